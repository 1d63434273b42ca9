//! The seam between the run loop and where checkpoints live: the [`Store`]
//! trait that applications hold, and what a store's author needs besides
//! ([`SaveRequest`], the checks every store runs before it writes, the size
//! of a state).

pub mod backend;
pub mod blob;
pub mod group;
pub mod head;
pub mod image;
pub mod layout;
pub mod local;
pub mod memory;
pub(crate) mod named;
pub mod place;
pub mod plan;
pub mod rows;
#[cfg(feature = "tls")]
pub mod tls;

use std::sync::Arc;

use async_trait::async_trait;

use crate::record::checkpoint::{Checkpoint, RunStatus, StepRecord};
use crate::record::clock::{Clock, Timestamp};
use crate::record::error::StoreError;
pub use crate::record::events::{
    check_events, MAX_EVENTS_PER_APPEND, MAX_EVENT_BYTES, MAX_STORED_EVENT_BYTES,
};
use crate::record::events::{NewEvent, RunEvent};
use crate::record::state::State;
pub use crate::record::state::{check_update, ValueProblem};
pub use crate::store::head::{decode_head, encode_head, encode_json, to_i64, RunCache};

/// One compare-and-swap write of a run's checkpoint.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SaveRequest<'a> {
    /// The record to store. Its `version` field is ignored: the store writes the
    /// new version (`expected + 1`, or 1 for a fresh run).
    pub checkpoint: &'a Checkpoint,
    /// The version the writer read: `None` means the run must not exist yet.
    pub expected: Option<u64>,
    /// The step this save completes, when it completes one. Stores that keep
    /// per-step history or persist deltas use it; others may ignore it.
    pub step: Option<&'a StepRecord>,
    /// Only the head changed since the stored version (the lease, the wait,
    /// decisions, status, attempts, error, times): the store keeps its stored
    /// state, completed steps and `next`, and ignores the checkpoint's (which
    /// may be empty). A lease renewal saves this way, so it never rewrites
    /// the state.
    pub head_only: bool,
    /// Write this version instead of `expected + 1`: for
    /// [`transfer::put_run`](crate::ops::transfer::put_run), which brings a run
    /// over from another store with the version it had there (an encrypted
    /// record's seal covers it). The compare-and-swap on `expected` stays.
    pub write_version: Option<u64>,
}

impl<'a> SaveRequest<'a> {
    /// A save of `checkpoint` expecting the stored version `expected`.
    pub fn new(checkpoint: &'a Checkpoint, expected: Option<u64>) -> Self {
        SaveRequest {
            checkpoint,
            expected,
            step: None,
            head_only: false,
            write_version: None,
        }
    }

    /// Marks the save as changing only the head; see [`SaveRequest::head_only`].
    pub fn head_only(mut self) -> Self {
        self.head_only = true;
        self
    }

    /// Attaches the step this save completes.
    pub fn with_step(mut self, step: &'a StepRecord) -> Self {
        self.step = Some(step);
        self
    }

    /// Makes the save write `version` rather than `expected + 1`; see
    /// [`SaveRequest::write_version`].
    pub fn writing_version(mut self, version: u64) -> Self {
        self.write_version = Some(version);
        self
    }

    /// The version this save writes: [`write_version`](SaveRequest::write_version)
    /// when set, else `expected + 1` (1 for a fresh run).
    pub fn new_version(&self) -> u64 {
        self.write_version
            .unwrap_or_else(|| self.expected.map_or(1, |v| v + 1))
    }
}

/// Which runs [`Store::list`] returns. Every set field must match.
///
/// ```
/// use steadfast_core::{ListFilter, RunStatus};
/// let filter = ListFilter::new().status(RunStatus::Failed).workflow("ingest").limit(50);
/// assert_eq!(filter.limit, Some(50));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this workflow.
    pub workflow: Option<String>,
    /// Only runs last saved strictly before this time.
    pub updated_before: Option<Timestamp>,
    /// Only runs whose id sorts strictly after this one (a cursor: pass the last
    /// run id of the previous page).
    pub after: Option<String>,
    /// At most this many runs.
    pub limit: Option<usize>,
}

impl ListFilter {
    /// A filter that matches every run.
    pub fn new() -> Self {
        Self::default()
    }
    /// Only runs with `status`.
    pub fn status(mut self, status: RunStatus) -> Self {
        self.status = Some(status);
        self
    }
    /// Only runs of `workflow`.
    pub fn workflow(mut self, workflow: impl Into<String>) -> Self {
        self.workflow = Some(workflow.into());
        self
    }
    /// Only runs last saved before `t`.
    pub fn updated_before(mut self, t: Timestamp) -> Self {
        self.updated_before = Some(t);
        self
    }
    /// Only runs whose id sorts after `run_id`.
    pub fn after(mut self, run_id: impl Into<String>) -> Self {
        self.after = Some(run_id.into());
        self
    }
    /// At most `n` runs.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// The next page of runs that match, from `store`, moving the cursor
    /// ([`after`](ListFilter::after)) past it; empty once every run was
    /// listed. Paging this way lists each run once, whatever is deleted
    /// meanwhile.
    pub async fn next_page<S: Store + ?Sized>(
        &mut self,
        store: &S,
    ) -> Result<Vec<RunSummary>, StoreError> {
        let page = store.list(self).await?;
        if let Some(last) = page.last() {
            self.after = Some(last.run_id.clone());
        }
        Ok(page)
    }

