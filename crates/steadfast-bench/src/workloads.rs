//! W1 to W5 of WORKLOAD.md on one store.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast::store::SaveRequest;
use steadfast::{
    open_store, update, Checkpoint, Event, RetryPolicy, RunStatus, Runner, Step, Store, Timestamp,
    Workflow,
};

use crate::baseline::{remove_db, round};
use crate::{durability, emit, median, Args};

/// A result with any error.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Steps of the W1/W2 workflow.
pub const STEPS: usize = 10;

/// The WORKLOAD.md workflow: steps `s0`..`s9`, step `i` returns `{"s<i>": i}`.
pub fn ten_steps() -> Workflow {
    let mut b = Workflow::builder("w");
    for i in 0..STEPS {
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| async move {
                update(json!({ format!("s{i}"): i }))
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

/// The URL of a fresh store of `kind` named `tag` under the bench directory.
pub fn fresh_url(kind: &str, dir: &Path, tag: &str) -> String {
    match kind {
        "memory" => "memory:".into(),
        "file" => {
            let p = dir.join(format!("{tag}.json"));
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_dir_all(format!("{}.blobs", p.display()));
            format!("file:{}", p.display())
        }
        "sqlite" | "sqlite-sealed" => {
            let p = dir.join(format!("{tag}.db"));
            remove_db(&p);
            format!("sqlite:{}", p.display())
        }
        "postgres" => crate::pg::fresh_url(tag),
        other => panic!("unknown store {other}"),
    }
}

fn runs_for(kind: &str, args: &Args) -> usize {
    match (args.quick, kind) {
        (true, _) => 20,
        (false, "file") => 200,
        _ => 1000,
    }
}

fn runs_note(kind: &str, args: &Args) -> &'static str {
    if kind == "file" && !args.quick {
        "200 runs instead of 1000: every save rewrites the whole file"
    } else {
        ""
    }
}

/// Opens the store `kind` at `url`: `sqlite-sealed` is SQLite through the
/// encryption seal, with a fixed bench key.
async fn open_kind(kind: &str, url: &str) -> Res<Arc<dyn Store>> {
    let store = open_store(url).await?;
    if kind.ends_with("-sealed") {
        let keys =
            steadfast::seal::Keyring::parse("bench:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")?;
        return Ok(Arc::new(steadfast::seal::SealedStore::new(store, keys)));
    }
    Ok(store)
}

/// Runs every wanted workload on `kind`.
pub async fn all(kind: &str, args: &Args) -> Res<()> {
    if kind.ends_with("-sealed") {
        // W1 and W2 only: the others run child processes on a plain URL.
        for durable in [false, true] {
            if args.wants("W1") {
                w1_w2(kind, args, 1, durable).await?;
            }
            if args.wants("W2") {
                w1_w2(kind, args, 16, durable).await?;
            }
        }
        return Ok(());
    }
    for durable in [false, true] {
        if args.wants("W1") {
            w1_w2(kind, args, 1, durable).await?;
        }
        if args.wants("W2") {
            w1_w2(kind, args, 16, durable).await?;
        }
    }
    if args.wants("limit") {
        w2_limit(kind, args).await?;
    }
    if args.wants("procs") {
        if kind == "sqlite" {
            w2_processes(kind, args).await?;
        } else {
            eprintln!("{kind}: procs skipped; it measures SQLite's write lock shared by processes");
        }
    }
    if args.wants("W3") {
        w3(kind, args).await?;
    }
    if args.wants("W4") && kind != "memory" {
        w4(kind, args).await?;
    }
    if args.wants("W5") {
        w5(kind, args).await?;
    }
    if args.wants("W7") {
        crate::large::w7(kind, args).await?;
    }
    if args.wants("gc") && !kind.ends_with("-sealed") {
        crate::ops::gc(kind, args).await?;
    }
    if args.wants("prune") {
        crate::ops::prune(kind, args).await?;
    }
    Ok(())
}

/// [`drive`], for the other workload modules.
pub async fn drive_pub<F, Fut>(
    prefix: &str,
    runs: usize,
    concurrency: usize,
    run: F,
) -> Res<Duration>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), steadfast::Error>> + Send,
{
    drive(prefix, runs, concurrency, run).await
}

/// Runs `run(run_id)` for `runs` run ids, `concurrency` at a time; returns
/// the wall time.
async fn drive<F, Fut>(prefix: &str, runs: usize, concurrency: usize, run: F) -> Res<Duration>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), steadfast::Error>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, prefix, run) = (Arc::clone(&next), prefix.to_string(), run.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let r = next.fetch_add(1, Ordering::Relaxed);
                if r >= runs {
                    return Ok::<(), steadfast::Error>(());
                }
                run(format!("{prefix}-{r}")).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// `runs` runs of the ten-step workflow, `concurrency` at a time; returns the wall time.
pub async fn run_many(
    store: Arc<dyn Store>,
    prefix: &str,
    runs: usize,
    concurrency: usize,
) -> Res<Duration> {
    let wf = Arc::new(ten_steps());
    drive(prefix, runs, concurrency, move |run_id| {
        let (store, wf) = (Arc::clone(&store), Arc::clone(&wf));
        async move { steadfast::run(&run_id, &wf, &*store).await.map(drop) }
    })
    .await
}

/// W1 (`concurrency` 1) or W2 (16), with listed steps or as a durable function.
async fn w1_w2(kind: &str, args: &Args, concurrency: usize, durable: bool) -> Res<()> {
    let runs = runs_for(kind, args);
    let mut walls = Vec::new();
    for rep in 0..args.reps() {
        let tag = format!("{}{concurrency}-{rep}", if durable { "d" } else { "w" });
        let store = open_kind(kind, &fresh_url(kind, &args.dir, &tag)).await?;
        let wall = if durable {
            run_many_durable(store, "run", runs, concurrency).await?
        } else {
            run_many(store, "run", runs, concurrency).await?
        };
        walls.push(wall.as_secs_f64());
    }
    let wall = median(walls);
    let steps = runs * STEPS;
    let workload = match (concurrency, durable) {
        (1, false) => "W1",
        (_, false) => "W2",
        (1, true) => "W1/durable",
        (_, true) => "W2/durable",
    };
    let notes = if durable {
        format!(
            "W1 workflow as a durable function (10 steps + 1 result save per run). {}",
            runs_note(kind, args)
        )
        .trim_end()
        .to_string()
    } else {
        runs_note(kind, args).to_string()
    };
    emit(
        "steadfast",
        kind,
        workload,
        durability(kind),
        json!({"runs": runs, "steps": steps, "concurrency": concurrency, "wall_s": round3(wall),
               "steps_per_s": round(steps as f64 / wall), "us_per_step": round(wall * 1e6 / steps as f64),
               "notes": notes}),
    );
    Ok(())
}

/// Seconds for `runs` runs of the W1 workflow, 16 at a time, spread over
/// `procs` worker processes on the store at `url` (created before the
/// clock starts; the time includes starting the processes).
pub async fn w2_in_processes(url: &str, args: &Args, runs: usize, procs: usize) -> Res<f64> {
    drop(open_store(url).await?);
    let t = Instant::now();
    let mut children = Vec::new();
    for p in 0..procs {
        children.push(
            tokio::process::Command::new(std::env::current_exe()?)
                .args(["--child", "w2", "--child-store", url, "--dir"])
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
    Ok(t.elapsed().as_secs_f64())
}

/// W2 in one process and over two processes (8 runs at a time in each)
/// sharing one database, interleaved in each repetition on fresh
/// databases: what group commit keeps when another process holds the
/// write lock by turns.
async fn w2_processes(kind: &str, args: &Args) -> Res<()> {
    let runs = runs_for(kind, args);
    let mut walls: [Vec<f64>; 2] = Default::default();
    for rep in 0..args.reps() {
        for (i, procs) in [1, 2].into_iter().enumerate() {
            let url = fresh_url(kind, &args.dir, &format!("procs{procs}-{rep}"));
            walls[i].push(w2_in_processes(&url, args, runs, procs).await?);
        }
    }
    for (i, procs) in [1usize, 2].into_iter().enumerate() {
        let wall = median(std::mem::take(&mut walls[i]));
        let steps = (runs / procs * procs * STEPS) as f64;
        emit(
            "steadfast",
            kind,
            &format!("W2/{procs}proc"),
            durability(kind),
            json!({"runs": runs / procs * procs, "steps": steps, "concurrency": 16, "processes": procs,
                   "wall_s": round3(wall), "steps_per_s": round(steps / wall),
                   "us_per_step": round(wall * 1e6 / steps),
                   "notes": "16 runs at a time over the processes, interleaved with the other count in each repetition on fresh databases; wall time includes starting the processes"}),
        );
    }
    Ok(())
}

/// The W2 workflow with every step holding a slot of one shared key of
/// size 16 (`bench:16`), so 16 concurrent runs never wait for a slot: the
/// cost of taking and giving back a slot in the store's documents.
pub fn ten_limited_steps() -> Workflow {
    let limit = steadfast::LimitSpec::parse("bench:16").expect("a valid limit");
    let mut b = Workflow::builder("w");
    for i in 0..STEPS {
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| async move {
                update(json!({ format!("s{i}"): i }))
            })
            .retry(RetryPolicy::none())
            .limit(limit.clone()),
        );
    }
    b.build().expect("a valid workflow")
}

/// W2 with and without a shared limit, interleaved in each repetition on
/// fresh stores: the cost of a limit (two more compare-and-swap writes of
/// one shared document per step, contended by 16 runs).
async fn w2_limit(kind: &str, args: &Args) -> Res<()> {
    let runs = runs_for(kind, args);
    let (mut plain, mut limited) = (Vec::new(), Vec::new());
    let limited_wf = Arc::new(ten_limited_steps());
    for rep in 0..args.reps() {
        let store = open_kind(kind, &fresh_url(kind, &args.dir, &format!("lp-{rep}"))).await?;
        plain.push(run_many(store, "run", runs, 16).await?.as_secs_f64());
        let store = open_kind(kind, &fresh_url(kind, &args.dir, &format!("ll-{rep}"))).await?;
        let wf = Arc::clone(&limited_wf);
        let wall = drive("run", runs, 16, move |run_id| {
            let (store, wf) = (Arc::clone(&store), Arc::clone(&wf));
            async move { steadfast::run(&run_id, &wf, &*store).await.map(drop) }
        })
        .await?;
        limited.push(wall.as_secs_f64());
    }
    let steps = runs * STEPS;
    let (plain, limited) = (median(plain), median(limited));
    for (workload, wall) in [("W2", plain), ("W2/limit", limited)] {
        emit(
            "steadfast",
            kind,
            workload,
            durability(kind),
            json!({"runs": runs, "steps": steps, "concurrency": 16, "wall_s": round3(wall),
                   "steps_per_s": round(steps as f64 / wall), "us_per_step": round(wall * 1e6 / steps as f64),
                   "limit_over_plain": round3(wall / plain),
                   "notes": format!("W2 and W2 with every step holding a slot of one key of size 16, interleaved in each repetition; medians. {}", runs_note(kind, args)).trim_end().to_string()}),
        );
    }
    Ok(())
}

/// `runs` runs of the W1 workflow written as a durable function, `concurrency`
/// at a time; returns the wall time.
pub async fn run_many_durable(
    store: Arc<dyn Store>,
    prefix: &str,
    runs: usize,
    concurrency: usize,
) -> Res<Duration> {
    drive(prefix, runs, concurrency, move |run_id| {
        let store = Arc::clone(&store);
        async move {
            steadfast::durable(&run_id, &store, "w", |ctx| async move {
                for i in 0..STEPS {
                    ctx.step(format!("s{i}"), || async move {
                        Ok::<_, steadfast::StepError>(i)
                    })
                    .await?;
                }
                Ok(())
            })
            .await
            .map(drop)
        }
    })
    .await
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn completed_checkpoint(run_id: &str) -> Checkpoint {
    let mut cp = Checkpoint::new(run_id, "w", Timestamp::from_unix_millis(1_700_000_000_000));
    for i in 0..STEPS {
        cp.completed.push(format!("s{i}"));
        cp.state.insert(format!("s{i}"), json!(i));
    }
    cp.next = STEPS;
    cp.status = RunStatus::Completed;
    cp
}

/// Fills a store with `n` completed runs. The file store's file is written
/// directly (saving 10,000 runs one rewrite at a time would take hours).
async fn populate(kind: &str, url: &str, store: &Arc<dyn Store>, n: usize) -> Res<()> {
    if kind == "file" {
        let path = url.trim_start_matches("file:");
        let mut runs = serde_json::Map::new();
        for i in 0..n {
            let mut cp = completed_checkpoint(&format!("old-{i:06}"));
            cp.version = 1;
            runs.insert(cp.run_id.clone(), serde_json::to_value(&cp)?);
        }
        let text = serde_json::to_vec(&json!({"format": 1, "runs": runs}))?;
        std::fs::write(path, text)?;
        return Ok(());
    }
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, next) = (Arc::clone(store), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), steadfast::StoreError>(());
                }
                let cp = completed_checkpoint(&format!("old-{i:06}"));
                store.save(SaveRequest::new(&cp, None)).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn w3(kind: &str, args: &Args) -> Res<()> {
    let sizes: &[usize] = match (args.quick, kind) {
        (true, _) => &[100, 1000],
        (false, "file") => &[100, 1_000, 10_000],
        _ => &[100, 1_000, 10_000, 100_000],
    };
    for &n in sizes {
        let tag = format!("w3-{n}");
        let url = fresh_url(kind, &args.dir, &tag);
        let store = open_store(&url).await?;
        populate(kind, &url, &store, n).await?;
        let wf = ten_steps();
        let mut per_step = Vec::new();
        let timed = if args.quick { 5 } else { 20 };
        for r in 0..timed {
            let t = Instant::now();
            steadfast::run(&format!("new-{r}"), &wf, &*store).await?;
            per_step.push(t.elapsed().as_secs_f64() * 1e6 / STEPS as f64);
        }
        let us = median(per_step);
        emit(
            "steadfast",
            kind,
            &format!("W3@{n}"),
            durability(kind),
            json!({"runs": timed, "steps": timed * STEPS, "stored_runs": n, "us_per_step": round(us),
                   "steps_per_s": round(1e6 / us), "notes": "median of single runs"}),
        );
        drop(store);
        cleanup(kind, &url);
    }
    Ok(())
}

pub fn cleanup(kind: &str, url: &str) {
    match kind {
        "file" => {
            let p = url.trim_start_matches("file:");
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_file(format!("{p}.lock"));
            let _ = std::fs::remove_dir_all(format!("{p}.blobs"));
        }
        "sqlite" => remove_db(Path::new(url.trim_start_matches("sqlite:"))),
        "postgres" => crate::pg::drop_schema(url),
        _ => {}
    }
}

fn w4_workflow(log: &Path, die_in_step_1: bool) -> Workflow {
    let mut b = Workflow::builder("w4");
    for i in 0..3 {
        let log = log.to_path_buf();
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .expect("log");
                writeln!(f, "s{i}").expect("log write");
                if i == 1 && die_in_step_1 {
                    std::process::exit(9);
                }
                async move { update(json!({ format!("s{i}"): i })) }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

async fn w4(kind: &str, args: &Args) -> Res<()> {
    let url = fresh_url(kind, &args.dir, "w4");
    let log = args.dir.join("w4.log");
    let _ = std::fs::remove_file(&log);
    let status = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--child", "w4", "--child-store", &url, "--dir"])
        .arg(&args.dir)
        .status()
        .await?;
    let store = open_store(&url).await?;
    let out = steadfast::run("w4", &w4_workflow(&log, false), &*store).await?;
    let state = out.completed().unwrap_or_default();
    let lines: Vec<String> = std::fs::read_to_string(&log)?
        .lines()
        .map(String::from)
        .collect();
    let pass = status.code() == Some(9)
        && lines == ["s0", "s1", "s1", "s2"]
        && (0..3).all(|i| state.get(&format!("s{i}")) == Some(&json!(i)));
    emit(
        "steadfast",
        kind,
        "W4",
        durability(kind),
        json!({"runs": 1, "steps": 3, "pass": pass,
               "notes": format!("child exit {:?}; step executions {:?}", status.code(), lines)}),
    );
    Ok(())
}

async fn w5(kind: &str, args: &Args) -> Res<()> {
    let steps = 200;
    let mut first = Vec::new();
    let mut last = Vec::new();
    let mut all = Vec::new();
    for rep in 0..args.reps() {
        let store = open_store(&fresh_url(kind, &args.dir, &format!("w5-{rep}"))).await?;
        let mut b = Workflow::builder("w5");
        for i in 0..steps {
            b = b.push(
                Step::new(format!("s{i}"), move |_, _| async move {
                    update(json!({ format!("k{i}"): "x".repeat(4096) }))
                })
                .retry(RetryPolicy::none()),
            );
        }
        let wf = b.build()?;
        let took = Arc::new(Mutex::new(Vec::with_capacity(steps)));
        let sink = Arc::clone(&took);
        let start = Instant::now();
        Runner::new(&*store)
            .observer(move |e| {
                if let Event::Completed { took, .. } = e {
                    sink.lock().expect("samples").push(took.as_secs_f64() * 1e6);
                }
            })
            .run(&format!("w5-{rep}"), &wf)
            .await?;
        all.push(start.elapsed().as_secs_f64() * 1e6 / steps as f64);
        let took = took.lock().expect("samples").clone();
        first.push(took[..20].iter().sum::<f64>() / 20.0);
        last.push(took[steps - 20..].iter().sum::<f64>() / 20.0);
    }
    let (f, l) = (median(first), median(last));
    emit(
        "steadfast",
        kind,
        "W5",
        durability(kind),
        json!({"runs": 1, "steps": steps, "us_per_step": round(median(all)),
               "first20_us_per_step": round(f), "last20_us_per_step": round(l),
               "notes": format!("last20/first20 = {:.2}; state ends near 800 KiB", l / f)}),
    );
    Ok(())
}

/// What a re-executed child process does.
pub fn child(role: &str, args: &Args) -> Res<()> {
    let url = args
        .child_store
        .clone()
        .ok_or("--child-store is required")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match role {
        "w4" => {
            let store = rt.block_on(open_store(&url))?;
            let log = args.dir.join("w4.log");
            rt.block_on(steadfast::run("w4", &w4_workflow(&log, true), &*store))?;
            Err("step 1 should have ended the process".into())
        }
        "syncs-w1" | "syncs-w2" => {
            let store = rt.block_on(open_store(&url))?;
            let concurrency = if role == "syncs-w1" { 1 } else { 16 };
            rt.block_on(run_many(store, "s", args.child_runs, concurrency))?;
            Ok(())
        }
        "syncs-raw" => crate::syncs::raw_upserts(&url, args.child_runs),
        "w2" => crate::pg::child(&url, args.child_runs),
        other => Err(format!("unknown child role {other}").into()),
    }
}

/// The SQLite targets measured interleaved: each repetition runs the disk's
/// fsync of 200 bytes, the raw upsert baseline, then W1, W1 as a durable
/// function and W2, on fresh databases, so that the disk's drift hits all
/// alike. The targets: W1 within 1.25x a raw upsert, the durable function
/// within 1.1x W1, and W2 at least 5x W1's throughput.
pub async fn ratios(args: &Args) -> Res<()> {
    // Many short alternations rather than a few long ones: a shared disk
    // slows down for seconds at a time, and a median over 15 rounds of about
    // 3 seconds each is less at the mercy of one slow spell than one over 5
    // rounds of 10 seconds (about the same work in all).
    let reps = if args.quick { 1 } else { args.reps().max(15) };
    let upserts = if args.quick { 200 } else { 3_000 };
    let syncs = if args.quick { 50 } else { 300 };
    let runs = if args.quick {
        runs_for("sqlite", args)
    } else {
        300
    };
    let mut samples: [Vec<f64>; 5] = Default::default();
    for rep in 0..reps {
        samples[0].push(crate::baseline::sync_200b(&args.dir, syncs, false)?);
        let path = args.dir.join(format!("ratios-raw-{rep}.db"));
        let raw_path = path.clone();
        let us = tokio::task::spawn_blocking(move || -> Result<f64, String> {
            remove_db(&raw_path);
            let conn = rusqlite::Connection::open(&raw_path).map_err(|e| e.to_string())?;
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
                .map_err(|e| e.to_string())?;
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(|e| e.to_string())?;
            let t = Instant::now();
            crate::baseline::upserts(&conn, upserts).map_err(|e| e.to_string())?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / upserts as f64)
        })
        .await??;
        remove_db(&path);
        samples[1].push(us);
        for (i, concurrency, durable) in [(2, 1, false), (3, 1, true), (4, 16, false)] {
            let tag = format!(
                "ratios-{}{concurrency}-{rep}",
                if durable { "d" } else { "w" }
            );
            let url = fresh_url("sqlite", &args.dir, &tag);
            let store = open_store(&url).await?;
            let wall = if durable {
                run_many_durable(store, "run", runs, concurrency).await?
            } else {
                run_many(store, "run", runs, concurrency).await?
            };
            samples[i].push(wall.as_secs_f64() * 1e6 / (runs * STEPS) as f64);
            cleanup("sqlite", &url);
        }
    }
    let [fsync, raw, w1, durable, w2] = samples.map(median);
    let w1_over_raw = w1 / raw;
    let durable_over_w1 = durable / w1;
    let w2_speedup = w1 / w2;
    emit(
        "steadfast",
        "sqlite",
        "ratios",
        durability("sqlite"),
        json!({"reps": reps, "fsync_200b_us": round(fsync), "raw_upsert_us": round(raw),
               "w1_us_per_step": round(w1), "w1_durable_us_per_step": round(durable),
               "w2_us_per_step": round(w2), "w1_over_raw": round3(w1_over_raw),
               "w1_over_fsync": round3(w1 / fsync),
               "durable_over_w1": round3(durable_over_w1),
               "w2_over_w1_throughput": round3(w2_speedup),
               "w1_within_1_25x_raw": w1_over_raw <= 1.25,
               "durable_within_1_1x_w1": durable_over_w1 <= 1.1,
               "w2_at_least_5x_w1": w2_speedup >= 5.0,
               "notes": "fsync of 200 bytes, raw upsert, W1, W1 as a durable function and W2 interleaved in each repetition; medians"}),
    );
    Ok(())
}
