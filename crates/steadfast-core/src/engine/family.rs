//! Child runs on the store: starting one, retrying one for its parent,
//! marking a waiting parent due when a child ends, and passing a cancel
//! from a parent to its children (see [`record::family`](crate::record::family)).
//!
//! A parent that waits for children holds no process: it is saved waiting,
//! and a child's end marks it due (a compare-and-swap on the parent, as a
//! signal does). A parent that finds its children still going saves its
//! wait and then looks at them again, so a child that ended meanwhile is
//! never missed: either the child sees the wait and marks it, or the parent
//! sees the child. A child whose process died between its end and the mark
//! is found at the wait's recheck time.

use serde_json::Value;

use crate::record::checkpoint::{Checkpoint, RunStatus, Wait};
use crate::record::clock::{Clock, Timestamp};
use crate::record::error::{StoreError, StoreErrorKind};
use crate::record::family::{ended, ParentLink, PARENT_AUDITOR, PARENT_KEY};
use crate::record::keys::INPUT_KEY;
use crate::store::{SaveRequest, Store};

/// How long a parent waiting for children stands before a worker looks at
/// them all the same: 10 minutes.
pub const CHILDREN_RECHECK: std::time::Duration = std::time::Duration::from_secs(600);

/// Records child run `id` of `workflow` with `input`, belonging to step
/// `link.step` of run `link.run`, as pending for a worker. Returns the
/// record found instead when the id is taken (by this child, started
/// before, or by another run). The child takes the parent's place in the
/// workers' queue (`queue`): a parent's priority reaches the children it
/// waits for.
pub(crate) async fn start_child<S: Store + ?Sized>(
    store: &S,
    id: &str,
    workflow: &str,
    input: Value,
    link: &ParentLink,
    now: Timestamp,
    queue: Option<&crate::record::queue::Queue>,
) -> Result<Option<Checkpoint>, StoreError> {
    let mut cp = Checkpoint::new(id, workflow, now);
    cp.status = RunStatus::Pending;
    cp.queue = queue.cloned();
    cp.state.insert(INPUT_KEY.into(), input);
    cp.state.insert(PARENT_KEY.into(), link.to_value());
    for _ in 0..3 {
        match store.save(SaveRequest::new(&cp, None)).await {
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == StoreErrorKind::Conflict => {
                if let Some(found) = store.load(id).await? {
                    return Ok(Some(found));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "child run {id:?} kept appearing and disappearing while it was started"
    )))
}

/// Saves `cp` over the version it was loaded at, as `what` did.
async fn swap<S: Store + ?Sized>(store: &S, cp: &mut Checkpoint) -> Result<(), StoreError> {
    cp.writer = fastrand::u64(1..);
    let v = store.save(SaveRequest::new(cp, Some(cp.version))).await?;
    cp.version = v;
    Ok(())
}

/// Retries failed child `id` for its parent: cleared as
/// [`retry`](crate::ops::retry) does, by [`PARENT_AUDITOR`], so that a
/// worker takes it again. Returns `false` when the child is not failed any
/// more (someone retried it first), or a process holds it (someone runs it
/// by hand): either way it is under way.
pub(crate) async fn retry_child<S: Store + ?Sized>(
    store: &S,
    id: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    for _ in 0..10 {
        let Some(mut cp) = store.load(id).await? else {
            return Ok(false);
        };
        if cp.lease.as_ref().is_some_and(|l| l.until > now) {
            return Ok(false);
        }
        if cp.mark_retried(PARENT_AUDITOR, now).is_err() {
            return Ok(false);
        }
        cp.updated_at = now;
        match swap(store, &mut cp).await {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "child run {id:?} kept changing while it was retried"
    )))
}

/// How many times in a row `cp`'s parent retried it: its parent's retries
/// since its last retry by anyone else (a person retrying the child, or its
/// parent, gives it a fresh budget). Counted in its audit, which keeps the
/// last [`MAX_AUDIT_ENTRIES`](crate::MAX_AUDIT_ENTRIES) entries: a parent's
/// retries are at most [`MAX_CHILD_ATTEMPTS`] - 1.
pub(crate) fn parent_retries(cp: &Checkpoint) -> u32 {
    let mut n = 0;
    for a in cp.audit.iter().rev() {
        if !matches!(
            a.action,
            crate::record::checkpoint::AuditAction::Retry { .. }
        ) {
            continue;
        }
        if a.by != PARENT_AUDITOR {
            break;
        }
        n += 1;
    }
    n
}

/// The most attempts a parent makes of one child: 32 (its retries are
/// counted in the child's audit, which keeps 64 entries).
pub const MAX_CHILD_ATTEMPTS: u32 = 32;

