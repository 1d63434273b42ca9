//! The Azure Cosmos DB (NoSQL API) store of Steadfast:
//! `cosmos://HOST[:PORT]/DATABASE/CONTAINER`.
//!
//! - **One logical partition per run.** The partition key is the run's key
//!   (its id, encoded), so runs spread over physical partitions and every
//!   operation on a run is a point operation, a transactional batch or a
//!   query within its partition. `list` is the one cross-partition query,
//!   over head items only.
//! - **Items.** A head item (status, version, next step, lease, wait,
//!   decisions, the state snapshot when it is small), a history item per
//!   completed step (its update), and chunk items for a state or an update
//!   too large for one item.
//! - **Every checkpoint is one transactional batch**: the head replaced with
//!   `If-Match: ETAG` (created, for a fresh run) first, then the step's
//!   history item; a 412 or 409 is a conflict that changes nothing. Chunks
//!   are written before the batch that refers to them: a crash between the
//!   two leaves only chunks nothing refers to, which are never read (and
//!   which `steadfast gc` removes: `Blobs::collect_leftovers`).
//! - **Large values.** A value of a state or of a step's update whose JSON
//!   text is over the blob threshold (64 KiB by default,
//!   `?blob_threshold=SIZE`) is a blob: items in the run's partition, named
//!   by the run's generation and the SHA-256 of the text, written (and
//!   checked for) before the batch that first refers to them, so a step
//!   that returns a document the run holds already writes only a reference.
//!   Blobs live in the run's partition because a transactional batch (and
//!   so a count of who refers to a blob) never spans two partitions: the
//!   same content is stored once per run, not once per container, and goes
//!   with the run.
//! - **Keys.** The master key comes from `$STEADFAST_COSMOS_KEY`, or from the
//!   file named by `?keyfile=PATH`; never from the URL itself, and it never
//!   appears in a message.
//! - **TLS** through rustls, with the Mozilla roots, or with the certificate
//!   of `?cafile=PATH` (a local emulator's).
//! - **Retries.** Within a retry budget (30 s by default,
//!   `?retry_budget=DURATION`), a throttled request (429) is sent again
//!   after the delay the service advertises, a request that never left is
//!   sent again, and so is a read after a 408, a 503 or a lost answer. A
//!   write whose outcome is open (a lost answer, 408, 503) is reported as
//!   an unknown outcome: the run loop reads the head back and compares its
//!   version and writer, so the step is neither lost nor recorded twice.
//!
//! The client is a small REST client on reqwest; see `docs/cosmos.md`.

pub mod auth;
mod client;

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};
use steadfast_core::store::blob::{
    decision_refs, refs_of, Blob, BlobHash, Resolver, STORED_DECISIONS_FORMAT,
};
use steadfast_core::store::head::encode_head_with_blobs;
use steadfast_core::store::plan::{
    conflict, expect_version, head_only_of_absent, plan_save_with_blobs, Known, Plan,
};
use steadfast_core::store::rows::{
    no_row_to_fold, rebuild, still_merged, Fields, HistoryRow, Place, RecordRow,
};
use steadfast_core::store::{check_head, DueRequest, Rewrite, RunCache, SaveRequest};
use steadfast_core::{
    Capabilities, Document, Documents, Events, History, NewEvent, RunEvent, Schedule, Timestamp,
};
use steadfast_core::{
    Checkpoint, ListFilter, RunSummary, StepRecord, Store, StoreError, StoreErrorKind,
};

use crate::auth::MasterKey;
use crate::client::{answer_error, failure_error, Answer, Client};

/// The URL scheme of this store.
pub const URL_SCHEMES: &[&str] = &["cosmos"];

/// Default limit of one run's state: 64 MiB.
pub const DEFAULT_MAX_STATE_BYTES: u64 = 64 << 20;

/// The environment variable that holds the account's master key.
pub const KEY_ENV: &str = "STEADFAST_COSMOS_KEY";

/// A text longer than this goes into chunk items instead of its item. JSON
/// escaping can make a text up to six times longer in its item (a control
/// character becomes `\u0001`), so a head and a history item of inline
/// texts stay within a 2 MB batch.
const INLINE_MAX: usize = 128 * 1024;

/// The size of one chunk item's text: even escaped six times over, within
/// Cosmos's 2 MB per item.
const CHUNK: usize = 256 * 1024;

/// The largest head document (lease, wait, decisions with their data) a
/// head item takes, with room for the inline snapshot beside it.
const MAX_HEAD_DOC: usize = 256 * 1024;

/// Options of a [`CosmosStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CosmosOptions {
    /// The largest state (serialized) of one run.
    pub max_state_bytes: u64,
    /// Whether opening may create the database and the container.
    pub create: bool,
    /// The size (JSON text, bytes) above which a value is stored once per
    /// run as a blob (default 64 KiB; `?blob_threshold=SIZE` in a URL,
    /// which wins over this).
    pub blob_threshold: u64,
    /// How long one request is retried for: throttled (429, after the delay
    /// the service asks for), never sent, or a read that met a timeout, an
    /// unavailable service or a lost answer (default 30 s;
    /// `?retry_budget=DURATION` in a URL, which wins over this). No try
    /// starts past it (a try itself may take up to the client's 60 s
    /// timeout); a request still throttled then fails with an error that
    /// names the budget, others with their last error and the tries made.
    pub retry_budget: std::time::Duration,
    /// How long a create may wait between two of its writes before its
    /// batch ([`CREATE_WINDOW`], the longest taken; shorter only in
    /// tests).
    #[doc(hidden)]
    pub create_window: std::time::Duration,
}

impl Default for CosmosOptions {
    fn default() -> Self {
        CosmosOptions {
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            create: true,
            blob_threshold: steadfast_core::store::blob::DEFAULT_BLOB_THRESHOLD,
            retry_budget: client::DEFAULT_RETRY_BUDGET,
            create_window: CREATE_WINDOW,
        }
    }
}

/// The longest a create may wait between two of its writes before its
/// batch: each item it writes under a generation of its own (a blob's
/// part or manifest, a chunk) starts, and its batch is sent, within this
/// of the last such write landing (or of the save's start). Past it the
/// create sends nothing more, deletes what it wrote and fails as
/// unavailable. A write's answer may come a request's timeout (1 minute)
/// after the service stamped it, so with the longest retry budget (10
/// minutes) and another timeout the batch lands within 32 minutes of the
/// create's newest item, which is what lets [`LEFTOVER_AGE`] tell a create
/// in flight from one that died.
pub const CREATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// How old (by the service's clock, each item's `_ts`) the newest item of
/// a generation no head names must be before
/// `collect_leftovers` removes the generation's items: the 32 minutes
/// between a create's newest item and its batch (see [`CREATE_WINDOW`]),
/// and a margin of 28 for the difference between this machine's clock and
/// the service's.
pub const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(60 * 60);

impl CosmosOptions {
    /// Sets the per-run state limit.
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = bytes;
        self
    }
    /// Sets whether opening may create the database and container.
    pub fn create(mut self, yes: bool) -> Self {
        self.create = yes;
        self
    }
    /// Sets [`CosmosOptions::create_window`] (for tests).
    #[doc(hidden)]
    pub fn create_window(mut self, window: std::time::Duration) -> Self {
        self.create_window = window;
        self
    }
    /// Sets the size above which a value is stored as a blob (checked when
    /// the store opens: 256 bytes to 1 GiB).
    pub fn blob_threshold(mut self, bytes: u64) -> Self {
        self.blob_threshold = bytes;
        self
    }
    /// Sets how long one request is retried in all (checked when the store
    /// opens: at most 10 minutes).
    pub fn retry_budget(mut self, budget: std::time::Duration) -> Self {
        self.retry_budget = budget;
        self
    }
}

/// What a store remembers of a run between a load and its saves.
#[derive(Clone, Debug)]
struct Acct {
    version: u64,
    etag: String,
    next: usize,
    snapshot_bytes: u64,
    delta_bytes: u64,
    /// The head's snapshot fields, which a save that appends a delta must
    /// carry over into the replaced head, when they are small enough to
    /// remember (else the head is read again).
    carry: Option<Arc<serde_json::Map<String, Value>>>,
    /// The run's generation: a tag given when the run is created and kept
    /// by every item of it, so that items of a deleted run never count for
    /// a run created again with the same id.
    gen: String,
    /// The blobs the head refers to (a decision's data): stored while the
    /// head is at this version, as a sweep counts them.
    head_blobs: Arc<[BlobHash]>,
}

/// The fields of a head item that describe its snapshot.
const SNAPSHOT_FIELDS: [&str; 5] = [
    "snapshot",
    "snapshot_chunks",
    "snapshot_chunks_tag",
    "snapshot_completed",
    "snapshot_next",
];

/// The snapshot fields of a head item, if they are small enough to keep.
fn carry_of(head: &serde_json::Map<String, Value>) -> Option<Arc<serde_json::Map<String, Value>>> {
    let small = head
        .get("snapshot")
        .and_then(Value::as_str)
        .is_none_or(|s| s.len() <= INLINE_MAX);
    small.then(|| {
        Arc::new(
            SNAPSHOT_FIELDS
                .iter()
                .filter_map(|f| head.get(*f).map(|v| (f.to_string(), v.clone())))
                .collect(),
        )
    })
}

/// The Cosmos DB store. Cheap to clone.
#[derive(Clone)]
pub struct CosmosStore {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    display: String,
    opts: CosmosOptions,
    accts: RunCache<Acct>,
}

impl std::fmt::Debug for CosmosStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosStore")
            .field("url", &self.shared.display)
            .finish_non_exhaustive()
    }
}

/// What a `cosmos://` URL says.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    host: String,
    port: u16,
    db: String,
    coll: String,
    keyfile: Option<String>,
    cafile: Option<String>,
    blob_threshold: Option<u64>,
    retry_budget: Option<std::time::Duration>,
}

fn parse_url(url: &str) -> Result<Parsed, StoreError> {
    let bad = |why: &str| {
        StoreError::InvalidInput(format!(
            "store URL: {why} (expected cosmos://HOST[:PORT]/DATABASE/CONTAINER[?keyfile=PATH][&cafile=PATH][&blob_threshold=SIZE][&retry_budget=DURATION])"
        ))
    };
    let rest = url
        .strip_prefix("cosmos://")
        .ok_or_else(|| bad("it does not start with cosmos://"))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parts = path.split('/');
    let authority = parts
        .next()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| bad("no host"))?;
    if authority.contains('@') {
        return Err(bad(
            "a key or user does not belong in the URL; use $STEADFAST_COSMOS_KEY or ?keyfile=PATH",
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| bad("the port is not a number"))?,
        ),
        None => (authority, 443),
    };
    let db = parts
        .next()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| bad("no database"))?;
    let coll = parts
        .next()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("no container"))?;
    if parts.next().is_some() {
        return Err(bad("too many path segments"));
    }
    for name in [db, coll] {
        let ok = name.len() <= 255
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !ok {
            return Err(bad(&format!(
                "{name:?} is not a database or container name this store uses (letters, digits, '-', '_', '.')"
            )));
        }
    }
    let (mut keyfile, mut cafile, mut blob_threshold, mut retry_budget) = (None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("keyfile", v)) if !v.is_empty() => keyfile = Some(v.to_string()),
            Some(("cafile", v)) if !v.is_empty() => cafile = Some(v.to_string()),
            Some(("blob_threshold", v)) => {
                let size = steadfast_core::store::blob::parse_size(v).map_err(|e| match e {
                    StoreError::InvalidInput(why) => bad(&format!("blob_threshold: {why}")),
                    other => other,
                })?;
                blob_threshold = Some(size);
            }
            Some(("retry_budget", v)) => {
                let budget = humantime::parse_duration(v).map_err(|e| {
                    bad(&format!(
                        "retry_budget: {v:?} is not a duration like 30s or 2m ({e})"
                    ))
                })?;
                retry_budget = Some(budget);
            }
            Some(("key", _)) => {
                return Err(bad(
                    "the key never goes in the URL; use $STEADFAST_COSMOS_KEY or ?keyfile=PATH",
                ))
            }
            _ => {
                return Err(bad(&format!(
                    "unknown parameter {:?}",
                    pair.split('=').next().unwrap_or("")
                )))
            }
        }
    }
    Ok(Parsed {
        host: host.to_string(),
        port,
        db: db.to_string(),
        coll: coll.to_string(),
        keyfile,
        cafile,
        blob_threshold,
        retry_budget,
    })
}

fn read_key(keyfile: Option<&str>) -> Result<MasterKey, StoreError> {
    let text = match keyfile {
        Some(path) => read_key_file(std::path::Path::new(path))?,
        None => std::env::var(KEY_ENV).map_err(|_| {
            StoreError::InvalidInput(format!(
                "no Cosmos DB key: set ${KEY_ENV} or name a key file with ?keyfile=PATH"
            ))
        })?,
    };
    MasterKey::from_base64(&text)
        .map_err(|why| StoreError::InvalidInput(format!("the Cosmos DB key: {why}")))
}

/// Reads a key file: a regular file of this user's, readable by no one else
/// (it is a secret), of at most 4 KiB (a key is 88 characters).
fn read_key_file(path: &std::path::Path) -> Result<String, StoreError> {
    steadfast_core::local::read_secret_file(path, "key file", 4096, false)
        .map_err(StoreError::InvalidInput)
}

/// Encodes a run id into the characters an item id and a URL path may hold:
/// ASCII letters, digits, `-`, `_` and `.` stay; every other byte becomes
/// `~XX`. A run id of at most 200 bytes gives at most 600 characters, within
/// Cosmos's 1,023.
pub fn encode_run_id(run_id: &str) -> String {
    let mut out = String::with_capacity(run_id.len());
    for b in run_id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("~{b:02X}"));
        }
    }
    out
}

fn head_id(key: &str) -> String {
    format!("h~{key}")
}

fn step_id(key: &str, gen: &str, index: usize) -> String {
    format!("s~{key}~{gen}~{index:010}")
}

fn chunk_id(key: &str, tag: &str, n: usize) -> String {
    format!("c~{key}~{tag}~{n}")
}

