//! Large values by reference on PostgreSQL (schema 2): stored once across
//! steps and runs, freed when no run refers to them (also with writers in
//! other processes' connections at work on the same content), damage
//! reported with its place, values stored before blobs read back as
//! written.

mod support;

use serde_json::{json, Value};
use steadfast_core::store::SaveRequest;
use steadfast_core::{
    ops, run, update, Checkpoint, Store, StoreErrorKind, StoreExt as _, SystemClock, Timestamp,
    Workflow,
};
use steadfast_postgres::{PgOptions, PgStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

use steadfast_conformance::fixtures::{doc, rereading_agent as agent};

/// A store with a threshold of 16 KiB in a fresh schema.
async fn fresh() -> (PgStore, support::DropSchema) {
    support::fresh_store(PgOptions::default().blob_threshold(16 << 10)).await
}

/// Another handle on the schema `guard` drops, with its own pool (as
/// another process would have), at the same threshold.
async fn second_handle(guard: &support::DropSchema) -> Result<PgStore, steadfast_core::StoreError> {
    PgStore::connect_with(
        &support::url_with_schema(&guard.0),
        PgOptions::default().blob_threshold(16 << 10),
    )
    .await
}

/// (blobs, bytes of their chunks, references) in the store's schema.
async fn counts(store: &PgStore) -> Result<(i64, i64, i64), Box<dyn std::error::Error>> {
    let q = store.quoted_schema();
    let client = store.connection().await?;
    let row = client
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {q}.blobs),
                        (SELECT coalesce(sum(octet_length(body)), 0)::bigint FROM {q}.blob_chunks),
                        (SELECT count(*) FROM {q}.blob_refs)"
            ),
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// Runs `sql` (`{q}` is the schema) behind the store's back.
async fn tamper(store: &PgStore, sql: &str) -> TestResult {
    let client = store.connection().await?;
    client
        .batch_execute(&sql.replace("{q}", &store.quoted_schema()))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_value_is_stored_once_across_steps_and_runs_and_freed_with_its_last_run() -> TestResult {
    let (store, _g) = fresh().await;
    for r in 0..3 {
        run(&format!("r{r}"), &agent(4, r), &store).await?;
    }
    // Two shared documents, and one of its own per step and run.
    let (blobs, bytes, refs) = counts(&store).await?;
    assert_eq!(blobs, 2 + 3 * 4);
    let unique = 2 * (doc(0, 100).len() + 2) + 12 * (doc(1000, 20).len() + 2);
    assert_eq!(bytes as usize, unique, "every content once");
    assert_eq!(refs, 3 * (2 + 4));
    let totals = store.blob_totals().await?.expect("a store with blobs");
    assert_eq!((totals.blobs, totals.bytes), (14, unique as u64));
    // Every step's row holds references, not the values.
    let q = store.quoted_schema();
    let longest: i32 = store
        .connection()
        .await?
        .query_one(
            &format!("SELECT max(octet_length(update_json)) FROM {q}.steps"),
            &[],
        )
        .await?
        .get(0);
    assert!(longest < 1000, "a history row holds {longest} bytes");
    // What one run stores, and how much of it others share.
    let usage = store.usage("r1").await?.expect("stored");
    assert_eq!(usage.blobs, 6);
    assert_eq!(usage.shared_bytes, 2 * (doc(0, 100).len() as u64 + 2));

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
    assert_eq!(counts(&store).await?.0, 2 + 2 * 4);
    let v = store.load("r1").await?.expect("stored").version;
    assert!(store.delete_if("r1", v).await?);
    assert_eq!(counts(&store).await?.0, 2 + 4);
    assert_eq!(
        store.load("r2").await?.expect("stored").state["shared1"],
        json!(doc(1, 100))
    );
    assert!(store.delete("r2").await?);
    assert_eq!(counts(&store).await?, (0, 0, 0), "nothing left behind");
    Ok(())
}

#[tokio::test]
async fn prune_and_rewind_free_the_values_only_dropped_rows_held() -> TestResult {
    let (store, _g) = fresh().await;
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(counts(&store).await?.0, 2 + 6);
    // Rewinding to s4 drops s4 and s5: their own values go (the state no
    // longer has them either).
    ops::rewind(&store, "r", "s4", "test", &SystemClock).await?;
    assert_eq!(counts(&store).await?.0, 2 + 4);
    // Folding into s2 keeps every value the state still has.
    ops::prune(&store, "r", 1, "test", &SystemClock).await?;
    let cp = store.load("r").await?.expect("stored");
    for i in 0..4 {
        assert_eq!(cp.state[&format!("own{i}")], json!(doc(1000 + i, 20)));
    }
    assert_eq!(counts(&store).await?.0, 2 + 4);
    // Running it on brings s4 and s5 back, with their values.
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(counts(&store).await?.0, 2 + 6);
    let history = store.history("r").await?.expect("stored");
    assert_eq!(
        history.last().map(|r| &r.update["own5"]),
        Some(&json!(doc(1005, 20)))
    );
    Ok(())
}

#[tokio::test]
async fn a_damaged_or_missing_blob_is_corrupt_with_its_place() -> TestResult {
    let (store, _g) = fresh().await;
    run("r", &agent(2, 0), &store).await?;
    // One byte changed: the content no longer hashes to its name.
    tamper(
        &store,
        "UPDATE {q}.blob_chunks SET body = overlay(body placing '\\x78'::bytea from 3)
         WHERE hash = (SELECT hash FROM {q}.blob_chunks ORDER BY hash LIMIT 1)",
    )
    .await?;
    let err = store.load("r").await.expect_err("a damaged blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("runs[\"r\"]"), "{err}");
    // A blob gone altogether (the foreign keys set aside, as damage would).
    tamper(
        &store,
        "ALTER TABLE {q}.blob_refs DROP CONSTRAINT blob_refs_hash_fkey;
         DELETE FROM {q}.blobs;",
    )
    .await?;
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
    let (store, guard) = fresh().await;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"plain": 1})) })
        .build()?;
    run("r", &wf, &store).await?;
    // As a build before schema 2 would have written them: not escaped.
    let fake = json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
    let text = serde_json::to_string(&json!({"plain": 1, "fake": fake}))?;
    tamper(
        &store,
        &format!(
            "DROP TABLE {{q}}.documents; DROP TABLE {{q}}.events; DROP TABLE {{q}}.blob_refs; DROP TABLE {{q}}.blob_chunks; DROP TABLE {{q}}.blobs;
             ALTER TABLE {{q}}.runs RENAME COLUMN snapshot_steps TO snapshot_completed;
             UPDATE {{q}}.meta SET value = 1 WHERE key = 'schema_version';
             UPDATE {{q}}.steps SET update_json = '{text}';
             UPDATE {{q}}.runs SET snapshot = '{text}';"
        ),
    )
    .await?;
    let url = support::url_with_schema(&guard.0);
    let store = PgStore::connect(&url).await?;
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["fake"], fake);
    assert_eq!(
        store.history("r").await?.expect("stored")[0].update["fake"],
        fake
    );
    // A process of the older build still running cannot load a run (and so
    // never mistakes a reference for its value).
    let q = store.quoted_schema();
    let old = store
        .connection()
        .await?
        .query(&format!("SELECT snapshot_completed FROM {q}.runs"), &[])
        .await;
    assert!(old.is_err(), "an older build's load still runs");
    Ok(())
}

