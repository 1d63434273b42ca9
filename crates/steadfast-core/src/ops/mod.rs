//! Operations a person performs on a run's record by hand: cancel, retry,
//! rewind, fork and prune. Each one is a compare-and-swap save of the run (a fork:
//! of the new run), and leaves an [`AuditEntry`] (what, who, when) in the
//! record, which `show` and `history` print.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::{ops, run, update, MemoryStore, Outcome, SystemClock, Workflow};
//!
//! let wf = Workflow::builder("count")
//!     .step("one", |_, _| async { update(json!({"one": 1})) })
//!     .step("two", |_, s| async move { update(json!({"two": s["one"].as_i64().unwrap() + 1})) })
//!     .build()?;
//! let store = MemoryStore::new();
//! run("r", &wf, &store).await?;
//! // Step "two" runs again on the state as it was after "one".
//! let cp = ops::rewind(&store, "r", "two", "ada", &SystemClock).await?;
//! assert_eq!((cp.next, cp.state.get("two")), (1, None));
//! assert!(matches!(run("r", &wf, &store).await?, Outcome::Completed(_)));
//! // A copy of the run's first step, resuming at "two", under a new id.
//! let fork = ops::fork(&store, "r", "two", "r-copy", "ada", &SystemClock).await?;
//! assert_eq!(fork.completed, vec!["one".to_string()]);
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

pub mod limits;
pub mod plan;
pub mod retention;
pub mod schedules;
pub mod start;
pub mod stuck;
pub mod transfer;
pub mod watch;
pub mod worker;

use std::collections::HashSet;

use crate::engine::{standing, store_error, Standing};
use crate::record::checkpoint::{
    AuditAction, AuditEntry, Checkpoint, RewoundStep, RunStatus, StepRecord, MAX_REWOUND_LISTED,
};
use crate::record::clock::{Clock, Timestamp};
use crate::record::error::{Error, StoreError, StoreErrorKind};
use crate::record::limits::MAX_REASON_BYTES;
use crate::record::state::State;
use crate::store::StoreExt as _;
use crate::store::{SaveRequest, Store};

/// Keys of a run's state that the engine writes without a step record: the
/// result of a durable function, which a rewind or fork takes away.
const ENGINE_KEYS: [&str; 1] = [crate::record::keys::RESULT_KEY];

/// Cancels run `run_id`: its status becomes [`RunStatus::Cancelled`], its
/// wait is cleared, and no worker takes it again (its lease stays until it
/// lapses, so that a rewind waits for a holder still finishing a step). A process that
/// holds it finds out at its next save or lease renewal and stops there
/// (see [`Runner::cancel_grace`](crate::Runner::cancel_grace)); `run` of a
/// cancelled run fails with [`Error::Cancelled`].
///
/// A completed, rejected or already cancelled run is refused with
/// [`Error::InvalidInput`]; `reason` is at most
/// [`MAX_REASON_BYTES`].
pub async fn cancel<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    reason: Option<String>,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    check_operator(run_id, "cancel", by)?;
    if let Some(r) = &reason {
        if r.len() > MAX_REASON_BYTES {
            return Err(Error::InvalidInput {
                what: format!("the reason for cancelling run {run_id:?}"),
                reason: format!(
                    "it is {} bytes, over the limit of {MAX_REASON_BYTES}; nothing was written",
                    r.len()
                ),
            });
        }
    }
    let mut running = Vec::new();
    let cp = modify(store, run_id, "cancel", clock, |cp, now| {
        running = match &cp.wait {
            Some(crate::record::checkpoint::Wait::Children { runs, .. }) => runs.clone(),
            _ => Vec::new(),
        };
        cp.mark_cancelled(reason.clone(), by, now)
            .map_err(|why| refused(run_id, "cancel", why))
    })
    .await?;
    crate::engine::family::cancelled(store, &cp, running, clock).await;
    Ok(cp)
}

/// Retries failed run `run_id`: clears its error and the attempts its
/// failed step used, so that the next `run` or worker tries that step again
/// with its whole retry budget. When that step's child run failed, the
/// child is retried too. Only a [`RunStatus::Failed`] run can be
/// retried ([`Error::InvalidInput`] otherwise).
pub async fn retry<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    check_operator(run_id, "retry", by)?;
    let mut failed_step = None;
    let cp = modify(store, run_id, "retry", clock, |cp, now| {
        failed_step = cp.error.as_ref().map(|e| e.step.clone());
        cp.mark_retried(by, now)
            .map_err(|why| refused(run_id, "retry", why))
    })
    .await?;
    if let Some(step) = failed_step {
        crate::engine::family::retried(store, &cp, &step, by, clock).await;
    }
    Ok(cp)
}