/// Part `n` of a blob of run `key`'s generation `gen`, as the write
/// tagged `tag` made it (`None`: a blob written before parts were tagged).
/// Each write of a blob tags its parts afresh, so a write of a content a
/// sweep is deleting never meets the parts the sweep deletes.
fn blob_id(key: &str, gen: &str, hash: &BlobHash, tag: Option<&str>, n: usize) -> String {
    match tag {
        Some(tag) => format!("b~{key}~{gen}~{}~{tag}~{n}", hash.hex()),
        None => format!("b~{key}~{gen}~{}~{n}", hash.hex()),
    }
}

/// Whether `parts` parts can hold a blob of `bytes` bytes as this store
/// splits it (at most [`CHUNK`] bytes each, and at least three fewer but
/// for the last, to end on a character): so that a damaged or planted
/// manifest never makes a read or a sweep go through more parts than a
/// blob has.
fn parts_fit(parts: u64, bytes: u64) -> bool {
    (bytes.div_ceil(CHUNK as u64)..=bytes.div_ceil(CHUNK as u64 - 3)).contains(&parts)
}

/// The tag of the parts a manifest names (`None`: untagged parts), or
/// why it is not one this store writes (1 to 16 hex digits): a tag goes
/// into item ids, so a damaged or planted one is never used.
fn parts_tag(manifest: &Value) -> Result<Option<&str>, &'static str> {
    match manifest.get("tag") {
        None => Ok(None),
        Some(Value::String(t))
            if (1..=16).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            Ok(Some(t))
        }
        Some(_) => Err("a blob manifest whose parts' tag is not 1 to 16 hex digits"),
    }
}

/// The small item that says a blob is whole: how many parts, how many
/// bytes. Written after every part, read to see whether the blob is there.
fn manifest_id(key: &str, gen: &str, hash: &BlobHash) -> String {
    format!("b~{key}~{gen}~{}~m", hash.hex())
}

impl CosmosStore {
    /// Opens the container a `cosmos://` URL names, creating the database
    /// and the container (partitioned by `/pk`) when `opts.create` allows.
    pub async fn open_with(url: &str, mut opts: CosmosOptions) -> Result<Self, StoreError> {
        let p = parse_url(url)?;
        if let Some(t) = p.blob_threshold {
            opts.blob_threshold = t;
        }
        steadfast_core::store::blob::check_threshold(opts.blob_threshold)?;
        if let Some(b) = p.retry_budget {
            opts.retry_budget = b;
        }
        if opts.retry_budget > client::MAX_RETRY_BUDGET {
            return Err(StoreError::InvalidInput(format!(
                "the Cosmos DB retry budget of {:?} is longer than the {:?} a store takes",
                opts.retry_budget,
                client::MAX_RETRY_BUDGET
            )));
        }
        // Longer would let `collect_leftovers` take a create in flight.
        if opts.create_window > CREATE_WINDOW {
            return Err(StoreError::InvalidInput(format!(
                "a create window of {:?} is longer than the {:?} a store takes",
                opts.create_window, CREATE_WINDOW
            )));
        }
        let key = read_key(p.keyfile.as_deref())?;
        let tls = steadfast_core::store::tls::verified(p.cafile.as_deref(), "cafile")?;
        let base = format!("https://{}:{}", p.host, p.port);
        let display = format!("cosmos://{}:{}/{}/{}", p.host, p.port, p.db, p.coll);
        let client = Client::new(
            base,
            p.db.clone(),
            p.coll.clone(),
            key,
            tls,
            opts.retry_budget,
        )?;
        let store = CosmosStore {
            shared: Arc::new(Shared {
                client,
                display,
                opts,
                accts: RunCache::new(4096),
            }),
        };
        store.prepare().await?;
        Ok(store)
    }

    /// The request units the service charged this handle so far (as its
    /// `x-ms-request-charge` headers said), and the requests it sent.
    pub fn request_charge(&self) -> (f64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.shared.client;
        (
            c.charged_milli_ru.load(Relaxed) as f64 / 1000.0,
            c.requests.load(Relaxed),
        )
    }

