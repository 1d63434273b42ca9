//! The checks of operations that replace or remove a run (import, copy,
//! delete): a refused replacement leaves the run as it was, a run a live
//! process holds is refused unless forced, the holder is told what
//! happened, and a run still being built is left alone by retention.
//! Re-exported by [`checks`](crate::checks).

use std::sync::Arc;

use serde_json::{json, Value};
use steadfast_core::retention::{collect, Retention};
use steadfast_core::transfer::{
    export_line, export_run, put_run, put_run_with, Exported, Put, PutOptions,
};
use steadfast_core::{
    ops, start, update, Error, Lease, MemoryStore, Outcome, Owner, Removal, RunStatus, Runner,
    Store, SystemClock, Timestamp, Workflow, MAX_VALUE_DEPTH,
};

use crate::ops_checks::{gated, through_gate, Tally};
use crate::{CheckResult, Fault, FaultyStore, TestStore, STATE_LIMIT};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

/// The export line of run `r` (record and history), or a note that it is
/// absent: what "left as it was" compares.
async fn exported(store: &Arc<dyn Store>, r: &str) -> Result<String, Error> {
    Ok(export_line(&**store, r)
        .await?
        .unwrap_or_else(|| "absent".into()))
}

/// A record of run `id` from another store: `steps` steps (`s0`, `s1`, ...),
/// step `i` writing `updates(i)`.
async fn record_of(
    id: &str,
    steps: usize,
    updates: impl Fn(usize) -> Value,
) -> Result<Exported, Box<dyn std::error::Error + Send + Sync>> {
    let source = MemoryStore::with_state_limit(u64::MAX);
    let mut b = Workflow::builder("gated");
    for i in 0..steps {
        let u = updates(i);
        b = b.step(format!("s{i}"), move |_, _| {
            let u = u.clone();
            async move { update(u) }
        });
    }
    Runner::new(&source).run(id, &b.build()?).await?;
    Ok(export_run(&source, id).await?.ok_or("no export")?)
}

