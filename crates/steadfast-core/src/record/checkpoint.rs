//! The durable record of a run.

use serde::{Deserialize, Serialize};

use crate::record::clock::Timestamp;
use crate::record::state::{State, Update};

/// The version of the checkpoint's JSON layout written by this build.
pub const CHECKPOINT_FORMAT: u32 = 1;

/// The [`format`](Checkpoint::format) of a record as a store with blobs
/// keeps it when a decision's data is a reference to a blob (or looks like
/// one, escaped): never a record a caller sees, as a load puts the data
/// back and the format to [`CHECKPOINT_FORMAT`]. A build that does not read
/// such records refuses one rather than show a reference as data. See
/// [`encode_decisions`](crate::store::blob::encode_decisions).
pub const STORED_DECISIONS_FORMAT: u32 = 2;

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunStatus {
    /// Recorded by [`start`](crate::start) for a worker to pick up; no step
    /// has run yet.
    Pending,
    /// Started and not finished: running now, or interrupted by a crash.
    Running,
    /// Every step completed.
    Completed,
    /// A step failed; running again resumes at that step.
    Failed,
    /// Stopped at a gate until someone approves or rejects it.
    Waiting,
    /// Stopped at a durable timer until its wake-up time.
    Sleeping,
    /// A gate was rejected: the run is over.
    Rejected,
    /// Someone cancelled the run ([`cancel`](crate::ops::cancel)): no step
    /// runs again unless a person rewinds or retries it.
    Cancelled,
}

impl RunStatus {
    /// The lowercase name used in stores, filters and output.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Waiting => "waiting",
            RunStatus::Sleeping => "sleeping",
            RunStatus::Rejected => "rejected",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pending" => Ok(RunStatus::Pending),
            "running" => Ok(RunStatus::Running),
            "completed" => Ok(RunStatus::Completed),
            "failed" => Ok(RunStatus::Failed),
            "waiting" => Ok(RunStatus::Waiting),
            "sleeping" => Ok(RunStatus::Sleeping),
            "rejected" => Ok(RunStatus::Rejected),
            "cancelled" => Ok(RunStatus::Cancelled),
            other => Err(format!(
                "unknown status {other:?} (expected pending, running, completed, failed, waiting, sleeping, rejected or cancelled)"
            )),
        }
    }
}

/// The last error recorded for a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepFailure {
    /// The failing step's index.
    pub index: usize,
    /// The failing step's name.
    pub step: String,
    /// The error text.
    pub message: String,
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// Whether the error was terminal (no further attempts).
    pub terminal: bool,
    /// When it was recorded.
    pub at: Timestamp,
}

impl StepFailure {
    /// A failure record. A message longer than
    /// [`limits::MAX_ERROR_BYTES`](crate::record::limits::MAX_ERROR_BYTES) is cut in its
    /// middle.
    pub fn new(
        index: usize,
        step: &str,
        message: String,
        attempt: u32,
        terminal: bool,
        at: Timestamp,
    ) -> Self {
        StepFailure {
            index,
            step: step.to_string(),
            message: crate::record::limits::cut_middle(
                message,
                crate::record::limits::MAX_ERROR_BYTES,
            ),
            attempt,
            terminal,
            at,
        }
    }
}

