//! The native part of the `steadfast` Node.js package: the Rust engine and its
//! stores, exposed to the JavaScript layer in `index.js`, which is the
//! documented API (with its types in `index.d.ts`).
//!
//! Values cross the boundary as JSON text, checked by the JavaScript layer on
//! the way out of JavaScript (finite numbers, plain objects, with the path of
//! a refused value) and by the engine again before anything is saved. Errors
//! cross as a rejection whose message is [`PREFIX`] and a JSON object
//! `{kind, message, id?, step?}`, which the JavaScript layer turns into an
//! instance of the class named by `kind`.

// Node-API's generated registrations are left out of test builds, which
// would leave every exported function unused there.
#![cfg_attr(test, allow(dead_code))]

mod durable;
mod graph;
mod store;
mod workflow;

use std::time::Duration;

use serde_json::{json, Value};
use steadfast::{error_chain, Error, StoreError, StoreErrorKind};

/// A JavaScript function called from the engine with one argument, whose
/// promise resolves to JSON text.
pub type JsCall<A> = napi::threadsafe_function::ThreadsafeFunction<
    A,
    napi::bindgen_prelude::Promise<String>,
    A,
    napi::Status,
    false,
>;

/// What starts the message of every error this module rejects with.
pub const PREFIX: &str = "steadfast-error:";

/// A rejection carrying `kind` and `message` (and any other fields of
/// `extra`) for the JavaScript layer.
pub(crate) fn reject(kind: &str, message: String, extra: Value) -> napi::Error {
    let mut body = json!({ "kind": kind, "message": message });
    if let (Some(b), Value::Object(more)) = (body.as_object_mut(), extra) {
        b.extend(more);
    }
    napi::Error::from_reason(format!("{PREFIX}{body}"))
}

/// An `InvalidInput` rejection: an argument out of its range or shape.
pub(crate) fn invalid(message: impl Into<String>) -> napi::Error {
    reject("InvalidInput", message.into(), Value::Null)
}

/// The class name for a store error's kind.
pub(crate) fn store_kind(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::Conflict => "Conflict",
        StoreErrorKind::Corrupt => "Corrupt",
        StoreErrorKind::TooLarge => "TooLarge",
        StoreErrorKind::InvalidInput => "InvalidInput",
        StoreErrorKind::OutcomeUnknown => "OutcomeUnknown",
        StoreErrorKind::Unavailable => "Unavailable",
        StoreErrorKind::Unsupported => "Unsupported",
        StoreErrorKind::NotFound => "NotFound",
        _ => "StoreFailure",
    }
}

/// The rejection for a store error, with the message the CLI prints.
pub(crate) fn store_err(e: &StoreError) -> napi::Error {
    reject(store_kind(e.kind()), error_chain(e), Value::Null)
}

/// The class name for an engine error, the same mapping as Python's.
fn engine_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidRunId { .. } => "InvalidRunId",
        Error::InvalidWorkflow { .. } => "InvalidWorkflow",
        Error::WorkflowChanged { .. } => "WorkflowChanged",
        Error::StepFailed { .. } => "StepFailed",
        Error::InvalidValue { .. } => "InvalidValue",
        Error::Held { .. } | Error::ClaimLost { .. } | Error::Removed { .. } => "Held",
        Error::InvalidInput { .. } => "InvalidInput",
        Error::NoSuchRun { .. } => "NoSuchRun",
        Error::NotWaiting { .. } => "NotWaiting",
        Error::Cancelled { .. } => "Cancelled",
        Error::Suspended(_) => "Suspended",
        Error::Store { source, .. } => store_kind(source.kind()),
        _ => "SteadfastError",
    }
}

/// The message of an engine error: the CLI's, or for a suspension what the
/// function should do with it.
fn engine_message(e: &Error) -> String {
    match e {
        Error::Suspended(s) => match s {
            steadfast::Suspension::Waiting { gate } => format!(
                "the run stopped at {gate:?} to wait (for a decision at a gate or a signal); let this propagate"
            ),
            steadfast::Suspension::Sleeping { until } => {
                format!("the run stopped at a durable timer until {until}; let this propagate")
            }
            steadfast::Suspension::Rejected { gate, .. } => {
                format!("gate {gate:?} was rejected; let this propagate")
            }
            other => format!("the run stopped ({other:?}); let this propagate"),
        },
        other => error_chain(other),
    }
}

/// The rejection for an engine error; `id` tags an error a context call
/// raised, so that the same error comes back out when the function lets it
/// propagate.
pub(crate) fn engine_err(e: &Error, id: Option<u64>) -> napi::Error {
    let step = match e {
        Error::StepFailed { step, .. } => Some(step.clone()),
        _ => None,
    };
    reject(
        engine_kind(e),
        engine_message(e),
        json!({ "id": id, "step": step }),
    )
}

/// A duration given in milliseconds from JavaScript, checked: finite, not
/// negative, in `range`.
pub(crate) fn millis(
    what: &str,
    ms: f64,
    range: Option<steadfast::limits::DurationRange>,
) -> napi::Result<Duration> {
    let d = Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
        invalid(format!(
            "{what}: {ms} is not a duration in milliseconds (a finite number, 0 or more)"
        ))
    })?;
    if let Some(range) = range {
        range.check(what, d).map_err(invalid)?;
    }
    Ok(d)
}

/// JSON text from the JavaScript layer, parsed; `what` names it in the error.
pub(crate) fn parse(what: &str, text: &str) -> napi::Result<Value> {
    serde_json::from_str(text).map_err(|e| invalid(format!("{what}: not JSON: {e}")))
}

/// A value as JSON text for the JavaScript layer.
pub(crate) fn text<T: serde::Serialize>(v: &T) -> napi::Result<String> {
    serde_json::to_string(v).map_err(|e| napi::Error::from_reason(e.to_string()))
}

/// The package's version, the same as the Rust crates'.
#[napi_derive::napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The store URL used when none is given: SQLite under `.steadfast/`.
#[napi_derive::napi]
pub fn default_store_url() -> String {
    steadfast::DEFAULT_STORE_URL.to_string()
}

/// The id of the child run that step `step` of run `parent` starts.
#[napi_derive::napi]
pub fn child_id(parent: String, step: String) -> String {
    steadfast::child_id(&parent, &step)
}