    /// Whether `cp` passes every condition except `limit`.
    pub fn matches(&self, cp: &Checkpoint) -> bool {
        self.status.is_none_or(|s| s == cp.status)
            && self.workflow.as_deref().is_none_or(|w| w == cp.workflow)
            && self.updated_before.is_none_or(|t| cp.updated_at < t)
            && self.after.as_deref().is_none_or(|a| cp.run_id.as_str() > a)
    }
}

/// One line of [`Store::list`]: a run's head without its state. As JSON
/// (`runs --json`, the web API, Python's `runs`), its fields by name, times
/// in RFC 3339.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct RunSummary {
    /// The run.
    pub run_id: String,
    /// Its workflow.
    pub workflow: String,
    /// Where it stands.
    pub status: RunStatus,
    /// Completed steps.
    pub next: usize,
    /// Its version.
    pub version: u64,
    /// When it was first saved.
    pub created_at: Timestamp,
    /// When it was last saved.
    pub updated_at: Timestamp,
    /// What it spent and its budgets, if either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spend: Option<crate::record::spend::Spend>,
    /// Its priority and partition, when started with either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::record::queue::Queue>,
    /// The version of its workflow it was started with
    /// ([`Origin::version`](crate::Origin::version)), if one was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<String>,
}

impl From<&Checkpoint> for RunSummary {
    fn from(cp: &Checkpoint) -> Self {
        RunSummary {
            run_id: cp.run_id.clone(),
            workflow: cp.workflow.clone(),
            status: cp.status,
            next: cp.next,
            version: cp.version,
            created_at: cp.created_at,
            updated_at: cp.updated_at,
            spend: cp.spend.clone(),
            queue: cp.queue.clone(),
            workflow_version: cp.origin.as_ref().and_then(|o| o.version.clone()),
        }
    }
}

/// Where checkpoints live: the seam between the engine and a store.
///
/// A store writes five methods: [`load`](Store::load), [`save`](Store::save),
/// [`list`](Store::list), [`delete`](Store::delete) and
/// [`delete_if`](Store::delete_if). Anything more it offers it declares in
/// [`capabilities`](Store::capabilities): per-step history ([`History`]),
/// scheduling for workers ([`Schedule`]), a clock of its own, a state size
/// limit. Callers reach all of it through [`StoreExt`], which answers
/// [`StoreError::Unsupported`] (or a default) for what a store lacks. A
/// wrapper (an encrypting store, a fault injector) forwards the five
/// methods and the capabilities of the store it wraps, keeping every one of
/// them; the conformance suite checks that it does.
///
/// Every backend passes the conformance suite (`steadfast-conformance`), which is
/// the executable form of the contract written on each method. Concurrency is
/// compare-and-swap on [`Checkpoint::version`]: nothing else is assumed of a
/// backend, so leases, gates and timers are built on `load` and `save`.
/// `docs/store-guide.md` says what a new store must write.
#[async_trait]
pub trait Store: Send + Sync {
    /// Loads the run's checkpoint.
    ///
    /// - MUST return `Ok(None)` when the run has never been saved or was deleted.
    /// - MUST return [`StoreError::Corrupt`] (with a location) when the stored data
    ///   cannot be decoded, and MUST NOT treat that as absent.
    /// - MUST return what the last acknowledged save wrote, version included.
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Writes a checkpoint if the stored version equals `req.expected`, and returns
    /// the new version (`expected + 1`, or 1 when `expected` is `None`; or
    /// [`write_version`](SaveRequest::write_version) when it is set).
    ///
    /// - MUST fail with [`StoreError::Conflict`] and change nothing when the stored
    ///   version differs (including: present when `None` was expected, absent when a
    ///   version was expected).
    /// - MUST make the write survive a process kill and a power loss before
    ///   returning `Ok`, unless the store is documented as in-memory.
    /// - MUST be atomic: after any failure, the stored record is either the old one
    ///   or the new one, never a mixture.
    /// - MUST return [`StoreError::OutcomeUnknown`] when it cannot tell whether the
    ///   write took effect, and a definite error only when it did not.
    /// - MUST refuse a state over its size limit with [`StoreError::TooLarge`]
    ///   before writing anything.
    /// - MUST NOT overwrite data it could not decode.
    /// - MUST, for a [`head_only`](SaveRequest::head_only) save, keep the
    ///   stored state, completed steps and `next` and write the rest of the
    ///   checkpoint; such a save of an absent run (`expected` is `None`) MUST
    ///   fail with [`StoreError::InvalidInput`].
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError>;

    /// Lists runs that match `filter`, ordered by run id.
    ///
    /// - MUST apply every set condition of the filter, and `limit` last.
    /// - MUST NOT return a run more than once.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError>;

    /// Deletes a run. Returns whether it existed.
    ///
    /// - MUST make a later `load` return `Ok(None)` and a later fresh save succeed.
    /// - MUST be durable like `save`.
    async fn delete(&self, run_id: &str) -> Result<bool, StoreError>;

    /// Deletes run `run_id` only if its stored version is still `version`:
    /// what retention and replacements use, so that a run that changed since
    /// it was looked at (retried, rewound, claimed again) is never deleted on
    /// old news. Returns whether it existed.
    ///
    /// - MUST fail with [`StoreError::Conflict`] and delete nothing when the
    ///   run exists with another version;
    /// - MUST answer `Ok(false)` for an absent run, and be durable like
    ///   [`delete`](Store::delete) otherwise.
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError>;

    /// What this store offers beyond the five methods: none by default.
    ///
    /// - MUST answer the same every time for one store value.
    /// - A wrapper MUST answer every capability of the store it wraps (its
    ///   own implementation of it, or the inner one's).
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
    }
}