/// The durable record of a run: which steps are done, the state they built, and
/// the bookkeeping that makes a resume safe.
///
/// `next` always equals `completed.len()`; stores check it when they decode one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Checkpoint {
    /// The layout version ([`CHECKPOINT_FORMAT`] when written by this build).
    pub format: u32,
    /// The run.
    pub run_id: String,
    /// The workflow's name, so a worker can find the code again.
    pub workflow: String,
    /// Where the run stands.
    pub status: RunStatus,
    /// The index of the next step: the number of completed steps.
    pub next: usize,
    /// The names of the completed steps, in order.
    pub completed: Vec<String>,
    /// The state after the completed steps.
    pub state: State,
    /// The compare-and-swap version: 1 after the first save, plus one per save.
    pub version: u64,
    /// When the run was first saved.
    pub created_at: Timestamp,
    /// When the run was last saved.
    pub updated_at: Timestamp,
    /// Failed attempts of step `next` so far, across resumes.
    #[serde(default)]
    pub attempts: u32,
    /// The last error, if the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepFailure>,
    /// A random number chosen per save, so a writer can recognise its own save
    /// after an error that left the outcome unknown.
    #[serde(default)]
    pub writer: u64,
    /// Who is running the run now, and until when the claim holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// The gate or timer the run is stopped at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// Every gate decision, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    /// A seal over the head, written by an encrypting wrapper (the
    /// `steadfast-seal` crate) so that a changed status, wait, decision or
    /// step count is detected; stores keep it as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// What people did to the run by hand (cancel, retry, rewind, fork),
    /// oldest first; at most [`MAX_AUDIT_ENTRIES`], the oldest dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditEntry>,
    /// What a listed run was started with (its steps), so that a start of
    /// the same id with other steps, or a worker or a run with other steps,
    /// is refused before any step has run. Records written before it
    /// existed, and durable functions, have none, and are taken to match.
    pub origin: Option<Origin>,
    /// What the run's steps spent and its budgets
    /// ([`StepCtx::spend`](crate::StepCtx::spend)); none until either is
    /// set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend: Option<crate::record::spend::Spend>,
    /// Its priority and partition in the workers' queue, as it was started
    /// ([`StartOptions`](crate::StartOptions)); none for the default place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::record::queue::Queue>,
    /// Left by a worker that took the run but lacks the version of its
    /// workflow the run was started with ([`Origin::version`]): the run
    /// waits for a worker that has it, and `runs --stuck` says so. Cleared
    /// when code of that version takes the run. Boxed: the record is
    /// moved with every step, and an inline mark made that cost more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_over: Option<Box<PassedOver>>,
}

/// The longest worker name a [`PassedOver`] keeps, in bytes (a longer one
/// is cut in its middle).
pub const MAX_PASSED_OVER_BY_BYTES: usize = 256;

/// The most versions a [`PassedOver`] lists.
pub const MAX_PASSED_OVER_VERSIONS: usize = 16;

/// A worker passed a run over: it has the run's workflow, but not the
/// version the run was started with ([`Checkpoint::passed_over`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PassedOver {
    /// The version the run needs.
    pub version: String,
    /// The versions of the workflow the worker had, newest last (at most
    /// [`MAX_PASSED_OVER_VERSIONS`], the newest kept).
    pub available: Vec<String>,
    /// The worker, written out.
    pub by: String,
    /// When.
    pub at: Timestamp,
}

impl PassedOver {
    /// The mark of worker `by` lacking `version`, having `available`.
    pub fn new(version: &str, available: &[&str], by: &str, at: Timestamp) -> Self {
        let skip = available.len().saturating_sub(MAX_PASSED_OVER_VERSIONS);
        PassedOver {
            version: version.to_string(),
            available: available[skip..].iter().map(|v| v.to_string()).collect(),
            by: crate::record::limits::cut_middle(by.to_string(), MAX_PASSED_OVER_BY_BYTES),
            at,
        }
    }