#[tokio::test]
async fn a_value_larger_than_a_chunk_round_trips() -> TestResult {
    let (store, _g) = support::fresh_store(PgOptions::default()).await;
    let big = "z".repeat(17 << 20);
    let value = big.clone();
    let wf = Workflow::builder("w")
        .step("a", move |_, _| {
            let value = value.clone();
            async move { update(json!({ "big": value })) }
        })
        .build()?;
    run("r", &wf, &store).await?;
    let q = store.quoted_schema();
    let chunks: i64 = store
        .connection()
        .await?
        .query_one(&format!("SELECT count(*) FROM {q}.blob_chunks"), &[])
        .await?
        .get(0);
    assert_eq!(chunks, 2, "17 MiB in chunks of 16 MiB");
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["big"], Value::String(big));
    Ok(())
}

#[tokio::test]
async fn the_threshold_is_set_in_the_url_and_checked() -> TestResult {
    let schema = support::fresh_schema();
    let _g = support::DropSchema(schema.clone());
    let url = format!("{}&blob_threshold=1KiB", support::url_with_schema(&schema));
    let store = PgStore::connect(&url).await?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"v": "x".repeat(2000)})) })
        .build()?;
    run("r", &wf, &store).await?;
    assert_eq!(
        counts(&store).await?.0,
        1,
        "a 2 KB value is a blob at 1 KiB"
    );
    let err = PgStore::connect_with(
        &support::url_with_schema(&schema),
        PgOptions::default().blob_threshold(10),
    )
    .await
    .expect_err("a threshold of 10 bytes");
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{err}");
    Ok(())
}