/// What a [`Store`] offers beyond its five methods, as it declares them in
/// [`Store::capabilities`].
///
/// ```
/// use steadfast_core::{store::Capabilities, MemoryStore, Store};
/// let store = MemoryStore::new();
/// let caps = store.capabilities();
/// assert!(caps.history.is_some() && caps.schedule.is_none());
/// assert_eq!(caps.names(), ["history", "max_state_bytes", "events", "documents"]);
/// assert!(Capabilities::none().names().is_empty());
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct Capabilities<'a> {
    /// Per-step history, and rewriting it ([`History`]).
    pub history: Option<&'a dyn History>,
    /// Finding due runs for workers, and waking them ([`Schedule`]).
    pub schedule: Option<&'a dyn Schedule>,
    /// The clock that leases, timers and gate timeouts on this store are
    /// judged by (the database server's), instead of the system clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// The largest state (serialized, in bytes) a save takes: the limit
    /// [`Store::save`] refuses with [`StoreError::TooLarge`] (a store with
    /// further limits, such as the size of a whole file, may still refuse a
    /// save within it). What [`transfer`](crate::transfer) checks a record
    /// against before it replaces anything.
    pub max_state_bytes: Option<u64>,
    /// Large values stored once, by reference, and what they weigh
    /// ([`Blobs`]).
    pub blobs: Option<&'a dyn Blobs>,
    /// Each run's log of the values its steps emitted ([`Events`]).
    pub events: Option<&'a dyn Events>,
    /// Small documents shared by every process on the store, each under a
    /// key with a compare-and-swap version ([`Documents`]): concurrency
    /// limits and rate buckets.
    pub documents: Option<&'a dyn Documents>,
}

impl std::fmt::Debug for Capabilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl<'a> Capabilities<'a> {
    /// No capability.
    pub fn none() -> Self {
        Self::default()
    }
    /// With per-step history.
    pub fn history(mut self, h: &'a dyn History) -> Self {
        self.history = Some(h);
        self
    }
    /// With scheduling.
    pub fn schedule(mut self, s: &'a dyn Schedule) -> Self {
        self.schedule = Some(s);
        self
    }
    /// With a clock of the store's own.
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = Some(c);
        self
    }
    /// With a state size limit.
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = Some(bytes);
        self
    }
    /// With blobs.
    pub fn blobs(mut self, b: &'a dyn Blobs) -> Self {
        self.blobs = Some(b);
        self
    }
    /// With event logs.
    pub fn events(mut self, e: &'a dyn Events) -> Self {
        self.events = Some(e);
        self
    }
    /// With shared documents.
    pub fn documents(mut self, d: &'a dyn Documents) -> Self {
        self.documents = Some(d);
        self
    }
    /// The names of the capabilities present, in a fixed order: what a
    /// wrapper must keep.
    pub fn names(&self) -> Vec<&'static str> {
        [
            ("history", self.history.is_some()),
            ("schedule", self.schedule.is_some()),
            ("clock", self.clock.is_some()),
            ("max_state_bytes", self.max_state_bytes.is_some()),
            ("blobs", self.blobs.is_some()),
            ("events", self.events.is_some()),
            ("documents", self.documents.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, on)| on.then_some(n))
        .collect()
    }
}

/// Each run's event log: the values its steps emitted while they ran
/// ([`StepCtx::emit`](crate::StepCtx::emit)), numbered 1, 2, 3… per run. A
/// capability of a [`Store`] ([`Capabilities::events`]).
///
/// - [`Store::delete`] and [`Store::delete_if`] MUST remove a run's events
///   with the run (in the same write where the store can).
/// - Events MAY be appended under a run id before the run's first save (a
///   new run's first step emits before its checkpoint exists).
#[async_trait]
pub trait Events: Send + Sync {
    /// Appends `events` to run `run_id`'s log after its last event, numbered
    /// consecutively, and returns the number of the last one appended.
    ///
    /// - MUST check the events with [`check_events`] and write nothing when
    ///   they fail it.
    /// - MUST write all of them or none, durably as a save is.
    /// - MUST give concurrent appends to one run disjoint runs of numbers
    ///   with no gap between them: the log of a run is 1, 2, 3… whoever
    ///   appended.
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError>;

    /// Run `run_id`'s events numbered above `after`, in order, at most
    /// `limit` of them (empty for a run with none, or an absent one).
    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError>;

    /// Waits until events may have been appended to run `run_id` (at most
    /// `timeout`): a watcher's pause between looks. By default it waits the
    /// whole `timeout` (polling); a store that can be told of appends (the
    /// PostgreSQL store listens for them) returns sooner. It MAY return
    /// early without new events; a wrapper SHOULD forward it.
    async fn wait_for_events(&self, run_id: &str, timeout: std::time::Duration) {
        let _ = run_id;
        tokio::time::sleep(timeout).await;
    }

    /// The most one append takes: events, and bytes of their values' JSON
    /// as given to [`append_events`](Self::append_events). By default
    /// [`MAX_EVENTS_PER_APPEND`]
    /// and no byte bound; a store whose appends are bounded by its service
    /// (Cosmos DB's transactional batches) says less, and an emitting
    /// step's batches keep within it. A wrapper that changes the values'
    /// size SHOULD scale it.
    fn append_bounds(&self) -> (usize, u64) {
        (crate::record::events::MAX_EVENTS_PER_APPEND, u64::MAX)
    }
}

