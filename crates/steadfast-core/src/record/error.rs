//! Errors of the run loop, of stores and of steps.

use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A boxed error from user code or a backend.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong in a store, independent of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The stored version was not the expected one: someone else saved first.
    Conflict,
    /// The stored data cannot be decoded. Nothing was changed; a human must look.
    Corrupt,
    /// The value is larger than the store accepts. Nothing was written.
    TooLarge,
    /// The value or run id cannot be stored as given. Nothing was written.
    InvalidInput,
    /// The save may or may not have taken effect. Reload to find out.
    OutcomeUnknown,
    /// The store cannot be reached or used right now (I/O error, lock timeout, a
    /// handle poisoned by an earlier fsync failure).
    Unavailable,
    /// The operation or URL is not supported by this build.
    Unsupported,
    /// The store does not exist (and was not to be created).
    NotFound,
}

/// An error from a [`Store`](crate::Store), with a portable [`StoreErrorKind`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Compare-and-swap failed.
    #[error("conflict on run {run_id:?}: expected version {}, found {}", show_version(*.expected), show_version(*.found))]
    Conflict {
        /// The run.
        run_id: String,
        /// The version the writer expected (`None`: absent).
        expected: Option<u64>,
        /// The version that was stored (`None`: absent).
        found: Option<u64>,
    },
    /// The stored bytes cannot be decoded.
    #[error("corrupt store at {location}: {reason}")]
    Corrupt {
        /// Where: a path with line and column, a row, an item.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// The value exceeds a size limit.
    #[error("run {run_id:?}: {what} is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// The run.
        run_id: String,
        /// What was measured ("state", "store file").
        what: &'static str,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// Bad input to the store.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The save may have landed.
    #[error("outcome of save for run {run_id:?} unknown")]
    OutcomeUnknown {
        /// The run.
        run_id: String,
        /// The failure that left the outcome open.
        #[source]
        source: BoxError,
    },
    /// An I/O error, with what was being done.
    #[error("{context}")]
    Io {
        /// What was being done, and to which path.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A lock wait ran out.
    #[error("timed out after {waited:?} waiting for the lock {}; another process holds it (a stopped or hung process keeps it until it exits)", .path.display())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The handle refuses writes after an earlier durability failure.
    #[error("store {} refuses saves after an earlier failure to make data durable; reopen it to read the disk again", .path.display())]
    Poisoned {
        /// The store's path.
        path: PathBuf,
    },
    /// Not supported by this build or backend.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The store (its file or database) does not exist, and the caller asked
    /// not to create it.
    #[error("{0}")]
    NotFound(String),
    /// Any other backend failure.
    #[error("{message}")]
    Backend {
        /// The portable kind.
        kind: StoreErrorKind,
        /// What happened.
        message: String,
        /// The cause.
        #[source]
        source: Option<BoxError>,
    },
}

fn show_version(v: Option<u64>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| v.to_string())
}

impl StoreError {
    /// The portable kind of this error.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Conflict { .. } => StoreErrorKind::Conflict,
            StoreError::Corrupt { .. } => StoreErrorKind::Corrupt,
            StoreError::TooLarge { .. } => StoreErrorKind::TooLarge,
            StoreError::InvalidInput(_) => StoreErrorKind::InvalidInput,
            StoreError::OutcomeUnknown { .. } => StoreErrorKind::OutcomeUnknown,
            StoreError::Io { .. }
            | StoreError::LockTimeout { .. }
            | StoreError::Poisoned { .. } => StoreErrorKind::Unavailable,
            StoreError::Unsupported(_) => StoreErrorKind::Unsupported,
            StoreError::NotFound(_) => StoreErrorKind::NotFound,
            StoreError::Backend { kind, .. } => *kind,
        }
    }

    /// Whether trying the same operation again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Io { .. }
                | StoreError::LockTimeout { .. }
                | StoreError::OutcomeUnknown { .. }
        ) || matches!(
            self,
            StoreError::Backend {
                kind: StoreErrorKind::Unavailable,
                ..
            }
        )
    }

    /// A backend failure of `kind`, described by `message`, with no cause
    /// to carry (its text is in the message).
    ///
    /// ```
    /// use steadfast_core::{StoreError, StoreErrorKind};
    /// let e = StoreError::backend(StoreErrorKind::TooLarge, "the file is 2 GiB");
    /// assert_eq!(e.kind(), StoreErrorKind::TooLarge);
    /// assert_eq!(e.to_string(), "the file is 2 GiB");
    /// ```
    pub fn backend(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError::Backend {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The store cannot be used right now (a worker thread died, a write was
    /// abandoned): [`StoreErrorKind::Unavailable`], which a retry may cure.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::backend(StoreErrorKind::Unavailable, message)
    }

    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }
}

