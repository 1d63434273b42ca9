//! The log is copied back into the database by the store's checkpoint
//! thread, not inside the commits, and stays bounded however much is
//! written.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_core::store::SaveRequest;
use steadfast_core::{Checkpoint, RunStatus, Store, Timestamp};
use steadfast_sqlite::{SqliteOptions, SqliteStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The size of the store's log file.
fn wal_bytes(db: &Path) -> u64 {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// A run whose state holds one new value of `bytes` bytes (a blob).
fn run_with_value(i: usize, bytes: usize) -> Checkpoint {
    let mut cp = Checkpoint::new(format!("big-{i}"), "w", Timestamp::from_unix_millis(1_000));
    cp.status = RunStatus::Running;
    // Different content for each run, so that each is stored.
    let text = format!("{i:08}{}", "x".repeat(bytes - 8));
    cp.state.insert("doc".into(), json!(text));
    cp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_checkpointed_by_the_thread_and_the_log_stays_bounded() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    const RUNS: usize = 48;
    const VALUE: usize = 512 << 10;
    let mut largest_log = 0;
    for i in 0..RUNS {
        store
            .save(SaveRequest::new(&run_with_value(i, VALUE), None))
            .await?;
        largest_log = largest_log.max(wal_bytes(&db));
    }
    // 48 values of 512 KiB are some 6,000 pages: with no checkpoint at
    // all, the log would hold them all. The write connection checkpoints
    // itself at 4,000 pages at the latest, after the commit that reached
    // them (128 pages and a few).
    let page = 4096 + 24;
    assert!(
        largest_log <= (4_000 + 200) * page,
        "the log reached {largest_log} bytes"
    );
    assert!(
        (RUNS * VALUE) as u64 > (4_000 + 200) * page,
        "the test writes more than the bound it checks"
    );
    // The thread was asked (the log passed 1,000 pages) and ran, and was
    // asked again once the log had started over after its pass was closed
    // (some 6,000 pages make several passes of 1,000).
    let until = Instant::now() + Duration::from_secs(20);
    while store.write_stats().checkpoints < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = store.write_stats();
    assert!(stats.checkpoints >= 2, "{stats:?}");
    // Everything reads back, from a handle of its own too.
    drop(store);
    let store = SqliteStore::open(&db)?;
    for i in 0..RUNS {
        let cp = store
            .load(&format!("big-{i}"))
            .await?
            .ok_or("a run is missing")?;
        assert_eq!(
            cp.state["doc"],
            run_with_value(i, VALUE).state["doc"],
            "run {i}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_commits_are_checkpointed_by_the_write_connection_once_the_log_is_long() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    // A few pages each, far below 1,000 in all: a checkpoint per commit
    // would double the syncs.
    for i in 0..50 {
        store
            .save(SaveRequest::new(&run_with_value(i, 64), None))
            .await?;
    }
    let stats = store.write_stats();
    assert_eq!(
        (stats.checkpoints, stats.checkpoints_by_writer),
        (0, 0),
        "{stats:?}"
    );
    assert!(wal_bytes(&db) > 0, "the commits are in the log");
    // Past 1,000 pages of small commits (a new run writes a few pages), the
    // write connection checkpoints itself, as SQLite would, and the
    // thread is not asked: a checkpoint beside such commits slows them.
    let mut largest_log = 0;
    for i in 50..600 {
        store
            .save(SaveRequest::new(&run_with_value(i, 64), None))
            .await?;
        largest_log = largest_log.max(wal_bytes(&db));
    }
    let stats = store.write_stats();
    assert!(stats.checkpoints_by_writer >= 1, "{stats:?}");
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert!(
        largest_log <= (1_000 + 50) * (4096 + 24),
        "the log reached {largest_log} bytes"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_connection_bounds_the_log_when_the_thread_never_copies() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let mut opts = SqliteOptions::default();
    opts.mutants.stalled_checkpoint_thread = true;
    let store = SqliteStore::open_with(&db, opts)?;
    const RUNS: usize = 48;
    const VALUE: usize = 512 << 10;
    let mut largest_log = 0;
    for i in 0..RUNS {
        store
            .save(SaveRequest::new(&run_with_value(i, VALUE), None))
            .await?;
        largest_log = largest_log.max(wal_bytes(&db));
    }
    // The thread takes the ask and never runs its pass; the write
    // connection checkpoints itself once the log holds 4,000 pages, after
    // the commit that reached them (128 pages and a few).
    let stats = store.write_stats();
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert!(stats.checkpoints_by_writer >= 1, "{stats:?}");
    assert!(
        largest_log <= (4_000 + 200) * (4096 + 24),
        "the log reached {largest_log} bytes"
    );
    drop(store);
    let store = SqliteStore::open(&db)?;
    for i in 0..RUNS {
        let cp = store
            .load(&format!("big-{i}"))
            .await?
            .ok_or("a run is missing")?;
        assert_eq!(
            cp.state["doc"],
            run_with_value(i, VALUE).state["doc"],
            "run {i}"
        );
    }
    Ok(())
}
