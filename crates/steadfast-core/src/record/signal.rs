//! Signals: named messages delivered to a run from outside it.
//!
//! A signal is kept in its run's event log (an event of the reserved step
//! [`SIGNAL_STEP`]), so that sending one never writes the run's record while
//! a process holds it. A wait for the name (a durable function's
//! `wait_for`, a flow file's `wait` step) takes the oldest signal of that
//! name no earlier wait took, and records it as its step's update: the
//! delivery (name, data, sender, time, number) under the step's name, and
//! the number among those taken under [`SIGNALS_KEY`]. Taking it is part of
//! the wait step's checkpoint, so each signal is delivered to one wait, once.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::record::clock::Timestamp;
use crate::record::events::{NewEvent, RunEvent};
use crate::record::state::State;

/// The step name a signal is recorded under in the event log. Steps cannot
/// take it: names starting with `__` are the engine's.
pub const SIGNAL_STEP: &str = "__signal";

/// The state key listing the numbers of the signals the run's waits took.
pub const SIGNALS_KEY: &str = "__signals";

/// A signal as its run's log holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Signal {
    /// Its number in the run's event log.
    pub seq: u64,
    /// Its name, which a wait names.
    #[serde(rename = "signal")]
    pub name: String,
    /// What it carries (`null` when nothing).
    pub data: Value,
    /// Who sent it.
    pub by: String,
    /// When it was sent.
    pub at: Timestamp,
}

impl Signal {
    /// The event that records a signal `name` carrying `data`, sent by `by`
    /// at `at`.
    pub fn event(name: &str, data: Value, by: &str, at: Timestamp) -> NewEvent {
        let mut e = NewEvent::new(
            SIGNAL_STEP,
            1,
            at,
            json!({ "signal": name, "data": data, "by": by }),
        );
        e.first = true;
        e
    }

    /// The signal an event records, if it records one.
    pub fn from_event(e: &RunEvent) -> Option<Signal> {
        if e.step != SIGNAL_STEP {
            return None;
        }
        let v = e.value.as_object()?;
        Some(Signal {
            seq: e.seq,
            name: v.get("signal")?.as_str()?.to_string(),
            data: v.get("data").cloned().unwrap_or(Value::Null),
            by: v.get("by")?.as_str()?.to_string(),
            at: e.at,
        })
    }

    /// The delivery as a wait step records it under its name.
    pub fn delivery(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The numbers of the signals the run's waits have taken, as its state
/// lists them.
pub fn taken(state: &State) -> Vec<u64> {
    state
        .get(SIGNALS_KEY)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_goes_into_an_event_and_back() {
        let at = Timestamp::from_unix_millis(5);
        let e = Signal::event("go", json!({"n": 1}), "ada", at).numbered(7);
        let s = Signal::from_event(&e).expect("a signal");
        assert_eq!(
            (s.seq, s.name.as_str(), &s.data, s.by.as_str(), s.at),
            (7, "go", &json!({"n": 1}), "ada", at)
        );
        assert_eq!(s.delivery()["signal"], json!("go"));
        // An event of another step is not a signal, whatever it holds.
        let mut other = e.clone();
        other.step = "s".into();
        assert!(Signal::from_event(&other).is_none());
    }
}
