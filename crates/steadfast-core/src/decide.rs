//! Decisions at gates, written into a waiting run's record by compare-and-swap.

use crate::checkpoint::{Checkpoint, Decision, RunStatus, Wait};
use crate::clock::Clock;
use crate::error::{Error, StoreErrorKind};
use crate::store::{SaveRequest, Store};

/// Approves gate `gate` of waiting run `run_id`: records who, when and the
/// data, which the next run of the workflow merges into the state under the
/// gate's name before it goes on.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{approve, run, update, MemoryStore, Outcome, Step, SystemClock, Workflow};
///
/// let wf = Workflow::builder("publish")
///     .step("draft", |_, _| async { update(json!({"draft": "text"})) })
///     .push(Step::gate("review"))
///     .step("post", |_, s| async move { update(json!({"posted": s["review"]["ok"]})) })
///     .build()?;
/// let store = MemoryStore::new();
/// assert_eq!(run("r", &wf, &store).await?, Outcome::Waiting { gate: "review".into() });
/// approve(&store, "r", "review", Some(json!({"ok": true})), "ada", &SystemClock).await?;
/// let state = run("r", &wf, &store).await?.completed().unwrap();
/// assert_eq!(state["posted"], json!(true));
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn approve<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    gate: &str,
    data: Option<serde_json::Value>,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    decide(store, run_id, gate, clock, |cp, now| {
        cp.decisions
            .push(Decision::approve(gate, by, now, data.clone()));
    })
    .await
}

/// Rejects gate `gate` of waiting run `run_id`: the run ends with status
/// `rejected`, and the decision (who, when, why) stays in its record.
pub async fn reject<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    gate: &str,
    reason: Option<String>,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    decide(store, run_id, gate, clock, |cp, now| {
        cp.decisions
            .push(Decision::reject(gate, by, now, reason.clone()));
        cp.status = RunStatus::Rejected;
        cp.wait = None;
    })
    .await
}

async fn decide<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    gate: &str,
    clock: &dyn Clock,
    apply: impl Fn(&mut Checkpoint, crate::Timestamp),
) -> Result<Checkpoint, Error> {
    crate::validate_run_id(run_id)?;
    let store_err = |e| Error::Store {
        run_id: run_id.to_string(),
        op: format!("decision at gate {gate:?}"),
        source: e,
    };
    // A concurrent save (a lease renewal, another decision) can move the version
    // between our load and our save: load again and re-check.
    for _ in 0..10 {
        let mut cp = store
            .load(run_id)
            .await
            .map_err(store_err)?
            .ok_or_else(|| Error::NoSuchRun {
                run_id: run_id.to_string(),
            })?;
        let waiting_here = cp.status == RunStatus::Waiting
            && matches!(&cp.wait, Some(Wait::Gate { step, .. }) if step == gate);
        let decided = matches!(&cp.wait, Some(Wait::Gate { since, .. })
            if cp.decisions.iter().any(|d| d.gate == gate && d.waited_since == Some(*since)));
        if !waiting_here || decided {
            let detail = match (&cp.wait, cp.status) {
                (_, _) if decided => "a decision was already recorded".to_string(),
                (Some(w), status) => format!("its status is {status} at step {:?}", w.step()),
                (None, status) => format!("its status is {status}"),
            };
            return Err(Error::NotWaiting {
                run_id: run_id.to_string(),
                gate: gate.to_string(),
                detail,
            });
        }
        let now = clock.now();
        let since = match &cp.wait {
            Some(Wait::Gate { since, .. }) => Some(*since),
            _ => None,
        };
        apply(&mut cp, now);
        if let (Some(d), Some(since)) = (cp.decisions.last_mut(), since) {
            d.waited_since = Some(since);
        }
        cp.updated_at = now;
        cp.writer = fastrand::u64(1..);
        match store.save(SaveRequest::new(&cp, Some(cp.version))).await {
            Ok(v) => {
                cp.version = v;
                return Ok(cp);
            }
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(store_err(e)),
        }
    }
    Err(Error::NotWaiting {
        run_id: run_id.to_string(),
        gate: gate.to_string(),
        detail: "the run kept changing while the decision was being saved".into(),
    })
}