    /// Opens with default options.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, CosmosOptions::default()).await
    }

    async fn prepare(&self) -> Result<(), StoreError> {
        let c = &self.shared.client;
        let ctx = format!("opening {}", self.shared.display);
        let get = |a: Result<Answer, client::Failure>| -> Result<Answer, StoreError> {
            a.map_err(|f| failure_error(f, &ctx, "", false))
        };
        let coll_link = c.coll_link();
        let found = get(c
            .send(Method::GET, "colls", &coll_link, &coll_link, &[], None)
            .await)?;
        match found.status.as_u16() {
            200 => {
                let paths = found
                    .json()
                    .ok()
                    .and_then(|c| c.pointer("/partitionKey/paths").cloned());
                if paths != Some(json!(["/pk"])) {
                    return Err(StoreError::InvalidInput(format!(
                        "{}: the container is partitioned by {} and this store needs /pk; name another container",
                        self.shared.display,
                        paths.map_or_else(|| "nothing".to_string(), |p| p.to_string())
                    )));
                }
                return Ok(());
            }
            404 if !self.shared.opts.create => {
                return Err(StoreError::NotFound(format!(
                    "no store: {} does not exist",
                    self.shared.display
                )))
            }
            404 => {}
            _ => return Err(answer_error(&found, &ctx, "", false)),
        }
        let db_body = serde_json::to_vec(&json!({ "id": c.db })).unwrap_or_default();
        let made = get(c
            .send(
                Method::POST,
                "dbs",
                "",
                "dbs",
                &[("content-type", "application/json".into())],
                Some(db_body),
            )
            .await)?;
        if !matches!(made.status.as_u16(), 201 | 409) {
            return Err(answer_error(
                &made,
                &format!("creating database {}", c.db),
                "",
                true,
            ));
        }
        let coll_body = serde_json::to_vec(&json!({
            "id": c.coll,
            "partitionKey": { "paths": ["/pk"], "kind": "Hash", "version": 2 }
        }))
        .unwrap_or_default();
        let db_link = format!("dbs/{}", c.db);
        let made = get(c
            .send(
                Method::POST,
                "colls",
                &db_link,
                &format!("{db_link}/colls"),
                &[("content-type", "application/json".into())],
                Some(coll_body),
            )
            .await)?;
        if !matches!(made.status.as_u16(), 201 | 409) {
            return Err(answer_error(
                &made,
                &format!("creating container {}", c.coll),
                "",
                true,
            ));
        }
        Ok(())
    }

    /// Deletes the store's database with everything in it (tests, teardown).
    pub async fn drop_database(&self) -> Result<(), StoreError> {
        let c = &self.shared.client;
        let link = format!("dbs/{}", c.db);
        let a = c
            .send(Method::DELETE, "dbs", &link, &link, &[], None)
            .await
            .map_err(|f| failure_error(f, "dropping the database", "", true))?;
        match a.status.as_u16() {
            204 | 404 => Ok(()),
            _ => Err(answer_error(&a, "dropping the database", "", true)),
        }
    }

    fn pk_header(key: &str) -> (&'static str, String) {
        ("x-ms-documentdb-partitionkey", format!("[\"{key}\"]"))
    }

    async fn read_item(
        &self,
        key: &str,
        id: &str,
        run_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        let c = &self.shared.client;
        let link = format!("{}/docs/{id}", c.coll_link());
        let what = format!("reading run {run_id:?} from {}", self.shared.display);
        let a = c
            .send(
                Method::GET,
                "docs",
                &link,
                &link,
                &[Self::pk_header(key)],
                None,
            )
            .await
            .map_err(|f| failure_error(f, &what, run_id, false))?;
        match a.status.as_u16() {
            200 => a.json().map(Some).map_err(|e| self.corrupt(run_id, id, e)),
            // Only a plain 404 means absent: 404/1002 (the session's
            // writes not yet readable here) and 404/1003 (no container) do
            // not.
            404 if a.header("x-ms-substatus").is_none_or(|s| s == "0") => Ok(None),
            404 => Err(StoreError::unavailable(format!(
                "{what}: HTTP 404 with substatus {}",
                a.header("x-ms-substatus").unwrap_or_default()
            ))),
            _ => Err(answer_error(&a, &what, run_id, false)),
        }
    }

    /// Runs a query within one run's partition, every page.
    async fn query_partition(
        &self,
        key: &str,
        run_id: &str,
        query: &str,
        params: Value,
    ) -> Result<Vec<Value>, StoreError> {
        self.query(Some(key), run_id, query, params).await
    }

    async fn query(
        &self,
        key: Option<&str>,
        run_id: &str,
        query: &str,
        params: Value,
    ) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::new();
        self.query_each(key, run_id, query, params, |item| out.push(item))
            .await?;
        Ok(out)
    }

    /// Runs a query (within `key`'s partition, or across partitions),
    /// handing `each` every item found, a page at a time.
    async fn query_each(
        &self,
        key: Option<&str>,
        run_id: &str,
        query: &str,
        params: Value,
        mut each: impl FnMut(Value) + Send,
    ) -> Result<(), StoreError> {
        let what = format!("querying {}", self.shared.display);
        let body = serde_json::to_vec(&json!({ "query": query, "parameters": params }))
            .unwrap_or_default();
        let mut continuation: Option<String> = None;
        loop {
            let mut headers = vec![
                ("content-type", "application/query+json".to_string()),
                ("x-ms-documentdb-isquery", "True".to_string()),
                ("x-ms-max-item-count", "1000".to_string()),
            ];
            if key.is_none() {
                headers.push((
                    "x-ms-documentdb-query-enablecrosspartition",
                    "True".to_string(),
                ));
            }
            if let Some(token) = &continuation {
                headers.push(("x-ms-continuation", token.clone()));
            }
            let a = self
                .post_docs(key, headers, body.clone())
                .await
                .map_err(|f| failure_error(f, &what, run_id, false))?;
            if a.status.as_u16() != 200 {
                return Err(answer_error(&a, &what, run_id, false));
            }
            let mut page = a.json().map_err(|e| self.corrupt(run_id, "query", e))?;
            if let Some(Value::Array(docs)) = page.get_mut("Documents").map(Value::take) {
                docs.into_iter().for_each(&mut each);
            }
            continuation = a
                .header("x-ms-continuation")
                .map(str::to_string)
                .filter(|t| !t.is_empty());
            if continuation.is_none() {
                return Ok(());
            }
        }
    }

    /// POSTs to the container's items (a create, an upsert, a batch or a
    /// query), in the partition of `key` when given.
    async fn post_docs(
        &self,
        key: Option<&str>,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    ) -> Result<Answer, client::Failure> {
        let c = &self.shared.client;
        let link = c.coll_link();
        let mut headers = headers;
        if let Some(k) = key {
            headers.push(Self::pk_header(k));
        }
        c.send(
            Method::POST,
            "docs",
            &link,
            &format!("{link}/docs"),
            &headers,
            Some(body),
        )
        .await
    }

    /// Deletes an item (if its ETag is still `if_match`, when given).
    /// Returns whether it was deleted; absent or changed is `false`.
    async fn delete_item(
        &self,
        key: &str,
        id: &str,
        run_id: &str,
        if_match: Option<&str>,
    ) -> Result<bool, StoreError> {
        let c = &self.shared.client;
        let link = format!("{}/docs/{id}", c.coll_link());
        let what = format!("deleting run {run_id:?} from {}", self.shared.display);
        let mut headers = vec![Self::pk_header(key)];
        if let Some(etag) = if_match {
            headers.push(("if-match", etag.to_string()));
        }
        let a = c
            .send(Method::DELETE, "docs", &link, &link, &headers, None)
            .await
            .map_err(|f| failure_error(f, &what, run_id, true))?;
        match a.status.as_u16() {
            204 => Ok(true),
            404 | 412 => Ok(false),
            _ => Err(answer_error(&a, &what, run_id, true)),
        }
    }

    /// How messages name a field of run `run_id`'s head item.
    fn head_place(&self, run_id: &str) -> impl Fn(&str) -> String + Sync {
        let at = format!(
            "{} run {run_id:?} item {}",
            self.shared.display,
            head_id(&encode_run_id(run_id))
        );
        move |field: &str| format!("{at}.{field}")
    }

    /// A run's summary from the fields of its head item.
    fn summary(&self, r: &Value) -> Result<RunSummary, StoreError> {
        let run_id = r.get("run_id").and_then(Value::as_str).unwrap_or_default();
        let locate = self.head_place(run_id);
        Fields::new(&Place::new(run_id, &locate), r).summary()
    }

    /// What a save needs to know of run `run_id` from its head item.
    fn acct_of(&self, run_id: &str, head: &Value) -> Result<Acct, StoreError> {
        let locate = self.head_place(run_id);
        let place = Place::new(run_id, &locate);
        let f = Fields::new(&place, head);
        Ok(Acct {
            version: f.count("version")?,
            etag: f.text("_etag")?.to_string(),
            next: f.index("next")?,
            snapshot_bytes: f.count("snapshot_bytes")?,
            delta_bytes: f.count("delta_bytes")?,
            carry: head.as_object().and_then(carry_of),
            gen: f.text("gen")?.to_string(),
            // Unknown (so written again) if the head does not read: a load
            // reports that damage.
            head_blobs: head
                .get("head")
                .and_then(Value::as_str)
                .and_then(|doc| steadfast_core::store::blob::head_refs_in(doc, &place, "head").ok())
                .unwrap_or_default()
                .into(),
        })
    }

    fn corrupt(&self, run_id: &str, item: &str, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            location: format!("{} run {run_id:?} item {item}", self.shared.display),
            reason: reason.to_string(),
        }
    }

    /// Writes `text` as chunk items of the run `key` under `tag`; returns
    /// how many.
    async fn write_chunks(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        tag: &str,
        text: &str,
        pace: &Pace,
    ) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut start = 0;
        while start < text.len() {
            let mut end = (start + CHUNK).min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let item = json!({ "id": chunk_id(key, tag, n), "pk": key, "gen": gen, "kind": "chunk", "data": &text[start..end] });
            self.upsert_item(key, run_id, item, "a chunk", pace).await?;
            n += 1;
            start = end;
        }
        Ok(n)
    }

    async fn read_chunks(
        &self,
        key: &str,
        run_id: &str,
        tag: &str,
        count: usize,
    ) -> Result<String, StoreError> {
        let mut text = String::new();
        for n in 0..count {
            let id = chunk_id(key, tag, n);
            let item = self
                .read_item(key, &id, run_id)
                .await?
                .ok_or_else(|| self.corrupt(run_id, &id, "a chunk the run refers to is missing"))?;
            let data = item
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| self.corrupt(run_id, &id, "a chunk without data"))?;
            text.push_str(data);
        }
        Ok(text)
    }

    /// Writes each of `blobs` that run `key`'s generation `gen` does not
    /// hold yet: its parts, under a tag of this write's, then its manifest
    /// (the tag, how many parts and bytes), so that a blob whose manifest is
    /// there is whole; looking costs a point read of the small manifest.
    /// Before the batch that refers to them: a crash between leaves only
    /// items nothing refers to, which a rewrite's sweep, the run's deletion
    /// or (for a create's own generation) `collect_leftovers` removes.
    /// `pace` keeps the id of each item written.
    async fn write_blobs(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        blobs: &[Blob],
        pace: &Pace,
    ) -> Result<(), StoreError> {
        for blob in blobs {
            let manifest = manifest_id(key, gen, &blob.hash);
            let held = self.read_item(key, &manifest, run_id).await?;
            let bytes = blob.text.len() as u64;
            if held.is_some_and(|h| h.get("bytes").and_then(Value::as_u64) == Some(bytes)) {
                continue;
            }
            let tag = format!("{:016x}", fastrand::u64(..));
            let parts = parts_of(&blob.text);
            for (n, part) in parts.iter().enumerate() {
                let id = blob_id(key, gen, &blob.hash, Some(&tag), n);
                let item = json!({
                    "id": id, "pk": key, "gen": gen,
                    "kind": "blob", "hash": blob.hash.hex(), "n": n, "data": part,
                });
                self.upsert_item(key, run_id, item, "a part of a large value", pace)
                    .await?;
            }
            let item = json!({
                "id": manifest, "pk": key, "gen": gen, "kind": "blob_manifest",
                "hash": blob.hash.hex(), "tag": tag, "parts": parts.len(), "bytes": bytes,
            });
            self.upsert_item(key, run_id, item, "a large value's manifest", pace)
                .await?;
        }
        Ok(())
    }

    /// Deletes items of run `run_id` that no head names (the blobs and
    /// chunks of a create that failed for sure: its batch failed whole,
    /// and the client never sends a write again after a lost answer, or it
    /// never sent its batch), in the order given (manifests before their
    /// parts); a failure only leaves them, for `collect_leftovers`, and is
    /// logged.
    async fn drop_items(&self, key: &str, run_id: &str, ids: &[String]) {
        if let (_, Some(e)) = self.delete_items(key, run_id, ids).await {
            tracing::warn!(run_id, error = %e, "items of a create that failed are left (nothing reads them; gc removes them)");
        }
    }

    /// Upserts one item of run `run_id` that nothing refers to yet (a
    /// chunk, a blob's part or manifest, before the batch that refers to
    /// it), in step with `pace`: its failure is definite.
    async fn upsert_item(
        &self,
        key: &str,
        run_id: &str,
        item: Value,
        what: &str,
        pace: &Pace,
    ) -> Result<(), StoreError> {
        pace.check(&self.shared.display, run_id)?;
        // Kept before it is sent: a write whose answer is lost may have
        // landed, and a create that fails deletes it all the same.
        pace.attempt(&item);
        let body = serde_json::to_vec(&item).unwrap_or_default();
        let what = format!(
            "writing {what} of run {run_id:?} to {}",
            self.shared.display
        );
        let a = self
            .post_docs(
                Some(key),
                vec![
                    ("content-type", "application/json".into()),
                    ("x-ms-documentdb-is-upsert", "True".into()),
                ],
                body,
            )
            .await
            .map_err(|f| failure_error(f, &what, run_id, false))?;
        if !matches!(a.status.as_u16(), 200 | 201) {
            let e = answer_error(&a, &what, run_id, false);
            return Err(match e.kind() {
                StoreErrorKind::OutcomeUnknown => StoreError::unavailable(e.to_string()),
                _ => e,
            });
        }
        pace.landed();
        Ok(())
    }

    /// The stored text of blob `hash` of run `key`'s generation `gen`
    /// (`None`: not there), which its reference says is `expect` bytes.
    async fn fetch_blob(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        hash: &BlobHash,
        expect: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let manifest = manifest_id(key, gen, hash);
        let Some(head) = self.read_item(key, &manifest, run_id).await? else {
            return Ok(None);
        };
        let num = |f: &str| head.get(f).and_then(Value::as_u64);
        let (Some(parts), Some(bytes)) = (num("parts"), num("bytes")) else {
            return Err(self.corrupt(run_id, &manifest, "a blob without its size"));
        };
        if bytes != expect {
            return Err(self.corrupt(
                run_id,
                &manifest,
                format!("blob {hash} holds {bytes} bytes where its reference says {expect}"),
            ));
        }
        if !parts_fit(parts, bytes) {
            return Err(self.corrupt(
                run_id,
                &manifest,
                format!("a blob of {bytes} bytes in {parts} parts, which cannot hold it"),
            ));
        }
        let tag = parts_tag(&head).map_err(|why| self.corrupt(run_id, &manifest, why))?;
        let mut out = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0));
        for n in 0..usize::try_from(parts).unwrap_or(usize::MAX) {
            let id = blob_id(key, gen, hash, tag, n);
            let item = self
                .read_item(key, &id, run_id)
                .await?
                .ok_or_else(|| self.corrupt(run_id, &id, "a part of a blob is missing"))?;
            let data = item
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| self.corrupt(run_id, &id, "a part of a blob without data"))?;
            if out.len() + data.len() > usize::try_from(expect).unwrap_or(usize::MAX) {
                return Err(self.corrupt(run_id, &id, "a blob longer than its size"));
            }
            out.extend_from_slice(data.as_bytes());
        }
        Ok(Some(out))
    }

    /// Puts back the large values of `objects` (a state, history updates),
    /// each blob read once.
    async fn resolve_all(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        objects: Vec<(&mut serde_json::Map<String, Value>, String)>,
        place: &Place<'_>,
    ) -> Result<(), StoreError> {
        let mut wanted: Vec<(BlobHash, u64)> = Vec::new();
        for (map, _) in &objects {
            for r in refs_of(map) {
                if !wanted.iter().any(|w| w.0 == r.0) {
                    wanted.push(r);
                }
            }
        }
        let mut got = std::collections::HashMap::new();
        for (hash, bytes) in wanted {
            let text = self.fetch_blob(key, gen, run_id, &hash, bytes).await?;
            got.insert(hash, text);
        }
        let mut fetch = |h: &BlobHash, _: u64| Ok(got.remove(h).flatten());
        let mut resolver = Resolver::new(&mut fetch);
        for (map, column) in objects {
            resolver.resolve(map, place, &column)?;
        }
        Ok(())
    }

    /// A text stored inline or in chunks: `(field, tag field, count field)`.
    async fn text_of(
        &self,
        key: &str,
        run_id: &str,
        item: &Value,
        field: &str,
        id: &str,
    ) -> Result<String, StoreError> {
        if let Some(t) = item.get(field).and_then(Value::as_str) {
            return Ok(t.to_string());
        }
        let tag = item
            .get(format!("{field}_chunks_tag"))
            .and_then(Value::as_str)
            .ok_or_else(|| self.corrupt(run_id, id, format!("no {field}")))?;
        let count = item
            .get(format!("{field}_chunks"))
            .and_then(Value::as_u64)
            .ok_or_else(|| self.corrupt(run_id, id, format!("no {field} chunk count")))?;
        self.read_chunks(key, run_id, tag, count as usize).await
    }

    /// Puts `text` into `item` under `field`, inline or (too large) in chunks
    /// written first.
    #[allow(clippy::too_many_arguments)]
    async fn put_text(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        item: &mut serde_json::Map<String, Value>,
        field: &str,
        text: String,
        pace: &Pace,
    ) -> Result<(), StoreError> {
        if text.len() <= INLINE_MAX {
            item.insert(field.to_string(), Value::String(text));
            return Ok(());
        }
        let tag = format!("{:016x}", fastrand::u64(..));
        let count = self
            .write_chunks(key, gen, run_id, &tag, &text, pace)
            .await?;
        item.insert(format!("{field}_chunks_tag"), json!(tag));
        item.insert(format!("{field}_chunks"), json!(count));
        Ok(())
    }

    async fn load_full(&self, run_id: &str) -> Result<Option<(Checkpoint, Acct)>, StoreError> {
        let key = encode_run_id(run_id);
        let hid = head_id(&key);
        let Some(head) = self.read_item(&key, &hid, run_id).await? else {
            return Ok(None);
        };
        let head_place = self.head_place(run_id);
        let place = Place::new(run_id, &head_place);
        let fields = Fields::new(&place, &head);
        let num = |f: &str| fields.count(f);
        let text = |f: &str| fields.text(f).map(str::to_string);
        let next = num("next")?;
        let snapshot_next = num("snapshot_next")?;
        let gen = text("gen")?;
        let snapshot = self.text_of(&key, run_id, &head, "snapshot", &hid).await?;
        // Where a field of this run is: its head item, or a step's item.
        let display = &self.shared.display;
        let locate = |column: &str| match column.strip_prefix("steps[") {
            Some(rest) => {
                let idx = rest
                    .split(']')
                    .next()
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(0);
                format!("{display} run {run_id:?} item {}", step_id(&key, &gen, idx))
            }
            None if column == "steps" => format!("{display} run {run_id:?} steps"),
            None => format!("{display} run {run_id:?} item {hid}"),
        };
        let place = Place::new(run_id, &locate);
        let mut deltas = Vec::new();
        if next > snapshot_next {
            let steps = self
                .query_partition(
                    &key,
                    run_id,
                    "SELECT * FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind = 'step' AND c.idx >= @a AND c.idx < @b",
                    json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}, {"name": "@a", "value": snapshot_next}, {"name": "@b", "value": next}]),
                )
                .await?;
            let mut steps: Vec<(i64, Value)> = steps
                .into_iter()
                .map(|s| (s.get("idx").and_then(Value::as_i64).unwrap_or(i64::MAX), s))
                .collect();
            steps.sort_by_key(|s| s.0);
            for (idx, item) in steps {
                let sid = step_id(&key, &gen, usize::try_from(idx).unwrap_or(usize::MAX));
                let text = self.text_of(&key, run_id, &item, "update", &sid).await?;
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| self.corrupt(run_id, &sid, "no name"))?;
                deltas.push(Ok((idx, name.to_string(), text)));
            }
        }
        let int = |f: &str| fields.int(f);
        let record = RecordRow {
            workflow: text("workflow")?,
            status: text("status")?,
            next: int("next")?,
            version: int("version")?,
            created_at: int("created_at")?,
            updated_at: int("updated_at")?,
            head: text("head")?,
            snapshot,
            snapshot_completed: text("snapshot_completed")?,
            snapshot_next: int("snapshot_next")?,
            snapshot_bytes: int("snapshot_bytes")?,
            delta_bytes: int("delta_bytes")?,
        };
        let (mut cp, _) = rebuild(&place, record, deltas)?;
        let hplace = Place::new(run_id, &head_place);
        self.resolve_all(
            &key,
            &gen,
            run_id,
            vec![(&mut cp.state, "state".to_string())],
            &hplace,
        )
        .await?;
        if cp.format == STORED_DECISIONS_FORMAT {
            let mut got = std::collections::HashMap::new();
            for (hash, bytes) in decision_refs(&cp) {
                let text = self.fetch_blob(&key, &gen, run_id, &hash, bytes).await?;
                got.insert(hash, text);
            }
            let mut fetch = |h: &BlobHash, _: u64| Ok(got.remove(h).flatten());
            Resolver::new(&mut fetch).resolve_decisions(&mut cp, &hplace)?;
        }
        Ok(Some((cp, self.acct_of(run_id, &head)?)))
    }

    /// Sends an atomic batch whose first operation writes run `run_id`'s
    /// head (guarded by its ETag, or a create) and the rest its items, and
    /// reads the answers: every operation applied, or a conflict (the head
    /// changed or went, or already exists), too large, or failed with
    /// nothing applied, or (answers that do not say) an unknown outcome.
    async fn head_batch(
        &self,
        key: &str,
        run_id: &str,
        expected: Option<u64>,
        ops: Vec<Value>,
    ) -> Result<Vec<Value>, StoreError> {
        let count = ops.len();
        let results = self.batch(key, run_id, ops).await?;
        let status = |i: usize| op_status(&results, i);
        let unknown = |why: String| StoreError::OutcomeUnknown {
            run_id: run_id.to_string(),
            source: why.into(),
        };
        if results.len() != count {
            let n = results.len();
            return Err(unknown(format!(
                "the batch answered {n} results for {count} operations"
            )));
        }
        // An atomic batch that failed answers 424 for the operations that
        // did not fail: the failing one says why, and nothing was applied.
        let applied = status(0) != 424;
        let failed = match applied {
            true => Some(status(0)),
            false => (0..count).map(status).find(|s| *s != 424),
        };
        let too_large = || StoreError::TooLarge {
            run_id: run_id.to_string(),
            what: "checkpoint item",
            size: 0,
            limit: 2 << 20,
        };
        match failed {
            Some(200 | 201) => {}
            Some(404 | 409 | 412) => {
                self.shared.accts.set(run_id, None);
                return Err(conflict(run_id, expected, None));
            }
            Some(413) => return Err(too_large()),
            Some(403) if !applied => return Err(too_large()),
            other if !applied => {
                return Err(StoreError::unavailable(format!(
                    "writing run {run_id:?} to {}: the batch failed with {other:?}; nothing was applied",
                    self.shared.display
                )))
            }
            // A status this store does not know, or none: it cannot tell
            // what happened.
            other => return Err(unknown(format!("the head's operation answered {other:?}"))),
        }
        // A delete answers 204 (no content).
        if let Some(s) = (1..count)
            .map(status)
            .find(|s| !matches!(s, 200 | 201 | 204))
        {
            // The head was written but not an item: on a service that rolls
            // batches back this cannot happen.
            return Err(unknown(format!("an item of the batch answered {s}")));
        }
        Ok(results)
    }

    /// Sends one transactional batch on a run's partition; returns the
    /// per-operation answers (the service answers 200 with statuses inside).
    async fn batch(
        &self,
        key: &str,
        run_id: &str,
        ops: Vec<Value>,
    ) -> Result<Vec<Value>, StoreError> {
        let what = format!("saving run {run_id:?} to {}", self.shared.display);
        let body = serde_json::to_vec(&ops).unwrap_or_default();
        let a = self
            .post_docs(
                Some(key),
                vec![
                    ("content-type", "application/json".into()),
                    ("x-ms-cosmos-is-batch-request", "True".into()),
                    ("x-ms-cosmos-batch-atomic", "True".into()),
                ],
                body,
            )
            .await
            .map_err(|f| failure_error(f, &what, run_id, true))?;
        if !matches!(a.status.as_u16(), 200 | 207) {
            return Err(answer_error(&a, &what, run_id, true));
        }
        match a.json() {
            Ok(Value::Array(results)) => Ok(results),
            _ => Err(StoreError::OutcomeUnknown {
                run_id: run_id.to_string(),
                source: format!("{what}: the batch's answer could not be read").into(),
            }),
        }
    }
}

