//! Steps recorded by their history row alone (schema 5): an ordinary
//! checkpoint writes one page, and everything that reads or rewrites a run
//! sees the progress those rows carry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::json;
use steadfast_core::store::{ListFilter, SaveRequest};
use steadfast_core::{
    update, Checkpoint, Event, RunStatus, Runner, Step, StepRecord, Store, StoreErrorKind,
    StoreExt as _, Timestamp, Workflow,
};
use steadfast_sqlite::SqliteStore;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Steps `s0`..`s{n-1}`; step `i` sets `s<i>` to `i`.
fn steps(n: usize) -> Workflow {
    let mut b = Workflow::builder("w");
    for i in 0..n {
        b = b.push(Step::new(format!("s{i}"), move |_, _| async move {
            update(json!({ format!("s{i}"): i }))
        }));
    }
    b.build().expect("a valid workflow")
}

fn wal(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

/// The WAL's frames so far (4 KiB pages, a 24-byte header each).
fn frames(db: &Path) -> u64 {
    let size = std::fs::metadata(wal(db)).map(|m| m.len()).unwrap_or(0);
    size.saturating_sub(32) / (4096 + 24)
}

#[tokio::test]
async fn an_ordinary_step_writes_one_page() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let path = db.clone();
    Runner::new(&store)
        .observer(move |e| {
            if let Event::Started { .. } = e {
                sink.lock().expect("frames").push(frames(&path));
            }
        })
        .run("r", &steps(8))
        .await?;
    let at_start = seen.lock().expect("frames").clone();
    // Between the starts of steps i and i + 1 lies step i's save. The first
    // creates the run (its head and the index entries over it); the ones
    // after it only add a history row.
    let per_save: Vec<u64> = at_start.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(per_save.len(), 7, "{at_start:?}");
    assert!(
        per_save[0] >= 2,
        "the first save writes the head too: {per_save:?}"
    );
    assert_eq!(
        &per_save[1..],
        &[1; 6],
        "an ordinary step is one page: {per_save:?}"
    );
    Ok(())
}

/// A run of `n` completed steps `s0`.. saved one by one through `store`,
/// each save recording its step and leaving the head as it was.
async fn saved_steps(
    store: &dyn Store,
    run_id: &str,
    n: usize,
) -> Result<(Checkpoint, u64), Box<dyn std::error::Error>> {
    let at = Timestamp::from_unix_millis(1_700_000_000_000);
    let mut cp = Checkpoint::new(run_id, "w", at);
    cp.status = RunStatus::Running;
    let mut version = None;
    for i in 0..n {
        let up = json!({ format!("s{i}"): i });
        let up = up.as_object().cloned().unwrap_or_default();
        cp.state.extend(up.clone());
        cp.completed.push(format!("s{i}"));
        cp.next = i + 1;
        cp.updated_at = Timestamp::from_unix_millis(1_700_000_000_000 + i as u64 + 1);
        // As the engine does: a new writer number with every save, which
        // tells it whether a save with an unknown outcome landed.
        cp.writer = u64::MAX - i as u64;
        let rec = StepRecord::new(i, &format!("s{i}"), up, 1, at, at);
        version = Some(
            store
                .save(SaveRequest::new(&cp, version).with_step(&rec))
                .await?,
        );
    }
    Ok((cp, version.unwrap_or(0)))
}