/// The longest key of a shared document, in bytes.
pub const MAX_DOCUMENT_KEY_BYTES: usize = 200;

/// The largest shared document, in bytes of JSON.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// A shared document as stored: its key, value and version.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Document {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: serde_json::Value,
    /// Its version: 1 after the first write, plus one per write.
    pub version: u64,
}

impl Document {
    /// A document from its parts.
    pub fn new(key: impl Into<String>, value: serde_json::Value, version: u64) -> Self {
        Document {
            key: key.into(),
            value,
            version,
        }
    }
}

/// Checks a shared document before a store writes it: a key of 1 to
/// [`MAX_DOCUMENT_KEY_BYTES`] bytes without control characters, and a
/// value that is a JSON object of at most [`MAX_DOCUMENT_BYTES`] that
/// loads back ([`check_update`]'s rules). Refused with
/// [`StoreError::InvalidInput`] (or [`StoreError::TooLarge`]).
///
/// ```
/// use serde_json::json;
/// use steadfast_core::store::check_document;
/// assert!(check_document("limit:openai", &json!({"size": 8})).is_ok());
/// assert!(check_document("", &json!({})).is_err());
/// assert!(check_document("a\u{7}", &json!({})).is_err());
/// assert!(check_document("k", &json!([1])).is_err());
/// ```
pub fn check_document(key: &str, value: &serde_json::Value) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_DOCUMENT_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(StoreError::InvalidInput(format!(
            "the document key {:?} must be 1 to {MAX_DOCUMENT_KEY_BYTES} bytes without control characters; nothing was written",
            crate::record::ids::preview(key)
        )));
    }
    let serde_json::Value::Object(map) = value else {
        return Err(StoreError::InvalidInput(format!(
            "document {key:?}: its value must be a JSON object; nothing was written"
        )));
    };
    check_update(map).map_err(|p| {
        StoreError::InvalidInput(format!(
            "document {key:?}: the value at `{}`: {}; nothing was written",
            p.path, p.reason
        ))
    })?;
    let size = crate::store::named::json_len(value);
    if size > MAX_DOCUMENT_BYTES as u64 {
        return Err(StoreError::TooLarge {
            run_id: key.to_string(),
            what: "document",
            size,
            limit: MAX_DOCUMENT_BYTES as u64,
        });
    }
    Ok(())
}

/// A document as a store reads it back from its JSON text and version
/// (`version` as stored; one below 1 or past `u64` reads as 0): a text
/// that is not a JSON object a write would take, or a version of 0, is
/// [`StoreError::Corrupt`] at `location`. One rule for every store that
/// keeps documents as text.
///
/// ```
/// use steadfast_core::store::decode_document;
/// assert_eq!(decode_document("k", r#"{"n":1}"#, 2, "here").unwrap().version, 2);
/// assert!(decode_document("k", "[1]", 2, "here").is_err());
/// assert!(decode_document("k", "{}", 0, "here").is_err());
/// ```
pub fn decode_document(
    key: &str,
    text: &str,
    version: u64,
    location: &str,
) -> Result<Document, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        location: format!("{location} document {key:?}"),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    check_document(key, &value).map_err(|e| corrupt(e.to_string()))?;
    if version == 0 {
        return Err(corrupt("version 0 is never stored".into()));
    }
    Ok(Document::new(key, value, version))
}

/// Small documents shared by every process on a store, each a JSON object
/// under a key, written by compare-and-swap on its version as runs are: a
/// capability of a [`Store`] ([`Capabilities::documents`]) on which
/// concurrency limits and rate buckets are built.
///
/// - Writes MUST be durable as a save is, and MUST check the document with
///   [`check_document`] first, writing nothing when it fails.
/// - Documents are apart from runs: [`Store::list`] never shows them and
///   deleting a run never touches them.
#[async_trait]
pub trait Documents: Send + Sync {
    /// The document under `key`, or `None`.
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError>;

    /// Writes `value` under `key` if the stored version is `expected`
    /// (`None`: no document under `key`) and returns the new version
    /// (`expected + 1`, or 1).
    ///
    /// - MUST fail with [`StoreError::Conflict`] and write nothing when the
    ///   stored version is not `expected`.
    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError>;

    /// The documents whose keys start with `prefix`, in key order.
    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError>;

    /// Deletes the document under `key` if its version is `expected`;
    /// `false` when there is none or another version is stored.
    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError>;
}

/// Large values stored once, by reference ([`blob`]): a capability of a
/// [`Store`] ([`Capabilities::blobs`]) that says what a run stores and what
/// the store's blobs weigh, for `steadfast show` and `steadfast gc`.
#[async_trait]
pub trait Blobs: Send + Sync {
    /// What run `run_id` stores (`None`: an absent run).
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError>;

    /// The store's blobs in all.
    async fn blob_totals(&self) -> Result<BlobTotals, StoreError>;

    /// Values whose JSON text is longer than this many bytes are kept as
    /// blobs (and count as their references towards
    /// [`Capabilities::max_state_bytes`]).
    fn threshold(&self) -> u64;

    /// Whether one content is stored once for every run that holds it
    /// (`false`: once per run, as on Cosmos DB, whose blobs live in their
    /// run's partition).
    fn shared_across_runs(&self) -> bool {
        true
    }