/// The item that numbers run `key`'s event log: its generation and its last
/// number.
fn log_id(key: &str) -> String {
    format!("l~{key}")
}

/// Event `seq` of generation `lgen` of run `key`'s log.
fn event_id(key: &str, lgen: &str, seq: u64) -> String {
    format!("e~{key}~{lgen}~{seq:012}")
}

/// The most events one append writes on Cosmos DB: a transactional batch
/// takes 100 operations, one of which moves the log's number on.
pub const MAX_EVENTS_PER_BATCH: usize = SWEEP_BATCH - 1;

/// The most bytes of event values (their JSON text) one append writes: a
/// transactional batch's request is at most 2 MB, each value is kept as a
/// JSON string (escaping can double it), and each item carries its fields.
pub const MAX_EVENT_BATCH_BYTES: u64 = 800_000;

/// The most a batch of events may weigh as sent, values escaped.
const MAX_EVENT_BATCH_REQUEST: u64 = 1_900_000;

impl CosmosStore {
    /// Run `run_id`'s log item (its generation, last number and ETag), if
    /// it has one.
    async fn read_log(
        &self,
        key: &str,
        run_id: &str,
    ) -> Result<Option<(String, u64, String)>, StoreError> {
        let id = log_id(key);
        let Some(item) = self.read_item(key, &id, run_id).await? else {
            return Ok(None);
        };
        let field = |f: &str| item.get(f);
        match (
            field("lgen").and_then(Value::as_str),
            field("last").and_then(Value::as_u64),
            field("_etag").and_then(Value::as_str),
        ) {
            (Some(g), Some(last), Some(etag)) => Ok(Some((g.to_string(), last, etag.to_string()))),
            _ => Err(self.corrupt(
                run_id,
                &id,
                "the event log's item lacks its generation, last number or ETag",
            )),
        }
    }

    /// Deletes run `key`'s event log: its log item first, as it was read
    /// (the log is then empty, and a new one starts at 1 under another
    /// generation), then that generation's events, as far as it can (what
    /// is left is never read). A log a racing append created meanwhile is
    /// another generation, and left alone.
    async fn delete_log(&self, key: &str, run_id: &str) -> Result<(), StoreError> {
        let mut gone = None;
        for _ in 0..5 {
            let Some((lgen, _, etag)) = self.read_log(key, run_id).await? else {
                return Ok(());
            };
            if self
                .delete_item(key, &log_id(key), run_id, Some(&etag))
                .await?
            {
                gone = Some(lgen);
                break;
            }
        }
        let Some(lgen) = gone else {
            return Err(StoreError::unavailable(format!(
                "deleting the event log of run {run_id:?} from {}: it kept changing",
                self.shared.display
            )));
        };
        let items = self
            .query_partition(
                key,
                run_id,
                "SELECT c.id FROM c WHERE c.pk = @pk AND c.kind = 'event' AND c.lgen = @g",
                json!([{"name": "@pk", "value": key}, {"name": "@g", "value": lgen}]),
            )
            .await;
        match items {
            Ok(items) => {
                let ids = ids_of(&items);
                if let (_, Some(e)) = self.delete_items(key, run_id, &ids).await {
                    tracing::warn!(run_id, error = %e, "the run's events are deleted; some of their items are left until gc collects them (nothing reads them)");
                }
            }
            Err(e) => {
                tracing::warn!(run_id, error = %e, "the run's events are deleted; their items could not be listed for removal")
            }
        }
        Ok(())
    }
}

/// The partition of document `key`: `~d~` and the key encoded as a run id
/// is. No run shares it: an encoded run id's `~` is always followed by two
/// uppercase hex digits, never by `d`.
fn doc_partition(key: &str) -> String {
    format!("~d~{}", encode_run_id(key))
}

/// Each document is one item, `doc`, in a partition of its own; a write
/// replaces it under its ETag.
#[async_trait]
impl Documents for CosmosStore {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        let item = self.read_item(&doc_partition(key), "doc", key).await?;
        item.map(|v| self.document_of(key, &v).map(|(d, _)| d))
            .transpose()
    }

    async fn put_document(
        &self,
        key: &str,
        value: &Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        steadfast_core::store::check_document(key, value)?;
        // Kept as JSON text, so that numbers come back exact.
        let text = steadfast_core::store::encode_json(value, key, "document")?;
        let pk = doc_partition(key);
        let version = expected.map_or(1, |v| v + 1);
        let item = json!({
            "id": "doc", "pk": pk, "kind": "document", "key": key,
            "value": text, "version": version,
        });
        let body = serde_json::to_vec(&item).unwrap_or_default();
        let what = format!("writing document {key:?} to {}", self.shared.display);
        let conflict = |found: Option<u64>| StoreError::Conflict {
            run_id: key.to_string(),
            expected,
            found,
        };
        let a = match expected {
            None => self
                .post_docs(
                    Some(&pk),
                    vec![("content-type", "application/json".into())],
                    body,
                )
                .await
                .map_err(|f| failure_error(f, &what, key, true))?,
            Some(v) => {
                let Some(stored) = self.read_item(&pk, "doc", key).await? else {
                    return Err(conflict(None));
                };
                let (doc, etag) = self.document_of(key, &stored)?;
                if doc.version != v {
                    return Err(conflict(Some(doc.version)));
                }
                let c = &self.shared.client;
                let link = format!("{}/docs/doc", c.coll_link());
                c.send(
                    Method::PUT,
                    "docs",
                    &link,
                    &link,
                    &[
                        Self::pk_header(&pk),
                        ("content-type", "application/json".into()),
                        ("if-match", etag),
                    ],
                    Some(body),
                )
                .await
                .map_err(|f| failure_error(f, &what, key, true))?
            }
        };
        match a.status.as_u16() {
            200 | 201 => Ok(version),
            409 | 412 => {
                let found = self
                    .get_document(key)
                    .await
                    .ok()
                    .flatten()
                    .map(|d| d.version);
                Err(conflict(found))
            }
            _ => Err(answer_error(&a, &what, key, true)),
        }
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        let items = self
            .query(
                None,
                prefix,
                // Filtered by the server, so that a listing of a few keys
                // does not read every document of the container.
                "SELECT * FROM c WHERE c.kind = 'document' AND STARTSWITH(c.key, @prefix)",
                json!([{"name": "@prefix", "value": prefix}]),
            )
            .await?;
        let mut out = Vec::new();
        for item in &items {
            let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
            if key.starts_with(prefix) {
                out.push(self.document_of(key, item)?.0);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        let pk = doc_partition(key);
        let Some(stored) = self.read_item(&pk, "doc", key).await? else {
            return Ok(false);
        };
        let (doc, etag) = self.document_of(key, &stored)?;
        if doc.version != expected {
            return Ok(false);
        }
        self.delete_item(&pk, "doc", key, Some(&etag)).await
    }
}

impl CosmosStore {
    /// A document item read back, with its ETag: a key, value or version
    /// that a write would not have made is corrupt.
    fn document_of(&self, key: &str, item: &Value) -> Result<(Document, String), StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            location: format!("{} document {key:?}", self.shared.display),
            reason,
        };
        if item.get("key").and_then(Value::as_str) != Some(key) {
            return Err(corrupt("the item names another key".into()));
        }
        let text = item
            .get("value")
            .and_then(Value::as_str)
            .ok_or_else(|| corrupt("no value text".into()))?;
        let version = item.get("version").and_then(Value::as_u64).unwrap_or(0);
        let doc = steadfast_core::store::decode_document(key, text, version, &self.shared.display)?;
        let etag = item
            .get("_etag")
            .and_then(Value::as_str)
            .ok_or_else(|| corrupt("no ETag".into()))?
            .to_string();
        Ok((doc, etag))
    }
}

/// Each append is one transactional batch in the run's partition: the log
/// item moved on (created, or replaced under its ETag) and one item per
/// event, so an append is written whole or not at all, and two racing
/// appends cannot take the same numbers (the loser's batch fails on the
/// ETag and is tried again). An append takes at most 99 events and 800 KB
/// of values ([`Events::append_bounds`]). Values are kept as JSON text, so
/// that numbers come back exactly as they went in.
#[async_trait]
impl Events for CosmosStore {
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        let texts = steadfast_core::store::check_events(run_id, events)?;
        let bytes: u64 = texts.iter().map(|t| t.len() as u64).sum();
        let sent: u64 = texts
            .iter()
            .map(|t| serde_json::to_string(t).map_or(u64::MAX, |s| s.len() as u64))
            .fold(0, u64::saturating_add);
        if events.len() > MAX_EVENTS_PER_BATCH
            || bytes > MAX_EVENT_BATCH_BYTES
            || sent > MAX_EVENT_BATCH_REQUEST
        {
            return Err(StoreError::InvalidInput(format!(
                "run {run_id:?}: an append to a Cosmos DB store takes at most {MAX_EVENTS_PER_BATCH} events and {MAX_EVENT_BATCH_BYTES} bytes of values, not {} and {bytes}; nothing was written",
                events.len()
            )));
        }
        let key = encode_run_id(run_id);
        let pk = format!("[\"{key}\"]");
        let mut last_error = None;
        for attempt in 0..64u32 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(
                    1..=(2 + u64::from(attempt.min(6)) * 5),
                )))
                .await;
            }
            let read = match self.read_log(&key, run_id).await {
                Ok(read) => read,
                // A read is safe to try again.
                Err(e) if e.kind() == StoreErrorKind::Unavailable => {
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let (lgen, last, log_op) = match read {
                Some((lgen, last, etag)) => {
                    let body = json!({"id": log_id(&key), "pk": key, "kind": "evlog", "run_id": run_id, "lgen": lgen, "last": last + events.len() as u64});
                    let op = json!({"operationType": "Replace", "id": log_id(&key), "partitionKey": pk, "ifMatch": etag, "resourceBody": body});
                    (lgen, last, op)
                }
                None => {
                    let lgen = format!("{:016x}", fastrand::u64(..));
                    let body = json!({"id": log_id(&key), "pk": key, "kind": "evlog", "run_id": run_id, "lgen": lgen, "last": events.len() as u64});
                    let op = json!({"operationType": "Create", "partitionKey": pk, "resourceBody": body});
                    (lgen, 0, op)
                }
            };
            let mut ops = vec![log_op];
            for (i, e) in events.iter().enumerate() {
                let seq = last + 1 + i as u64;
                ops.push(
                    json!({"operationType": "Create", "partitionKey": pk, "resourceBody": {
                        "id": event_id(&key, &lgen, seq), "pk": key, "kind": "event", "lgen": lgen,
                        "seq": seq, "step": e.step, "attempt": e.attempt, "at": e.at.unix_millis(),
                        // As JSON text: Cosmos keeps numbers as doubles.
                        "text": texts[i], "first": e.first,
                    }}),
                );
            }
            match self.head_batch(&key, run_id, None, ops).await {
                Ok(_) => return Ok(last + events.len() as u64),
                Err(e) if e.kind() == StoreErrorKind::Conflict => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::unavailable(format!(
            "appending events to run {run_id:?} in {}: other appends kept taking the numbers first ({})",
            self.shared.display,
            last_error.map(|e| e.to_string()).unwrap_or_default()
        )))
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let key = encode_run_id(run_id);
        let Some((lgen, last, _)) = self.read_log(&key, run_id).await? else {
            return Ok(Vec::new());
        };
        let upto = last.min(after.saturating_add(limit as u64));
        if upto <= after {
            return Ok(Vec::new());
        }
        let items = self
            .query_partition(
                &key,
                run_id,
                "SELECT * FROM c WHERE c.pk = @pk AND c.kind = 'event' AND c.lgen = @g AND c.seq > @a AND c.seq <= @b",
                json!([{"name": "@pk", "value": key}, {"name": "@g", "value": lgen}, {"name": "@a", "value": after}, {"name": "@b", "value": upto}]),
            )
            .await?;
        let mut out = Vec::with_capacity(items.len());
        for item in &items {
            let id = item.get("id").and_then(Value::as_str).unwrap_or("an event");
            let bad = |what: &str| {
                self.corrupt(
                    run_id,
                    id,
                    format!("the event's {what} is missing or not valid"),
                )
            };
            let seq = item
                .get("seq")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad("seq"))?;
            let step = item
                .get("step")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("step"))?;
            let attempt = item
                .get("attempt")
                .and_then(Value::as_u64)
                .and_then(|a| u32::try_from(a).ok())
                .ok_or_else(|| bad("attempt"))?;
            let at = item
                .get("at")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad("time"))?;
            let value: Value = item
                .get("text")
                .and_then(Value::as_str)
                .and_then(|t| serde_json::from_str(t).ok())
                .ok_or_else(|| bad("value"))?;
            let first = item.get("first").and_then(Value::as_bool).unwrap_or(false);
            let mut e = NewEvent::new(step, attempt, Timestamp::from_unix_millis(at), value);
            e.first = first;
            // What the store would refuse to append is refused on the way
            // out too: a changed item is corrupt, not passed on.
            steadfast_core::store::check_events(run_id, std::slice::from_ref(&e))
                .map_err(|err| self.corrupt(run_id, id, err))?;
            out.push(e.numbered(seq));
        }
        out.sort_by_key(|e| e.seq);
        // Every number from `after` up to the log's last: an append is one
        // atomic batch in the partition the log item was read from, so a
        // missing one is damage, not lag.
        if out.iter().zip(after + 1..).any(|(e, want)| e.seq != want)
            || out.len() as u64 != upto - after
        {
            return Err(self.corrupt(
                run_id,
                &log_id(&key),
                format!(
                    "events {} to {upto} are not all there, once each",
                    after + 1
                ),
            ));
        }
        Ok(out)
    }

    fn append_bounds(&self) -> (usize, u64) {
        (MAX_EVENTS_PER_BATCH, MAX_EVENT_BATCH_BYTES)
    }
}

