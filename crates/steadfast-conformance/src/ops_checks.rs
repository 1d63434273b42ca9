//! The checks of run operations (cancel, retry, rewind, fork, retention)
//! and of [`Store::delete_if`], which they stand on. Re-exported by
//! [`checks`](crate::checks).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_core::retention::{collect, Retention};
use steadfast_core::store::SaveRequest;
use steadfast_core::{
    approve, ops, start, update, AuditAction, Checkpoint, Error, Lease, Outcome, Owner, RunStatus,
    Runner, Step, StepError, Store, StoreErrorKind, SystemClock, Timestamp, Workflow,
};

use crate::{CheckResult, TestStore};
use steadfast_core::StoreExt as _;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

/// How many times each step ran, by name.
#[derive(Clone, Default)]
pub(crate) struct Tally(Arc<Mutex<BTreeMap<String, u32>>>);

impl Tally {
    fn hit(&self, name: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default() += 1;
    }
    fn get(&self) -> BTreeMap<String, u32> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn counts(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Steps `a`, `b`, gate `g`, `c`: `a` overwrites the input's `x`, `b` and
/// `c` build on what came before.
pub(crate) fn gated(tally: &Tally) -> Result<Workflow, Error> {
    let (ta, tb, tc) = (tally.clone(), tally.clone(), tally.clone());
    Workflow::builder("gated")
        .step("a", move |_, _| {
            ta.hit("a");
            async { update(json!({"x": "a"})) }
        })
        .step("b", move |_, s| {
            tb.hit("b");
            let x = s.get("x").cloned().unwrap_or(Value::Null);
            async move { update(json!({"b": format!("{}-b", x.as_str().unwrap_or("?"))})) }
        })
        .push(Step::gate("g"))
        .step("c", move |_, s| {
            tc.hit("c");
            let seen = json!([s.get("b"), s.get("g")]);
            // `x` again, unchanged: a value a later step writes as it was.
            let x = s.get("x").cloned().unwrap_or(Value::Null);
            async move { update(json!({"c": seen, "x": x})) }
        })
        .build()
}

/// Runs `r` of `wf` through its gate (approving with `data`) to the end.
pub(crate) async fn through_gate(
    store: &Arc<dyn Store>,
    wf: &Workflow,
    r: &str,
    data: Value,
) -> CheckResult {
    let first = Runner::new(&**store).run(r, wf).await?;
    ensure!(
        first == Outcome::Waiting { gate: "g".into() },
        "expected to wait at g, got {first:?}"
    );
    approve(&**store, r, "g", Some(data), "ada", &SystemClock).await?;
    let done = Runner::new(&**store).run(r, wf).await?;
    ensure!(
        matches!(done, Outcome::Completed(_)),
        "expected completion, got {done:?}"
    );
    Ok(())
}

/// The record and history of a run, as text: what "byte for byte" compares.
async fn snapshot(
    store: &Arc<dyn Store>,
    r: &str,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let cp = store.load(r).await?;
    let history = store.history(r).await?;
    Ok(format!(
        "{}\n{}",
        serde_json::to_string(&cp.map(serde_json::to_value).transpose()?)?,
        serde_json::to_string(&history)?
    ))
}

/// `delete_if` deletes only at the version given: another version is a
/// conflict that deletes nothing, an absent run is `false`.
pub async fn delete_if_is_guarded_by_the_version(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let mut cp = Checkpoint::new("r", "flow", Timestamp::from_unix_millis(1));
    cp.status = RunStatus::Completed;
    let v1 = store.save(SaveRequest::new(&cp, None)).await?;
    let v2 = store.save(SaveRequest::new(&cp, Some(v1))).await?;
    let stale = store.delete_if("r", v1).await;
    ensure!(
        matches!(&stale, Err(e) if e.kind() == StoreErrorKind::Conflict),
        "a delete at a stale version gave {stale:?}"
    );
    let kept = store
        .load("r")
        .await?
        .ok_or("a refused delete removed the run")?;
    ensure!(
        kept.version == v2,
        "the run changed: version {}",
        kept.version
    );
    ensure!(
        store.delete_if("r", v2).await?,
        "the delete at the stored version found nothing"
    );
    ensure!(store.load("r").await?.is_none(), "the run is still there");
    ensure!(
        !store.delete_if("r", v2).await?,
        "a second delete found the run"
    );
    ensure!(
        !store.delete_if("never", 1).await?,
        "an absent run was deleted"
    );
    // A fresh start under the same id works afterwards.
    store.save(SaveRequest::new(&cp, None)).await?;
    Ok(())
}

/// A failed run is retried with a fresh budget and completes; the retry
/// is audited; only a failed run can be retried.
pub async fn retry_clears_a_failed_run(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let failing = Arc::new(Mutex::new(true));
    let (t1, t2, f) = (tally.clone(), tally.clone(), Arc::clone(&failing));
    let wf = Workflow::builder("flaky")
        .step("one", move |_, _| {
            t1.hit("one");
            async { update(json!({"one": 1})) }
        })
        .step("two", move |_, _| {
            t2.hit("two");
            let fail = *f.lock().unwrap_or_else(|p| p.into_inner());
            async move {
                if fail {
                    Err(StepError::terminal("not yet"))
                } else {
                    update(json!({"two": 2}))
                }
            }
        })
        .build()?;
    let first = Runner::new(&**store).run("r", &wf).await;
    ensure!(
        matches!(first, Err(Error::StepFailed { index: 1, .. })),
        "expected step 1 to fail, got {first:?}"
    );
    let failed = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(
        failed.status == RunStatus::Failed,
        "status {}",
        failed.status
    );
    let done = ops::retry(&**store, "r", "ada", &SystemClock).await?;
    ensure!(
        done.status == RunStatus::Running && done.error.is_none() && done.attempts == 0,
        "retry left {:?} / {:?} / {}",
        done.status,
        done.error,
        done.attempts
    );
    let stored = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(
        matches!(
            stored.audit.last().map(|e| &e.action),
            Some(AuditAction::Retry { index: 1, .. })
        ),
        "no retry audit entry: {:?}",
        stored.audit
    );
    *failing.lock().unwrap_or_else(|p| p.into_inner()) = false;
    let end = Runner::new(&**store).run("r", &wf).await?;
    ensure!(matches!(end, Outcome::Completed(_)), "after retry: {end:?}");
    ensure!(
        tally.get() == counts(&[("one", 1), ("two", 2)]),
        "steps ran {:?}",
        tally.get()
    );
    let again = ops::retry(&**store, "r", "ada", &SystemClock).await;
    ensure!(
        matches!(again, Err(Error::InvalidInput { .. })),
        "retrying a completed run gave {again:?}"
    );
    let absent = ops::retry(&**store, "nope", "ada", &SystemClock).await;
    ensure!(
        matches!(absent, Err(Error::NoSuchRun { .. })),
        "retrying an absent run gave {absent:?}"
    );
    Ok(())
}

/// A cancel stops a running call: without a lease at its next save (the
/// step's result is not saved, no later step runs), with a lease at its
/// next renewal, after the grace period, even if the step never returns.
/// A cancelled run stays cancelled, and `run` of it fails with
/// `Error::Cancelled` without running anything.
pub async fn cancel_stops_a_run_at_the_next_boundary(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let (t1, t2, t3) = (tally.clone(), tally.clone(), tally.clone());
    let (g, s) = (Arc::clone(&gate), Arc::clone(&started));
    let wf = Workflow::builder("slow")
        .step("first", move |_, _| {
            t1.hit("first");
            async { update(json!({"first": 1})) }
        })
        .step("slow", move |_, _| {
            t2.hit("slow");
            let (g, s) = (Arc::clone(&g), Arc::clone(&s));
            async move {
                s.notify_one();
                // Holds until released (never, for the leased call); each
                // release lets one call through.
                if let Ok(permit) = g.acquire().await {
                    permit.forget();
                }
                update(json!({"slow": 1}))
            }
        })
        .step("after", move |_, _| {
            t3.hit("after");
            async { update(json!({"after": 1})) }
        })
        .build()?;
    let wf = Arc::new(wf);

    // No lease: the cancel is found at the save after the step.
    let (st, w) = (Arc::clone(store), Arc::clone(&wf));
    let call = tokio::spawn(async move { Runner::new(&*st).run("plain", &w).await });
    started.notified().await;
    ops::cancel(
        &**store,
        "plain",
        Some("changed my mind".into()),
        "ada",
        &SystemClock,
    )
    .await?;
    gate.add_permits(1);
    let ended = call.await?;
    ensure!(
        matches!(&ended, Err(Error::Cancelled { by, reason: Some(r), .. }) if by == "ada" && r == "changed my mind"),
        "a cancelled call ended with {ended:?}"
    );
    let cp = store.load("plain").await?.ok_or("the run vanished")?;
    ensure!(
        cp.status == RunStatus::Cancelled && cp.next == 1 && cp.lease.is_none(),
        "after the cancel: {:?} at {}",
        cp.status,
        cp.next
    );
    let again = Runner::new(&**store).run("plain", &wf).await;
    ensure!(
        matches!(again, Err(Error::Cancelled { .. })),
        "running a cancelled run gave {again:?}"
    );
    ensure!(
        tally.get() == counts(&[("first", 1), ("slow", 1)]),
        "steps ran {:?}",
        tally.get()
    );
    let twice = ops::cancel(&**store, "plain", None, "ada", &SystemClock).await;
    ensure!(
        matches!(twice, Err(Error::InvalidInput { .. })),
        "cancelling twice gave {twice:?}"
    );

    // A lease renewed every 100 ms: the call stops after the 200 ms grace
    // although its step never returns.
    let (st, w) = (Arc::clone(store), Arc::clone(&wf));
    let call = tokio::spawn(async move {
        Runner::new(&*st)
            .lease(
                Owner::new("conformance-host", 1, 1),
                Duration::from_millis(300),
            )
            .cancel_grace(Duration::from_millis(200))
            .run("leased", &w)
            .await
    });
    started.notified().await;
    ops::cancel(&**store, "leased", None, "bob", &SystemClock).await?;
    let ended = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .map_err(|_| "a cancelled call with a lease did not stop")??;
    ensure!(
        matches!(&ended, Err(Error::Cancelled { by, .. }) if by == "bob"),
        "a cancelled leased call ended with {ended:?}"
    );
    let cp = store.load("leased").await?.ok_or("the run vanished")?;
    ensure!(
        cp.status == RunStatus::Cancelled && cp.next == 1,
        "after the cancel: {:?} at {}",
        cp.status,
        cp.next
    );
    ensure!(
        !tally.get().contains_key("after"),
        "a step after the cancel ran: {:?}",
        tally.get()
    );
    Ok(())
}

/// Retention deletes exactly the finished runs older than its age, never a
/// pending, running, waiting or sleeping one; a dry run deletes nothing.
/// While it runs, failed runs are retried and claimed: none of those is
/// deleted.
pub async fn gc_deletes_old_finished_runs_and_never_a_live_one(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let old = Timestamp::from_unix_millis(1_000_000);
    let young = Timestamp::from_unix_millis(9_000_000);
    let now = Timestamp::from_unix_millis(10_000_000);
    let statuses = [
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Rejected,
        RunStatus::Cancelled,
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Sleeping,
    ];
    for (i, status) in statuses.iter().enumerate() {
        for (age, at) in [("old", old), ("young", young)] {
            let mut cp = Checkpoint::new(format!("{age}-{i}-{status}"), "w", at);
            cp.status = *status;
            store.save(SaveRequest::new(&cp, None)).await?;
        }
    }
    let policy = Retention::new(Duration::from_millis(5_000_000)).batch(3);
    let dry = collect(&**store, &policy.clone().dry_run(true), now, |_| {}).await?;
    ensure!(
        dry.matched == 4 && dry.deleted == 0,
        "a dry run reported {dry:?}"
    );
    let mut batches = 0;
    let report = collect(&**store, &policy, now, |_| batches += 1).await?;
    ensure!(report.deleted == 4, "deleted {report:?}");
    ensure!(batches >= 4, "progress was reported {batches} times");
    for (i, status) in statuses.iter().enumerate() {
        for age in ["old", "young"] {
            let id = format!("{age}-{i}-{status}");
            let there = store.load(&id).await?.is_some();
            let finished = i < 4;
            ensure!(
                there != (finished && age == "old"),
                "run {id}: present {there}"
            );
        }
    }
    let live = collect(
        &**store,
        &Retention::new(Duration::ZERO).statuses([RunStatus::Running]),
        now,
        |_| {},
    )
    .await;
    ensure!(
        matches!(live, Err(Error::InvalidInput { .. })),
        "a policy naming running runs gave {live:?}"
    );

    // Under concurrent retries and claims.
    let n = 120;
    for i in 0..n {
        let mut cp = Checkpoint::new(format!("f{i:03}"), "w", old);
        cp.status = RunStatus::Failed;
        store.save(SaveRequest::new(&cp, None)).await?;
    }
    let st = Arc::clone(store);
    let claimer = tokio::spawn(async move {
        let mut revived = Vec::new();
        for i in (0..n).filter(|i| i % 2 == 1) {
            let id = format!("f{i:03}");
            // A person retries it, a worker claims it.
            let Ok(mut cp) = ops::retry(&*st, &id, "ada", &SystemClock).await else {
                continue;
            };
            cp.lease = Some(Lease::new(
                Owner::new("worker-host", 7, 7),
                Timestamp::from_unix_millis(u64::MAX / 4),
            ));
            if st
                .save(SaveRequest::new(&cp, Some(cp.version)).head_only())
                .await
                .is_ok()
            {
                revived.push(id);
            }
            tokio::task::yield_now().await;
        }
        revived
    });
    let report = collect(
        &**store,
        &Retention::new(Duration::from_millis(1)).batch(16),
        now,
        |_| {},
    )
    .await?;
    let revived = claimer.await?;
    for id in &revived {
        let cp = store
            .load(id)
            .await?
            .ok_or_else(|| format!("run {id} was retried and claimed, then deleted"))?;
        ensure!(cp.status == RunStatus::Running, "run {id} is {}", cp.status);
    }
    for i in (0..n).filter(|i| i % 2 == 0) {
        let id = format!("f{i:03}");
        ensure!(
            store.load(&id).await?.is_none(),
            "failed run {id} was not deleted"
        );
    }
    ensure!(
        report.deleted as usize + revived.len() <= n + 4,
        "counts do not add up: {report:?}, {} revived",
        revived.len()
    );
    Ok(())
}

/// Rewinding re-executes exactly the rewound steps, on the state as it was
/// before the step (an input value a later step overwrote included); a
/// rewound gate waits for a new decision; the rewind is audited; a step
/// that is not completed, or a run held by a live owner, is refused.
pub async fn rewind_reruns_exactly_the_rewound_steps(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let wf = gated(&tally)?;
    start(&**store, "gated", "r", json!({"x": "in", "n": 1}), false).await?;
    through_gate(store, &wf, "r", json!({"ok": 1})).await?;
    ensure!(
        tally.get() == counts(&[("a", 1), ("b", 1), ("c", 1)]),
        "first pass ran {:?}",
        tally.get()
    );
    let cp = ops::rewind(&**store, "r", "b", "ada", &SystemClock).await?;
    ensure!(
        cp.next == 1 && cp.completed == ["a"] && cp.status == RunStatus::Running,
        "after rewind: next {} {:?} {}",
        cp.next,
        cp.completed,
        cp.status
    );
    let want = json!({"x": "a", "n": 1, "__start": {"x": "in", "n": 1}});
    ensure!(
        Value::Object(cp.state.clone()) == want,
        "state after rewinding to b: {:?}",
        cp.state
    );
    let stored = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(
        stored.state == cp.state,
        "the stored state differs: {:?}",
        stored.state
    );
    match stored.audit.last().map(|e| &e.action) {
        Some(AuditAction::Rewind {
            to: 1,
            from: 4,
            rewound,
            ..
        }) => {
            let names: Vec<&str> = rewound.iter().map(|r| r.name.as_str()).collect();
            ensure!(names == ["b", "g", "c"], "rewound steps listed: {names:?}");
        }
        other => return Err(format!("no rewind audit entry: {other:?}").into()),
    }
    ensure!(
        store.history("r").await?.ok_or("no history")?.len() == 1,
        "history still lists rewound steps"
    );
    // The gate waits for a new decision; then b and c run again, a does not.
    through_gate(store, &wf, "r", json!({"ok": 2})).await?;
    ensure!(
        tally.get() == counts(&[("a", 1), ("b", 2), ("c", 2)]),
        "after the rewind ran {:?}",
        tally.get()
    );
    let done = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(
        done.state.get("c") == Some(&json!(["a-b", {"ok": 2}])),
        "c saw {:?}",
        done.state.get("c")
    );
    ensure!(
        store.history("r").await?.ok_or("no history")?.len() == 4,
        "history is not whole"
    );

    // To the first step, by index: the input as given, before `a` overwrote x.
    let cp = ops::rewind(&**store, "r", "0", "ada", &SystemClock).await?;
    let want = json!({"x": "in", "n": 1, "__start": {"x": "in", "n": 1}});
    ensure!(
        Value::Object(cp.state.clone()) == want,
        "state after rewinding to step 0: {:?}",
        cp.state
    );

    for bad in ["c", "nope", "7", ""] {
        let refused = ops::rewind(&**store, "r", bad, "ada", &SystemClock).await;
        ensure!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "rewinding to {bad:?} gave {refused:?}"
        );
    }
    // Held by a live owner elsewhere: refused, record untouched.
    let mut held = store.load("r").await?.ok_or("the run vanished")?;
    held.lease = Some(Lease::new(
        Owner::new("another-host", 1, 1),
        Timestamp::from_unix_millis(u64::MAX / 4),
    ));
    store
        .save(SaveRequest::new(&held, Some(held.version)).head_only())
        .await?;
    let before = snapshot(store, "r").await?;
    let refused = ops::rewind(&**store, "r", "a", "ada", &SystemClock).await;
    ensure!(
        matches!(refused, Err(Error::Held { .. })),
        "rewinding a held run gave {refused:?}"
    );
    ensure!(
        snapshot(store, "r").await? == before,
        "a refused rewind changed the run"
    );
    Ok(())
}

/// A fork copies the state and history below its step into a new run that
/// resumes there; the original is byte-for-byte untouched; an existing id
/// is refused.
pub async fn fork_copies_the_first_steps_and_leaves_the_original(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let wf = gated(&tally)?;
    start(&**store, "gated", "orig", json!({"x": "in"}), false).await?;
    through_gate(store, &wf, "orig", json!({"ok": true})).await?;
    let before = snapshot(store, "orig").await?;
    let original_history = store.history("orig").await?.ok_or("no history")?;

    let fork = ops::fork(&**store, "orig", "c", "copy", "ada", &SystemClock).await?;
    ensure!(
        snapshot(store, "orig").await? == before,
        "the fork changed the original"
    );
    let stored = store.load("copy").await?.ok_or("no fork stored")?;
    ensure!(
        stored.next == 3 && stored.completed == ["a", "b", "g"] && stored.lease.is_none(),
        "fork: next {} {:?} lease {:?}",
        stored.next,
        stored.completed,
        stored.lease
    );
    ensure!(
        stored.state == fork.state,
        "the returned fork differs from the stored one"
    );
    let want = json!({"x": "a", "b": "a-b", "g": {"ok": true}, "__start": {"x": "in"}});
    ensure!(
        Value::Object(stored.state.clone()) == want,
        "fork state {:?}",
        stored.state
    );
    let history = store
        .history("copy")
        .await?
        .ok_or("the fork has no history")?;
    ensure!(
        history[..] == original_history[..3],
        "fork history {history:?} is not the original's first three"
    );
    ensure!(
        matches!(stored.audit.last().map(|e| &e.action), Some(AuditAction::Fork { from_run, at: 3, .. }) if from_run == "orig"),
        "fork audit: {:?}",
        stored.audit
    );
    let end = Runner::new(&**store).run("copy", &wf).await?;
    ensure!(
        matches!(end, Outcome::Completed(_)),
        "the fork ended {end:?}"
    );
    ensure!(
        tally.get() == counts(&[("a", 1), ("b", 1), ("c", 2)]),
        "the fork ran {:?}",
        tally.get()
    );
    ensure!(
        snapshot(store, "orig").await? == before,
        "running the fork changed the original"
    );

    let copy_before = snapshot(store, "copy").await?;
    let exists = ops::fork(&**store, "orig", "b", "copy", "ada", &SystemClock).await;
    ensure!(
        matches!(exists, Err(Error::InvalidInput { .. })),
        "forking onto an existing id gave {exists:?}"
    );
    ensure!(
        snapshot(store, "copy").await? == copy_before,
        "a refused fork changed its target"
    );
    // At the first step: nothing copied but what the run started with.
    let first = ops::fork(&**store, "orig", "a", "fresh", "ada", &SystemClock).await?;
    ensure!(
        first.next == 0
            && Value::Object(first.state.clone()) == json!({"x": "in", "__start": {"x": "in"}}),
        "fork at the first step: {:?}",
        first.state
    );
    Ok(())
}

/// A durable function is rewound and forked by step name: the code replays
/// the steps before the name and goes live there; a call that asks for the
/// recorded steps in another order still fails with `WorkflowChanged`.
pub async fn durable_functions_rewind_and_fork_by_step_name(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let tally = Tally::default();
    let body = |tally: Tally, order: [&'static str; 3]| {
        move |ctx: steadfast_core::DurableCtx<'static, Arc<dyn Store>>| async move {
            let mut sum = 0u64;
            for (i, name) in order.iter().enumerate() {
                let t = tally.clone();
                sum += ctx
                    .step(*name, move || {
                        t.hit(name);
                        async move { Ok::<_, StepError>(i as u64 + 1) }
                    })
                    .await?;
            }
            Ok(sum)
        }
    };
    let order = ["s1", "s2", "s3"];
    let out = Runner::new(store)
        .durable("d", "sum", body(tally.clone(), order))
        .await?;
    ensure!(out == Outcome::Completed(6), "first call gave {out:?}");
    let cp = ops::rewind(&**store, "d", "s2", "ada", &SystemClock).await?;
    ensure!(
        cp.completed == ["s1"] && !cp.state.contains_key("__result") && cp.state.contains_key("s1"),
        "after rewind: {:?} {:?}",
        cp.completed,
        cp.state
    );
    let out = Runner::new(store)
        .durable("d", "sum", body(tally.clone(), order))
        .await?;
    ensure!(out == Outcome::Completed(6), "after rewind gave {out:?}");
    ensure!(
        tally.get() == counts(&[("s1", 1), ("s2", 2), ("s3", 2)]),
        "steps ran {:?}",
        tally.get()
    );
    ops::fork(&**store, "d", "s3", "d2", "ada", &SystemClock).await?;
    // Asking for s2 before s1 contradicts the fork's record.
    let changed = Runner::new(store)
        .durable("d2", "sum", body(tally.clone(), ["s2", "s1", "s3"]))
        .await;
    ensure!(
        matches!(changed, Err(Error::WorkflowChanged { .. })),
        "a diverging call gave {changed:?}"
    );
    let out = Runner::new(store)
        .durable("d2", "sum", body(tally.clone(), order))
        .await?;
    ensure!(out == Outcome::Completed(6), "the fork gave {out:?}");
    ensure!(
        tally.get() == counts(&[("s1", 1), ("s2", 2), ("s3", 3)]),
        "steps ran {:?}",
        tally.get()
    );
    Ok(())
}

