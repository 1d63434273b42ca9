//! SQLite-store specifics: settings read back from live connections, schema
//! versions, file modes, deltas and snapshots, and corrupt rows.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_core::StoreExt as _;
use steadfast_core::{run, update, Store, StoreError, StoreErrorKind, Workflow};
use steadfast_sqlite::{SqliteOptions, SqliteStore, SCHEMA_VERSION};

/// The workflow most tests here run: one step `a` that sets `a` to 1.
fn one_step() -> Result<Workflow, steadfast_core::Error> {
    Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .build()
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn durability_settings_read_back_from_live_connections() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("runs.db"))?;
    let (writer, reader) = store.settings().await?;
    for (who, s) in [("writer", writer), ("reader", reader)] {
        assert_eq!(s.journal_mode, "wal", "{who}");
        assert_eq!(s.synchronous, 2, "{who}: synchronous must be FULL (2)");
        assert_eq!(s.busy_timeout_ms, 10_000, "{who}");
    }
    Ok(())
}

#[tokio::test]
async fn files_are_private() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("nested/runs.db");
    let store = SqliteStore::open(&path)?;
    let wf = one_step()?;
    run("r", &wf, &store).await?;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode(&path)?, 0o600, "database");
    assert_eq!(
        mode(&dir.path().join("nested/runs.db-wal"))?,
        0o600,
        "write-ahead log"
    );
    assert_eq!(
        mode(&dir.path().join("nested"))?,
        0o700,
        "created directory"
    );
    Ok(())
}

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    drop(SqliteStore::open(&path)?);
    let conn = rusqlite::Connection::open(&path)?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?;
    drop(conn);
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("newer than this build"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_corrupt_and_left_alone() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let junk =
        b"this is not an SQLite database, but it is long enough to have a header...".repeat(20);
    std::fs::write(&path, &junk)?;
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert_eq!(std::fs::read(&path)?, junk, "the file was changed");
    Ok(())
}

#[tokio::test]
async fn growing_state_is_saved_as_deltas_and_loads_back_whole() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path)?;
    let mut b = Workflow::builder("grow");
    for i in 0..60 {
        b = b.step(format!("s{i}"), move |_, _| async move {
            update(json!({ format!("k{i}"): "x".repeat(4096) }))
        });
    }
    let state = run("r", &b.build()?, &store)
        .await?
        .completed()
        .expect("completed");
    let conn = rusqlite::Connection::open(&path)?;
    let (snapshot_next, snapshot_bytes, delta_bytes): (i64, i64, i64) = conn.query_row(
        "SELECT snapshot_next, snapshot_bytes, delta_bytes FROM runs WHERE run_id = 'r'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    assert!(snapshot_next < 60, "the last steps were stored as deltas");
    assert!(
        delta_bytes <= snapshot_bytes.max(16 * 1024),
        "deltas never outweigh the snapshot"
    );
    let loaded = store.load("r").await?.expect("run");
    assert_eq!(
        loaded.state, state,
        "snapshot plus deltas equal the state the run loop held"
    );
    assert_eq!(loaded.completed.len(), 60);
    // A second handle (another process, say) rebuilds the same state.
    let other = SqliteStore::open(&path)?;
    assert_eq!(other.load("r").await?.map(|c| c.state), Some(state));
    assert_eq!(store.history("r").await?.map(|h| h.len()), Some(60));
    Ok(())
}