#[tokio::test]
async fn another_handle_sees_the_progress_of_rows_alone() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let a = SqliteStore::open(&db)?;
    let (cp, version) = saved_steps(&a, "r", 6).await?;
    // A second handle knows nothing of the run but what the file says.
    let b = SqliteStore::open(&db)?;
    let loaded = b.load("r").await?.ok_or("the run is gone")?;
    assert_eq!(loaded.version, version);
    assert_eq!(loaded.next, 6);
    assert_eq!(loaded.state, cp.state);
    assert_eq!(loaded.completed, cp.completed);
    assert_eq!(loaded.updated_at, cp.updated_at);
    assert_eq!(loaded.writer, cp.writer, "the last save's writer number");
    let listed = b.list(&ListFilter::default()).await?;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].next, listed[0].version), (6, version));
    assert_eq!(listed[0].updated_at, cp.updated_at);
    // The time filter sees the last step's time, not the head's.
    let older = ListFilter::new().updated_before(Timestamp::from_unix_millis(1_700_000_000_006));
    assert!(
        b.list(&older).await?.is_empty(),
        "the run was saved at ...006"
    );
    let history = b.history("r").await?.ok_or("no history")?;
    assert_eq!(history.len(), 6);
    // A stale save is a conflict and writes nothing: one from a handle that
    // loaded the run before its last step (and so would record by row alone
    // too), and one a version behind with no knowledge of the run.
    let (mut behind, v_behind) = saved_steps(&a, "q", 5).await?;
    let c = SqliteStore::open(&db)?;
    assert_eq!(c.load("q").await?.map(|q| q.version), Some(v_behind));
    let ahead = a.load("q").await?.ok_or("q is gone")?;
    let at = ahead.created_at;
    let mut next = ahead.clone();
    next.completed.push("s5".into());
    next.next = 6;
    let rec = StepRecord::new(5, "s5", Default::default(), 1, at, at);
    let v_ahead = a
        .save(SaveRequest::new(&next, Some(v_behind)).with_step(&rec))
        .await?;
    behind.completed.push("other".into());
    behind.next = 6;
    let rec = StepRecord::new(5, "other", Default::default(), 1, at, at);
    for (who, store) in [
        ("a handle that knew the run", &c),
        ("a fresh handle", &SqliteStore::open(&db)?),
    ] {
        let err = store
            .save(SaveRequest::new(&behind, Some(v_behind)).with_step(&rec))
            .await
            .expect_err("a save at an old version");
        assert_eq!(err.kind(), StoreErrorKind::Conflict, "{who}: {err}");
        assert!(
            err.to_string().contains(&v_ahead.to_string()),
            "{who}: the version found: {err}"
        );
    }
    let q = b.load("q").await?.ok_or("q is gone")?;
    assert_eq!(
        (q.version, q.completed.last().map(String::as_str)),
        (v_ahead, Some("s5"))
    );
    assert_eq!(a.load("r").await?.map(|c| c.version), Some(version));
    Ok(())
}

/// A handle remembers where the runs it recorded are, so that its next step
/// need not read that back; a write by another handle in between must make
/// it look again, or a stale save would pass its version check.
#[tokio::test]
async fn a_handle_sees_another_handles_write_between_two_of_its_steps() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let a = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&a, "r", 3).await?;
    // Another handle (another process, for SQLite) renews the run's lease:
    // a head write, which takes in the rows and moves the version on.
    let b = SqliteStore::open(&db)?;
    let mut theirs = b.load("r").await?.ok_or("the run is gone")?;
    theirs.attempts = 2;
    let moved = b
        .save(SaveRequest::new(&theirs, Some(version)).head_only())
        .await?;
    assert!(moved > version);
    // The first handle's next step, at the version it last wrote, is stale.
    let at = Timestamp::from_unix_millis(1_700_000_000_000);
    let up = json!({ "s3": 3 }).as_object().cloned().unwrap_or_default();
    cp.state.extend(up.clone());
    cp.completed.push("s3".into());
    cp.next = 4;
    let rec = StepRecord::new(3, "s3", up, 1, at, at);
    let err = a
        .save(SaveRequest::new(&cp, Some(version)).with_step(&rec))
        .await
        .expect_err("a save at a version another handle moved on from");
    assert_eq!(err.kind(), StoreErrorKind::Conflict, "{err}");
    let fresh = SqliteStore::open(&db)?;
    assert_eq!(fresh.history("r").await?.map(|h| h.len()), Some(3));
    // At the version as it now is, the step is recorded.
    cp.attempts = 2;
    let now = a
        .save(SaveRequest::new(&cp, Some(moved)).with_step(&rec))
        .await?;
    let loaded = fresh.load("r").await?.ok_or("the run is gone")?;
    assert_eq!((loaded.next, loaded.version), (4, now));
    Ok(())
}