/// Rewinds run `run_id` so that step `to` (a completed step's name, or its
/// index) runs next, on the state as it was after the step before it,
/// rebuilt from the run's per-step history. The steps from `to` on run again
/// at the next `run` or by a worker; the record's audit entry lists them as
/// their history had them (the history rows themselves are replaced as they
/// run again). Decisions stay in the record, but a rewound gate waits for a
/// new one: its old decisions no longer answer any wait.
///
/// Needs a store that keeps per-step history ([`History`](crate::store::History)). A run
/// that a live process holds is refused with [`Error::Held`]: cancel it, or
/// wait for it to stop. Works on durable functions the same way: the code
/// replays the steps before `to` and goes live there, and the divergence
/// check still applies.
pub async fn rewind<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    to: &str,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    check_operator(run_id, "rewind", by)?;
    let mut contended = None;
    for _ in 0..10 {
        let mut cp = load(store, run_id, "rewind").await?;
        check_not_held(&cp, clock.now())?;
        check_not_building(&cp, "rewind")?;
        let at = step_index(&cp, to, "rewind")?;
        let history = full_history(store, &cp, "rewind").await?;
        check_nameable(&cp, &history, at, "rewind")?;
        let state = state_before(&cp, &history, at);
        let now = clock.now();
        let rewound: Vec<RewoundStep> = history
            .iter()
            .filter(|r| r.index >= at)
            .take(MAX_REWOUND_LISTED)
            .map(|r| RewoundStep {
                index: r.index,
                name: r.name.clone(),
                attempt: r.attempt,
                started_at: r.started_at,
                finished_at: r.finished_at,
            })
            .collect();
        let more = (cp.next - at).saturating_sub(rewound.len());
        let action = AuditAction::Rewind {
            to: at,
            step: cp.completed[at].clone(),
            from: cp.next,
            was: cp.status,
            rewound,
            more,
        };
        cp.completed.truncate(at);
        // A decision at a gate that runs again answered a wait that is
        // over: it no longer matches any wait, so the gate waits for a new
        // one (it stays in the record as who decided what, when).
        let kept: HashSet<&str> = cp.completed.iter().map(String::as_str).collect();
        for d in &mut cp.decisions {
            if !kept.contains(d.gate.as_str()) {
                d.waited_since = None;
            }
        }
        cp.next = at;
        cp.state = state;
        cp.status = RunStatus::Running;
        cp.error = None;
        cp.attempts = 0;
        cp.wait = None;
        cp.lease = None;
        cp.updated_at = now;
        cp.push_audit(AuditEntry::new(action, by, now));
        match cas_save(store, &mut cp).await {
            Ok(()) => return Ok(cp),
            Err(e) if e.kind() == StoreErrorKind::Conflict => contended = Some(e),
            Err(e) => return Err(store_error(run_id, "save of the rewind", e)),
        }
    }
    Err(contention(run_id, "save of the rewind", contended))
}

