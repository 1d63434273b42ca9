//! Events: values a running step emits, recorded per run in order.
//!
//! A step emits values while it runs (a model's tokens, a tool's progress)
//! with [`StepCtx::emit`](crate::StepCtx::emit). Each lands in its run's
//! event log with a sequence number (1, 2, 3… per run, with no gap), the
//! step and the attempt that emitted it, and a time. The log is a store's
//! [`Events`](crate::store::Events) capability; the record of the run itself
//! is untouched, so a run that emits nothing writes nothing more.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::record::clock::Timestamp;
use crate::record::error::StoreError;

/// The largest value a step may emit, serialized, in bytes: 64 KiB. A
/// larger output belongs in the step's update, where large values are
/// stored once by reference.
pub const MAX_EVENT_BYTES: u64 = 64 * 1024;

/// The largest event value a store takes, as stored, in bytes: 128 KiB,
/// twice what a step may emit, which leaves room for an encrypting wrapper's
/// envelope around an emitted value.
pub const MAX_STORED_EVENT_BYTES: u64 = 2 * MAX_EVENT_BYTES;

/// The most events one append takes: an emitting step's buffer is written
/// in batches of at most this many.
pub const MAX_EVENTS_PER_APPEND: usize = 1000;

/// An event to append, not yet numbered: what a step emitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewEvent {
    /// The step that emitted it.
    pub step: String,
    /// The attempt of the step (1-based, across resumes).
    pub attempt: u32,
    /// When it was emitted.
    pub at: Timestamp,
    /// The value emitted.
    pub value: Value,
    /// Whether this is the first event of an execution of its step: a step
    /// that runs again after a crash emits under the same attempt, and this
    /// mark tells where the new execution begins (the events of the same
    /// step and attempt before it are superseded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first: bool,
}

impl NewEvent {
    /// An event of `step`'s attempt `attempt`, emitted at `at`.
    pub fn new(step: impl Into<String>, attempt: u32, at: Timestamp, value: Value) -> Self {
        NewEvent {
            step: step.into(),
            attempt,
            at,
            value,
            first: false,
        }
    }

    /// The event as recorded under `seq`.
    pub fn numbered(self, seq: u64) -> RunEvent {
        RunEvent {
            seq,
            step: self.step,
            attempt: self.attempt,
            at: self.at,
            value: self.value,
            first: self.first,
        }
    }
}

/// An event as recorded in its run's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunEvent {
    /// Its place in the run's log: 1 for the first, then one more each.
    pub seq: u64,
    /// The step that emitted it.
    pub step: String,
    /// The attempt of the step (1-based, across resumes).
    pub attempt: u32,
    /// When it was emitted.
    pub at: Timestamp,
    /// The value emitted.
    pub value: Value,
    /// Whether it is the first event of an execution of its step (see
    /// [`NewEvent::first`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first: bool,
}

impl RunEvent {
    /// The event as it was appended, without its number: to append it to
    /// another store's log (an import).
    pub fn unnumbered(&self) -> NewEvent {
        NewEvent {
            step: self.step.clone(),
            attempt: self.attempt,
            at: self.at,
            value: self.value.clone(),
            first: self.first,
        }
    }
}

/// Checks events on their way into a store, as every store must before it
/// appends: a valid run id, at least one and at most
/// [`MAX_EVENTS_PER_APPEND`] events, each step name a name, each attempt
/// from 1 to `i32::MAX`, each value within
/// [`MAX_VALUE_DEPTH`](crate::MAX_VALUE_DEPTH) with finite numbers and at
/// most [`MAX_STORED_EVENT_BYTES`] serialized. Returns each value's JSON text, for
/// stores that keep it as text.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::{store::check_events, NewEvent, Timestamp};
/// let ok = NewEvent::new("plan", 1, Timestamp::EPOCH, json!({"token": "Hel"}));
/// assert_eq!(check_events("r", &[ok]).unwrap(), [r#"{"token":"Hel"}"#]);
/// let big = NewEvent::new("plan", 1, Timestamp::EPOCH, json!("x".repeat(140_000)));
/// assert!(check_events("r", &[big]).is_err());
/// ```
pub fn check_events(run_id: &str, events: &[NewEvent]) -> Result<Vec<String>, StoreError> {
    if events.is_empty() || events.len() > MAX_EVENTS_PER_APPEND {
        return Err(StoreError::InvalidInput(format!(
            "run {run_id:?}: an append takes 1 to {MAX_EVENTS_PER_APPEND} events, not {}; nothing was written",
            events.len()
        )));
    }
    crate::record::ids::validate_run_id(run_id)
        .map_err(|e| StoreError::InvalidInput(format!("{e}; nothing was written")))?;
    let mut texts = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        crate::record::ids::check_step_name(&e.step).map_err(|reason| {
            StoreError::InvalidInput(format!(
                "run {run_id:?}: event {i} of the append: its step name: {reason}; nothing was written"
            ))
        })?;
        if e.attempt == 0 || e.attempt > i32::MAX as u32 {
            return Err(StoreError::InvalidInput(format!(
                "run {run_id:?}: event {i} of the append (step {:?}): attempt {} is outside 1 to {}; nothing was written",
                e.step,
                e.attempt,
                i32::MAX
            )));
        }
        crate::record::state::check_entries(std::iter::once(("value", &e.value))).map_err(
            |p| {
                StoreError::InvalidInput(format!(
                    "run {run_id:?}: event {i} of the append (step {:?}): the value at `{}`: {}; nothing was written",
                    e.step, p.path, p.reason
                ))
            },
        )?;
        let text = serde_json::to_string(&e.value).map_err(|err| {
            StoreError::InvalidInput(format!(
                "run {run_id:?}: event {i} of the append (step {:?}): {err}; nothing was written",
                e.step
            ))
        })?;
        if text.len() as u64 > MAX_STORED_EVENT_BYTES {
            return Err(StoreError::TooLarge {
                run_id: run_id.to_string(),
                what: "event value",
                size: text.len() as u64,
                limit: MAX_STORED_EVENT_BYTES,
            });
        }
        texts.push(text);
    }
    Ok(texts)
}
