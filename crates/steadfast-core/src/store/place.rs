//! Where a run's data sits in a store, for the toolkit's `Corrupt` errors
//! and the checked conversions of stored values.

use crate::record::checkpoint::RunStatus;
use crate::record::clock::Timestamp;
use crate::record::error::StoreError;

/// Where a run's data sits in a store, for messages: turns the name of a
/// column or field (`head`, `snapshot`, `steps[3].update_json`) into a
/// location (`runs.db runs["r1"].head`).
pub struct Place<'a> {
    run_id: &'a str,
    locate: &'a (dyn Fn(&str) -> String + Sync),
}

impl<'a> Place<'a> {
    /// The place of run `run_id`, with `locate` naming a column's location.
    pub fn new(run_id: &'a str, locate: &'a (dyn Fn(&str) -> String + Sync)) -> Self {
        Place { run_id, locate }
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        self.run_id
    }

    /// [`StoreError::Corrupt`] at `column`.
    pub fn corrupt(&self, column: &str, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            location: (self.locate)(column),
            reason: reason.to_string(),
        }
    }

    /// A stored count or version: a negative one is corrupt.
    pub fn count(&self, column: &str, v: i64) -> Result<u64, StoreError> {
        u64::try_from(v).map_err(|_| self.corrupt(column, format!("{v} is negative")))
    }

    /// A stored index or step count.
    pub fn index(&self, column: &str, v: i64) -> Result<usize, StoreError> {
        let n = self.count(column, v)?;
        usize::try_from(n).map_err(|_| self.corrupt(column, format!("{v} is too large")))
    }

    /// A stored attempt number.
    pub fn attempt(&self, column: &str, v: i64) -> Result<u32, StoreError> {
        let n = self.count(column, v)?;
        u32::try_from(n).map_err(|_| self.corrupt(column, format!("{v} is too large")))
    }

    /// A stored time in milliseconds since the epoch.
    pub fn millis(&self, column: &str, v: i64) -> Result<Timestamp, StoreError> {
        self.count(column, v).map(Timestamp::from_unix_millis)
    }

    /// A stored status.
    pub fn status(&self, column: &str, text: &str) -> Result<RunStatus, StoreError> {
        text.parse().map_err(|e| self.corrupt(column, e))
    }

    /// JSON text of `column`, decoded; the error names the line and column.
    pub fn json<T: serde::de::DeserializeOwned>(
        &self,
        column: &str,
        text: &str,
    ) -> Result<T, StoreError> {
        serde_json::from_str(text).map_err(|e| {
            self.corrupt(
                column,
                format!("{e} (line {}, column {})", e.line(), e.column()),
            )
        })
    }
}
