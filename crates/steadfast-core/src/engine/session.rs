//! One call's progress on a run's record: the checkpoint, the version it was
//! read at, and every operation that changes it (claim, renew, complete, fail,
//! gate, timer, save), for listed workflows and durable functions alike.

use std::collections::HashSet;
use std::time::Duration;

use tracing::Instrument;

use crate::engine::workflow::Step;
use crate::engine::{lease_left, standing, store_error, Runner, Standing};
use crate::record::checkpoint::{
    Checkpoint, Decision, Lease, OnTimeout, RunStatus, StepFailure, StepRecord, Wait,
};
use crate::record::clock::Timestamp;
use crate::record::error::{Error, StoreError, StoreErrorKind};
use crate::record::outcome::{rejected, Suspension};
use crate::record::state::Update;
use crate::store::{SaveRequest, Store};

/// The recorded progress of one call of a durable function.
pub(crate) struct Session {
    pub(crate) cp: Checkpoint,
    pub(crate) expected: Option<u64>,
    /// The number of steps of a listed workflow (its last save completes the
    /// run); unbounded for a durable function, whose result save does.
    pub(crate) total: usize,
    /// Attempts of the current step made in this call, against its budget.
    pub(crate) used: u32,
    /// The step that `used` and the record's attempt count belong to: a
    /// different step going live starts with a budget of its own.
    pub(crate) budget_step: Option<String>,
    /// The next recorded step the code is expected to ask for.
    pub(crate) cursor: usize,
    /// Names asked for in this call, to refuse a name used twice.
    pub(crate) seen: HashSet<String>,
    /// The record was left running by a call that did not finish (a
    /// crash, a kill, a lease that ran out): the first step this call runs
    /// may have run before. Counted once, in [`metrics`](crate::metrics).
    pub(crate) interrupted: bool,
    /// The run's status as last loaded or saved: a save that ends the run
    /// (from a status that had not) marks its parent due, if it is a child.
    saved_status: RunStatus,
}

impl Session {
    /// A call's progress on `cp`, with the code expected at record index
    /// `cursor`. The first live step's attempt budget: fresh for a failed
    /// run called again, and what is left of it for an interrupted one, for
    /// listed and durable steps alike.
    pub(crate) fn new(cp: Checkpoint, expected: Option<u64>, total: usize, cursor: usize) -> Self {
        let used = if cp.status == RunStatus::Failed {
            0
        } else {
            cp.attempts
        };
        // Attempts are counted only while a step fails, and recorded with
        // its failure: the record's error names the step they belong to.
        let budget_step = cp.error.as_ref().map(|e| e.step.clone());
        // A person's rewind or retry also leaves it running, with an audit
        // entry of the same time: that is no interruption.
        let interrupted = cp.version > 0
            && cp.status == RunStatus::Running
            && cp.audit.last().is_none_or(|a| a.at != cp.updated_at);
        Session {
            interrupted,
            saved_status: cp.status,
            cp,
            expected,
            total,
            used,
            budget_step,
            cursor,
            seen: HashSet::new(),
        }
    }