/// The error a step returns. Retryable by default; mark it terminal with
/// [`StepError::terminal`] when trying again cannot help.
///
/// Any error type converts into a retryable `StepError`, so `?` works in steps.
///
/// ```
/// use steadfast_core::StepError;
/// let e: StepError = std::io::Error::other("connection reset").into();
/// assert!(!e.is_terminal());
/// let e = StepError::terminal("the document does not exist");
/// assert!(e.is_terminal());
/// ```
pub struct StepError {
    pub(crate) source: BoxError,
    pub(crate) terminal: bool,
    pub(crate) kind: StepErrorKind,
    pub(crate) retry_after: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepErrorKind {
    Failed,
    TimedOut(Duration),
    /// A value that cannot be saved; carries the key path.
    InvalidValue(String),
}

impl StepError {
    /// A retryable error.
    pub fn retryable(e: impl Into<BoxError>) -> Self {
        StepError {
            source: e.into(),
            terminal: false,
            kind: StepErrorKind::Failed,
            retry_after: None,
        }
    }

    /// A retryable error from a provider that asked to be called again
    /// after `after` (HTTP 429 with `Retry-After`): the next attempt waits
    /// at least that long, and when the step holds a shared limit
    /// ([`LimitSpec`](crate::LimitSpec)), every step of that key waits
    /// until then too, across processes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use steadfast_core::StepError;
    /// let e = StepError::retry_after("rate limited", Duration::from_secs(30));
    /// assert_eq!(e.retry_after_hint(), Some(Duration::from_secs(30)));
    /// assert!(!e.is_terminal());
    /// ```
    pub fn retry_after(e: impl Into<BoxError>, after: Duration) -> Self {
        StepError {
            retry_after: Some(after.min(MAX_RETRY_AFTER)),
            ..Self::retryable(e)
        }
    }

    /// How long the provider asked to wait, if it did.
    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after
    }

    /// An error that fails the step at once, without further attempts.
    pub fn terminal(e: impl Into<BoxError>) -> Self {
        StepError {
            source: e.into(),
            terminal: true,
            kind: StepErrorKind::Failed,
            retry_after: None,
        }
    }

    /// A value the step produced cannot be stored (NaN, nesting too deep, ...).
    pub fn invalid_value(path: impl Into<String>, reason: impl Into<String>) -> Self {
        StepError {
            source: reason.into().into(),
            terminal: true,
            kind: StepErrorKind::InvalidValue(path.into()),
            retry_after: None,
        }
    }

    pub(crate) fn timed_out(after: Duration) -> Self {
        StepError {
            source: format!("timed out after {after:?}").into(),
            terminal: false,
            kind: StepErrorKind::TimedOut(after),
            retry_after: None,
        }
    }

    /// Whether this error stops the step without further attempts.
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// Whether the step ran past its timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, StepErrorKind::TimedOut(_))
    }

    /// The underlying error.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl<E: Into<BoxError>> From<E> for StepError {
    fn from(e: E) -> Self {
        StepError::retryable(e)
    }
}

impl fmt::Debug for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepError")
            .field("source", &self.source)
            .field("terminal", &self.terminal)
            .finish()
    }
}