/// A replacement that cannot be written (its version below its history
/// rows, a value nested deeper than the limit, a state over the store's
/// limit, also only after one of its steps) is refused before anything
/// is removed: the run there stays as it was, record and history, and the
/// error says nothing was written. A replacement that fails part way is
/// undone: the old run is written back as it was.
pub async fn a_refused_replacement_leaves_the_run_as_it_was(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let wf = gated(&tally)?;
    // A run waiting at a gate, and a run just started.
    start(&**store, "gated", "w", json!({"x": "in"}), false).await?;
    let first = Runner::new(&**store).run("w", &wf).await?;
    ensure!(
        first == Outcome::Waiting { gate: "g".into() },
        "expected to wait, got {first:?}"
    );
    start(&**store, "gated", "p", json!({}), false).await?;
    let before_w = exported(store, "w").await?;
    let before_p = exported(store, "p").await?;

    // 1. Its version is below its number of history rows.
    let mut low = record_of("p", 4, |i| json!({ format!("k{i}"): i })).await?;
    low.run.version = 2;
    let refused = put_run(&**store, &low).await;
    ensure!(
        matches!(&refused, Err(Error::InvalidInput { reason, .. }) if reason.contains("below its 4 history rows") && reason.contains("nothing was written")),
        "a version below the rows gave {refused:?}"
    );
    ensure!(
        exported(store, "p").await? == before_p,
        "the run was changed by a refused import (version below rows)"
    );

    // 2. A value nested deeper than the limit, in a step's update.
    let mut deep = json!("bottom");
    for _ in 0..MAX_VALUE_DEPTH + 5 {
        deep = json!([deep]);
    }
    let mut nested = record_of("w", 3, |i| json!({ format!("k{i}"): i })).await?;
    if let Some(rows) = nested.history.as_mut() {
        rows[1].update.insert("deep".into(), deep.clone());
    }
    nested.run.state.insert("deep".into(), deep);
    nested.run.version = 50;
    let refused = put_run(&**store, &nested).await;
    ensure!(
        matches!(&refused, Err(Error::InvalidInput { reason, .. }) if reason.contains("nothing was written")),
        "a deep value gave {refused:?}"
    );

    // 3. A state over the store's limit: at the end, or only after one
    // step (a later one overwrites the big values with small ones). Many
    // small values: a store with blobs keeps a large one by reference, and
    // its limit bounds the record.
    let keys = STATE_LIMIT as usize / 100 + 1;
    let many = |v: &str| -> serde_json::Map<String, Value> {
        (0..keys).map(|k| (format!("big{k}"), json!(v))).collect()
    };
    let big = "x".repeat(100);
    let mut at_end = record_of("w", 2, |i| json!({ format!("k{i}"): i })).await?;
    at_end.run.state.extend(many(&big));
    at_end.run.version = 50;
    // From a store that keeps no history: one save writes it.
    at_end.history = None;
    let mut midway = record_of("w", 3, |i| match i {
        1 => Value::Object(many(&big)),
        2 => Value::Object(many("small")),
        _ => json!({ "k": i }),
    })
    .await?;
    midway.run.version = 50;
    for (what, record) in [("its state is", at_end), ("after step 1 (s1)", midway)] {
        let refused = put_run(&**store, &record).await;
        ensure!(
            matches!(&refused, Err(Error::InvalidInput { reason, .. }) if reason.contains("over the store's limit") && reason.contains(what) && reason.contains("nothing was written")),
            "a state over the limit {what} gave {refused:?}"
        );
    }
    ensure!(
        exported(store, "w").await? == before_w,
        "the waiting run was changed by a refused import"
    );

    // A replacement whose second save is lost: the old run is put back.
    let mut good = record_of("w", 4, |i| json!({ format!("k{i}"): i })).await?;
    good.run.version = 60;
    let flaky = FaultyStore::new(Arc::clone(store), 1, Fault::LoseButReportUnknown);
    let failed = put_run(&flaky, &good).await;
    ensure!(
        matches!(&failed, Err(e @ Error::Store { .. }) if steadfast_core::error_chain(e).contains("was put back as it was")),
        "a replacement that failed part way gave {failed:?}"
    );
    ensure!(
        exported(store, "w").await? == before_w,
        "the waiting run was not put back as it was"
    );
    // And it still works: approve, run to the end.
    steadfast_core::approve(&**store, "w", "g", None, "ada", &SystemClock).await?;
    let done = Runner::new(&**store).run("w", &wf).await?;
    ensure!(
        matches!(done, Outcome::Completed(_)),
        "the run put back did not complete: {done:?}"
    );
    Ok(())
}

/// A lease of a process on another host, still good for an hour.
fn held_elsewhere() -> Lease {
    Lease::new(
        Owner::new("another-host.invalid", 4242, 1),
        steadfast_core::Clock::now(&SystemClock)
            .saturating_add(std::time::Duration::from_secs(3600)),
    )
}

/// `delete` and a replacement by import or copy refuse a run that a live
/// process holds ([`Error::Held`]) and leave it as it was; forced, they go
/// ahead.
pub async fn delete_and_replace_refuse_a_held_run(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    for id in ["d", "i"] {
        start(&**store, "gated", id, json!({}), false).await?;
        let mut cp = store.load(id).await?.ok_or("the run vanished")?;
        cp.status = RunStatus::Running;
        cp.lease = Some(held_elsewhere());
        let v = cp.version;
        store
            .save(steadfast_core::store::SaveRequest::new(&cp, Some(v)))
            .await?;
    }
    let before = exported(store, "d").await?;
    let refused = ops::delete(&**store, "d", false, &SystemClock).await;
    ensure!(
        matches!(refused, Err(Error::Held { .. })),
        "a delete of a held run gave {refused:?}"
    );
    ensure!(
        exported(store, "d").await? == before,
        "a refused delete changed the run"
    );
    ensure!(
        ops::delete(&**store, "d", true, &SystemClock).await?,
        "a forced delete found no run"
    );
    ensure!(
        store.load("d").await?.is_none(),
        "a forced delete left the run"
    );
    ensure!(
        !ops::delete(&**store, "d", false, &SystemClock).await?,
        "a delete of an absent run said it existed"
    );

    let before = exported(store, "i").await?;
    let newer = {
        let mut r = record_of("i", 2, |i| json!({ format!("k{i}"): i })).await?;
        r.run.version = 40;
        r
    };
    let refused = put_run(&**store, &newer).await;
    ensure!(
        matches!(refused, Err(Error::Held { .. })),
        "an import over a held run gave {refused:?}"
    );
    ensure!(
        exported(store, "i").await? == before,
        "a refused import changed the run"
    );
    let forced = put_run_with(&**store, &newer, &PutOptions::default().force(true)).await?;
    ensure!(
        matches!(forced, Put::Replaced { .. }),
        "a forced import gave {forced:?}"
    );
    ensure!(
        store.load("i").await?.as_ref() == Some(&newer.run),
        "the forced import did not arrive"
    );
    Ok(())
}

