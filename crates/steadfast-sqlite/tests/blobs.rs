//! Large values by reference on SQLite (schema 6): stored once across steps
//! and runs, freed when no run refers to them, damage reported with its
//! place, values stored before blobs read back as written.

use std::path::Path;

use rusqlite::Connection;
use serde_json::{json, Value};
use steadfast_core::{
    ops, run, update, Store, StoreErrorKind, StoreExt as _, SystemClock, Workflow,
};
use steadfast_sqlite::{SqliteOptions, SqliteStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

use steadfast_conformance::fixtures::{doc, rereading_agent as agent};

/// (blobs, bytes of their chunks, references) in the database.
fn counts(db: &Path) -> Result<(i64, i64, i64), rusqlite::Error> {
    let conn = Connection::open(db)?;
    conn.query_row(
        "SELECT (SELECT count(*) FROM blobs), (SELECT coalesce(sum(length(body)), 0) FROM blob_chunks),
                (SELECT count(*) FROM blob_refs)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

fn open(db: &Path) -> Result<SqliteStore, steadfast_core::StoreError> {
    SqliteStore::open_with(db, SqliteOptions::default().blob_threshold(16 << 10))
}

/// A store of its own (threshold 16 KiB) in a fresh directory, kept while
/// the directory lives.
fn fresh(
) -> Result<(tempfile::TempDir, std::path::PathBuf, SqliteStore), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = open(&db)?;
    Ok((dir, db, store))
}

#[tokio::test]
async fn a_value_is_stored_once_across_steps_and_runs_and_freed_with_its_last_run() -> TestResult {
    let (_dir, db, store) = fresh()?;
    for r in 0..3 {
        run(&format!("r{r}"), &agent(4, r), &store).await?;
    }
    // Two shared documents, and one of its own per step and run.
    let (blobs, bytes, refs) = counts(&db)?;
    assert_eq!(blobs, 2 + 3 * 4);
    let unique = 2 * (doc(0, 100).len() + 2) + 12 * (doc(1000, 20).len() + 2);
    assert_eq!(bytes as usize, unique, "every content once");
    assert_eq!(refs, 3 * (2 + 4));
    // Every step's row holds references, not the values.
    let conn = Connection::open(&db)?;
    let longest: i64 = conn.query_row("SELECT max(length(update_json)) FROM steps", [], |r| {
        r.get(0)
    })?;
    assert!(longest < 1000, "a history row holds {longest} bytes");

    // Loads and history see the values.
    let cp = store.load("r1").await?.expect("stored");
    assert_eq!(cp.state["shared0"], json!(doc(0, 100)));
    assert_eq!(cp.state["own3"], json!(doc(1000 + 100 + 3, 20)));
    let history = store.history("r1").await?.expect("stored");
    assert_eq!(history[2].update["shared0"], json!(doc(0, 100)));
    assert_eq!(history[2].update["own2"], json!(doc(1000 + 100 + 2, 20)));

    // A run's own values go with it; the shared ones stay while a run refers
    // to them.
    assert!(store.delete("r0").await?);
    assert_eq!(counts(&db)?.0, 2 + 2 * 4);
    assert!(store.delete("r1").await?);
    assert_eq!(counts(&db)?.0, 2 + 4);
    assert_eq!(
        store.load("r2").await?.expect("stored").state["shared1"],
        json!(doc(1, 100))
    );
    assert!(store.delete("r2").await?);
    assert_eq!(counts(&db)?, (0, 0, 0), "nothing left behind");
    Ok(())
}

#[tokio::test]
async fn prune_and_rewind_free_the_values_only_dropped_rows_held() -> TestResult {
    let (_dir, db, store) = fresh()?;
    run("r", &agent(6, 0), &store).await?;
    let before = counts(&db)?.0;
    assert_eq!(before, 2 + 6);
    // Rewinding to s4 drops the rows of s4 and s5: their own values go (the
    // state no longer has them either).
    ops::rewind(&store, "r", "s4", "test", &SystemClock).await?;
    assert_eq!(counts(&db)?.0, 2 + 4);
    // Folding into s2 keeps every value the state still has: the fold row
    // carries the merged updates.
    ops::prune(&store, "r", 1, "test", &SystemClock).await?;
    let cp = store.load("r").await?.expect("stored");
    for i in 0..4 {
        assert_eq!(cp.state[&format!("own{i}")], json!(doc(1000 + i, 20)));
    }
    assert_eq!(counts(&db)?.0, 2 + 4);
    // Running it on brings s4 and s5 back, with their values.
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(counts(&db)?.0, 2 + 6);
    Ok(())
}

/// Runs `sql` on the database behind the store's back.
fn tamper(db: &Path, sql: &str) -> Result<(), rusqlite::Error> {
    Connection::open(db)?.execute_batch(sql)
}

#[tokio::test]
async fn a_damaged_or_missing_blob_is_corrupt_with_its_place() -> TestResult {
    let (_dir, db, store) = fresh()?;
    run("r", &agent(2, 0), &store).await?;
    drop(store);
    // One byte changed: the content no longer hashes to its name.
    tamper(
        &db,
        "UPDATE blob_chunks SET body = CAST('\"x' || substr(CAST(body AS TEXT), 3) AS BLOB)
         WHERE rowid = (SELECT min(rowid) FROM blob_chunks)",
    )?;
    let store = open(&db)?;
    let err = store.load("r").await.expect_err("a damaged blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("runs[\"r\"]"), "{err}");
    drop(store);
    // A blob gone altogether.
    tamper(&db, "DELETE FROM blob_chunks; DELETE FROM blobs;")?;
    let store = open(&db)?;
    let err = store.load("r").await.expect_err("a missing blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("not in the store"), "{err}");
    let err = store
        .history("r")
        .await
        .expect_err("history of a missing blob");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    Ok(())
}

#[tokio::test]
async fn values_stored_before_blobs_that_look_like_references_read_back() -> TestResult {
    let (_dir, db, store) = fresh()?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"plain": 1})) })
        .build()?;
    run("r", &wf, &store).await?;
    drop(store);
    // As a build before schema 6 would have written them: not escaped.
    let fake = json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
    let text = serde_json::to_string(&json!({"plain": 1, "fake": fake}))?;
    let conn = Connection::open(&db)?;
    conn.execute_batch(
        "DROP TABLE documents; DROP TRIGGER events_go_with_their_run; DROP TABLE events;
         DROP TABLE blob_refs; DROP TABLE blob_chunks; DROP TABLE blobs;
         ALTER TABLE runs RENAME COLUMN snapshot_steps TO snapshot_completed;
         PRAGMA user_version = 5;",
    )?;
    conn.execute("UPDATE steps SET update_json = ?1", [&text])?;
    conn.execute("UPDATE runs SET snapshot = ?1", [&text])?;
    drop(conn);
    let store = open(&db)?;
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["fake"], fake);
    assert_eq!(
        store.history("r").await?.expect("stored")[0].update["fake"],
        fake
    );
    let conn = Connection::open(&db)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    assert_eq!(version, steadfast_sqlite::SCHEMA_VERSION);
    // A process of the older build still on the file cannot load a run
    // (and so never mistakes a reference for its value).
    let old_load = conn.prepare("SELECT snapshot, snapshot_completed FROM runs WHERE run_id = 'r'");
    assert!(old_load.is_err(), "an older build's load still prepares");
    Ok(())
}