    fn check(&self) -> Result<(), String> {
        crate::record::limits::check_version("the version it needs", &self.version)?;
        if self.available.len() > MAX_PASSED_OVER_VERSIONS {
            return Err(format!(
                "it lists {} versions, more than {MAX_PASSED_OVER_VERSIONS}",
                self.available.len()
            ));
        }
        for v in &self.available {
            crate::record::limits::check_version("a version it lists", v)?;
        }
        if self.by.len() > MAX_PASSED_OVER_BY_BYTES {
            return Err(format!(
                "its worker's name is longer than {MAX_PASSED_OVER_BY_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

/// What a listed run was started with: a fingerprint of its step names
/// ([`Checkpoint::origin`]). Step names are no secret (the record lists the
/// completed ones), so the fingerprint reveals nothing the record does not;
/// the input is compared as the state keeps it, never fingerprinted.
///
/// ```
/// use steadfast_core::Origin;
/// let a = Origin::listed(["fetch", "write"]);
/// assert_eq!(a, Origin::listed(["fetch", "write"]));
/// assert_ne!(a, Origin::listed(["fetch", "review"]));
/// assert_ne!(a, Origin::listed(["fetch"]));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Origin {
    /// How many steps the workflow had.
    pub steps: usize,
    /// A fingerprint of the step names, in order: the first 16 bytes of a
    /// SHA-256 over each name with its length, in hex.
    pub steps_sha256: String,
    /// The version of the workflow the run was started with (a flow file's
    /// declared `version`, else a digest of the file;
    /// [`Workflow::with_version`](crate::Workflow::with_version)): the run
    /// resumes only under that version. None for workflows without one and
    /// for records written before versions were recorded: those resume
    /// under any version. Builds before it ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl Origin {
    /// The origin of a listed workflow with these step names.
    pub fn listed<'a>(steps: impl IntoIterator<Item = &'a str>) -> Self {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        let mut count = 0;
        for name in steps {
            count += 1;
            hash.update((name.len() as u64).to_le_bytes());
            hash.update(name.as_bytes());
        }
        Origin {
            steps: count,
            steps_sha256: hash
                .finalize()
                .iter()
                .take(16)
                .map(|b| format!("{b:02x}"))
                .collect(),
            version: None,
        }
    }

    /// The same origin, recorded as version `version` of its workflow.
    ///
    /// ```
    /// use steadfast_core::Origin;
    /// let v2 = Origin::listed(["fetch"]).versioned(Some("2"));
    /// assert_eq!(v2.version.as_deref(), Some("2"));
    /// assert!(v2.same_steps(&Origin::listed(["fetch"])));
    /// assert_ne!(v2, Origin::listed(["fetch"]));
    /// ```
    pub fn versioned(mut self, version: Option<&str>) -> Self {
        self.version = version.map(str::to_string);
        self
    }

    /// Whether `other` names the same steps, whatever the versions.
    pub fn same_steps(&self, other: &Origin) -> bool {
        self.steps == other.steps && self.steps_sha256 == other.steps_sha256
    }

    /// Whether a run of this origin resumes under workflow version
    /// `version`: a run recorded without a version resumes under any,
    /// one with a version only under that version.
    ///
    /// ```
    /// use steadfast_core::Origin;
    /// let old = Origin::listed(["fetch"]);
    /// assert!(old.runs_under(Some("2")) && old.runs_under(None));
    /// let v1 = old.versioned(Some("1"));
    /// assert!(v1.runs_under(Some("1")));
    /// assert!(!v1.runs_under(Some("2")) && !v1.runs_under(None));
    /// ```
    pub fn runs_under(&self, version: Option<&str>) -> bool {
        self.version.is_none() || self.version.as_deref() == version
    }
}

/// Who marks a run that a copy or an import is writing.
pub(crate) const COPIER: &str = "steadfast copy";

/// The reason of the mark a run being copied in carries.
pub(crate) const COPY_MARK: &str =
    "being copied in: a copy or import that stopped here left it unfinished; run it again";

/// How the reason of the mark of a run being forked starts and ends
/// (the original's id sits between).
pub(crate) const FORK_MARK: &str = "being forked from run ";
pub(crate) const FORK_MARK_END: &str =
    ": a fork that stopped here is unfinished; delete it and fork again";

/// The most audit entries a run keeps ([`Checkpoint::audit`]): beyond it,
/// the oldest go, so that a run operated on again and again keeps a head of
/// bounded size.
pub const MAX_AUDIT_ENTRIES: usize = 64;

/// The most rewound steps one [`AuditAction::Rewind`] lists by name; the
/// rest are counted in its `more`.
pub const MAX_REWOUND_LISTED: usize = 100;

/// One hand operation on a run: what, who, when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// What was done.
    pub action: AuditAction,
    /// Who did it (`--by`, or the user running the command).
    pub by: String,
    /// When, on the operator's clock.
    pub at: Timestamp,
}

impl AuditEntry {
    /// An entry for `action` by `by` at `at`.
    pub fn new(action: AuditAction, by: &str, at: Timestamp) -> Self {
        AuditEntry {
            action,
            by: by.to_string(),
            at,
        }
    }
}

/// What a hand operation did (see [`ops`](crate::ops)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum AuditAction {
    /// The run was cancelled.
    Cancel {
        /// Its status before.
        was: RunStatus,
        /// Why, if given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A failed run's error and attempt count were cleared.
    Retry {
        /// The failed step's index.
        index: usize,
        /// Its name.
        step: String,
        /// Attempts it had used.
        attempts: u32,
        /// The error it had.
        error: String,
    },
    /// The run was set back to step `to`: steps `to..from` are to run again.
    Rewind {
        /// The step that runs next (its index).
        to: usize,
        /// Its name.
        step: String,
        /// `next` before the rewind.
        from: usize,
        /// The status before.
        was: RunStatus,
        /// The rewound steps as their history recorded them (the first
        /// `MAX_REWOUND_LISTED`, 100); their updates are no longer part of the
        /// state.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rewound: Vec<RewoundStep>,
        /// Rewound steps not listed.
        #[serde(default, skip_serializing_if = "is_zero")]
        more: usize,
    },
    /// The per-step history below step `folded_into` was folded into that
    /// step's row ([`ops::prune`](crate::ops::prune)).
    Prune {
        /// The step whose row holds the merged updates of every step up
        /// to it.
        folded_into: usize,
        /// Its name.
        step: String,
    },
    /// This run was made as a copy of another one's first `at` steps.
    Fork {
        /// The run it was forked from.
        from_run: String,
        /// The step it resumes at (its index): the original's steps below it
        /// are this run's.
        at: usize,
        /// That step's name.
        step: String,
    },
    /// The run was moved to another version of its workflow
    /// ([`ops::plan::migrate`](crate::ops::plan::migrate)).
    Migrate {
        /// The steps of the version it was moved to: how many, and their
        /// names' fingerprint (as [`Origin`]).
        steps: usize,
        /// The fingerprint of those steps' names.
        steps_sha256: String,
        /// Recorded steps now known by another name: (old, new).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        renamed: Vec<(String, String)>,
        /// The version of the workflow it was moved to
        /// ([`Origin::version`]), if that workflow has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A step undone by a rewind, as its history row recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RewoundStep {
    /// Its index.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// The attempt that had succeeded.
    pub attempt: u32,
    /// When that attempt started.
    pub started_at: Timestamp,
    /// When it returned.
    pub finished_at: Timestamp,
}

impl AuditAction {
    /// A one-line account, for `show` and `history`.
    pub fn describe(&self) -> String {
        match self {
            AuditAction::Cancel { was, reason } => match reason {
                Some(r) => format!("cancelled (was {was}): {r}"),
                None => format!("cancelled (was {was})"),
            },
            AuditAction::Retry {
                index,
                step,
                attempts,
                ..
            } => format!(
                "retry: cleared the error and {attempts} used attempt(s) of step {index} ({step})"
            ),
            AuditAction::Rewind {
                to,
                step,
                from,
                was,
                ..
            } => format!("rewound to step {to} ({step}) from next step {from} (was {was}); steps {to}..{from} run again"),
            AuditAction::Prune { folded_into, step } => format!(
                "pruned: the history of steps 0 to {folded_into} was folded into the row of step {folded_into} ({step})"
            ),
            AuditAction::Fork { from_run, at, step } => {
                format!("forked from run {from_run:?} at step {at} ({step})")
            }
            AuditAction::Migrate {
                steps,
                steps_sha256,
                renamed,
                version,
            } => {
                let mut text = match version {
                    Some(v) => format!(
                        "migrated to version {v:?} of {steps} step(s) (fingerprint {steps_sha256})"
                    ),
                    None => format!(
                        "migrated to a version of {steps} step(s) (fingerprint {steps_sha256})"
                    ),
                };
                for (old, new) in renamed {
                    text.push_str(&format!("; {old:?} is now {new:?}"));
                }
                text
            }
        }
    }
}

/// Who holds a lease: a process on a host, told apart from a later process with
/// the same pid by its start time.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Owner {
    /// The host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The process's start time, in clock ticks since boot (0 if unknown).
    pub started: u64,
}

impl Owner {
    /// An owner identity.
    pub fn new(host: impl Into<String>, pid: u32, started: u64) -> Self {
        Owner {
            host: host.into(),
            pid,
            started,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {}", self.pid, self.host)
    }
}

/// A claim on a run: `owner` runs it until `until` unless it renews.
///
/// `until` is the holder's wall clock, which another host compares with its
/// own. On the holder's own host the claim is judged without wall clocks: a
/// holder whose process is gone has lost it, and a live one keeps it until
/// `local_until`, read on the host's boot clock, which nobody can set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    /// The holder.
    pub owner: Owner,
    /// When the claim lapses unless renewed, on the holder's wall clock.
    pub until: Timestamp,
    /// When the claim lapses unless renewed, in milliseconds since the
    /// holder's host booted (meaningful only on that host, while the holder
    /// lives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_until: Option<u64>,
}

impl Lease {
    /// A lease for `owner` until `until`, with no boot-clock deadline.
    pub fn new(owner: Owner, until: Timestamp) -> Self {
        Lease {
            owner,
            until,
            local_until: None,
        }
    }

    /// The same lease, lapsing `local_until` milliseconds after its host booted.
    pub fn local_until(mut self, local_until: Option<u64>) -> Self {
        self.local_until = local_until;
        self
    }
}

/// What a gate does when its timeout passes without a decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// Reject the run.
    #[default]
    Reject,
    /// Approve with no data.
    Approve,
}

impl std::str::FromStr for OnTimeout {
    type Err = String;
    /// `reject` or `approve`, as flow files and the bindings write it.
    ///
    /// ```
    /// use steadfast_core::OnTimeout;
    /// assert_eq!("approve".parse::<OnTimeout>(), Ok(OnTimeout::Approve));
    /// assert!("maybe".parse::<OnTimeout>().unwrap_err().contains("reject or approve"));
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reject" => Ok(OnTimeout::Reject),
            "approve" => Ok(OnTimeout::Approve),
            other => Err(format!(
                "on_timeout {other:?} is not one of reject or approve"
            )),
        }
    }
}

