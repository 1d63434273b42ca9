//! Every check a store must pass. Each takes a fresh [`TestStore`].

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use steadfast_core::store::SaveRequest;
use steadfast_core::{
    Checkpoint, Decision, Lease, ListFilter, OnTimeout, Owner, RunStatus, Spend, State,
    StepFailure, StepRecord, Store, StoreError, StoreErrorKind, Timestamp, Wait,
};

use crate::{CheckResult, TestStore, STATE_LIMIT};

pub use crate::blob_checks::*;
pub use crate::events_checks::*;
pub use crate::ops_checks::*;
pub use crate::replace_checks::*;
use steadfast_core::StoreExt as _;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_700_000_000_000 + ms)
}

fn checkpoint(run_id: &str, workflow: &str, state: Value) -> Checkpoint {
    let mut cp = Checkpoint::new(run_id, workflow, t(0));
    if let Value::Object(map) = state {
        cp.state = map;
    }
    cp
}

/// Saves `cp` expecting `expected` and returns the new version.
async fn save(
    store: &dyn Store,
    cp: &Checkpoint,
    expected: Option<u64>,
) -> Result<u64, StoreError> {
    store.save(SaveRequest::new(cp, expected)).await
}

fn is_conflict<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(e) if e.kind() == StoreErrorKind::Conflict)
}

/// Loading a run that was never saved returns `None`.
pub async fn absent_run_loads_as_none(t: TestStore) -> CheckResult {
    let loaded = t.store.load("never-saved").await?;
    ensure!(loaded.is_none(), "expected None, got {loaded:?}");
    Ok(())
}

/// Run ids with characters stores must escape (`/ \ ? # " ~`, spaces,
/// non-ASCII), ids that differ only where an escaping could make them
/// collide, and the longest allowed, are kept apart: each loads back as
/// saved, and `list` names each once.
pub async fn odd_run_ids_are_kept_apart_and_load_back(ts: TestStore) -> CheckResult {
    let longest = "/".repeat(steadfast_core::MAX_RUN_ID_BYTES);
    let ids = [
        "a/b",
        "a~2Fb",
        "a%2Fb",
        "q?#\\",
        "\"quoted\"",
        "é ü 中",
        "~",
        longest.as_str(),
    ];
    for (i, id) in ids.iter().enumerate() {
        let mut cp = Checkpoint::new(*id, "wf", Timestamp::from_unix_millis(1));
        cp.state.insert("i".into(), json!(i));
        save(&*ts.store, &cp, None).await?;
    }
    for (i, id) in ids.iter().enumerate() {
        let cp = ts.store.load(id).await?;
        let cp = cp.ok_or_else(|| format!("run {id:?} is absent"))?;
        ensure!(
            cp.run_id == *id && cp.state.get("i") == Some(&json!(i)),
            "run {id:?} loaded back as {cp:?}"
        );
    }
    let mut listed: Vec<String> = ts
        .store
        .list(&ListFilter::new())
        .await?
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    listed.sort();
    let mut expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    expected.sort();
    ensure!(listed == expected, "list gave {listed:?}");
    Ok(())
}

/// A fresh save writes version 1 and every field loads back equal.
pub async fn first_save_writes_version_one_and_loads_back_equal(ts: TestStore) -> CheckResult {
    let mut cp = checkpoint(
        "run/1 ü",
        "flow",
        json!({"a": 1, "nested": {"x": [1, 2.5, "s", null, true]}}),
    );
    cp.completed = vec!["a".into(), "b".into()];
    cp.next = 2;
    cp.attempts = 2;
    cp.updated_at = t(5);
    cp.writer = 42;
    cp.error = Some(StepFailure::new(
        2,
        "c",
        "boom \"quoted\"\n".into(),
        2,
        false,
        t(4),
    ));
    cp.status = RunStatus::Waiting;
    cp.lease = Some(Lease::new(Owner::new("host-a", 42, 12345), t(9)));
    cp.wait = Some(Wait::Gate {
        step: "review".into(),
        since: t(3),
        timeout_at: Some(t(100)),
        on_timeout: OnTimeout::Approve,
    });
    cp.decisions = vec![
        Decision::reject("review", "bo", t(1), Some("no".into())),
        Decision::approve("review", "ada", t(2), Some(json!({"ok": [1, "x"]}))),
    ];
    let record = StepRecord::new(1, "b", Map::new(), 1, t(1), t(2));
    let v = ts
        .store
        .save(SaveRequest::new(&cp, None).with_step(&record))
        .await?;
    ensure!(v == 1, "first save returned version {v}, expected 1");
    let loaded = ts
        .store
        .load("run/1 ü")
        .await?
        .ok_or("saved run loads as None")?;
    cp.version = 1;
    ensure!(loaded == cp, "loaded {loaded:#?}\nsaved {cp:#?}");
    Ok(())
}

/// Two fresh saves of one run: the second is a conflict.
pub async fn second_fresh_save_conflicts(ts: TestStore) -> CheckResult {
    let cp = checkpoint("r", "flow", json!({"a": 1}));
    save(&*ts.store, &cp, None).await?;
    let other = checkpoint("r", "flow", json!({"a": 2}));
    let second = save(&*ts.store, &other, None).await;
    ensure!(
        is_conflict(&second),
        "second fresh save returned {second:?}"
    );
    let loaded = ts.store.load("r").await?.ok_or("run vanished")?;
    ensure!(
        loaded.state["a"] == json!(1),
        "the conflicting save changed the record: {loaded:?}"
    );
    Ok(())
}

/// A save with a stale version conflicts and leaves the record as it was.
pub async fn stale_version_conflicts_and_leaves_record_unchanged(ts: TestStore) -> CheckResult {
    let mut cp = checkpoint("r", "flow", json!({"n": 0}));
    let v1 = save(&*ts.store, &cp, None).await?;
    cp.state.insert("n".into(), json!(1));
    let v2 = save(&*ts.store, &cp, Some(v1)).await?;
    let before = ts.store.load("r").await?;
    cp.state.insert("n".into(), json!(99));
    let stale = save(&*ts.store, &cp, Some(v1)).await;
    ensure!(is_conflict(&stale), "stale save returned {stale:?}");
    let after = ts.store.load("r").await?;
    ensure!(
        before == after,
        "record changed by a stale save: {before:?} -> {after:?}"
    );
    ensure!(after.map(|c| c.version) == Some(v2), "version moved");
    Ok(())
}

/// Expecting a version of a run that does not exist is a conflict, and creates nothing.
pub async fn expected_version_on_absent_run_conflicts(ts: TestStore) -> CheckResult {
    let cp = checkpoint("ghost", "flow", json!({}));
    let r = save(&*ts.store, &cp, Some(3)).await;
    ensure!(
        is_conflict(&r),
        "save expecting version 3 of an absent run returned {r:?}"
    );
    ensure!(
        ts.store.load("ghost").await?.is_none(),
        "the failed save created the run"
    );
    Ok(())
}

