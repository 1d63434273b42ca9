//! The engine under both run loops (listed steps and durable functions): the
//! runner, its options and store, the judgement of leases, and the errors a
//! run returns. The operations on a run's record are the session's.

pub(crate) mod budget;
pub mod ctx;
pub mod decide;
pub mod durable;
pub(crate) mod emit;
pub mod family;
pub(crate) mod limit;
pub mod metrics;
pub mod process;
pub mod run;
pub mod session;
pub mod signal;
pub(crate) mod spend;
pub mod typed;
pub mod workflow;

use std::sync::Arc;
use std::time::Duration;

use crate::engine::workflow::Workflow;
use crate::record::checkpoint::{Checkpoint, Lease, Owner};
use crate::record::clock::Timestamp;
use crate::record::clock::{Clock, SystemClock};
pub(crate) use crate::record::error::store_error;
use crate::record::error::{Error, StepError, StepErrorKind, StoreError};
use crate::record::outcome::Event;
use crate::store::Store;
use crate::store::StoreExt as _;

/// How long a running step may go on after its run was cancelled, unless
/// [`Runner::cancel_grace`] says otherwise.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

type Observer = Arc<dyn Fn(&Event<'_>) + Send + Sync>;
type TakeoverHook = Arc<dyn Fn(&Lease) + Send + Sync>;
type SlotHook = Arc<dyn Fn(&Owner, &str) + Send + Sync>;

/// The run loop with options: a clock, an observer, and whether to accept
/// changed code.
pub struct Runner<'s, S: Store + ?Sized> {
    pub(crate) store: StoreRef<'s, S>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) observer: Option<Observer>,
    pub(crate) accept_changed_workflow: bool,
    pub(crate) lease: Option<(Owner, Duration)>,
    pub(crate) wait_for_timers: bool,
    pub(crate) takeover: Option<TakeoverHook>,
    pub(crate) slot_reclaimed: Option<SlotHook>,
    pub(crate) cancel_grace: Duration,
    pub(crate) budget: Option<std::collections::BTreeMap<String, f64>>,
    /// Set by a worker to the record version at which it found the run due:
    /// it takes the run only as it found it. A run that changed since (another
    /// worker ran, parked, finished or pinned it to a version between the
    /// look and the load) is a missed claim, to be looked at again, never a
    /// run this call completed or a workflow it must refuse.
    pub(crate) found_due_at: Option<u64>,
    #[cfg(feature = "mutants")]
    pub(crate) mutant_skip_reload_after_unknown: bool,
    #[cfg(feature = "mutants")]
    pub(crate) mutant_blind_lease_renewal: bool,
}

/// The store a runner works on: borrowed by [`Runner::new`], shared by the
/// runner a durable function's context keeps.
pub(crate) enum StoreRef<'s, S: ?Sized> {
    Borrowed(&'s S),
    Shared(Arc<S>),
}

impl<S: ?Sized> std::ops::Deref for StoreRef<'_, S> {
    type Target = S;
    fn deref(&self) -> &S {
        match self {
            StoreRef::Borrowed(s) => s,
            StoreRef::Shared(s) => s,
        }
    }
}

impl<S: Store + ?Sized> std::fmt::Debug for Runner<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("clock", &self.clock)
            .field("accept_changed_workflow", &self.accept_changed_workflow)
            .finish_non_exhaustive()
    }
}

/// How long the look that explains a conflict (deleted, replaced,
/// cancelled?) waits for the store before the conflict is reported as it is.
const EXPLAIN_LOOK: std::time::Duration = std::time::Duration::from_secs(10);

impl<'s, S: Store + ?Sized> Runner<'s, S> {
    /// A runner on `store` with the store's clock ([`Capabilities::clock`](crate::store::Capabilities::clock): the
    /// database server's, for PostgreSQL), or else the system clock.
    pub fn new(store: &'s S) -> Self {
        Runner {
            store: StoreRef::Borrowed(store),
            clock: store.clock().unwrap_or_else(|| Arc::new(SystemClock)),
            observer: None,
            accept_changed_workflow: false,
            lease: None,
            wait_for_timers: false,
            takeover: None,
            slot_reclaimed: None,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            budget: None,
            found_due_at: None,
            #[cfg(feature = "mutants")]
            mutant_skip_reload_after_unknown: false,
            #[cfg(feature = "mutants")]
            mutant_blind_lease_renewal: false,
        }
    }

