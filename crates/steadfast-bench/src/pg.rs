//! The PostgreSQL measurements: a raw single-row upsert per transaction on
//! the same server, W1 and W2 interleaved with it, commits (WAL flushes) per
//! step, and W2 spread over 1, 2 and 4 worker processes. The server
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

async fn connect(url: &str) -> Res<tokio_postgres::Client> {
    // The driver knows `sslmode=disable`, `prefer` and `require`; with no TLS
    // connector, `prefer` falls back to plain TCP and `require` fails.
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// `n` single-row upserts over 1000 keys, each its own transaction (one
/// commit, one WAL flush): the server's floor for a durable write.
async fn raw_upserts(client: &tokio_postgres::Client, n: usize) -> Res<f64> {
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

/// The targets of the PostgreSQL issue, measured interleaved in each
/// repetition (raw upsert, W1, W2) so that the server's drift hits all
/// three alike; then W2 over 1, 2 and 4 worker processes.
pub async fn measure(args: &Args) -> Res<()> {
    let Some(base) = server() else {
        eprintln!("postgres: skipped; set {ENV} to a PostgreSQL URL (for example postgres://postgres@127.0.0.1:5432/test) to measure it");
        return Ok(());
    };
    let client = connect(&base).await?;
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
    for rep in 0..reps {
        raw.push(raw_upserts(&client, upserts).await?);
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
    }
    let (raw, w1, w2) = (median(raw), median(w1), median(w2));
    let w2_steps_per_s = 1e6 / w2;
    emit(
        "steadfast",
        "postgres",
        "ratios",
        durability,
        json!({"reps": reps, "raw_upsert_us": round(raw), "w1_us_per_step": round(w1),
               "w2_us_per_step": round(w2), "w1_over_raw": (w1 / raw * 1000.0).round() / 1000.0,
               "w2_steps_per_s": round(w2_steps_per_s),
               "w1_commits_per_step": (median(s1) * 1000.0).round() / 1000.0,
               "w2_commits_per_step": (median(s2) * 1000.0).round() / 1000.0,
               "w1_within_1_1x_raw": w1 / raw <= 1.1, "w2_at_least_6900_steps_per_s": w2_steps_per_s >= 6900.0,
               "notes": format!("raw upsert, W1 and W2 interleaved in each repetition; medians; plain TCP on both unless the URL asks for TLS; {}", settings.join(", "))}),
    );
    // W2 over processes: the workload's own 1000 runs.
    let runs = if args.quick { 20 } else { 1000 };
    for procs in [1usize, 2, 4] {
        let mut walls = Vec::new();
        for rep in 0..args.reps() {
            let url = fresh_url(&format!("procs-{procs}-{rep}"));
            // Create the schema before the clock starts.
            drop(open_store(&url).await?);
            let t = Instant::now();
            let mut children = Vec::new();
            for p in 0..procs {
                children.push(
                    tokio::process::Command::new(std::env::current_exe()?)
                        .args(["--child", "pg-w2", "--child-store", &url, "--dir"])
                        .arg(&args.dir)
                        .args(["--child-runs", &(runs / procs).to_string()])
                        .env("STEADFAST_BENCH_CHILD_PREFIX", format!("p{p}"))
                        .env(
                            "STEADFAST_BENCH_CHILD_CONCURRENCY",
                            (16 / procs).to_string(),
                        )
                        .spawn()?,
                );
            }
            for mut c in children {
                let status = c.wait().await?;
                if !status.success() {
                    return Err(format!("a W2 worker process failed: {status}").into());
                }
            }
            walls.push(t.elapsed().as_secs_f64());
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
