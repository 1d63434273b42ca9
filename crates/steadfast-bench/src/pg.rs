//! The PostgreSQL measurements: a raw single-row upsert per transaction on
//! the same server, W1 and W2 interleaved with it, commits (WAL flushes) per
//! step, and W2 spread over 1, 2 and 4 worker processes; and where a W1
//! step's time goes (`--workloads breakdown --stores postgres`). The server
//! is the one `STEADFAST_BENCH_PG` names; without it they are skipped with a
//! printed reason.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use steadfast::open_store;
use steadfast::postgres::{PgOptions, PgStore};

use crate::baseline::round;
use crate::workloads::{run_many, Res, STEPS};
use crate::{emit, median, Args};

/// The environment variable naming the server.
pub const ENV: &str = "STEADFAST_BENCH_PG";

/// The server's URL, if one is given. Without an `sslmode`, the harness
/// asks for `sslmode=disable`: the raw baseline speaks plain TCP, and so must
/// the store it is compared with (by default the store encrypts whenever
/// the server offers TLS, which costs a loopback round trip more CPU than
/// it takes to run the statement).
pub fn server() -> Option<String> {
    let url = std::env::var(ENV).ok().filter(|u| !u.is_empty())?;
    if url.contains("sslmode=") {
        return Some(url);
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}sslmode=disable"))
}

/// The URL of schema `tag` on the server, dropped first so that it starts
/// empty.
pub fn fresh_url(tag: &str) -> String {
    let url = schema_url(tag);
    drop_schema(&url);
    url
}

fn schema_url(tag: &str) -> String {
    let base = server().expect("STEADFAST_BENCH_PG is set when postgres is measured");
    let sep = if base.contains('?') { '&' } else { '?' };
    let schema: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{base}{sep}schema=bench_{schema}")
}

/// Drops the schema a URL names, if it exists (on a thread of its own: the
/// caller may be inside a runtime).
pub fn drop_schema(url: &str) {
    let url = url.to_string();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            if let Ok(s) = PgStore::connect_with(&url, PgOptions::default().create(false)).await {
                let _ = s.drop_schema().await;
            }
        });
    })
    .join();
}