/// Creates run `new_id` as a copy of run `run_id` up to, not including,
/// step `at` (a completed step's name, or its index): the same workflow,
/// the state as it was after the step before `at`, and the history rows of
/// the steps below it. The new run resumes at `at` with a fresh attempt
/// budget; the original is not written at all.
///
/// The new run is written step by step (one save per copied step, each
/// carrying its history row), marked cancelled (with an audit entry saying
/// why) so that no worker takes it half built; the last save makes it
/// runnable. A fork cut short stays marked: delete it and fork again. Fails with
/// [`Error::InvalidInput`] when `new_id` exists already, and needs a store
/// that keeps per-step history.
pub async fn fork<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    at: &str,
    new_id: &str,
    by: &str,
    clock: &dyn Clock,
) -> Result<Checkpoint, Error> {
    check_operator(run_id, "fork", by)?;
    crate::validate_run_id(new_id)?;
    if new_id == run_id {
        return Err(refused(
            run_id,
            "fork",
            "the new run's id is the original's".into(),
        ));
    }
    let original = load(store, run_id, "fork").await?;
    let index = step_index(&original, at, "fork")?;
    let history = full_history(store, &original, "fork").await?;
    check_nameable(&original, &history, index, "fork")?;
    let now = clock.now();
    let mut cp = Checkpoint::new(new_id, &original.workflow, now);
    // Started with what the original was started with, in its place in
    // the queue.
    cp.origin = original.origin.clone();
    cp.queue = original.queue.clone();
    // A pruned history starts at its fold row: the steps below it are
    // recorded by name only.
    let first = history.first().map_or(0, |r| r.index).min(index);
    cp.completed = original.completed[..first].to_vec();
    cp.next = first;
    // What the run started with, then the copied steps' updates below.
    cp.state = start_state(&original, &history);
    let gates: HashSet<&str> = original.completed[..index]
        .iter()
        .map(String::as_str)
        .collect();
    cp.decisions = original
        .decisions
        .iter()
        .filter(|d| gates.contains(d.gate.as_str()))
        .cloned()
        .collect();
    let step = original.completed[index].clone();
    cp.push_audit(AuditEntry::new(
        AuditAction::Fork {
            from_run: run_id.to_string(),
            at: index,
            step,
        },
        by,
        now,
    ));
    // Not runnable while it is built: a fork cut short says so, and is
    // never taken by a worker nor deleted by retention; its age is the
    // time the fork began. The last save makes it runnable.
    let finished_audit = cp.audit.clone();
    let building = index > first;
    if building {
        use crate::record::checkpoint::{FORK_MARK, FORK_MARK_END};
        cp.mark_building(format!("{FORK_MARK}{run_id:?}{FORK_MARK_END}"), by, now);
    }
    let what = |e: StoreError| match e.kind() {
        StoreErrorKind::Conflict => Error::InvalidInput {
            what: format!("the fork of run {run_id:?} as {new_id:?}"),
            reason: format!("run {new_id:?} exists already; nothing was written"),
        },
        _ => store_error(new_id, "save of the fork", e),
    };
    let mut expected = None;
    cp.writer = fastrand::u64(1..);
    expected = Some(
        store
            .save(SaveRequest::new(&cp, expected))
            .await
            .map_err(what)?,
    );
    for record in history.iter().filter(|r| r.index < index) {
        crate::record::state::merge_ref(&mut cp.state, &record.update);
        let name = &original.completed[record.index];
        cp.completed.push(name.clone());
        cp.next += 1;
        cp.writer = fastrand::u64(1..);
        // The row under the name the record gives the step now: a run
        // relabelled (an accepted change, a migration) keeps its old names
        // in its own rows, and a store rebuilds names from rows.
        let renamed;
        let record = if record.name == *name {
            record
        } else {
            let mut r = record.clone();
            r.name = name.clone();
            renamed = r;
            &renamed
        };
        let v = store
            .save(SaveRequest::new(&cp, expected).with_step(record))
            .await
            .map_err(|e| store_error(new_id, &format!("copy of step {}", record.index), e))?;
        expected = Some(v);
    }
    if building {
        cp.status = RunStatus::Running;
        cp.updated_at = clock.now();
        cp.audit = finished_audit;
        cp.writer = fastrand::u64(1..);
        expected = Some(
            store
                .save(SaveRequest::new(&cp, expected).head_only())
                .await
                .map_err(|e| store_error(new_id, "save of the finished fork", e))?,
        );
    }
    cp.version = expected.unwrap_or(1);
    Ok(cp)
}

/// Deletes run `run_id`, unless a live process holds it: that is refused
/// with [`Error::Held`] and the run is left as it is, unless `force` is
/// set. Returns whether the run existed.
///
/// What `force` costs: the holder's step that is running goes on (its side
/// effects happen), but its result is never saved; the holder's next save
/// is refused and it stops, saying the run was deleted. A forced delete does
/// not read the run first, so a run that cannot be loaded (damaged, or
/// sealed with a key that is gone) is deleted too.
///
/// The run is deleted on condition of the version that was looked at
/// ([`Store::delete_if`]), so that a run claimed meanwhile is looked at
/// again, never deleted on old news.
pub async fn delete<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    force: bool,
    clock: &dyn Clock,
) -> Result<bool, Error> {
    crate::validate_run_id(run_id)?;
    if force {
        // Unread: a run that cannot be loaded (damaged, or sealed with a
        // key that is gone) can still be deleted.
        return store
            .delete(run_id)
            .await
            .map_err(|e| store_error(run_id, "delete", e));
    }
    let mut contended = None;
    for _ in 0..10 {
        let Some(cp) = store.load(run_id).await.map_err(|e| {
            store_error(
                run_id,
                "load to check that no live process holds the run (--force deletes it unread)",
                e,
            )
        })?
        else {
            return Ok(false);
        };
        check_not_held(&cp, clock.now())?;
        match store.delete_if(run_id, cp.version).await {
            Ok(existed) => return Ok(existed),
            Err(e) if e.kind() == StoreErrorKind::Conflict => contended = Some(e),
            Err(e) if e.kind() == StoreErrorKind::Unsupported => {
                return store
                    .delete(run_id)
                    .await
                    .map_err(|e| store_error(run_id, "delete", e));
            }
            Err(e) => return Err(store_error(run_id, "delete", e)),
        }
    }
    Err(contention(run_id, "delete", contended))
}