impl fmt::Display for StepError {
    /// The cause's text; for a value that cannot be stored, with the path
    /// where it sits, so that the recorded error names it too.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            StepErrorKind::InvalidValue(path) if !path.is_empty() => {
                write!(f, "the value at `{path}` cannot be stored: {}", self.source)
            }
            _ => fmt::Display::fmt(&self.source, f),
        }
    }
}

/// An error from building a workflow or running one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The run id is not acceptable.
    #[error("invalid run id {run_id:?}: {reason}")]
    InvalidRunId {
        /// The run id (its first 64 characters).
        run_id: String,
        /// Why it was refused.
        reason: String,
    },
    /// The workflow definition is not acceptable.
    #[error("invalid workflow {workflow:?}: {reason}")]
    InvalidWorkflow {
        /// The workflow's name.
        workflow: String,
        /// Why it was refused.
        reason: String,
    },
    /// The stored run was made by different code than the workflow given now.
    #[error("run {run_id:?} was recorded by a different workflow: at step {at} the record has {} where the workflow given has {}; `steadfast plan` shows what differs, and `migrate` (or the override to accept changed code) moves the run on", shown(.stored), shown(.given))]
    WorkflowChanged {
        /// The run.
        run_id: String,
        /// The index of the first difference.
        at: usize,
        /// What the record has there (`None`: nothing, or a different workflow name).
        stored: Option<String>,
        /// What the workflow given has there.
        given: Option<String>,
    },
    /// A step failed after its attempts ran out (or with a terminal error).
    #[error("run {run_id:?}: step {index} ({step}) failed after {attempts} attempt(s)")]
    StepFailed {
        /// The run.
        run_id: String,
        /// The step's index in the workflow.
        index: usize,
        /// The step's name.
        step: String,
        /// Attempts made, across resumes.
        attempts: u32,
        /// Whether the last error was a timeout.
        timed_out: bool,
        /// The step's error.
        #[source]
        source: BoxError,
    },
    /// A step produced a value that could not be loaded back after saving.
    #[error("run {run_id:?}: step {index} ({step}) produced a value that cannot be stored at `{path}`: {reason}")]
    InvalidValue {
        /// The run.
        run_id: String,
        /// The step's index.
        index: usize,
        /// The step's name.
        step: String,
        /// The key path inside the state.
        path: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// Another owner holds the run's lease.
    #[error("run {run_id:?} is held by {holder} until {until}")]
    Held {
        /// The run.
        run_id: String,
        /// Who holds it.
        holder: crate::record::checkpoint::Owner,
        /// Until when (unless renewed).
        until: crate::record::clock::Timestamp,
    },
    /// Another process claimed the run between this call's look at it and
    /// its own claim (both saw it free; the other's claim landed first).
    /// This call ran nothing and held nothing.
    #[error("run {run_id:?} was claimed by another process first; this call ran nothing")]
    ClaimLost {
        /// The run.
        run_id: String,
    },
    /// The run was deleted, or replaced by an import or a copy, while this
    /// call held it (an operation forced past its lease): its last step's
    /// result was not saved, and nothing this call does reaches the store.
    #[error("run {run_id:?} was {how} while this call held it; its last result was not saved")]
    Removed {
        /// The run.
        run_id: String,
        /// What happened to it.
        how: Removal,
    },
    /// An argument is out of its range or cannot be stored (a duration, a
    /// decision's data, a name). Nothing was written.
    #[error("{what}: {reason}")]
    InvalidInput {
        /// What was given, and where.
        what: String,
        /// Why it was refused.
        reason: String,
    },
    /// No run has this id.
    #[error("no run {run_id:?} in the store")]
    NoSuchRun {
        /// The run.
        run_id: String,
    },
    /// A decision was given for a gate the run is not waiting at.
    #[error("run {run_id:?} is not waiting at gate {gate:?}: {detail}")]
    NotWaiting {
        /// The run.
        run_id: String,
        /// The gate named.
        gate: String,
        /// Where the run stands instead.
        detail: String,
    },
    /// The run was cancelled ([`ops::cancel`](crate::ops::cancel)): before
    /// this call, or while it ran (it stopped at a step boundary, or after
    /// the cancel grace period).
    #[error("run {run_id:?} was cancelled by {by}{}", .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Cancelled {
        /// The run.
        run_id: String,
        /// Who cancelled it.
        by: String,
        /// Why, if they said.
        reason: Option<String>,
    },
    /// A durable function stopped at a gate or timer (or was rejected there).
    /// Pass it on with `?`: [`Runner::durable`](crate::Runner::durable) turns
    /// it into the matching [`Outcome`](crate::Outcome).
    #[error("the run stopped: {0:?}")]
    Suspended(crate::record::outcome::Suspension),
    /// The store failed.
    #[error("run {run_id:?}: {op} failed")]
    Store {
        /// The run.
        run_id: String,
        /// What the run loop was doing (`load`, `save after step 3 (fetch)`).
        op: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl Error {
    /// The store error inside, if this is one.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Error::Store { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether another owner has the run: a held lease, a claim that
    /// another process made first, a conflict that fenced this caller out,
    /// or the run removed from under it.
    pub fn is_held_elsewhere(&self) -> bool {
        matches!(
            self,
            Error::Held { .. } | Error::ClaimLost { .. } | Error::Removed { .. }
        ) || self.is_conflict()
    }

    /// Whether this call never had the run: another owner held it, or
    /// claimed it first. Nothing ran, and nobody was fenced out.
    pub fn is_claim_missed(&self) -> bool {
        matches!(self, Error::Held { .. } | Error::ClaimLost { .. })
    }

    /// Whether this error is a compare-and-swap conflict in the store.
    pub fn is_conflict(&self) -> bool {
        self.store_error()
            .is_some_and(|e| e.kind() == StoreErrorKind::Conflict)
    }
}

/// What happened to a run that was removed from under the call holding it
/// ([`Error::Removed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removal {
    /// It was deleted.
    Deleted,
    /// It is being replaced by an import or a copy (the half-written run
    /// is there now).
    BeingReplaced,
    /// It was deleted and written again: by an import or a copy of
    /// another record of it, or as a new run under the same id.
    Replaced,
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Removal::Deleted => "deleted",
            Removal::BeingReplaced => "being replaced by an import or a copy",
            Removal::Replaced => "replaced (by an import, a copy, or a new run under its id)",
        })
    }
}