/// The bytes the relations of the schema `url` names take on the server
/// (tables, their TOAST and indexes).
pub async fn schema_bytes(url: &str) -> Res<u64> {
    let schema = url
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("schema="))
        .ok_or("the URL names no schema")?
        .to_string();
    let base = server().ok_or("no server")?;
    let client = connect(&base).await?;
    let row = client
        .query_one(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind = 'r'",
            &[&schema],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

pub(crate) async fn connect(url: &str) -> Res<tokio_postgres::Client> {
    // The driver knows `sslmode=disable`, `prefer` and `require`; with no TLS
    // connector, `prefer` falls back to plain TCP and `require` fails.
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// `n` single-row upserts over 1000 keys, each its own transaction (one
/// commit, one WAL flush): the server's floor for a durable write.
pub(crate) async fn raw_upserts(client: &tokio_postgres::Client, n: usize) -> Res<f64> {
    client
        .batch_execute(
            "DROP TABLE IF EXISTS steadfast_bench_kv;
             CREATE TABLE steadfast_bench_kv (k bigint PRIMARY KEY, v text NOT NULL)",
        )
        .await?;
    let stmt = client
        .prepare("INSERT INTO steadfast_bench_kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v")
        .await?;
    let t = Instant::now();
    for i in 0..n {
        client
            .execute(&stmt, &[&((i % 1000) as i64), &format!("{i:0>200}")])
            .await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    client
        .batch_execute("DROP TABLE steadfast_bench_kv")
        .await?;
    Ok(us)
}

/// Where a W1 step's time goes on PostgreSQL (`--workloads breakdown
/// --stores postgres`), every measure interleaved in each repetition on a
/// fresh schema, each run as a task on a worker of the runtime (as the
/// engine's runs are): the raw upsert, W1's saves made on the store
/// directly (no engine), a load of a missing run (the engine makes one
/// before each run's first step) and W1 through the engine, each but the
/// load with the process's CPU time per operation (its threads: the
/// caller, the driver's connection tasks); what the engine adds is W1 less
/// the saves and the load. Beside them, the raw upsert awaited on the
/// harness's own thread (each answer then wakes that thread from another),
/// and the raw upsert, the saves and W1 again on a current-thread runtime
/// of their own, where no request crosses threads.
pub async fn breakdown(args: &Args) -> Res<()> {
    let Some(base) = server() else {
        eprintln!("postgres: breakdown skipped; set {ENV} to a PostgreSQL URL");
        return Ok(());
    };
    let client = Arc::new(connect(&base).await?);
    let reps = if args.quick { 1 } else { args.reps().max(15) };
    let runs = if args.quick { 20 } else { 100 };
    let ops = runs * STEPS;
    let mut samples: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for rep in 0..reps {
        let url = fresh_url(&format!("breakdown-{rep}"));
        let store = PgStore::connect(&url).await?;
        let mut push = |k, v| samples.entry(k).or_default().push(v);
        let c = Arc::clone(&client);
        let (us, cpu) = on_worker(ops, async move { raw_upserts(&c, ops).await }).await?;
        push("raw_upsert_us", us);
        push("raw_upsert_cpu_us", cpu);
        push(
            "raw_upsert_harness_thread_us",
            raw_upserts(&client, ops).await?,
        );
        let (s, tag) = (store.clone(), format!("s{rep}"));
        let (us, cpu) = on_worker(
            ops,
            async move { crate::breakdown::saves(&s, &tag, runs).await },
        )
        .await?;
        push("save_us", us);
        push("save_cpu_us", cpu);
        let s = store.clone();
        let (us, _) =
            on_worker(runs, async move { crate::breakdown::loads(&s, runs).await }).await?;
        push("load_missing_us", us);
        let cpu = cpu_us();
        let wall = run_many(Arc::new(store.clone()), "w", runs, 1).await?;
        push("w1_cpu_us", (cpu_us() - cpu) / ops as f64);
        push("w1_us_per_step", wall.as_secs_f64() * 1e6 / ops as f64);
        drop(store);
        drop_schema(&url);
        let (raw, save, w1) = current_thread(&base, &format!("breakdown-ct-{rep}"), runs)?;
        push("current_thread_raw_upsert_us", raw);
        push("current_thread_save_us", save);
        push("current_thread_w1_us_per_step", w1);
    }
    let m: std::collections::BTreeMap<&str, f64> =
        samples.into_iter().map(|(k, v)| (k, median(v))).collect();
    let (raw, save, load, w1) = (
        m["raw_upsert_us"],
        m["save_us"],
        m["load_missing_us"],
        m["w1_us_per_step"],
    );
    let ratio = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut out = serde_json::Map::new();
    for (k, v) in &m {
        out.insert((*k).into(), json!(round(*v)));
    }
    out.insert("reps".into(), json!(reps));
    out.insert("save_over_raw".into(), json!(ratio(save / raw)));
    out.insert("w1_over_raw".into(), json!(ratio(w1 / raw)));
    out.insert(
        "current_thread_w1_over_raw".into(),
        json!(ratio(
            m["current_thread_w1_us_per_step"] / m["current_thread_raw_upsert_us"]
        )),
    );
    out.insert(
        "engine_us_per_step".into(),
        json!(round(w1 - save - load / STEPS as f64)),
    );
    // W1 makes a load before each run's first step (to see whether the run
    // is there to resume) and a save per step; were every save as cheap as
    // the raw upsert and the engine free, W1 / raw would still be this.
    out.insert(
        "w1_floor_over_raw".into(),
        json!(ratio(1.0 + load / (STEPS as f64 * raw))),
    );
    out.insert("notes".into(), json!(format!("medians of {reps} repetitions, each on a fresh schema: {ops} raw upserts (over 1000 keys, one transaction each), {runs} runs' W1 saves made on the store directly ({ops} saves), {runs} loads of missing runs and {runs} W1 runs through the engine, each as a task on a runtime worker; *_cpu_us = the process's CPU time (its threads alive at the end) per operation; engine = W1 step - save - load / {STEPS}; w1_floor_over_raw = 1 + load / ({STEPS} raw upserts), W1 / raw with saves as cheap as the raw upsert and no engine; raw_upsert_harness_thread_us = the raw upsert awaited on the harness's own thread; current_thread_* = raw upsert, saves and W1 on a current-thread runtime of their own")));
    emit(
        "steadfast",
        "postgres",
        "breakdown",
        "commit per save (synchronous_commit=on, fsync=on)",
        serde_json::Value::Object(out),
    );
    Ok(())
}

/// The CPU time so far of the process's threads alive now, in µs (Linux's
/// per-thread run time; 0 elsewhere): the runtime's threads live as long
/// as the harness, so a difference of two readings is theirs.
fn cpu_us() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|st| st.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1000.0
}

/// Runs `fut` (µs per operation) as a task on a worker of the runtime;
/// returns its figure and the process's CPU time per operation of `ops`.
pub(crate) async fn on_worker<F>(ops: usize, fut: F) -> Res<(f64, f64)>
where
    F: std::future::Future<Output = Res<f64>> + Send + 'static,
{
    let cpu = cpu_us();
    let got = tokio::spawn(async move { fut.await.map_err(|e| e.to_string()) }).await?;
    Ok((got?, (cpu_us() - cpu) / ops as f64))
}

/// The raw upsert, W1's saves made directly and W1 through the engine (µs
/// per operation), on a current-thread runtime of their own in a thread of
/// their own, with a client and a store connected there.
fn current_thread(base: &str, tag: &str, runs: usize) -> Res<(f64, f64, f64)> {
    let url = fresh_url(tag);
    let (base, at) = (base.to_string(), url.clone());
    let got = std::thread::spawn(move || -> Result<(f64, f64, f64), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let text = |e: Box<dyn std::error::Error>| e.to_string();
            let client = connect(&base).await.map_err(text)?;
            let raw = raw_upserts(&client, runs * STEPS).await.map_err(text)?;
            let store = PgStore::connect(&at).await.map_err(|e| e.to_string())?;
            let save = crate::breakdown::saves(&store, "s", runs)
                .await
                .map_err(text)?;
            let wf = crate::workloads::ten_steps();
            let t = Instant::now();
            for r in 0..runs {
                steadfast::run(&format!("w-{r}"), &wf, &store)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let w1 = t.elapsed().as_secs_f64() * 1e6 / (runs * STEPS) as f64;
            Ok((raw, save, w1))
        })
    })
    .join()
    .map_err(|_| "the current-thread measure panicked")?;
    drop_schema(&url);
    Ok(got?)
}