#[tokio::test]
async fn a_snapshot_that_drops_a_value_frees_it() -> TestResult {
    let (store, _g) = fresh().await;
    // A run that starts with a large input and no step yet.
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("input".into(), json!(doc(5, 100)));
    let v = store.save(SaveRequest::new(&cp, None)).await?;
    assert_eq!(counts(&store).await?.0, 1);
    // A save of the whole state without it (a rekey's, a replacement's).
    cp.state.clear();
    cp.state.insert("small".into(), json!(1));
    store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(
        counts(&store).await?,
        (0, 0, 0),
        "the dropped value is freed"
    );
    Ok(())
}

/// A run this handle made without large values, which then takes one and
/// drops it again in a new snapshot: the value is freed (the handle must not
/// keep believing the run refers to no blob), and a snapshot of a run that
/// never referred to one is saved too.
#[tokio::test]
async fn a_run_that_takes_up_a_value_and_drops_it_frees_it() -> TestResult {
    let (store, _g) = fresh().await;
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("small".into(), json!(1));
    let v = store.save(SaveRequest::new(&cp, None)).await?;
    cp.state.insert("small".into(), json!(2));
    let v = store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(counts(&store).await?, (0, 0, 0));
    cp.state.insert("input".into(), json!(doc(5, 100)));
    let v = store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(counts(&store).await?.0, 1);
    cp.state.remove("input");
    let v = store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(
        counts(&store).await?,
        (0, 0, 0),
        "the dropped value is freed"
    );
    let loaded = store.load("r").await?.expect("saved");
    assert_eq!(loaded.state, cp.state);
    assert_eq!(store.load("r").await?.map(|_| v), Some(v));
    Ok(())
}

/// A run another handle (another process) gave a large value: this handle
/// loads it, and its snapshot without the value frees it. When the other
/// handle adds a value after this one's last save, this handle's next save
/// (at the version the other left, never loaded here) counts again and
/// frees it: what this handle knew was of an older version.
#[tokio::test]
async fn a_run_loaded_from_another_handle_frees_what_its_snapshot_drops() -> TestResult {
    let (a, guard) = fresh().await;
    let b = second_handle(&guard).await?;
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("input".into(), json!(doc(5, 100)));
    let v1 = b.save(SaveRequest::new(&cp, None)).await?;
    let mut got = a.load("r").await?.expect("saved by b");
    got.state.remove("input");
    a.save(SaveRequest::new(&got, Some(v1))).await?;
    assert_eq!(counts(&a).await?, (0, 0, 0), "freed by a's snapshot");
    // A run a made with no large value, at v2 in a's knowledge; b loads
    // it and adds one (v3); a saves at v3 without loading, dropping it.
    let mut small = Checkpoint::new("q", "w", Timestamp::from_unix_millis(1));
    small.state.insert("small".into(), json!(1));
    let v1 = a.save(SaveRequest::new(&small, None)).await?;
    let v2 = a.save(SaveRequest::new(&small, Some(v1))).await?;
    let mut theirs = b.load("q").await?.expect("saved by a");
    theirs.state.insert("input".into(), json!(doc(6, 100)));
    let v3 = b.save(SaveRequest::new(&theirs, Some(v2))).await?;
    assert_eq!(counts(&a).await?.0, 1);
    small.state.insert("small".into(), json!(2));
    a.save(SaveRequest::new(&small, Some(v3))).await?;
    assert_eq!(
        counts(&a).await?,
        (0, 0, 0),
        "freed by a's snapshot at b's version"
    );
    assert_eq!(a.load("q").await?.expect("saved").state, small.state);
    Ok(())
}