/// Where a stopped run waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Wait {
    /// At a gate, for a decision.
    Gate {
        /// The gate step's name.
        step: String,
        /// Since when.
        since: Timestamp,
        /// When the gate decides by itself, if ever.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_at: Option<Timestamp>,
        /// What it decides then.
        #[serde(default)]
        on_timeout: OnTimeout,
    },
    /// At a durable timer.
    Timer {
        /// The sleep step's name.
        step: String,
        /// When it wakes.
        until: Timestamp,
    },
    /// At a wait for a signal.
    Signal {
        /// The wait step's name.
        step: String,
        /// The signal's name.
        signal: String,
        /// Since when.
        since: Timestamp,
        /// When the wait gives up (the step then records `null`), if ever.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_at: Option<Timestamp>,
        /// A signal of the name was sent since the wait began: the run is
        /// due (the next run of it takes the signal).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        arrived: bool,
        /// When a worker looks again for a signal all the same (one whose
        /// sender died before marking the run due).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recheck_at: Option<Timestamp>,
    },
    /// Before a step, for a slot of a shared limit
    /// ([`LimitSpec`](crate::LimitSpec)): the run sleeps until `until`,
    /// then looks again.
    Limit {
        /// The step that waits for a slot.
        step: String,
        /// The limit's key.
        key: String,
        /// When it looks again.
        until: Timestamp,
    },
    /// At child runs ([`DurableCtx::children`](crate::DurableCtx::children)),
    /// for their outcomes.
    Children {
        /// The first child step of the group whose result is not recorded.
        step: String,
        /// The child runs under way, by id.
        runs: Vec<String>,
        /// Since when.
        since: Timestamp,
        /// One of them ended since the wait began: the run is due.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        arrived: bool,
        /// When a worker looks at the children all the same (one whose
        /// process died between its end and marking this run due).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recheck_at: Option<Timestamp>,
    },
}