/// A head write checks its expectation against where the progress rows
/// leave the run, not against the head's own (older) columns: a save at
/// the version of the run's first save, or of any row but the last, is
/// stale, and writes nothing.
#[tokio::test]
async fn a_head_write_at_a_version_the_rows_moved_on_from_conflicts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&store, "r", 5).await?;
    let conn = rusqlite::Connection::open(&db)?;
    let head_version: i64 =
        conn.query_row("SELECT version FROM runs WHERE run_id = 'r'", [], |r| {
            r.get(0)
        })?;
    assert!((head_version as u64) < version, "the rows carry the run on");
    let head_row = |conn: &rusqlite::Connection| {
        conn.query_row(
            "SELECT next, version, updated_at, delta_bytes, head FROM runs WHERE run_id = 'r'",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                ))
            },
        )
    };
    let before = (versions(&conn)?, head_row(&conn)?);
    cp.attempts = 4;
    for stale in [head_version as u64, version - 1] {
        // A lease renewal, a rewind (a snapshot) and a step with a status
        // change (a delta) alike.
        let rec = StepRecord::new(
            5,
            "s5",
            serde_json::Map::new(),
            1,
            cp.updated_at,
            cp.updated_at,
        );
        let mut done = cp.clone();
        done.next = 6;
        done.completed.push("s5".into());
        done.status = RunStatus::Completed;
        for (what, req) in [
            (
                "a head write",
                SaveRequest::new(&cp, Some(stale)).head_only(),
            ),
            ("a snapshot", SaveRequest::new(&cp, Some(stale))),
            (
                "a step with a status change",
                SaveRequest::new(&done, Some(stale)).with_step(&rec),
            ),
        ] {
            let err = store.save(req).await.expect_err(what);
            assert_eq!(
                err.kind(),
                StoreErrorKind::Conflict,
                "{what} at {stale}: {err}"
            );
        }
    }
    assert_eq!(
        (versions(&conn)?, head_row(&conn)?),
        before,
        "a stale save wrote something"
    );
    let fresh = SqliteStore::open(&db)?;
    let loaded = fresh.load("r").await?.ok_or("the run is gone")?;
    assert_eq!(
        (loaded.next, loaded.version, loaded.attempts),
        (5, version, 0)
    );
    Ok(())
}

#[tokio::test]
async fn a_head_write_takes_the_progress_in() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&store, "r", 5).await?;
    // A head-only save (as a lease renewal makes) keeps every step.
    cp.attempts = 3;
    let version = store
        .save(SaveRequest::new(&cp, Some(version)).head_only())
        .await?;
    let other = SqliteStore::open(&db)?;
    let loaded = other.load("r").await?.ok_or("the run is gone")?;
    assert_eq!(
        (loaded.next, loaded.version, loaded.attempts),
        (5, version, 3)
    );
    assert_eq!(loaded.state, cp.state);
    // The head's own columns now say so too.
    let conn = rusqlite::Connection::open(&db)?;
    let (next, stored): (i64, i64) = conn.query_row(
        "SELECT next, version FROM runs WHERE run_id = 'r'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    assert_eq!((next, stored), (5, version as i64));
    // Deleting at the run's version works; at an older one it conflicts.
    let (_, v2) = saved_steps(&store, "q", 4).await?;
    let err = store
        .delete_if("q", v2 - 1)
        .await
        .expect_err("an old version");
    assert_eq!(err.kind(), StoreErrorKind::Conflict, "{err}");
    assert!(store.delete_if("q", v2).await?);
    assert!(store.load("q").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn a_completed_run_resumes_to_nothing_and_a_rewind_cuts_progress_rows() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&store, "r", 6).await?;
    // A save without a step that goes back to step 2 (a rewind) writes a
    // snapshot and drops the later rows, progress rows included.
    cp.next = 2;
    cp.completed.truncate(2);
    cp.state.retain(|k, _| k == "s0" || k == "s1");
    let version = store.save(SaveRequest::new(&cp, Some(version))).await?;
    let other = SqliteStore::open(&db)?;
    let loaded = other.load("r").await?.ok_or("the run is gone")?;
    assert_eq!((loaded.next, loaded.version), (2, version));
    assert_eq!(loaded.state, cp.state);
    assert_eq!(other.history("r").await?.map(|h| h.len()), Some(2));
    Ok(())
}