/// The status code a batch answered for operation `i` (0 if none).
fn op_status(results: &[Value], i: usize) -> u64 {
    results
        .get(i)
        .and_then(|r| r.get("statusCode"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The ids of the chunk items an item's `update` was written to, if any.
fn chunk_ids_of(key: &str, item: &serde_json::Map<String, Value>) -> Vec<String> {
    field_chunk_ids(key, item, "update")
}

/// The ids of the chunk items an item's text `field` was written to, if any.
fn field_chunk_ids(key: &str, item: &serde_json::Map<String, Value>, field: &str) -> Vec<String> {
    match (
        item.get(&format!("{field}_chunks_tag"))
            .and_then(Value::as_str),
        item.get(&format!("{field}_chunks")).and_then(Value::as_u64),
    ) {
        (Some(tag), Some(n)) => (0..n as usize).map(|i| chunk_id(key, tag, i)).collect(),
        _ => Vec::new(),
    }
}

/// A blob's text in the parts its items hold: at most [`CHUNK`] bytes each,
/// cut on character boundaries.
fn parts_of(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + CHUNK).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        parts.push(&text[start..end]);
        start = end;
    }
    parts
}

fn step_item(key: &str, gen: &str, step: &StepRecord) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("gen".into(), json!(gen));
    m.insert("id".into(), json!(step_id(key, gen, step.index)));
    m.insert("pk".into(), json!(key));
    m.insert("kind".into(), json!("step"));
    m.insert("idx".into(), json!(step.index));
    m.insert("name".into(), json!(step.name));
    m.insert("attempt".into(), json!(step.attempt));
    m.insert("started_at".into(), json!(step.started_at.unix_millis()));
    m.insert("finished_at".into(), json!(step.finished_at.unix_millis()));
    m
}

impl CosmosStore {
    /// Deletes a run, at version `expected` when given.
    async fn delete_at(&self, run_id: &str, expected: Option<u64>) -> Result<bool, StoreError> {
        let key = encode_run_id(run_id);

        self.shared.accts.set(run_id, None);
        let hid = head_id(&key);
        // The head first, as it was read (If-Match): once it is gone the run
        // is absent. A head that changed meanwhile is read again.
        let mut gen = None;
        for _ in 0..5 {
            let Some(head) = self.read_item(&key, &hid, run_id).await? else {
                if expected.is_none() {
                    // A log left by a step that wrote after its run was
                    // deleted goes too.
                    self.delete_log(&key, run_id).await?;
                }
                return Ok(false);
            };
            let etag = head
                .get("_etag")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some(expected) = expected {
                expect_version(
                    run_id,
                    expected,
                    head.get("version").and_then(Value::as_u64),
                )?;
            }
            if self.delete_item(&key, &hid, run_id, Some(etag)).await? {
                gen = head.get("gen").and_then(Value::as_str).map(str::to_string);
                break;
            }
        }
        let Some(gen) = gen else {
            return Err(StoreError::unavailable(format!(
                "deleting run {run_id:?} from {}: its head kept changing",
                self.shared.display
            )));
        };
        // Its event log: the log item first, so the log reads empty. A log
        // left behind would be read by a run created again under the id:
        // say so (deleting again removes it).
        self.delete_log(&key, run_id).await.map_err(|e| {
            StoreError::unavailable(format!(
                "run {run_id:?} was deleted, but not its event log ({e}); delete it again"
            ))
        })?;
        // Then this generation's other items. What is left of them after a
        // failure here is never read (a run created again gets a new
        // generation), so the delete stands and the failure is only logged.
        let rest = self
            .query_partition(
                &key,
                run_id,
                "SELECT c.id FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind != 'head'",
                json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}]),
            )
            .await;
        let ids = match rest {
            Ok(items) => ids_of(&items),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "the run is deleted; its history could not be listed for removal");
                Vec::new()
            }
        };
        if let (_, Some(e)) = self.delete_items(&key, run_id, &ids).await {
            tracing::warn!(run_id, error = %e, "the run is deleted; some of its items are left until gc collects them (nothing reads them)");
        }
        Ok(true)
    }
}

impl CosmosStore {
    /// [`Store::save`] once the pace of a create's writes is set.
    async fn save_paced(&self, req: SaveRequest<'_>, pace: &Pace) -> Result<u64, StoreError> {
        let cp = req.checkpoint;
        check_head(cp)?;
        let run_id = cp.run_id.as_str();
        if req.head_only && req.expected.is_none() {
            return Err(head_only_of_absent(run_id));
        }
        let key = encode_run_id(run_id);
        let limit = self.shared.opts.max_state_bytes;
        // The stored head's ETag and bookkeeping, for the expected version.
        let mut acct =
            self.shared.accts.get(run_id).filter(|a| {
                Some(a.version) == req.expected && !a.etag.is_empty() && !a.gen.is_empty()
            });
        let mut stored_head: Option<Value> = None;
        if req.expected.is_some() && (acct.is_none() || req.head_only) {
            let hid = head_id(&key);
            let head = self.read_item(&key, &hid, run_id).await?;
            let found = head.as_ref().and_then(|h| h.get("version"));
            if let Some(expected) = req.expected {
                expect_version(run_id, expected, found.and_then(Value::as_u64))?;
            }
            if let Some(h) = &head {
                acct = Some(self.acct_of(run_id, h)?);
            }
            stored_head = head;
        }
        let gen = match (&req.expected, &acct) {
            (None, _) => format!("{:016x}", fastrand::u64(..)),
            (Some(_), Some(a)) if !a.gen.is_empty() && !a.etag.is_empty() => a.gen.clone(),
            (Some(_), _) => {
                let reason = "the head has no generation or ETag";
                return Err(self.corrupt(run_id, &head_id(&key), reason));
            }
        };
        let mut head = serde_json::Map::new();
        head.insert("id".into(), json!(head_id(&key)));
        head.insert("gen".into(), json!(gen));
        head.insert("pk".into(), json!(key));
        head.insert("kind".into(), json!("head"));
        head.insert("run_id".into(), json!(run_id));
        head.insert("workflow".into(), json!(cp.workflow));
        head.insert("status".into(), json!(cp.status.as_str()));
        head.insert("version".into(), json!(req.new_version()));
        head.insert("created_at".into(), json!(cp.created_at.unix_millis()));
        head.insert("updated_at".into(), json!(cp.updated_at.unix_millis()));
        // A decision's large data is a blob, written with the state's.
        let mut head_blobs = Vec::new();
        let doc = encode_head_with_blobs(cp, self.shared.opts.blob_threshold, &mut head_blobs)?;
        if doc.len() > MAX_HEAD_DOC {
            return Err(StoreError::TooLarge {
                run_id: run_id.to_string(),
                what: "head (lease, wait, decisions)",
                size: doc.len() as u64,
                limit: MAX_HEAD_DOC as u64,
            });
        }
        head.insert("head".into(), json!(doc));
        head.insert(
            "wake_at".into(),
            json!(cp.runnable_at().map(|t| t.unix_millis())),
        );
        let mut step_ops = Vec::new();
        let (snapshot_bytes, delta_bytes, next);
        let known = acct
            .as_ref()
            .filter(|a| !a.etag.is_empty())
            .map(|a| Known::new(a.version, a.next, a.snapshot_bytes, a.delta_bytes));
        let (plan, mut blobs) =
            plan_save_with_blobs(&req, known.as_ref(), limit, self.shared.opts.blob_threshold)?;
        // What the stored head refers to is stored: a decision carried again
        // costs no read of its manifest.
        let head_hashes: Arc<[BlobHash]> = head_blobs.iter().map(|b| b.hash).collect();
        let stored = match (&acct, req.expected) {
            (Some(a), Some(v)) if a.version == v && !a.etag.is_empty() => &a.head_blobs[..],
            _ => &[],
        };
        steadfast_core::store::blob::add_head_blobs(&mut blobs, head_blobs, stored);
        self.write_blobs(&key, &gen, run_id, &blobs, pace).await?;
        // A new snapshot below the stored `next` (a rewind; a changed
        // workflow accepted, or a durable function that took another path,
        // which the engine saves the same way) leaves the rows above it
        // unread: once it is written, the blobs no record refers to any
        // more are freed. Rare, and it reads the run's history once more.
        let rewound = matches!(plan, Plan::Snapshot { .. })
            && req.expected.is_some()
            && acct.as_ref().is_some_and(|a| cp.next < a.next);
        match plan {
            Plan::Head => {
                // Keep the stored state, steps and snapshot as they are.
                let stored = stored_head.ok_or_else(|| conflict(run_id, req.expected, None))?;
                for f in [
                    "next",
                    "snapshot",
                    "snapshot_chunks",
                    "snapshot_chunks_tag",
                    "snapshot_completed",
                    "snapshot_next",
                    "snapshot_bytes",
                    "delta_bytes",
                ] {
                    if let Some(v) = stored.get(f) {
                        head.insert(f.into(), v.clone());
                    }
                }
                let n = |f: &str| stored.get(f).and_then(Value::as_u64).unwrap_or(0);
                snapshot_bytes = n("snapshot_bytes");
                delta_bytes = n("delta_bytes");
                next = usize::try_from(n("next")).unwrap_or(usize::MAX);
            }
            Plan::Delta { step } => {
                next = cp.next;
                let a = acct
                    .clone()
                    .ok_or_else(|| conflict(run_id, req.expected, None))?;
                // The snapshot stays; it is not in this head item unless it
                // was read: the replace must carry it.
                let carry = match (stored_head.as_ref(), &a.carry) {
                    (Some(h), _) => h.as_object().and_then(carry_of),
                    (None, Some(c)) => Some(Arc::clone(c)),
                    (None, None) => None,
                };
                let carry = match carry {
                    Some(c) => (*c).clone(),
                    None => {
                        let hid = head_id(&key);
                        let h = self
                            .read_item(&key, &hid, run_id)
                            .await?
                            .unwrap_or(Value::Null);
                        SNAPSHOT_FIELDS
                            .iter()
                            .filter_map(|f| h.get(*f).map(|v| (f.to_string(), v.clone())))
                            .collect()
                    }
                };
                head.extend(carry);
                snapshot_bytes = a.snapshot_bytes;
                delta_bytes = a.delta_bytes + step.update.len() as u64;
                if let Some(s) = req.step {
                    let mut item = step_item(&key, &gen, s);
                    self.put_text(&key, &gen, run_id, &mut item, "update", step.update, pace)
                        .await?;
                    step_ops.push(item);
                }
            }
            Plan::Snapshot {
                state,
                completed,
                step,
            } => {
                next = cp.next;
                snapshot_bytes = state.len() as u64;
                delta_bytes = 0;
                head.insert("snapshot_completed".into(), json!(completed));
                head.insert("snapshot_next".into(), json!(cp.next));
                self.put_text(&key, &gen, run_id, &mut head, "snapshot", state, pace)
                    .await?;
                if let (Some(s), Some(row)) = (req.step, step) {
                    let mut item = step_item(&key, &gen, s);
                    self.put_text(&key, &gen, run_id, &mut item, "update", row.update, pace)
                        .await?;
                    step_ops.push(item);
                }
            }
        }
        head.insert("next".into(), json!(next));
        head.insert("snapshot_bytes".into(), json!(snapshot_bytes));
        head.insert("delta_bytes".into(), json!(delta_bytes));
        let carry = carry_of(&head);
        let pk = format!("[\"{key}\"]");
        let written = rewound.then(|| Value::Object(head.clone()));
        let head_op = match (&req.expected, &acct) {
            (None, _) => {
                json!({ "operationType": "Create", "partitionKey": pk, "resourceBody": Value::Object(head) })
            }
            (Some(_), Some(a)) => json!({
                "operationType": "Replace", "id": head_id(&key), "partitionKey": pk,
                "ifMatch": a.etag, "resourceBody": Value::Object(head)
            }),
            (Some(_), None) => return Err(conflict(run_id, req.expected, None)),
        };
        // A create that wrote items of its own generation sends its batch
        // within its window, or never: past it, `collect_leftovers` may
        // already take that generation for one whose create died.
        if pace.wrote_any() {
            pace.check(&self.shared.display, run_id)?;
        }
        // The head first: a conflicting batch then changes nothing, even on
        // a server that does not roll back the operations before a failure.
        let mut ops = vec![head_op];
        for item in step_ops {
            ops.push(json!({ "operationType": "Upsert", "partitionKey": pk, "resourceBody": Value::Object(item) }));
        }
        // A definite failure of a create's batch drops what it wrote
        // (`save`).
        let results = self.head_batch(&key, run_id, req.expected, ops).await?;
        let etag = results
            .first()
            .and_then(|r| r.get("eTag"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if etag.is_empty() {
            // Without the new ETag, the next save reads the head first.
            self.shared.accts.set(run_id, None);
            return Ok(req.new_version());
        }
        if let Some(body) = &written {
            let hid = head_id(&key);
            let fence = Fence {
                hid: &hid,
                pk: &pk,
                body,
                expected: req.new_version(),
            };
            // The save has landed whatever the sweep does: leaving blobs is
            // safe, so a failure is only logged. A sweep that wrote (each of
            // its batches replaces the head) leaves an ETag this process
            // does not keep: the next save reads the head first.
            match self
                .sweep_blobs(&key, &gen, run_id, body, fence, etag.clone())
                .await
            {
                Ok(0) => {}
                Ok(n) => {
                    tracing::debug!(
                        run_id,
                        blobs = n,
                        "a save below the stored next freed blobs no row refers to"
                    );
                    self.shared.accts.set(run_id, None);
                    return Ok(req.new_version());
                }
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "blobs the run no longer refers to are left until a later rewrite of its history or its deletion");
                    self.shared.accts.set(run_id, None);
                    return Ok(req.new_version());
                }
            }
        }
        let new = Acct {
            version: req.new_version(),
            etag,
            next,
            snapshot_bytes,
            delta_bytes,
            carry,
            gen,
            head_blobs: head_hashes,
        };
        self.shared.accts.after_save(cp, &Ok::<_, ()>(new));
        Ok(req.new_version())
    }
}