/// References planted under a run id before the run exists (left by hand,
/// or by a run of that id deleted half-way): the run's first statement sees
/// them, so its first new snapshot counts them again and frees the blob.
#[tokio::test]
async fn references_planted_before_a_run_exists_are_counted_at_its_first_snapshot() -> TestResult {
    let (store, _g) = fresh().await;
    let mut other = Checkpoint::new("other", "w", Timestamp::from_unix_millis(1));
    other.state.insert("input".into(), json!(doc(5, 100)));
    store.save(SaveRequest::new(&other, None)).await?;
    tamper(
        &store,
        "INSERT INTO {q}.blob_refs (run_id, hash)
         SELECT 'planted', hash FROM {q}.blob_refs WHERE run_id = 'other'",
    )
    .await?;
    assert!(store.delete("other").await?);
    assert_eq!(counts(&store).await?.0, 1, "held by the planted reference");
    let mut cp = Checkpoint::new("planted", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("small".into(), json!(1));
    let v = store.save(SaveRequest::new(&cp, None)).await?;
    cp.state.insert("small".into(), json!(2));
    store.save(SaveRequest::new(&cp, Some(v))).await?;
    assert_eq!(
        counts(&store).await?,
        (0, 0, 0),
        "the planted reference is gone"
    );
    assert_eq!(store.load("planted").await?.expect("saved").state, cp.state);
    Ok(())
}

/// Writers on two handles (two pools: as two processes would) take up and
/// drop the same contents at once: every run left loads whole, and once
/// every run is gone no blob is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_two_handles_share_and_free_the_same_values_safely() -> TestResult {
    let (a, guard) = fresh().await;
    let b = second_handle(&guard).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8usize {
        let store = if t % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move {
            let mut kept = Vec::new();
            for i in 0..12usize {
                let run_id = format!("r{t}-{i}");
                let k = (t + i) % 2;
                let mut cp = Checkpoint::new(&run_id, "w", Timestamp::from_unix_millis(1));
                cp.state.insert("doc".into(), json!(doc(k, 40)));
                let v = store.save(SaveRequest::new(&cp, None)).await?;
                if i % 3 == 0 {
                    kept.push((run_id, k));
                } else {
                    assert!(store.delete_if(&run_id, v).await?);
                }
            }
            Ok::<_, steadfast_core::StoreError>(kept)
        });
    }
    let mut kept = Vec::new();
    while let Some(done) = tasks.join_next().await {
        kept.extend(done??);
    }
    for (run_id, k) in &kept {
        let cp = b.load(run_id).await?.expect("kept");
        assert_eq!(cp.state["doc"], json!(doc(*k, 40)), "{run_id}");
    }
    assert_eq!(counts(&a).await?.0, 2, "two contents, stored once each");
    for (run_id, _) in &kept {
        assert!(a.delete(run_id).await?);
    }
    assert_eq!(counts(&a).await?, (0, 0, 0), "nothing left behind");
    Ok(())
}

/// A delete that meets saves of the same run in flight (another handle
/// adding large values to it) leaves no reference and no blob behind: the
/// run's rows and references are deleted after its row, as of a snapshot
/// that sees every save that got to it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_saves_of_the_run_leaves_nothing_behind() -> TestResult {
    let (a, guard) = fresh().await;
    let b = second_handle(&guard).await?;
    for round in 0..30usize {
        let run_id = format!("r{round}");
        let mut cp = Checkpoint::new(&run_id, "w", Timestamp::from_unix_millis(1));
        cp.state.insert("doc".into(), json!(doc(round, 20)));
        let first = a.save(SaveRequest::new(&cp, None)).await?;
        let saver = {
            let a = a.clone();
            tokio::spawn(async move {
                let mut version = first;
                for i in 0..6usize {
                    cp.state
                        .insert(format!("d{i}"), json!(doc(10_000 + round * 10 + i, 20)));
                    match a.save(SaveRequest::new(&cp, Some(version))).await {
                        Ok(v) => version = v,
                        // Deleted under it: the save changed nothing.
                        Err(e) if e.kind() == StoreErrorKind::Conflict => return,
                        Err(e) => panic!("save {i} of {}: {e}", cp.run_id),
                    }
                }
            })
        };
        tokio::time::sleep(std::time::Duration::from_micros((round as u64 % 6) * 400)).await;
        b.delete(&run_id).await?;
        saver.await?;
        // Whatever the saver managed after the delete is a run of its own:
        // none, since every save after it conflicts.
        assert!(b.load(&run_id).await?.is_none(), "{run_id} came back");
    }
    assert_eq!(
        counts(&a).await?,
        (0, 0, 0),
        "references or blobs left behind"
    );
    Ok(())
}