    /// Removes what writes that failed or were cut short left behind and
    /// no run will ever read (with `dry_run`, only counts it): on a store
    /// that cannot free a blob in the transaction that drops its last
    /// reference, a delete interrupted half-way or a create that failed
    /// after writing its large values leaves items no record names.
    /// `steadfast gc` calls it. The default, for stores whose writes free
    /// everything in their own transaction, finds nothing.
    async fn collect_leftovers(&self, dry_run: bool) -> Result<Leftovers, StoreError> {
        let _ = dry_run;
        Ok(Leftovers::default())
    }
}

/// What [`Blobs::collect_leftovers`] removed (or, dry, found).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Leftovers {
    /// The failed or cut-short writes whose items were found (each counted
    /// once, however many items it left).
    pub remnants: u64,
    /// Their items (removed, or on a dry run found).
    pub items: u64,
    /// Remnants whose items could not all be removed (the reason is
    /// logged; what went stays gone, the next call tries the rest again).
    pub failed: u64,
}

impl Leftovers {
    /// Counts from their parts, none failed.
    pub fn new(remnants: u64, items: u64) -> Self {
        Leftovers {
            remnants,
            items,
            failed: 0,
        }
    }
}

/// What one run stores, in bytes ([`Blobs::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Usage {
    /// Its record: the head, the state as stored (references in place of
    /// large values) and the history rows.
    pub record_bytes: u64,
    /// The blobs it refers to.
    pub blobs: u64,
    /// Their size.
    pub blob_bytes: u64,
    /// The part of `blob_bytes` that other runs refer to as well (stored
    /// once for all of them).
    pub shared_bytes: u64,
}

impl Usage {
    /// A usage from its parts.
    pub fn new(record_bytes: u64, blobs: u64, blob_bytes: u64, shared_bytes: u64) -> Self {
        Usage {
            record_bytes,
            blobs,
            blob_bytes,
            shared_bytes,
        }
    }
}

/// A store's blobs in all ([`Blobs::blob_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct BlobTotals {
    /// How many.
    pub blobs: u64,
    /// Their size in bytes.
    pub bytes: u64,
}

impl BlobTotals {
    /// Totals from their parts.
    pub fn new(blobs: u64, bytes: u64) -> Self {
        BlobTotals { blobs, bytes }
    }
}

/// Per-step history: a capability of a [`Store`]
/// ([`Capabilities::history`]), on which rewind, fork, prune and export
/// rely.
#[async_trait]
pub trait History: Send + Sync {
    /// The run's per-step history: one [`StepRecord`] per completed step, in
    /// index order, as the saves that completed them carried.
    ///
    /// - MUST return `Ok(None)` for an absent run.
    /// - MUST return the records of the steps below the run's `next`, at most one
    ///   per index (the latest save's), and none at or above `next`.
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError>;

    /// Rewrites run `run_id`'s history as `rewrite` says, if the run's
    /// version is still `expected`: one write, or none. The version does not
    /// change. A [`Rewrite::replace`] replaces the updates of the rows with
    /// its records' indexes (names, attempts and times stay), for
    /// re-encryption (`steadfast rekey`); a [`Rewrite::fold`] also deletes
    /// the rows below its record's index, whose updates it holds merged (for
    /// `steadfast prune`).
    ///
    /// - MUST fail with [`StoreError::Conflict`] and change nothing when the
    ///   stored version is not `expected`, or the run is absent;
    /// - MUST leave every row not named as it was, and what [`Store::load`]
    ///   returns unchanged: a record that a load still merges into the state
    ///   (on stores that keep deltas, those since the last snapshot; a save
    ///   without a step takes a snapshot) or one at or above `next` is
    ///   refused with [`StoreError::InvalidInput`], and nothing is written;
    /// - a fold into a row that does not exist MUST be refused
    ///   ([`no_row_to_fold`](rows::no_row_to_fold)), and after a fold
    ///   [`history`](History::history) MUST list the rows from the fold's
    ///   index on.
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError>;
}

/// History rows as [`Rewrite::rows_with_blobs`] gives them: each record's
/// index and update text, and the blobs those refer to.
pub type RowsAndBlobs = (Vec<(i64, String)>, Vec<blob::Blob>);

/// A history rewrite or fold, checked before any store sees it: the records
/// whose updates replace the stored rows' (names, attempts and times stay)
/// and, for a fold, the rows below the first record's index deleted. Made
/// only by [`Rewrite::replace`] and [`Rewrite::fold`], which refuse an
/// update that would not load back, so a store given one need not look at
/// the values again.
#[derive(Clone, Copy, Debug)]
pub struct Rewrite<'a> {
    records: &'a [StepRecord],
    fold: bool,
}

impl<'a> Rewrite<'a> {
    /// Replaces the updates of the rows with `records`' indexes (for
    /// `steadfast rekey`).
    pub fn replace(run_id: &str, records: &'a [StepRecord]) -> Result<Self, StoreError> {
        for r in records {
            check_state(run_id, "step's update", &r.update)?;
        }
        Ok(Rewrite {
            records,
            fold: false,
        })
    }

    /// Folds the rows below `fold.index` into its row: that row takes
    /// `fold`'s update and the rows below it go (for `steadfast prune`).
    pub fn fold(run_id: &str, fold: &'a StepRecord) -> Result<Self, StoreError> {
        let mut rewrite = Self::replace(run_id, std::slice::from_ref(fold))?;
        rewrite.fold = true;
        Ok(rewrite)
    }