/// Versions go 1, 2, 3, ... and load back as saved.
pub async fn each_save_increments_the_version_by_one(ts: TestStore) -> CheckResult {
    let mut cp = checkpoint("r", "flow", json!({}));
    let mut expected = None;
    for i in 1..=20u64 {
        cp.state.insert(format!("k{i}"), json!(i));
        let v = save(&*ts.store, &cp, expected).await?;
        ensure!(v == i, "save {i} returned version {v}");
        let loaded = ts.store.load("r").await?.ok_or("run vanished")?;
        ensure!(
            loaded.version == i,
            "loaded version {} after save {i}",
            loaded.version
        );
        ensure!(loaded.state == cp.state, "state differs after save {i}");
        expected = Some(v);
    }
    Ok(())
}

async fn seed_runs(store: &dyn Store) -> Result<(), StoreError> {
    for i in 0..12u64 {
        let mut cp = checkpoint(
            &format!("run-{i:02}"),
            if i % 2 == 0 { "even" } else { "odd" },
            json!({"i": i}),
        );
        cp.status = match i % 3 {
            0 => RunStatus::Completed,
            1 => RunStatus::Failed,
            _ => RunStatus::Running,
        };
        cp.updated_at = t(i * 1000);
        save(store, &cp, None).await?;
    }
    Ok(())
}

fn ids(list: &[steadfast_core::RunSummary]) -> Vec<String> {
    list.iter().map(|s| s.run_id.clone()).collect()
}

/// `list` applies status, workflow, updated-before and limit, and orders by run id.
pub async fn list_applies_every_filter_and_the_limit(ts: TestStore) -> CheckResult {
    seed_runs(&*ts.store).await?;
    let all = ts.store.list(&ListFilter::new()).await?;
    ensure!(all.len() == 12, "listed {} runs, expected 12", all.len());
    let mut sorted = ids(&all);
    sorted.sort();
    ensure!(
        ids(&all) == sorted,
        "not ordered by run id: {:?}",
        ids(&all)
    );

    let failed = ts
        .store
        .list(&ListFilter::new().status(RunStatus::Failed))
        .await?;
    ensure!(
        ids(&failed) == ["run-01", "run-04", "run-07", "run-10"],
        "status filter gave {:?}",
        ids(&failed)
    );
    let even_done = ts
        .store
        .list(
            &ListFilter::new()
                .workflow("even")
                .status(RunStatus::Completed),
        )
        .await?;
    ensure!(
        ids(&even_done) == ["run-00", "run-06"],
        "workflow+status gave {:?}",
        ids(&even_done)
    );
    let old = ts
        .store
        .list(&ListFilter::new().updated_before(t(3000)))
        .await?;
    ensure!(
        ids(&old) == ["run-00", "run-01", "run-02"],
        "updated_before gave {:?}",
        ids(&old)
    );
    let limited = ts
        .store
        .list(&ListFilter::new().workflow("odd").limit(2))
        .await?;
    ensure!(
        ids(&limited) == ["run-01", "run-03"],
        "limit gave {:?}",
        ids(&limited)
    );
    let summary = &failed[0];
    ensure!(
        summary.workflow == "odd" && summary.version == 1 && summary.updated_at == t(1000),
        "summary fields wrong: {summary:?}"
    );
    Ok(())
}

/// Paging with `after` and `limit` visits every run exactly once.
pub async fn list_cursor_pages_through_every_run_once(ts: TestStore) -> CheckResult {
    seed_runs(&*ts.store).await?;
    let mut seen = Vec::new();
    let mut filter = ListFilter::new().limit(5);
    loop {
        let page = ts.store.list(&filter).await?;
        if page.is_empty() {
            break;
        }
        ensure!(page.len() <= 5, "page of {} over the limit", page.len());
        let last = page.last().map(|s| s.run_id.clone()).unwrap_or_default();
        seen.extend(ids(&page));
        filter = ListFilter::new().limit(5).after(last);
        ensure!(seen.len() <= 12, "paging does not end: {seen:?}");
    }
    let unique: BTreeSet<_> = seen.iter().collect();
    ensure!(
        seen.len() == 12 && unique.len() == 12,
        "paging visited {seen:?}"
    );
    Ok(())
}

/// `delete` makes the run absent, reports whether it existed, and a fresh save works again.
pub async fn delete_removes_the_run_and_allows_a_fresh_start(ts: TestStore) -> CheckResult {
    let cp = checkpoint("r", "flow", json!({"a": 1}));
    save(&*ts.store, &cp, None).await?;
    save(&*ts.store, &checkpoint("keep", "flow", json!({})), None).await?;
    ensure!(
        ts.store.delete("r").await?,
        "delete of an existing run returned false"
    );
    ensure!(
        ts.store.load("r").await?.is_none(),
        "deleted run still loads"
    );
    ensure!(!ts.store.delete("r").await?, "second delete returned true");
    ensure!(
        ts.store.load("keep").await?.is_some(),
        "delete removed another run"
    );
    let v = save(&*ts.store, &cp, None).await?;
    ensure!(v == 1, "fresh save after delete returned version {v}");
    let listed = ids(&ts.store.list(&ListFilter::new()).await?);
    ensure!(listed == ["keep", "r"], "list after delete: {listed:?}");
    Ok(())
}