#[tokio::test]
async fn a_value_larger_than_a_chunk_round_trips() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db)?;
    let big = "z".repeat(17 << 20);
    let value = big.clone();
    let wf = Workflow::builder("w")
        .step("a", move |_, _| {
            let value = value.clone();
            async move { update(json!({ "big": value })) }
        })
        .build()?;
    run("r", &wf, &store).await?;
    let chunks: i64 =
        Connection::open(&db)?.query_row("SELECT count(*) FROM blob_chunks", [], |r| r.get(0))?;
    assert_eq!(chunks, 2, "17 MiB in chunks of 16 MiB");
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["big"], Value::String(big));
    Ok(())
}

#[tokio::test]
async fn the_threshold_is_set_in_the_url_and_checked() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let url = format!("{}?blob_threshold=1KiB", db.display());
    let store = steadfast_sqlite::open_url(&url, true)?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"v": "x".repeat(2000)})) })
        .build()?;
    run("r", &wf, &*store).await?;
    assert_eq!(counts(&db)?.0, 1, "a 2 KB value is a blob at 1 KiB");
    for bad in [
        "?blob_threshold=1",
        "?blob_threshold=2GiB",
        "?blob_threshold=lots",
        "?blobs=1",
        "?",
        "?blob_threshold=",
        "?blob_threshold=64KiB&",
        "?blob_threshold=-1",
    ] {
        let Err(err) = steadfast_sqlite::open_url(&format!("{}{bad}", db.display()), true) else {
            panic!("{bad} was taken");
        };
        assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{bad}: {err}");
    }
    Ok(())
}

#[tokio::test]
async fn a_snapshot_that_drops_a_value_frees_it() -> TestResult {
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Timestamp};
    let (_dir, db, store) = fresh()?;
    // A run that starts with a large input and no step yet.
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("input".into(), json!(doc(5, 100)));
    let v = store.save(SaveRequest::new(&cp, None)).await?;
    assert_eq!(counts(&db)?.0, 1);
    // A save of the whole state without it (a rekey's, a replacement's).
    cp.state.clear();
    cp.state.insert("small".into(), json!(1));
    store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(counts(&db)?, (0, 0, 0), "the dropped value is freed");
    Ok(())
}

