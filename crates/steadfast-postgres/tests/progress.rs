//! Progress rows on PostgreSQL: an ordinary step is recorded by its history
//! row alone, every read sees where the run really is, a head write racing a
//! step lets exactly one of them land, damaged rows are reported, and a
//! store of the schema before them is migrated.

mod support;

use serde_json::json;
use steadfast_conformance::runtime as rt;
use steadfast_core::store::{History, SaveRequest};
use steadfast_core::{
    Checkpoint, ListFilter, RunStatus, StepRecord, Store, StoreErrorKind, Timestamp,
};
use steadfast_postgres::{PgOptions, PgStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A running run `id` with no steps, saved.
async fn started(store: &PgStore, id: &str) -> Result<Checkpoint, Box<dyn std::error::Error>> {
    let mut cp = Checkpoint::new(id, "wf", Timestamp::from_unix_millis(1_000));
    cp.status = RunStatus::Running;
    cp.version = store.save(SaveRequest::new(&cp, None)).await?;
    Ok(cp)
}

/// Completes step `cp.next` of `cp` in memory, as the engine does before its
/// save, and returns the step's record.
fn complete_step(cp: &mut Checkpoint, at: u64) -> StepRecord {
    let i = cp.next;
    let name = format!("s{i}");
    let update = json!({ name.clone(): i })
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in &update {
        cp.state.insert(k.clone(), v.clone());
    }
    cp.completed.push(name.clone());
    cp.next += 1;
    cp.updated_at = Timestamp::from_unix_millis(at);
    cp.writer = 0x1000 + i as u64;
    let t = Timestamp::from_unix_millis(at);
    StepRecord::new(i, &name, update, 1, t, t)
}

/// The head's own `next` and version, and how many progress rows lie ahead.
async fn stored_rows(
    store: &PgStore,
    id: &str,
) -> Result<(i64, i64, i64), Box<dyn std::error::Error>> {
    let q = store.quoted_schema();
    let row = store
        .connection()
        .await?
        .query_one(
            &format!(
                "SELECT r.next, r.version,
                        (SELECT count(*) FROM {q}.steps s WHERE s.run_id = r.run_id
                         AND s.idx >= r.next AND s.version IS NOT NULL)
                 FROM {q}.runs r WHERE r.run_id = $1"
            ),
            &[&id],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

#[test]
fn ordinary_steps_are_one_row_each_and_every_read_sees_where_the_run_is() -> TestResult {
    rt().block_on(async {
        let (store, guard) = support::fresh_store(PgOptions::default()).await;
        let mut cp = started(&store, "r").await?;
        for at in [2_000, 3_000, 4_000] {
            let step = complete_step(&mut cp, at);
            cp.version = store
                .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
                .await?;
        }
        // The first step after the load-free start is a delta the head
        // writes; those after it are rows alone (the head stays behind).
        let (head_next, head_version, ahead) = stored_rows(&store, "r").await?;
        assert!(ahead >= 2, "{ahead} progress rows");
        assert_eq!(head_next + ahead, 3);
        assert!(head_version < cp.version as i64);
        // A store with nothing cached reads where the run is.
        let other = PgStore::connect(&support::url_with_schema(&guard.0)).await?;
        let loaded = other.load("r").await?.expect("stored");
        assert_eq!((loaded.next, loaded.version), (3, cp.version));
        assert_eq!(loaded.state, cp.state);
        assert_eq!(loaded.completed, cp.completed);
        assert_eq!(loaded.writer, cp.writer, "the last row's writer number");
        assert_eq!(loaded.updated_at, Timestamp::from_unix_millis(4_000));
        let listed = other.list(&ListFilter::default()).await?;
        assert_eq!((listed[0].next, listed[0].version), (3, cp.version));
        assert_eq!(listed[0].updated_at, Timestamp::from_unix_millis(4_000));
        // Saved before 3.5 s: the run is not, by its last row's time.
        let before = ListFilter::new().updated_before(Timestamp::from_unix_millis(3_500));
        assert!(other.list(&before).await?.is_empty());
        let history = other.history("r").await?.expect("stored");
        assert_eq!(history.len(), 3);
        // The other store goes on from what it loaded; its head write takes
        // the rows in.
        let mut cp = loaded;
        cp.status = RunStatus::Completed;
        cp.version = other
            .save(SaveRequest::new(&cp, Some(cp.version)).head_only())
            .await?;
        let (head_next, head_version, _) = stored_rows(&store, "r").await?;
        assert_eq!((head_next, head_version), (3, cp.version as i64));
        let loaded = store.load("r").await?.expect("stored");
        assert_eq!((loaded.next, loaded.version), (3, cp.version));
        assert_eq!(loaded.status, RunStatus::Completed);
        Ok(())
    })
}

#[test]
fn a_stale_step_is_a_conflict_and_writes_nothing() -> TestResult {
    rt().block_on(async {
        let (a, guard) = support::fresh_store(PgOptions::default()).await;
        let b = PgStore::connect(&support::url_with_schema(&guard.0)).await?;
        let mut cp = started(&a, "r").await?;
        for at in [2_000, 3_000] {
            let step = complete_step(&mut cp, at);
            cp.version = a
                .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
                .await?;
        }
        // B loads, A records one more step: B's step of the same index
        // conflicts, and so does B's head write.
        let mut seen = b.load("r").await?.expect("stored");
        let step = complete_step(&mut cp, 4_000);
        cp.version = a
            .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
            .await?;
        let mut late = seen.clone();
        let late_step = complete_step(&mut late, 4_500);
        let err = b
            .save(SaveRequest::new(&late, Some(seen.version)).with_step(&late_step))
            .await
            .expect_err("a step of an index already recorded");
        assert_eq!(err.kind(), StoreErrorKind::Conflict, "{err}");
        assert!(err.to_string().contains(&cp.version.to_string()), "{err}");
        seen.status = RunStatus::Failed;
        let err = b
            .save(SaveRequest::new(&seen, Some(seen.version)).head_only())
            .await
            .expect_err("a head write behind a progress row");
        assert_eq!(err.kind(), StoreErrorKind::Conflict, "{err}");
        let loaded = a.load("r").await?.expect("stored");
        assert_eq!((loaded.next, loaded.version), (3, cp.version));
        assert_eq!(loaded.state, cp.state);
        assert_eq!(loaded.status, RunStatus::Running);
        Ok(())
    })
}

/// Two stores (two caches, two connections) race a step and a head write on
/// the same run, many times: exactly one lands, and the run reads back whole
/// with the winner's version.
#[test]
fn a_head_write_racing_a_step_lets_exactly_one_land() -> TestResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (a, guard) = support::fresh_store(PgOptions::default()).await;
        let b = PgStore::connect(&support::url_with_schema(&guard.0)).await?;
        let (mut steps_won, mut heads_won) = (0, 0);
        for n in 0..150 {
            let id = format!("r{n}");
            let mut cp = started(&a, &id).await?;
            // A step first, so that the racing step is a row alone.
            let step = complete_step(&mut cp, 2_000);
            cp.version = a
                .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
                .await?;
            let step = complete_step(&mut cp, 2_500);
            cp.version = a
                .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
                .await?;
            let mut head = b.load(&id).await?.expect("stored");
            let expected = head.version;
            let step = complete_step(&mut cp, 3_000);
            head.status = RunStatus::Waiting;
            let (by_step, by_head) = tokio::join!(
                a.save(SaveRequest::new(&cp, Some(expected)).with_step(&step)),
                b.save(SaveRequest::new(&head, Some(expected)).head_only()),
            );
            let loaded = PgStore::connect(&support::url_with_schema(&guard.0))
                .await?
                .load(&id)
                .await?
                .expect("stored");
            match (by_step, by_head) {
                (Ok(v), Err(e)) => {
                    assert_eq!(e.kind(), StoreErrorKind::Conflict, "{e}");
                    assert_eq!((loaded.version, loaded.next), (v, 3));
                    assert_eq!(loaded.status, RunStatus::Running);
                    steps_won += 1;
                }
                (Err(e), Ok(v)) => {
                    assert_eq!(e.kind(), StoreErrorKind::Conflict, "{e}");
                    assert_eq!((loaded.version, loaded.next), (v, 2));
                    assert_eq!(loaded.status, RunStatus::Waiting);
                    heads_won += 1;
                }
                other => panic!("run {id}: exactly one must land, got {other:?}"),
            }
        }
        assert!(steps_won + heads_won == 150, "{steps_won} + {heads_won}");
        Ok(())
    })
}