#[tokio::test]
async fn a_corrupt_row_is_reported_with_its_run_and_column() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path)?;
    let wf = one_step()?;
    run("r", &wf, &store).await?;
    let conn = rusqlite::Connection::open(&path)?;
    conn.execute(
        "UPDATE runs SET snapshot = '{\"a\": tru' WHERE run_id = 'r'",
        [],
    )?;
    let err = store.load("r").await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("\"r\"") && text.contains("snapshot"),
        "{text}"
    );
    conn.execute(
        "UPDATE runs SET snapshot = '{}', status = 'paused' WHERE run_id = 'r'",
        [],
    )?;
    assert_eq!(
        store.load("r").await.unwrap_err().kind(),
        StoreErrorKind::Corrupt
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_member_fails_alone_in_a_shared_batch() -> TestResult {
    use std::sync::Arc;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Timestamp};

    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("runs.db"))?);
    let cp = |id: &str| Checkpoint::new(id, "w", Timestamp::from_unix_millis(0));
    store.save(SaveRequest::new(&cp("contested"), None)).await?;
    // Many saves at once, so that they share batches: every stale one must
    // fail with a conflict and every good one must land.
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            if i % 4 == 0 {
                let r = store.save(SaveRequest::new(&cp("contested"), None)).await;
                (i, r.map_err(|e| e.kind()))
            } else {
                let r = store
                    .save(SaveRequest::new(&cp(&format!("good-{i}")), None))
                    .await;
                (i, r.map_err(|e| e.kind()))
            }
        }));
    }
    for t in tasks {
        let (i, r) = t.await?;
        if i % 4 == 0 {
            assert_eq!(r, Err(StoreErrorKind::Conflict), "stale save {i}");
        } else {
            assert_eq!(r, Ok(1), "good save {i}");
        }
    }
    assert_eq!(store.list(&Default::default()).await?.len(), 151);
    let stats = store.write_stats();
    assert!(
        stats.commits < stats.writes,
        "no batch had two members: {stats:?}"
    );
    Ok(())
}

/// A member whose write fails for a reason other than a conflict breaks its
/// batch: the batch is rolled back and every member gets an error, and no
/// member after it is applied. Here the failure (a trigger of the user's)
/// rolls the whole transaction back itself, as SQLite does on a full disk:
/// a member applied after it would commit on its own while told it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_breaks_its_batch_leaves_no_member_applied() -> TestResult {
    use std::sync::Arc;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Timestamp};

    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = Arc::new(SqliteStore::open(&db)?);
    rusqlite::Connection::open(&db)?.execute_batch(
        "CREATE TRIGGER boom BEFORE INSERT ON runs WHEN NEW.run_id LIKE 'boom-%'
         BEGIN SELECT RAISE(ROLLBACK, 'refused by the test'); END;",
    )?;
    let cp = |id: &str| Checkpoint::new(id, "w", Timestamp::from_unix_millis(0));
    let mut tasks = Vec::new();
    for i in 0..300 {
        let store = Arc::clone(&store);
        let id = if i % 100 == 50 {
            format!("boom-{i}")
        } else {
            format!("good-{i}")
        };
        tasks.push(tokio::spawn(async move {
            let r = store.save(SaveRequest::new(&cp(&id), None)).await;
            (id, r.map_err(|e| e.to_string()))
        }));
    }
    let (mut refused, mut shared) = (0, 0);
    for t in tasks {
        let (id, r) = t.await?;
        let there = store.load(&id).await?.is_some();
        match r {
            Ok(_) => assert!(there, "{id} was acknowledged but is not there"),
            Err(e) => {
                refused += 1;
                shared += usize::from(id.starts_with("good-"));
                assert!(!there, "{id} was refused ({e}) but is there");
            }
        }
    }
    assert!(refused >= 3, "every boom run is refused: {refused}");
    assert!(shared > 0, "no good run shared a batch with a boom run");
    Ok(())
}

/// Runs that save again as soon as their last save is acknowledged (as
/// concurrent runs do, step after step) join a transaction begun for the
/// first of them to come back. Joined or not, a member is answered only
/// after its batch's COMMIT: what is acknowledged is stored, what is
/// refused is not, a stale member fails alone, and a member that breaks
/// its batch leaves nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_that_join_an_open_batch_are_answered_by_its_commit() -> TestResult {
    tokio::time::timeout(Duration::from_secs(120), joined_saves())
        .await
        .map_err(|_| "the saves did not all finish in two minutes")?
}