#[tokio::test]
async fn a_progress_row_without_its_version_is_corrupt() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    saved_steps(&store, "r", 4).await?;
    drop(store);
    let conn = rusqlite::Connection::open(&db)?;
    let changed = conn.execute(
        "UPDATE steps SET version = NULL WHERE run_id = 'r' AND idx = 3",
        [],
    )?;
    assert_eq!(changed, 1);
    drop(conn);
    let store = SqliteStore::open(&db)?;
    let err = store.load("r").await.expect_err("a damaged progress row");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("steps[3]"), "names the row: {err}");
    Ok(())
}

#[tokio::test]
async fn the_engine_resumes_after_progress_rows_from_another_process_view() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    saved_steps(&store, "r", 3).await?;
    drop(store);
    // A fresh handle runs the rest of a five-step workflow whose first three
    // steps are recorded by rows alone: they are skipped, not run again.
    let store = SqliteStore::open(&db)?;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut b = Workflow::builder("w");
    for i in 0..5 {
        let ran = Arc::clone(&ran);
        b = b.push(Step::new(format!("s{i}"), move |_, _| {
            ran.lock().expect("ran").push(i);
            async move { update(json!({ format!("s{i}"): i })) }
        }));
    }
    let out = steadfast_core::run("r", &b.build()?, &store).await?;
    assert_eq!(*ran.lock().expect("ran"), vec![3, 4]);
    let state = out.completed().ok_or("not completed")?;
    assert_eq!(state.len(), 5);
    Ok(())
}

