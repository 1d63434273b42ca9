//! One file per subcommand: its arguments and what it does. Each takes the
//! opened store and returns the exit code, or a [`Failure`].

pub mod approve;
pub mod cancel;
pub mod copy;
pub mod delete;
pub mod export;
pub mod fork;
pub mod gc;
pub mod history;
pub mod import;
pub mod limits;
pub mod plan;
pub mod prune;
pub mod reject;
pub mod rekey;
pub mod retry;
pub mod rewind;
pub mod run;
pub mod runs;
pub mod schedule;
pub mod serve;
pub mod show;
pub mod signal;
pub mod start;
pub mod watch;
pub mod worker;

use std::sync::Arc;

use steadfast::Store;

use crate::args::exit;
use steadfast::StoreExt as _;

/// What every command works on.
pub struct Ctx {
    /// The store, opened (and created only for `run`).
    pub store: Arc<dyn Store>,
    /// The same store as the seal that wraps it, when keys are given.
    pub sealed: Option<Arc<steadfast::seal::SealedStore>>,
    /// The store as opened, without the seal or the refusal of sealed
    /// records: for export and import, which move records as they are.
    pub raw: Arc<dyn Store>,
    /// Its URL, as given but with any password hidden, for messages.
    pub url: String,
}

impl Ctx {
    /// The clock decisions are stamped with: the store's own (the database
    /// server's) when it has one, else this machine's.
    pub fn clock(&self) -> Arc<dyn steadfast::Clock> {
        self.store
            .clock()
            .unwrap_or_else(|| Arc::new(steadfast::SystemClock))
    }
}

/// An error with the exit code it maps to.
pub struct Failure {
    /// The exit code.
    pub code: i32,
    /// What went wrong, with its causes.
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error = e.into();
        let code = classify(&error);
        Failure { code, error }
    }
}

/// A `--data JSON` argument, parsed exactly (a usage error when it is not
/// JSON that can be stored).
pub fn data_arg(text: Option<&str>) -> Result<Option<serde_json::Value>, Failure> {
    text.map(|t| {
        crate::command::parse_json_exact(t)
            .map_err(|e| usage(format!("--data is not JSON that can be stored: {e}")))
    })
    .transpose()
}

/// A usage error (exit code 2) with `msg`.
pub fn usage(msg: String) -> Failure {
    Failure {
        code: exit::USAGE,
        error: anyhow::anyhow!(msg),
    }
}

/// The exit code for an error: usage for bad input, held for another owner,
/// failed for the rest.
fn classify(e: &anyhow::Error) -> i32 {
    use steadfast::{Error, StoreErrorKind};
    if e.downcast_ref::<crate::flow::FlowError>().is_some() {
        return exit::USAGE;
    }
    if let Some(err) = e.downcast_ref::<Error>() {
        return match err {
            Error::Cancelled { .. } => exit::CANCELLED,
            e if e.is_held_elsewhere() => exit::HELD,
            Error::InvalidRunId { .. }
            | Error::InvalidInput { .. }
            | Error::InvalidWorkflow { .. }
            | Error::NotWaiting { .. }
            | Error::NoSuchRun { .. }
            | Error::WorkflowChanged { .. } => exit::USAGE,
            _ => exit::FAILED,
        };
    }
    if let Some(err) = e.downcast_ref::<steadfast::StoreError>() {
        return match err.kind() {
            StoreErrorKind::InvalidInput
            | StoreErrorKind::Unsupported
            | StoreErrorKind::NotFound => exit::USAGE,
            _ => exit::FAILED,
        };
    }
    exit::FAILED
}

/// The error for a run id the store does not have.
pub(crate) fn no_such_run(id: &str, ctx: &Ctx) -> Failure {
    usage(format!("no run {id:?} in {}", ctx.url))
}
