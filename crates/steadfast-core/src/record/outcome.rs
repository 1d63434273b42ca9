//! What a call of the run loop ends with, and what it reports as it goes.

use std::time::Duration;

use crate::record::checkpoint::Checkpoint;
use crate::record::clock::Timestamp;
use crate::record::state::State;

/// What a call of the run loop ended with, when it did not fail.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Outcome<T = State> {
    /// Every step is done; here is the final state.
    Completed(T),
    /// Stopped at a gate; [`approve`](crate::approve) or [`reject`](crate::reject) it,
    /// then run again.
    Waiting {
        /// The gate step's name.
        gate: String,
    },
    /// Stopped at a durable timer; run again after `until`.
    Sleeping {
        /// When the timer fires.
        until: Timestamp,
    },
    /// A gate was rejected; the run is over.
    Rejected {
        /// The gate step's name.
        gate: String,
        /// Why, if the rejection said.
        reason: Option<String>,
    },
}

impl<T> Outcome<T> {
    /// The final state, if the run completed.
    pub fn completed(self) -> Option<T> {
        match self {
            Outcome::Completed(t) => Some(t),
            _ => None,
        }
    }

    /// Converts the carried state.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Completed(t) => Outcome::Completed(f(t)),
            Outcome::Waiting { gate } => Outcome::Waiting { gate },
            Outcome::Sleeping { until } => Outcome::Sleeping { until },
            Outcome::Rejected { gate, reason } => Outcome::Rejected { gate, reason },
        }
    }

    /// Fallible [`map`](Outcome::map).
    pub fn try_map<U, E>(self, f: impl FnOnce(T) -> Result<U, E>) -> Result<Outcome<U>, E> {
        Ok(match self {
            Outcome::Completed(t) => Outcome::Completed(f(t)?),
            Outcome::Waiting { gate } => Outcome::Waiting { gate },
            Outcome::Sleeping { until } => Outcome::Sleeping { until },
            Outcome::Rejected { gate, reason } => Outcome::Rejected { gate, reason },
        })
    }
}

/// Why a run stopped before completing: the outcomes that carry no state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Suspension {
    /// Stopped at a gate.
    Waiting {
        /// The gate step's name.
        gate: String,
    },
    /// Stopped at a durable timer.
    Sleeping {
        /// When the timer fires.
        until: Timestamp,
    },
    /// A gate was rejected; the run is over.
    Rejected {
        /// The gate step's name.
        gate: String,
        /// Why, if the rejection said.
        reason: Option<String>,
    },
}

impl<T> From<Suspension> for Outcome<T> {
    fn from(s: Suspension) -> Self {
        match s {
            Suspension::Waiting { gate } => Outcome::Waiting { gate },
            Suspension::Sleeping { until } => Outcome::Sleeping { until },
            Suspension::Rejected { gate, reason } => Outcome::Rejected { gate, reason },
        }
    }
}

/// The suspension of a rejected run, from its last rejection.
pub(crate) fn rejected(cp: &Checkpoint) -> Suspension {
    let last = cp.decisions.iter().rev().find(|d| !d.approved);
    Suspension::Rejected {
        gate: last.map(|d| d.gate.clone()).unwrap_or_default(),
        reason: last.and_then(|d| d.reason.clone()),
    }
}

/// Something the run loop did, reported to a [`Runner::observer`](crate::Runner::observer) as it happens.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A step was skipped because the record says it is done.
    Skipped {
        /// The step's index.
        index: usize,
        /// The step's name.
        step: &'a str,
    },
    /// An attempt of a step is starting.
    Started {
        /// The step's index.
        index: usize,
        /// The step's name.
        step: &'a str,
        /// The attempt (1-based, across resumes).
        attempt: u32,
    },
    /// A step finished and its checkpoint was saved.
    Completed {
        /// The step's index.
        index: usize,
        /// The step's name.
        step: &'a str,
        /// The attempt that succeeded.
        attempt: u32,
        /// How long the attempt ran.
        took: Duration,
    },
    /// An attempt failed.
    Failed {
        /// The step's index.
        index: usize,
        /// The step's name.
        step: &'a str,
        /// The attempt that failed.
        attempt: u32,
        /// The error text.
        error: &'a str,
        /// When another attempt follows, after how long.
        retry_in: Option<Duration>,
    },
}