/// A save may write a given version (for imports): the compare-and-swap on
/// the expected version still applies, and the version loads back.
pub async fn a_save_can_write_a_given_version(ts: TestStore) -> CheckResult {
    let store = &ts.store;
    let cp = Checkpoint::new("r", "flow", Timestamp::from_unix_millis(1));
    let v = store
        .save(SaveRequest::new(&cp, None).writing_version(41))
        .await?;
    ensure!(v == 41, "a fresh save meant to write version 41 wrote {v}");
    let loaded = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(loaded.version == 41, "loaded version {}", loaded.version);
    let stale = store
        .save(SaveRequest::new(&cp, Some(40)).writing_version(90))
        .await;
    ensure!(
        matches!(&stale, Err(e) if e.kind() == StoreErrorKind::Conflict),
        "a save expecting a stale version gave {stale:?}"
    );
    ensure!(
        store.save(SaveRequest::new(&cp, Some(41))).await? == 42,
        "the next save is not 42"
    );
    let v = store
        .save(SaveRequest::new(&cp, Some(42)).writing_version(100))
        .await?;
    ensure!(v == 100, "wrote {v}");
    ensure!(
        store.load("r").await?.ok_or("the run vanished")?.version == 100,
        "version 100 did not load back"
    );
    Ok(())
}

