//! The engine under both run loops (listed steps and durable functions): the
//! runner's options and the operations on a run's record — claim, renew,
//! attempt, complete, fail, gate, timer and save.

use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::{
    Checkpoint, Decision, Lease, OnTimeout, Owner, RunStatus, StepFailure, StepRecord, Wait,
};
use crate::clock::Timestamp;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StepError, StepErrorKind, StoreError, StoreErrorKind};
use crate::outcome::{rejected, Event, Suspension};
use crate::state::Update;
use crate::store::{SaveRequest, Store};
use crate::workflow::{Step, Workflow};

type Observer = Arc<dyn Fn(&Event<'_>) + Send + Sync>;
type TakeoverHook = Arc<dyn Fn(&Lease) + Send + Sync>;

/// The run loop with options: a clock, an observer, and whether to accept
/// changed code.
pub struct Runner<'s, S: Store + ?Sized> {
    store: StoreRef<'s, S>,
    clock: Arc<dyn Clock>,
    observer: Option<Observer>,
    accept_changed_workflow: bool,
    lease: Option<(Owner, Duration)>,
    wait_for_timers: bool,
    takeover: Option<TakeoverHook>,
    #[cfg(feature = "mutants")]
    mutant_skip_reload_after_unknown: bool,
    #[cfg(feature = "mutants")]
    mutant_blind_lease_renewal: bool,
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

impl<'s, S: Store + ?Sized> Runner<'s, S> {
    /// A runner on `store` with the system clock.
    pub fn new(store: &'s S) -> Self {
        Runner {
            store: StoreRef::Borrowed(store),
            clock: Arc::new(SystemClock),
            observer: None,
            accept_changed_workflow: false,
            lease: None,
            wait_for_timers: false,
            takeover: None,
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

    /// Checks the options that have ranges (the lease's time to live).
    pub(crate) fn check_options(&self) -> Result<(), Error> {
        if let Some((_, ttl)) = &self.lease {
            crate::limits::LEASE
                .check("lease", *ttl)
                .map_err(|reason| Error::InvalidInput {
                    what: "the runner's lease".into(),
                    reason,
                })?;
        }
        Ok(())
    }

    /// A lease for this runner's owner from now, on both clocks.
    fn fresh_lease(&self, me: &Owner, ttl: Duration) -> Lease {
        let local = crate::process::boot_millis()
            .map(|b| b.saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64));
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
    /// [`limits::LEASE`](crate::limits::LEASE); a run with one outside it
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

    /// Records a completed step (its update already merged into the state) and
    /// saves; the last step's save also marks the run completed and releases
    /// the lease.
    ///
    /// When the save fails for any reason but a conflict (the state grew past
    /// the store's limit, the disk is full), the record is put back as it was
    /// before the step, and the failure is recorded in the store with the lease
    /// released if the store still takes that small write, so that the run
    /// reads `failed` with the cause instead of `running` under a dead lease.
    pub(crate) async fn complete(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        record: StepRecord,
        total: usize,
    ) -> Result<(), Error> {
        let (index, name, attempt) = (record.index, record.name.clone(), record.attempt);
        match self.complete_unrecorded(cp, expected, record, total).await {
            Err(e) => {
                self.record_unsaved(cp, expected, index, &name, attempt, &e)
                    .await;
                Err(e)
            }
            ok => ok,
        }
    }

    /// [`complete`](Runner::complete) without recording a failed save, for
    /// a step among others still running (a parallel branch): their batch
    /// records the failure when it is over, and keeps the lease meanwhile.
    pub(crate) async fn complete_unrecorded(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        record: StepRecord,
        total: usize,
    ) -> Result<(), Error> {
        let undo = Undo::apply(cp, &record, total);
        let what = format!("save after step {} ({})", record.index, record.name);
        match self.save(cp, expected, Some(&record)).await {
            Ok(()) => Ok(()),
            Err(err) => {
                undo.revert(cp);
                Err(store_error(&cp.run_id, &what, err))
            }
        }
    }

    /// After a step's checkpoint failed to save (`failure`), records the run
    /// as failed with the cause and releases the lease, if the store still
    /// takes that small write; so the run reads `failed`, not `running` under
    /// a dead lease. Nothing is written after a conflict: someone else owns
    /// the run.
    pub(crate) async fn record_unsaved(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        index: usize,
        step: &str,
        attempt: u32,
        failure: &Error,
    ) {
        let Some(err) = failure.store_error() else {
            return;
        };
        if err.kind() == StoreErrorKind::Conflict {
            return;
        }
        let now = self.clock.now();
        cp.status = RunStatus::Failed;
        cp.lease = None;
        cp.updated_at = now;
        cp.error = Some(StepFailure::new(
            index,
            step,
            format!(
                "the step finished but its checkpoint could not be saved: {}",
                crate::error::chain(err)
            ),
            attempt,
            true,
            now,
        ));
        if let Err(e) = self.save(cp, expected, None).await {
            tracing::warn!(run_id = %cp.run_id, step, error = %crate::error::chain(&e), "could not record that a checkpoint failed");
        }
    }

    /// Claims the run with a lease, when leases are on. Refuses a lease that
    /// someone else still holds; takes over one whose holder is gone (a dead
    /// process on this host) or whose time ran out.
    pub(crate) async fn claim(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &self.lease else {
            return Ok(());
        };
        let mut taken = None;
        if let Some(held) = &cp.lease {
            match standing(held, me, self.clock.now()) {
                Standing::Mine => {}
                Standing::Held => {
                    return Err(Error::Held {
                        run_id: cp.run_id.clone(),
                        holder: held.owner.clone(),
                        until: held.until,
                    })
                }
                Standing::Gone => {
                    tracing::info!(run_id = %cp.run_id, holder = %held.owner, "taking over a lease whose holder is gone");
                    taken = Some(held.clone());
                }
                Standing::Lapsed => {
                    tracing::info!(run_id = %cp.run_id, holder = %held.owner, "taking over a lease that was not renewed in time");
                    taken = Some(held.clone());
                }
            }
        }
        cp.lease = Some(self.fresh_lease(me, *ttl));
        self.save(cp, expected, None)
            .await
            .map_err(|e| store_error(&cp.run_id, "claim of the lease", e))?;
        if let (Some(old), Some(hook)) = (taken, &self.takeover) {
            hook(&old);
        }
        Ok(())
    }

    /// Renews the lease before a step starts when a third of its time or
    /// more has passed since it was last written: a run of short steps keeps
    /// its claim fresh, and a runner that was stopped between steps finds out
    /// that it was taken over (a conflict) before it starts the next one.
    pub(crate) async fn renew_if_due(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &self.lease else {
            return Ok(());
        };
        let ttl_ms = ttl.as_millis().min(u64::MAX as u128) as u64;
        let keep = ttl_ms - ttl_ms / 3;
        let due = match &cp.lease {
            Some(l) if l.owner == *me => match (l.local_until, crate::process::boot_millis()) {
                (Some(until), Some(now)) => until.saturating_sub(now) < keep,
                _ => {
                    l.until
                        .unix_millis()
                        .saturating_sub(self.clock.now().unix_millis())
                        < keep
                }
            },
            _ => true,
        };
        if due {
            self.renew(cp, expected).await?;
        }
        Ok(())
    }

    /// Extends the lease. A conflict here means another owner took the run:
    /// this call is fenced out.
    pub(crate) async fn renew(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &self.lease else {
            return Ok(());
        };
        let old = cp.lease.replace(self.fresh_lease(me, *ttl));
        #[cfg(feature = "mutants")]
        if self.mutant_blind_lease_renewal {
            if let Ok(Some(stored)) = self.store.load(&cp.run_id).await {
                *expected = Some(stored.version);
            }
        }
        // Only the lease changed: the store keeps the state it has, so the
        // state need not be copied or written (it may even be lent out to a
        // running step now).
        if let Err(e) = self.save_request(cp, expected, None, true).await {
            cp.lease = old;
            return Err(store_error(&cp.run_id, "renewal of the lease", e));
        }
        Ok(())
    }

    /// A gate: passes on an approval, ends the run on a rejection, or stops the
    /// run to wait. Returns the outcome to stop with, or `None` to go on.
    pub(crate) async fn gate(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        step: &Step,
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
        total: usize,
    ) -> Result<Option<Suspension>, Error> {
        let now = self.clock.now();
        let name = step.name();
        let since = match &cp.wait {
            Some(Wait::Gate { step, since, .. }) if step == name => Some(*since),
            _ => None,
        };
        // A gate never waits longer than its timeout from now: when the wall
        // clock was ahead as the wait began and has been set back since, the
        // recorded deadline moves in.
        if let (
            Some(Wait::Gate {
                step,
                timeout_at: Some(at),
                ..
            }),
            Some(t),
        ) = (&mut cp.wait, timeout)
        {
            if step == name {
                *at = (*at).min(now.saturating_add(t));
            }
        }
        let mut decision = since.and_then(|since| {
            cp.decisions
                .iter()
                .rev()
                .find(|d| d.gate == name && d.waited_since == Some(since))
                .cloned()
        });
        if decision.is_none() {
            if let Some(Wait::Gate {
                step,
                timeout_at: Some(at),
                on_timeout,
                ..
            }) = &cp.wait
            {
                if step == name && now >= *at {
                    let d = match on_timeout {
                        OnTimeout::Approve => Decision::approve(name, "timeout", now, None),
                        OnTimeout::Reject => Decision::reject(
                            name,
                            "timeout",
                            now,
                            Some("the gate timed out".into()),
                        ),
                    };
                    let d = match since {
                        Some(since) => d.answering(since),
                        None => d,
                    };
                    cp.decisions.push(d.clone());
                    decision = Some(d);
                }
            }
        }
        match decision {
            Some(d) if d.approved => {
                let mut update = Update::new();
                update.insert(
                    name.to_string(),
                    d.data.clone().unwrap_or(serde_json::Value::Null),
                );
                let record = StepRecord::new(cp.next, name, update, 1, since.unwrap_or(now), now);
                self.complete(cp, expected, record, total).await?;
                Ok(None)
            }
            Some(_) => {
                cp.status = RunStatus::Rejected;
                cp.wait = None;
                cp.lease = None;
                cp.updated_at = now;
                self.save(cp, expected, None).await.map_err(|e| {
                    store_error(&cp.run_id, &format!("save of the rejection at {name}"), e)
                })?;
                Ok(Some(rejected(cp)))
            }
            None => {
                if since.is_none() {
                    cp.wait = Some(Wait::Gate {
                        step: name.to_string(),
                        since: now,
                        timeout_at: timeout.map(|t| now.saturating_add(t)),
                        on_timeout,
                    });
                }
                cp.status = RunStatus::Waiting;
                cp.lease = None;
                cp.updated_at = now;
                self.save(cp, expected, None).await.map_err(|e| {
                    store_error(&cp.run_id, &format!("save of the wait at {name}"), e)
                })?;
                Ok(Some(Suspension::Waiting {
                    gate: name.to_string(),
                }))
            }
        }
    }

    /// A durable timer: records the wake-up time once, then passes when it has
    /// come, sleeps until it (with `wait_for_timers`), or stops the run.
    pub(crate) async fn sleep(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        step: &Step,
        d: Duration,
        total: usize,
    ) -> Result<Timer, Error> {
        let name = step.name();
        let now = self.clock.now();
        let recorded = match &cp.wait {
            Some(Wait::Timer { step, until }) if step == name => Some(*until),
            _ => None,
        };
        // A timer never waits longer than its duration from now: when the wall
        // clock was ahead as the timer was set and has been set back since,
        // the recorded wake-up time moves in.
        let until = match recorded {
            Some(at) => at.min(now.saturating_add(d)),
            None => now.saturating_add(d),
        };
        if now < until {
            cp.wait = Some(Wait::Timer {
                step: name.to_string(),
                until,
            });
            if !self.wait_for_timers {
                cp.status = RunStatus::Sleeping;
                cp.lease = None;
                cp.updated_at = now;
                self.save(cp, expected, None).await.map_err(|e| {
                    store_error(&cp.run_id, &format!("save of the timer at {name}"), e)
                })?;
                return Ok(Timer::Stop(Suspension::Sleeping { until }));
            }
            if recorded != Some(until) {
                // The wake-up time is durable before the wait begins, so a crash
                // does not restart the timer.
                cp.status = RunStatus::Sleeping;
                cp.updated_at = now;
                self.save(cp, expected, None).await.map_err(|e| {
                    store_error(&cp.run_id, &format!("save of the timer at {name}"), e)
                })?;
            }
            return Ok(Timer::Wait {
                set: now,
                left: until.saturating_since(now),
            });
        }
        self.timer_fired(cp, expected, name, now, total).await?;
        Ok(Timer::Passed)
    }

    /// Completes timer step `name`, set at `set`.
    pub(crate) async fn timer_fired(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        name: &str,
        set: Timestamp,
        total: usize,
    ) -> Result<(), Error> {
        let record = StepRecord::new(cp.next, name, Update::new(), 1, set, self.clock.now());
        self.complete(cp, expected, record, total).await
    }

    /// Checks a loaded record against the workflow given.
    pub(crate) fn verify(
        &self,
        mut cp: Checkpoint,
        workflow: &Workflow,
    ) -> Result<Checkpoint, Error> {
        let given: Vec<&str> = workflow.step_names().collect();
        let mismatch = if cp.workflow != workflow.name() {
            Some(Error::WorkflowChanged {
                run_id: cp.run_id.clone(),
                at: 0,
                stored: Some(format!("workflow {:?}", cp.workflow)),
                given: Some(format!("workflow {:?}", workflow.name())),
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
        match mismatch {
            None => Ok(cp),
            Some(e) if !self.accept_changed_workflow => Err(e),
            Some(_) => {
                tracing::warn!(run_id = %cp.run_id, "resuming a run recorded by different code, as asked");
                cp.workflow = workflow.name().to_string();
                let done = cp.next.min(given.len());
                cp.completed = given[..done].iter().map(|s| s.to_string()).collect();
                cp.next = done;
                Ok(cp)
            }
        }
    }

    /// Saves a failed attempt's record. Best effort, except that a conflict means
    /// someone else now owns the run, so this call must stop.
    pub(crate) async fn record_failure(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        step: &str,
        index: usize,
    ) -> Result<(), Error> {
        match self.save(cp, expected, None).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == StoreErrorKind::Conflict => Err(store_error(
                &cp.run_id,
                &format!("save of the failure of step {index} ({step})"),
                e,
            )),
            Err(e) => {
                tracing::warn!(run_id = %cp.run_id, step, error = %e, "could not record a step failure");
                Ok(())
            }
        }
    }

    /// Compare-and-swap save. After an error that leaves the outcome open, reload
    /// and recognise our own write by its writer number before deciding.
    pub(crate) async fn save(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        step: Option<&StepRecord>,
    ) -> Result<(), StoreError> {
        self.save_request(cp, expected, step, false).await
    }

    /// [`save`](Runner::save), saying whether only the head changed.
    async fn save_request(
        &self,
        cp: &mut Checkpoint,
        expected: &mut Option<u64>,
        step: Option<&StepRecord>,
        head_only: bool,
    ) -> Result<(), StoreError> {
        cp.writer = fastrand::u64(1..);
        let mut req = SaveRequest::new(cp, *expected);
        req.step = step;
        req.head_only = head_only;
        let new_version = req.new_version();
        let err = match self.store.save(req).await {
            Ok(v) => {
                cp.version = v;
                *expected = Some(v);
                return Ok(());
            }
            Err(e) => e,
        };
        // The store's contract: a definite error means the write did not land;
        // only an unknown outcome needs a look at what is stored.
        let definite = err.kind() != StoreErrorKind::OutcomeUnknown;
        #[cfg(feature = "mutants")]
        let definite = definite || self.mutant_skip_reload_after_unknown;
        if definite {
            return Err(err);
        }
        match self.store.load(&cp.run_id).await {
            Ok(Some(stored)) if stored.version == new_version && stored.writer == cp.writer => {
                tracing::info!(run_id = %cp.run_id, version = new_version, "save reported an error but had landed");
                cp.version = new_version;
                *expected = Some(new_version);
                Ok(())
            }
            Ok(stored) if stored.as_ref().map(|s| s.version) == *expected => Err(err),
            Ok(stored) => Err(StoreError::Conflict {
                run_id: cp.run_id.clone(),
                expected: *expected,
                found: stored.map(|s| s.version),
            }),
            Err(reload) => {
                tracing::warn!(run_id = %cp.run_id, error = %reload, "reload after a failed save failed too");
                Err(err)
            }
        }
    }
}

/// Where a timer stands.
pub(crate) enum Timer {
    /// It fired; its step is recorded.
    Passed,
    /// The run stops here.
    Stop(Suspension),
    /// Wait `left` (the runner waits for timers), then it fires.
    Wait {
        /// When it was looked at.
        set: Timestamp,
        /// How long is left.
        left: Duration,
    },
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
    if held.owner.host == me.host {
        if !crate::process::is_alive(&held.owner) {
            return Standing::Gone;
        }
        if let (Some(deadline), Some(boot)) = (held.local_until, crate::process::boot_millis()) {
            return if boot < deadline {
                Standing::Held
            } else {
                Standing::Lapsed
            };
        }
    }
    if held.until > now {
        Standing::Held
    } else {
        Standing::Lapsed
    }
}

/// What completing a step changed in a record, to put back if its save fails.
struct Undo {
    replaced: Vec<(String, Option<serde_json::Value>)>,
    status: RunStatus,
    attempts: u32,
    error: Option<StepFailure>,
    wait: Option<Wait>,
    lease: Option<Lease>,
    updated_at: Timestamp,
}

impl Undo {
    /// Merges the step's update, appends the step and moves the bookkeeping
    /// on; the last step of `total` also completes the run and releases the
    /// lease.
    fn apply(cp: &mut Checkpoint, record: &StepRecord, total: usize) -> Undo {
        let replaced = record
            .update
            .iter()
            .map(|(k, v)| (k.clone(), cp.state.insert(k.clone(), v.clone())))
            .collect();
        let undo = Undo {
            replaced,
            status: cp.status,
            attempts: cp.attempts,
            error: cp.error.take(),
            wait: cp.wait.take(),
            lease: cp.lease.clone(),
            updated_at: cp.updated_at,
        };
        cp.completed.push(record.name.clone());
        cp.next += 1;
        cp.attempts = 0;
        cp.updated_at = record.finished_at;
        if cp.next == total {
            cp.status = RunStatus::Completed;
            cp.lease = None;
        } else {
            cp.status = RunStatus::Running;
        }
        undo
    }

    fn revert(self, cp: &mut Checkpoint) {
        for (k, old) in self.replaced.into_iter().rev() {
            match old {
                Some(v) => cp.state.insert(k, v),
                None => cp.state.remove(&k),
            };
        }
        cp.completed.pop();
        cp.next -= 1;
        cp.status = self.status;
        cp.attempts = self.attempts;
        cp.error = self.error;
        cp.wait = self.wait;
        cp.lease = self.lease;
        cp.updated_at = self.updated_at;
    }
}

pub(crate) fn store_error(run_id: &str, op: &str, source: StoreError) -> Error {
    Error::Store {
        run_id: run_id.to_string(),
        op: op.to_string(),
        source,
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
