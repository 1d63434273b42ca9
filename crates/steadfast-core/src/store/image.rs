//! The toolkit's in-memory image of a store: every run's record and its
//! per-step history in two ordered maps, with the whole contract of a save,
//! a delete, a history rewrite and a fold applied to them. The memory store
//! keeps one (with each run's event log) in a mutex; the file store reads one from its file, changes it
//! and writes it back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::record::events::{check_events, NewEvent, RunEvent};
use crate::record::state::merge_ref;
use crate::record::state::Update;
use crate::store::blob::{self, Blob, BlobHash};
use crate::store::plan::{expect_version, follows_stored, head_only_of_absent};
use crate::store::rows::no_row_to_fold;
use crate::store::{
    check_head, check_size, check_state, check_whole_state, merge_head, ListFilter,
};
use crate::store::{Rewrite, RunSummary, SaveRequest};

/// Every run's record, and the history rows of the runs that have any.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunImage {
    /// Records by run id.
    pub runs: BTreeMap<String, Checkpoint>,
    /// History rows by run id, in index order (runs without rows absent).
    pub history: BTreeMap<String, Vec<StepRecord>>,
    /// Event logs by run id, in order (runs without events absent).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub events: BTreeMap<String, Vec<RunEvent>>,
    /// Shared documents by key ([`Documents`](crate::store::Documents)).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub documents: BTreeMap<String, StoredDocument>,
}

/// A shared document as an image keeps it: its value and version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoredDocument {
    /// Its value, a JSON object.
    pub value: serde_json::Value,
    /// Its version.
    pub version: u64,
}

/// A save taken out of its [`SaveRequest`], checked and owned, to apply to
/// an image later (on another thread, under a file's lock).
#[derive(Clone, Debug)]
pub struct Write {
    record: Checkpoint,
    expected: Option<u64>,
    step: Option<StepRecord>,
    head_only: bool,
    /// Set by [`Write::after_step_with_blobs`]: the record's state is the
    /// stored record's with the step's update merged over it (the record
    /// holds no state of its own).
    after_step: Option<AfterStep>,
}

/// The bounds of a [`Write`] whose state is taken from the stored record.
#[derive(Clone, Debug)]
struct AfterStep {
    /// The state's limit, in bytes as stored.
    limit: u64,
    /// The blob threshold the update was written at.
    threshold: u64,
    /// The caller's state, which the merge must match (checked in debug
    /// builds, so that every test through such a store holds its callers
    /// to [`follows_stored`]'s rule).
    #[cfg(debug_assertions)]
    given: Update,
}

/// A copy of `cp` with `state` for its state: the caller's state is not
/// copied. Every field is named, so a field added to [`Checkpoint`] must be
/// added here.
fn with_state(cp: &Checkpoint, state: Update) -> Checkpoint {
    let Checkpoint {
        format,
        run_id,
        workflow,
        status,
        next,
        completed,
        state: _,
        version,
        created_at,
        updated_at,
        attempts,
        error,
        writer,
        lease,
        wait,
        decisions,
        seal,
        audit,
        origin,
        spend,
        queue,
        passed_over,
    } = cp;
    Checkpoint {
        format: *format,
        run_id: run_id.clone(),
        workflow: workflow.clone(),
        status: *status,
        next: *next,
        completed: completed.clone(),
        state,
        version: *version,
        created_at: *created_at,
        updated_at: *updated_at,
        attempts: *attempts,
        error: error.clone(),
        writer: *writer,
        lease: lease.clone(),
        wait: wait.clone(),
        decisions: decisions.clone(),
        seal: seal.clone(),
        audit: audit.clone(),
        origin: origin.clone(),
        spend: spend.clone(),
        queue: queue.clone(),
        passed_over: passed_over.clone(),
    }
}

/// A copy of step `s` with `update` for its update (the caller's is not
/// copied).
fn with_update(s: &StepRecord, update: Update) -> StepRecord {
    let StepRecord {
        index,
        name,
        update: _,
        attempt,
        started_at,
        finished_at,
    } = s;
    StepRecord {
        index: *index,
        name: name.clone(),
        update,
        attempt: *attempt,
        started_at: *started_at,
        finished_at: *finished_at,
    }
}

