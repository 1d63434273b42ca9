//! An in-process store for tests and examples.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::record::events::{NewEvent, RunEvent};
use crate::store::image::{RunImage, Write};
use crate::store::{
    Capabilities, Document, Documents, Events, History, ListFilter, Rewrite, RunSummary,
    SaveRequest, Store,
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
    image: Arc<Mutex<RunImage>>,
    state_limit: u64,
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
            image: Arc::new(Mutex::new(RunImage::new())),
            state_limit: bytes,
        }
    }

    fn image(&self) -> std::sync::MutexGuard<'_, RunImage> {
        // A panic while holding the lock cannot leave a half-written record:
        // the image checks everything before it changes anything.
        self.image.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .history(self)
            .max_state_bytes(self.state_limit)
            .events(self)
            .documents(self)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        Ok(self.image().runs.get(run_id).cloned())
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        // Nothing here is serialized, but a record that another store could
        // not read back is refused alike, so tests on memory catch it.
        let write = Write::checked(&req, self.state_limit)?;
        self.image().save(write)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self.image().list(filter))
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        Ok(self.image().delete(run_id))
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.image().delete_if(run_id, version)
    }
}

#[async_trait]
impl Events for MemoryStore {
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        self.image().append_events(run_id, events)
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        Ok(self.image().read_events(run_id, after, limit))
    }
}

#[async_trait]
impl Documents for MemoryStore {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        Ok(self.image().get_document(key))
    }

    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.image().put_document(key, value, expected)
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        Ok(self.image().list_documents(prefix))
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        Ok(self.image().delete_document(key, expected))
    }
}

#[async_trait]
impl History for MemoryStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        Ok(self.image().history(run_id))
    }

    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        self.image().rewrite(run_id, expected, rewrite)
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