    /// The same rewrite of other records (a wrapper's sealed copies): a
    /// fold stays a fold.
    pub fn with_records<'b>(
        &self,
        run_id: &str,
        records: &'b [StepRecord],
    ) -> Result<Rewrite<'b>, StoreError> {
        if self.fold && records.len() != 1 {
            return Err(StoreError::InvalidInput(format!(
                "run {run_id:?}: a fold takes one record, not {}",
                records.len()
            )));
        }
        let mut rewrite = Rewrite::replace(run_id, records)?;
        rewrite.fold = self.fold;
        Ok(rewrite)
    }

    /// The records whose updates are written.
    pub fn records(&self) -> &'a [StepRecord] {
        self.records
    }

    /// Whether this is a fold.
    pub fn is_fold(&self) -> bool {
        self.fold
    }

    /// For a fold, the index below which rows are deleted.
    pub fn delete_below(&self) -> Option<usize> {
        self.records.first().filter(|_| self.fold).map(|r| r.index)
    }

    /// [`rows`](Self::rows) for a store with blobs: each update's values
    /// over `threshold` bytes as references, their blobs returned beside
    /// (each content once), values that look like references escaped (see
    /// [`blob`]).
    pub fn rows_with_blobs(
        &self,
        run_id: &str,
        threshold: u64,
    ) -> Result<RowsAndBlobs, StoreError> {
        let mut blobs = Vec::new();
        let rows = self
            .records
            .iter()
            .map(|r| {
                Ok((
                    to_i64(run_id, "step index", r.index as u64)?,
                    blob::encode_object(&r.update, threshold, run_id, "step's update", &mut blobs)?,
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok((rows, blobs))
    }

    /// Each record's index (as SQL keeps it) and update as JSON text.
    pub fn rows(&self, run_id: &str) -> Result<Vec<(i64, String)>, StoreError> {
        self.records
            .iter()
            .map(|r| {
                Ok((
                    to_i64(run_id, "step index", r.index as u64)?,
                    encode_json(&r.update, run_id, "step's update")?,
                ))
            })
            .collect()
    }
}

/// Scheduling for workers: a capability of a [`Store`]
/// ([`Capabilities::schedule`]). Without it, workers find due runs by
/// listing and loading the unfinished ones ([`claim_due_by_listing`]) and
/// look again at their poll interval.
#[async_trait]
pub trait Schedule: Send + Sync {
    /// Up to `limit` runs of the named workflows that a worker may take at
    /// `now` ([`Checkpoint::runnable_at`] at or before it), soonest first.
    ///
    /// A store may reserve what it returns for `worker` during `hold`, so
    /// that other workers asking meanwhile get other runs (the PostgreSQL
    /// store does, with `FOR UPDATE SKIP LOCKED`, and judges `now` by its
    /// own clock). A reservation is only a hint: the lease the run loop
    /// claims by compare-and-swap decides who runs a run.
    async fn claim_due(&self, due: &DueRequest<'_>) -> Result<Vec<RunSummary>, StoreError>;

    /// Waits until work may have arrived (a run started, decided or come
    /// due) or `timeout` passed, whichever is first (the PostgreSQL store
    /// wakes on `LISTEN/NOTIFY`).
    async fn wait_for_work(&self, timeout: std::time::Duration) {
        tokio::time::sleep(timeout).await;
    }
}

/// What callers use on any [`Store`]: its capabilities as methods, each
/// answering [`StoreError::Unsupported`], or a default, for a store that
/// lacks it. Implemented for every store; a store never implements it.
#[async_trait]
pub trait StoreExt: Store {
    /// [`History::history`], or [`StoreError::Unsupported`].
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        history_of(self)?.history(run_id).await
    }

    /// Replaces the updates of run `run_id`'s history rows with `records`'
    /// ([`Rewrite::replace`] through [`History::rewrite`]), or
    /// [`StoreError::Unsupported`].
    async fn rewrite_history(
        &self,
        run_id: &str,
        expected: u64,
        records: &[StepRecord],
    ) -> Result<(), StoreError> {
        let rewrite = Rewrite::replace(run_id, records)?;
        history_of(self)?.rewrite(run_id, expected, rewrite).await
    }

    /// Folds run `run_id`'s history below `fold.index` into that row
    /// ([`Rewrite::fold`] through [`History::rewrite`]), or
    /// [`StoreError::Unsupported`].
    async fn fold_history(
        &self,
        run_id: &str,
        expected: u64,
        fold: &StepRecord,
    ) -> Result<(), StoreError> {
        let rewrite = Rewrite::fold(run_id, fold)?;
        history_of(self)?.rewrite(run_id, expected, rewrite).await
    }

    /// [`Schedule::claim_due`], or [`claim_due_by_listing`].
    async fn claim_due(&self, due: &DueRequest<'_>) -> Result<Vec<RunSummary>, StoreError> {
        match self.capabilities().schedule {
            Some(s) => s.claim_due(due).await,
            None => claim_due_by_listing(self, due).await,
        }
    }

    /// [`Schedule::wait_for_work`], or a sleep of `timeout`.
    async fn wait_for_work(&self, timeout: std::time::Duration) {
        match self.capabilities().schedule {
            Some(s) => s.wait_for_work(timeout).await,
            None => tokio::time::sleep(timeout).await,
        }
    }

    /// The store's own clock ([`Capabilities::clock`]), if it has one.
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        self.capabilities().clock
    }

    /// The store's state size limit ([`Capabilities::max_state_bytes`]),
    /// if it has one.
    fn max_state_bytes(&self) -> Option<u64> {
        self.capabilities().max_state_bytes
    }

    /// [`Blobs::usage`], or `Ok(None)` for a store without blobs.
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError> {
        match self.capabilities().blobs {
            Some(b) => b.usage(run_id).await,
            None => Ok(None),
        }
    }

    /// [`Blobs::threshold`], or `None` for a store without blobs.
    fn blob_threshold(&self) -> Option<u64> {
        self.capabilities().blobs.map(|b| b.threshold())
    }

    /// [`Blobs::blob_totals`], or `Ok(None)` for a store without blobs.
    async fn blob_totals(&self) -> Result<Option<BlobTotals>, StoreError> {
        match self.capabilities().blobs {
            Some(b) => b.blob_totals().await.map(Some),
            None => Ok(None),
        }
    }

    /// [`Blobs::collect_leftovers`], or nothing found for a store without
    /// blobs.
    async fn collect_leftovers(&self, dry_run: bool) -> Result<Leftovers, StoreError> {
        match self.capabilities().blobs {
            Some(b) => b.collect_leftovers(dry_run).await,
            None => Ok(Leftovers::default()),
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// `store`'s [`History`], or [`StoreError::Unsupported`] saying that it
/// keeps none (for wrappers that pass a rewrite on).
pub fn history_of<S: Store + ?Sized>(store: &S) -> Result<&dyn History, StoreError> {
    store
        .capabilities()
        .history
        .ok_or_else(|| StoreError::Unsupported("this store keeps no per-step history".into()))
}

/// The store's shared documents, or [`StoreError::Unsupported`].
pub fn documents_of<S: Store + ?Sized>(store: &S) -> Result<&dyn Documents, StoreError> {
    store.capabilities().documents.ok_or_else(|| {
        StoreError::Unsupported(
            "this store keeps no shared documents (concurrency and rate limits need them)".into(),
        )
    })
}

/// Due runs found by listing the unfinished runs and loading each: what a
/// store without [`Schedule`] gives workers. It suits stores of one machine
/// with few unfinished runs: finished runs cost nothing (`list` filters by
/// status), but every run that is running, sleeping or waiting is loaded on
/// every look.
pub async fn claim_due_by_listing<S: Store + ?Sized>(
    store: &S,
    due: &DueRequest<'_>,
) -> Result<Vec<RunSummary>, StoreError> {
    let mut found: Vec<(Timestamp, RunSummary)> = Vec::new();
    for status in [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Sleeping,
        RunStatus::Waiting,
    ] {
        for &workflow in due.workflows {
            let mut filter = ListFilter::new()
                .status(status)
                .workflow(workflow)
                .limit(256);
            loop {
                let page = filter.next_page(store).await?;
                if page.is_empty() {
                    break;
                }
                for summary in page {
                    let Some(cp) = store.load(&summary.run_id).await? else {
                        continue;
                    };
                    if due.skip.contains(&cp.run_id.as_str()) {
                        continue;
                    }
                    if let Some(at) = cp.runnable_at().filter(|at| *at <= due.now) {
                        found.push((at, RunSummary::from(&cp)));
                    }
                }
            }
        }
    }
    Ok(claim_order(found, due.limit))
}

/// The due runs a claim of at most `limit` takes, in the order
/// [`fair_order`](crate::record::queue::fair_order) gives with a fresh
/// seed: by priority, then by turns over partitions, then by due time. For
/// stores that find their due runs with their due times and order them here.
pub fn claim_order(found: Vec<(Timestamp, RunSummary)>, limit: usize) -> Vec<RunSummary> {
    let default = crate::record::queue::Queue::default();
    let order: Vec<String> = crate::record::queue::fair_order(
        found
            .iter()
            .map(|(at, s)| (s.run_id.as_str(), *at, s.queue.as_ref().unwrap_or(&default))),
        limit,
        fastrand::u64(..),
    )
    .into_iter()
    .map(str::to_string)
    .collect();
    let mut by_id: std::collections::HashMap<String, RunSummary> = found
        .into_iter()
        .map(|(_, s)| (s.run_id.clone(), s))
        .collect();
    order.iter().filter_map(|id| by_id.remove(id)).collect()
}

/// What [`Schedule::claim_due`] is asked for.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct DueRequest<'a> {
    /// Who asks (an [`Owner`](crate::Owner), written out).
    pub worker: &'a str,
    /// Only runs of these workflows.
    pub workflows: &'a [&'a str],
    /// The asker's time.
    pub now: Timestamp,
    /// How long a store that reserves runs keeps them for the asker.
    pub hold: std::time::Duration,
    /// At most this many runs.
    pub limit: usize,
    /// Run ids not to return (the asker has them in hand, or leaves them
    /// alone for a while).
    pub skip: &'a [&'a str],
}

impl<'a> DueRequest<'a> {
    /// A request by `worker` for at most `limit` runs of `workflows` due at `now`.
    pub fn new(
        worker: &'a str,
        workflows: &'a [&'a str],
        now: Timestamp,
        hold: std::time::Duration,
        limit: usize,
    ) -> Self {
        DueRequest {
            worker,
            workflows,
            now,
            hold,
            limit,
            skip: &[],
        }
    }
}

#[async_trait]
impl<T: Store + ?Sized> Store for Arc<T> {
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        (**self).load(run_id).await
    }
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        (**self).save(req).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        (**self).list(filter).await
    }
    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        (**self).delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        (**self).delete_if(run_id, version).await
    }
    fn capabilities(&self) -> Capabilities<'_> {
        (**self).capabilities()
    }
}