    /// A runner with the same options on another handle to the store.
    fn with_store<'t>(&self, store: StoreRef<'t, S>) -> Runner<'t, S> {
        Runner {
            store,
            clock: Arc::clone(&self.clock),
            observer: self.observer.clone(),
            accept_changed_workflow: self.accept_changed_workflow,
            lease: self.lease.clone(),
            wait_for_timers: self.wait_for_timers,
            takeover: self.takeover.clone(),
            slot_reclaimed: self.slot_reclaimed.clone(),
            cancel_grace: self.cancel_grace,
            budget: self.budget.clone(),
            // Checked once, where a worker's call loads its run.
            found_due_at: None,
            #[cfg(feature = "mutants")]
            mutant_skip_reload_after_unknown: self.mutant_skip_reload_after_unknown,
            #[cfg(feature = "mutants")]
            mutant_blind_lease_renewal: self.mutant_blind_lease_renewal,
        }
    }

    /// A runner with the same options on the same borrowed store.
    pub(crate) fn reborrow(&self) -> Runner<'_, S> {
        self.with_store(StoreRef::Borrowed(&*self.store))
    }

    /// A runner with the same options that owns a clone of the store, for a
    /// durable function's context, which must outlive any borrow.
    pub(crate) fn to_shared(&self) -> Runner<'static, S>
    where
        S: Clone + Sized + 'static,
    {
        self.with_store(StoreRef::Shared(Arc::new((*self.store).clone())))
    }

    /// [`Error::ClaimLost`] when this runner takes only runs as it found
    /// them due and `cp` has changed since, or has already ended as
    /// completed, failed or rejected.
    pub(crate) fn check_due(&self, cp: &Checkpoint) -> Result<(), Error> {
        let Some(seen) = self.found_due_at else {
            return Ok(());
        };
        let ended = matches!(
            cp.status,
            crate::RunStatus::Completed | crate::RunStatus::Failed | crate::RunStatus::Rejected
        );
        if ended || cp.version != seen {
            return Err(Error::ClaimLost {
                run_id: cp.run_id.clone(),
            });
        }
        Ok(())
    }

    /// [`Error::ClaimLost`] when this runner takes only due runs and the
    /// run it found due is gone (deleted since): a worker never starts a
    /// run afresh.
    pub(crate) fn check_due_absent(&self, run_id: &str) -> Result<(), Error> {
        if self.found_due_at.is_some() {
            return Err(Error::ClaimLost {
                run_id: run_id.to_string(),
            });
        }
        Ok(())
    }

    /// Checks the options that have ranges (the lease's time to live, the
    /// budget).
    pub(crate) fn check_options(&self) -> Result<(), Error> {
        if let Some((_, ttl)) = &self.lease {
            crate::record::limits::LEASE
                .check("lease", *ttl)
                .map_err(|reason| Error::InvalidInput {
                    what: "the runner's lease".into(),
                    reason,
                })?;
        }
        if let Some(budget) = &self.budget {
            crate::record::spend::Spend::with_budget(budget.clone())
                .check()
                .map_err(|reason| Error::InvalidInput {
                    what: "the runner's budget".into(),
                    reason,
                })?;
        }
        Ok(())
    }

    /// Records `budget` with a run that has no budget yet (a new run, or
    /// one started without): its steps' spend
    /// ([`StepCtx::spend`](crate::StepCtx::spend)) may reach these amounts;
    /// past one, the run stops at its [`budget`](crate::BUDGET_GATE) gate
    /// before its next step. A run keeps the budget it has: raise it by
    /// approving the gate. It takes the place of a workflow's
    /// [`budget`](crate::Workflow::with_budget).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use serde_json::json;
    /// use steadfast_core::{approve, update, MemoryStore, Outcome, Runner, StepCtx, SystemClock, Workflow};
    ///
    /// let wf = Workflow::builder("agent")
    ///     .step("ask", |ctx: StepCtx, _| async move {
    ///         let _ = ctx.spend("usd", 3.0).expect("in range");
    ///         update(json!({"asked": true}))
    ///     })
    ///     .step("write", |_, _| async { update(json!({"written": true})) })
    ///     .build()?;
    /// let store = MemoryStore::new();
    /// let runner = Runner::new(&store).budget([("usd".to_string(), 2.0)].into());
    /// assert_eq!(runner.run("r", &wf).await?, Outcome::Waiting { gate: "budget".into() });
    /// approve(&store, "r", "budget", Some(json!({"usd": 5})), "ada", &SystemClock).await?;
    /// assert!(runner.run("r", &wf).await?.completed().is_some());
    /// # Ok::<(), steadfast_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn budget(mut self, budget: std::collections::BTreeMap<String, f64>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Records the budget a run starts with, when it has none yet: the
    /// runner's, else `workflow`'s.
    pub(crate) fn give_budget(
        &self,
        cp: &mut Checkpoint,
        workflow: Option<&std::collections::BTreeMap<String, f64>>,
    ) {
        let given = self.budget.as_ref().or(workflow).filter(|b| !b.is_empty());
        let Some(given) = given else { return };
        let spend = cp.spend.get_or_insert_with(Default::default);
        if spend.budget.is_empty() {
            spend.budget = given.clone();
        }
    }

    /// A lease for this runner's owner from now, on both clocks.
    pub(crate) fn fresh_lease(&self, me: &Owner, ttl: Duration) -> Lease {
        let local = crate::engine::process::local_deadline(ttl);
        Lease::new(me.clone(), self.clock.now().saturating_add(ttl)).local_until(local)
    }

    /// How often a held lease is renewed, if leases are on.
    pub(crate) fn renew_every(&self) -> Option<Duration> {
        self.lease
            .as_ref()
            .map(|(_, ttl)| (*ttl / 3).max(Duration::from_millis(10)))
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(crate) fn accepts_changed_workflow(&self) -> bool {
        self.accept_changed_workflow
    }

    pub(crate) fn store_ref(&self) -> &S {
        &self.store
    }

    /// Reads time from `clock`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Claims the run with a lease for `owner` before running, renews it every
    /// third of `ttl` while steps run, and releases it when the call stops. A
    /// run whose lease another live owner holds fails with [`Error::Held`]; a
    /// lease whose holder died (on this host) or expired is taken over; a holder
    /// whose lease was taken loses at its next save or renewal (a conflict).
    ///
    /// On one host, expiry is judged by the host's boot clock and the holder's
    /// process, never by wall clocks; across hosts, by the taker's wall clock
    /// (see `docs/durability.md`). `ttl` must lie in
    /// [`limits::LEASE`](crate::record::limits::LEASE); a run with one outside it
    /// fails with [`Error::InvalidInput`] before anything is loaded.
    pub fn lease(mut self, owner: Owner, ttl: Duration) -> Self {
        self.lease = Some((owner, ttl));
        self
    }

    /// Calls `f` with the lease this runner took over from another owner, as
    /// soon as its own claim is saved (so the old holder is already fenced out
    /// of the store) and before any step runs. The `steadfast` command uses it
    /// to kill the step processes of a runner on this host that was stopped
    /// past its lease, so that they never run beside the new ones.
    pub fn on_takeover(mut self, f: impl Fn(&Lease) + Send + Sync + 'static) -> Self {
        self.takeover = Some(Arc::new(f));
        self
    }

    /// Calls `f` with the holder and the run of each slot of a limit that
    /// this runner frees because its holder, a process on this host, has
    /// died, before the slot is given to anyone (the document that frees it
    /// is not yet saved). The `steadfast` command uses it to kill the dead
    /// holder's step processes of that run: their supervisors end them only
    /// once they hear of the death, and until then they would run beside
    /// the step that takes the slot.
    pub fn on_slot_reclaimed(mut self, f: impl Fn(&Owner, &str) + Send + Sync + 'static) -> Self {
        self.slot_reclaimed = Some(Arc::new(f));
        self
    }

    /// How long a step that is running when its run is cancelled may go on
    /// before it is dropped (for the `steadfast` command: its process group
    /// killed). The run stops either way, and the step's result is not
    /// saved. The cancel is seen at the next lease renewal (every third of
    /// the lease) or save. Default: [`DEFAULT_CANCEL_GRACE`].
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// After a call failed with a conflict, what happened to the run, from
    /// what is stored now: [`Error::Cancelled`] when it was cancelled;
    /// [`Error::Removed`] when a run this call had saved (`created_at` is
    /// when its record was created) was deleted, is being replaced by an
    /// import or a copy, or was written anew with another creation time;
    /// else the error as it was (an owner that took the run over, or a
    /// copy of this very run's record).
    pub(crate) async fn explain_conflict(
        &self,
        run_id: &str,
        created_at: Timestamp,
        e: Error,
    ) -> Error {
        // A save over a version this call had: it held the run.
        let fenced = matches!(
            e.store_error(),
            Some(StoreError::Conflict {
                expected: Some(_),
                ..
            })
        );
        if !fenced && !matches!(e, Error::ClaimLost { .. }) {
            return e;
        }
        let removed = |how| Error::Removed {
            run_id: run_id.to_string(),
            how,
        };
        // Bounded: a store that answered the write but not this look
        // leaves the error as it is. Generous, so that a slow store still
        // tells a cancelled run from a lost one; a step still running meets
        // a tighter bound (`with_renewals`).
        let Ok(found) = tokio::time::timeout(EXPLAIN_LOOK, self.store.load(run_id)).await else {
            return e;
        };
        match found {
            Ok(None) if fenced => removed(crate::Removal::Deleted),
            Ok(Some(cp)) if fenced && cp.being_built() => removed(crate::Removal::BeingReplaced),
            Ok(Some(cp)) if cp.status == crate::RunStatus::Cancelled => {
                crate::record::error::cancelled(&cp)
            }
            // Written anew: an owner that took the run over keeps its
            // record, created when it was; a record written again (by an
            // import or copy of another record, or a new run under its id)
            // was created at another time. A copy of this run's own record
            // cannot be told from a takeover, and stays a conflict.
            Ok(Some(cp)) if fenced && cp.created_at != created_at => {
                removed(crate::Removal::Replaced)
            }
            _ => e,
        }
    }

    /// Sleeps through durable timers instead of stopping at them.
    pub fn wait_for_timers(mut self, yes: bool) -> Self {
        self.wait_for_timers = yes;
        self
    }

    /// Calls `f` with each [`Event`] as the run loop goes (progress lines, metrics).
    pub fn observer(mut self, f: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(f));
        self
    }

    pub(crate) fn emit(&self, event: Event<'_>) {
        if let Some(f) = &self.observer {
            f(&event);
        }
    }

    /// Resumes a run even when its recorded steps differ from the workflow's: the
    /// record is taken to mean "this many steps are done" and is relabelled with
    /// the new step names. Use it when you changed the code on purpose.
    pub fn accept_changed_workflow(mut self, yes: bool) -> Self {
        self.accept_changed_workflow = yes;
        self
    }

    /// Test-only: renew the lease without compare-and-swap, overwriting
    /// whatever another owner saved (a deliberately broken run loop).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub fn mutant_blind_lease_renewal(mut self) -> Self {
        self.mutant_blind_lease_renewal = true;
        self
    }

    /// Test-only: after a save with an unknown outcome, skip the reload that
    /// recognises our own write (a deliberately broken run loop).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub fn mutant_skip_reload_after_unknown(mut self) -> Self {
        self.mutant_skip_reload_after_unknown = true;
        self
    }

    /// Checks a loaded record against the workflow given.
    pub(crate) fn verify(
        &self,
        mut cp: Checkpoint,
        workflow: &Workflow,
    ) -> Result<Checkpoint, Error> {
        let given: Vec<&str> = workflow.step_names().collect();
        // Before any step has run, the steps the run was started with are
        // what binds it to its code.
        let started_with = cp.origin.as_ref().filter(|_| cp.next == 0).and_then(|o| {
            let now = crate::Origin::listed(given.iter().copied());
            (!o.same_steps(&now)).then(|| {
                (
                    format!(
                        "the {} step(s) it was started with (fingerprint {})",
                        o.steps, o.steps_sha256
                    ),
                    now,
                )
            })
        });
        // A run started under a version of its workflow resumes only under
        // that version (one started without, under any).
        let other_version = cp
            .origin
            .as_ref()
            .filter(|o| !o.runs_under(workflow.version()))
            .and_then(|o| o.version.clone());
        let mismatch = if cp.workflow != workflow.name() {
            Some(Error::WorkflowChanged {
                run_id: cp.run_id.clone(),
                at: 0,
                stored: Some(format!("workflow {:?}", cp.workflow)),
                given: Some(format!("workflow {:?}", workflow.name())),
            })
        } else if let Some(had) = &other_version {
            Some(Error::WorkflowChanged {
                run_id: cp.run_id.clone(),
                at: 0,
                stored: Some(format!("version {had} of workflow {}", cp.workflow)),
                given: Some(match workflow.version() {
                    Some(v) => format!("version {v}"),
                    None => "no version".into(),
                }),
            })
        } else if let Some((stored, now)) = &started_with {
            Some(Error::WorkflowChanged {
                run_id: cp.run_id.clone(),
                at: 0,
                stored: Some(stored.clone()),
                given: Some(format!(
                    "{} step(s): {} (fingerprint {})",
                    given.len(),
                    crate::record::ids::preview(&given.join(", ")),
                    now.steps_sha256
                )),
            })
        } else {
            (0..cp.next)
                .find(|&i| given.get(i) != Some(&cp.completed[i].as_str()))
                .map(|at| Error::WorkflowChanged {
                    run_id: cp.run_id.clone(),
                    at,
                    stored: Some(cp.completed[at].clone()),
                    given: given.get(at).map(|s| s.to_string()),
                })
        };
        // Code of the run's version takes it: a worker's mark that it
        // lacked that version no longer holds.
        cp.passed_over = None;
        match mismatch {
            None => {
                // A run started without steps or a version (by name alone,
                // a child, a schedule's slot) is pinned to the code that
                // first runs it, so that a deploy does not move it mid-way.
                if cp.origin.is_none() && cp.next == 0 {
                    cp.origin = Some(
                        crate::Origin::listed(given.iter().copied()).versioned(workflow.version()),
                    );
                }
                Ok(cp)
            }
            Some(e) if !self.accept_changed_workflow => Err(e),
            Some(_) => {
                tracing::warn!(run_id = %cp.run_id, "resuming a run recorded by different code, as asked");
                cp.workflow = workflow.name().to_string();
                // The run follows the workflow given from now on: the steps
                // it counts as started with, and its version, are that
                // workflow's.
                if let Some((_, now)) = started_with {
                    cp.origin = Some(now.versioned(workflow.version()));
                } else if cp.origin.is_some() {
                    cp.origin = Some(
                        crate::Origin::listed(given.iter().copied()).versioned(workflow.version()),
                    );
                }
                let done = cp.next.min(given.len());
                cp.completed = given[..done].iter().map(|s| s.to_string()).collect();
                cp.next = done;
                Ok(cp)
            }
        }
    }
}