impl Wait {
    /// The step the run waits at.
    pub fn step(&self) -> &str {
        match self {
            Wait::Gate { step, .. }
            | Wait::Timer { step, .. }
            | Wait::Limit { step, .. }
            | Wait::Signal { step, .. }
            | Wait::Children { step, .. } => step,
        }
    }
}

/// A decision at a gate: who, when, and what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Decision {
    /// The gate step's name.
    pub gate: String,
    /// Approved (true) or rejected (false).
    pub approved: bool,
    /// Who decided (`timeout` when the gate's timeout did).
    pub by: String,
    /// When.
    pub at: Timestamp,
    /// The approval's payload, merged into the state under the gate's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// The rejection's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the wait this decision answers began: a decision belongs to one
    /// wait at its gate, whatever the clocks of the deciding and the running
    /// process say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_since: Option<Timestamp>,
}

impl Decision {
    /// Marks the decision as answering the wait that began at `since`.
    pub fn answering(mut self, since: Timestamp) -> Self {
        self.waited_since = Some(since);
        self
    }

    /// An approval. Data `null` is no data: both merge `null` into the state
    /// under the gate's name, and both are stored as no data.
    pub fn approve(gate: &str, by: &str, at: Timestamp, data: Option<serde_json::Value>) -> Self {
        Decision {
            gate: gate.into(),
            approved: true,
            by: by.into(),
            at,
            data: data.filter(|d| !d.is_null()),
            reason: None,
            waited_since: None,
        }
    }