/// Checks everything in a checkpoint except its state that decides whether
/// the record loads back, before a store writes it: the run id, the
/// bookkeeping that decoding checks (format, `next` against the completed
/// steps), and every decision's data, checked as the state value it becomes
/// under the gate's key (the run merges it there).
///
/// Every store calls this, with [`check_state`] on the state (or on the
/// step's update, for a store that persists deltas of a state it checked
/// before), so that no store accepts a write it could not read back. Limits
/// that are policy rather than readability (names, the length of a reason or
/// an error message) are checked where those values enter, so that a record
/// written under other limits still saves.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::{store::check_head, Checkpoint, Decision, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// assert!(check_head(&cp).is_ok());
/// let mut deep = json!(1);
/// for _ in 0..126 { deep = json!([deep]); }
/// cp.decisions.push(Decision::approve("review", "ada", Timestamp::EPOCH, Some(deep)));
/// assert!(check_head(&cp).unwrap_err().to_string().contains("review"));
/// ```
pub fn check_head(cp: &Checkpoint) -> Result<(), StoreError> {
    let run_id = &cp.run_id;
    if let Err(e) = crate::record::ids::validate_run_id(run_id) {
        return Err(StoreError::InvalidInput(format!(
            "{e}; nothing was written"
        )));
    }
    if let Err(what) = cp.check_shape() {
        return Err(StoreError::InvalidInput(format!(
            "run {run_id:?}: {what}; nothing was written"
        )));
    }
    for d in &cp.decisions {
        if let Some(data) = &d.data {
            check_decision_data(&d.gate, data).map_err(|p| {
                StoreError::InvalidInput(format!(
                    "run {run_id:?}: the decision data at gate {:?}, at `{}`: {}; nothing was written",
                    d.gate, p.path, p.reason
                ))
            })?;
        }
    }
    Ok(())
}

