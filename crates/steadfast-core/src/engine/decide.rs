//! Decisions at gates, written into a waiting run's record by compare-and-swap.

use crate::record::checkpoint::{Checkpoint, Decision, RunStatus, Wait};
use crate::record::clock::Clock;
use crate::record::error::{Error, StoreError, StoreErrorKind};
use crate::record::limits::MAX_REASON_BYTES;
use crate::record::spend::{amounts_of, BUDGET_GATE};
use crate::store::{SaveRequest, Store};

/// Approves gate `gate` of waiting run `run_id`: records who, when and the
/// data, which the next run of the workflow merges into the state under the
/// gate's name before it goes on.
///
/// Data that could not be stored in the state (nesting deeper than
/// [`MAX_VALUE_DEPTH`](crate::MAX_VALUE_DEPTH) under the gate's key) and a
/// `by` that is not a name (empty, over 200 bytes, control characters) are
/// refused with [`Error::InvalidInput`] before anything is loaded or written.
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
    check_decider(run_id, gate, by)?;
    if let Some(d) = &data {
        crate::store::check_decision_data(gate, d).map_err(|p| Error::InvalidInput {
            what: format!("the data approving gate {gate:?} of run {run_id:?}"),
            reason: format!(
                "the value at `{}` cannot be stored: {}; nothing was written",
                p.path, p.reason
            ),
        })?;
    }
    let budget = |cp: &Checkpoint| -> Result<(), Error> {
        // The budget gate takes amounts to add: refused before they are
        // written, not when the run reads them.
        let (Some(d), true) = (&data, gate == BUDGET_GATE && has_budget(cp)) else {
            return Ok(());
        };
        amounts_of(d)
            .map(drop)
            .map_err(|reason| Error::InvalidInput {
                what: format!("the data approving the budget of run {run_id:?}"),
                reason: format!(
                    "{reason} (it gives amounts to add, like {{\"usd\": 10}}); nothing was written"
                ),
            })
    };
    decide(store, run_id, gate, clock, budget, |cp, now| {
        cp.decisions
            .push(Decision::approve(gate, by, now, data.clone()));
    })
    .await
}

/// Checks who decides: a name like a step's (1 to 200 bytes, no control
/// characters), so that it is stored and shown as given.
fn check_decider(run_id: &str, gate: &str, by: &str) -> Result<(), Error> {
    crate::record::ids::check_step_name(by).map_err(|reason| Error::InvalidInput {
        what: format!(
            "the name of who decides gate {gate:?} of run {run_id:?} ({:?})",
            crate::record::ids::preview(by)
        ),
        reason: format!("{reason}; nothing was written"),
    })
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
    check_decider(run_id, gate, by)?;
    if let Some(r) = &reason {
        if r.len() > MAX_REASON_BYTES {
            return Err(Error::InvalidInput {
                what: format!("the reason for rejecting gate {gate:?} of run {run_id:?}"),
                reason: format!(
                    "it is {} bytes, over the limit of {MAX_REASON_BYTES}; nothing was written",
                    r.len()
                ),
            });
        }
    }
    decide(
        store,
        run_id,
        gate,
        clock,
        |_| Ok(()),
        |cp, now| {
            cp.decisions
                .push(Decision::reject(gate, by, now, reason.clone()));
            cp.status = RunStatus::Rejected;
            cp.wait = None;
            // The run has ended: no one holds it any more. A holder that claimed
            // it meanwhile (and died, or is resuming) is fenced by the version.
            cp.lease = None;
        },
    )
    .await
}

async fn decide<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    gate: &str,
    clock: &dyn Clock,
    check: impl Fn(&Checkpoint) -> Result<(), Error>,
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
    let mut contended = None;
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
        check(&cp)?;
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
                // A rejection ends the run: its parent, if any, hears of it.
                crate::engine::family::ended_child(store, &cp, clock).await;
                return Ok(cp);
            }
            Err(e) if e.kind() == StoreErrorKind::Conflict => contended = Some(e),
            Err(e) => return Err(store_err(e)),
        }
    }
    // Others kept writing the run: contention, like a held run, not a
    // decision given at the wrong place.
    Err(store_err(contended.unwrap_or_else(|| {
        StoreError::Conflict {
            run_id: run_id.to_string(),
            expected: None,
            found: None,
        }
    })))
}

/// Who decides, or operates, when no name is given: the login name
/// (`$USER`, else `$LOGNAME`) when it is a name the engine records, else
/// `unknown`. The command line and the bindings use it alike.
pub fn default_decider() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|name| crate::record::ids::check_step_name(name).is_ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Whether the run has budgets (its `budget` gate is then the engine's).
fn has_budget(cp: &Checkpoint) -> bool {
    cp.spend.as_ref().is_some_and(|s| !s.budget.is_empty())
}