    /// A rejection.
    pub fn reject(gate: &str, by: &str, at: Timestamp, reason: Option<String>) -> Self {
        Decision {
            gate: gate.into(),
            approved: false,
            by: by.into(),
            at,
            data: None,
            reason,
            waited_since: None,
        }
    }
}

impl Checkpoint {
    /// An empty record for a run that has not completed any step.
    pub fn new(run_id: impl Into<String>, workflow: impl Into<String>, now: Timestamp) -> Self {
        Checkpoint {
            format: CHECKPOINT_FORMAT,
            run_id: run_id.into(),
            workflow: workflow.into(),
            status: RunStatus::Running,
            next: 0,
            completed: Vec::new(),
            state: State::new(),
            version: 0,
            created_at: now,
            updated_at: now,
            attempts: 0,
            error: None,
            writer: 0,
            lease: None,
            wait: None,
            decisions: Vec::new(),
            seal: None,
            audit: Vec::new(),
            origin: None,
            spend: None,
            queue: None,
            passed_over: None,
        }
    }

    /// Cancels the run as `by` at `now`: status cancelled, no wait, an
    /// audit entry; the lease stays (its holder may be finishing a step).
    /// Refused, with the reason, when the run has ended otherwise.
    pub(crate) fn mark_cancelled(
        &mut self,
        reason: Option<String>,
        by: &str,
        now: Timestamp,
    ) -> Result<(), String> {
        if matches!(
            self.status,
            RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
        ) {
            return Err(format!("it is already {}", self.status));
        }
        let was = self.status;
        self.status = RunStatus::Cancelled;
        self.wait = None;
        self.push_audit(AuditEntry::new(
            AuditAction::Cancel { was, reason },
            by,
            now,
        ));
        Ok(())
    }

    /// Retries the failed run as `by` at `now`: its error and the attempts
    /// its failed step used are cleared, so that the next call tries that
    /// step again with its whole budget; an audit entry says what was
    /// cleared. Refused, with the reason, unless the run failed.
    pub(crate) fn mark_retried(&mut self, by: &str, now: Timestamp) -> Result<(), String> {
        if self.status != RunStatus::Failed {
            return Err(format!(
                "it is {}, and only a failed run is retried",
                self.status
            ));
        }
        let (index, step, error) = match &self.error {
            Some(e) => (e.index, e.step.clone(), e.message.clone()),
            None => (self.next, String::new(), String::new()),
        };
        let action = AuditAction::Retry {
            index,
            step,
            attempts: self.attempts,
            error: crate::record::limits::cut_middle(error, 1024),
        };
        self.status = RunStatus::Running;
        self.error = None;
        self.attempts = 0;
        self.lease = None;
        self.push_audit(AuditEntry::new(action, by, now));
        Ok(())
    }

    /// Appends an audit entry, dropping the oldest beyond
    /// [`MAX_AUDIT_ENTRIES`].
    pub fn push_audit(&mut self, entry: AuditEntry) {
        self.audit.push(entry);
        if self.audit.len() > MAX_AUDIT_ENTRIES {
            let extra = self.audit.len() - MAX_AUDIT_ENTRIES;
            self.audit.drain(..extra);
        }
    }

    /// Marks the run as being built (by a fork, a copy or an import) from
    /// `at` on: cancelled, so that no worker takes it, with an audit entry
    /// by `by` that [`being_built`](Checkpoint::being_built) recognises and
    /// that says what left it (`why`). Its last save replaces the record.
    pub(crate) fn mark_building(&mut self, why: String, by: &str, at: Timestamp) {
        self.status = RunStatus::Cancelled;
        self.updated_at = at;
        self.push_audit(AuditEntry::new(
            AuditAction::Cancel {
                was: RunStatus::Running,
                reason: Some(why),
            },
            by,
            at,
        ));
    }

    /// Whether this is a run that a fork, a copy or an import is still
    /// writing (or left unfinished): cancelled, with the mark they put in
    /// its audit as their last entry. Retention and `prune` leave such a
    /// run alone; copying or importing it again replaces it.
    ///
    /// ```
    /// use steadfast_core::{Checkpoint, Timestamp};
    /// let cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
    /// assert!(!cp.being_built());
    /// ```
    pub fn being_built(&self) -> bool {
        self.status == RunStatus::Cancelled
            && self.audit.last().is_some_and(|a| match &a.action {
                AuditAction::Cancel {
                    was: RunStatus::Running,
                    reason: Some(r),
                } => {
                    (a.by == COPIER && r == COPY_MARK)
                        || (r.starts_with(FORK_MARK) && r.ends_with(FORK_MARK_END))
                }
                _ => false,
            })
    }

