//! Signals: named messages delivered to a run from outside it.
//!
//! A signal is kept in its run's event log (an event of the reserved step
//! [`SIGNAL_STEP`]), so that sending one never writes the run's record while
//! a process holds it. Each carries a random id. A wait for a name (a
//! durable function's `wait_for`, a flow file's `wait` step) takes the
//! oldest signal of that name after the last one the run's waits took, and
//! records it as its step's update: the delivery (name, data, sender, time,
//! number, id) under the step's name, and, under [`SIGNALS_KEY`], the id
//! and number of the last signal taken per name. Taking it is part of the
//! wait step's checkpoint, so each signal is delivered to one wait, once.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::record::clock::Timestamp;
use crate::record::events::{NewEvent, RunEvent};
pub use crate::record::keys::SIGNALS_KEY;
use crate::record::state::State;

/// The step name a signal is recorded under in the event log. Steps cannot
/// take it: durable functions' names starting with `__` are the engine's,
/// and a listed workflow refuses it.
pub const SIGNAL_STEP: &str = "__signal";

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
    /// A random id given when it was sent: it names the signal whatever
    /// number a log gives it.
    #[serde(default)]
    pub id: String,
}

impl Signal {
    /// The event that records a signal `name` carrying `data`, sent by `by`
    /// at `at`, under a new random id.
    pub fn event(name: &str, data: Value, by: &str, at: Timestamp) -> NewEvent {
        let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let mut e = NewEvent::new(
            SIGNAL_STEP,
            1,
            at,
            json!({ "signal": name, "data": data, "by": by, "id": id }),
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
            id: v
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        })
    }

    /// The delivery as a wait step records it under its name.
    pub fn delivery(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The last signal named `name` the run's waits took, as its state records
/// it: its id, its number in the log then, and when it was sent.
pub fn last_taken(state: &State, name: &str) -> Option<(String, u64, Timestamp)> {
    let entry = state.get(SIGNALS_KEY)?.get(name)?;
    Some((
        entry.get("id")?.as_str()?.to_string(),
        entry.get("seq")?.as_u64()?,
        Timestamp::from_unix_millis(entry.get("at")?.as_u64()?),
    ))
}

/// The value of [`SIGNALS_KEY`] once `taken` is the last signal of its name
/// taken.
pub fn taking(state: &State, taken: &Signal) -> Value {
    let mut all = state
        .get(SIGNALS_KEY)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    all.insert(
        taken.name.clone(),
        json!({ "id": taken.id, "seq": taken.seq, "at": taken.at.unix_millis() }),
    );
    Value::Object(all)
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
        assert_eq!(s.id.len(), 32);
        assert_ne!(
            Signal::from_event(&Signal::event("go", Value::Null, "ada", at).numbered(1))
                .unwrap()
                .id,
            s.id,
            "two signals share an id"
        );
        assert_eq!(s.delivery()["signal"], json!("go"));
        // An event of another step is not a signal, whatever it holds.
        let mut other = e.clone();
        other.step = "s".into();
        assert!(Signal::from_event(&other).is_none());
    }

    #[test]
    fn the_last_signal_taken_is_kept_per_name() {
        let at = Timestamp::from_unix_millis(5);
        let mut state = State::new();
        assert_eq!(last_taken(&state, "go"), None);
        let go =
            Signal::from_event(&Signal::event("go", Value::Null, "a", at).numbered(3)).unwrap();
        state.insert(SIGNALS_KEY.into(), taking(&state, &go));
        let stop =
            Signal::from_event(&Signal::event("stop", Value::Null, "a", at).numbered(4)).unwrap();
        state.insert(SIGNALS_KEY.into(), taking(&state, &stop));
        assert_eq!(last_taken(&state, "go"), Some((go.id.clone(), 3, at)));
        assert_eq!(last_taken(&state, "stop"), Some((stop.id.clone(), 4, at)));
    }
}