/// What [`prune`] did to one run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// The step whose history row now holds the merged updates of every
    /// step up to it.
    pub folded_into: usize,
    /// History rows deleted.
    pub rows_deleted: usize,
}

/// Folds the per-step history of run `run_id` so that only the rows of
/// its last `keep` steps stay as they were: the row of the step before
/// them takes the merged updates of every step up to it, and the rows
/// below it are deleted. [`rewind`] and [`fork`] can still name each of
/// the last `keep` steps (the state before each is rebuilt from the fold
/// row and the rows after it); older steps keep their names in the record.
/// `show` and `history` list the rows from the fold row on.
///
/// Returns `None` when there is nothing to fold (at most `keep + 1` rows
/// left). First saves the record whole (so that no row is still merged by
/// a load), then folds in one write; a run held by a live process is
/// refused with [`Error::Held`]. Needs a store that can fold history
/// ([`StoreExt::fold_history`](crate::store::StoreExt::fold_history)). The prune is audited.
pub async fn prune<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    keep: usize,
    by: &str,
    clock: &dyn Clock,
) -> Result<Option<Pruned>, Error> {
    check_operator(run_id, "prune", by)?;
    let mut cp = load(store, run_id, "prune").await?;
    check_not_held(&cp, clock.now())?;
    check_not_building(&cp, "prune")?;
    // A run without rows (written before its store kept history) has
    // nothing to fold.
    if matches!(store.history(run_id).await, Ok(Some(h)) if h.is_empty()) {
        return Ok(None);
    }
    let history = full_history(store, &cp, "prune").await?;
    let first = history.first().map_or(cp.next, |r| r.index);
    let Some(fold_at) = cp.next.checked_sub(keep.saturating_add(1)) else {
        return Ok(None);
    };
    if fold_at <= first {
        return Ok(None);
    }
    let mut merged = crate::record::state::Update::new();
    for r in history.iter().filter(|r| r.index <= fold_at) {
        for (k, v) in &r.update {
            merged.insert(k.clone(), v.clone());
        }
    }
    let row = &history[fold_at - first];
    // What the folded row's own step ran as, not an earlier step's.
    let step_key = crate::record::state::STEP_KEY;
    merged.remove(step_key);
    if let Some(v) = row.update.get(step_key) {
        merged.insert(step_key.to_string(), v.clone());
    }
    let fold = StepRecord::new(
        fold_at,
        &row.name,
        merged,
        row.attempt,
        row.started_at,
        row.finished_at,
    );
    // The record whole, unchanged: a snapshot, so that no row is still
    // merged by a load. Then the fold, then the audit entry.
    cas_save(store, &mut cp)
        .await
        .map_err(|e| store_error(run_id, "save before the prune", e))?;
    store
        .fold_history(run_id, cp.version, &fold)
        .await
        .map_err(|e| match e.kind() {
            StoreErrorKind::Unsupported => refused(run_id, "prune", format!("{e}")),
            _ => store_error(run_id, "folding the history", e),
        })?;
    // `updated_at` stays: retention and the stuck labels judge a run by
    // its last change, and a prune changes nothing of it.
    let now = clock.now();
    cp.push_audit(AuditEntry::new(
        AuditAction::Prune {
            folded_into: fold_at,
            step: row.name.clone(),
        },
        by,
        now,
    ));
    cp.writer = fastrand::u64(1..);
    if let Err(e) = store
        .save(SaveRequest::new(&cp, Some(cp.version)).head_only())
        .await
    {
        // The fold stands; only its audit entry is missing.
        tracing::warn!(run_id, error = %crate::record::error::chain(&e), "the prune is done, but its audit entry could not be saved");
    }
    Ok(Some(Pruned {
        folded_into: fold_at,
        rows_deleted: fold_at - first,
    }))
}