    /// Checks the record's internal consistency; stores call this on decode and
    /// report a failure as [`StoreError::Corrupt`](crate::StoreError::Corrupt).
    pub fn check(&self) -> Result<(), String> {
        self.check_as(CHECKPOINT_FORMAT)
    }

    /// [`check`](Checkpoint::check) of a record as a store with blobs keeps
    /// it: one of format [`STORED_DECISIONS_FORMAT`] (its decisions' data in
    /// stored form, which a load puts back) passes too.
    pub fn check_stored(&self) -> Result<(), String> {
        match self.format {
            STORED_DECISIONS_FORMAT => self.check_as(STORED_DECISIONS_FORMAT),
            _ => self.check(),
        }
    }

    fn check_as(&self, format: u32) -> Result<(), String> {
        self.check_shape_as(format)?;
        if self.version == 0 {
            return Err("version 0 is never stored".into());
        }
        Ok(())
    }

    /// When a worker may next take this run, or `None` when no worker
    /// should (it is finished, failed, or waits at a gate for a person with
    /// no timeout). The one rule every store and worker uses:
    ///
    /// - `pending`: now (since it was recorded);
    /// - `running`: when its lease runs out (a run marked running without a
    ///   lease was interrupted: at once, from its creation);
    /// - `sleeping`: when its timer wakes;
    /// - `waiting`: at once when its gate has a decision for this wait (at
    ///   the epoch, whatever the decider's clock), else at the gate's
    ///   timeout, else never;
    /// - `completed`, `rejected`, `failed`, `cancelled`: never (a failed run
    ///   used up its attempts; running it again is a person's call).
    ///
    /// A lease still held pushes the time to the lease's end.
    ///
    /// The times are wall-clock times of whoever wrote them; a worker
    /// compares them with its runner's clock (the database's, on stores that
    /// have one).
    ///
    /// ```
    /// use steadfast_core::{Checkpoint, RunStatus, Timestamp};
    /// let mut cp = Checkpoint::new("r", "wf", Timestamp::from_unix_millis(5));
    /// cp.status = RunStatus::Pending;
    /// assert_eq!(cp.runnable_at(), Some(Timestamp::from_unix_millis(5)));
    /// cp.status = RunStatus::Completed;
    /// assert_eq!(cp.runnable_at(), None);
    /// ```
    pub fn runnable_at(&self) -> Option<Timestamp> {
        let at = self.wake_time()?;
        // A lease still held (a `run --wait` sleeping through its timer)
        // keeps the run its holder's until it lapses.
        Some(match &self.lease {
            Some(lease) => at.max(lease.until),
            None => at,
        })
    }

