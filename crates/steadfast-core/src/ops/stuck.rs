//! Why a run cannot make progress by itself: the labels `steadfast runs`
//! and `show` print, and [`runs --stuck`] lists.
//!
//! [`runs --stuck`]: crate::ops::stuck::diagnose

use std::time::Duration;

use crate::engine::workflow::Workflow;
use crate::engine::{lease_left, standing, Standing};
use crate::record::checkpoint::{Checkpoint, RunStatus, Wait};
use crate::record::clock::Timestamp;

/// How long past its time a run may be before it counts as stuck, unless
/// told otherwise: a worker that polls takes a due run well within it.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(60);

/// Why a run cannot make progress by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stuck {
    /// It is running under a lease whose holder (a process on this host) is
    /// gone; the next `run` or a worker takes it over.
    HolderDead {
        /// The holder, written out.
        holder: String,
    },
    /// It is running under a lease that was not renewed in time: its holder
    /// stopped, hung or died on another host, and no worker took it over.
    LeaseExpired {
        /// The holder, written out.
        holder: String,
        /// How long ago the lease ran out.
        ago: Duration,
    },
    /// It was interrupted (running, with no lease) and nothing resumed it.
    Interrupted {
        /// Since when.
        since: Timestamp,
    },
    /// A step used up its attempts: a person must `retry` (or rewind) it.
    RetriesExhausted {
        /// The failed step's index.
        index: usize,
        /// Its name.
        step: String,
        /// Attempts used.
        attempts: u32,
    },
    /// It waits at a gate whose timeout passed, and no worker applied it.
    GateOverdue {
        /// The gate.
        gate: String,
        /// How long ago the timeout passed.
        ago: Duration,
    },
    /// It waits for a signal that was sent, or whose wait timed out, and
    /// no worker or run has taken it up since.
    SignalNotTaken {
        /// The wait's step.
        step: String,
        /// The signal's name.
        signal: String,
        /// How long it has been due.
        ago: Duration,
    },
    /// Its record was written by other code than the workflow given: a
    /// run would refuse to resume it ([`Error::WorkflowChanged`](crate::Error::WorkflowChanged)).
    WorkflowChanged {
        /// The first step index where record and code differ.
        at: usize,
        /// What the record has there.
        stored: Option<String>,
        /// What the code has there.
        given: Option<String>,
    },
    /// Its timer fired a while ago, and no worker woke it.
    SleepingPastTime {
        /// The timer step.
        step: String,
        /// How long ago it fired.
        ago: Duration,
    },
    /// It was started for a worker a while ago, and none took it.
    PendingNoWorker {
        /// How long it has waited.
        waited: Duration,
    },
    /// It was started under a version of its workflow that the worker
    /// which took it last does not have, and no worker with that version
    /// has taken it since ([`Checkpoint::passed_over`]).
    VersionMissing {
        /// The workflow.
        workflow: String,
        /// The version the run needs.
        version: String,
        /// The versions the worker had.
        available: Vec<String>,
        /// The worker, written out.
        by: String,
        /// When it passed the run over.
        since: Timestamp,
    },
}