/// The state a run had after its first `at` steps: what it started with
/// and the updates of those steps, in order.
fn state_before(cp: &Checkpoint, history: &[StepRecord], at: usize) -> State {
    let mut state = start_state(cp, history);
    for record in history.iter().filter(|r| r.index < at) {
        crate::record::state::merge_ref(&mut state, &record.update);
    }
    state
}

/// The state `cp` started with: the keys of its state that no recorded
/// step wrote (less the engine's result), and the input [`start`](crate::start)
/// kept under [`START_KEY`](crate::record::keys::START_KEY) for the keys a step
/// overwrote since.
fn start_state(cp: &Checkpoint, history: &[StepRecord]) -> State {
    let written: HashSet<&str> = history
        .iter()
        .flat_map(|r| r.update.keys().map(String::as_str))
        .collect();
    let mut state: State = cp
        .state
        .iter()
        .filter(|(k, _)| !written.contains(k.as_str()) && !ENGINE_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(serde_json::Value::Object(input)) = cp.state.get(crate::record::keys::START_KEY) {
        for (k, v) in input {
            if written.contains(k.as_str()) {
                state.insert(k.clone(), v.clone());
            }
        }
    }
    state
}

/// The index of the completed step `step` names (its name, or its index in
/// digits when no step has that name).
fn step_index(cp: &Checkpoint, step: &str, op: &str) -> Result<usize, Error> {
    if let Some(i) = cp.completed.iter().position(|n| n == step) {
        return Ok(i);
    }
    if let Ok(i) = step.parse::<usize>() {
        if i < cp.next {
            return Ok(i);
        }
    }
    let done = if cp.completed.is_empty() {
        "it has completed no step".to_string()
    } else {
        format!(
            "its completed steps are {}",
            crate::record::ids::preview(&cp.completed.join(", "))
        )
    };
    Err(refused(
        &cp.run_id,
        op,
        format!(
            "{:?} names no completed step (by name or index); {done}",
            crate::record::ids::preview(step)
        ),
    ))
}

/// Whether `history` holds one row per completed step from its first row
/// on: rows from 0, or (after a [`prune`]) from the row that the older ones
/// were folded into. Names are not compared: a record relabelled when
/// changed code was accepted keeps rows under the old names.
pub(crate) fn history_is_whole(cp: &Checkpoint, history: &[StepRecord]) -> bool {
    if history.is_empty() {
        return cp.next == 0;
    }
    let first = history.first().map_or(cp.next, |r| r.index);
    history.len() == cp.next - first.min(cp.next)
        && history
            .iter()
            .enumerate()
            .all(|(i, r)| r.index == first + i && r.index < cp.next)
}

/// The step index from which [`rewind`] and [`fork`] can rebuild the
/// state: 0, or after a [`prune`] one past the row the older rows were
/// folded into.
fn first_nameable(history: &[StepRecord]) -> usize {
    match history.first() {
        Some(r) if r.index > 0 => r.index + 1,
        _ => 0,
    }
}

/// Refuses step `at` when the history it needs was folded away.
fn check_nameable(
    cp: &Checkpoint,
    history: &[StepRecord],
    at: usize,
    op: &str,
) -> Result<(), Error> {
    let from = first_nameable(history);
    if at < from {
        let nameable = if from >= cp.next {
            "no step can be named any more (the prune kept no row)".to_string()
        } else {
            format!("the steps that can be named are {from} to {}", cp.next - 1)
        };
        return Err(refused(
            &cp.run_id,
            op,
            format!(
                "the history of steps 0 to {} was pruned (folded into the row of step {}), so the state before step {at} cannot be rebuilt; {nameable}",
                from - 1,
                from - 1
            ),
        ));
    }
    Ok(())
}

/// The run's history, checked to hold one row per completed step (from
/// 0, or from the row a prune folded the older ones into) whose name is
/// the record's.
async fn full_history<S: Store + ?Sized>(
    store: &S,
    cp: &Checkpoint,
    op: &str,
) -> Result<Vec<StepRecord>, Error> {
    let run_id = &cp.run_id;
    let history = match store.history(run_id).await {
        Ok(Some(h)) => h,
        Ok(None) => return Err(Error::NoSuchRun {
            run_id: run_id.clone(),
        }),
        Err(e) if e.kind() == StoreErrorKind::Unsupported => {
            return Err(refused(
                run_id,
                op,
                format!("the state before a step is rebuilt from the per-step history, and this store keeps none ({e}); use a SQLite, PostgreSQL or Cosmos DB store"),
            ))
        }
        Err(e) => return Err(store_error(run_id, "reading the history", e)),
    };
    if history.is_empty() && cp.next > 0 {
        return Err(refused(
            run_id,
            op,
            "the run has no per-step history (it was written, or copied from, a store that keeps none), so the state before a step cannot be rebuilt".into(),
        ));
    }
    if !history_is_whole(cp, &history) {
        return Err(store_error(
            run_id,
            "reading the history",
            StoreError::Corrupt {
                location: format!("the history of run {run_id:?}"),
                reason: format!(
                    "{} rows do not match the {} completed steps of the record",
                    history.len(),
                    cp.next
                ),
            },
        ));
    }
    Ok(history)
}

/// Refuses a run that a fork, a copy or an import is still writing.
pub(crate) fn check_not_building(cp: &Checkpoint, op: &str) -> Result<(), Error> {
    if cp.being_built() {
        return Err(refused(
            &cp.run_id,
            op,
            "it is being written by a fork, a copy or an import (or one of them stopped half way): finish that, or delete the run".into(),
        ));
    }
    Ok(())
}

/// Refuses a run that a live process other than this one holds.
pub(crate) fn check_not_held(cp: &Checkpoint, now: Timestamp) -> Result<(), Error> {
    if let Some(held) = &cp.lease {
        if standing(held, &crate::current_owner(), now) == Standing::Held {
            return Err(Error::Held {
                run_id: cp.run_id.clone(),
                holder: held.owner.clone(),
                until: held.until,
            });
        }
    }
    Ok(())
}

/// Loads, changes with `apply` and saves by compare-and-swap, again when a
/// concurrent save (a lease renewal) moved the version.
async fn modify<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    op: &str,
    clock: &dyn Clock,
    mut apply: impl FnMut(&mut Checkpoint, Timestamp) -> Result<(), Error>,
) -> Result<Checkpoint, Error> {
    let what = format!("save of the {op}");
    let mut contended = None;
    for _ in 0..10 {
        let mut cp = load(store, run_id, op).await?;
        let now = clock.now();
        apply(&mut cp, now)?;
        cp.updated_at = now;
        match cas_save(store, &mut cp).await {
            Ok(()) => return Ok(cp),
            Err(e) if e.kind() == StoreErrorKind::Conflict => contended = Some(e),
            Err(e) => return Err(store_error(run_id, &what, e)),
        }
    }
    Err(contention(run_id, &what, contended))
}