/// `put_run` writes a run as another store had it (record, version and,
/// where this store keeps it, history) and loads back equal; again, it
/// keeps what is there; a newer record here is never overwritten, an older
/// one is replaced. An encrypted-looking state (opaque strings) moves as is.
pub async fn put_run_copies_a_run_exactly_and_never_overwrites_a_newer_one(
    ts: TestStore,
) -> CheckResult {
    use steadfast_core::transfer::{export_run, put_run, Put};
    let store = &ts.store;
    let source: Arc<dyn Store> = Arc::new(steadfast_core::MemoryStore::new());
    let tally = Tally::default();
    let wf = gated(&tally)?;
    start(&*source, "gated", "r", json!({"x": "in"}), false).await?;
    through_gate(&source, &wf, "r", json!({"ok": [1, 2.5, "three"]})).await?;
    ops::rewind(&*source, "r", "c", "ada", &SystemClock).await?;
    let record = export_run(&*source, "r").await?.ok_or("no export")?;
    let keeps_history =
        !matches!(store.history("nope").await, Err(e) if e.kind() == StoreErrorKind::Unsupported);

    ensure!(
        put_run(&**store, &record).await? == Put::Written,
        "not written"
    );
    let here = store.load("r").await?.ok_or("the run did not arrive")?;
    ensure!(
        here == record.run,
        "the run differs:\n{here:?}\n{:?}",
        record.run
    );
    if keeps_history {
        let h = store.history("r").await?;
        ensure!(h == record.history, "the history differs: {h:?}");
    }
    ensure!(
        matches!(put_run(&**store, &record).await?, Put::Kept { version } if version == record.run.version),
        "a second put was not kept"
    );
    // The source moves on: the copy here is replaced.
    Runner::new(&*source).run("r", &wf).await?;
    let newer = export_run(&*source, "r").await?.ok_or("no export")?;
    ensure!(
        put_run(&**store, &newer).await?
            == (Put::Replaced {
                was: record.run.version
            }),
        "an older copy was not replaced"
    );
    ensure!(
        store.load("r").await?.as_ref() == Some(&newer.run),
        "the newer run did not arrive"
    );
    // The older record again: the newer one here stays.
    ensure!(
        matches!(put_run(&**store, &record).await?, Put::Kept { .. }),
        "an older record overwrote a newer one"
    );
    ensure!(
        store.load("r").await?.as_ref() == Some(&newer.run),
        "the newer run changed"
    );
    // The run works on here: a rewind (where history is kept) and a run.
    if keeps_history {
        ops::rewind(&**store, "r", "b", "ada", &SystemClock).await?;
        through_gate(store, &wf, "r", json!({"ok": "again"})).await?;
    }

    // A copy cut short (the store dies at its last save) leaves a run no
    // worker takes, which the next copy replaces, also when the source's
    // version equals its number of steps (a run without a lease).
    let mut b = Workflow::builder("three");
    for name in ["p", "q", "s"] {
        b = b.step(name, move |_, _| async move { update(json!({ name: 1 })) });
    }
    let three = b.build()?;
    Runner::new(&*source).run("v", &three).await?;
    let rec = export_run(&*source, "v").await?.ok_or("no export")?;
    ensure!(
        rec.run.version == 3,
        "the source's version is {}",
        rec.run.version
    );
    let dying = crate::FaultyStore::new(Arc::clone(store), 3, crate::Fault::FailFromHere);
    ensure!(
        put_run(&dying, &rec).await.is_err(),
        "the cut-short copy did not fail"
    );
    let half = store
        .load("v")
        .await?
        .ok_or("nothing was written before the cut")?;
    ensure!(
        half.status == RunStatus::Cancelled,
        "a half-written run is {}",
        half.status
    );
    ensure!(
        half.runnable_at().is_none(),
        "a half-written run is runnable"
    );
    let again = put_run(&**store, &rec).await?;
    ensure!(
        matches!(again, Put::Replaced { .. }),
        "the next copy gave {again:?}"
    );
    ensure!(
        store.load("v").await?.as_ref() == Some(&rec.run),
        "the run did not arrive whole"
    );
    Ok(())
}