impl Write {
    /// Checks `req` as every store must before writing (the head, a
    /// head-only save of an absent run, the state within `limit` bytes with
    /// values that load back, the step's update) and takes what it writes.
    pub fn checked(req: &SaveRequest<'_>, limit: u64) -> Result<Self, StoreError> {
        Self::checked_as(
            req,
            |cp| check_whole_state(&cp.run_id, &cp.state, limit),
            |map, _| Ok(map.clone()),
        )
    }

    /// [`checked`](Self::checked) for a store with blobs at `threshold`:
    /// the state's size as stored within `limit`, and the record's state and
    /// the step's update in their stored form (each value over the
    /// threshold a reference, values that look like one escaped), with the
    /// blobs they refer to, each content once.
    pub fn checked_with_blobs(
        req: &SaveRequest<'_>,
        limit: u64,
        threshold: u64,
    ) -> Result<(Self, Vec<Blob>), StoreError> {
        let mut blobs = Vec::new();
        let run_id = req.checkpoint.run_id.as_str();
        // Each map is written in its stored form straight from the caller's,
        // never copied whole first (a state may hold many large values).
        let write = Self::checked_as(
            req,
            |cp| {
                check_size(
                    &cp.run_id,
                    "state",
                    blob::stored_size(&cp.state, threshold),
                    limit,
                )?;
                check_state(&cp.run_id, "state", &cp.state)
            },
            |map, what| blob::encode_map(map, threshold, run_id, what, &mut blobs),
        )?;
        let mut write = write;
        write.decisions_with_blobs(threshold, &mut blobs)?;
        Ok((write, blobs))
    }

    /// Puts the record's decisions in their stored form, when any needs it
    /// ([`blob::encode_decisions`]), with the record's format saying so.
    fn decisions_with_blobs(
        &mut self,
        threshold: u64,
        blobs: &mut Vec<Blob>,
    ) -> Result<(), StoreError> {
        let record = &mut self.record;
        if let Some(stored) =
            blob::encode_decisions(&record.decisions, threshold, &record.run_id, blobs)?
        {
            record.decisions = stored;
            record.format = blob::STORED_DECISIONS_FORMAT;
        }
        Ok(())
    }

    /// Checks `req` (`check_whole` checks a whole state) and takes what it
    /// writes, each map (the state, unless head-only, and the step's update)
    /// as `stored` writes it, given the map and what it is.
    fn checked_as(
        req: &SaveRequest<'_>,
        check_whole: impl FnOnce(&Checkpoint) -> Result<(), StoreError>,
        mut stored: impl FnMut(&Update, &str) -> Result<Update, StoreError>,
    ) -> Result<Self, StoreError> {
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
            check_whole(cp)?;
            if let Some(s) = req.step {
                check_state(&cp.run_id, "step's update", &s.update)?;
            }
            with_state(cp, stored(&cp.state, "state")?)
        };
        record.version = req.new_version();
        // A head-only save records no step (as in every store): its update
        // is neither checked nor copied, and a value nested too deep in it
        // cannot overflow the copy.
        let step = match req.step.filter(|_| !req.head_only) {
            Some(s) => Some(with_update(s, stored(&s.update, "step's update")?)),
            None => None,
        };
        Ok(Write {
            record,
            expected: req.expected,
            step,
            head_only: req.head_only,
            after_step: None,
        })
    }

    /// [`checked_with_blobs`](Self::checked_with_blobs) for a save that
    /// completes the step after the one its record's stored version covers,
    /// without writing out the state: only the step's update is checked,
    /// written in stored form and named (its large values the blobs
    /// returned), and the state is taken when the write is applied
    /// ([`RunImage::try_save`]): the stored record's (which passed every
    /// check when it was written), with the update merged over it. So a save
    /// costs the update's values (and the decisions' data, which the head
    /// carries with every save), not every value of the state. The
    /// caller's state must be that merge, as for any store's delta
    /// ([`follows_stored`]). `None` when `req` cannot be such a save (no
    /// step, a fresh run, a head-only save, or a record whose `next` is not
    /// the step's index + 1).
    pub fn after_step_with_blobs(
        req: &SaveRequest<'_>,
        limit: u64,
        threshold: u64,
    ) -> Result<Option<(Self, Vec<Blob>)>, StoreError> {
        let cp = req.checkpoint;
        let Some(step) = req.step else {
            return Ok(None);
        };
        if req.head_only || req.expected.is_none() || step.index.checked_add(1) != Some(cp.next) {
            return Ok(None);
        }
        check_head(cp)?;
        check_state(&cp.run_id, "step's update", &step.update)?;
        let mut blobs = Vec::new();
        let update = blob::encode_map(
            &step.update,
            threshold,
            &cp.run_id,
            "step's update",
            &mut blobs,
        )?;
        let mut record = with_state(cp, Update::new());
        record.version = req.new_version();
        let mut write = Write {
            record,
            expected: req.expected,
            step: Some(with_update(step, update)),
            head_only: false,
            after_step: Some(AfterStep {
                limit,
                threshold,
                #[cfg(debug_assertions)]
                given: cp.state.clone(),
            }),
        };
        write.decisions_with_blobs(threshold, &mut blobs)?;
        Ok(Some((write, blobs)))
    }

    /// The run written.
    pub fn run_id(&self) -> &str {
        &self.record.run_id
    }
}