async fn joined_saves() -> TestResult {
    use std::sync::Arc;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Timestamp};

    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = Arc::new(SqliteStore::open(&db)?);
    rusqlite::Connection::open(&db)?.execute_batch(
        "CREATE TRIGGER boom BEFORE UPDATE ON runs
           WHEN NEW.run_id = 'run-5' AND NEW.version = 13
         BEGIN SELECT RAISE(ROLLBACK, 'refused by the test'); END;",
    )?;
    const SAVES: u64 = 30;
    // run-5 tries its refused save this often; the others retry what a
    // batch it broke refused until they are through.
    const BOOM_TRIES: u32 = 10;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let id = format!("run-{i}");
            let mut cp = Checkpoint::new(&id, "w", Timestamp::from_unix_millis(0));
            let mut stored: Option<u64> = None;
            let (mut refused, mut stale) = (0u32, 0u32);
            while stored.unwrap_or(0) < SAVES && !(i == 5 && refused >= BOOM_TRIES) {
                let at = stored.unwrap_or(0);
                cp.state.insert("n".into(), json!(at + 1));
                if i % 4 == 0 && at % 7 == 3 && stale <= at as u32 / 7 {
                    // A save from a stale handle: a conflict, alone (or
                    // the error of a batch run-5 broke, if it came after).
                    stale += 1;
                    match store.save(SaveRequest::new(&cp, at.checked_sub(1))).await {
                        Err(e) if e.kind() == StoreErrorKind::Conflict => {}
                        Err(e) if e.to_string().contains("refused by the test") => {}
                        other => panic!("{id}: a stale save at {at}: {other:?}"),
                    }
                    let back = store.load(&id).await?.map(|c| c.version);
                    assert_eq!(back, stored, "{id}: a stale save changed the run");
                    continue;
                }
                match store.save(SaveRequest::new(&cp, stored)).await {
                    Ok(v) => {
                        assert_eq!(v, at + 1, "{id}");
                        stored = Some(v);
                        let back = store.load(&id).await?.expect("an acknowledged run");
                        assert_eq!(back.version, v, "{id}: acknowledged, not stored");
                        assert_eq!(back.state.get("n"), Some(&json!(v)), "{id}");
                    }
                    Err(e) => {
                        assert!(e.to_string().contains("refused by the test"), "{id}: {e}");
                        refused += 1;
                        let back = store.load(&id).await?.map(|c| c.version);
                        assert_eq!(back, stored, "{id}: refused ({e}), yet stored");
                    }
                }
            }
            Ok::<_, StoreError>((i, stored, refused))
        }));
    }
    for t in tasks {
        let (i, stored, refused) = t.await??;
        if i == 5 {
            assert_eq!(stored, Some(12), "run-5 stops where the trigger refuses it");
            assert_eq!(refused, BOOM_TRIES);
        } else {
            assert_eq!(stored, Some(SAVES), "run-{i}");
        }
    }
    let stats = store.write_stats();
    assert!(stats.joined > 0, "no save joined an open batch: {stats:?}");
    assert!(stats.commits < stats.writes, "{stats:?}");
    Ok(())
}

/// Two handles on one database (as two processes would be), each with
/// runs that save as fast as they are acknowledged: the handles take the
/// write lock by turns, a committer that had to wait for its turn does not
/// hold the lock waiting for more, and every save lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_joining_their_own_batches_share_the_database() -> TestResult {
    use std::sync::Arc;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Timestamp};

    const SAVES: u64 = 25;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let handles = [
        Arc::new(SqliteStore::open(&db)?),
        Arc::new(SqliteStore::open(&db)?),
    ];
    let work = async {
        let mut tasks = Vec::new();
        for (h, store) in handles.iter().enumerate() {
            for i in 0..8 {
                let store = Arc::clone(store);
                tasks.push(tokio::spawn(async move {
                    let id = format!("h{h}-{i}");
                    let mut cp = Checkpoint::new(&id, "w", Timestamp::from_unix_millis(0));
                    let mut stored = None;
                    for n in 1..=SAVES {
                        cp.state.insert("n".into(), json!(n));
                        stored = Some(store.save(SaveRequest::new(&cp, stored)).await?);
                    }
                    Ok::<_, StoreError>((id, stored))
                }));
            }
        }
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await??);
        }
        Ok::<_, Box<dyn std::error::Error>>(done)
    };
    let done = tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .map_err(|_| "the saves did not all finish in two minutes")??;
    for (id, stored) in done {
        assert_eq!(stored, Some(SAVES), "{id}");
        for store in &handles {
            let back = store.load(&id).await?.expect("a saved run");
            assert_eq!(
                (back.version, back.state.get("n")),
                (SAVES, Some(&json!(SAVES))),
                "{id}"
            );
        }
    }
    let [a, b] = handles.map(|h| h.write_stats());
    assert_eq!(a.writes + b.writes, 16 * SAVES, "{a:?} {b:?}");
    Ok(())
}