/// `prune` folds the old history into one row: what `load` returns stays,
/// `history` lists the fold row and the kept rows, a rewind or fork to a
/// kept step still rebuilds the right state and one to a folded step is
/// refused, and a pruned run copies to another store whole. A stale fold
/// changes nothing.
pub async fn prune_keeps_load_resume_rewind_and_fork_correct(ts: TestStore) -> CheckResult {
    use steadfast_core::transfer::{export_run, put_run};
    let store = &ts.store;
    let tally = Tally::default();
    let mut builder = Workflow::builder("long");
    for i in 0..8usize {
        let t = tally.clone();
        builder = builder.step(format!("s{i}"), move |_, _| {
            t.hit(&format!("s{i}"));
            async move { update(json!({"n": i, format!("s{i}"): i})) }
        });
    }
    let wf = builder.build()?;
    Runner::new(&**store).run("p", &wf).await?;
    let before = store.load("p").await?.ok_or("the run vanished")?;

    // A stale fold writes nothing.
    let history = store.history("p").await?.ok_or("no history")?;
    let mut fold = history[2].clone();
    fold.update = json!({"n": 99}).as_object().cloned().unwrap_or_default();
    let stale = store.fold_history("p", before.version + 1, &fold).await;
    ensure!(
        matches!(&stale, Err(e) if e.kind() == StoreErrorKind::Conflict),
        "a stale fold gave {stale:?}"
    );
    ensure!(
        store.history("p").await? == Some(history),
        "a stale fold changed the history"
    );

    let pruned = ops::prune(&**store, "p", 3, "ada", &SystemClock)
        .await?
        .ok_or("nothing was pruned")?;
    ensure!(
        pruned.folded_into == 4 && pruned.rows_deleted == 4,
        "pruned {pruned:?}"
    );
    let after = store.load("p").await?.ok_or("the run vanished")?;
    ensure!(
        after.state == before.state
            && after.completed == before.completed
            && after.status == before.status,
        "the prune changed the run: {after:?}"
    );
    let rows = store.history("p").await?.ok_or("no history")?;
    let idx: Vec<usize> = rows.iter().map(|r| r.index).collect();
    ensure!(idx == [4, 5, 6, 7], "rows after the prune: {idx:?}");
    let want = json!({"n": 4, "s0": 0, "s1": 1, "s2": 2, "s3": 3, "s4": 4});
    ensure!(
        serde_json::Value::Object(rows[0].update.clone()) == want,
        "the fold row holds {:?}",
        rows[0].update
    );
    ensure!(
        ops::prune(&**store, "p", 3, "ada", &SystemClock)
            .await?
            .is_none(),
        "a second prune found something to fold"
    );

    // Copied elsewhere, pruned as it is.
    let rec = export_run(&**store, "p").await?.ok_or("no export")?;
    let other = steadfast_core::MemoryStore::new();
    put_run(&other, &rec).await?;
    ensure!(
        other.history("p").await? == Some(rows.clone()),
        "the copy's history differs"
    );

    for (op, bad) in [("rewind", "s4"), ("rewind", "s0"), ("fork", "s3")] {
        let refused = match op {
            "rewind" => ops::rewind(&**store, "p", bad, "ada", &SystemClock).await,
            _ => ops::fork(&**store, "p", bad, "pf", "ada", &SystemClock).await,
        };
        ensure!(
            matches!(&refused, Err(Error::InvalidInput { reason, .. }) if reason.contains("pruned")),
            "{op} to {bad} after the prune gave {refused:?}"
        );
    }
    let fork = ops::fork(&**store, "p", "s6", "pf", "ada", &SystemClock).await?;
    let want = json!({"n": 5, "s0": 0, "s1": 1, "s2": 2, "s3": 3, "s4": 4, "s5": 5});
    ensure!(
        serde_json::Value::Object(fork.state.clone()) == want,
        "the fork's state {:?}",
        fork.state
    );
    let cp = ops::rewind(&**store, "p", "s5", "ada", &SystemClock).await?;
    let want = json!({"n": 4, "s0": 0, "s1": 1, "s2": 2, "s3": 3, "s4": 4});
    ensure!(
        serde_json::Value::Object(cp.state.clone()) == want,
        "the state before s5: {:?}",
        cp.state
    );
    Runner::new(&**store).run("p", &wf).await?;
    Runner::new(&**store).run("pf", &wf).await?;
    let ran = tally.get();
    let want: BTreeMap<String, u32> = (0..8)
        .map(|i| {
            (
                format!("s{i}"),
                if i >= 5 { 2 + u32::from(i >= 6) } else { 1 },
            )
        })
        .collect();
    ensure!(ran == want, "steps ran {ran:?}");
    let end = store.load("p").await?.ok_or("the run vanished")?;
    ensure!(
        end.state == before.state,
        "the rerun ended with {:?}",
        end.state
    );
    // Everything folded: no step can be named any more.
    let all = ops::prune(&**store, "p", 0, "ada", &SystemClock)
        .await?
        .ok_or("nothing folded")?;
    ensure!(all.folded_into == 7, "{all:?}");
    ensure!(
        store.history("p").await?.map(|h| h.len()) == Some(1),
        "rows left after keeping none"
    );
    Ok(())
}