/// An error and its causes on one line, joined by `: ` (a cause whose words
/// the line already ends with is not repeated).
///
/// ```
/// let e = steadfast_core::StoreError::io("reading runs.db", std::io::Error::other("disk on fire"));
/// assert_eq!(steadfast_core::error_chain(&e), "reading runs.db: disk on fire");
/// ```
pub fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

pub(crate) use error_chain as chain;

/// The longest "retry after" a step can ask for ([`StepError::retry_after`]):
/// a day; a longer one is cut to it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// An error of store operation `op` on run `run_id`.
pub(crate) fn store_error(run_id: &str, op: &str, source: StoreError) -> Error {
    Error::Store {
        run_id: run_id.to_string(),
        op: op.to_string(),
        source,
    }
}

/// The error for input `what` that is refused because of `reason`.
pub(crate) fn invalid_input(what: &str, reason: String) -> Error {
    Error::InvalidInput {
        what: what.to_string(),
        reason,
    }
}

/// The error for a call of cancelled run `cp`, from its last cancel.
pub(crate) fn cancelled(cp: &crate::record::checkpoint::Checkpoint) -> Error {
    use crate::record::checkpoint::AuditAction;
    let last = cp.audit.iter().rev().find_map(|e| match &e.action {
        AuditAction::Cancel { reason, .. } => Some((e.by.clone(), reason.clone())),
        _ => None,
    });
    let (by, reason) = last.unwrap_or_else(|| ("someone".into(), None));
    Error::Cancelled {
        run_id: cp.run_id.clone(),
        by,
        reason,
    }
}

/// A side of a [`Error::WorkflowChanged`], quoted, or "nothing".
fn shown(what: &Option<String>) -> String {
    what.as_deref()
        .map_or("nothing".to_string(), |s| format!("{s:?}"))
}