    /// Records a completed step (its update already merged into the state) and
    /// saves; the last step's save also marks the run completed and releases
    /// the lease.
    ///
    /// When the save is refused for the step's own data (the state grew
    /// past the store's limit, a value it cannot take), the record is put
    /// back as it was before the step, and the failure is recorded in the
    /// store with the lease released, so that the run reads `failed` with the
    /// cause instead of `running` under a dead lease. A store that is
    /// unavailable gets no such write: see [`record_unsaved`](Session::record_unsaved).
    pub(crate) async fn complete<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        record: StepRecord,
        total: usize,
    ) -> Result<(), Error> {
        let (index, name, attempt) = (record.index, record.name.clone(), record.attempt);
        match self.complete_unrecorded(r, record, total).await {
            Err(e) => {
                self.record_unsaved(r, index, &name, attempt, &e).await;
                Err(e)
            }
            ok => ok,
        }
    }

    /// [`complete`](Session::complete) without recording a failed save, for
    /// a step among others still running (a parallel branch): their batch
    /// records the failure when it is over, and keeps the lease meanwhile.
    pub(crate) async fn complete_unrecorded<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        record: StepRecord,
        total: usize,
    ) -> Result<(), Error> {
        let undo = Undo::apply(&mut self.cp, &record, total);
        match self.save(r, Some(&record)).await {
            Ok(()) => Ok(()),
            Err(err) => {
                undo.revert(&mut self.cp);
                let what = format!("save after step {} ({})", record.index, record.name);
                Err(store_error(&self.cp.run_id, &what, err))
            }
        }
    }

    /// After a step's checkpoint failed to save (`failure`), records the run
    /// as failed with the cause and releases the lease, if the store still
    /// takes that small write; so the run reads `failed`, not `running` under
    /// a dead lease. Nothing is written after a conflict (someone else owns
    /// the run) or when the store is unavailable (the run resumes later).
    pub(crate) async fn record_unsaved<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        index: usize,
        step: &str,
        attempt: u32,
        failure: &Error,
    ) {
        let Some(err) = failure.store_error() else {
            return;
        };
        // After a conflict, someone else owns the run. When the store itself
        // is in trouble (unreachable, a full disk, an unknown outcome), the
        // run stays as it was, running under its lease: once the lease
        // lapses, a worker or the next call resumes it at this step, rather
        // than finding a failed run that nobody retries.
        if matches!(
            err.kind(),
            StoreErrorKind::Conflict | StoreErrorKind::Unavailable | StoreErrorKind::OutcomeUnknown
        ) {
            return;
        }
        let now = r.clock.now();
        self.cp.status = RunStatus::Failed;
        self.cp.lease = None;
        self.cp.updated_at = now;
        self.cp.error = Some(StepFailure::new(
            index,
            step,
            format!(
                "the step finished but its checkpoint could not be saved: {}",
                crate::record::error::chain(err)
            ),
            attempt,
            true,
            now,
        ));
        if let Err(e) = self.save(r, None).await {
            tracing::warn!(run_id = %self.cp.run_id, step, error = %crate::record::error::chain(&e), "could not record that a checkpoint failed");
        }
    }

    /// Claims the run with a lease, when leases are on. Refuses a lease that
    /// someone else still holds; takes over one whose holder is gone (a dead
    /// process on this host) or whose time ran out.
    pub(crate) async fn claim<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &r.lease else {
            return Ok(());
        };
        let mut taken = None;
        if let Some(held) = &self.cp.lease {
            match standing(held, me, r.clock.now()) {
                Standing::Mine => {}
                Standing::Held => {
                    return Err(Error::Held {
                        run_id: self.cp.run_id.clone(),
                        holder: held.owner.clone(),
                        until: held.until,
                    })
                }
                Standing::Gone => {
                    tracing::info!(run_id = %self.cp.run_id, holder = %held.owner, "taking over a lease whose holder is gone");
                    taken = Some(held.clone());
                }
                Standing::Lapsed => {
                    tracing::info!(run_id = %self.cp.run_id, holder = %held.owner, "taking over a lease that was not renewed in time");
                    taken = Some(held.clone());
                }
            }
        }
        self.cp.lease = Some(r.fresh_lease(me, *ttl));
        match self.save(r, None).await {
            Ok(()) => {}
            // Someone saved between the look and the claim: this call never
            // had the run.
            Err(e) if e.kind() == StoreErrorKind::Conflict => {
                crate::engine::metrics::claim_missed();
                return Err(Error::ClaimLost {
                    run_id: self.cp.run_id.clone(),
                });
            }
            Err(e) => return Err(store_error(&self.cp.run_id, "claim of the lease", e)),
        }
        if let (Some(old), Some(hook)) = (taken, &r.takeover) {
            hook(&old);
        }
        Ok(())
    }

    /// Renews the lease before a step starts when a third of its time or
    /// more has passed since it was last written: a run of short steps keeps
    /// its claim fresh, and a runner that was stopped between steps finds out
    /// that it was taken over (a conflict) before it starts the next one.
    pub(crate) async fn renew_if_due<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &r.lease else {
            return Ok(());
        };
        let ttl_ms = ttl.as_millis().min(u64::MAX as u128) as u64;
        let keep = ttl_ms - ttl_ms / 3;
        let due = match &self.cp.lease {
            Some(l) if l.owner == *me => lease_left(l, r.clock.now(), true) < keep,
            _ => true,
        };
        if due {
            self.renew(r).await?;
        }
        Ok(())
    }

    /// [`renew`](Self::renew), given up when the store has not answered by
    /// `by` or by a tenth of the lease's time before the recorded lease runs
    /// out (at once when less is left), whichever is first: then the record
    /// keeps the lease it had and `Ok(false)` says that nothing was confirmed
    /// (the save may still land later; its compare-and-swap fences it like
    /// any stale write).
    pub(crate) async fn renew_by<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        by: tokio::time::Instant,
    ) -> Result<bool, Error> {
        let Some((me, ttl)) = &r.lease else {
            return Ok(true);
        };
        let margin = renewal_margin(*ttl);
        let mut until = by;
        if let Some(held) = self.cp.lease.as_ref().filter(|l| l.owner == *me) {
            let left = Duration::from_millis(crate::engine::lease_left(held, r.clock.now(), true));
            // A lease that ran out while this process stood still (paused
            // past it) gives up at once: the caller stops the step before it
            // looks whether another worker took the run over.
            let now = tokio::time::Instant::now();
            until = until.min(now.checked_add(left.saturating_sub(margin)).unwrap_or(now));
        }
        let (old, writer) = (self.cp.lease.clone(), self.cp.writer);
        match tokio::time::timeout_at(until, self.renew(r)).await {
            Ok(done) => done.map(|()| true),
            Err(_) => {
                self.cp.lease = old;
                self.cp.writer = writer;
                Ok(false)
            }
        }
    }

    /// Extends the lease. A conflict here means another owner took the run:
    /// this call is fenced out.
    pub(crate) async fn renew<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
    ) -> Result<(), Error> {
        let Some((me, ttl)) = &r.lease else {
            return Ok(());
        };
        let old = self.cp.lease.replace(r.fresh_lease(me, *ttl));
        #[cfg(feature = "mutants")]
        if r.mutant_blind_lease_renewal {
            if let Ok(Some(stored)) = r.store.load(&self.cp.run_id).await {
                self.expected = Some(stored.version);
            }
        }
        // Only the lease changed: the store keeps the state it has, so the
        // state need not be copied or written (it may even be lent out to a
        // running step now).
        if let Err(e) = self.save_request(r, None, true).await {
            self.cp.lease = old;
            return Err(store_error(&self.cp.run_id, "renewal of the lease", e));
        }
        Ok(())
    }

    /// A gate: passes on an approval, ends the run on a rejection, or stops the
    /// run to wait. Returns the outcome to stop with, or `None` to go on.
    pub(crate) async fn gate<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        step: &Step,
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
        total: usize,
    ) -> Result<Option<Suspension>, Error> {
        let now = r.clock.now();
        let name = step.name();
        if name == crate::record::spend::BUDGET_GATE
            && self.cp.spend.as_ref().is_some_and(|s| !s.budget.is_empty())
        {
            return Err(Error::InvalidWorkflow {
                workflow: self.cp.workflow.clone(),
                reason: format!(
                    "a gate is named {name:?} in a run with a budget, whose own gate has that name; rename it"
                ),
            });
        }
        let since = match &self.cp.wait {
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
        ) = (&mut self.cp.wait, timeout)
        {
            if step == name {
                *at = (*at).min(now.saturating_add(t));
            }
        }
        let mut decision = since.and_then(|since| {
            self.cp
                .decisions
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
            }) = &self.cp.wait
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
                    self.cp.decisions.push(d.clone());
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
                let record =
                    StepRecord::new(self.cp.next, name, update, 1, since.unwrap_or(now), now);
                self.complete(r, record, total).await?;
                Ok(None)
            }
            Some(_) => {
                self.cp.status = RunStatus::Rejected;
                self.cp.wait = None;
                self.cp.lease = None;
                self.cp.updated_at = now;
                self.save(r, None).await.map_err(|e| {
                    store_error(
                        &self.cp.run_id,
                        &format!("save of the rejection at {name}"),
                        e,
                    )
                })?;
                Ok(Some(rejected(&self.cp)))
            }
            None => {
                if since.is_none() {
                    self.cp.wait = Some(Wait::Gate {
                        step: name.to_string(),
                        since: now,
                        timeout_at: timeout.map(|t| now.saturating_add(t)),
                        on_timeout,
                    });
                }
                self.cp.status = RunStatus::Waiting;
                self.cp.lease = None;
                self.cp.updated_at = now;
                self.save(r, None).await.map_err(|e| {
                    store_error(&self.cp.run_id, &format!("save of the wait at {name}"), e)
                })?;
                Ok(Some(Suspension::Waiting {
                    gate: name.to_string(),
                }))
            }
        }
    }

    /// A wait for signal `signal` at step `name`: takes the oldest signal of
    /// that name no earlier wait took (recording the delivery as the step's
    /// update), records `null` once `timeout` has passed since the wait
    /// began, or saves the wait and stops the run. After saving the wait it
    /// looks again: a signal sent meanwhile marks the run due.
    pub(crate) async fn wait_signal<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        name: &str,
        signal: &str,
        timeout: Option<Duration>,
        total: usize,
    ) -> Result<Option<Suspension>, Error> {
        use crate::record::signal::{taking, SIGNALS_KEY};
        let now = r.clock.now();
        let (since, mut timeout_at) = match &self.cp.wait {
            Some(Wait::Signal {
                step,
                since,
                timeout_at,
                ..
            }) if step == name => (Some(*since), *timeout_at),
            _ => (None, None),
        };
        // Never longer than the timeout from now (a clock set back since).
        if let Some(t) = timeout {
            let latest = now.saturating_add(t);
            timeout_at = Some(timeout_at.map_or(latest, |at| at.min(latest)));
        }
        let op = |what: &str| format!("{what} for signal {signal:?} at {name}");
        let log = r.store.capabilities().events.ok_or_else(|| {
            store_error(
                &self.cp.run_id,
                &op("the wait"),
                StoreError::Unsupported(
                    "the store keeps no event log, where signals are kept".into(),
                ),
            )
        })?;
        let found = crate::engine::signal::next_signal(log, &self.cp, signal)
            .await
            .map_err(|e| store_error(&self.cp.run_id, &op("reading the signals"), e))?;
        let delivery = match (found, timeout_at) {
            (Some(s), _) => Some((s.delivery(), Some(taking(&self.cp.state, &s)))),
            (None, Some(at)) if now >= at && since.is_some() => {
                Some((serde_json::Value::Null, None))
            }
            _ => None,
        };
        if let Some((value, all)) = delivery {
            let mut update = Update::new();
            update.insert(name.to_string(), value);
            if let Some(all) = all {
                update.insert(SIGNALS_KEY.to_string(), all);
            }
            let record = StepRecord::new(self.cp.next, name, update, 1, since.unwrap_or(now), now);
            self.complete(r, record, total).await?;
            return Ok(None);
        }
        self.cp.wait = Some(Wait::Signal {
            step: name.to_string(),
            signal: signal.to_string(),
            since: since.unwrap_or(now),
            timeout_at,
            arrived: false,
            recheck_at: Some(now.saturating_add(crate::engine::signal::SIGNAL_RECHECK)),
        });
        self.cp.status = RunStatus::Waiting;
        self.cp.lease = None;
        self.cp.updated_at = now;
        self.save(r, None)
            .await
            .map_err(|e| store_error(&self.cp.run_id, &op("save of the wait"), e))?;
        // A signal sent between the look and the save found the run not yet
        // waiting: mark it due, as its sender would have.
        let late = match crate::engine::signal::next_signal(log, &self.cp, signal).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                tracing::warn!(run_id = %self.cp.run_id, error = %e, "after saving a wait, the signals could not be read again; a worker looks again at the wait's recheck time");
                false
            }
        };
        if late {
            if let Err(e) =
                crate::engine::signal::wake(&*r.store, &self.cp.run_id, signal, &*r.clock).await
            {
                tracing::warn!(run_id = %self.cp.run_id, error = %e, "a signal that came as the run began to wait did not mark it due; run it again to take it");
            }
        }
        Ok(Some(Suspension::Waiting {
            gate: name.to_string(),
        }))
    }

    /// A durable timer: records the wake-up time once, then passes when it has
    /// come, sleeps until it (with `wait_for_timers`), or stops the run.
    pub(crate) async fn sleep<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        step: &Step,
        d: Duration,
        total: usize,
    ) -> Result<Timer, Error> {
        let name = step.name();
        let now = r.clock.now();
        let recorded = match &self.cp.wait {
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
            self.cp.wait = Some(Wait::Timer {
                step: name.to_string(),
                until,
            });
            if !r.wait_for_timers {
                self.cp.status = RunStatus::Sleeping;
                self.cp.lease = None;
                self.cp.updated_at = now;
                self.save(r, None).await.map_err(|e| {
                    store_error(&self.cp.run_id, &format!("save of the timer at {name}"), e)
                })?;
                return Ok(Timer::Stop(Suspension::Sleeping { until }));
            }
            if recorded != Some(until) {
                // The wake-up time is durable before the wait begins, so a crash
                // does not restart the timer.
                self.cp.status = RunStatus::Sleeping;
                self.cp.updated_at = now;
                self.save(r, None).await.map_err(|e| {
                    store_error(&self.cp.run_id, &format!("save of the timer at {name}"), e)
                })?;
            }
            return Ok(Timer::Wait {
                set: now,
                left: until.saturating_since(now),
            });
        }
        self.timer_fired(r, name, now, total).await?;
        Ok(Timer::Passed)
    }

    /// Completes timer step `name`, set at `set`.
    pub(crate) async fn timer_fired<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        name: &str,
        set: Timestamp,
        total: usize,
    ) -> Result<(), Error> {
        let record = StepRecord::new(self.cp.next, name, Update::new(), 1, set, r.clock.now());
        self.complete(r, record, total).await
    }

    /// Saves a failed attempt's record. Best effort, except that a conflict means
    /// someone else now owns the run, so this call must stop.
    pub(crate) async fn record_failure<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        step: &str,
        index: usize,
    ) -> Result<(), Error> {
        match self.save(r, None).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == StoreErrorKind::Conflict => Err(store_error(
                &self.cp.run_id,
                &format!("save of the failure of step {index} ({step})"),
                e,
            )),
            Err(e) => {
                tracing::warn!(run_id = %self.cp.run_id, step, error = %e, "could not record a step failure");
                Ok(())
            }
        }
    }

    /// Compare-and-swap save. After an error that leaves the outcome open, reload
    /// and recognise our own write by its writer number before deciding.
    pub(crate) async fn save<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        step: Option<&StepRecord>,
    ) -> Result<(), StoreError> {
        // Boxed, here and in `save_head`: a save's future holds the store's
        // and a reload's, and every future that may save (a step's attempt
        // loop, a renewal) held it inline and was copied whole at each move.
        Box::pin(self.save_request(r, step, false)).await
    }

    /// A save of the head alone (lease, status, wait, spend): the store
    /// keeps the state it has, which may be lent out to a running step.
    pub(crate) async fn save_head<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
    ) -> Result<(), StoreError> {
        Box::pin(self.save_request(r, None, true)).await
    }

    /// Before step `name`, no slot of limit `key` is free: the run sleeps
    /// until `until` (saved, the lease released) and then looks again.
    pub(crate) async fn wait_for_slot<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        name: &str,
        key: &str,
        until: Timestamp,
    ) -> Result<Suspension, Error> {
        self.cp.wait = Some(Wait::Limit {
            step: name.to_string(),
            key: key.to_string(),
            until,
        });
        self.cp.status = RunStatus::Sleeping;
        self.cp.lease = None;
        self.cp.updated_at = r.clock.now();
        if self.expected.is_none() {
            // A new run without a record yet: saved whole.
            self.save(r, None).await
        } else {
            self.save_head(r).await
        }
        .map_err(|e| {
            store_error(
                &self.cp.run_id,
                &format!("save of the wait for a slot before {name}"),
                e,
            )
        })?;
        Ok(Suspension::Sleeping { until })
    }

    /// After a save landed: a run it ended marks its parent due.
    async fn saved<S: Store + ?Sized>(&mut self, r: &Runner<'_, S>) {
        let was = std::mem::replace(&mut self.saved_status, self.cp.status);
        if !crate::record::family::ended(was) && crate::record::family::ended(self.cp.status) {
            crate::engine::family::ended_child(&*r.store, &self.cp, &*r.clock).await;
        }
    }

    /// [`save`](Session::save), saying whether only the head changed.
    async fn save_request<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
        step: Option<&StepRecord>,
        head_only: bool,
    ) -> Result<(), StoreError> {
        self.cp.writer = fastrand::u64(1..);
        let mut req = SaveRequest::new(&self.cp, self.expected);
        req.step = step;
        req.head_only = head_only;
        let new_version = req.new_version();
        let span = tracing::debug_span!(
            "steadfast.store",
            op = if head_only { "save_head" } else { "save" },
            run_id = %self.cp.run_id,
            version = new_version,
        );
        let began = std::time::Instant::now();
        let saved = r.store.save(req).instrument(span).await;
        crate::engine::metrics::save(
            began.elapsed(),
            saved.is_ok(),
            matches!(&saved, Err(e) if e.kind() == StoreErrorKind::Conflict),
        );
        let err = match saved {
            Ok(v) => {
                self.cp.version = v;
                self.expected = Some(v);
                self.saved(r).await;
                return Ok(());
            }
            Err(e) => e,
        };
        // The store's contract: a definite error means the write did not land;
        // only an unknown outcome needs a look at what is stored.
        let definite = err.kind() != StoreErrorKind::OutcomeUnknown;
        #[cfg(feature = "mutants")]
        let definite = definite || r.mutant_skip_reload_after_unknown;
        if definite {
            return Err(err);
        }
        match r.store.load(&self.cp.run_id).await {
            Ok(Some(stored))
                if stored.version == new_version && stored.writer == self.cp.writer =>
            {
                tracing::info!(run_id = %self.cp.run_id, version = new_version, "save reported an error but had landed");
                self.cp.version = new_version;
                self.expected = Some(new_version);
                self.saved(r).await;
                Ok(())
            }
            Ok(stored) if stored.as_ref().map(|s| s.version) == self.expected => Err(err),
            Ok(stored) => Err(StoreError::Conflict {
                run_id: self.cp.run_id.clone(),
                expected: self.expected,
                found: stored.map(|s| s.version),
            }),
            Err(reload) => {
                tracing::warn!(run_id = %self.cp.run_id, error = %reload, "reload after a failed save failed too");
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
            .filter(|(k, _)| k.as_str() != crate::record::version::STEP_KEY)
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

/// How long before a lease runs out a renewal that has not been answered is
/// given up, and the step it covers stopped: a tenth of the lease's time, at
/// least 10 ms.
pub(crate) fn renewal_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(10))
}