/// A holder whose run is deleted, or replaced by an import, while its step
/// runs is told exactly that ([`Error::Removed`]), not a version conflict,
/// and saves nothing more.
pub async fn a_holder_is_told_its_run_was_deleted_or_replaced(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let mut replacement = record_of("x-replaced", 3, |i| json!({ format!("k{i}"): i })).await?;
    // Created at another time than the holder's run, as a record from
    // elsewhere is.
    replacement.run.created_at = Timestamp::from_unix_millis(1);
    for (id, how) in [
        ("x-deleted", Removal::Deleted),
        ("x-replaced", Removal::Replaced),
    ] {
        let (s, rec) = (Arc::clone(store), replacement.clone());
        let wf = Workflow::builder("gated")
            .step("first", |_, _| async { update(json!({"first": 1})) })
            .step("meanwhile", move |ctx, _| {
                let (s, rec) = (Arc::clone(&s), rec.clone());
                async move {
                    let id = ctx.run_id().to_string();
                    if id == "x-deleted" {
                        ops::delete(&*s, &id, true, &SystemClock)
                            .await
                            .map_err(steadfast_core::StepError::terminal)?;
                    } else {
                        let mut rec = rec.clone();
                        rec.run.version = 1000;
                        put_run_with(&*s, &rec, &PutOptions::default().force(true))
                            .await
                            .map_err(steadfast_core::StepError::terminal)?;
                    }
                    update(json!({"meanwhile": 1}))
                }
            })
            .build()?;
        let got = Runner::new(&**store)
            .lease(
                steadfast_core::current_owner(),
                std::time::Duration::from_secs(60),
            )
            .run(id, &wf)
            .await;
        ensure!(
            matches!(&got, Err(Error::Removed { how: h, .. }) if *h == how),
            "the holder of {id} was told {got:?}"
        );
        let text = got.err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(
            text.contains(&how.to_string()) && !text.contains("conflict"),
            "the message says {text:?}"
        );
        let now = store.load(id).await?;
        ensure!(
            now.as_ref()
                .is_none_or(|cp| !cp.state.contains_key("meanwhile")),
            "the holder's result reached the store: {now:?}"
        );
    }
    Ok(())
}

/// A run that a copy or import left half written is marked as being built:
/// no worker takes it, retention leaves it alone whatever its age (which
/// is the time the writing began, not its steps'), and the next copy
/// replaces it.
pub async fn a_half_built_run_is_left_alone_by_retention(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let began = steadfast_core::Clock::now(&SystemClock);
    let mut old = record_of("v", 4, |i| json!({ format!("k{i}"): i })).await?;
    // Steps that finished long ago.
    for r in old.history.iter_mut().flatten() {
        r.started_at = Timestamp::from_unix_millis(1_000);
        r.finished_at = Timestamp::from_unix_millis(2_000);
    }
    old.run.created_at = Timestamp::from_unix_millis(500);
    old.run.updated_at = Timestamp::from_unix_millis(2_000);
    let dying = FaultyStore::new(Arc::clone(store), 2, Fault::FailFromHere);
    ensure!(
        put_run(&dying, &old).await.is_err(),
        "the cut-short copy did not fail"
    );
    let half = store.load("v").await?.ok_or("nothing was written")?;
    ensure!(half.being_built(), "the half-written run is not marked");
    ensure!(
        half.updated_at >= began,
        "the half-written run's age is {} (its steps'), not when the copy began ({began})",
        half.updated_at
    );
    ensure!(half.runnable_at().is_none(), "a half-built run is runnable");
    // A finished cancelled run beside it is collected.
    start(&**store, "gated", "c", json!({}), false).await?;
    ops::cancel(&**store, "c", None, "ada", &SystemClock).await?;
    let later = began.saturating_add(std::time::Duration::from_secs(10 * 365 * 24 * 3600));
    let report = collect(
        &**store,
        &Retention::new(std::time::Duration::ZERO),
        later,
        |_| {},
    )
    .await?;
    ensure!(
        store.load("v").await?.is_some(),
        "retention deleted a run being built"
    );
    ensure!(
        store.load("c").await?.is_none(),
        "retention left an old cancelled run"
    );
    ensure!(
        report.building == 1,
        "the report counts {} runs being built",
        report.building
    );
    ensure!(
        matches!(put_run(&**store, &old).await?, Put::Replaced { .. }),
        "the next copy did not replace the half-written run"
    );
    ensure!(
        !store.load("v").await?.ok_or("gone")?.being_built(),
        "the copy left the mark"
    );
    Ok(())
}

