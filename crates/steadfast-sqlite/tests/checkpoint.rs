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

/// The log's bound in bytes: `pages` frames of a 4 KiB page and its header.
fn frames(pages: u64) -> u64 {
    pages * (4096 + 24)
}

/// Saves runs `from..to`, each a new value of `bytes` bytes, and returns
/// the longest the log was after any of them.
async fn save_runs(
    store: &SqliteStore,
    db: &Path,
    runs: std::ops::Range<usize>,
    bytes: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    let mut largest_log = 0;
    for i in runs {
        store
            .save(SaveRequest::new(&run_with_value(i, bytes), None))
            .await?;
        largest_log = largest_log.max(wal_bytes(db));
    }
    Ok(largest_log)
}

/// Every one of `runs` reads back whole from a handle of its own.
async fn reads_back(db: &Path, runs: std::ops::Range<usize>, bytes: usize) -> TestResult {
    let store = SqliteStore::open(db)?;
    for i in runs {
        let cp = store
            .load(&format!("big-{i}"))
            .await?
            .ok_or("a run is missing")?;
        assert_eq!(
            cp.state["doc"],
            run_with_value(i, bytes).state["doc"],
            "run {i}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_checkpointed_by_the_thread_and_the_log_stays_bounded() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    const RUNS: usize = 48;
    const VALUE: usize = 512 << 10;
    let largest_log = save_runs(&store, &db, 0..RUNS, VALUE).await?;
    // 48 values of 512 KiB are some 6,000 pages: with no checkpoint at
    // all, the log would hold them all. The write connection checkpoints
    // itself at 4,000 pages at the latest, after the commit that reached
    // them (128 pages and a few).
    assert!(
        largest_log <= frames(4_000 + 200),
        "the log reached {largest_log} bytes"
    );
    assert!(
        (RUNS * VALUE) as u64 > frames(4_000 + 200),
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
    reads_back(&db, 0..RUNS, VALUE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_commits_are_checkpointed_by_the_write_connection_once_the_log_is_long() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    // A few pages each, far below 1,000 in all: a checkpoint per commit
    // would double the syncs.
    save_runs(&store, &db, 0..50, 64).await?;
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
    let largest_log = save_runs(&store, &db, 50..600, 64).await?;
    let stats = store.write_stats();
    assert!(stats.checkpoints_by_writer >= 1, "{stats:?}");
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert!(
        largest_log <= frames(1_000 + 50),
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
    let largest_log = save_runs(&store, &db, 0..RUNS, VALUE).await?;
    // The thread takes the ask and never runs its pass; the write
    // connection checkpoints itself once the log holds 4,000 pages, after
    // the commit that reached them (128 pages and a few).
    let stats = store.write_stats();
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert!(stats.checkpoints_by_writer >= 1, "{stats:?}");
    assert!(
        largest_log <= frames(4_000 + 200),
        "the log reached {largest_log} bytes"
    );
    drop(store);
    reads_back(&db, 0..RUNS, VALUE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_writing_large_values_at_once_share_the_log_and_keep_it_bounded() -> TestResult
{
    // Two handles on one file, as two processes have: each has its own
    // write connection and checkpoint thread, and each sees the other's
    // commits in the log's length. SQLite runs one checkpoint at a time;
    // a handle whose checkpoint finds another running tries again later.
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let a = SqliteStore::open(&db)?;
    let b = SqliteStore::open(&db)?;
    const RUNS: usize = 40;
    const VALUE: usize = 512 << 10;
    // In rounds, each a save of each handle on a task of its own, both
    // sent before either is awaited: their commits contend for the
    // database's write lock (a save commits on its caller's thread, so
    // two saves in one task would never overlap).
    let mut largest_log = 0;
    for i in 0..RUNS {
        let save = |store: &SqliteStore, run: usize| {
            let (store, db) = (store.clone(), db.clone());
            tokio::spawn(async move {
                save_runs(&store, &db, run..run + 1, VALUE)
                    .await
                    .map_err(|e| e.to_string())
            })
        };
        let (ta, tb) = (save(&a, i), save(&b, RUNS + i));
        largest_log = largest_log.max(ta.await??).max(tb.await??);
    }
    // 80 values of 512 KiB are some 10,000 pages. Each handle holds the
    // log to 4,000 pages after its own commits once a running checkpoint
    // ends; how much the other appends meanwhile depends on how long that
    // takes, so the bound is loose: it held at 1,119 to 1,383 pages here, and
    // fails at 11,069 with checkpoints off.
    assert!(
        largest_log <= frames(8_000),
        "the log reached {largest_log} bytes"
    );
    assert!(
        (2 * RUNS * VALUE) as u64 > frames(8_000),
        "the test writes more than the bound it checks"
    );
    // The log started over, so one of the handles copied it whole (the
    // automatic checkpoint is off on both write connections).
    let (sa, sb) = (a.write_stats(), b.write_stats());
    let copies =
        sa.checkpoints + sa.checkpoints_by_writer + sb.checkpoints + sb.checkpoints_by_writer;
    assert!(copies >= 1, "{sa:?} {sb:?}");
    drop((a, b));
    reads_back(&db, 0..2 * RUNS, VALUE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_log_left_by_another_connection_is_copied_after_the_first_commit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    drop(SqliteStore::open(&db)?);
    // Another connection, whose automatic checkpoint is off, leaves some
    // 6,000 pages in the log and stays open, so that nothing copies them
    // when it is done. Its table is dropped again: the store's schema is
    // as the store left it.
    let other = rusqlite::Connection::open(&db)?;
    other.pragma_update(None, "wal_autocheckpoint", 0)?;
    other.execute_batch("CREATE TABLE scratch (x BLOB)")?;
    for _ in 0..48 {
        other.execute("INSERT INTO scratch VALUES (randomblob(512 * 1024))", [])?;
    }
    other.execute_batch("DROP TABLE scratch")?;
    // A passive checkpoint (which copies what it can) reports whether it
    // could run and how many frames the log holds.
    let log_frames = |c: &rusqlite::Connection| -> rusqlite::Result<(i64, i64)> {
        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    };
    assert!(wal_bytes(&db) > frames(4_000), "the log is long");

    // The store's first commit finds the log past 4,000 pages, whoever
    // wrote them, and its write connection copies it; the commit after
    // that starts the log over.
    let store = SqliteStore::open(&db)?;
    save_runs(&store, &db, 0..1, 64).await?;
    let stats = store.write_stats();
    assert_eq!(stats.checkpoints_by_writer, 1, "{stats:?}");
    save_runs(&store, &db, 1..2, 64).await?;
    let (busy, frames_now) = log_frames(&other)?;
    assert_eq!(busy, 0, "the log could not be looked at");
    assert!(
        (0..50).contains(&frames_now),
        "the log holds {frames_now} frames"
    );
    drop((store, other));
    reads_back(&db, 0..2, 64).await
}