/// Panics unless `merged` (a stored state with a step's update merged
/// over it) holds the keys of the caller's state `given`, in order, with
/// the same values where the stored one is not a reference or escaped.
#[cfg(debug_assertions)]
fn check_merge(given: &Update, merged: &Update, run_id: &str) {
    let keys = |m: &Update| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(given),
        keys(merged),
        "run {run_id:?}: a save after the stored step carries a state that is not the stored state with the step's update merged over it"
    );
    for (k, v) in merged {
        if !blob::looks_like_mark(v) {
            assert_eq!(
                Some(v),
                given.get(k),
                "run {run_id:?}: the state's {k:?} is not the stored value with the step's update merged over it"
            );
        }
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
        RunImage {
            runs,
            history,
            events: BTreeMap::new(),
            documents: BTreeMap::new(),
        }
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
    ///
    /// A write made by [`Write::after_step_with_blobs`] whose step does not
    /// follow the stored record is refused ([`StoreError::InvalidInput`]);
    /// [`try_save`](Self::try_save) says so instead, for the caller to
    /// write the whole state.
    pub fn save(&mut self, write: Write) -> Result<u64, StoreError> {
        let run_id = write.record.run_id.clone();
        let index = write.step.as_ref().map_or(0, |s| s.index);
        self.try_save(write)?.ok_or_else(|| {
            StoreError::InvalidInput(format!(
                "run {run_id:?}: the save completes step {index}, which does not follow the stored record; nothing was written"
            ))
        })
    }

    /// [`save`](Self::save), except that a write made by
    /// [`Write::after_step_with_blobs`] changes nothing and returns
    /// `Ok(None)`, for the caller to write the whole state instead
    /// ([`Write::checked_with_blobs`]), when its state cannot be taken from
    /// the stored record: its step does not follow the stored record
    /// ([`follows_stored`]); the stored state holds a value over the
    /// write's blob threshold that is not a reference (stored before the
    /// store had blobs, or under a higher threshold), which the whole state
    /// writes as a blob; or the merged state, as stored, is over the limit
    /// (the whole state, measured as this save writes it, may not be). A
    /// conflict on the version is a conflict either way.
    pub fn try_save(&mut self, write: Write) -> Result<Option<u64>, StoreError> {
        let Write {
            mut record,
            expected,
            step,
            head_only,
            after_step,
        } = write;
        let stored = self.runs.get(&record.run_id);
        let found = stored.map(|c| c.version);
        if found != expected {
            return Err(StoreError::Conflict {
                run_id: record.run_id.clone(),
                expected,
                found,
            });
        }
        if let Some(after) = after_step {
            let (limit, threshold) = (after.limit, after.threshold);
            let (Some(stored), Some(step)) = (stored, step.as_ref()) else {
                return Ok(None);
            };
            if !follows_stored(step, record.next, stored.next) {
                return Ok(None);
            }
            let mut state = stored.state.clone();
            merge_ref(&mut state, &step.update);
            match blob::stored_form_size(&state, threshold) {
                Some(size) if size <= limit => {}
                _ => return Ok(None),
            }
            #[cfg(debug_assertions)]
            check_merge(&after.given, &state, &record.run_id);
            record.state = state;
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
        Ok(Some(version))
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

    /// The blobs run `run_id`'s record refers to (its state's and its
    /// decisions', not its history rows'), each once.
    pub fn refs_of_record(&self, run_id: &str) -> Vec<(BlobHash, u64)> {
        let Some(cp) = self.runs.get(run_id) else {
            return Vec::new();
        };
        let mut out = blob::refs_of(&cp.state);
        for r in blob::decision_refs(cp) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// The blobs run `run_id`'s record (its state and its decisions) and
    /// history rows refer to, each once, with the size each reference
    /// gives.
    pub fn refs_of_run(&self, run_id: &str) -> Vec<(BlobHash, u64)> {
        let mut out: Vec<(BlobHash, u64)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut add = |found: Vec<(BlobHash, u64)>| {
            for r in found {
                if seen.insert(r) {
                    out.push(r);
                }
            }
        };
        if let Some(cp) = self.runs.get(run_id) {
            add(blob::refs_of(&cp.state));
            add(blob::decision_refs(cp));
        }
        for row in self.history.get(run_id).into_iter().flatten() {
            add(blob::refs_of(&row.update));
        }
        out
    }

    /// What run `run_id` stores ([`Blobs::usage`](crate::store::Blobs::usage)):
    /// its record and history rows as kept (references in place of large
    /// values), the blobs they refer to, and the part of those other runs
    /// refer to as well. `None` for an absent run.
    pub fn usage(&self, run_id: &str) -> Option<crate::store::Usage> {
        let cp = self.runs.get(run_id)?;
        let record = crate::store::json_size(cp)
            + self.history.get(run_id).map_or(0, crate::store::json_size);
        let all = self.all_refs();
        let (mut blobs, mut bytes, mut shared) = (0, 0, 0);
        for (hash, n) in self.refs_of_run(run_id) {
            blobs += 1;
            bytes += n;
            if all.get(&hash).is_some_and(|(_, runs)| runs.len() > 1) {
                shared += n;
            }
        }
        Some(crate::store::Usage::new(record, blobs, bytes, shared))
    }

    /// Every blob a record or a history row refers to, with the runs that
    /// refer to it and its size.
    pub fn all_refs(&self) -> BTreeMap<BlobHash, (u64, Vec<&str>)> {
        let mut out: BTreeMap<BlobHash, (u64, Vec<&str>)> = BTreeMap::new();
        for run_id in self.runs.keys() {
            for (hash, bytes) in self.refs_of_run(run_id) {
                let entry = out.entry(hash).or_insert((bytes, Vec::new()));
                entry.1.push(run_id);
            }
        }
        out
    }

    /// Whether any record's state or history row holds a reference or an
    /// escaped value (a record whose decisions do says so by its format,
    /// [`STORED_DECISIONS_FORMAT`](blob::STORED_DECISIONS_FORMAT)).
    pub fn holds_marks(&self) -> bool {
        self.runs.values().any(|cp| blob::holds_marks(&cp.state))
            || self
                .history
                .values()
                .flatten()
                .any(|r| blob::holds_marks(&r.update))
    }

    /// Escapes, in every record and history row, the values that look like
    /// references: for records written before the store had blobs, so that
    /// they read back as written.
    pub fn escape_lookalikes(&mut self) {
        for cp in self.runs.values_mut() {
            blob::escape_lookalikes_in(&mut cp.state);
        }
        for row in self.history.values_mut().flatten() {
            blob::escape_lookalikes_in(&mut row.update);
        }
    }

    /// Deletes a run with its history and its events; whether it existed.
    pub fn delete(&mut self, run_id: &str) -> bool {
        self.history.remove(run_id);
        self.events.remove(run_id);
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

    /// Appends events to a run's log ([`Events::append_events`](crate::store::Events::append_events)): checked
    /// first, numbered after the last; returns the last number.
    pub fn append_events(&mut self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        check_events(run_id, events)?;
        let log = self.events.entry(run_id.to_string()).or_default();
        let mut seq = log.last().map_or(0, |e| e.seq);
        for e in events {
            seq += 1;
            log.push(e.clone().numbered(seq));
        }
        Ok(seq)
    }

    /// The document under `key` ([`Documents::get_document`](crate::store::Documents::get_document)).
    pub fn get_document(&self, key: &str) -> Option<crate::store::Document> {
        self.documents
            .get(key)
            .map(|d| crate::store::Document::new(key, d.value.clone(), d.version))
    }

    /// Writes a document by compare-and-swap on its version
    /// ([`Documents::put_document`](crate::store::Documents::put_document)):
    /// checked first; a conflict changes nothing.
    pub fn put_document(
        &mut self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        crate::store::check_document(key, value)?;
        let found = self.documents.get(key).map(|d| d.version);
        if found != expected {
            return Err(StoreError::Conflict {
                run_id: key.to_string(),
                expected,
                found,
            });
        }
        let version = expected.map_or(1, |v| v + 1);
        self.documents.insert(
            key.to_string(),
            StoredDocument {
                value: value.clone(),
                version,
            },
        );
        Ok(version)
    }

    /// The documents whose keys start with `prefix`, in key order.
    pub fn list_documents(&self, prefix: &str) -> Vec<crate::store::Document> {
        self.documents
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, d)| crate::store::Document::new(k.as_str(), d.value.clone(), d.version))
            .collect()
    }

    /// Deletes the document under `key` at version `expected`.
    pub fn delete_document(&mut self, key: &str, expected: u64) -> bool {
        if self.documents.get(key).map(|d| d.version) != Some(expected) {
            return false;
        }
        self.documents.remove(key).is_some()
    }

    /// A run's events numbered above `after`, at most `limit`
    /// ([`Events::read_events`](crate::store::Events::read_events)).
    pub fn read_events(&self, run_id: &str, after: u64, limit: usize) -> Vec<RunEvent> {
        let Some(log) = self.events.get(run_id) else {
            return Vec::new();
        };
        let from = log.partition_point(|e| e.seq <= after);
        log[from..].iter().take(limit).cloned().collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::checkpoint::{PassedOver, StepFailure};
    use crate::record::clock::Timestamp;
    use serde_json::{json, Map, Value};

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    /// A record and a step whose fields of one type all differ, so that a
    /// copy that drops or swaps one shows.
    fn record() -> (Checkpoint, StepRecord) {
        let mut cp = Checkpoint::new("r", "w", t(1_000));
        cp.updated_at = t(2_000);
        cp.next = 3;
        cp.version = 17;
        cp.writer = 13;
        cp.attempts = 5;
        cp.completed = vec!["a".into(), "b".into(), "c".into()];
        cp.error = Some(StepFailure::new(2, "c", "boom".into(), 4, false, t(2_500)));
        cp.seal = Some("seal".into());
        cp.passed_over = Some(Box::new(PassedOver::new("v2", &["v1"], "w1", t(2_600))));
        cp.state = obj(json!({"doc": "d".repeat(5_000), "n": 1}));
        let update = obj(json!({"doc": "d".repeat(5_000)}));
        let step = StepRecord::new(2, "c", update, 4, t(3_000), t(4_000));
        (cp, step)
    }

    #[test]
    fn a_checked_save_takes_every_field_as_given() {
        let (cp, step) = record();
        let mut req = SaveRequest::new(&cp, Some(10));
        req.step = Some(&step);
        let mut want = cp.clone();
        want.version = 11;

        let write = Write::checked(&req, u64::MAX).unwrap();
        assert_eq!(write.record, want);
        assert_eq!(write.step.as_ref(), Some(&step));

        // With blobs: the same, each large value in its stored form, the
        // content once.
        let (write, blobs) = Write::checked_with_blobs(&req, u64::MAX, 1024).unwrap();
        assert_eq!(blobs.len(), 1);
        let mut again = Vec::new();
        want.state = blob::encode_map(&cp.state, 1024, "r", "state", &mut again).unwrap();
        let mut want_step = step.clone();
        want_step.update =
            blob::encode_map(&step.update, 1024, "r", "step's update", &mut again).unwrap();
        assert_ne!(want.state, cp.state, "the document is a reference");
        assert_eq!(write.record, want);
        assert_eq!(write.step, Some(want_step));
    }

    /// The state of [`record`]'s run before its step `c`: a large value the
    /// step replaces, one it keeps, a small one and a look-alike of a
    /// reference.
    fn state_before() -> Update {
        obj(json!({
            "doc": "e".repeat(5_000),
            "kept": "k".repeat(4_000),
            "n": 1,
            "look": {"$blob": "sha256:00", "bytes": 3},
        }))
    }

    /// The stored record of [`record`]'s run before its step `c`, two steps
    /// done, `state` written at `threshold`, at version 10.
    fn stored_before(cp: &Checkpoint, state: Update, threshold: u64) -> RunImage {
        let mut before = cp.clone();
        before.next = 2;
        before.completed.truncate(2);
        before.state = state;
        let mut image = RunImage::new();
        let (write, _) =
            Write::checked_with_blobs(&SaveRequest::new(&before, Some(9)), u64::MAX, threshold)
                .unwrap();
        image.runs.insert("r".into(), write.record);
        image.runs.get_mut("r").unwrap().version = 10;
        image
    }

    /// [`record`], its state the one before with `step`'s update merged.
    fn after(step: &StepRecord) -> Checkpoint {
        let (mut cp, _) = record();
        cp.state = state_before();
        crate::record::state::merge_ref(&mut cp.state, &step.update);
        cp
    }

    /// A save after the stored step leaves what writing the whole state
    /// leaves, and returns only the update's blobs; its step's record
    /// (`__step`) stays out of the state, as a merge keeps it out.
    #[test]
    fn a_save_after_the_stored_step_leaves_what_the_whole_state_would() {
        let update = obj(json!({
            "doc": "d".repeat(5_000),
            "more": "m".repeat(3_000),
            "n": 2,
            "look2": {"$blob": "x"},
            crate::STEP_KEY: {"fingerprint": "f", "fields": {}},
        }));
        let step = StepRecord::new(2, "c", update, 4, t(3_000), t(4_000));
        let cp = after(&step);
        let image = stored_before(&cp, state_before(), 1024);
        let req = SaveRequest::new(&cp, Some(10)).with_step(&step);

        let (whole, whole_blobs) = Write::checked_with_blobs(&req, u64::MAX, 1024).unwrap();
        assert_eq!(
            whole_blobs.len(),
            3,
            "the whole state names the kept value too"
        );
        let mut want = image.clone();
        assert_eq!(want.save(whole).unwrap(), 11);

        let (after, blobs) = Write::after_step_with_blobs(&req, u64::MAX, 1024)
            .unwrap()
            .expect("the step follows the stored record");
        assert!(
            after.record.state.is_empty(),
            "the caller's state is not written out"
        );
        let mut got = image.clone();
        assert_eq!(got.try_save(after).unwrap(), Some(11));
        assert_eq!(got, want);
        assert!(!got.runs["r"].state.contains_key(crate::STEP_KEY));
        let mut sizes: Vec<_> = blobs.iter().map(|b| b.text.len()).collect();
        sizes.sort_unstable();
        assert_eq!(
            sizes,
            [3_002, 5_002],
            "the update's two large values, not the kept one"
        );
    }

    /// A save whose step the stored record does not lead to (a step
    /// skipped, or the record rewound), whose stored state holds a value
    /// over the threshold in full (stored under a higher one), or whose
    /// merged state is over the limit as stored changes nothing and says
    /// so, for the whole state to be written; a stale version is a
    /// conflict; a save that is no step's is not taken this way.
    #[test]
    fn a_save_after_a_step_is_taken_only_when_it_follows_the_stored_record() {
        let (_, step) = record();
        let cp = after(&step);
        let mut image = stored_before(&cp, state_before(), 1024);
        let req = SaveRequest::new(&cp, Some(10)).with_step(&step);
        let write = |limit| {
            Write::after_step_with_blobs(&req, limit, 1024)
                .unwrap()
                .unwrap()
                .0
        };

        image.runs.get_mut("r").unwrap().next = 1;
        let before = image.clone();
        assert_eq!(image.try_save(write(u64::MAX)).unwrap(), None);
        assert_eq!(image, before);
        let err = image.save(write(u64::MAX)).unwrap_err().to_string();
        assert!(err.contains("does not follow the stored record"), "{err}");
        assert_eq!(image, before);
        image.runs.get_mut("r").unwrap().next = 2;

        image.runs.get_mut("r").unwrap().version = 12;
        let err = image.try_save(write(u64::MAX)).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Conflict {
                    found: Some(12),
                    ..
                }
            ),
            "{err}"
        );
        image.runs.get_mut("r").unwrap().version = 10;

        // The limit bounds the merged state as stored, to the byte.
        let mut plain = image.clone();
        assert_eq!(plain.try_save(write(u64::MAX)).unwrap(), Some(11));
        let merged = crate::store::state_size(&plain.runs["r"].state);
        let before = image.clone();
        assert_eq!(image.try_save(write(merged - 1)).unwrap(), None);
        assert_eq!(image, before);
        assert_eq!(image.clone().try_save(write(merged)).unwrap(), Some(11));

        // Stored at a threshold of 8 KiB, "kept" is in the record in full.
        let mut inline = stored_before(&cp, state_before(), 8 << 10);
        assert!(!blob::holds_marks(&obj(
            json!({"kept": inline.runs["r"].state["kept"]})
        )));
        let before = inline.clone();
        assert_eq!(inline.try_save(write(u64::MAX)).unwrap(), None);
        assert_eq!(inline, before);

        let fresh = SaveRequest::new(&cp, None).with_step(&step);
        let head = SaveRequest::new(&cp, Some(10)).with_step(&step).head_only();
        let no_step = SaveRequest::new(&cp, Some(10));
        let mut skipping = cp.clone();
        skipping.next = 4;
        let skips = SaveRequest::new(&skipping, Some(10)).with_step(&step);
        for req in [fresh, head, no_step, skips] {
            assert!(Write::after_step_with_blobs(&req, u64::MAX, 1024)
                .unwrap()
                .is_none());
        }
    }

    /// In a debug build, a caller whose state is not the stored state with
    /// the step's update merged over it is caught, not written.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not the stored value with the step's update merged over it")]
    fn a_state_that_is_not_the_merge_is_caught_in_debug_builds() {
        let (_, step) = record();
        let mut cp = after(&step);
        cp.state.insert("n".into(), json!(7));
        let mut image = stored_before(&after(&step), state_before(), 1024);
        let req = SaveRequest::new(&cp, Some(10)).with_step(&step);
        let (write, _) = Write::after_step_with_blobs(&req, u64::MAX, 1024)
            .unwrap()
            .unwrap();
        let _ = image.try_save(write);
    }

    /// A value nested `depth` arrays deep, built and taken apart without
    /// recursion (dropping it the ordinary way would overflow the stack).
    fn nested(depth: usize) -> Value {
        let mut v = Value::Null;
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        v
    }

    fn take_apart(mut v: Value) {
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn a_state_nested_far_too_deep_is_refused_clearly_not_overflowed() {
        let mut cp = Checkpoint::new("r", "w", t(1_000));
        cp.state.insert("deep".into(), nested(200_000));
        let req = SaveRequest::new(&cp, None);
        for result in [
            Write::checked(&req, u64::MAX).map(|_| ()),
            Write::checked_with_blobs(&req, u64::MAX, 1024).map(|_| ()),
        ] {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("nesting deeper than"), "{err}");
        }
        if let Some(v) = cp.state.remove("deep") {
            take_apart(v);
        }
    }

    /// A step's update nested far too deep is refused by a save after the
    /// stored step too, before anything writes it out; an empty update is
    /// taken, and leaves the stored state as it was.
    #[test]
    fn a_save_after_the_stored_step_refuses_a_deep_update_and_takes_an_empty_one() {
        let (_, step) = record();
        let cp = after(&step);
        let mut deep = step.clone();
        deep.update.insert("deep".into(), nested(200_000));
        let req = SaveRequest::new(&cp, Some(10)).with_step(&deep);
        let err = Write::after_step_with_blobs(&req, u64::MAX, 1024)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nesting deeper than"), "{err}");
        if let Some(v) = deep.update.remove("deep") {
            take_apart(v);
        }

        let empty = StepRecord::new(2, "c", Update::new(), 4, t(3_000), t(4_000));
        let mut cp = after(&empty);
        cp.state = state_before();
        let image = stored_before(&cp, state_before(), 1024);
        let req = SaveRequest::new(&cp, Some(10)).with_step(&empty);
        let (write, blobs) = Write::after_step_with_blobs(&req, u64::MAX, 1024)
            .unwrap()
            .unwrap();
        assert!(blobs.is_empty());
        let mut got = image.clone();
        assert_eq!(got.try_save(write).unwrap(), Some(11));
        assert_eq!(got.runs["r"].state, image.runs["r"].state);
    }
}
