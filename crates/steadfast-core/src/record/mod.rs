//! The record of a run and its checks: the checkpoint, its state and the
//! rules a value must keep, run ids and names, the ranges of inputs, time,
//! errors and outcomes. It imports nothing else of the crate.

pub mod checkpoint;
pub mod clock;
pub mod error;
pub mod events;
pub mod family;
pub mod ids;
pub mod keys;
pub mod limit;
pub mod limits;
pub mod outcome;
pub mod queue;
pub mod schedule;
pub mod signal;
pub mod spend;
pub mod state;
pub mod version;
