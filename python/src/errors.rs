//! Steadfast's errors as Python exception classes, with the messages the Rust
//! library and the CLI print.

use pyo3::create_exception;
use pyo3::exceptions::{PyBaseException, PyException};
use pyo3::prelude::*;
use steadfast::{error_chain, Error, StoreError, StoreErrorKind};

create_exception!(
    steadfast,
    SteadfastError,
    PyException,
    "Base class of every error Steadfast raises."
);
create_exception!(
    steadfast,
    InvalidRunId,
    SteadfastError,
    "A run id that is empty, too long or holds characters a store cannot keep."
);
create_exception!(
    steadfast,
    InvalidWorkflow,
    SteadfastError,
    "A workflow that cannot run: a duplicate or reserved step name, a duration out of range."
);
create_exception!(
    steadfast,
    WorkflowChanged,
    SteadfastError,
    "The run was recorded by a different workflow or different code; nothing new ran."
);
create_exception!(
    steadfast,
    StepFailed,
    SteadfastError,
    "A step failed for good: its attempts ran out or its error was terminal."
);
create_exception!(
    steadfast,
    InvalidValue,
    SteadfastError,
    "A step produced a value that cannot be stored and read back."
);
create_exception!(
    steadfast,
    Held,
    SteadfastError,
    "Another live process holds the run (or the LangGraph thread) and its lease has not run out."
);
create_exception!(
    steadfast,
    InvalidInput,
    SteadfastError,
    "An argument out of its range or shape; nothing was written."
);
create_exception!(
    steadfast,
    NoSuchRun,
    SteadfastError,
    "No run with that id in the store."
);
create_exception!(
    steadfast,
    NotWaiting,
    SteadfastError,
    "The run is not waiting at that gate."
);
create_exception!(
    steadfast,
    Cancelled,
    SteadfastError,
    "The run was cancelled."
);
create_exception!(
    steadfast,
    StoreFailure,
    SteadfastError,
    "The store failed; the message names the store and what it was doing."
);
create_exception!(
    steadfast,
    Conflict,
    StoreFailure,
    "Another writer saved the run first."
);
create_exception!(
    steadfast,
    Corrupt,
    StoreFailure,
    "A record or file that cannot be read: the store is never treated as empty."
);
create_exception!(
    steadfast,
    TooLarge,
    StoreFailure,
    "A state or value over the store's size limit."
);
create_exception!(
    steadfast,
    OutcomeUnknown,
    StoreFailure,
    "A save whose outcome is unknown (the connection dropped during the commit)."
);
create_exception!(
    steadfast,
    Unavailable,
    StoreFailure,
    "The store cannot be reached or is locked by another process."
);
create_exception!(
    steadfast,
    Unsupported,
    StoreFailure,
    "The store or URL does not support what was asked."
);
create_exception!(
    steadfast,
    NotFound,
    StoreFailure,
    "The store (a file, a schema) does not exist."
);
create_exception!(
    steadfast,
    Suspended,
    PyBaseException,
    "Raised inside a durable function when the run stops at a gate or timer; let it propagate."
);

/// Registers the classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    macro_rules! add {
        ($($t:ident),*) => { $( m.add(stringify!($t), py.get_type::<$t>())?; )* };
    }
    add!(
        SteadfastError,
        InvalidRunId,
        InvalidWorkflow,
        WorkflowChanged,
        StepFailed,
        InvalidValue,
        Held,
        InvalidInput,
        NoSuchRun,
        NotWaiting,
        Cancelled,
        StoreFailure,
        Conflict,
        Corrupt,
        TooLarge,
        OutcomeUnknown,
        Unavailable,
        Unsupported,
        NotFound,
        Suspended
    );
    Ok(())
}

/// The Python exception for a store error.
pub fn store_err(e: &StoreError) -> PyErr {
    store_kind_err(e.kind(), error_chain(e))
}

pub fn store_kind_err(kind: StoreErrorKind, msg: String) -> PyErr {
    match kind {
        StoreErrorKind::Conflict => Conflict::new_err(msg),
        StoreErrorKind::Corrupt => Corrupt::new_err(msg),
        StoreErrorKind::TooLarge => TooLarge::new_err(msg),
        StoreErrorKind::InvalidInput => InvalidInput::new_err(msg),
        StoreErrorKind::OutcomeUnknown => OutcomeUnknown::new_err(msg),
        StoreErrorKind::Unavailable => Unavailable::new_err(msg),
        StoreErrorKind::Unsupported => Unsupported::new_err(msg),
        StoreErrorKind::NotFound => NotFound::new_err(msg),
        _ => StoreFailure::new_err(msg),
    }
}

/// The Python exception for an engine error, with the message the CLI prints.
pub fn err(e: &Error) -> PyErr {
    let msg = error_chain(e);
    match e {
        Error::InvalidRunId { .. } => InvalidRunId::new_err(msg),
        Error::InvalidWorkflow { .. } => InvalidWorkflow::new_err(msg),
        Error::WorkflowChanged { .. } => WorkflowChanged::new_err(msg),
        Error::StepFailed { .. } => StepFailed::new_err(msg),
        Error::InvalidValue { .. } => InvalidValue::new_err(msg),
        Error::Held { .. } | Error::ClaimLost { .. } | Error::Removed { .. } => Held::new_err(msg),
        Error::InvalidInput { .. } => InvalidInput::new_err(msg),
        Error::NoSuchRun { .. } => NoSuchRun::new_err(msg),
        Error::NotWaiting { .. } => NotWaiting::new_err(msg),
        Error::Cancelled { .. } => Cancelled::new_err(msg),
        Error::Suspended(s) => Suspended::new_err(match s {
            steadfast::Suspension::Waiting { gate } => format!(
                "the run stopped at {gate:?} to wait (for a decision at a gate, a signal or child runs); let this propagate"
            ),
            steadfast::Suspension::Sleeping { until } => {
                format!("the run stopped at a durable timer until {until}; let this propagate")
            }
            steadfast::Suspension::Rejected { gate, .. } => {
                format!("gate {gate:?} was rejected; let this propagate")
            }
            other => format!("the run stopped ({other:?}); let this propagate"),
        }),
        Error::Store { source, .. } => store_kind_err(source.kind(), msg),
        _ => SteadfastError::new_err(msg),
    }
}

/// The Python exception for a graph store error.
pub fn graph_err(e: steadfast_graph::GraphError) -> PyErr {
    use steadfast_graph::GraphError;
    match e {
        GraphError::Held(m) => Held::new_err(m),
        GraphError::InvalidInput(m) => InvalidInput::new_err(m),
        GraphError::Unsupported(m) => Unsupported::new_err(m),
        GraphError::Store { kind, message } => store_kind_err(kind, message),
        other => SteadfastError::new_err(other.to_string()),
    }
}