/// A record relabelled by changed code (`accept_changed_workflow`) keeps a
/// store that loads, a history that lists, and rewind and export working,
/// though its rows were written under the old names.
pub async fn a_relabelled_record_keeps_its_history_usable(ts: TestStore) -> CheckResult {
    use steadfast_core::transfer::export_run;
    let store = &ts.store;
    let old = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .step("b", |_, _| async { update(json!({"b": 1})) })
        .push(Step::gate("g"))
        .build()?;
    let new = Workflow::builder("w")
        .step("a2", |_, _| async { update(json!({"a": 2})) })
        .step("b2", |_, _| async { update(json!({"b": 2})) })
        .push(Step::gate("g"))
        .step("c", |_, _| async { update(json!({"c": 3})) })
        .build()?;
    Runner::new(&**store).run("r", &old).await?;
    approve(&**store, "r", "g", None, "ada", &SystemClock).await?;
    let out = Runner::new(&**store)
        .accept_changed_workflow(true)
        .run("r", &new)
        .await?;
    ensure!(
        matches!(out, Outcome::Completed(_)),
        "the relabelled run ended {out:?}"
    );
    // Everything still reads: other runs of the store, this run, its rows.
    store.list(&steadfast_core::ListFilter::new()).await?;
    let cp = store.load("r").await?.ok_or("the run vanished")?;
    ensure!(
        cp.completed == ["a2", "b2", "g", "c"],
        "completed {:?}",
        cp.completed
    );
    let rows = store.history("r").await?.ok_or("no history")?;
    ensure!(rows.len() == 4, "{} rows", rows.len());
    ensure!(
        export_run(&**store, "r").await?.is_some(),
        "the run does not export"
    );
    let cp = ops::rewind(&**store, "r", "c", "ada", &SystemClock).await?;
    ensure!(
        cp.completed == ["a2", "b2", "g"],
        "after rewind {:?}",
        cp.completed
    );
    let fork = ops::fork(&**store, "r", "b2", "f", "ada", &SystemClock).await?;
    ensure!(
        fork.completed == ["a2"],
        "the fork has {:?}",
        fork.completed
    );
    let loaded = store.load("f").await?.ok_or("the fork vanished")?;
    ensure!(
        loaded.completed == ["a2"],
        "the fork loads with {:?}",
        loaded.completed
    );
    Ok(())
}