    /// [`runnable_at`](Checkpoint::runnable_at) before any lease is counted.
    fn wake_time(&self) -> Option<Timestamp> {
        match self.status {
            RunStatus::Pending => Some(self.updated_at),
            // Without a lease: since it was created, which (unlike the time of
            // its last save) stays put, so a store's index over this time is
            // not rewritten by every save.
            RunStatus::Running => Some(self.lease.as_ref().map_or(self.created_at, |l| l.until)),
            RunStatus::Sleeping => match &self.wait {
                Some(Wait::Timer { until, .. }) | Some(Wait::Limit { until, .. }) => Some(*until),
                _ => Some(self.updated_at),
            },
            RunStatus::Waiting => match &self.wait {
                Some(Wait::Gate {
                    step,
                    since,
                    timeout_at,
                    ..
                }) => {
                    let decided = self
                        .decisions
                        .iter()
                        .any(|d| d.gate == *step && d.waited_since == Some(*since));
                    if decided {
                        // Due at once, whatever the decider's clock said.
                        Some(Timestamp::EPOCH)
                    } else {
                        *timeout_at
                    }
                }
                Some(Wait::Children {
                    arrived,
                    recheck_at,
                    ..
                }) => {
                    if *arrived {
                        Some(Timestamp::EPOCH)
                    } else {
                        *recheck_at
                    }
                }
                Some(Wait::Signal {
                    arrived,
                    timeout_at,
                    recheck_at,
                    ..
                }) => {
                    if *arrived {
                        Some(Timestamp::EPOCH)
                    } else {
                        match (*timeout_at, *recheck_at) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        }
                    }
                }
                _ => Some(self.updated_at),
            },
            RunStatus::Completed
            | RunStatus::Rejected
            | RunStatus::Failed
            | RunStatus::Cancelled => None,
        }
    }

    /// The part of [`check`](Checkpoint::check) that holds before a store
    /// sets the version: the format and `next` against the completed steps.
    pub(crate) fn check_shape(&self) -> Result<(), String> {
        self.check_shape_as(CHECKPOINT_FORMAT)
    }

    fn check_shape_as(&self, format: u32) -> Result<(), String> {
        if self.format != format {
            return Err(format!(
                "checkpoint format {} is not understood by this build (it reads {CHECKPOINT_FORMAT})",
                self.format
            ));
        }
        if self.next != self.completed.len() {
            return Err(format!(
                "next is {} but {} completed steps are listed",
                self.next,
                self.completed.len()
            ));
        }
        if let Some(spend) = &self.spend {
            spend
                .check()
                .map_err(|r| format!("its spend record: {r}"))?;
        }
        if let Some(queue) = &self.queue {
            queue
                .check()
                .map_err(|r| format!("its place in the queue: {r}"))?;
        }
        if let Some(v) = self.origin.as_ref().and_then(|o| o.version.as_deref()) {
            crate::record::limits::check_version("the version it was started with", v)?;
        }
        if let Some(p) = &self.passed_over {
            p.check()
                .map_err(|r| format!("the mark of a worker that passed it over: {r}"))?;
        }
        Ok(())
    }
}

/// What one completed step contributed: the history row that stores which keep
/// per-step history (or persist deltas) may record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// The step's index.
    pub index: usize,
    /// The step's name.
    pub name: String,
    /// The update it returned (already merged into the checkpoint's state).
    pub update: Update,
    /// The attempt that succeeded (1-based).
    pub attempt: u32,
    /// When that attempt started.
    pub started_at: Timestamp,
    /// When it returned.
    pub finished_at: Timestamp,
}

impl StepRecord {
    /// A history row.
    pub fn new(
        index: usize,
        name: &str,
        update: Update,
        attempt: u32,
        started_at: Timestamp,
        finished_at: Timestamp,
    ) -> Self {
        StepRecord {
            index,
            name: name.to_string(),
            update,
            attempt,
            started_at,
            finished_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    #[test]
    fn when_a_worker_may_take_a_run() {
        let mut cp = Checkpoint::new("r", "wf", at(1_000));
        cp.status = RunStatus::Sleeping;
        cp.wait = Some(Wait::Timer {
            step: "nap".into(),
            until: at(5_000),
        });
        assert_eq!(cp.runnable_at(), Some(at(5_000)));
        // A holder sleeping through its timer keeps the run until its lease ends.
        cp.lease = Some(Lease::new(Owner::new("h", 1, 1), at(9_000)));
        assert_eq!(cp.runnable_at(), Some(at(9_000)));
        cp.lease = None;

        cp.status = RunStatus::Waiting;
        cp.wait = Some(Wait::Gate {
            step: "review".into(),
            since: at(2_000),
            timeout_at: None,
            on_timeout: OnTimeout::Reject,
        });
        assert_eq!(cp.runnable_at(), None, "a person decides");
        // A decision for an earlier wait at the gate does not count.
        cp.decisions
            .push(Decision::approve("review", "ada", at(1_500), None).answering(at(1_000)));
        assert_eq!(cp.runnable_at(), None);
        // One for this wait makes it due at once, whatever the decider's clock.
        cp.decisions
            .push(Decision::approve("review", "ada", at(99_000), None).answering(at(2_000)));
        assert_eq!(cp.runnable_at(), Some(Timestamp::EPOCH));

        cp.status = RunStatus::Running;
        assert_eq!(
            cp.runnable_at(),
            Some(cp.updated_at),
            "interrupted without a lease"
        );
        cp.lease = Some(Lease::new(Owner::new("h", 1, 1), at(7_000)));
        assert_eq!(cp.runnable_at(), Some(at(7_000)));
        for done in [RunStatus::Completed, RunStatus::Rejected, RunStatus::Failed] {
            cp.status = done;
            assert_eq!(cp.runnable_at(), None, "{done}");
        }
    }
}