fn bytes_and_mode(path: &std::path::Path) -> Result<(Vec<u8>, String), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path)?;
    let conn = rusqlite::Connection::open(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    Ok((bytes, mode))
}

/// Finding 9: a database from a newer build is refused before anything is
/// changed: it is not switched to WAL, not a byte moves.
#[tokio::test]
async fn a_future_database_is_refused_unchanged() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    drop(SqliteStore::open(&path)?);
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?;
        let _: String = conn.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
    }
    let before = bytes_and_mode(&path)?;
    assert_eq!(before.1, "delete");
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("newer than this build"), "{err}");
    assert_eq!(
        bytes_and_mode(&path)?,
        before,
        "the refused file was changed"
    );
    Ok(())
}

/// Finding 9: a foreign database (even one with a `runs` table and schema
/// version 0) is refused, not adopted, and left as it was.
#[tokio::test]
async fn a_foreign_database_is_refused_unchanged() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.execute_batch("CREATE TABLE runs (x TEXT); INSERT INTO runs VALUES ('theirs');")?;
    }
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let before = bytes_and_mode(&path)?;
    let err = SqliteStore::open(&path).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("not a Steadfast store"), "{text}");
    assert_eq!(
        text.matches("CREATE").count(),
        0,
        "no SQL in the error: {text}"
    );
    assert_eq!(
        bytes_and_mode(&path)?,
        before,
        "the foreign file was changed"
    );
    Ok(())
}

/// A copy of a fixture database, private as the store wants it, in `dir`.
fn fixture(dir: &std::path::Path, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join("runs.db");
    std::fs::write(&path, bytes)?;
    std::fs::set_permissions(&path, PermissionsExt::from_mode(0o600))?;
    Ok(path)
}

/// A database written before the application id existed (release 0.1.0:
/// schema 2, head in columns, no id) is still ours: it opens, is migrated to
/// one head document, keeps its runs and gets the marker.
#[tokio::test]
async fn a_database_from_before_the_marker_is_adopted_and_migrated() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = fixture(
        dir.path(),
        include_bytes!("../../steadfast-cli/tests/fixtures/release-0.1/runs.db"),
    )?;
    let store = SqliteStore::open(&path)?;
    let done = store.load("done").await?.expect("kept");
    assert_eq!(done.status, steadfast_core::RunStatus::Completed);
    assert_eq!(done.decisions[0].by, "ada");
    let leased = store.load("leased").await?.expect("kept");
    assert!(
        leased.lease.is_some(),
        "the lease moved into the head document"
    );
    assert_ne!(leased.writer, 0);
    drop(store);
    let conn = rusqlite::Connection::open(&path)?;
    let id: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    assert_eq!(id, steadfast_sqlite::APPLICATION_ID);
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    assert_eq!(version, SCHEMA_VERSION);
    Ok(())
}

/// A database of schema 3 (the history a table with a separate key index)
/// is migrated to the clustered history: every step record is kept, and a
/// step then writes one b-tree instead of two.
#[tokio::test]
async fn schema_3_history_is_clustered_and_kept() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = fixture(
        dir.path(),
        include_bytes!("../../steadfast-cli/tests/fixtures/release-0.2-schema-3/runs.db"),
    )?;
    let before: Vec<(String, i64, String)> = {
        let conn = rusqlite::Connection::open(&path)?;
        let mut st =
            conn.prepare("SELECT run_id, idx, update_json FROM steps ORDER BY run_id, idx")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    assert!(before.len() >= 5, "the fixture has history: {before:?}");
    let store = SqliteStore::open(&path)?;
    let history = store.history("done").await?.expect("kept");
    let names: Vec<&str> = history.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["fetch", "review", "write"]);
    drop(store);
    let conn = rusqlite::Connection::open(&path)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    assert_eq!(version, SCHEMA_VERSION);
    let sql: String = conn.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'steps'",
        [],
        |r| r.get(0),
    )?;
    assert!(sql.contains("WITHOUT ROWID"), "{sql}");
    let after: Vec<(String, i64, String)> = {
        let mut st =
            conn.prepare("SELECT run_id, idx, update_json FROM steps ORDER BY run_id, idx")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    assert_eq!(before, after);
    Ok(())
}