#[test]
fn a_damaged_progress_row_is_corrupt_where_it_is_read() -> TestResult {
    rt().block_on(async {
        let (store, guard) = support::fresh_store(PgOptions::default()).await;
        let mut cp = started(&store, "r").await?;
        for at in [2_000, 3_000, 4_000] {
            let step = complete_step(&mut cp, at);
            cp.version = store
                .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
                .await?;
        }
        let q = store.quoted_schema();
        store
            .connection()
            .await?
            .batch_execute(&format!(
                "UPDATE {q}.steps SET version = NULL
                 WHERE idx = (SELECT max(idx) FROM {q}.steps)"
            ))
            .await?;
        let other = PgStore::connect(&support::url_with_schema(&guard.0)).await?;
        let err = other
            .load("r")
            .await
            .expect_err("a row without its version");
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("steps["), "{err}");
        let err = other
            .list(&ListFilter::default())
            .await
            .expect_err("a summary of a damaged row");
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
        Ok(())
    })
}

/// A store of schema 5 (no progress rows, rows past a rewind's `next` left
/// behind) opens migrated: the stale rows are gone, the run loads and goes
/// on, and an older build's statements fail.
#[test]
fn a_schema_5_store_is_migrated() -> TestResult {
    rt().block_on(async {
        let (store, guard) = support::fresh_store(PgOptions::default()).await;
        let mut cp = started(&store, "r").await?;
        let step = complete_step(&mut cp, 2_000);
        cp.version = store
            .save(SaveRequest::new(&cp, Some(cp.version)).with_step(&step))
            .await?;
        cp.status = RunStatus::Failed;
        cp.version = store
            .save(SaveRequest::new(&cp, Some(cp.version)).head_only())
            .await?;
        let q = store.quoted_schema();
        // As schema 5 was: a row left past `next` by a rewind.
        store
            .connection()
            .await?
            .batch_execute(&format!(
                "ALTER TABLE {q}.runs RENAME COLUMN snapshot_names TO snapshot_steps;
                 ALTER TABLE {q}.steps DROP COLUMN version, DROP COLUMN saved_at, DROP COLUMN writer;
                 INSERT INTO {q}.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
                     VALUES ('r', 5, 'stale', '{{\"stale\":true}}', 1, 0, 0);
                 UPDATE {q}.meta SET value = 5 WHERE key = 'schema_version';"
            ))
            .await?;
        drop(store);
        let store = PgStore::connect(&support::url_with_schema(&guard.0)).await?;
        let stale: i64 = store
            .connection()
            .await?
            .query_one(&format!("SELECT count(*) FROM {q}.steps WHERE idx >= 1"), &[])
            .await?
            .get(0);
        assert_eq!(stale, 0, "the row past next is gone");
        let loaded = store.load("r").await?.expect("stored");
        assert_eq!((loaded.next, loaded.version), (1, cp.version));
        assert_eq!(loaded.state, cp.state);
        let old = store
            .connection()
            .await?
            .query(&format!("SELECT snapshot_steps FROM {q}.runs"), &[])
            .await;
        assert!(old.is_err(), "an older build's load still runs");
        Ok(())
    })
}