#[test]
fn a_load_sees_one_commit_while_heads_and_rows_are_written() -> TestResult {
    // Many commits make a torn read likely: on a RAM disk where there is one.
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm")?,
        false => tempfile::tempdir()?,
    };
    let db = dir.path().join("runs.db");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let writer = SqliteStore::open(&db)?;
    let (mut cp, mut version) = rt.block_on(saved_steps(&writer, "r", 1))?;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (db, done) = (db.clone(), Arc::clone(&done));
        std::thread::spawn(move || -> Result<usize, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let store = SqliteStore::open(&db).map_err(|e| e.to_string())?;
            let mut loads = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let cp = rt
                    .block_on(store.load("r"))
                    .map_err(|e| e.to_string())?
                    .ok_or("the run is gone")?;
                // Each head write records its version in `attempts`; a step
                // recorded by its row alone follows it. One commit's view has
                // the run at that head's version or one step after it.
                let lag = cp.version.saturating_sub(u64::from(cp.attempts));
                if cp.attempts != 0 && lag > 1 {
                    return Err(format!(
                        "a torn read: version {} with the head of version {}",
                        cp.version, cp.attempts
                    ));
                }
                loads += 1;
            }
            Ok(loads)
        })
    };
    rt.block_on(async {
        for i in 1..2000 {
            // A head-only save (as a lease renewal), then a step by its row.
            cp.attempts = u32::try_from(version + 1)?;
            version = writer
                .save(SaveRequest::new(&cp, Some(version)).head_only())
                .await?;
            // One key, so that the state (and a load) stays small.
            let up = json!({ "n": i });
            let up = up.as_object().cloned().unwrap_or_default();
            cp.state.extend(up.clone());
            cp.completed.push(format!("s{i}"));
            cp.next = i + 1;
            let rec = StepRecord::new(i, &format!("s{i}"), up, 1, cp.created_at, cp.created_at);
            version = writer
                .save(SaveRequest::new(&cp, Some(version)).with_step(&rec))
                .await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let loads = reader.join().map_err(|_| "the reader panicked")??;
    assert!(loads > 0);
    Ok(())
}

#[tokio::test]
async fn a_process_of_an_older_build_cannot_write_the_head_over_progress_rows() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (_, version) = saved_steps(&store, "r", 4).await?;
    // What a schema-4 build does for its next step: it reads the head alone
    // (version and next as the head last wrote them) and updates it.
    let conn = rusqlite::Connection::open(&db)?;
    let (next, head_version): (i64, i64) = conn.query_row(
        "SELECT next, version FROM runs WHERE run_id = 'r'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    assert!(head_version < version as i64, "the head lags its rows");
    let err = conn
        .execute(
            "UPDATE runs SET next = ?1, version = ?2 WHERE run_id = 'r' AND version = ?3",
            rusqlite::params![next + 1, head_version + 1, head_version],
        )
        .expect_err("the stale head write");
    assert!(err.to_string().contains("newer build"), "{err}");
    drop(conn);
    let loaded = store.load("r").await?.ok_or("the run is gone")?;
    assert_eq!((loaded.version, loaded.next), (version, 4));
    Ok(())
}

/// Run `r`'s history rows: their indexes and versions (as stored, of any type).
fn versions(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<(i64, rusqlite::types::Value)>> {
    conn.prepare("SELECT idx, version FROM steps WHERE run_id = 'r' ORDER BY idx")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

#[tokio::test]
async fn a_damaged_progress_row_is_reported_by_every_path_and_nothing_is_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (cp, version) = saved_steps(&store, "r", 5).await?;
    drop(store);
    let conn = rusqlite::Connection::open(&db)?;
    // A row in the middle of the progress rows loses its version.
    assert_eq!(
        conn.execute(
            "UPDATE steps SET version = NULL WHERE run_id = 'r' AND idx = 2",
            []
        )?,
        1
    );
    let before = versions(&conn)?;
    let head = |conn: &rusqlite::Connection| -> rusqlite::Result<(i64, i64, String)> {
        conn.query_row(
            "SELECT next, version, head FROM runs WHERE run_id = 'r'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    };
    let head_before = head(&conn)?;
    let store = SqliteStore::open(&db)?;
    let err = store.load("r").await.expect_err("load");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "load: {err}");
    // A head write at the version the run had reached takes the rows in
    // first: it finds the damage and writes nothing.
    let err = store
        .save(SaveRequest::new(&cp, Some(version)).head_only())
        .await
        .expect_err("head-only save");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "save: {err}");
    assert!(err.to_string().contains("steps[2]"), "names the row: {err}");
    let err = store.delete_if("r", version).await.expect_err("delete_if");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "delete_if: {err}");
    assert_eq!(versions(&conn)?, before, "the history is as it was");
    assert_eq!(head(&conn)?, head_before, "the head is as it was");
    // The last row damaged: a list reports it too, not the head's values.
    conn.execute(
        "UPDATE steps SET version = NULL WHERE run_id = 'r' AND idx = 4",
        [],
    )?;
    let err = store.list(&ListFilter::new()).await.expect_err("list");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "list: {err}");
    Ok(())
}

#[tokio::test]
async fn an_imported_step_at_an_unrising_version_loads_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&store, "r", 3).await?;
    let up = json!({"s3": 3});
    let up = up.as_object().cloned().unwrap_or_default();
    cp.state.extend(up.clone());
    cp.completed.push("s3".into());
    cp.next = 4;
    let rec = StepRecord::new(3, "s3", up, 1, cp.created_at, cp.created_at);
    // An import writes the version it carries, here the one it replaces.
    let written = store
        .save(
            SaveRequest::new(&cp, Some(version))
                .with_step(&rec)
                .writing_version(version),
        )
        .await?;
    assert_eq!(written, version);
    let other = SqliteStore::open(&db)?;
    let loaded = other.load("r").await?.ok_or("the run is gone")?;
    assert_eq!((loaded.version, loaded.next), (version, 4));
    assert_eq!(loaded.state, cp.state);
    Ok(())
}