/// A fork cut short is marked as being built too: retention leaves it
/// alone, and `prune` refuses it.
pub async fn a_half_built_fork_is_left_alone_by_retention_and_prune(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let wf = gated(&tally)?;
    start(&**store, "gated", "orig", json!({"x": "in"}), false).await?;
    through_gate(store, &wf, "orig", json!({"ok": 1})).await?;
    let dying = FaultyStore::new(Arc::clone(store), 2, Fault::FailFromHere);
    ensure!(
        ops::fork(&dying, "orig", "c", "forked", "ada", &SystemClock)
            .await
            .is_err(),
        "the cut-short fork did not fail"
    );
    let half = store.load("forked").await?.ok_or("nothing was written")?;
    ensure!(half.being_built(), "the half-built fork is not marked");
    let later = steadfast_core::Clock::now(&SystemClock)
        .saturating_add(std::time::Duration::from_secs(3600));
    collect(
        &**store,
        &Retention::new(std::time::Duration::ZERO),
        later,
        |_| {},
    )
    .await?;
    ensure!(
        store.load("forked").await?.is_some(),
        "retention deleted a fork being built"
    );
    let pruned = ops::prune(&**store, "forked", 0, "ada", &SystemClock).await;
    ensure!(
        matches!(&pruned, Err(Error::InvalidInput { reason, .. }) if reason.contains("being written by a fork")),
        "prune of a half-built fork gave {pruned:?}"
    );
    Ok(())
}

/// A store keeps every capability when wrapped: in a [`FaultyStore`], and
/// in an `Arc` (what `open_store` hands out).
pub async fn wrappers_keep_every_capability(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let faulty = FaultyStore::new(Arc::clone(store), usize::MAX, Fault::FailFromHere);
    crate::keeps_capabilities(&**store, &faulty)?;
    let shared: Arc<dyn Store> = Arc::new(Arc::clone(store));
    crate::keeps_capabilities(&**store, &*shared)?;
    Ok(())
}

/// Starts of one run id at the same moment agree: exactly one records it;
/// the others, given the same input, find it there (`Ok(false)`), and given
/// another input are refused with [`Error::InvalidInput`], never another
/// error; the run keeps the winner's input.
pub async fn concurrent_starts_of_one_id_agree(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let mut starts = tokio::task::JoinSet::new();
    for i in 0..8 {
        let store = Arc::clone(store);
        starts.spawn(async move {
            let input = json!({ "pick": i % 2 });
            (i % 2, start(&*store, "gated", "same", input, false).await)
        });
    }
    let mut results = Vec::new();
    while let Some(done) = starts.join_next().await {
        results.push(done?);
    }
    let created: Vec<i32> = results
        .iter()
        .filter(|(_, r)| matches!(r, Ok(true)))
        .map(|(p, _)| *p)
        .collect();
    ensure!(
        created.len() == 1,
        "{} starts recorded the run: {results:?}",
        created.len()
    );
    let winner = created[0];
    for (pick, r) in &results {
        let fine = match r {
            Ok(_) => *pick == winner,
            Err(Error::InvalidInput { reason, .. }) => {
                *pick != winner && reason.contains("another input")
            }
            Err(_) => false,
        };
        ensure!(
            fine,
            "a start with input {pick} (winner {winner}) gave {r:?}"
        );
    }
    let cp = store.load("same").await?.ok_or("the run vanished")?;
    ensure!(
        cp.state.get("pick") == Some(&json!(winner)),
        "the run holds {:?}",
        cp.state
    );
    Ok(())
}