/// Checks a decision's data as the value it becomes in the state: the
/// gate's key.
pub(crate) fn check_decision_data(
    gate: &str,
    data: &serde_json::Value,
) -> Result<(), ValueProblem> {
    crate::record::state::check_entries(std::iter::once((gate, data)))
}

/// Checks a state (or an update) with [`check_update`] and words a problem as
/// the store error a save returns.
pub fn check_state(run_id: &str, what: &str, values: &State) -> Result<(), StoreError> {
    check_update(values).map_err(|p| {
        StoreError::InvalidInput(format!(
            "run {run_id:?}: {what} value at `{}`: {}; nothing was written",
            p.path, p.reason
        ))
    })
}

/// The record a [`head_only`](SaveRequest::head_only) save leaves: the head
/// of `cp` (everything but its state, completed steps and `next`) with the
/// stored record's state, completed steps and `next`, which are moved out of
/// `stored`. Neither state is copied.
pub fn merge_head(cp: &Checkpoint, stored: &mut Checkpoint) -> Checkpoint {
    Checkpoint {
        format: cp.format,
        run_id: cp.run_id.clone(),
        workflow: cp.workflow.clone(),
        status: cp.status,
        next: stored.next,
        completed: std::mem::take(&mut stored.completed),
        state: std::mem::take(&mut stored.state),
        version: cp.version,
        created_at: cp.created_at,
        updated_at: cp.updated_at,
        attempts: cp.attempts,
        error: cp.error.clone(),
        writer: cp.writer,
        lease: cp.lease.clone(),
        wait: cp.wait.clone(),
        decisions: cp.decisions.clone(),
        seal: cp.seal.clone(),
        audit: cp.audit.clone(),
        origin: cp.origin.clone(),
        spend: cp.spend.clone(),
        queue: cp.queue.clone(),
        passed_over: cp.passed_over.clone(),
    }
}

/// Refuses `size` bytes of `what` ("state", "store file") over `limit` with
/// [`StoreError::TooLarge`], the error every store gives for it.
pub fn check_size(
    run_id: &str,
    what: &'static str,
    size: u64,
    limit: u64,
) -> Result<(), StoreError> {
    if size > limit {
        return Err(StoreError::TooLarge {
            run_id: run_id.to_string(),
            what,
            size,
            limit,
        });
    }
    Ok(())
}

/// The checks of a save that writes the whole state: within `limit` bytes,
/// and every value one that loads back ([`check_state`]).
pub fn check_whole_state(run_id: &str, state: &State, limit: u64) -> Result<(), StoreError> {
    check_size(run_id, "state", state_size(state), limit)?;
    check_state(run_id, "state", state)
}

/// The serialized size of a state, in bytes, without building the text.
pub fn state_size(state: &crate::State) -> u64 {
    crate::store::named::json_object_len(state)
}

/// The size of `v` written as compact JSON, in bytes, without building the
/// text (nor copying `v`).
pub fn json_size<T: serde::Serialize + ?Sized>(v: &T) -> u64 {
    crate::store::named::serialized_len(v)
}

/// A store URL fit for messages and logs: a password in its user part
/// (`scheme://user:PASSWORD@host`) or in a `password=` parameter becomes
/// `***`. Everything up to the first `@` after `://` counts as the user
/// part, as PostgreSQL's URL parser reads it, so a password holding `/` or
/// `?` is hidden too (a URL with no password may lose a little more than
/// needed).
///
/// ```
/// use steadfast_core::store::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db/prod"), "postgres://app:***@db/prod");
/// assert_eq!(redact_url("postgres://db/prod?password=x&schema=a"), "postgres://db/prod?password=***&schema=a");
/// assert_eq!(redact_url("sqlite:runs.db"), "sqlite:runs.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let after = scheme_end + 3;
        if let Some(at) = out[after..].find('@') {
            if let Some(colon) = out[after..after + at].find(':') {
                out.replace_range(after + colon + 1..after + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    out
}