/// How a lease stands for someone who wants the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The asker holds it.
    Mine,
    /// Someone else holds it and it has not lapsed.
    Held,
    /// Its holder, on this host, is no longer running.
    Gone,
    /// It was not renewed in time.
    Lapsed,
}

/// Judges `held` for `me` at wall-clock time `now`. On one host, by the
/// holder's process and the boot clock; across hosts, by the wall clock.
pub(crate) fn standing(held: &Lease, me: &Owner, now: Timestamp) -> Standing {
    if held.owner == *me {
        return Standing::Mine;
    }
    let on_this_host = held.owner.host == me.host;
    if on_this_host && !crate::engine::process::is_alive(&held.owner) {
        return Standing::Gone;
    }
    if lease_left(held, now, on_this_host) > 0 {
        Standing::Held
    } else {
        Standing::Lapsed
    }
}

/// Whether `lease` still binds others, judged from this process at
/// wall-clock time `now` as the run loop judges a run's lease: a holder on
/// this host that has exited holds nothing, and on its host a lease with a
/// boot-clock deadline lapses by that clock (setting the wall clock neither
/// ends nor extends it); a holder on another host holds until `until` by
/// the wall clock. For leases kept outside a checkpoint (the graph store's
/// threads).
pub fn lease_holds(lease: &Lease, now: Timestamp) -> bool {
    match crate::engine::process::holder_is_running(&lease.owner) {
        Some(false) => false,
        Some(true) => lease_left(lease, now, true) > 0,
        None => lease_left(lease, now, false) > 0,
    }
}