impl Stuck {
    /// A short name for the label (`holder-dead`, `lease-expired`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Stuck::HolderDead { .. } => "holder-dead",
            Stuck::LeaseExpired { .. } => "lease-expired",
            Stuck::Interrupted { .. } => "interrupted",
            Stuck::RetriesExhausted { .. } => "retries-exhausted",
            Stuck::GateOverdue { .. } => "gate-overdue",
            Stuck::SignalNotTaken { .. } => "signal-not-taken",
            Stuck::WorkflowChanged { .. } => "workflow-changed",
            Stuck::SleepingPastTime { .. } => "sleeping-past-time",
            Stuck::PendingNoWorker { .. } => "pending-no-worker",
            Stuck::VersionMissing { .. } => "version-missing",
        }
    }
}

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = |d: &Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
        match self {
            Stuck::HolderDead { holder } => write!(
                f,
                "its lease holder ({holder}) is no longer running; run it again or let a worker take it over"
            ),
            Stuck::LeaseExpired { holder, ago: d } => write!(
                f,
                "its lease ran out {} ago and its holder ({holder}) did not renew it; no worker took it over",
                ago(d)
            ),
            Stuck::Interrupted { since } => write!(
                f,
                "it was interrupted (running, with no lease, since {since}) and nothing resumed it; run it again or start a worker"
            ),
            Stuck::RetriesExhausted {
                index,
                step,
                attempts,
            } => write!(
                f,
                "step {index} ({step}) failed {attempts} time(s) and has no attempt left; `retry` it or rewind it"
            ),
            Stuck::GateOverdue { gate, ago: d } => write!(
                f,
                "gate {gate:?} timed out {} ago and no worker applied the timeout; approve, reject, or start a worker",
                ago(d)
            ),
            Stuck::SignalNotTaken { step, signal, ago: d } => write!(
                f,
                "the wait at {step:?} for signal {signal:?} has been due for {} and nothing took it up; run it again, or start a worker",
                ago(d)
            ),
            Stuck::WorkflowChanged { at, stored, given } => write!(
                f,
                "the workflow changed since its last checkpoint: at step {at} the record has {} and the code {}",
                stored.as_deref().map_or("nothing".into(), |s| format!("{s:?}")),
                given.as_deref().map_or("nothing".into(), |s| format!("{s:?}"))
            ),
            Stuck::SleepingPastTime { step, ago: d } => write!(
                f,
                "timer {step:?} fired {} ago and no worker woke the run; run it again or start a worker",
                ago(d)
            ),
            Stuck::PendingNoWorker { waited } => write!(
                f,
                "it has waited {} for a worker and none took it; start a worker",
                ago(waited)
            ),
            Stuck::VersionMissing {
                workflow,
                version,
                available,
                by,
                since,
            } => {
                let had = if available.is_empty() {
                    "no versioned one".to_string()
                } else {
                    let quoted: Vec<String> = available.iter().map(|v| format!("{v:?}")).collect();
                    quoted.join(", ")
                };
                write!(
                    f,
                    "it was started under version {version:?} of workflow {workflow:?}; worker {by} has {had} and passed it over at {since}: start a worker with that version, or migrate the run to one it has"
                )
            }
        }
    }
}

/// Why run `cp` cannot make progress by itself at `now`, if it cannot.
///
/// A run counts as stuck when it is due and has been for longer than
/// `after` (a polling worker takes a due run well within a minute), or
/// when no one but a person can move it on (retries exhausted). With
/// `workflow`, a record that the code would refuse to resume counts too;
/// the workflow is only known to a caller that has the code.
///
/// ```
/// use std::time::Duration;
/// use steadfast_core::{stuck::{diagnose, Stuck}, Checkpoint, RunStatus, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::from_unix_millis(0));
/// cp.status = RunStatus::Pending;
/// let now = Timestamp::from_unix_millis(600_000);
/// let found = diagnose(&cp, now, Duration::from_secs(60), None);
/// assert!(matches!(found, Some(Stuck::PendingNoWorker { .. })));
/// assert_eq!(diagnose(&cp, Timestamp::from_unix_millis(1_000), Duration::from_secs(60), None), None);
/// ```
pub fn diagnose(
    cp: &Checkpoint,
    now: Timestamp,
    after: Duration,
    workflow: Option<&Workflow>,
) -> Option<Stuck> {
    let finished = matches!(
        cp.status,
        RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
    );
    if finished {
        return None;
    }
    if let Some(wf) = workflow {
        if let Some(changed) = changed(cp, wf) {
            return Some(changed);
        }
    }
    // A worker took it and lacked its version: it waits for one that has
    // (a mark for another version than the run now records is old news).
    let needs = cp.origin.as_ref().and_then(|o| o.version.as_deref());
    if let Some(p) = cp
        .passed_over
        .as_ref()
        .filter(|p| needs == Some(p.version.as_str()))
    {
        return Some(Stuck::VersionMissing {
            workflow: cp.workflow.clone(),
            version: p.version.clone(),
            available: p.available.clone(),
            by: p.by.clone(),
            since: p.at,
        });
    }
    // A live holder (a `run --wait` sleeping through its timer) moves it on.
    let held_live = cp.lease.as_ref().is_some_and(|held| {
        matches!(
            standing(held, &crate::current_owner(), now),
            Standing::Held | Standing::Mine
        )
    });
    if held_live && cp.status != RunStatus::Running {
        return None;
    }
    let late = |since: Timestamp| {
        let d = now.saturating_since(since);
        (d > after).then_some(d)
    };
    match cp.status {
        RunStatus::Failed => {
            let (index, step) = cp
                .error
                .as_ref()
                .map_or((cp.next, String::new()), |e| (e.index, e.step.clone()));
            Some(Stuck::RetriesExhausted {
                index,
                step,
                attempts: cp.attempts,
            })
        }
        RunStatus::Running => match &cp.lease {
            Some(held) => {
                let me = crate::current_owner();
                let on_this_host = held.owner.host == me.host;
                match standing(held, &me, now) {
                    Standing::Gone => Some(Stuck::HolderDead {
                        holder: held.owner.to_string(),
                    }),
                    Standing::Lapsed => {
                        // By the wall clock: how long ago it ran out.
                        let over = now.saturating_since(held.until);
                        let by_boot = lease_left(held, now, on_this_host) == 0;
                        (by_boot && over > after).then(|| Stuck::LeaseExpired {
                            holder: held.owner.to_string(),
                            ago: over,
                        })
                    }
                    Standing::Held | Standing::Mine => None,
                }
            }
            None => late(cp.updated_at).map(|_| Stuck::Interrupted {
                since: cp.updated_at,
            }),
        },
        RunStatus::Pending => late(cp.updated_at).map(|waited| Stuck::PendingNoWorker { waited }),
        RunStatus::Sleeping => match &cp.wait {
            Some(Wait::Timer { step, until }) | Some(Wait::Limit { step, until, .. }) => {
                late(*until).map(|ago| Stuck::SleepingPastTime {
                    step: step.clone(),
                    ago,
                })
            }
            _ => None,
        },
        RunStatus::Waiting => match &cp.wait {
            Some(Wait::Gate {
                step,
                timeout_at: Some(at),
                ..
            }) => late(*at).map(|ago| Stuck::GateOverdue {
                gate: step.clone(),
                ago,
            }),
            Some(Wait::Signal {
                step,
                signal,
                arrived,
                timeout_at,
                ..
            }) => {
                // Due since it was marked (its last save), or since its
                // timeout passed.
                let due = match (*arrived, timeout_at) {
                    (true, _) => Some(cp.updated_at),
                    (false, Some(at)) => Some(*at),
                    (false, None) => None,
                };
                due.and_then(late).map(|ago| Stuck::SignalNotTaken {
                    step: step.clone(),
                    signal: signal.clone(),
                    ago,
                })
            }
            _ => None,
        },
        _ => None,
    }
}