/// Saves `cp` over the version it was loaded at. After an unknown outcome,
/// reloads and recognises its own write by the writer number.
async fn cas_save<S: Store + ?Sized>(store: &S, cp: &mut Checkpoint) -> Result<(), StoreError> {
    cp.writer = fastrand::u64(1..);
    let req = SaveRequest::new(cp, Some(cp.version));
    let new_version = req.new_version();
    match store.save(req).await {
        Ok(v) => {
            cp.version = v;
            Ok(())
        }
        Err(e) if e.kind() == StoreErrorKind::OutcomeUnknown => {
            match store.load(&cp.run_id).await {
                Ok(Some(s)) if s.version == new_version && s.writer == cp.writer => {
                    cp.version = new_version;
                    Ok(())
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

async fn load<S: Store + ?Sized>(store: &S, run_id: &str, op: &str) -> Result<Checkpoint, Error> {
    crate::validate_run_id(run_id)?;
    store
        .load(run_id)
        .await
        .map_err(|e| store_error(run_id, &format!("load for the {op}"), e))?
        .ok_or_else(|| Error::NoSuchRun {
            run_id: run_id.to_string(),
        })
}

fn contention(run_id: &str, what: &str, e: Option<StoreError>) -> Error {
    store_error(
        run_id,
        what,
        e.unwrap_or_else(|| StoreError::Conflict {
            run_id: run_id.to_string(),
            expected: None,
            found: None,
        }),
    )
}

fn refused(run_id: &str, op: &str, reason: String) -> Error {
    Error::InvalidInput {
        what: format!("the {op} of run {run_id:?}"),
        reason: format!("{reason}; nothing was written"),
    }
}

/// Checks who operates: a name like a step's.
fn check_operator(run_id: &str, op: &str, by: &str) -> Result<(), Error> {
    crate::record::ids::check_step_name(by).map_err(|reason| Error::InvalidInput {
        what: format!(
            "the name of who performs the {op} of run {run_id:?} ({:?})",
            crate::record::ids::preview(by)
        ),
        reason: format!("{reason}; nothing was written"),
    })
}