/// Milliseconds until `held` lapses: by the boot clock when it has a
/// boot-clock deadline and is judged on its holder's host, else by the wall
/// clock reading `now`.
pub(crate) fn lease_left(held: &Lease, now: Timestamp, on_this_host: bool) -> u64 {
    match (held.local_until, crate::engine::process::boot_millis()) {
        (Some(deadline), Some(boot)) if on_this_host => deadline.saturating_sub(boot),
        _ => held.until.unix_millis().saturating_sub(now.unix_millis()),
    }
}

pub(crate) fn step_failed(
    run_id: &str,
    index: usize,
    step: &str,
    attempts: u32,
    err: StepError,
) -> Error {
    match err.kind {
        StepErrorKind::InvalidValue(path) => Error::InvalidValue {
            run_id: run_id.to_string(),
            index,
            step: step.to_string(),
            path,
            reason: err.source.to_string(),
        },
        kind => Error::StepFailed {
            run_id: run_id.to_string(),
            index,
            step: step.to_string(),
            attempts,
            timed_out: matches!(kind, StepErrorKind::TimedOut(_)),
            source: err.source,
        },
    }
}

/// A one-word name for how a call ended, for spans and logs.
pub(crate) fn label<T>(out: &Result<crate::record::outcome::Outcome<T>, Error>) -> &'static str {
    match out {
        Ok(crate::record::outcome::Outcome::Completed(_)) => "completed",
        Ok(crate::record::outcome::Outcome::Waiting { .. }) => "waiting",
        Ok(crate::record::outcome::Outcome::Sleeping { .. }) => "sleeping",
        Ok(crate::record::outcome::Outcome::Rejected { .. }) => "rejected",
        Err(Error::Cancelled { .. }) => "cancelled",
        Err(e) if e.is_held_elsewhere() => "held",
        Err(_) => "failed",
    }
}