/// After failed run `cp` was retried by `by`: if the step that failed
/// started a child that failed, the child is retried too (a fresh budget,
/// by `by`), so that the run's next call waits for it again instead of
/// failing at once. Best effort: logged when it cannot be done.
pub(crate) async fn retried<S: Store + ?Sized>(
    store: &S,
    cp: &Checkpoint,
    step: &str,
    by: &str,
    clock: &dyn Clock,
) {
    let id = crate::record::family::child_id(&cp.run_id, step);
    let result = async {
        for _ in 0..10 {
            let Some(mut child) = store.load(&id).await? else {
                return Ok(());
            };
            let ours = ParentLink::of(&child.state).is_some_and(|l| {
                l.run == cp.run_id && l.step == step && l.created == cp.created_at
            });
            let now = clock.now();
            if !ours || child.mark_retried(by, now).is_err() {
                return Ok(());
            }
            child.updated_at = now;
            match swap(store, &mut child).await {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::unavailable(format!(
            "child run {id:?} kept changing while it was retried"
        )))
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(run_id = %cp.run_id, child = %id, error = %e, "the run was retried, but its failed child was not; retry the child too");
    }
}

/// Marks `parent` due when it waits for child `child` and no process holds
/// it (compare-and-swap; a parent that moved on needs nothing, and a holder
/// looks at its children itself after saving its wait).
pub(crate) async fn wake_parent<S: Store + ?Sized>(
    store: &S,
    parent: &str,
    child: &str,
    clock: &dyn Clock,
) -> Result<(), StoreError> {
    for _ in 0..10 {
        let Some(mut cp) = store.load(parent).await? else {
            return Ok(());
        };
        match (&cp.status, &mut cp.wait, &cp.lease) {
            (RunStatus::Waiting, Some(Wait::Children { runs, arrived, .. }), None)
                if !*arrived && runs.iter().any(|r| r == child) =>
            {
                *arrived = true
            }
            _ => return Ok(()),
        }
        cp.updated_at = clock.now();
        match swap(store, &mut cp).await {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "run {parent:?} kept changing while it was marked due for child {child:?}"
    )))
}

/// After run `cp` was saved ended: marks its parent due, if it is a child.
/// Best effort: a failure is logged, and the parent finds the child at its
/// recheck time.
pub(crate) async fn ended_child<S: Store + ?Sized>(store: &S, cp: &Checkpoint, clock: &dyn Clock) {
    if !ended(cp.status) {
        return;
    }
    let Some(link) = ParentLink::of(&cp.state) else {
        return;
    };
    if let Err(e) = wake_parent(store, &link.run, &cp.run_id, clock).await {
        tracing::warn!(run_id = %cp.run_id, parent = %link.run, error = %e, "a child run ended, but its parent was not marked due; it looks again at its recheck time");
    }
}

/// After run `cp` was cancelled (with children `running` under way, as its
/// wait listed them): cancels those children, and theirs, and marks its own
/// parent due. Best effort: a child that could not be cancelled is logged,
/// and cancels itself when it next runs and finds its parent cancelled.
pub(crate) async fn cancelled<S: Store + ?Sized>(
    store: &S,
    cp: &Checkpoint,
    running: Vec<String>,
    clock: &dyn Clock,
) {
    ended_child(store, cp, clock).await;
    let mut todo: Vec<(String, (String, Timestamp))> = running
        .into_iter()
        .map(|c| (c, (cp.run_id.clone(), cp.created_at)))
        .collect();
    let mut done = 0usize;
    while let Some((id, parent)) = todo.pop() {
        done += 1;
        if done > 100_000 {
            tracing::warn!(run_id = %cp.run_id, "stopped cancelling descendants after 100000 runs");
            return;
        }
        match cancel_child(store, &id, &parent, clock).await {
            Ok(Some((more, created))) => {
                todo.extend(more.into_iter().map(|c| (c, (id.clone(), created))))
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(run_id = %id, parent = %parent.0, error = %e, "could not cancel a child of a cancelled run; it cancels itself when it runs next")
            }
        }
    }
}

/// Cancels child `id` of `parent` (its id and creation time; only if it is
/// that parent's child), returning the children it had under way and its
/// own creation time, or `None` when it was not cancelled now.
async fn cancel_child<S: Store + ?Sized>(
    store: &S,
    id: &str,
    parent: &(String, Timestamp),
    clock: &dyn Clock,
) -> Result<Option<(Vec<String>, Timestamp)>, StoreError> {
    for _ in 0..10 {
        let Some(mut cp) = store.load(id).await? else {
            return Ok(None);
        };
        // Only the child itself: a fork or copy of it keeps its link.
        let ours = ParentLink::of(&cp.state).is_some_and(|l| {
            l.run == parent.0
                && l.created == parent.1
                && cp.run_id == crate::record::family::child_id(&l.run, &l.step)
        });
        if !ours {
            return Ok(None);
        }
        let running = match &cp.wait {
            Some(Wait::Children { runs, .. }) => runs.clone(),
            _ => Vec::new(),
        };
        let now = clock.now();
        let reason = format!("its parent run {:?} was cancelled", parent.0);
        if cp
            .mark_cancelled(Some(reason), PARENT_AUDITOR, now)
            .is_err()
        {
            return Ok(None);
        }
        cp.updated_at = now;
        match swap(store, &mut cp).await {
            Ok(()) => return Ok(Some((running, cp.created_at))),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "child run {id:?} kept changing while it was cancelled"
    )))
}

/// For a child about to run: cancels it (and returns the cancelled record)
/// when its parent was cancelled, which covers a child started just before
/// its parent's cancel, or one the cancel could not reach.
pub(crate) async fn orphaned<S: Store + ?Sized>(
    store: &S,
    cp: &Checkpoint,
    clock: &dyn Clock,
) -> Result<Option<Checkpoint>, StoreError> {
    let Some(link) = ParentLink::of(&cp.state) else {
        return Ok(None);
    };
    if ended(cp.status) || cp.run_id != crate::record::family::child_id(&link.run, &link.step) {
        return Ok(None);
    }
    let Some(parent) = store.load(&link.run).await? else {
        return Ok(None);
    };
    if parent.status != RunStatus::Cancelled || parent.created_at != link.created {
        return Ok(None);
    }
    let Some((running, _)) =
        cancel_child(store, &cp.run_id, &(link.run.clone(), link.created), clock).await?
    else {
        return Ok(None);
    };
    let now = store.load(&cp.run_id).await?;
    if let Some(cancelled_cp) = &now {
        cancelled(store, cancelled_cp, running, clock).await;
    }
    Ok(now)
}