#[tokio::test]
async fn a_state_of_large_values_over_the_record_limit_moves_between_stores() -> TestResult {
    use steadfast_core::transfer::{export_run, put_run, Put};
    let dir = tempfile::tempdir()?;
    // 64 KiB for the record; three values of about 30 KB each, as blobs.
    let opts = || {
        SqliteOptions::default()
            .max_state_bytes(64 << 10)
            .blob_threshold(16 << 10)
    };
    let a = SqliteStore::open_with(dir.path().join("a.db"), opts())?;
    let b = SqliteStore::open_with(dir.path().join("b.db"), opts())?;
    let wf = Workflow::builder("w")
        .step("s0", |_, _| async { update(json!({"d0": doc(0, 30)})) })
        .step("s1", |_, _| async { update(json!({"d1": doc(1, 30)})) })
        .step("s2", |_, _| async { update(json!({"d2": doc(2, 30)})) })
        .build()?;
    run("r", &wf, &a).await?;
    let record = export_run(&a, "r").await?.expect("stored");
    assert!(matches!(put_run(&b, &record).await?, Put::Written));
    assert_eq!(b.load("r").await?, a.load("r").await?);
    assert_eq!(b.history("r").await?, a.history("r").await?);
    Ok(())
}

#[tokio::test]
async fn a_damaged_old_row_keeps_every_reference_and_saves_go_on() -> TestResult {
    use steadfast_core::store::SaveRequest;
    let (_dir, db, store) = fresh()?;
    run("r", &agent(2, 0), &store).await?;
    drop(store);
    let before = counts(&db)?;
    // Step 0's row lies below the snapshot: a load does not read it.
    tamper(
        &db,
        "UPDATE steps SET update_json = '{\"x\":{\"$blob\":1}}' WHERE idx = 0",
    )?;
    let store = open(&db)?;
    let mut cp = store.load("r").await?.expect("stored");
    cp.state.insert("more".into(), json!(1));
    // A snapshot (nothing is known of the record yet): it counts the run's
    // references again, meets the damaged row, and keeps them all.
    store.save(SaveRequest::new(&cp, Some(cp.version))).await?;
    assert_eq!(counts(&db)?, before);
    // The longer of two chunks than its reference says is refused too.
    tamper(
        &db,
        "UPDATE blob_chunks SET body = body || CAST('xx' AS BLOB)",
    )?;
    let err = store.load("r").await.expect_err("a longer blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    Ok(())
}

/// A decision's data over the threshold is a blob the head refers to (the
/// head says checkpoint format 2); data in a head of format 1 that looks
/// like a reference (a decision written before decisions could hold
/// references) reads back as written, never looked up; and a head of
/// format 2 whose reference is damaged is `Corrupt` at the decision.
#[tokio::test]
async fn decision_data_by_reference_and_older_look_alikes_read_back() -> TestResult {
    use steadfast_core::{approve, Step};
    let (_dir, db, store) = fresh()?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .push(Step::gate("g"))
        .build()?;
    for id in ["old", "big"] {
        run(id, &wf, &store).await?;
    }
    approve(
        &store,
        "old",
        "g",
        Some(json!({"ok": 1})),
        "ada",
        &SystemClock,
    )
    .await?;
    let data = json!({"draft": "d".repeat(40 << 10)});
    approve(&store, "big", "g", Some(data.clone()), "ada", &SystemClock).await?;
    let head = |id: &str| -> Result<Value, Box<dyn std::error::Error>> {
        let text: String = Connection::open(&db)?.query_row(
            "SELECT head FROM runs WHERE run_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        Ok(serde_json::from_str(&text)?)
    };
    let big = head("big")?;
    assert_eq!(big["format"], json!(2));
    assert!(big["decisions"][0]["data"]["$blob"].is_string(), "{big}");
    assert_eq!(counts(&db)?.0, 1);
    // As an older build wrote it: format 1, the caller's look-alike as is.
    let fake = json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
    let mut old = head("old")?;
    assert_eq!(old["format"], json!(1));
    old["decisions"][0]["data"] = fake.clone();
    let conn = Connection::open(&db)?;
    conn.execute(
        "UPDATE runs SET head = ?1 WHERE run_id = 'old'",
        [serde_json::to_string(&old)?],
    )?;
    let store = open(&db)?;
    let cp = store.load("old").await?.expect("stored");
    assert_eq!(cp.decisions[0].data.as_ref(), Some(&fake));
    let cp = store.load("big").await?.expect("stored");
    assert_eq!((cp.format, cp.decisions[0].data.as_ref()), (1, Some(&data)));
    // A damaged reference is reported where it is.
    let mut big = big;
    big["decisions"][0]["data"]["bytes"] = json!("many");
    conn.execute(
        "UPDATE runs SET head = ?1 WHERE run_id = 'big'",
        [serde_json::to_string(&big)?],
    )?;
    let err = open(&db)?.load("big").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("head.decisions"), "{err}");
    Ok(())
}