#[tokio::test]
async fn hostile_values_in_a_progress_row_are_corrupt_not_a_panic() -> TestResult {
    // Each damage to the last progress row, planted by another program.
    let damages = [
        ("a time before the epoch", "saved_at = -5"),
        ("a writer that is not UTF-8", "writer = X'FFFE'"),
        ("a writer of a megabyte", "writer = hex(zeroblob(500000))"),
        ("a writer that is a number", "writer = 7"),
        (
            "a version far below the head's",
            "version = -9223372036854775808",
        ),
        ("a version of another type", "version = 'seven'"),
    ];
    for (what, set) in damages {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("runs.db");
        let store = SqliteStore::open(&db)?;
        let (cp, version) = saved_steps(&store, "r", 4).await?;
        drop(store);
        let conn = rusqlite::Connection::open(&db)?;
        let changed = conn.execute(
            &format!("UPDATE steps SET {set} WHERE run_id = 'r' AND idx = 3"),
            [],
        )?;
        assert_eq!(changed, 1, "{what}");
        let before = versions(&conn)?;
        let store = SqliteStore::open(&db)?;
        let err = store.load("r").await.expect_err(what);
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{what}: load: {err}");
        let err = store.list(&ListFilter::new()).await;
        if let Err(e) = &err {
            assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: list: {e}");
        }
        let saved = store
            .save(SaveRequest::new(&cp, Some(version)).head_only())
            .await;
        let err = saved.expect_err(what);
        assert!(
            matches!(
                err.kind(),
                StoreErrorKind::Corrupt | StoreErrorKind::Conflict
            ),
            "{what}: save: {err}"
        );
        assert_eq!(versions(&conn)?, before, "{what}: the history is as it was");
    }
    Ok(())
}

#[tokio::test]
async fn a_head_that_is_not_json_is_replaced_by_the_next_head_write_with_its_progress_kept(
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let (mut cp, version) = saved_steps(&store, "r", 4).await?;
    drop(store);
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute(
        "UPDATE runs SET head = '{\"format\": tru' WHERE run_id = 'r'",
        [],
    )?;
    let store = SqliteStore::open(&db)?;
    let err = store.load("r").await.expect_err("a damaged head");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    // A head write at the run's version (as a repair from a known record
    // makes) replaces the head and keeps every step.
    cp.attempts = 2;
    let written = store
        .save(SaveRequest::new(&cp, Some(version)).head_only())
        .await?;
    let loaded = store.load("r").await?.ok_or("the run is gone")?;
    assert_eq!(
        (loaded.version, loaded.next, loaded.attempts),
        (written, 4, 2)
    );
    assert_eq!(loaded.state, cp.state);
    Ok(())
}

/// The WAL is checkpointed as large values are written, so it stays
/// bounded: 40 steps that each store a new 1 MiB value write 40 MiB, and a
/// WAL never checkpointed would hold all of it (a guard for any change to
/// when checkpoints run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_as_large_values_are_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let mut b = Workflow::builder("big");
    for i in 0..40 {
        b = b.push(Step::new(format!("s{i}"), move |_, _| async move {
            // A value of its own per step: each is a new blob.
            let value: String = std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), 1 << 20)
                .chain(i.to_string().chars())
                .collect();
            update(json!({ format!("s{i}"): value }))
        }));
    }
    let path = db.clone();
    let seen = Arc::new(Mutex::new(0u64));
    let sink = Arc::clone(&seen);
    Runner::new(&store)
        .observer(move |e| {
            if let Event::Started { .. } = e {
                let size = std::fs::metadata(wal(&path)).map(|m| m.len()).unwrap_or(0);
                let mut l = sink.lock().expect("size");
                *l = (*l).max(size);
            }
        })
        .run("r", &b.build()?)
        .await?;
    let largest = *seen.lock().expect("size");
    assert!(
        largest < 16 << 20,
        "the WAL grew to {largest} bytes for 40 MiB of values: it was not checkpointed"
    );
    let loaded = store.load("r").await?.ok_or("the run")?;
    assert_eq!(loaded.status, RunStatus::Completed);
    assert_eq!(
        loaded.state["s39"].as_str().map(str::len),
        Some((1 << 20) + 2)
    );
    Ok(())
}
