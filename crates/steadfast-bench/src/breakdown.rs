//! Where one W1 checkpoint's time goes on SQLite (`--workloads breakdown`):
//! the same saves measured with and without the engine, on the disk and on
//! a RAM disk (where a sync costs nothing), the save's plan alone (encoding
//! and checks), the hand-off to blocking code, and the WAL frames each
//! commit writes, beside a raw upsert measured the same ways.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use steadfast::sqlite::SqliteStore;
use steadfast::store::plan::plan_save;
use steadfast::store::SaveRequest;
use steadfast::{Checkpoint, RunStatus, StepRecord, Store, Timestamp};

use crate::baseline::{remove_db, round};
use crate::workloads::{run_many, STEPS};
use crate::{emit, median, Args};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The saves of one W1 run, as the engine makes them: one per step, carrying
/// its record; the first creates the run, the last completes it.
pub(crate) fn w1_saves(run_id: &str) -> Vec<(Checkpoint, Option<StepRecord>)> {
    let now = Timestamp::from_unix_millis(1_700_000_000_000);
    let mut cp = Checkpoint::new(run_id, "w", now);
    cp.status = RunStatus::Running;
    let mut out = Vec::with_capacity(STEPS);
    for i in 0..STEPS {
        let update = json!({ format!("s{i}"): i });
        let update = update.as_object().cloned().unwrap_or_default();
        cp.state.extend(update.clone());
        cp.completed.push(format!("s{i}"));
        cp.next = i + 1;
        if i + 1 == STEPS {
            cp.status = RunStatus::Completed;
        }
        let step = StepRecord::new(i, &format!("s{i}"), update, 1, now, now);
        out.push((cp.clone(), Some(step)));
    }
    out
}