#[async_trait]
impl Store for CosmosStore {
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .history(self)
            .schedule(self)
            .events(self)
            .documents(self)
            .max_state_bytes(self.shared.opts.max_state_bytes)
            .blobs(self)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let loaded = settled(|| self.load_full(run_id), || self.head_etag(run_id)).await?;
        self.shared
            .accts
            .set(run_id, loaded.as_ref().map(|l| l.1.clone()));
        Ok(loaded.map(|l| l.0))
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        // A create writes under a generation of its own before its batch,
        // each write within the window of the one before (or of the
        // save's start), and the batch within the window of the last.
        let create = req.expected.is_none();
        let pace = Pace::new(create.then_some(self.shared.opts.create_window));
        let run_id = req.checkpoint.run_id.as_str();
        let saved = self.save_paced(req, &pace).await;
        // A create that failed for sure (its batch is atomic: a definite
        // failure applied nothing) leaves items no head will ever name:
        // deleted again, the last written first (a manifest before its
        // parts). Only an unknown outcome may have landed.
        if let Err(e) = &saved {
            if create && e.kind() != StoreErrorKind::OutcomeUnknown {
                let written = pace.written();
                if !written.is_empty() {
                    self.drop_items(&encode_run_id(run_id), run_id, &written)
                        .await;
                }
            }
        }
        saved
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        let mut query = String::from(
            "SELECT c.run_id, c.workflow, c.status, c.next, c.version, c.created_at, c.updated_at, c.head FROM c WHERE c.kind = 'head'",
        );
        let mut params = Vec::new();
        if let Some(s) = filter.status {
            query.push_str(" AND c.status = @status");
            params.push(json!({"name": "@status", "value": s.as_str()}));
        }
        if let Some(w) = &filter.workflow {
            query.push_str(" AND c.workflow = @workflow");
            params.push(json!({"name": "@workflow", "value": w}));
        }
        if let Some(t) = filter.updated_before {
            query.push_str(" AND c.updated_at < @before");
            params.push(json!({"name": "@before", "value": t.unix_millis()}));
        }
        let rows = self.query(None, "", &query, Value::Array(params)).await?;
        let mut out = Vec::new();
        for r in rows {
            let summary = self.summary(&r)?;
            let mut cp = Checkpoint::new(
                summary.run_id.as_str(),
                summary.workflow.as_str(),
                summary.created_at,
            );
            cp.status = summary.status;
            cp.updated_at = summary.updated_at;
            if filter.matches(&cp) {
                out.push(summary);
            }
        }
        // Byte order of run ids, whatever order the service sorts strings in.
        out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        out.dedup_by(|a, b| a.run_id == b.run_id);
        if let Some(n) = filter.limit {
            out.truncate(n);
        }
        Ok(out)
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.delete_at(run_id, None).await
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.delete_at(run_id, Some(version)).await
    }
}

#[async_trait]
impl Schedule for CosmosStore {
    /// Due runs by the heads' `wake_at`, in one cross-partition query (no
    /// reservation: the lease the run loop claims decides who runs a run).
    async fn claim_due(&self, due: &DueRequest<'_>) -> Result<Vec<RunSummary>, StoreError> {
        let rows = self
            .query(
                None,
                "",
                "SELECT c.run_id, c.workflow, c.status, c.next, c.version, c.created_at, c.updated_at, c.head, c.wake_at \
                 FROM c WHERE c.kind = 'head' AND c.wake_at <= @now AND ARRAY_CONTAINS(@workflows, c.workflow)",
                json!([
                    {"name": "@now", "value": due.now.unix_millis()},
                    {"name": "@workflows", "value": due.workflows},
                ]),
            )
            .await?;
        let mut found: Vec<(Timestamp, RunSummary)> = Vec::new();
        for r in rows {
            let workflow = r
                .get("workflow")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let run_id = r.get("run_id").and_then(Value::as_str).unwrap_or_default();
            if !due.workflows.contains(&workflow) || due.skip.contains(&run_id) {
                continue;
            }
            let at = r.get("wake_at").and_then(Value::as_u64).unwrap_or(0);
            found.push((Timestamp::from_unix_millis(at), self.summary(&r)?));
        }
        Ok(steadfast_core::store::claim_order(found, due.limit))
    }
}

/// How many times a read that met a missing item is made again.
const READ_AGAIN: usize = 2;

/// Runs `read` again (up to [`READ_AGAIN`] times) when it finds the run
/// damaged and the run's head has changed since: a read is not one
/// snapshot, so a prune that freed a blob, or a rewrite that removed an old
/// chunk, between the read of a head or row and the read of what it
/// referred to looks like a missing item, and the next read starts from
/// the head the prune wrote. `head` gives the head's ETag now; the first
/// failure is always read again, a later one only when the ETag moved
/// since the failure before. Damage that stays is reported as found.
async fn settled<T, F, Fut, H, HFut>(read: F, head: H) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
    H: Fn() -> HFut,
    HFut: std::future::Future<Output = Option<String>>,
{
    let mut again = 0;
    let mut seen: Option<Option<String>> = None;
    loop {
        match read().await {
            Err(e) if e.kind() == StoreErrorKind::Corrupt && again < READ_AGAIN => {
                let now = head().await;
                if seen.as_ref().is_some_and(|before| *before == now) {
                    return Err(e);
                }
                seen = Some(now);
                again += 1;
            }
            other => return other,
        }
    }
}

impl CosmosStore {
    /// The ETag of run `run_id`'s head now (`None`: gone or unreadable).
    async fn head_etag(&self, run_id: &str) -> Option<String> {
        let key = encode_run_id(run_id);
        let head = self.read_item(&key, &head_id(&key), run_id).await.ok()??;
        head.get("_etag")
            .and_then(Value::as_str)
            .map(str::to_string)
    }
}

#[async_trait]
impl History for CosmosStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        settled(|| self.history_once(run_id), || self.head_etag(run_id)).await
    }

    /// Replaces history items' updates (and, for a fold, deletes the items
    /// below the one replaced), guarded by the run's version: transactional
    /// batches that each replace the head as last seen (`If-Match`) and up to
    /// 90 step items. A fold's row is marked `folded`, so that the items
    /// below it are no longer history from the moment it is written; they
    /// are deleted after it.
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let (records, fold) = (rewrite.records(), rewrite.is_fold());
        let key = encode_run_id(run_id);
        let hid = head_id(&key);
        let Some(head) = self.read_item(&key, &hid, run_id).await? else {
            return Err(conflict(run_id, Some(expected), None));
        };
        expect_version(
            run_id,
            expected,
            head.get("version").and_then(Value::as_u64),
        )?;
        let head_place = self.head_place(run_id);
        let place = Place::new(run_id, &head_place);
        let fields = Fields::new(&place, &head);
        let snapshot_next = fields.index("snapshot_next")?;
        let gen = fields.text("gen")?.to_string();
        let etag = fields.text("_etag")?.to_string();
        // Steps from the snapshot on are merged into the state by a load.
        if let Some(r) = records.iter().find(|r| r.index >= snapshot_next) {
            return Err(still_merged(run_id, r.index as u64, snapshot_next as u64));
        }
        let pk = format!("[\"{key}\"]");
        let mut body = head.as_object().cloned().unwrap_or_default();
        body.retain(|k, _| !k.starts_with('_'));
        let head_body = Value::Object(body);
        // The replaced rows, in batches of at most 90 items and about 1.5 MB,
        // each led by the head as last seen (If-Match): a run saved
        // meanwhile stops the rewrite there.
        let mut groups: Vec<Vec<Value>> = vec![Vec::new()];
        let mut bytes = 0usize;
        // Chunk items the replaced and deleted rows leave unreferenced.
        let mut stale: Vec<String> = Vec::new();
        for r in records {
            let sid = step_id(&key, &gen, r.index);
            let Some(item) = self.read_item(&key, &sid, run_id).await? else {
                if fold {
                    return Err(no_row_to_fold(run_id, r.index as u64));
                }
                continue;
            };
            let mut item = item.as_object().cloned().unwrap_or_default();
            item.retain(|k, _| !k.starts_with('_'));
            stale.extend(chunk_ids_of(&key, &item));
            for f in ["update", "update_chunks", "update_chunks_tag"] {
                item.remove(f);
            }
            let mut blobs = Vec::new();
            let text = steadfast_core::store::blob::encode_object(
                &r.update,
                self.shared.opts.blob_threshold,
                run_id,
                "step's update",
                &mut blobs,
            )?;
            // The run's own generation, named by its head: no window.
            let unpaced = Pace::new(None);
            let pace = &unpaced;
            self.write_blobs(&key, &gen, run_id, &blobs, pace).await?;
            let size = text.len().min(INLINE_MAX) + 512;
            self.put_text(&key, &gen, run_id, &mut item, "update", text, pace)
                .await?;
            if fold {
                item.insert("folded".into(), json!(true));
            }
            let last = groups.last_mut().expect("a group");
            if !last.is_empty() && (last.len() >= 90 || bytes + size > 1_500_000) {
                groups.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            groups.last_mut().expect("a group").push(json!({
                "operationType": "Replace", "id": sid, "partitionKey": pk,
                "resourceBody": Value::Object(item)
            }));
        }
        self.shared.accts.set(run_id, None);
        let mut etag = etag;
        for rows in groups {
            let mut ops = vec![json!({
                "operationType": "Replace", "id": hid, "partitionKey": pk,
                "ifMatch": etag, "resourceBody": head_body.clone()
            })];
            ops.extend(rows);
            let results = self.head_batch(&key, run_id, Some(expected), ops).await?;
            etag = match results[0].get("eTag").and_then(Value::as_str) {
                Some(e) => e.to_string(),
                None => match self.read_item(&key, &hid, run_id).await? {
                    Some(h) if h.get("version").and_then(Value::as_u64) == Some(expected) => h
                        .get("_etag")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    _ => return Err(conflict(run_id, Some(expected), None)),
                },
            };
        }
        // The rows below a fold go last. The fold row is marked, so those
        // not deleted yet (a failure here) are no longer history; deleting
        // them only frees space.
        if let (true, Some(f)) = (fold, records.first()) {
            let below = self
                .query_partition(
                    &key,
                    run_id,
                    "SELECT c.id, c.update_chunks, c.update_chunks_tag FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind = 'step' AND c.idx < @b",
                    json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}, {"name": "@b", "value": f.index}]),
                )
                .await;
            let ids: Vec<String> = match below {
                Ok(items) => items
                    .iter()
                    .flat_map(|i| {
                        let chunks = i
                            .as_object()
                            .map(|m| chunk_ids_of(&key, m))
                            .unwrap_or_default();
                        i.get("id")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .into_iter()
                            .chain(chunks)
                    })
                    .collect(),
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "the history is folded; the rows below the fold could not be listed for removal");
                    Vec::new()
                }
            };
            if let (_, Some(e)) = self.delete_items(&key, run_id, &ids).await {
                tracing::warn!(run_id, error = %e, "the history is folded; some rows below the fold are left (they are not read)");
            }
        }
        // The old chunks of replaced rows: never read again, so a failure
        // to remove them is only logged.
        for id in stale {
            if let Err(e) = self.delete_item(&key, &id, run_id, None).await {
                tracing::warn!(run_id, item = %id, error = %e, "an old chunk of a rewritten row could not be removed");
            }
        }
        // Blobs that only replaced, folded or rewound rows held. Leaving
        // them is safe, so a failure is only logged.
        let fence = Fence {
            hid: &hid,
            pk: &pk,
            body: &head_body,
            expected,
        };
        match self
            .sweep_blobs(&key, &gen, run_id, &head, fence, etag)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::debug!(run_id, blobs = n, "freed blobs no row refers to"),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "blobs the rewritten history no longer refers to are left until the next prune or the run's deletion")
            }
        }
        Ok(())
    }
}

impl CosmosStore {
    /// Run `key`'s head and its generation, `None` when the run is absent.
    async fn head_and_gen(
        &self,
        key: &str,
        run_id: &str,
    ) -> Result<Option<(Value, String)>, StoreError> {
        let hid = head_id(key);
        let Some(head) = self.read_item(key, &hid, run_id).await? else {
            return Ok(None);
        };
        let gen = head
            .get("gen")
            .and_then(Value::as_str)
            .ok_or_else(|| self.corrupt(run_id, &hid, "the head has no generation"))?
            .to_string();
        Ok(Some((head, gen)))
    }