/// A completed step records what it ran as (its declared version, under
/// [`STEP_KEY`](steadfast_core::STEP_KEY) in its history row), a step
/// cannot forge it, and it never reaches the state: not as the run goes,
/// not after a load, a fork or a rewind. A plan sees the record: clean for
/// the same code, the changed field for a new version.
pub async fn step_definitions_are_recorded_and_never_reach_the_state(ts: TestStore) -> CheckResult {
    use steadfast_core::ops::plan::{plan, StepAction};
    use steadfast_core::{StepVersion, STEP_KEY};
    let store = &ts.store;
    let flow = |version: &str| {
        Workflow::new(
            "versioned",
            vec![
                Step::new("a", |_, _| async {
                    update(json!({"a": 1, STEP_KEY: "forged"}))
                })
                .version(version),
                Step::gate("g"),
                Step::new("c", |_, _| async { update(json!({"c": 2})) }).version(version),
            ],
        )
    };
    let (v1, v2) = (flow("1")?, flow("2")?);
    let out = Runner::new(&**store).run("v", &v1).await?;
    ensure!(
        out == Outcome::Waiting { gate: "g".into() },
        "expected to wait at g, got {out:?}"
    );
    let no_key = |cp: &Checkpoint, when: &str| -> CheckResult {
        ensure!(
            !cp.state.contains_key(STEP_KEY),
            "{when}: the state holds {STEP_KEY}: {:?}",
            cp.state
        );
        Ok(())
    };
    no_key(
        &store.load("v").await?.ok_or("the run is gone")?,
        "after a load",
    )?;
    let history = store.history("v").await?.ok_or("no history")?;
    ensure!(
        history[0].update.get(STEP_KEY) == Some(&StepVersion::declared("1")?.to_value()),
        "the first step's record: {:?}",
        history[0].update
    );
    let same = plan(&**store, "v", &v1).await?;
    ensure!(same.clean, "the same code is not a clean plan: {same:?}");
    let newer = plan(&**store, "v", &v2).await?;
    ensure!(
        !newer.clean
            && newer.stops_at.is_none()
            && newer.steps[0].action == StepAction::Changed
            && newer.steps[0].changes[0].field == "version",
        "a new version: {newer:?}"
    );
    approve(&**store, "v", "g", None, "ada", &SystemClock).await?;
    let done = Runner::new(&**store).run("v", &v1).await?;
    ensure!(
        matches!(done, Outcome::Completed(_)),
        "expected completion, got {done:?}"
    );
    no_key(
        &store.load("v").await?.ok_or("the run is gone")?,
        "at the end",
    )?;
    let fork = ops::fork(&**store, "v", "c", "v-fork", "ada", &SystemClock).await?;
    no_key(&fork, "after a fork")?;
    let forked = store
        .history("v-fork")
        .await?
        .ok_or("no history of the fork")?;
    ensure!(
        forked[0].update.contains_key(STEP_KEY),
        "the fork's first row lost its definition: {:?}",
        forked[0].update
    );
    let back = ops::rewind(&**store, "v", "a", "ada", &SystemClock).await?;
    no_key(&back, "after a rewind")?;
    let again = Runner::new(&**store).run("v", &v2).await?;
    ensure!(
        again == Outcome::Waiting { gate: "g".into() },
        "after the rewind: {again:?}"
    );
    let history = store.history("v").await?.ok_or("no history")?;
    ensure!(
        history[0].update.get(STEP_KEY) == Some(&StepVersion::declared("2")?.to_value()),
        "the step run again under version 2 records it: {:?}",
        history[0].update
    );
    Ok(())
}