/// A view of a user's own over the history makes the clustering migration
/// fail: the open is refused with the view's name, the database is left as
/// it was (schema 3, every step), and once the view is gone it opens.
#[tokio::test]
async fn a_user_view_on_the_history_fails_the_migration_cleanly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = fixture(
        dir.path(),
        include_bytes!("../../steadfast-cli/tests/fixtures/release-0.2-schema-3/runs.db"),
    )?;
    rusqlite::Connection::open(&path)?
        .execute_batch("CREATE VIEW recent_steps AS SELECT run_id, idx FROM steps")?;
    let err = SqliteStore::open(&path).err().ok_or("opened")?;
    assert!(err.to_string().contains("recent_steps"), "{err}");
    let conn = rusqlite::Connection::open(&path)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    assert_eq!(version, 3);
    let steps: i64 = conn.query_row("SELECT count(*) FROM steps", [], |r| r.get(0))?;
    assert!(steps >= 5, "{steps}");
    conn.execute_batch("DROP VIEW recent_steps")?;
    drop(conn);
    let store = SqliteStore::open(&path)?;
    assert!(store.history("done").await?.is_some_and(|h| h.len() == 3));
    Ok(())
}

/// Finding 9, with a write-ahead log still pending: refusing the database
/// does not checkpoint it either; database and log keep every byte.
#[tokio::test]
async fn a_future_database_with_a_pending_log_is_refused_unchanged() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    drop(SqliteStore::open(&path)?);
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?;
    }
    let wal = dir.path().join("runs.db-wal");
    let before = (std::fs::read(&path)?, std::fs::read(&wal)?);
    assert!(!before.1.is_empty(), "the log holds the change");
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("newer than this build"), "{err}");
    assert_eq!((std::fs::read(&path)?, std::fs::read(&wal)?), before);
    Ok(())
}

/// Another writer keeps the write lock nearly all the time for 1.2 s,
/// committing every 100 ms (with gaps of microseconds), while the store's
/// busy timeout is 300 ms. `native` runs with SQLite's own busy handler only.
async fn save_while_another_writer_keeps_committing(native: bool) -> Result<Duration, StoreError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut opts = SqliteOptions::default().busy_timeout(Duration::from_millis(300));
    opts.mutants.native_busy_wait = native;
    let store = SqliteStore::open_with(&path, opts)?;
    let wf = one_step().unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("CREATE TABLE scratch (n INTEGER)")
        .unwrap();
    let queue = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.path().join("runs.db-writer"))
        .unwrap();
    queue.lock().unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (ready, holding) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        ready.send(()).unwrap();
        for n in 0..12 {
            std::thread::sleep(Duration::from_millis(100));
            raw.execute("INSERT INTO scratch VALUES (?1)", [n]).unwrap();
            raw.execute_batch("COMMIT").unwrap();
            if n < 11 {
                raw.execute_batch("BEGIN IMMEDIATE").unwrap();
            }
        }
        drop(queue);
    });
    holding.recv().unwrap();
    let started = Instant::now();
    let result = run("r", &wf, &store).await;
    let waited = started.elapsed();
    other.join().unwrap();
    match result {
        Ok(outcome) => {
            assert!(outcome.completed().is_some());
            Ok(waited)
        }
        Err(steadfast_core::Error::Store { source, .. }) => Err(source),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_store_is_a_wait_while_others_commit() -> TestResult {
    let waited = save_while_another_writer_keeps_committing(false).await?;
    // It waited for the other writer, far longer than the busy timeout.
    assert!(waited >= Duration::from_millis(1000), "{waited:?}");
    Ok(())
}

/// The negative control: SQLite's busy handler alone gives up after the busy
/// timeout although the other writer commits all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_queue_the_same_wait_fails() {
    let err = save_while_another_writer_keeps_committing(true)
        .await
        .expect_err("SQLite's busy handler alone should give up");
    assert!(
        err.to_string().contains("locked") || err.to_string().contains("busy"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_of_the_lock_is_an_error_after_the_busy_timeout() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let opts = SqliteOptions::default().busy_timeout(Duration::from_millis(300));
    let store = SqliteStore::open_with(&path, opts)?;
    let wf = one_step()?;
    // A holder that never commits: the queue's lock held by a stopped writer.
    let queue = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("runs.db-writer"))?;
    queue.lock()?;
    let started = Instant::now();
    let err = run("r", &wf, &store).await.expect_err("no turn, no save");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let text = steadfast_core::error_chain(&err);
    assert!(
        text.contains("is busy") && text.contains("no one committed"),
        "{text}"
    );
    drop(queue);
    assert!(store.load("r").await?.is_none(), "nothing was written");
    Ok(())
}

/// The store keeps its write queue's file open between commits; a file
/// removed, or replaced by another renamed over it, must not split the
/// queue: the next save queues on the file that is there now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_file_removed_or_replaced_is_queued_on_anew() -> TestResult {
    for replace in [false, true] {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("runs.db");
        let opts = SqliteOptions::default().busy_timeout(Duration::from_secs(5));
        let store = SqliteStore::open_with(&path, opts)?;
        let wf = one_step()?;
        run("first", &wf, &store).await?;
        let queue_path = dir.path().join("runs.db-writer");
        if replace {
            let other = dir.path().join("other-writer");
            std::fs::File::create(&other)?;
            std::fs::rename(&other, &queue_path)?;
        } else {
            std::fs::remove_file(&queue_path)?;
        }
        // Another writer holds the queue's file as it is now, for a while.
        let queue = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&queue_path)?;
        queue.lock()?;
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            drop(queue);
        });
        let started = Instant::now();
        run("second", &wf, &store).await?;
        let waited = started.elapsed();
        holder.join().unwrap();
        assert!(
            waited >= Duration::from_millis(350),
            "replaced: {replace}: the save did not wait for the queue's holder ({waited:?})"
        );
        assert!(store.load("second").await?.is_some());
    }
    Ok(())
}