/// The difference between the record's steps and the workflow's, as a label.
fn changed(cp: &Checkpoint, wf: &Workflow) -> Option<Stuck> {
    if cp.workflow != wf.name() {
        return Some(Stuck::WorkflowChanged {
            at: 0,
            stored: Some(format!("workflow {}", cp.workflow)),
            given: Some(format!("workflow {}", wf.name())),
        });
    }
    if let Some(had) = cp
        .origin
        .as_ref()
        .filter(|o| !o.runs_under(wf.version()))
        .and_then(|o| o.version.as_deref())
    {
        return Some(Stuck::WorkflowChanged {
            at: 0,
            stored: Some(format!("version {had}")),
            given: Some(
                wf.version()
                    .map_or("no version".to_string(), |v| format!("version {v}")),
            ),
        });
    }
    let given: Vec<&str> = wf.step_names().collect();
    (0..cp.next)
        .find(|&i| given.get(i) != Some(&cp.completed[i].as_str()))
        .map(|at| Stuck::WorkflowChanged {
            at,
            stored: Some(cp.completed[at].clone()),
            given: given.get(at).map(|s| s.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::checkpoint::{Lease, OnTimeout, Owner, StepFailure};

    const MIN: Duration = Duration::from_secs(60);

    fn at(s: u64) -> Timestamp {
        Timestamp::from_unix_millis(1_700_000_000_000 + s * 1000)
    }

    fn run(status: RunStatus, updated: Timestamp) -> Checkpoint {
        let mut cp = Checkpoint::new("r", "wf", updated);
        cp.status = status;
        cp
    }

    fn label(cp: &Checkpoint, now: Timestamp) -> Option<&'static str> {
        diagnose(cp, now, MIN, None).map(|s| s.label())
    }

    #[test]
    fn each_cause_is_labelled_once_it_is_late() {
        let now = at(10_000);
        // Pending: late after a minute.
        let cp = run(RunStatus::Pending, at(9_950));
        assert_eq!(label(&cp, now), None);
        let cp = run(RunStatus::Pending, at(9_000));
        assert_eq!(label(&cp, now), Some("pending-no-worker"));

        // Running without a lease: interrupted.
        let cp = run(RunStatus::Running, at(9_000));
        assert_eq!(label(&cp, now), Some("interrupted"));

        // Running under a lease of another host that ran out long ago.
        let mut cp = run(RunStatus::Running, at(9_000));
        cp.lease = Some(Lease::new(Owner::new("elsewhere", 1, 1), at(9_500)));
        assert_eq!(label(&cp, now), Some("lease-expired"));
        cp.lease = Some(Lease::new(Owner::new("elsewhere", 1, 1), at(9_990)));
        assert_eq!(label(&cp, now), None, "lapsed only just");
        cp.lease = Some(Lease::new(Owner::new("elsewhere", 1, 1), at(20_000)));
        assert_eq!(label(&cp, now), None, "held");

        // Under a lease of a process of this host that is gone.
        let me = crate::current_owner();
        cp.lease = Some(Lease::new(
            Owner::new(me.host.clone(), u32::MAX - 7, 1),
            at(20_000),
        ));
        assert_eq!(label(&cp, now), Some("holder-dead"));

        // Failed: at once.
        let mut cp = run(RunStatus::Failed, now);
        cp.attempts = 3;
        cp.error = Some(StepFailure::new(2, "fetch", "boom".into(), 3, false, now));
        assert_eq!(
            diagnose(&cp, now, MIN, None),
            Some(Stuck::RetriesExhausted {
                index: 2,
                step: "fetch".into(),
                attempts: 3
            })
        );

        // A gate whose timeout passed; one without a timeout is never stuck.
        let mut cp = run(RunStatus::Waiting, at(1_000));
        cp.wait = Some(Wait::Gate {
            step: "review".into(),
            since: at(1_000),
            timeout_at: Some(at(5_000)),
            on_timeout: OnTimeout::Reject,
        });
        assert_eq!(label(&cp, now), Some("gate-overdue"));
        cp.wait = Some(Wait::Gate {
            step: "review".into(),
            since: at(1_000),
            timeout_at: None,
            on_timeout: OnTimeout::Reject,
        });
        assert_eq!(label(&cp, now), None);

        // A wait for a signal: stuck once a sent signal or its timeout has
        // been due a while; waiting for one not sent yet is not stuck.
        let signal_wait = |arrived, timeout_at| Wait::Signal {
            step: "answer".into(),
            signal: "reply".into(),
            since: at(1_000),
            timeout_at,
            arrived,
            recheck_at: None,
        };
        let mut cp = run(RunStatus::Waiting, at(1_000));
        cp.wait = Some(signal_wait(false, None));
        assert_eq!(label(&cp, now), None);
        cp.wait = Some(signal_wait(true, None));
        assert_eq!(label(&cp, now), Some("signal-not-taken"));
        cp.updated_at = at(9_990);
        assert_eq!(label(&cp, now), None, "marked only just");
        cp.wait = Some(signal_wait(false, Some(at(2_000))));
        assert_eq!(label(&cp, now), Some("signal-not-taken"));

        // A timer that fired long ago, unless a live holder sleeps through it.
        let mut cp = run(RunStatus::Sleeping, at(1_000));
        cp.wait = Some(Wait::Timer {
            step: "nap".into(),
            until: at(2_000),
        });
        assert_eq!(label(&cp, now), Some("sleeping-past-time"));
        cp.lease = Some(Lease::new(Owner::new("elsewhere", 1, 1), at(20_000)));
        assert_eq!(label(&cp, now), None);

        // Finished runs are never stuck.
        for s in [
            RunStatus::Completed,
            RunStatus::Rejected,
            RunStatus::Cancelled,
        ] {
            assert_eq!(label(&run(s, at(0)), now), None);
        }
    }

    #[test]
    fn a_record_the_code_no_longer_matches_is_labelled() {
        let wf = Workflow::builder("wf")
            .step("a", |_, _| async { crate::update(serde_json::json!({})) })
            .step("b2", |_, _| async { crate::update(serde_json::json!({})) })
            .build()
            .unwrap();
        let mut cp = run(RunStatus::Waiting, at(0));
        cp.completed = vec!["a".into(), "b".into()];
        cp.next = 2;
        let found = diagnose(&cp, at(1), MIN, Some(&wf));
        assert_eq!(
            found,
            Some(Stuck::WorkflowChanged {
                at: 1,
                stored: Some("b".into()),
                given: Some("b2".into())
            })
        );
        cp.completed[1] = "b2".into();
        assert_eq!(diagnose(&cp, at(1), MIN, Some(&wf)), None);
        cp.workflow = "other".into();
        assert_eq!(
            diagnose(&cp, at(1), MIN, Some(&wf)).map(|s| s.label()),
            Some("workflow-changed")
        );
    }
}
