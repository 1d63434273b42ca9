//! The toolkit's in-memory image of a store: every run's record and its
//! per-step history in two ordered maps, with the whole contract of a save,
//! a delete, a history rewrite and a fold applied to them. The memory store
//! keeps one in a mutex; the file store reads one from its file, changes it
//! and writes it back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::store::plan::{expect_version, head_only_of_absent};
use crate::store::rows::no_row_to_fold;
use crate::store::{check_head, check_state, check_whole_state, merge_head, ListFilter};
use crate::store::{Rewrite, RunSummary, SaveRequest};

/// Every run's record, and the history rows of the runs that have any.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunImage {
    /// Records by run id.
    pub runs: BTreeMap<String, Checkpoint>,
    /// History rows by run id, in index order (runs without rows absent).
    pub history: BTreeMap<String, Vec<StepRecord>>,
}

/// A save taken out of its [`SaveRequest`], checked and owned, to apply to
/// an image later (on another thread, under a file's lock).
#[derive(Clone, Debug)]
pub struct Write {
    record: Checkpoint,
    expected: Option<u64>,
    step: Option<StepRecord>,
    head_only: bool,
}

impl Write {
    /// Checks `req` as every store must before writing (the head, a
    /// head-only save of an absent run, the state within `limit` bytes with
    /// values that load back, the step's update) and takes what it writes.
    pub fn checked(req: &SaveRequest<'_>, limit: u64) -> Result<Self, StoreError> {
        let cp = req.checkpoint;
        check_head(cp)?;
        if req.head_only && req.expected.is_none() {
            return Err(head_only_of_absent(&cp.run_id));
        }
        let mut record = if req.head_only {
            // The stored state, steps and `next` are taken when it applies.
            merge_head(
                cp,
                &mut Checkpoint::new(&cp.run_id, &cp.workflow, cp.created_at),
            )
        } else {
            check_whole_state(&cp.run_id, &cp.state, limit)?;
            if let Some(s) = req.step {
                check_state(&cp.run_id, "step's update", &s.update)?;
            }
            cp.clone()
        };
        record.version = req.new_version();
        Ok(Write {
            record,
            expected: req.expected,
            step: req.step.cloned(),
            head_only: req.head_only,
        })
    }

    /// The run written.
    pub fn run_id(&self) -> &str {
        &self.record.run_id
    }
}

impl RunImage {
    /// An empty image.
    pub fn new() -> Self {
        Self::default()
    }

    /// An image of these records and rows (a store that decodes its own
    /// layout checks them first).
    pub fn from_parts(
        runs: BTreeMap<String, Checkpoint>,
        history: BTreeMap<String, Vec<StepRecord>>,
    ) -> Self {
        RunImage { runs, history }
    }

    /// The records and the rows.
    pub fn into_parts(
        self,
    ) -> (
        BTreeMap<String, Checkpoint>,
        BTreeMap<String, Vec<StepRecord>>,
    ) {
        (self.runs, self.history)
    }

    /// Applies a save by compare-and-swap on the stored version: a
    /// [`StoreError::Conflict`] changes nothing. A head-only save keeps the
    /// stored state, steps and `next`; any other save records the step's
    /// row and keeps only the rows below the record's `next`. Returns the
    /// version written.
    pub fn save(&mut self, write: Write) -> Result<u64, StoreError> {
        let Write {
            mut record,
            expected,
            step,
            head_only,
        } = write;
        let found = self.runs.get(&record.run_id).map(|c| c.version);
        if found != expected {
            return Err(StoreError::Conflict {
                run_id: record.run_id.clone(),
                expected,
                found,
            });
        }
        let version = record.version;
        if head_only {
            if let Some(kept) = self.runs.get_mut(&record.run_id) {
                record = merge_head(&record, kept);
                record.version = version;
            }
        } else {
            if expected.is_none() {
                self.history.remove(&record.run_id);
            }
            self.record_rows(&record, step.as_ref());
        }
        self.runs.insert(record.run_id.clone(), record);
        Ok(version)
    }

    /// Records the history a save leaves: the rows below the run's `next`,
    /// with `step` (the row the save completes) in place of any row of its
    /// index; rows follow a record relabelled with changed code.
    fn record_rows(&mut self, cp: &Checkpoint, step: Option<&StepRecord>) {
        let rows = self.history.entry(cp.run_id.clone()).or_default();
        rows.retain(|r| r.index < cp.next);
        if let Some(step) = step.filter(|s| s.index < cp.next) {
            rows.retain(|r| r.index != step.index);
            let at = rows.partition_point(|r| r.index < step.index);
            rows.insert(at, step.clone());
        }
        for r in rows.iter_mut() {
            if let Some(name) = cp.completed.get(r.index) {
                if r.name != *name {
                    r.name = name.clone();
                }
            }
        }
        if rows.is_empty() {
            self.history.remove(&cp.run_id);
        }
    }

    /// Deletes a run with its history; whether it existed.
    pub fn delete(&mut self, run_id: &str) -> bool {
        self.history.remove(run_id);
        self.runs.remove(run_id).is_some()
    }

    /// Deletes a run only at `version` ([`StoreError::Conflict`] otherwise,
    /// `Ok(false)` when absent).
    pub fn delete_if(&mut self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        match self.runs.get(run_id).map(|c| c.version) {
            None => Ok(false),
            Some(v) if v == version => Ok(self.delete(run_id)),
            found => Err(StoreError::Conflict {
                run_id: run_id.to_string(),
                expected: Some(version),
                found,
            }),
        }
    }

    /// The runs `filter` names, by run id.
    pub fn list(&self, filter: &ListFilter) -> Vec<RunSummary> {
        self.runs
            .values()
            .filter(|cp| filter.matches(cp))
            .take(filter.limit.unwrap_or(usize::MAX))
            .map(RunSummary::from)
            .collect()
    }

    /// A run's history rows (none for an absent run).
    pub fn history(&self, run_id: &str) -> Option<Vec<StepRecord>> {
        self.runs
            .contains_key(run_id)
            .then(|| self.history.get(run_id).cloned().unwrap_or_default())
    }

    /// Applies `rewrite` if the run is at `expected` (see
    /// [`History::rewrite`](crate::store::History::rewrite)). Checked first:
    /// a conflict, a row at or above `next` or a fold into a missing row
    /// changes nothing.
    pub fn rewrite(
        &mut self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let (records, fold) = (rewrite.records(), rewrite.is_fold());
        let found = self.runs.get(run_id);
        expect_version(run_id, expected, found.map(|c| c.version))?;
        let next = found.map_or(0, |c| c.next);
        let has_row = |index: usize| {
            self.history
                .get(run_id)
                .is_some_and(|rows| rows.iter().any(|h| h.index == index))
        };
        for r in records {
            if r.index >= next {
                return Err(StoreError::InvalidInput(format!(
                    "run {run_id:?}: step {} is not history (next is {next})",
                    r.index
                )));
            }
            if fold && !has_row(r.index) {
                return Err(no_row_to_fold(run_id, r.index as u64));
            }
        }
        let Some(rows) = self.history.get_mut(run_id) else {
            return Ok(());
        };
        for r in records {
            if let Some(h) = rows.iter_mut().find(|h| h.index == r.index) {
                h.update = r.update.clone();
            }
        }
        if let Some(below) = rewrite.delete_below() {
            rows.retain(|h| h.index >= below);
        }
        if rows.is_empty() {
            self.history.remove(run_id);
        }
        Ok(())
    }
}