/// 100 concurrent read-modify-write savers on 10 runs: every acknowledged save
/// is in the record, and each run's versions are 1, 2, 3, ... without a gap.
pub async fn interleaved_savers_keep_versions_gap_free(ts: TestStore) -> CheckResult {
    const SAVERS: usize = 100;
    const RUNS: usize = 10;
    const EACH: usize = 2;
    let store: Arc<dyn Store> = Arc::clone(&ts.store);
    let mut tasks = Vec::new();
    for saver in 0..SAVERS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let run_id = format!("run-{}", saver % RUNS);
            let mut done = 0;
            let mut tries = 0;
            while done < EACH {
                tries += 1;
                if tries > 10_000 {
                    return Err(format!("saver {saver} made no progress"));
                }
                let loaded = store.load(&run_id).await.map_err(|e| e.to_string())?;
                let (mut cp, expected) = match loaded {
                    Some(cp) => {
                        let v = cp.version;
                        (cp, Some(v))
                    }
                    None => (checkpoint(&run_id, "flow", json!({"log": []})), None),
                };
                let new_version = expected.map_or(1, |v| v + 1);
                if let Some(Value::Array(log)) = cp.state.get_mut("log") {
                    log.push(json!([new_version, saver]));
                }
                match store.save(SaveRequest::new(&cp, expected)).await {
                    Ok(v) if v == new_version => done += 1,
                    Ok(v) => {
                        return Err(format!("save returned version {v}, expected {new_version}"))
                    }
                    Err(e) if e.kind() == StoreErrorKind::Conflict => {
                        tokio::task::yield_now().await
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    for r in 0..RUNS {
        let cp = store
            .load(&format!("run-{r}"))
            .await?
            .ok_or("run missing")?;
        let log = cp.state["log"].as_array().ok_or("log is not an array")?;
        let expected_saves = SAVERS / RUNS * EACH;
        ensure!(
            log.len() == expected_saves,
            "run-{r} has {} saves logged, expected {expected_saves}",
            log.len()
        );
        for (i, entry) in log.iter().enumerate() {
            ensure!(
                entry[0] == json!(i + 1),
                "run-{r} log entry {i} is {entry}: versions have a gap or repeat"
            );
        }
        ensure!(
            cp.version == expected_saves as u64,
            "run-{r} ends at version {}",
            cp.version
        );
    }
    Ok(())
}

/// A state over the limit is refused with `TooLarge`, and the stored record
/// stays. (The state is many small values: a store with blobs stores a large
/// value by reference, and the limit bounds the record.)
pub async fn oversize_state_is_refused_and_prior_record_intact(ts: TestStore) -> CheckResult {
    let cp = checkpoint("r", "flow", json!({"small": "x"}));
    let v = save(&*ts.store, &cp, None).await?;
    let before = ts.store.load("r").await?;
    let many = || {
        let value = "x".repeat(100);
        let n = STATE_LIMIT as usize / 100 + 1;
        Value::Object((0..n).map(|i| (format!("k{i}"), json!(value))).collect())
    };
    let big = checkpoint("r", "flow", many());
    let r = save(&*ts.store, &big, Some(v)).await;
    ensure!(
        matches!(&r, Err(e) if e.kind() == StoreErrorKind::TooLarge),
        "oversize save returned {r:?}"
    );
    ensure!(
        ts.store.load("r").await? == before,
        "the refused save changed the record"
    );
    let fresh = save(&*ts.store, &checkpoint("new", "flow", many()), None).await;
    ensure!(fresh.is_err(), "oversize fresh save was accepted");
    ensure!(
        ts.store.load("new").await?.is_none(),
        "the refused fresh save created the run"
    );
    Ok(())
}

/// Large values (stored once by reference in a store with blobs), the same
/// value under several keys and in several runs, and values of the caller's
/// that look like references all load back exactly, in the state and in the
/// history, through a fresh save, a step's delta and a rewind.
pub async fn large_values_and_lookalikes_load_back_equal(ts: TestStore) -> CheckResult {
    let doc = "d".repeat(8 * 1024);
    let other = "e".repeat(8 * 1024);
    let lookalikes = json!({
        "fake": {"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3},
        "lit": {"$blob": "literal", "value": [1]},
        "odd": {"$blob": 1},
        "nested": {"a": {"$blob": "literal"}},
    });
    let mut first = json!({"doc": doc, "copy": doc, "n": 1});
    if let (Value::Object(f), Value::Object(l)) = (&mut first, lookalikes) {
        f.extend(l);
    }
    let history = ts.store.capabilities().history.is_some();
    for run_id in ["big-1", "big-2"] {
        let mut cp = checkpoint(run_id, "flow", first.clone());
        cp.completed = vec!["a".into()];
        cp.next = 1;
        let a = record(0, "a", first.clone(), 1);
        let v1 = ts
            .store
            .save(SaveRequest::new(&cp, None).with_step(&a))
            .await?;
        let b_update = json!({"doc2": other, "fake": {"$blob": "x"}, "doc": doc});
        let b = record(1, "b", b_update.clone(), 1);
        if let Value::Object(u) = &b_update {
            cp.state.extend(u.clone());
        }
        cp.completed.push("b".into());
        cp.next = 2;
        let v2 = ts
            .store
            .save(SaveRequest::new(&cp, Some(v1)).with_step(&b))
            .await?;
        cp.version = v2;
        let loaded = ts.store.load(run_id).await?;
        ensure!(
            loaded.as_ref() == Some(&cp),
            "run {run_id} loaded back differently: {:?}",
            loaded.map(|l| l.state.keys().cloned().collect::<Vec<_>>())
        );
        if history {
            let h = ts.store.history(run_id).await?.ok_or("no history")?;
            ensure!(h == vec![a.clone(), b], "run {run_id}: the history differs");
        }
        if run_id == "big-2" && history {
            // A rewind drops the second step; the first still loads.
            cp.next = 1;
            cp.completed.truncate(1);
            cp.state = match first.clone() {
                Value::Object(m) => m,
                _ => State::new(),
            };
            cp.version = ts.store.save(SaveRequest::new(&cp, Some(v2))).await?;
            ensure!(
                ts.store.load(run_id).await?.as_ref() == Some(&cp),
                "a rewound run loaded back differently"
            );
            let h = ts.store.history(run_id).await?.ok_or("no history")?;
            ensure!(h == vec![a], "the rewound history differs");
        }
    }
    // Deleting one run leaves the other whole.
    ensure!(ts.store.delete("big-1").await?, "delete found nothing");
    let left = ts
        .store
        .load("big-2")
        .await?
        .ok_or("the other run vanished")?;
    ensure!(
        left.state.get("doc") == Some(&json!(doc)),
        "deleting a run that shared a value damaged the other"
    );
    Ok(())
}

/// Runs that hold the same large values are saved and deleted at once by
/// many tasks (a store with blobs shares them, and frees one only when no
/// run refers to it): every run left loads back whole, in its state and its
/// history, and every deleted one is gone.
pub async fn shared_large_values_survive_concurrent_saves_and_deletes(
    ts: TestStore,
) -> CheckResult {
    let docs: Arc<Vec<String>> =
        Arc::new((0..3).map(|k| format!("{k}").repeat(6 * 1024)).collect());
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..6usize {
        let store = Arc::clone(&ts.store);
        let docs = Arc::clone(&docs);
        tasks.spawn(async move {
            let mut kept = Vec::new();
            for i in 0..8usize {
                let run_id = format!("share-{task}-{i}");
                let doc = docs[(task + i) % 3].clone();
                let mut cp = checkpoint(&run_id, "flow", json!({ "doc": doc }));
                cp.completed = vec!["read".into()];
                cp.next = 1;
                let step = record(0, "read", json!({ "doc": doc }), 1);
                let v = store
                    .save(SaveRequest::new(&cp, None).with_step(&step))
                    .await?;
                // Every other run goes again at once: the last reference to
                // a value, or one of many.
                if i % 2 == 1 {
                    ensure!(
                        store.delete_if(&run_id, v).await?,
                        "{run_id} was not there to delete"
                    );
                } else {
                    kept.push((run_id, (task + i) % 3));
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(kept)
        });
    }
    let mut kept = Vec::new();
    while let Some(done) = tasks.join_next().await {
        kept.extend(done??);
    }
    let history = ts.store.capabilities().history.is_some();
    for (run_id, k) in &kept {
        let cp = ts
            .store
            .load(run_id)
            .await?
            .ok_or(format!("{run_id} vanished"))?;
        ensure!(
            cp.state.get("doc") == Some(&json!(docs[*k])),
            "{run_id} lost its value"
        );
        if history {
            let h = ts.store.history(run_id).await?.ok_or("no history")?;
            ensure!(
                h.first().and_then(|r| r.update.get("doc")) == Some(&json!(docs[*k])),
                "{run_id}'s history lost its value"
            );
        }
    }
    for task in 0..6 {
        for i in (1..8).step_by(2) {
            let run_id = format!("share-{task}-{i}");
            ensure!(
                ts.store.load(&run_id).await?.is_none(),
                "{run_id} came back"
            );
        }
    }
    if let Some(blobs) = ts.store.capabilities().blobs {
        // Stored once: three contents, whatever the number of runs (a
        // store that seals values first has as many as it sealed).
        let totals = blobs.blob_totals().await?;
        if blobs.threshold() < 6 * 1024 {
            // Once per content, or once per run that holds it.
            let expected = if blobs.shared_across_runs() {
                3
            } else {
                kept.len() as u64
            };
            ensure!(
                totals.blobs == expected,
                "{} blobs stored for {expected}: {totals:?}",
                totals.blobs
            );
        }
        // Freed when the last run that refers to them goes.
        for (run_id, _) in &kept {
            ensure!(ts.store.delete(run_id).await?, "{run_id} was not there");
        }
        let left = blobs.blob_totals().await?;
        ensure!(
            left.blobs == 0 && left.bytes == 0,
            "blobs left after every run was deleted: {left:?}"
        );
    }
    Ok(())
}

/// Arbitrary JSON values, control characters, extreme numbers and nesting
/// included: the values the property checks feed to a store.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".*".prop_map(Value::String),
        "[\\\\\"\u{0}\u{1f}\u{7f}\u{2028}\u{10ffff}a]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn deep(depth: usize) -> Value {
    let mut v = json!("bottom");
    for i in 0..depth {
        v = if i % 2 == 0 {
            json!([v])
        } else {
            json!({ "k": v })
        };
    }
    v
}

fn state_strategy() -> impl Strategy<Value = State> {
    prop_oneof![
        8 => prop::collection::btree_map(".{0,10}", json_value(), 0..6)
            .prop_map(|m| m.into_iter().collect::<State>()),
        1 => (0usize..200).prop_map(|d| {
            let mut s = State::new();
            s.insert("deep".into(), deep(d));
            s
        }),
        1 => (0usize..(STATE_LIMIT as usize + 1024)).prop_map(|n| {
            let mut s = State::new();
            s.insert("blob".into(), Value::String("b".repeat(n)));
            s
        }),
    ]
}

/// A save of `cp` was acknowledged with version `v`: the run must load back
/// exactly as saved.
async fn loads_back_as_saved(
    store: &dyn Store,
    mut cp: Checkpoint,
    v: u64,
) -> Result<(), TestCaseError> {
    cp.version = v;
    let loaded = store
        .load(&cp.run_id)
        .await
        .map_err(|e| TestCaseError::fail(format!("save accepted, load failed: {e}")))?;
    prop_assert_eq!(loaded, Some(cp));
    Ok(())
}

/// Whatever state `save` accepts loads back equal: never `Ok` followed by a load
/// error or a different value.
pub async fn accepted_values_load_back_equal(ts: TestStore) -> CheckResult {
    let cases: u32 = std::env::var("STEADFAST_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let store = Arc::clone(&ts.store);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(PropConfig {
            cases,
            failure_persistence: None,
            ..PropConfig::default()
        });
        let n = std::sync::atomic::AtomicU64::new(0);
        runner
            .run(&state_strategy(), |state| {
                let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let run_id = format!("prop-{i}");
                let mut cp = checkpoint(&run_id, "flow", json!({}));
                cp.state = state;
                handle.block_on(async {
                    match store.save(SaveRequest::new(&cp, None)).await {
                        Err(_) => Ok(()),
                        Ok(v) => loads_back_as_saved(&*store, cp, v).await,
                    }
                })
            })
            .map_err(|e| e.to_string())
    })
    .await??;
    Ok(())
}

/// `depth` levels of arrays around a number, built and taken apart without
/// recursion (serde_json's own drop of a value this deep would overflow the
/// stack before any store saw it).
fn far_too_deep(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

fn take_apart(mut v: Value) {
    loop {
        v = match v {
            Value::Array(mut items) => items.pop().unwrap_or(Value::Null),
            Value::Object(map) => match map.into_iter().next() {
                Some((_, inner)) => inner,
                None => return,
            },
            _ => return,
        };
    }
}

/// A value nested far deeper than [`MAX_VALUE_DEPTH`](steadfast_core::MAX_VALUE_DEPTH)
/// (some 32,000 levels, as deep as the test stores' state limit allows:
/// deep enough to overflow a recursive walk on a test thread's stack) in a
/// state, a step's update or a decision's data is refused as invalid
/// input, with nothing written, and a head-only save given such an update
/// saves the head alone: never a stack overflow in the store's copying,
/// encoding, sizing or naming of the value, which would end the process.
pub async fn values_nested_far_too_deep_are_refused_not_overflowed(ts: TestStore) -> CheckResult {
    // `[` and `]` a level, under the state limit.
    const DEPTH: usize = (crate::STATE_LIMIT as usize - 64) / 2;
    let store = &*ts.store;
    let mut other = checkpoint("other", "flow", json!({"kept": true}));
    other.version = save(store, &other, None).await?;
    let mut in_state = checkpoint("deep-state", "flow", json!({}));
    in_state.state.insert("deep".into(), far_too_deep(DEPTH));
    let mut in_decision = checkpoint("deep-decision", "flow", json!({}));
    in_decision.decisions.push(Decision::approve(
        "review",
        "ada",
        t(1),
        Some(far_too_deep(DEPTH)),
    ));
    let in_update = checkpoint("deep-update", "flow", json!({}));
    let mut update = Map::new();
    update.insert("deep".into(), far_too_deep(DEPTH));
    let step = StepRecord::new(0, "a", update, 1, t(1), t(2));
    let outcomes = [
        (
            in_state.run_id.clone(),
            store.save(SaveRequest::new(&in_state, None)).await,
        ),
        (
            in_decision.run_id.clone(),
            store.save(SaveRequest::new(&in_decision, None)).await,
        ),
        (
            in_update.run_id.clone(),
            store
                .save(SaveRequest::new(&in_update, None).with_step(&step))
                .await,
        ),
    ];
    // A head-only save records no step, in every store: one given a deep
    // update anyway saves the head alone, without copying or writing it.
    let head = store
        .save(
            SaveRequest::new(&other, Some(other.version))
                .head_only()
                .with_step(&step),
        )
        .await;
    // Taken apart before anything can fail: a check that returns early
    // would drop them whole, and overflow in the test, not the store.
    for v in [
        in_state.state.remove("deep"),
        in_decision.decisions.pop().and_then(|d| d.data),
        step.update.into_iter().next().map(|(_, v)| v),
    ]
    .into_iter()
    .flatten()
    {
        take_apart(v);
    }
    if outcomes.iter().any(|(_, r)| r.is_ok()) {
        // The store kept a value it cannot drop without overflowing: it is
        // never dropped, so that the failure below is reported.
        std::mem::forget(Arc::clone(&ts.store));
    }
    other.version = head?;
    for (run_id, r) in &outcomes {
        ensure!(
            matches!(r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
            "run {run_id:?}: expected InvalidInput, got {r:?}"
        );
        ensure!(
            store.load(run_id).await?.is_none(),
            "run {run_id:?}: a refused save left a record"
        );
    }
    ensure!(
        store.load("other").await?.as_ref() == Some(&other),
        "another run changed or stopped loading"
    );
    Ok(())
}

/// Every value of a record besides its state (decision data, who decided,
/// reasons, error messages, the run id) is either refused with nothing
/// written, or loads back equal; a refused save leaves every other run
/// readable. (A decision whose data nested too deep once made a whole file
/// store unreadable.)
pub async fn head_values_are_refused_or_load_back_equal(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let mut other = checkpoint("other", "flow", json!({"kept": true}));
    other.version = save(store, &other, None).await?;
    let too_deep = {
        let mut cp = checkpoint("deep-data", "flow", json!({}));
        cp.decisions
            .push(Decision::approve("review", "ada", t(1), Some(deep(126))));
        cp
    };
    let deep_under_gate = {
        let mut cp = checkpoint("deep-under-gate", "flow", json!({}));
        let mut v = json!(1);
        for _ in 0..steadfast_core::MAX_VALUE_DEPTH {
            v = json!([v]);
        }
        cp.decisions
            .push(Decision::approve("review", "ada", t(1), Some(v)));
        cp
    };
    let bad_run_id = checkpoint("bad\u{7}id", "flow", json!({}));
    for cp in [too_deep, deep_under_gate, bad_run_id] {
        let r = save(store, &cp, None).await;
        ensure!(
            matches!(&r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
            "run {:?}: expected InvalidInput, got {r:?}",
            cp.run_id
        );
        ensure!(
            store.load(&cp.run_id).await?.is_none(),
            "run {:?}: a refused save left a record",
            cp.run_id
        );
    }
    ensure!(
        store.load("other").await?.as_ref() == Some(&other),
        "another run changed or stopped loading"
    );
    ensure!(
        store.list(&ListFilter::new()).await?.len() == 1,
        "list broke"
    );
    // Text that reads back fine is stored, whatever limits its writer had: a
    // record from an earlier build must never become unsaveable.
    let mut old = checkpoint("earlier-limits", "flow", json!({}));
    old.decisions.push(Decision::reject(
        "review",
        &"a very long name ".repeat(20),
        t(1),
        Some("why ".repeat(20_000)),
    ));
    let mut failure = StepFailure::new(0, "a", String::new(), 1, true, t(2));
    failure.message = "x".repeat(100_000);
    old.error = Some(failure);
    old.version = save(store, &old, None).await?;
    ensure!(
        store.load("earlier-limits").await?.as_ref() == Some(&old),
        "a record with long text did not load back equal"
    );

    let cases: u32 = std::env::var("STEADFAST_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let store = Arc::clone(&ts.store);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let data = prop_oneof![4 => json_value(), 1 => (90usize..140).prop_map(deep)];
        let mut runner = TestRunner::new(PropConfig {
            cases,
            failure_persistence: None,
            ..PropConfig::default()
        });
        let n = std::sync::atomic::AtomicU64::new(0);
        runner
            .run(
                &(".{0,12}", data, ".{0,20}", ".{0,30}"),
                |(by, data, reason, message)| {
                    let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let run_id = format!("head-{i}");
                    let mut cp = checkpoint(&run_id, "flow", json!({}));
                    cp.decisions
                        .push(Decision::approve("review", &by, t(1), Some(data)));
                    cp.decisions
                        .push(Decision::reject("review", "ada", t(2), Some(reason)));
                    cp.error = Some(StepFailure::new(0, "a", message, 1, false, t(3)));
                    handle.block_on(async {
                        match store.save(SaveRequest::new(&cp, None)).await {
                            Err(e) => {
                                prop_assert!(
                                    matches!(
                                        e.kind(),
                                        StoreErrorKind::InvalidInput | StoreErrorKind::TooLarge
                                    ),
                                    "refused with the wrong kind: {}",
                                    e
                                );
                                let broke = |e: StoreError| {
                                    TestCaseError::fail(format!(
                                        "a refused save broke the store: {e}"
                                    ))
                                };
                                prop_assert!(store.load("other").await.map_err(broke)?.is_some());
                                let left = store.load(&run_id).await.map_err(broke)?;
                                prop_assert!(left.is_none(), "a refused save left a record");
                                Ok(())
                            }
                            Ok(v) => loads_back_as_saved(&*store, cp, v).await,
                        }
                    })
                },
            )
            .map_err(|e| e.to_string())
    })
    .await??;
    Ok(())
}

/// A head-only save (a lease renewal) changes the head, keeps the stored
/// state and steps whatever the checkpoint carries, is compare-and-swap like
/// any save, and is refused for a run that does not exist.
pub async fn head_only_saves_keep_the_stored_state(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let mut cp = checkpoint("r", "flow", json!({"kept": [1, 2, 3]}));
    cp.completed = vec!["a".into()];
    cp.next = 1;
    let v1 = save(store, &cp, None).await?;
    let mut head = cp.clone();
    // What a renewal may carry while its steps are lent out or were cut back
    // in memory: the store keeps its own state, steps and `next`.
    head.state = State::new();
    head.completed = Vec::new();
    head.next = 0;
    head.workflow = "renamed".into();
    head.lease = Some(Lease::new(Owner::new("h", 7, 9), t(500)));
    head.updated_at = t(400);
    let v2 = store
        .save(SaveRequest::new(&head, Some(v1)).head_only())
        .await?;
    ensure!(v2 == v1 + 1, "version {v2} after {v1}");
    let loaded = store.load("r").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.state == cp.state,
        "the state changed: {:?}",
        loaded.state
    );
    ensure!(
        loaded.completed == cp.completed && loaded.next == 1,
        "the steps changed"
    );
    ensure!(loaded.lease == head.lease, "the lease was not written");
    ensure!(
        loaded.workflow == "renamed",
        "the workflow's name was not written"
    );
    ensure!(loaded.updated_at == t(400), "the head was not written");
    let stale = store
        .save(SaveRequest::new(&head, Some(v1)).head_only())
        .await;
    ensure!(is_conflict(&stale), "a stale head-only save: {stale:?}");
    let mut absent = head.clone();
    absent.run_id = "absent".into();
    let fresh = store
        .save(SaveRequest::new(&absent, None).head_only())
        .await;
    ensure!(
        matches!(&fresh, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
        "a head-only save of an absent run: {fresh:?}"
    );
    ensure!(store.load("absent").await?.is_none(), "it left a record");
    Ok(())
}

/// A run's spend record (what its steps spent, its budgets) loads back
/// exactly after a whole save and after a head-only save, amounts with
/// fractions and large whole numbers alike; a record with an amount that
/// could not be read back (not finite, negative) or a bad name is refused
/// and leaves nothing.
pub async fn spend_records_load_back_exactly(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let mut cp = checkpoint("spender", "flow", json!({"kept": 1}));
    let mut spend = Spend::default();
    spend.charge(&[("usd".to_string(), 0.1)].into())?;
    spend.charge(
        &[
            ("usd".to_string(), 0.2),
            ("tokens".to_string(), 9_007_199_254_740_991.0 / 10.0),
        ]
        .into(),
    )?;
    spend.budget.insert("usd".into(), 5.0);
    spend.budget.insert("tokens".into(), 1e15);
    cp.spend = Some(spend);
    let v1 = save(store, &cp, None).await?;
    let loaded = store.load("spender").await?.ok_or("the run is gone")?;
    ensure!(loaded.spend == cp.spend, "after a save: {:?}", loaded.spend);
    let mut head = cp.clone();
    head.version = v1;
    head.state = State::new();
    head.spend
        .as_mut()
        .ok_or("spend")?
        .charge(&[("usd".to_string(), 1.5)].into())?;
    let v2 = store
        .save(SaveRequest::new(&head, Some(v1)).head_only())
        .await?;
    let loaded = store.load("spender").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.spend == head.spend,
        "after a head-only save: {:?}",
        loaded.spend
    );
    ensure!(
        loaded.version == v2 && loaded.state == cp.state,
        "the head-only save broke the record"
    );
    for (name, amount) in [
        ("usd", f64::NAN),
        ("usd", f64::INFINITY),
        ("usd", -1.0),
        ("bad name", 1.0),
    ] {
        let mut bad = head.clone();
        bad.spend
            .as_mut()
            .ok_or("spend")?
            .spent
            .insert(name.into(), amount);
        let r = store
            .save(SaveRequest::new(&bad, Some(v2)).head_only())
            .await;
        ensure!(
            matches!(&r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
            "{name:?} = {amount}: expected InvalidInput, got {r:?}"
        );
        let mut fresh = bad.clone();
        fresh.run_id = "bad-spender".into();
        fresh.version = 0;
        let r = save(store, &fresh, None).await;
        ensure!(
            matches!(&r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
            "a new run with {name:?} = {amount}: expected InvalidInput, got {r:?}"
        );
        ensure!(
            store.load("bad-spender").await?.is_none(),
            "a refused save left a record"
        );
    }
    let loaded = store.load("spender").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.version == v2 && loaded.spend == head.spend,
        "a refused save changed the run"
    );
    Ok(())
}

/// A run's place in the queue (priority, partition) loads back after a
/// whole save and a head-only save, and shows in its summary, which the
/// workers' claim orders by; a place out of range is refused and leaves
/// nothing.
pub async fn queue_places_load_back_and_list(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let mut cp = checkpoint("queued", "flow", json!({"kept": 1}));
    cp.queue = Some(steadfast_core::Queue::new(-7, Some("tenant:42/eu"))?);
    let v1 = save(store, &cp, None).await?;
    let loaded = store.load("queued").await?.ok_or("the run is gone")?;
    ensure!(loaded.queue == cp.queue, "after a save: {:?}", loaded.queue);
    let listed = store.list(&ListFilter::new()).await?;
    let summary = listed
        .iter()
        .find(|s| s.run_id == "queued")
        .ok_or("not listed")?;
    ensure!(summary.queue == cp.queue, "listed: {:?}", summary.queue);
    let mut head = cp.clone();
    head.version = v1;
    head.state = State::new();
    head.attempts = 1;
    let v2 = store
        .save(SaveRequest::new(&head, Some(v1)).head_only())
        .await?;
    let loaded = store.load("queued").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.queue == cp.queue && loaded.version == v2,
        "after a head-only save: {:?}",
        loaded.queue
    );
    let mut bad = checkpoint("badly-queued", "flow", json!({}));
    let mut q = steadfast_core::Queue::default();
    q.priority = 5_000;
    bad.queue = Some(q);
    let r = save(store, &bad, None).await;
    ensure!(
        matches!(&r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
        "priority 5000: expected InvalidInput, got {r:?}"
    );
    ensure!(
        store.load("badly-queued").await?.is_none(),
        "a refused save left a record"
    );
    Ok(())
}

/// The version of its workflow a run was started with, and a worker's mark
/// that it lacked that version, load back after a whole save and a
/// head-only save; the version shows in the run's summary, which workers
/// route by; a version or mark out of range is refused and leaves nothing.
pub async fn workflow_versions_and_pass_over_marks_load_back(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let mut cp = checkpoint("versioned", "flow", json!({"kept": 1}));
    cp.status = RunStatus::Pending;
    cp.origin =
        Some(steadfast_core::Origin::listed(["a", "b"]).versioned(Some("sha256:0a1b 2c\"é")));
    let v1 = save(store, &cp, None).await?;
    let loaded = store.load("versioned").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.origin == cp.origin,
        "after a save: {:?}",
        loaded.origin
    );
    let listed = store.list(&ListFilter::new()).await?;
    let summary = listed
        .iter()
        .find(|s| s.run_id == "versioned")
        .ok_or("not listed")?;
    ensure!(
        summary.workflow_version.as_deref() == Some("sha256:0a1b 2c\"é"),
        "listed: {:?}",
        summary.workflow_version
    );
    let mut head = cp.clone();
    head.version = v1;
    head.state = State::new();
    head.passed_over = Some(Box::new(steadfast_core::PassedOver::new(
        "sha256:0a1b 2c\"é",
        &["1", "2"],
        "worker-7:4242",
        t(5),
    )));
    let v2 = store
        .save(SaveRequest::new(&head, Some(v1)).head_only())
        .await?;
    let loaded = store.load("versioned").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.passed_over == head.passed_over
            && loaded.origin == cp.origin
            && loaded.version == v2
            && loaded.state.get("kept") == Some(&json!(1)),
        "after a head-only save: {:?} {:?}",
        loaded.passed_over,
        loaded.origin
    );
    // Cleared by the next save without it.
    let mut cleared = loaded.clone();
    cleared.passed_over = None;
    let v3 = store
        .save(SaveRequest::new(&cleared, Some(v2)).head_only())
        .await?;
    let loaded = store.load("versioned").await?.ok_or("the run is gone")?;
    ensure!(
        loaded.passed_over.is_none() && loaded.version == v3,
        "a cleared mark stayed: {:?}",
        loaded.passed_over
    );
    let mut long = checkpoint("badly-versioned", "flow", json!({}));
    long.origin = Some(steadfast_core::Origin::listed(["a"]).versioned(Some(&"v".repeat(101))));
    let mut control = checkpoint("badly-versioned", "flow", json!({}));
    control.origin = Some(steadfast_core::Origin::listed(["a"]).versioned(Some("a\nb")));
    let mut marked = checkpoint("badly-versioned", "flow", json!({}));
    let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
    let mut mark = steadfast_core::PassedOver::new("1", &[], "w", t(1));
    mark.available = many;
    marked.passed_over = Some(Box::new(mark));
    for (what, bad) in [
        ("101 bytes", long),
        ("a newline", control),
        ("17 versions", marked),
    ] {
        let r = save(store, &bad, None).await;
        ensure!(
            matches!(&r, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
            "{what}: expected InvalidInput, got {r:?}"
        );
        ensure!(
            store.load("badly-versioned").await?.is_none(),
            "{what}: a refused save left a record"
        );
    }
    Ok(())
}

/// A claim of due runs takes the higher priority first and reads each
/// run's place right, also when a gate's decision data holds a "queue" of
/// its own: the run of priority 5 goes before an ordinary run due earlier,
/// and before a run whose only "queue" is in its decision data.
pub async fn claims_follow_the_queue(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let decided = |cp: &mut Checkpoint, data: Value| {
        cp.decisions
            .push(Decision::approve("g", "ada", t(1), Some(data)));
    };
    let mut plain = checkpoint("q-plain", "queued-flow", json!({}));
    plain.status = RunStatus::Pending;
    decided(
        &mut plain,
        json!({"queue": {"priority": 999, "partition": "x"}}),
    );
    save(store, &plain, None).await?;
    let mut tricky = checkpoint("q-tricky", "queued-flow", json!({}));
    tricky.status = RunStatus::Pending;
    tricky.updated_at = t(5);
    decided(&mut tricky, json!({"queue": {"name": "billing"}}));
    tricky.queue = Some(steadfast_core::Queue::new(5, Some("acme"))?);
    save(store, &tricky, None).await?;
    let mut low = checkpoint("q-low", "queued-flow", json!({}));
    low.status = RunStatus::Pending;
    low.queue = Some(steadfast_core::Queue::new(-3, None)?);
    save(store, &low, None).await?;
    let now = steadfast_core::Timestamp::from(std::time::SystemTime::now())
        .saturating_add(std::time::Duration::from_secs(5));
    let workflows = ["queued-flow"];
    let ask = steadfast_core::DueRequest::new(
        "conformance",
        &workflows,
        now,
        std::time::Duration::from_millis(1),
        3,
    );
    let due = store.claim_due(&ask).await?;
    let ids: Vec<&str> = due.iter().map(|s| s.run_id.as_str()).collect();
    ensure!(
        ids == ["q-tricky", "q-plain", "q-low"],
        "claimed in the order {ids:?}"
    );
    let tricky_summary = due.first().ok_or("no run claimed")?;
    ensure!(
        tricky_summary.queue == tricky.queue,
        "the claim's summary lost the place: {:?}",
        tricky_summary.queue
    );
    Ok(())
}

fn record(index: usize, name: &str, update: Value, attempt: u32) -> StepRecord {
    let Value::Object(update) = update else {
        unreachable!("updates are objects")
    };
    StepRecord::new(
        index,
        name,
        update,
        attempt,
        t(index as u64 * 10),
        t(index as u64 * 10 + 7),
    )
}

/// Each save that completes a step records it; history lists them by index,
/// with their updates, attempts and times, and forgets steps a later save undid.
pub async fn history_lists_completed_steps_in_order(ts: TestStore) -> CheckResult {
    let mut cp = checkpoint("r", "flow", json!({}));
    let mut expected = None;
    for i in 0..5usize {
        let rec = record(
            i,
            &format!("s{i}"),
            json!({ format!("s{i}"): i }),
            1 + (i % 2) as u32,
        );
        cp.state.insert(format!("s{i}"), json!(i));
        cp.completed.push(format!("s{i}"));
        cp.next = i + 1;
        let v = ts
            .store
            .save(SaveRequest::new(&cp, expected).with_step(&rec))
            .await?;
        expected = Some(v);
        if i == 2 {
            // A failure record in between carries no step.
            cp.attempts = 1;
            expected = Some(ts.store.save(SaveRequest::new(&cp, expected)).await?);
            cp.attempts = 0;
        }
    }
    let history = ts
        .store
        .history("r")
        .await?
        .ok_or("history of a saved run is None")?;
    ensure!(
        history.len() == 5,
        "history has {} records, expected 5",
        history.len()
    );
    for (i, rec) in history.iter().enumerate() {
        let want = record(
            i,
            &format!("s{i}"),
            json!({ format!("s{i}"): i }),
            1 + (i % 2) as u32,
        );
        ensure!(*rec == want, "record {i} is {rec:?}, expected {want:?}");
    }
    let loaded = ts.store.load("r").await?.ok_or("run vanished")?;
    ensure!(
        loaded.state == cp.state && loaded.completed == cp.completed,
        "state rebuilt wrongly: {loaded:?}"
    );

    // A save that moves `next` back (changed code accepted) drops later records.
    cp.next = 2;
    cp.completed.truncate(2);
    expected = Some(ts.store.save(SaveRequest::new(&cp, expected)).await?);
    let history = ts.store.history("r").await?.ok_or("history vanished")?;
    ensure!(
        history.len() == 2,
        "history after rewinding has {} records",
        history.len()
    );
    let _ = expected;
    Ok(())
}

/// History of a run that does not exist is `None`.
pub async fn history_is_none_for_an_absent_run(ts: TestStore) -> CheckResult {
    ensure!(
        ts.store.history("nope").await?.is_none(),
        "history of an absent run is not None"
    );
    Ok(())
}

/// Step records' updates can be replaced (for re-encryption) under the run's
/// version: one write or none; nothing else changes, and what a load returns
/// stays as it was.
pub async fn history_rewrite_is_guarded_by_the_version(ts: TestStore) -> CheckResult {
    let mut cp = checkpoint("r", "flow", json!({}));
    let mut expected = None;
    for i in 0..3usize {
        let rec = record(i, &format!("s{i}"), json!({ format!("s{i}"): i }), 1);
        cp.state.insert(format!("s{i}"), json!(i));
        cp.completed.push(format!("s{i}"));
        cp.next = i + 1;
        expected = Some(
            ts.store
                .save(SaveRequest::new(&cp, expected).with_step(&rec))
                .await?,
        );
    }
    // Before any snapshot, a record may still be merged into the state by a
    // load: a rewrite is refused or, if the store takes it, what load
    // returns does not change.
    let v0 = expected.ok_or("no version")?;
    let before = ts.store.load("r").await?.ok_or("run vanished")?;
    let early = record(1, "s1", json!({"s1": "one"}), 1);
    match ts
        .store
        .rewrite_history("r", v0, std::slice::from_ref(&early))
        .await
    {
        Err(e) if e.kind() == StoreErrorKind::InvalidInput => {
            let history = ts.store.history("r").await?.ok_or("history vanished")?;
            ensure!(
                history[1] == record(1, "s1", json!({"s1": 1}), 1),
                "a refused rewrite changed record 1: {:?}",
                history[1]
            );
        }
        Ok(()) => {
            let after = ts.store.load("r").await?.ok_or("run vanished")?;
            ensure!(
                after == before,
                "a rewrite changed what load returns: {after:?}"
            );
            // Put it back, so the checks below see the original record 1.
            ts.store
                .rewrite_history("r", v0, &[record(1, "s1", json!({"s1": 1}), 1)])
                .await?;
        }
        Err(e) => return Err(format!("rewriting a recent record: {e}").into()),
    }
    let after = ts.store.load("r").await?.ok_or("run vanished")?;
    ensure!(
        after == before,
        "a rewrite changed what load returns: {after:?}"
    );
    // A save without a step: every record is history now.
    cp.attempts = 0;
    let v = ts.store.save(SaveRequest::new(&cp, expected)).await?;
    let before = ts.store.load("r").await?.ok_or("run vanished")?;
    let new0 = record(0, "s0", json!({"s0": "zero"}), 1);
    let new2 = record(2, "s2", json!({"s2": "two"}), 1);

    // A stale version, an absent run, a record not below next: nothing written.
    let stale = ts
        .store
        .rewrite_history("r", v - 1, std::slice::from_ref(&new0))
        .await;
    ensure!(
        matches!(&stale, Err(e) if e.kind() == StoreErrorKind::Conflict),
        "a stale rewrite gave {stale:?}"
    );
    let absent = ts
        .store
        .rewrite_history("nope", 1, std::slice::from_ref(&new0))
        .await;
    ensure!(
        matches!(&absent, Err(e) if e.kind() == StoreErrorKind::Conflict),
        "a rewrite of an absent run gave {absent:?}"
    );
    let beyond = record(3, "s3", json!({"s3": 3}), 1);
    let refused = ts
        .store
        .rewrite_history("r", v, &[new0.clone(), beyond])
        .await;
    ensure!(
        matches!(&refused, Err(e) if e.kind() == StoreErrorKind::InvalidInput),
        "rewriting a record at next gave {refused:?}"
    );
    let history = ts.store.history("r").await?.ok_or("history vanished")?;
    ensure!(
        history[0] == record(0, "s0", json!({"s0": 0}), 1),
        "a refused rewrite changed record 0: {:?}",
        history[0]
    );

    ts.store
        .rewrite_history("r", v, &[new0.clone(), new2.clone()])
        .await?;
    let history = ts.store.history("r").await?.ok_or("history vanished")?;
    ensure!(history.len() == 3, "history has {} records", history.len());
    ensure!(history[0] == new0, "record 0 is {:?}", history[0]);
    ensure!(
        history[1] == record(1, "s1", json!({"s1": 1}), 1),
        "record 1 changed: {:?}",
        history[1]
    );
    ensure!(history[2] == new2, "record 2 is {:?}", history[2]);
    let after = ts.store.load("r").await?.ok_or("run vanished")?;
    ensure!(
        after == before,
        "a rewrite changed what load returns: {after:?} vs {before:?}"
    );
    Ok(())
}

/// Shared documents are compare-and-swap like runs: a fresh write expects
/// none, each write bumps the version by one, a stale write or delete
/// changes nothing; listing by prefix is in key order; documents are not
/// runs; a key or value the store could not read back is refused and
/// leaves nothing; concurrent writers lose no update.
pub async fn documents_are_compare_and_swap(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let docs = steadfast_core::store::documents_of(store)?;
    ensure!(
        docs.get_document("limit:a").await?.is_none(),
        "a document before any write"
    );
    let v1 = docs
        .put_document("limit:a", &json!({"size": 2}), None)
        .await?;
    ensure!(v1 == 1, "first version {v1}");
    let again = docs
        .put_document("limit:a", &json!({"size": 3}), None)
        .await;
    ensure!(is_conflict(&again), "a second fresh write: {again:?}");
    let v2 = docs
        .put_document(
            "limit:a",
            &json!({"size": 3, "held": [{"run": "r"}]}),
            Some(1),
        )
        .await?;
    ensure!(v2 == 2, "second version {v2}");
    let stale = docs
        .put_document("limit:a", &json!({"size": 9}), Some(1))
        .await;
    ensure!(is_conflict(&stale), "a stale write: {stale:?}");
    let got = docs
        .get_document("limit:a")
        .await?
        .ok_or("the document is gone")?;
    ensure!(
        got.version == 2 && got.value == json!({"size": 3, "held": [{"run": "r"}]}),
        "read back {got:?}"
    );
    for key in ["limit:c", "limit:b", "limiter", "other:a", "limit:\u{e9}"] {
        docs.put_document(
            key,
            &json!({"k": key, "n": 12345678901234567_u64, "f": 0.1}),
            None,
        )
        .await?;
    }
    let listed: Vec<String> = docs
        .list_documents("limit:")
        .await?
        .into_iter()
        .map(|d| d.key)
        .collect();
    ensure!(
        listed == ["limit:a", "limit:b", "limit:c", "limit:\u{e9}"],
        "listed {listed:?}"
    );
    let b = docs.get_document("limit:b").await?.ok_or("limit:b")?;
    ensure!(
        b.value == json!({"k": "limit:b", "n": 12345678901234567_u64, "f": 0.1}),
        "numbers changed: {:?}",
        b.value
    );
    ensure!(
        store.list(&ListFilter::new()).await?.is_empty(),
        "documents listed as runs"
    );
    ensure!(
        store.load("limit:a").await?.is_none(),
        "a document loaded as a run"
    );
    for (key, value) in [
        ("", json!({})),
        ("bad\u{7}key", json!({})),
        (&"k".repeat(201)[..], json!({})),
        ("limit:bad", json!([1])),
        ("limit:bad", json!({"deep": deep(200)})),
        ("limit:bad", json!({"big": "x".repeat(1100 * 1024)})),
    ] {
        let r = docs.put_document(key, &value, None).await;
        ensure!(
            matches!(&r, Err(e) if matches!(e.kind(), StoreErrorKind::InvalidInput | StoreErrorKind::TooLarge)),
            "{key:?}: expected a refusal, got {r:?}"
        );
    }
    ensure!(
        docs.get_document("limit:bad").await?.is_none(),
        "a refused write left a document"
    );
    ensure!(!docs.delete_document("limit:a", 1).await?, "a stale delete");
    ensure!(
        docs.get_document("limit:a").await?.is_some(),
        "a stale delete removed it"
    );
    ensure!(
        docs.delete_document("limit:a", 2).await?,
        "a delete at the version"
    );
    ensure!(
        docs.get_document("limit:a").await?.is_none(),
        "deleted, still there"
    );
    ensure!(
        !docs.delete_document("limit:a", 2).await?,
        "a delete of nothing"
    );

    // Eight writers add one each, twenty times, by read and compare-and-swap.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = Arc::clone(&ts.store);
        tasks.push(tokio::spawn(async move {
            let docs = steadfast_core::store::documents_of(&*store).map_err(|e| e.to_string())?;
            for _ in 0..20 {
                loop {
                    let cur = docs
                        .get_document("counter")
                        .await
                        .map_err(|e| e.to_string())?;
                    let (n, v) = cur.map_or((0, None), |d| {
                        (d.value["n"].as_u64().unwrap_or(0), Some(d.version))
                    });
                    match docs.put_document("counter", &json!({"n": n + 1}), v).await {
                        Ok(_) => break,
                        Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let counter = docs
        .get_document("counter")
        .await?
        .ok_or("the counter is gone")?;
    ensure!(
        counter.value == json!({"n": 160}) && counter.version == 160,
        "lost updates: {counter:?}"
    );
    Ok(())
}