/// The targets of the PostgreSQL issue, measured interleaved in each
/// repetition (raw upsert, W1, W2) so that the server's drift hits all
/// three alike; then W2 over 1, 2 and 4 worker processes.
pub async fn measure(args: &Args) -> Res<()> {
    let Some(base) = server() else {
        eprintln!("postgres: skipped; set {ENV} to a PostgreSQL URL (for example postgres://postgres@127.0.0.1:5432/test) to measure it");
        return Ok(());
    };
    let client = Arc::new(connect(&base).await?);
    let settings: Vec<String> = {
        let mut out = Vec::new();
        for name in [
            "server_version",
            "synchronous_commit",
            "fsync",
            "wal_sync_method",
        ] {
            let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
            out.push(format!("{name}={}", row.get::<_, String>(0)));
        }
        out
    };
    let durability = "commit per batch (synchronous_commit=on, fsync=on)";
    // Many short alternations, as for SQLite (`workloads::ratios`).
    let reps = if args.quick { 1 } else { args.reps().max(15) };
    let upserts = if args.quick { 200 } else { 3_000 };
    let runs = if args.quick { 20 } else { 300 };
    let steps = (runs * STEPS) as f64;
    let (mut raw, mut w1, mut w2, mut s1, mut s2) = (vec![], vec![], vec![], vec![], vec![]);
    let mut raw_here = vec![];
    let mut durable = vec![];
    for rep in 0..reps {
        // On a worker of the runtime, as W1's runs are: awaited on the
        // harness's own thread, each answer would also wake that thread
        // from another (some 70 µs more on a 2-core VM), flattering W1.
        let c = Arc::clone(&client);
        raw.push(
            on_worker(upserts, async move { raw_upserts(&c, upserts).await })
                .await?
                .0,
        );
        raw_here.push(raw_upserts(&client, upserts).await?);
        for (concurrency, samples, syncs) in [(1, &mut w1, &mut s1), (16, &mut w2, &mut s2)] {
            let url = fresh_url(&format!("ratios-{concurrency}-{rep}"));
            let store = PgStore::connect(&url).await?;
            let wall = run_many(Arc::new(store.clone()), "run", runs, concurrency).await?;
            samples.push(wall.as_secs_f64() * 1e6 / steps);
            // Each commit is one WAL flush (synchronous_commit=on). The
            // server's own counter (pg_stat_wal) is reported by its backends
            // up to seconds late, so the store's count is the one read.
            syncs.push(store.write_stats().commits as f64 / steps);
            drop(store);
            drop_schema(&url);
        }
        // W1 as a durable function: ten steps and a result save a run.
        let url = fresh_url(&format!("ratios-durable-{rep}"));
        let store = PgStore::connect(&url).await?;
        let wall = crate::workloads::run_many_durable(Arc::new(store), "run", runs, 1).await?;
        durable.push(wall.as_secs_f64() * 1e6 / steps);
        drop_schema(&url);
    }
    let (raw, w1, w2) = (median(raw), median(w1), median(w2));
    let durable = median(durable);
    let w2_steps_per_s = 1e6 / w2;
    emit(
        "steadfast",
        "postgres",
        "ratios",
        durability,
        json!({"reps": reps, "raw_upsert_us": round(raw), "w1_us_per_step": round(w1),
               "raw_upsert_harness_thread_us": round(median(raw_here)),
               "w1_durable_us_per_step": round(durable),
               "durable_over_w1": (durable / w1 * 1000.0).round() / 1000.0,
               "w2_us_per_step": round(w2), "w1_over_raw": (w1 / raw * 1000.0).round() / 1000.0,
               "w2_steps_per_s": round(w2_steps_per_s),
               "w1_commits_per_step": (median(s1) * 1000.0).round() / 1000.0,
               "w2_commits_per_step": (median(s2) * 1000.0).round() / 1000.0,
               "w1_within_1_1x_raw": w1 / raw <= 1.1, "w2_at_least_6900_steps_per_s": w2_steps_per_s >= 6900.0,
               "notes": format!("raw upsert, W1, W2 and W1 as a durable function interleaved in each repetition, each on a runtime worker (raw_upsert_harness_thread_us: the raw upsert awaited on the harness's own thread, the baseline earlier versions of this harness used); medians; plain TCP on both unless the URL asks for TLS; {}", settings.join(", "))}),
    );
    // W2 over processes: the workload's own 1000 runs.
    let runs = if args.quick { 20 } else { 1000 };
    for procs in [1usize, 2, 4] {
        let mut walls = Vec::new();
        for rep in 0..args.reps() {
            let url = fresh_url(&format!("procs-{procs}-{rep}"));
            walls.push(crate::workloads::w2_in_processes(&url, args, runs, procs).await?);
            drop_schema(&url);
        }
        let wall = median(walls);
        let total = (runs / procs * procs * STEPS) as f64;
        emit(
            "steadfast",
            "postgres",
            &format!("W2/{procs}proc"),
            durability,
            json!({"runs": runs / procs * procs, "steps": total, "concurrency": 16, "processes": procs,
                   "wall_s": (wall * 1000.0).round() / 1000.0, "steps_per_s": round(total / wall),
                   "us_per_step": round(wall * 1e6 / total),
                   "notes": format!("16 runs at a time over {procs} process(es), {} each; wall time includes starting the processes", 16 / procs)}),
        );
    }
    Ok(())
}

/// A W2 worker process: its share of the runs, at its share of the
/// concurrency.
pub fn child(url: &str, runs: usize) -> Res<()> {
    let prefix = std::env::var("STEADFAST_BENCH_CHILD_PREFIX").unwrap_or_else(|_| "p".into());
    let concurrency: usize = std::env::var("STEADFAST_BENCH_CHILD_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = open_store(url).await?;
        run_many(store, &prefix, runs, concurrency).await?;
        Ok(())
    })
}

/// The bytes the steps (history) table of the schema `url` names takes,
/// with its indexes and TOAST, after a VACUUM so that deleted rows count as
/// free space.
pub async fn steps_bytes(url: &str) -> Res<u64> {
    let schema = url
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("schema="))
        .ok_or("the URL names no schema")?
        .to_string();
    let client = connect(&server().ok_or("no server")?).await?;
    let table = format!("\"{schema}\".steps");
    client.batch_execute(&format!("VACUUM {table}")).await?;
    let row = client
        .query_one(
            "SELECT pg_total_relation_size($1::text::regclass)",
            &[&table],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}