/// Microseconds per save of `runs` W1 runs' saves on `store`.
pub(crate) async fn saves(store: &dyn Store, tag: &str, runs: usize) -> Res<f64> {
    let mut n = 0;
    let t = Instant::now();
    for r in 0..runs {
        let mut version = None;
        for (cp, step) in w1_saves(&format!("{tag}-{r}")) {
            let mut req = SaveRequest::new(&cp, version);
            if let Some(s) = &step {
                req = req.with_step(s);
            }
            version = Some(store.save(req).await?);
            n += 1;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// What [`saves`] measures, with the store's commits taken apart
/// (`steadfast_sqlite::timings`): µs per save, then each phase's µs per
/// commit (begin, statements, COMMIT, answers, the log's look), the rest of
/// a save outside its commit (plan, queue, hand-off, return), and saves per
/// commit, each named by its field in `keys` ([`DISK_KEYS`], [`RAM_KEYS`]).
async fn timed_saves(
    store: &SqliteStore,
    tag: &str,
    runs: usize,
    keys: &[&'static str; 8],
) -> Res<Vec<(&'static str, f64)>> {
    use steadfast::sqlite::timings;
    timings::start();
    let us = saves(store, tag, runs).await;
    let p = timings::stop();
    let us = us?;
    if p.batches == 0 {
        return Err("the timed saves committed nothing".into());
    }
    let per = |ns: u64| ns as f64 / p.batches as f64 / 1000.0;
    let phases = [
        per(p.begin_ns),
        per(p.statements_ns),
        per(p.commit_ns),
        per(p.answer_ns),
        per(p.log_ns),
    ];
    let saves_per_commit = (runs * STEPS) as f64 / p.batches as f64;
    let inside: f64 = phases.iter().sum::<f64>() / saves_per_commit;
    let values = std::iter::once(us)
        .chain(phases)
        .chain([us - inside, saves_per_commit]);
    Ok(keys.iter().copied().zip(values).collect())
}

/// The fields of a save's figures on the disk, in the order of
/// [`timed_saves`]: the save, its commit's phases (the write turn and
/// `BEGIN`, the statements, `COMMIT`, the answers, the log), the rest
/// outside the commit, and saves per commit.
const DISK_KEYS: [&str; 8] = [
    "save_us",
    "save_begin_us",
    "save_statements_us",
    "save_commit_us",
    "save_answer_us",
    "save_log_us",
    "save_outside_commit_us",
    "saves_per_commit",
];

/// The same on the RAM disk.
const RAM_KEYS: [&str; 8] = [
    "save_ram_us",
    "save_ram_begin_us",
    "save_ram_statements_us",
    "save_ram_commit_us",
    "save_ram_answer_us",
    "save_ram_log_us",
    "save_ram_outside_commit_us",
    "saves_per_commit_ram",
];

/// Microseconds per load of a run that is not there, as the engine makes
/// one before each run's first step.
pub(crate) async fn loads(store: &dyn Store, n: usize) -> Res<f64> {
    let t = Instant::now();
    for i in 0..n {
        if store.load(&format!("missing-{i}")).await?.is_some() {
            return Err("a run that was never written loaded".into());
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Microseconds per save of the plan alone (encoding and checks), with what
/// the store would know of each run.
fn plans(runs: usize) -> Res<f64> {
    let all: Vec<_> = (0..runs).map(|r| w1_saves(&format!("p-{r}"))).collect();
    let mut n = 0;
    let t = Instant::now();
    for saves in &all {
        let mut known: Option<steadfast::store::plan::Known> = None;
        for (v, (cp, step)) in saves.iter().enumerate() {
            let expected = (v > 0).then_some(v as u64);
            let mut req = SaveRequest::new(cp, expected);
            if let Some(s) = step {
                req = req.with_step(s);
            }
            let plan = plan_save(&req, known.as_ref(), 64 << 20)?;
            known = plan.known_after(v as u64 + 1, cp.next, known.as_ref());
            std::hint::black_box(&plan);
            n += 1;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Microseconds per hand-off of the async worker to blocking code and back
/// (`block_in_place` around nothing), as a lone save pays it on a
/// multi-threaded runtime.
async fn hand_off(n: usize) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        tokio::task::block_in_place(|| std::hint::black_box(i));
        tokio::task::yield_now().await;
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The WAL's frames after a fresh database's writes, from its size.
fn wal_frames(db: &Path) -> Res<f64> {
    let conn = rusqlite::Connection::open(db)?;
    let page: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    drop(conn);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    Ok(size.saturating_sub(32) as f64 / (page as f64 + 24.0))
}

/// A directory on a RAM disk for the no-sync measurements, if there is one.
fn ram_dir() -> Option<PathBuf> {
    let base = Path::new("/dev/shm");
    if !base.is_dir() {
        return None;
    }
    let dir = base.join(format!("steadfast-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).ok()?;
    Some(dir)
}

/// A fresh SQLite store at `dir/name.db`.
fn fresh(dir: &Path, name: &str) -> Res<(SqliteStore, PathBuf)> {
    let path = dir.join(format!("{name}.db"));
    remove_db(&path);
    Ok((SqliteStore::open(&path)?, path))
}

/// Microseconds per raw upsert at `path` (WAL, synchronous=FULL), and its
/// WAL frames per commit.
fn raw(path: &Path, n: usize) -> Res<(f64, f64)> {
    remove_db(path);
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
    let before = wal_frames(path)?;
    crate::baseline::upserts(&conn, 100)?;
    let frames = (wal_frames(path)? - before) / 100.0;
    let t = Instant::now();
    crate::baseline::upserts(&conn, n)?;
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    drop(conn);
    remove_db(path);
    Ok((us, frames))
}

/// Microseconds per raw upsert at `path`, each after `spin_us` of CPU work
/// (a busy loop on the clock): what the disk's sync costs when the CPU was
/// busy, not idle, just before it, as a W1 step's is.
fn raw_busy(path: &Path, n: usize, spin_us: f64) -> Res<f64> {
    remove_db(path);
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    crate::baseline::upserts(&conn, 100)?;
    let spin = std::time::Duration::from_secs_f64(spin_us.max(0.0) / 1e6);
    let t = Instant::now();
    crate::baseline::upserts_with(&conn, n, || {
        let t = Instant::now();
        while t.elapsed() < spin {
            std::hint::spin_loop();
        }
    })?;
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    drop(conn);
    remove_db(path);
    Ok(us)
}

/// The breakdown, on a worker of the runtime (a spawned task), where the
/// engine runs and where `block_in_place` hands the worker's other tasks to
/// another thread.
pub async fn measure(args: &Args) -> Res<()> {
    let args = args.clone();
    tokio::spawn(async move { measure_here(&args).await.map_err(|e| e.to_string()) }).await??;
    Ok(())
}

/// The breakdown, medians of the repetitions.
async fn measure_here(args: &Args) -> Res<()> {
    let reps = if args.quick { 1 } else { args.reps().max(3) };
    let (runs, upserts) = if args.quick { (10, 200) } else { (200, 2_000) };
    let ram = ram_dir();
    let mut rows: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut push = |k: &'static str, v: f64| rows.entry(k).or_default().push(v);
    for rep in 0..reps {
        let (us, frames) = raw(&args.dir.join("bd-raw.db"), upserts)?;
        push("raw_upsert_us", us);
        push("raw_wal_frames_per_commit", frames);
        let (store, path) = fresh(&args.dir, &format!("bd-w1-{rep}"))?;
        let store = Arc::new(store);
        let wall = run_many(store.clone() as Arc<dyn Store>, "run", runs, 1).await?;
        push(
            "w1_us_per_step",
            wall.as_secs_f64() * 1e6 / (runs * STEPS) as f64,
        );
        drop(store);
        remove_db(&path);
        // The saves alone; the WAL's growth over the first 20 runs counts
        // frames.
        let (store, path) = fresh(&args.dir, &format!("bd-saves-{rep}"))?;
        let before = wal_frames(&path)?;
        saves(&store, "f", 20).await?;
        let after = wal_frames(&path)?;
        // SQLite checkpoints the log at 1000 frames and then writes it from
        // its start again: the count holds only below that.
        if after >= 1000.0 {
            return Err(format!("the WAL reached {after} frames; count fewer saves").into());
        }
        push(
            "wal_frames_per_commit",
            (after - before) / (20 * STEPS) as f64,
        );
        for (key, v) in timed_saves(&store, "s", runs, &DISK_KEYS).await? {
            push(key, v);
        }
        push("load_missing_us", loads(&store, runs).await?);
        drop(store);
        remove_db(&path);
        // The same count for the engine's own saves.
        let (store, path) = fresh(&args.dir, &format!("bd-w1-frames-{rep}"))?;
        let store: Arc<dyn Store> = Arc::new(store);
        let before = wal_frames(&path)?;
        run_many(Arc::clone(&store), "run", 20, 1).await?;
        // Read before the store closes (closing checkpoints the log away).
        push(
            "w1_wal_frames_per_commit",
            (wal_frames(&path)? - before) / (20 * STEPS) as f64,
        );
        drop(store);
        remove_db(&path);
        if let Some(ram) = &ram {
            let (store, path) = fresh(ram, &format!("bd-ram-{rep}"))?;
            for (key, v) in timed_saves(&store, "s", runs, &RAM_KEYS).await? {
                push(key, v);
            }
            drop(store);
            remove_db(&path);
            let (store, path) = fresh(ram, &format!("bd-ram-w1-{rep}"))?;
            let wall = run_many(Arc::new(store) as Arc<dyn Store>, "run", runs, 1).await?;
            let w1_ram = wall.as_secs_f64() * 1e6 / (runs * STEPS) as f64;
            push("w1_ram_us_per_step", w1_ram);
            remove_db(&path);
            let (store, path) = fresh(ram, &format!("bd-ram-load-{rep}"))?;
            push("load_missing_ram_us", loads(&store, runs).await?);
            drop(store);
            remove_db(&path);
            let (us, _) = raw(&ram.join("bd-raw.db"), upserts)?;
            push("raw_upsert_ram_us", us);
            // The raw upsert on the disk again, with the CPU time a W1 step
            // spends beyond it (both measured on the RAM disk just now)
            // spent before each commit.
            let spin = w1_ram - us;
            push("raw_upsert_busy_spin_us", spin);
            push(
                "raw_upsert_busy_us",
                raw_busy(&args.dir.join("bd-raw-busy.db"), upserts, spin)?,
            );
        }
        push("plan_us", plans(runs)?);
        push("hand_off_us", hand_off(runs * STEPS).await);
    }
    if let Some(ram) = &ram {
        let _ = std::fs::remove_dir_all(ram);
    }
    let m: serde_json::Map<String, serde_json::Value> = rows
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!((median(v) * 100.0).round() / 100.0)))
        .collect();
    let get = |k: &str| {
        m.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    let mut fields = m.clone();
    fields.insert("reps".into(), json!(reps));
    // A W1 step makes one save (the first creates the run): the engine's
    // share is what a step costs beyond it.
    fields.insert(
        "engine_us".into(),
        json!(round(get("w1_us_per_step") - get("save_us"))),
    );
    fields.insert(
        "engine_ram_us".into(),
        json!(round(get("w1_ram_us_per_step") - get("save_ram_us"))),
    );
    fields.insert(
        "disk_us".into(),
        json!(round(get("save_us") - get("save_ram_us"))),
    );
    fields.insert(
        "queue_statements_wal_us".into(),
        json!(round(get("save_ram_us") - get("plan_us"))),
    );
    fields.insert(
        "raw_upsert_busy_sync_extra_us".into(),
        json!(round(
            get("raw_upsert_busy_us") - get("raw_upsert_busy_spin_us") - get("raw_upsert_us")
        )),
    );
    fields.insert(
        "notes".into(),
        json!("engine = W1 step - save (engine_ram: both on a RAM disk); disk = save on disk - save on a RAM disk; queue_statements_wal = save on a RAM disk - plan; save_{begin,statements,commit,answer,log}_us = the store's commit taken apart, per commit (the write turn and BEGIN IMMEDIATE; the statements; COMMIT, its WAL frames written and synced; the answers; the look at the WAL's length and any copy back), and save_outside_commit_us the rest of a save (plan, queue, hand-off, return), the same with _ram_ on the RAM disk; raw_upsert_busy = the raw upsert with raw_upsert_busy_spin (W1's CPU beyond the upsert's) of busy CPU before each commit, and raw_upsert_busy_sync_extra what that adds beyond the spin itself; medians"),
    );
    emit(
        "steadfast",
        "sqlite",
        "breakdown",
        crate::durability("sqlite"),
        serde_json::Value::Object(fields),
    );
    Ok(())
}