/// A lone save that finds SQLite's lock held by a writer that does not
/// queue (another program on the file) waits on blocking terms: the runtime
/// worker it was on goes on with other tasks meanwhile.
#[test]
fn a_lone_save_waiting_for_another_programs_lock_leaves_the_worker_free() -> TestResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("runs.db");
        let store = SqliteStore::open(&path)?;
        let wf = one_step()?;
        run("warm", &wf, &store).await?;
        // Another program takes SQLite's write lock, without the queue, for
        // 500 ms.
        let raw = rusqlite::Connection::open(&path)?;
        raw.execute_batch("BEGIN IMMEDIATE")?;
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            raw.execute_batch("COMMIT").unwrap();
        });
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = std::sync::Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            for _ in 0..200 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let saved = tokio::spawn(async move { run("lone", &wf, &store).await.map(drop) });
        saved.await??;
        let during = ticks.load(std::sync::atomic::Ordering::Relaxed);
        holder.join().unwrap();
        ticker.abort();
        assert!(
            during >= 20,
            "the only runtime worker was blocked while the save waited ({during} ticks)"
        );
        Ok(())
    })
}

/// Two handles on one database in one process take turns: each gives the
/// write queue's lock back after its commit although it keeps the file open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_in_one_process_take_turns() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let opts = SqliteOptions::default().busy_timeout(Duration::from_millis(500));
    let a = SqliteStore::open_with(&path, opts.clone())?;
    let b = SqliteStore::open_with(&path, opts)?;
    let wf = one_step()?;
    for i in 0..3 {
        run(&format!("a{i}"), &wf, &a).await?;
        run(&format!("b{i}"), &wf, &b).await?;
    }
    assert_eq!(a.list(&Default::default()).await?.len(), 6);
    Ok(())
}

/// A symbolic link planted over the write queue's file while a store has
/// the real one open is not followed: the next save is refused with an
/// error naming the queue, nothing is written, and the store works again
/// once the link is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_over_the_kept_queue_file_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path)?;
    let wf = one_step()?;
    run("first", &wf, &store).await?;
    let queue = dir.path().join("runs.db-writer");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, b"")?;
    std::fs::remove_file(&queue)?;
    std::os::unix::fs::symlink(&elsewhere, &queue)?;
    let err = run("second", &wf, &store)
        .await
        .expect_err("a planted link");
    let text = steadfast_core::error_chain(&err);
    assert!(text.contains("write queue"), "{text}");
    assert!(store.load("second").await?.is_none(), "nothing was written");
    std::fs::remove_file(&queue)?;
    run("second", &wf, &store).await?;
    assert!(store.load("second").await?.is_some());
    Ok(())
}
