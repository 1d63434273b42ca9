//! An in-process store for tests and examples.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::store::{
    check_head, check_whole_state, Capabilities, History, ListFilter, RunSummary, SaveRequest,
    Store,
};

/// The default state size limit of [`MemoryStore`]: 64 MiB.
pub const DEFAULT_MEMORY_STATE_LIMIT: u64 = 64 << 20;

/// A store that keeps checkpoints in this process's memory. Nothing survives the
/// process: use it for tests and examples (URL `memory:`). Clones share the
/// same runs.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use steadfast_core::{MemoryStore, Store};
/// let store = MemoryStore::new();
/// assert!(store.load("nothing-yet").await.unwrap().is_none());
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    runs: Arc<Mutex<BTreeMap<String, Entry>>>,
    state_limit: u64,
}

#[derive(Debug)]
struct Entry {
    checkpoint: Checkpoint,
    history: Vec<StepRecord>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with the default state limit.
    pub fn new() -> Self {
        Self::with_state_limit(DEFAULT_MEMORY_STATE_LIMIT)
    }

    /// An empty store that refuses states larger than `bytes` when serialized.
    pub fn with_state_limit(bytes: u64) -> Self {
        MemoryStore {
            runs: Arc::new(Mutex::new(BTreeMap::new())),
            state_limit: bytes,
        }
    }

    /// A head-only save: the stored state, steps and history stay.
    fn save_head(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let cp = req.checkpoint;
        let mut runs = self.runs();
        let found = runs.get(&cp.run_id).map(|e| e.checkpoint.version);
        if req.expected.is_none() {
            return Err(StoreError::InvalidInput(format!(
                "run {:?}: a head-only save needs the run to exist",
                cp.run_id
            )));
        }
        let Some(entry) = runs.get_mut(&cp.run_id).filter(|_| found == req.expected) else {
            return Err(StoreError::Conflict {
                run_id: cp.run_id.clone(),
                expected: req.expected,
                found,
            });
        };
        let mut stored = crate::store::merge_head(cp, &mut entry.checkpoint);
        stored.version = req.new_version();
        entry.checkpoint = stored;
        Ok(req.new_version())
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        // A panic while holding the lock cannot leave a half-written record: every
        // mutation below is a single insert or remove.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The entry of run `run_id` if its version is `expected`, else a conflict.
fn at_version<'a>(
    runs: &'a mut BTreeMap<String, Entry>,
    run_id: &str,
    expected: u64,
) -> Result<&'a mut Entry, StoreError> {
    let entry = runs.get_mut(run_id);
    let found = entry.as_ref().map(|e| e.checkpoint.version);
    entry
        .filter(|_| found == Some(expected))
        .ok_or_else(|| StoreError::Conflict {
            run_id: run_id.to_string(),
            expected: Some(expected),
            found,
        })
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .history(self)
            .max_state_bytes(self.state_limit)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        Ok(self.runs().get(run_id).map(|e| e.checkpoint.clone()))
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let cp = req.checkpoint;
        // Nothing here is serialized, but a record that another store could
        // not read back is refused alike, so tests on memory catch it.
        check_head(cp)?;
        if req.head_only {
            return self.save_head(req);
        }
        check_whole_state(&cp.run_id, &cp.state, self.state_limit)?;
        let mut runs = self.runs();
        let found = runs.get(&cp.run_id).map(|e| e.checkpoint.version);
        if found != req.expected {
            return Err(StoreError::Conflict {
                run_id: cp.run_id.clone(),
                expected: req.expected,
                found,
            });
        }
        let version = req.new_version();
        let mut stored = cp.clone();
        stored.version = version;
        let mut history = runs
            .remove(&cp.run_id)
            .map(|e| e.history)
            .unwrap_or_default();
        history.retain(|r| r.index < cp.next);
        if let Some(step) = req.step.filter(|s| s.index < cp.next) {
            history.retain(|r| r.index != step.index);
            history.push(step.clone());
            history.sort_by_key(|r| r.index);
        }
        runs.insert(
            stored.run_id.clone(),
            Entry {
                checkpoint: stored,
                history,
            },
        );
        Ok(version)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        let runs = self.runs();
        Ok(runs
            .values()
            .map(|e| &e.checkpoint)
            .filter(|cp| filter.matches(cp))
            .take(filter.limit.unwrap_or(usize::MAX))
            .map(RunSummary::from)
            .collect())
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        Ok(self.runs().remove(run_id).is_some())
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        let mut runs = self.runs();
        match runs.get(run_id).map(|e| e.checkpoint.version) {
            None => Ok(false),
            Some(v) if v == version => Ok(runs.remove(run_id).is_some()),
            found => Err(StoreError::Conflict {
                run_id: run_id.to_string(),
                expected: Some(version),
                found,
            }),
        }
    }
}

#[async_trait]
impl History for MemoryStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        Ok(self.runs().get(run_id).map(|e| e.history.clone()))
    }
    async fn rewrite_history(
        &self,
        run_id: &str,
        expected: u64,
        records: &[StepRecord],
    ) -> Result<(), StoreError> {
        let mut runs = self.runs();
        let entry = at_version(&mut runs, run_id, expected)?;
        for r in records {
            if r.index >= entry.checkpoint.next {
                return Err(StoreError::InvalidInput(format!(
                    "run {run_id:?}: step {} is not history (next is {})",
                    r.index, entry.checkpoint.next
                )));
            }
            crate::store::check_state(run_id, "step's update", &r.update)?;
        }
        for r in records {
            if let Some(h) = entry.history.iter_mut().find(|h| h.index == r.index) {
                h.update = r.update.clone();
            }
        }
        Ok(())
    }
    async fn fold_history(
        &self,
        run_id: &str,
        expected: u64,
        fold: &StepRecord,
    ) -> Result<(), StoreError> {
        let mut runs = self.runs();
        let entry = at_version(&mut runs, run_id, expected)?;
        crate::store::check_state(run_id, "step's update", &fold.update)?;
        let Some(row) = entry.history.iter_mut().find(|h| h.index == fold.index) else {
            return Err(StoreError::InvalidInput(format!(
                "run {run_id:?}: step {} has no history row to fold into",
                fold.index
            )));
        };
        row.update = fold.update.clone();
        entry.history.retain(|r| r.index >= fold.index);
        Ok(())
    }
}

/// The memory store as a backend: `memory:`, with nothing after the colon.
pub const BACKEND: crate::store::backend::Backend = crate::store::backend::Backend::new(
    "memory",
    &["memory"],
    "memory:",
    "in this process only, for tests and examples",
    |_, rest, _| {
        Box::pin(std::future::ready(if rest.is_empty() {
            Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
        } else {
            Err(StoreError::InvalidInput(
                "memory: takes nothing after the colon".into(),
            ))
        }))
    },
);