    /// One read of a run's history (see [`settled`]).
    async fn history_once(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let key = encode_run_id(run_id);
        let Some((head, gen)) = self.head_and_gen(&key, run_id).await? else {
            return Ok(None);
        };
        let gen = gen.as_str();
        let next = head.get("next").and_then(Value::as_u64).unwrap_or(0);
        let steps = self
            .query_partition(
                &key,
                run_id,
                "SELECT * FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind = 'step' AND c.idx < @b",
                json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}, {"name": "@b", "value": next}]),
            )
            .await?;
        let mut out = Vec::new();
        // A fold's row is marked: rows below it that a fold cut short left
        // behind are not history any more.
        let folded = steps
            .iter()
            .filter(|i| i.get("folded").and_then(Value::as_bool) == Some(true))
            .filter_map(|i| i.get("idx").and_then(Value::as_u64))
            .max()
            .unwrap_or(0) as usize;
        for item in steps {
            let Some(idx) = item.get("idx").and_then(Value::as_i64) else {
                return Err(self.corrupt(run_id, "steps", "a step item has no index"));
            };
            if idx < folded as i64 {
                continue;
            }
            let sid = step_id(&key, gen, usize::try_from(idx).unwrap_or(0));
            let locate = |_: &str| format!("{} run {run_id:?} item {sid}", self.shared.display);
            let place = Place::new(run_id, &locate);
            let text = self.text_of(&key, run_id, &item, "update", &sid).await?;
            let n = |f: &str| {
                item.get(f)
                    .and_then(Value::as_i64)
                    .ok_or_else(|| place.corrupt(f, format!("{f} is missing or not a number")))
            };
            let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
            let row = HistoryRow::new(
                idx,
                name.to_string(),
                text,
                n("attempt")?,
                n("started_at")?,
                n("finished_at")?,
            );
            out.push(row.record(&place)?);
        }
        out.sort_by_key(|s| s.index);
        let locate = |column: &str| format!("{} run {run_id:?} {column}", self.shared.display);
        let place = Place::new(run_id, &locate);
        let gen = gen.to_string();
        let objects = out
            .iter_mut()
            .map(|r| {
                let column = format!("history[{}].update", r.index);
                (&mut r.update, column)
            })
            .collect();
        self.resolve_all(&key, &gen, run_id, objects, &place)
            .await?;
        Ok(Some(out))
    }
}

/// The head as a rewrite left it, to lead (If-Match) each batch that
/// follows: a save of the run meanwhile makes the batch fail whole.
struct Fence<'a> {
    hid: &'a str,
    pk: &'a str,
    body: &'a Value,
    expected: u64,
}

impl CosmosStore {
    /// Deletes the blobs of run `key`'s generation `gen` that neither the
    /// head's snapshot, its decisions nor a history row (an item below the head's `next`;
    /// those above it are not read) refers to, in batches each led by the
    /// head as last written (`etag`). A save that refers to such a blob
    /// again (it saw the manifest before it went) leads its own batch with
    /// an older ETag than the sweep's and fails; one that committed first
    /// makes the sweep's batch fail. Returns how many blobs went.
    async fn sweep_blobs(
        &self,
        key: &str,
        gen: &str,
        run_id: &str,
        head: &Value,
        fence: Fence<'_>,
        mut etag: String,
    ) -> Result<usize, StoreError> {
        let manifests = self
            .query_partition(
                key,
                run_id,
                "SELECT c.hash, c.parts, c.bytes, c.tag FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind = 'blob_manifest'",
                json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}]),
            )
            .await?;
        if manifests.is_empty() {
            return Ok(0);
        }
        let head_place = self.head_place(run_id);
        let place = Place::new(run_id, &head_place);
        let next = Fields::new(&place, head).index("next")?;
        let mut held = std::collections::HashSet::new();
        let snapshot = self
            .text_of(key, run_id, head, "snapshot", fence.hid)
            .await?;
        held.extend(steadfast_core::store::blob::refs_in(
            &snapshot, &place, "state",
        )?);
        // A decision's data may be a blob too.
        let doc = Fields::new(&place, head).text("head")?;
        held.extend(steadfast_core::store::blob::head_refs_in(
            doc, &place, "head",
        )?);
        // History rows only: a row at or above `next` is never read (the
        // head and the row that raises `next` to pass it go in one batch).
        let rows = self
            .query_partition(
                key,
                run_id,
                "SELECT * FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind = 'step' AND c.idx < @next",
                json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}, {"name": "@next", "value": next}]),
            )
            .await?;
        for row in &rows {
            let id = row.get("id").and_then(Value::as_str).unwrap_or_default();
            let text = self.text_of(key, run_id, row, "update", id).await?;
            held.extend(steadfast_core::store::blob::refs_in(
                &text, &place, "update",
            )?);
        }
        let doomed: Vec<Doomed> = manifests
            .iter()
            .filter_map(|m| {
                let hash = m
                    .get("hash")
                    .and_then(Value::as_str)
                    .and_then(BlobHash::parse_hex)?;
                // A manifest that does not read is left alone (a load of a
                // run that refers to it reports it).
                let parts = m.get("parts").and_then(Value::as_u64)?;
                let bytes = m.get("bytes").and_then(Value::as_u64)?;
                let tag = parts_tag(m).ok()?;
                if !parts_fit(parts, bytes) {
                    return None;
                }
                let parts = usize::try_from(parts).ok()?;
                (!held.contains(&hash)).then(|| Doomed {
                    ids: std::iter::once(manifest_id(key, gen, &hash))
                        .chain((0..parts).map(|n| blob_id(key, gen, &hash, tag, n)))
                        .collect(),
                    tagged: tag.is_some(),
                })
            })
            .collect();
        let mut freed = 0;
        for batch in sweep_batches(doomed, SWEEP_BATCH - 1) {
            let mut ops = vec![json!({
                "operationType": "Replace", "id": fence.hid, "partitionKey": fence.pk,
                "ifMatch": etag, "resourceBody": fence.body
            })];
            let blobs = batch.blobs.len();
            ops.extend(batch.blobs.iter().flatten().map(
                |id| json!({ "operationType": "Delete", "id": id, "partitionKey": fence.pk }),
            ));
            let results = self
                .head_batch(key, run_id, Some(fence.expected), ops)
                .await?;
            freed += blobs;
            // The rest of a blob too large for one batch: its manifest went
            // in the batch above, so nothing reads these parts any more,
            // and a write of the same content tags its parts afresh.
            if let (_, Some(e)) = self.delete_items(key, run_id, &batch.rest).await {
                tracing::warn!(run_id, error = %e, "parts of a freed blob are left until the run is deleted (nothing reads them)");
            }
            etag = match results[0].get("eTag").and_then(Value::as_str) {
                Some(e) => e.to_string(),
                None => break,
            };
        }
        Ok(freed)
    }

    /// Deletes `ids` of partition `key` (items nothing reads any more), in
    /// order, in batches of up to [`SWEEP_BATCH`], one by one where a batch
    /// fails. Returns how many were there to delete, and the error that
    /// stopped it, if one did (what went stays gone).
    async fn delete_items(
        &self,
        key: &str,
        run_id: &str,
        ids: &[String],
    ) -> (u64, Option<StoreError>) {
        let pk = format!("[\"{key}\"]");
        let mut deleted = 0;
        for group in ids.chunks(SWEEP_BATCH) {
            let ops = group
                .iter()
                .map(|id| json!({ "operationType": "Delete", "id": id, "partitionKey": pk }))
                .collect();
            let whole = match self.batch(key, run_id, ops).await {
                Ok(results) => {
                    results.len() == group.len()
                        && results.iter().all(|r| {
                            r.get("statusCode")
                                .and_then(Value::as_u64)
                                .is_some_and(|c| (200..300).contains(&c))
                        })
                }
                Err(_) => false,
            };
            if whole {
                deleted += group.len() as u64;
                continue;
            }
            for id in group {
                match self.delete_item(key, id, run_id, None).await {
                    Ok(true) => deleted += 1,
                    Ok(false) => {}
                    Err(e) => return (deleted, Some(e)),
                }
            }
        }
        (deleted, None)
    }
}

/// The ids of items a query listed (`SELECT c.id …`).
fn ids_of(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| i.get("id").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// A blob a sweep deletes: its manifest's id, then its parts'; `tagged`
/// when its parts carry the tag of their write, so that it may be deleted
/// over several batches.
struct Doomed {
    ids: Vec<String>,
    tagged: bool,
}

/// One fenced batch of a sweep: whole blobs (each its manifest, then its
/// parts), and `rest`, the parts of a blob too large for the batch that
/// are deleted after it.
#[derive(Debug, Default, PartialEq)]
struct SweepBatch {
    blobs: Vec<Vec<String>>,
    rest: Vec<String>,
}

impl CosmosStore {
    /// [`Blobs::collect_leftovers`](steadfast_core::Blobs::collect_leftovers)
    /// with items `age` old (by each item's `_ts`) counted as settled where
    /// the store takes [`LEFTOVER_AGE`]; a shorter age than that may take
    /// the items of a create still in flight, so only tests use one.
    #[doc(hidden)]
    pub async fn collect_leftovers_older_than(
        &self,
        age: std::time::Duration,
        dry_run: bool,
    ) -> Result<steadfast_core::Leftovers, StoreError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let cutoff = now.saturating_sub(age).as_secs();
        // The tagged items first, then the heads and logs: a generation
        // whose head lands after this read began is either named by that
        // head below, or too young to be taken. Folded a page at a time.
        // (partition, an event log's generation?, generation) -> newest _ts
        let mut newest: std::collections::BTreeMap<(String, bool, String), u64> =
            std::collections::BTreeMap::new();
        self.query_each(
            None,
            "*",
            "SELECT c.pk, c.gen, c.lgen, c.kind, c._ts FROM c WHERE c.kind = 'step' OR c.kind = 'chunk' OR c.kind = 'blob' OR c.kind = 'blob_manifest' OR c.kind = 'event'",
            json!([]),
            |item| {
                let text = |f: &str| item.get(f).and_then(Value::as_str);
                let Some(pk) = text("pk") else { return };
                let of_log = text("kind") == Some("event");
                let Some(gen) = text(if of_log { "lgen" } else { "gen" }) else {
                    return;
                };
                // An item without a time counts as written just now.
                let ts = item.get("_ts").and_then(Value::as_u64).unwrap_or(u64::MAX);
                let at = newest
                    .entry((pk.to_string(), of_log, gen.to_string()))
                    .or_insert(0);
                *at = (*at).max(ts);
            },
        )
        .await?;
        newest.retain(|_, ts| *ts <= cutoff);
        let mut named = std::collections::HashSet::new();
        for (kind, field) in [("head", "gen"), ("evlog", "lgen")] {
            let of_log = kind == "evlog";
            self.query_each(
                None,
                "*",
                &format!("SELECT c.pk, c.{field} FROM c WHERE c.kind = '{kind}'"),
                json!([]),
                |r| {
                    let text = |f: &str| r.get(f).and_then(Value::as_str).map(str::to_string);
                    // Only the candidates' names are kept, not every run's.
                    if let (Some(pk), Some(gen)) = (text("pk"), text(field)) {
                        let name = (pk, of_log, gen);
                        if newest.contains_key(&name) {
                            named.insert(name);
                        }
                    }
                },
            )
            .await?;
        }
        newest.retain(|name, _| !named.contains(name));
        let mut found = steadfast_core::Leftovers::default();
        for (pk, of_log, gen) in newest.into_keys() {
            let query = if of_log {
                "SELECT c.id, c.kind FROM c WHERE c.pk = @pk AND c.lgen = @gen AND c.kind = 'event'"
            } else {
                "SELECT c.id, c.kind FROM c WHERE c.pk = @pk AND c.gen = @gen AND c.kind != 'head'"
            };
            let label = format!("(leftovers of partition {pk})");
            let params = json!([{"name": "@pk", "value": pk}, {"name": "@gen", "value": gen}]);
            // Manifests first, so that no blob ever reads whole over parts
            // already gone (nothing reads this generation; all the same).
            let removed = match self.query_partition(&pk, &label, query, params).await {
                Ok(items) if items.is_empty() => continue,
                Ok(items) => {
                    let mut ids: Vec<(bool, String)> = items
                        .iter()
                        .filter_map(|i| {
                            let kind = i.get("kind").and_then(Value::as_str);
                            let id = i.get("id")?.as_str()?.to_string();
                            Some((kind != Some("blob_manifest"), id))
                        })
                        .collect();
                    ids.sort();
                    let ids: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
                    found.remnants += 1;
                    if dry_run {
                        found.items += ids.len() as u64;
                        continue;
                    }
                    self.delete_items(&pk, &label, &ids).await
                }
                Err(e) => {
                    found.remnants += 1;
                    (0, Some(e))
                }
            };
            found.items += removed.0;
            match removed.1 {
                None => {
                    tracing::debug!(partition = %pk, generation = %gen, of_log, items = removed.0, "removed what a failed or cut-short write left");
                }
                Some(e) => {
                    found.failed += 1;
                    tracing::warn!(partition = %pk, generation = %gen, error = %e, "leftovers of a failed or cut-short write are left for the next gc");
                }
            }
        }
        Ok(found)
    }
}

/// The most operations a transactional batch takes.
const SWEEP_BATCH: usize = 100;

/// The pace of a create's writes before its batch: each write of an item
/// under the create's own generation must start, and its batch must be
/// sent, within `window` of the last such write landing (or of the save's
/// start), by this process's monotonic clock and by the wall clock (which
/// also counts a suspended machine). `None`: a save under a generation a
/// head names, which nothing collects.
struct Pace {
    window: Option<std::time::Duration>,
    last: std::sync::Mutex<Last>,
}

/// When a save's last write before its batch landed, and the ids of what
/// it wrote or tried to write, in order.
struct Last {
    at: std::time::Instant,
    wall: std::time::SystemTime,
    written: Vec<String>,
}

impl Pace {
    fn new(window: Option<std::time::Duration>) -> Self {
        Pace {
            window,
            last: std::sync::Mutex::new(Last {
                at: std::time::Instant::now(),
                wall: std::time::SystemTime::now(),
                written: Vec::new(),
            }),
        }
    }

    /// Unavailable when the window has passed since the last write.
    fn check(&self, display: &str, run_id: &str) -> Result<(), StoreError> {
        let Some(window) = self.window else {
            return Ok(());
        };
        let gap = {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            // A wall clock set back reads as no time at all.
            last.at
                .elapsed()
                .max(last.wall.elapsed().unwrap_or_default())
        };
        if gap <= window {
            return Ok(());
        }
        Err(StoreError::unavailable(format!(
            "creating run {run_id:?} in {display}: {:.1?} passed between two of its writes before its batch, more than the {} a create may wait (so that `gc` never takes the items of a create in flight); nothing was saved (what it wrote is deleted again), try again",
            gap,
            humantime::format_duration(window)
        )))
    }

    /// `item` is being written (kept only for a create, which deletes what
    /// it wrote when it fails).
    fn attempt(&self, item: &Value) {
        if self.window.is_none() {
            return;
        }
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.written.push(id.to_string());
    }

    /// The write attempted last landed.
    fn landed(&self) {
        if self.window.is_none() {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.at = std::time::Instant::now();
        last.wall = std::time::SystemTime::now();
    }

    /// Whether anything was written (or tried).
    fn wrote_any(&self) -> bool {
        !self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .written
            .is_empty()
    }

    /// What was written or tried, the last first.
    fn written(&self) -> Vec<String> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.written.iter().rev().cloned().collect()
    }
}

/// Groups blobs to delete into batches of at most `room` items, each blob
/// whole in one batch: deleted all at once, a blob is never left with a
/// manifest over missing parts (a save that writes it again meanwhile
/// writes every part and then the manifest, after the batch or not at
/// all). A blob of more items than `room` (over 24 MiB) gets a batch of
/// its own with its manifest and the parts that fit, the rest of its parts
/// after it: once the manifest is gone nothing reads them, and a write of
/// the same content meanwhile writes parts of another tag. An untagged one
/// (written before parts were tagged, whose parts a new write would
/// overwrite) is left to go with its run.
fn sweep_batches(blobs: Vec<Doomed>, room: usize) -> Vec<SweepBatch> {
    let mut batches: Vec<SweepBatch> = Vec::new();
    let mut large = Vec::new();
    let mut used = 0;
    for blob in blobs {
        if blob.ids.len() > room {
            if blob.tagged {
                let mut ids = blob.ids;
                let rest = ids.split_off(room);
                large.push(SweepBatch {
                    blobs: vec![ids],
                    rest,
                });
            }
            continue;
        }
        if batches.is_empty() || used + blob.ids.len() > room {
            batches.push(SweepBatch::default());
            used = 0;
        }
        used += blob.ids.len();
        batches.last_mut().expect("a batch").blobs.push(blob.ids);
    }
    batches.extend(large);
    batches
}

#[cfg(test)]
mod sweep_tests {
    use super::{settled, sweep_batches, Doomed, SweepBatch, READ_AGAIN};
    use steadfast_core::{StoreError, StoreErrorKind};

    /// A read that finds the run damaged `bad` times, then whole; the
    /// head's ETag moves between reads when `moving`.
    fn outcome(bad: usize, moving: bool) -> Result<(usize, usize), StoreError> {
        let calls = std::cell::Cell::new(0);
        let head = || {
            let tag = if moving { calls.get() } else { 0 };
            async move { Some(format!("etag-{tag}")) }
        };
        let read = || {
            let n = calls.get();
            calls.set(n + 1);
            async move {
                if n < bad {
                    Err(StoreError::Corrupt {
                        location: "item".into(),
                        reason: "a part of a blob is missing".into(),
                    })
                } else {
                    Ok(n)
                }
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        rt.block_on(settled(read, head)).map(|v| (v, calls.get()))
    }

    #[test]
    fn a_read_that_meets_a_freed_item_is_made_again_and_damage_that_stays_is_reported() {
        assert_eq!(outcome(0, true).ok(), Some((0, 1)));
        // A head that moves between reads: read again, up to the limit.
        assert_eq!(
            outcome(READ_AGAIN, true).ok(),
            Some((READ_AGAIN, READ_AGAIN + 1))
        );
        let err = outcome(READ_AGAIN + 1, true).expect_err("damage that stays");
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        // A head that stays: one more read only, then the damage.
        assert_eq!(outcome(1, false).ok(), Some((1, 2)));
        assert!(outcome(2, false).is_err());
    }

    fn blob(name: &str, parts: usize) -> Doomed {
        Doomed {
            ids: std::iter::once(format!("{name}m"))
                .chain((0..parts).map(|n| format!("{name}{n}")))
                .collect(),
            tagged: true,
        }
    }

    /// Every text split as the store splits it has a count of parts that
    /// fits its size; counts a blob cannot have do not.
    #[test]
    fn the_parts_a_blob_can_have() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..200 {
            let len = rng.usize(1..700_000);
            let text: String = (0..len)
                .map(|_| ['a', 'é', '€', '𝄞'][rng.usize(0..4)])
                .collect();
            let parts = super::parts_of(&text).len() as u64;
            assert!(
                super::parts_fit(parts, text.len() as u64),
                "{parts} parts of {}",
                text.len()
            );
        }
        assert!(!super::parts_fit(0, 300));
        assert!(!super::parts_fit(u64::MAX, 1 << 30));
        assert!(!super::parts_fit(5, 256 * 1024));
        assert!(super::parts_fit(1, 256 * 1024));
    }

    #[test]
    fn blobs_that_fit_are_never_split_and_a_larger_one_leads_with_its_manifest() {
        let untagged = |name: &str, parts: usize| Doomed {
            tagged: false,
            ..blob(name, parts)
        };
        let blobs = vec![
            blob("a", 50),
            blob("b", 50),
            blob("c", 98),
            blob("d", 99),
            blob("e", 3),
            untagged("u", 99),
            untagged("v", 5),
            blob("f", 250),
        ];
        let batches = sweep_batches(blobs, 99);
        let names: Vec<Vec<&str>> = batches
            .iter()
            .map(|b| b.blobs.iter().map(|ids| ids[0].as_str()).collect())
            .collect();
        // The untagged blob too large for a batch is left; d and f are split.
        assert_eq!(
            names,
            [
                vec!["am"],
                vec!["bm"],
                vec!["cm"],
                vec!["em", "vm"],
                vec!["dm"],
                vec!["fm"]
            ]
        );
        for b in &batches {
            assert!(b.blobs.iter().map(Vec::len).sum::<usize>() <= 99);
        }
        let d = &batches[4];
        assert_eq!(
            (d.blobs[0].len(), d.rest.clone()),
            (99, vec!["d98".to_string()])
        );
        let f = &batches[5];
        assert_eq!(f.blobs[0].len() + f.rest.len(), 251);
        assert_eq!(f.rest.first().map(String::as_str), Some("f98"));
        assert!(batches[..4].iter().all(|b| b.rest.is_empty()));
        let small: Vec<Doomed> = (0..40).map(|i| blob(&format!("s{i}-"), 4)).collect();
        let batches = sweep_batches(small, 99);
        assert_eq!(
            batches.iter().map(|b| b.blobs.len()).collect::<Vec<_>>(),
            [19, 19, 2]
        );
        assert_eq!(sweep_batches(Vec::new(), 99), Vec::<SweepBatch>::new());
    }
}

#[async_trait]
impl steadfast_core::Blobs for CosmosStore {
    /// Its head and history items' JSON, and its generation's blobs (none
    /// shared: they live in the run's partition).
    async fn usage(&self, run_id: &str) -> Result<Option<steadfast_core::Usage>, StoreError> {
        let key = encode_run_id(run_id);
        let Some((head, gen)) = self.head_and_gen(&key, run_id).await? else {
            return Ok(None);
        };
        let items = self
            .query_partition(
                &key,
                run_id,
                "SELECT * FROM c WHERE c.pk = @pk AND c.gen = @gen AND (c.kind = 'step' OR c.kind = 'blob_manifest')",
                json!([{"name": "@pk", "value": key}, {"name": "@gen", "value": gen}]),
            )
            .await?;
        let size = |v: &Value| serde_json::to_vec(v).map_or(0, |t| t.len() as u64);
        let mut record = size(&head);
        let (mut blobs, mut bytes) = (0, 0);
        for item in &items {
            if item.get("kind").and_then(Value::as_str) == Some("blob_manifest") {
                blobs += 1;
                bytes += item.get("bytes").and_then(Value::as_u64).unwrap_or(0);
            } else {
                record += size(item);
            }
        }
        Ok(Some(steadfast_core::Usage::new(record, blobs, bytes, 0)))
    }

    /// Every manifest in the container (a cross-partition query): blobs
    /// of runs deleted half-way and of lost creates included.
    async fn blob_totals(&self) -> Result<steadfast_core::BlobTotals, StoreError> {
        let items = self
            .query(
                None,
                "",
                "SELECT c.bytes FROM c WHERE c.kind = 'blob_manifest'",
                json!([]),
            )
            .await?;
        let bytes = items
            .iter()
            .filter_map(|i| i.get("bytes").and_then(Value::as_u64))
            .sum();
        Ok(steadfast_core::BlobTotals::new(items.len() as u64, bytes))
    }

    /// The items of generations no head names (a delete cut short, a
    /// create that failed or died after writing its large values), and
    /// events of logs no log item names, whose newest item is at least
    /// [`LEFTOVER_AGE`] old: one cross-partition query over every history,
    /// chunk, blob and event item (a few small fields each), two over the
    /// heads and logs, then within each partition that has any a query
    /// and batches of deletes (one by one where a batch fails).
    async fn collect_leftovers(
        &self,
        dry_run: bool,
    ) -> Result<steadfast_core::Leftovers, StoreError> {
        self.collect_leftovers_older_than(LEFTOVER_AGE, dry_run)
            .await
    }

    fn threshold(&self) -> u64 {
        self.shared.opts.blob_threshold
    }

    fn shared_across_runs(&self) -> bool {
        false
    }
}

/// Opens the store a `cosmos://` URL names (`rest` follows the scheme's
/// colon), creating the database and container only when `create` is set.
pub async fn open_url(rest: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let url = format!("cosmos:{rest}");
    Ok(Arc::new(
        CosmosStore::open_with(&url, CosmosOptions::default().create(create)).await?,
    ))
}

/// This store as a backend of the facade: `cosmos://HOST/DB/CONTAINER`.
pub const BACKEND: steadfast_core::store::backend::Backend =
    steadfast_core::store::backend::Backend::new(
        "cosmos",
        URL_SCHEMES,
        "cosmos://HOST/DB/CONTAINER",
        "Azure Cosmos DB for NoSQL",
        |_, rest, create| Box::pin(open_url(rest, create)),
    );

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_database_and_container_and_never_a_key() {
        let p = parse_url("cosmos://127.0.0.1:8081/db1/runs?cafile=/tmp/c.pem").expect("valid");
        assert_eq!(
            (p.host.as_str(), p.port, p.db.as_str(), p.coll.as_str()),
            ("127.0.0.1", 8081, "db1", "runs")
        );
        assert_eq!(p.cafile.as_deref(), Some("/tmp/c.pem"));
        assert_eq!(p.retry_budget, None);
        let p = parse_url("cosmos://h/db/c?retry_budget=1m30s").expect("valid");
        assert_eq!(p.retry_budget, Some(std::time::Duration::from_secs(90)));
        assert_eq!(
            parse_url("cosmos://acct.documents.azure.com/db/c")
                .expect("valid")
                .port,
            443
        );
        for (url, says) in [
            ("cosmos://h/db", "no container"),
            ("cosmos://h/db/c/x", "too many"),
            ("cosmos://h/db/c?key=abc", "never goes in the URL"),
            ("cosmos://me:secret@h/db/c", "does not belong"),
            ("cosmos://h:port/db/c", "port"),
            ("cosmos://h/d b/c", "not a database"),
            ("cosmos://h/db/c?colour=red", "unknown parameter"),
            ("cosmos://h/db/c?retry_budget=soon", "retry_budget"),
            ("cosmos://h/db/c?retry_budget=-1s", "retry_budget"),
            ("cosmos://h/db/c?retry_budget=", "retry_budget"),
            (
                "cosmos://h/db/c?retry_budget=99999999999999999999999s",
                "retry_budget",
            ),
            ("cosmos://h/db/c?retry_budget=%FF", "retry_budget"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret") && !e.contains("abc"), "{e}");
        }
    }

    /// A key file must be this user's regular file, readable by no one
    /// else, and small; the error never shows the key.
    #[test]
    fn key_files_are_private_small_regular_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temp dir");
        let key = dir.path().join("key");
        std::fs::write(&key, "c2VjcmV0").expect("write");
        let read = |p: &std::path::Path| {
            read_key(Some(p.to_str().expect("utf-8")))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read(&key).unwrap_err();
        assert!(
            e.contains("read or changed by others") && !e.contains("c2VjcmV0"),
            "{e}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read(&key), Ok(()));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&key, &link).expect("symlink");
        assert!(read(&link).unwrap_err().contains("symbolic link"));
        assert!(read(&dir.path().join("missing"))
            .unwrap_err()
            .contains("No such file"));
        let big = dir.path().join("big");
        std::fs::write(&big, "A".repeat(10_000)).expect("write");
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(read(&big).unwrap_err().contains("over 4096 bytes"));
        let junk = dir.path().join("junk");
        std::fs::write(&junk, [0xff, 0xfe, 0x00]).expect("write");
        std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(
            read(&junk).is_err(),
            "a key file that is not UTF-8 is refused"
        );
        assert!(read(dir.path()).is_err(), "a directory is refused");
    }

    #[test]
    fn run_ids_become_valid_item_ids() {
        assert_eq!(encode_run_id("run-1_a.b"), "run-1_a.b");
        assert_eq!(encode_run_id("a/b\\c?d#e f"), "a~2Fb~5Cc~3Fd~23e~20f");
        assert_eq!(encode_run_id("é"), "~C3~A9");
        let longest = "/".repeat(200);
        assert!(head_id(&encode_run_id(&longest)).len() <= 1023);
        assert!(step_id(&encode_run_id(&longest), "0123456789abcdef", usize::MAX).len() <= 1023);
        // Different ids never encode alike.
        assert_ne!(encode_run_id("~2F"), encode_run_id("/"));
    }
}
