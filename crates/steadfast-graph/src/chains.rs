//! Chains of checkpoints on any store, kept in the store's shared documents
//! ([`steadfast::Documents`], which every store has): the Agent Framework
//! storage's layer, so that it is written once for `sqlite:`, `postgres://`,
//! `file:`, `cosmos://` and `memory:`.
//!
//! A chain is one workflow run: checkpoints linked by their predecessor. Each
//! chain has one document (its workflow, its checkpoints in save order, its
//! head, and who may write it until when); each checkpoint's body is kept in
//! one or more part documents beside it (a document holds at most
//! [`steadfast::store::MAX_DOCUMENT_BYTES`]), named by the checkpoint and a number
//! drawn for each save.
//!
//! A save writes the parts first and then the chain's document by
//! compare-and-swap on its version, which is also where the lease is taken
//! or renewed: a checkpoint exists once its chain's document lists it. So a
//! save refused (another live holder) or cut short by a crash leaves no
//! checkpoint, only parts nothing lists, and a save that returned has both
//! parts and listing as durable as the store makes a document.
//!
//! The calls block: call them from a thread, not from inside an async task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use steadfast::store::blob::BlobHash;
use steadfast::{Documents, Store, StoreError, StoreErrorKind, Timestamp};

use crate::error::store_err;
use crate::{block, now_ms, GraphError, Holder, Result};
use serde::de::DeserializeOwned;

/// The largest checkpoint body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 256 << 20;
/// The longest checkpoint id, workflow name or timestamp, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// How much of a body one part document holds, in bytes of JSON text (a
/// document holds at most 1 MiB).
const PART_BYTES: usize = 768 << 10;
/// How many times a save retries when another writer changed the chain's
/// document under it.
const RETRIES: usize = 32;
/// How many checkpoints' chains a store remembers.
const CACHE: usize = 4096;
/// How many checkpoints a chain's own document lists before they are moved
/// into a segment document of their own.
const SEGMENT: usize = 256;
/// How long a replaced segment is kept for readers who saw it listed.
const RETIRED_FOR_MS: i64 = 120_000;
/// How many replaced segments a chain keeps at most, whatever their age.
const RETIRED_MAX: usize = 1024;
/// Up to how many checkpoints a listing reads one by one (past that, every
/// part of the namespace at once).
const FEW: usize = 32;
/// How many chains' lease generations a store remembers.
const MINE: usize = 1 << 16;

/// One checkpoint as stored: its id, chain, workflow, predecessor,
/// timestamp and body.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The checkpoint's id.
    pub id: String,
    /// The chain (workflow run) it is in: the id of the chain's first
    /// checkpoint.
    pub chain: String,
    /// The workflow it belongs to.
    pub workflow: String,
    /// The checkpoint it follows, if any.
    pub previous: Option<String>,
    /// Its timestamp, as given.
    pub timestamp: String,
    /// Its body, as given.
    pub body: String,
}

/// One checkpoint in a chain's document.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    id: String,
    /// The number drawn for the save whose parts hold the body.
    save: String,
    parts: u32,
    previous: Option<String>,
    timestamp: String,
    #[serde(default)]
    sealed: bool,
    /// The save this one replaced, whose parts are kept until the next
    /// replacement so that a reader who saw it listed still finds them.
    #[serde(default)]
    older: Option<Older>,
}

/// A replaced save of a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Older {
    save: String,
    parts: u32,
}

/// A chain's document.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Chain {
    chain: String,
    workflow: String,
    /// The holder's text (empty: none).
    holder: String,
    until: i64,
    local_until: Option<i64>,
    /// How many times the lease passed to another writer.
    generation: i64,
    /// The checkpoint saved last.
    head: Option<String>,
    /// The keys of the chain's sealed-off segments, oldest first: documents
    /// that each list a full segment of its earlier checkpoints.
    #[serde(default)]
    segments: Vec<String>,
    /// Segments replaced by a rewrite, kept until a later rewrite after
    /// [`RETIRED_FOR_MS`], so that a reader who saw them listed still finds
    /// them.
    #[serde(default)]
    retired: Vec<Retired>,
    /// Its latest checkpoints (those of no segment yet), in save order.
    entries: Vec<Entry>,
}

/// A segment no longer listed, and from when it may be removed.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Retired {
    key: String,
    after: i64,
}

/// A sealed-off segment of a chain's checkpoints.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Segment {
    chain: String,
    entries: Vec<Entry>,
}

/// A checkpoint found: its chain's document and version, its entry, and
/// the parts of its save read on the way (possibly none).
type Located = (Chain, u64, Entry, Vec<Part>);

/// What a store knows of a chain it took: the lease generation, and the
/// checkpoint it saved into it last.
#[derive(Clone, Debug)]
struct Mine {
    generation: i64,
    last: Option<String>,
}

/// One part of a body.
#[derive(Debug, Serialize, Deserialize)]
struct Part {
    id: String,
    chain: String,
    save: String,
    index: u32,
    text: String,
}

/// Checkpoint chains of one namespace in a store, with one writer per chain.
pub struct ChainStore {
    store: Arc<dyn Store>,
    ns: String,
    me: Holder,
    lease_ms: i64,
    keys: Option<steadfast::seal::Keyring>,
    /// The lease generation of each chain this store took last, kept after
    /// a release so that a save after another writer took the chain is
    /// still judged stale.
    mine: Mutex<HashMap<String, Mine>>,
    /// The chains this store holds now (for `close`).
    holding: Mutex<std::collections::HashSet<String>>,
    /// The chain of checkpoints seen here.
    seen: Mutex<HashMap<String, String>>,
    /// Segments read here (they never change: a rewrite makes a new one).
    segments: Mutex<HashMap<String, Arc<Vec<Entry>>>>,
    segment_size: usize,
}

fn invalid(msg: String) -> GraphError {
    GraphError::InvalidInput(msg)
}

fn check_name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES || s.chars().any(char::is_control) {
        return Err(invalid(format!(
            "the {what} {:?} must be 1 to {MAX_NAME_BYTES} bytes without control characters; nothing was written",
            s.chars().take(60).collect::<String>()
        )));
    }
    Ok(())
}

/// How many bytes `c` takes inside a JSON string.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `text` cut at character boundaries into pieces of at most
/// [`PART_BYTES`] once escaped in JSON.
fn split(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, c) in text.char_indices() {
        let n = escaped_len(c);
        if size + n > PART_BYTES {
            out.push(&text[start..i]);
            (start, size) = (i, 0);
        }
        size += n;
    }
    if start < text.len() || out.is_empty() {
        out.push(&text[start..]);
    }
    out
}

fn hash(s: &str) -> String {
    BlobHash::of(s.as_bytes()).hex()
}

impl ChainStore {
    /// Opens the store `url` names (creating it when missing), under the
    /// library's encryption policy for its runs; the chains are in
    /// namespace `ns`. `lease` is how long a chain stays this store's after
    /// its last save; with `encrypt`, every body is sealed with the keys in
    /// the environment and bound to its checkpoint.
    pub fn open(url: &str, ns: &str, lease: Duration, encrypt: bool) -> Result<Self> {
        let owned = url.to_string();
        let store =
            block(async move { steadfast::open_store(&owned).await }).map_err(|e| store_err(&e))?;
        Self::with_store(store, ns, lease, encrypt).map_err(|e| match e {
            GraphError::Unsupported(_) => GraphError::Unsupported(format!(
                "the store {} keeps no shared documents",
                steadfast::store::redact_url(url)
            )),
            other => other,
        })
    }

    /// The chains of namespace `ns` in an open store (as [`ChainStore::open`]).
    pub fn with_store(
        store: Arc<dyn Store>,
        ns: &str,
        lease: Duration,
        encrypt: bool,
    ) -> Result<Self> {
        let keys = crate::keyring(encrypt)?;
        steadfast::limits::LEASE
            .check("lease_seconds", lease)
            .map_err(GraphError::InvalidInput)?;
        if ns.is_empty()
            || ns.len() > 40
            || !ns
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(format!(
                "the namespace {ns:?} must be 1 to 40 ASCII letters, digits, '-' or '_'"
            )));
        }
        if store.capabilities().documents.is_none() {
            return Err(GraphError::Unsupported(
                "this store keeps no shared documents".into(),
            ));
        }
        Ok(ChainStore {
            store,
            ns: ns.to_string(),
            me: Holder {
                owner: steadfast::current_owner(),
                saver: fastrand::u64(..),
            },
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            keys,
            mine: Mutex::new(HashMap::new()),
            holding: Mutex::new(std::collections::HashSet::new()),
            seen: Mutex::new(HashMap::new()),
            segments: Mutex::new(HashMap::new()),
            segment_size: SEGMENT,
        })
    }

    fn docs(&self) -> &dyn Documents {
        self.store
            .capabilities()
            .documents
            .expect("checked when opened")
    }

    /// The same store with segments of `n` checkpoints (for tests).
    #[doc(hidden)]
    pub fn segment_size(mut self, n: usize) -> Self {
        self.segment_size = n.clamp(1, SEGMENT);
        self
    }

    /// A segment's checkpoints, or `None` when its document is gone.
    fn read_segment(&self, key: &str) -> Result<Option<Arc<Vec<Entry>>>> {
        if let Some(found) = self
            .segments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
        {
            return Ok(Some(Arc::clone(found)));
        }
        let Some((seg, _)) = self.read_doc::<Segment>(key, "a segment of checkpoints")? else {
            return Ok(None);
        };
        let entries = Arc::new(seg.entries);
        let mut cache = self.segments.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE {
            cache.clear();
        }
        cache.insert(key.to_string(), Arc::clone(&entries));
        Ok(Some(entries))
    }

    /// A segment listed by `chain`'s document at `key`: Corrupt when gone
    /// (a replaced segment is kept [`RETIRED_FOR_MS`] for readers who saw
    /// it listed).
    fn listed_segment(&self, chain: &str, key: &str) -> Result<Arc<Vec<Entry>>> {
        self.read_segment(key)?.ok_or_else(|| {
            store_err(&StoreError::Corrupt {
                location: format!("workflow run {chain:?}"),
                reason: format!("its segment {key:?} is missing"),
            })
        })
    }

    /// Writes a new segment of `chain`; its key.
    fn write_segment(&self, chain: &str, entries: &[Entry]) -> Result<String> {
        let key = format!(
            "{}/segment/{}/{:016x}",
            self.ns,
            hash(chain),
            fastrand::u64(..)
        );
        let value = serde_json::to_value(Segment {
            chain: chain.to_string(),
            entries: entries.to_vec(),
        })
        .map_err(|e| invalid(e.to_string()))?;
        block(self.docs().put_document(&key, &value, None)).map_err(|e| store_err(&e))?;
        Ok(key)
    }

    fn drop_segment(&self, key: &str) {
        if let Ok(Some(d)) = block(self.docs().get_document(key)) {
            // Best effort: a segment nothing lists is harmless.
            let _ = block(self.docs().delete_document(key, d.version));
        }
    }

    /// Every checkpoint of a chain, in save order.
    fn entries_of(&self, c: &Chain) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for key in &c.segments {
            out.extend(self.listed_segment(&c.chain, key)?.iter().cloned());
        }
        out.extend(c.entries.iter().cloned());
        Ok(out)
    }

    /// Where checkpoint `id` is in a chain (`None`: its own document, else
    /// the index of its segment), and its entry.
    fn find_in(&self, c: &Chain, id: &str) -> Result<Option<(Option<usize>, Entry)>> {
        if let Some(e) = c.entries.iter().find(|e| e.id == id) {
            return Ok(Some((None, e.clone())));
        }
        for (i, key) in c.segments.iter().enumerate().rev() {
            if let Some(e) = self
                .listed_segment(&c.chain, key)?
                .iter()
                .find(|e| e.id == id)
            {
                return Ok(Some((Some(i), e.clone())));
            }
        }
        Ok(None)
    }

    /// Replaces segment `i` of `doc` by one holding `entries` (none: drops
    /// it), retiring the old one; returns the new segment's key, to remove
    /// if the document's write fails, and the retired segments whose time
    /// is up, to remove once it succeeds.
    fn rewrite_segment(
        &self,
        doc: &mut Chain,
        i: usize,
        entries: &[Entry],
    ) -> Result<(Option<String>, Vec<String>)> {
        let new = if entries.is_empty() {
            None
        } else {
            Some(self.write_segment(&doc.chain, entries)?)
        };
        let old = match &new {
            Some(k) => std::mem::replace(&mut doc.segments[i], k.clone()),
            None => doc.segments.remove(i),
        };
        let now = now_ms();
        let (due, mut kept): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut doc.retired)
            .into_iter()
            .partition(|r| r.after <= now);
        let mut due: Vec<String> = due.into_iter().map(|r| r.key).collect();
        kept.push(Retired {
            key: old,
            after: now.saturating_add(RETIRED_FOR_MS),
        });
        if kept.len() > RETIRED_MAX {
            due.extend(kept.drain(..kept.len() - RETIRED_MAX).map(|r| r.key));
        }
        doc.retired = kept;
        Ok((new, due))
    }

    fn chain_key(&self, chain: &str) -> String {
        format!("{}/chain/{}", self.ns, hash(chain))
    }

    fn parts_prefix(&self, id: &str) -> String {
        format!("{}/part/{}/", self.ns, hash(id))
    }

    fn part_key(&self, id: &str, save: &str, index: u32) -> String {
        format!("{}{save}/{index}", self.parts_prefix(id))
    }

    fn check_process(&self) -> Result<()> {
        if std::process::id() != self.me.owner.pid {
            return Err(invalid(format!(
                "this store was opened in process {} and is used in process {} (a fork); open a new one in this process",
                self.me.owner.pid,
                std::process::id()
            )));
        }
        Ok(())
    }

    fn local_until(&self) -> Option<i64> {
        let ttl = Duration::from_millis(u64::try_from(self.lease_ms).unwrap_or(0));
        steadfast::local_deadline(ttl).and_then(|ms| i64::try_from(ms).ok())
    }

    /// The document under `key` read as `what` (Corrupt when it is not)
    /// and its version, or `None`.
    fn read_doc<T: DeserializeOwned>(&self, key: &str, what: &str) -> Result<Option<(T, u64)>> {
        let Some(doc) = block(self.docs().get_document(key)).map_err(|e| store_err(&e))? else {
            return Ok(None);
        };
        let parsed = serde_json::from_value(doc.value).map_err(|e| {
            store_err(&StoreError::Corrupt {
                location: format!("document {key:?}"),
                reason: format!("is not {what}: {e}"),
            })
        })?;
        Ok(Some((parsed, doc.version)))
    }

    /// The chain this store last saved checkpoint `id` into, if it knows.
    fn saved_in(&self, id: &str) -> Option<String> {
        self.mine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, m)| m.last.as_deref() == Some(id))
            .map(|(c, _)| c.clone())
    }

    /// A chain's document and its version, or `None`.
    fn read_chain(&self, chain: &str) -> Result<Option<(Chain, u64)>> {
        let key = self.chain_key(chain);
        let Some((parsed, version)) = self.read_doc::<Chain>(&key, "a chain of checkpoints")?
        else {
            return Ok(None);
        };
        if parsed.chain != chain {
            return Err(store_err(&StoreError::Corrupt {
                location: format!("document {key:?}"),
                reason: format!("holds chain {:?}, not {chain:?}", parsed.chain),
            }));
        }
        Ok(Some((parsed, version)))
    }

    /// Writes a chain's document if its version is still `expected`;
    /// `false` when another writer changed it first.
    fn write_chain(&self, doc: &Chain, expected: Option<u64>) -> Result<bool> {
        let value = serde_json::to_value(doc).map_err(|e| invalid(e.to_string()))?;
        match block(
            self.docs()
                .put_document(&self.chain_key(&doc.chain), &value, expected),
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == StoreErrorKind::Conflict => Ok(false),
            Err(StoreError::TooLarge { .. }) => Err(invalid(format!(
                "the document of workflow run {:?} would be over 1 MiB ({} checkpoints and {} segments listed); nothing was written",
                doc.chain,
                doc.entries.len(),
                doc.segments.len()
            ))),
            Err(e) => Err(store_err(&e)),
        }
    }

    /// Held when another live writer holds `doc`; else the generation this
    /// store writes it at. `extends`: the checkpoint a save follows, which
    /// must be the head when another writer took the chain since this one
    /// held it (`None`: no such rule, as for a load).
    fn decide(&self, doc: &Chain, now: i64, extends: Option<Option<&str>>) -> Result<i64> {
        if doc.holder == self.me.text() {
            return Ok(doc.generation);
        }
        if !doc.holder.is_empty() && Holder::holds(&doc.holder, doc.until, doc.local_until, now) {
            return Err(GraphError::Held(format!(
                "workflow run {:?} is held by {} until {}; a second writer would fork its checkpoints, so nothing was written (the holder's lease runs out, or it calls release or close, or its process exits)",
                doc.chain,
                Holder::describe(&doc.holder),
                Timestamp::from_unix_millis(doc.until.max(0) as u64)
            )));
        }
        let mine = self
            .mine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&doc.chain)
            .map(|m| m.generation);
        if let (Some(g), Some(extends)) = (mine, extends) {
            if g != doc.generation && extends != doc.head.as_deref() {
                return Err(GraphError::Held(format!(
                    "workflow run {:?} was written by another storage after this one's lease on it ran out; this checkpoint does not follow its latest and would fork it, so nothing was written (load the latest checkpoint to resume)",
                    doc.chain
                )));
            }
        }
        Ok(doc.generation.saturating_add(1))
    }

    /// Notes the lease generation taken on `chain`, and the checkpoint
    /// saved into it (`None`: a claim, which saves nothing).
    fn took(&self, chain: &str, generation: i64, saved: Option<&str>) {
        let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
        if mine.len() >= MINE && !mine.contains_key(chain) {
            // Bounded: an arbitrary entry goes.
            if let Some(k) = mine.keys().next().cloned() {
                mine.remove(&k);
            }
        }
        let noted = mine.entry(chain.to_string()).or_insert(Mine {
            generation,
            last: None,
        });
        noted.generation = generation;
        if let Some(id) = saved {
            noted.last = Some(id.to_string());
        }
        drop(mine);
        self.holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(chain.to_string());
    }

    fn remember(&self, id: &str, chain: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= CACHE {
            // A cache, not a record: start it again rather than grow.
            seen.clear();
        }
        seen.insert(id.to_string(), chain.to_string());
    }

    /// The chain listing checkpoint `id`, its version and the entry.
    fn locate(&self, id: &str) -> Result<Option<(Chain, u64, Entry)>> {
        Ok(self.locate_reading(id)?.map(|(c, v, e, _)| (c, v, e)))
    }

    /// [`Self::locate`], with the parts of the id it read on the way (when
    /// it had to list them to find the chain), for a caller that needs the
    /// body too.
    fn locate_reading(&self, id: &str) -> Result<Option<Located>> {
        let cached = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        let find = |c: Chain, v: u64| -> Result<Option<(Chain, u64, Entry)>> {
            Ok(self.find_in(&c, id)?.map(|(_, e)| (c, v, e)))
        };
        if let Some(chain) = cached {
            if let Some((c, v)) = self.read_chain(&chain)? {
                if let Some((c, v, e)) = find(c, v)? {
                    return Ok(Some((c, v, e, Vec::new())));
                }
            }
        }
        // Every chain the id's parts name (a crash may leave parts of a
        // save that never joined one).
        let parts =
            block(self.docs().list_documents(&self.parts_prefix(id))).map_err(|e| store_err(&e))?;
        let parts: Vec<Part> = parts
            .into_iter()
            .filter_map(|d| serde_json::from_value::<Part>(d.value).ok())
            .filter(|p| p.id == id)
            .collect();
        let mut chains: Vec<&str> = Vec::new();
        for p in &parts {
            if !chains.contains(&p.chain.as_str()) {
                chains.push(&p.chain);
            }
        }
        for chain in chains {
            if let Some((c, v)) = self.read_chain(chain)? {
                if let Some((c, v, e)) = find(c, v)? {
                    self.remember(id, chain);
                    let save = e.save.clone();
                    let mine = parts.into_iter().filter(|p| p.save == save).collect();
                    return Ok(Some((c, v, e, mine)));
                }
            }
        }
        Ok(None)
    }

    fn delete_parts(&self, id: &str, save: &str, parts: u32) {
        for i in 0..parts {
            let key = self.part_key(id, save, i);
            if let Ok(Some(d)) = block(self.docs().get_document(&key)) {
                // Best effort: parts nothing lists are harmless.
                let _ = block(self.docs().delete_document(&key, d.version));
            }
        }
    }

    /// Saves checkpoint `id` of `workflow`, following `previous` (in its
    /// chain, when that is a stored checkpoint of the same workflow; else
    /// the checkpoint starts a chain of its own); saving an id again
    /// replaces its body. Returns the chain. Held, and nothing written,
    /// when another live storage holds the chain.
    pub fn put(
        &self,
        id: &str,
        workflow: &str,
        previous: Option<&str>,
        timestamp: &str,
        body: &str,
    ) -> Result<String> {
        self.check_process()?;
        check_name("checkpoint id", id)?;
        check_name("workflow name", workflow)?;
        if let Some(p) = previous {
            check_name("previous checkpoint id", p)?;
        }
        if timestamp.len() > MAX_NAME_BYTES || timestamp.chars().any(char::is_control) {
            return Err(invalid(format!(
                "the timestamp of checkpoint {id:?} must be at most {MAX_NAME_BYTES} bytes without control characters; nothing was written"
            )));
        }
        if body.len() > MAX_BODY_BYTES {
            return Err(GraphError::Store {
                kind: StoreErrorKind::TooLarge,
                message: format!(
                    "checkpoint {id:?} is {} bytes, more than the {MAX_BODY_BYTES} a checkpoint may be; nothing was written",
                    body.len()
                ),
            });
        }
        // The chain, and its document as read to find it (the first try of
        // the compare-and-swap below starts from it).
        let in_workflow = |found: Option<(Chain, u64, Entry)>| {
            found
                .filter(|(c, _, _)| c.workflow == workflow)
                .map(|(c, v, _)| (c, v))
        };
        // An id saved before stays in its run: saving it again replaces it
        // there. An id of another workflow's run is not taken over.
        let mut known = match self.locate(id)? {
            Some((c, _, _)) if c.workflow != workflow => {
                return Err(invalid(format!(
                    "checkpoint id {id:?} already names a checkpoint of workflow {:?}, not {workflow:?}; nothing was written",
                    c.workflow
                )));
            }
            found => in_workflow(found),
        };
        if let (None, Some(p)) = (&known, previous) {
            known = in_workflow(self.locate(p)?);
            if known.is_none() {
                // A predecessor deleted since this store saved it: its run
                // still decides (a stale writer must not start a new run
                // beside it).
                if let Some(c) = self.saved_in(p) {
                    known = self
                        .read_chain(&c)?
                        .filter(|(doc, _)| doc.workflow == workflow);
                }
            }
        }
        let chain = known
            .as_ref()
            .map_or_else(|| id.to_string(), |(c, _)| c.chain.clone());
        // Refused before anything is written when it will be.
        if let Some((doc, _)) = &known {
            self.decide(doc, now_ms(), Some(previous))?;
        }

        // The parts, under a number of this save's own.
        let save = format!("{:016x}", fastrand::u64(..));
        let (text, sealed) = match &self.keys {
            None => (body.to_string(), false),
            Some(k) => {
                use base64::Engine as _;
                let ctx: [&[u8]; 3] = [self.ns.as_bytes(), id.as_bytes(), save.as_bytes()];
                let s = steadfast::seal::seal_blob(k, &ctx, body.as_bytes())
                    .map_err(|e| store_err(&e))?;
                (base64::engine::general_purpose::STANDARD.encode(s), true)
            }
        };
        let pieces = split(&text);
        let count = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
        for (i, piece) in pieces.iter().enumerate() {
            let part = Part {
                id: id.to_string(),
                chain: chain.clone(),
                save: save.clone(),
                index: i as u32,
                text: (*piece).to_string(),
            };
            let value = serde_json::to_value(&part).map_err(|e| invalid(e.to_string()))?;
            if let Err(e) = block(self.docs().put_document(
                &self.part_key(id, &save, i as u32),
                &value,
                None,
            )) {
                self.delete_parts(id, &save, i as u32);
                return Err(store_err(&e));
            }
        }
        let entry = Entry {
            id: id.to_string(),
            save: save.clone(),
            parts: count,
            previous: previous.map(str::to_string),
            timestamp: timestamp.to_string(),
            sealed,
            older: None,
        };

        // Then the chain's document, which lists it: the lease is taken
        // or renewed in the same compare-and-swap.
        for _ in 0..RETRIES {
            let now = now_ms();
            let read = match known.take() {
                Some(k) => Some(k),
                None => self.read_chain(&chain)?,
            };
            let (mut doc, version, generation) = match read {
                None => (
                    Chain {
                        chain: chain.clone(),
                        workflow: workflow.to_string(),
                        holder: String::new(),
                        until: 0,
                        local_until: None,
                        generation: 0,
                        head: None,
                        segments: Vec::new(),
                        retired: Vec::new(),
                        entries: Vec::new(),
                    },
                    None,
                    1,
                ),
                Some((doc, v)) => {
                    if doc.workflow != workflow {
                        self.delete_parts(id, &save, count);
                        return Err(invalid(format!(
                            "checkpoint id {id:?} already names a run of workflow {:?}, not {workflow:?}; nothing was written",
                            doc.workflow
                        )));
                    }
                    match self.decide(&doc, now, Some(previous)) {
                        Ok(g) => (doc, Some(v), g),
                        Err(e) => {
                            self.delete_parts(id, &save, count);
                            return Err(e);
                        }
                    }
                }
            };
            let replacing = |e: &Entry| {
                let mut new = entry.clone();
                new.older = Some(Older {
                    save: e.save.clone(),
                    parts: e.parts,
                });
                new
            };
            // A segment written for this try (removed if the try fails), and
            // segments retired before (removed once it succeeds).
            let (mut written, mut retired) = (None, Vec::new());
            let change = (|| -> Result<Option<Entry>> {
                Ok(match self.find_in(&doc, id)? {
                    Some((None, old)) => {
                        if let Some(e) = doc.entries.iter_mut().find(|e| e.id == id) {
                            *e = replacing(&old);
                        }
                        Some(old)
                    }
                    Some((Some(i), old)) => {
                        let mut entries = (*self.listed_segment(&chain, &doc.segments[i])?).clone();
                        for e in entries.iter_mut().filter(|e| e.id == id) {
                            *e = replacing(&old);
                        }
                        (written, retired) = self.rewrite_segment(&mut doc, i, &entries)?;
                        Some(old)
                    }
                    None => {
                        if doc.entries.len() >= self.segment_size {
                            // The document's checkpoints move to a segment.
                            let key = self.write_segment(&chain, &doc.entries)?;
                            doc.segments.push(key.clone());
                            doc.entries.clear();
                            written = Some(key);
                        }
                        doc.entries.push(entry.clone());
                        None
                    }
                })
            })();
            let replaced = match change {
                Ok(r) => r,
                Err(e) => {
                    self.delete_parts(id, &save, count);
                    return Err(e);
                }
            };
            if replaced.is_none() {
                doc.head = Some(id.to_string());
            }
            doc.holder = self.me.text();
            doc.until = now.saturating_add(self.lease_ms);
            doc.local_until = self.local_until();
            doc.generation = generation;
            match self.write_chain(&doc, version) {
                Ok(true) => {
                    self.took(&chain, generation, Some(id));
                    self.remember(id, &chain);
                    for key in &retired {
                        self.drop_segment(key);
                    }
                    // The parts of the save before the one replaced: a
                    // reader who saw that one listed has long moved on.
                    if let Some(Older { save: s, parts }) = replaced.and_then(|o| o.older) {
                        if s != save {
                            self.delete_parts(id, &s, parts);
                        }
                    }
                    return Ok(chain);
                }
                Ok(false) => {
                    if let Some(key) = written {
                        self.drop_segment(&key);
                    }
                    continue;
                }
                Err(e) => {
                    if !matches!(e, GraphError::Store { .. }) {
                        // Refused before anything was written.
                        self.delete_parts(id, &save, count);
                        if let Some(key) = written {
                            self.drop_segment(&key);
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.delete_parts(id, &save, count);
        Err(GraphError::Store {
            kind: StoreErrorKind::Conflict,
            message: format!(
                "workflow run {chain:?} kept changing under this save ({RETRIES} tries); nothing was written"
            ),
        })
    }

    fn body(&self, chain: &str, entry: &Entry, parts: &[&Part]) -> Result<String> {
        let place = format!("checkpoint {:?} of workflow run {chain:?}", entry.id);
        let corrupt = |reason: String| {
            store_err(&StoreError::Corrupt {
                location: place.clone(),
                reason,
            })
        };
        let mut text = String::new();
        for i in 0..entry.parts {
            let p = parts
                .iter()
                .find(|p| p.index == i)
                .ok_or_else(|| corrupt(format!("part {i} of {} is missing", entry.parts)))?;
            text.push_str(&p.text);
        }
        let Some(k) = &self.keys else {
            if !entry.sealed {
                return Ok(text);
            }
            return Err(corrupt(
                "is encrypted: open the storage with encrypt=True and the key".into(),
            ));
        };
        if !entry.sealed {
            return Err(corrupt(
                "is not sealed (written without encryption, or planted)".into(),
            ));
        }
        use base64::Engine as _;
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| corrupt(format!("is not sealed text: {e}")))?;
        let ctx: [&[u8]; 3] = [
            self.ns.as_bytes(),
            entry.id.as_bytes(),
            entry.save.as_bytes(),
        ];
        let plain =
            steadfast::seal::open_blob(k, &place, &ctx, &sealed).map_err(|e| store_err(&e))?;
        String::from_utf8(plain).map_err(|e| corrupt(format!("is not UTF-8: {e}")))
    }

    fn stored(&self, chain: &Chain, entry: &Entry, parts: &[&Part]) -> Result<Stored> {
        Ok(Stored {
            id: entry.id.clone(),
            chain: chain.chain.clone(),
            workflow: chain.workflow.clone(),
            previous: entry.previous.clone(),
            timestamp: entry.timestamp.clone(),
            body: self.body(&chain.chain, entry, parts)?,
        })
    }

    fn parts_of(&self, id: &str, save: &str) -> Result<Vec<Part>> {
        let prefix = format!("{}{save}/", self.parts_prefix(id));
        let docs = block(self.docs().list_documents(&prefix)).map_err(|e| store_err(&e))?;
        Ok(docs
            .into_iter()
            .filter_map(|d| serde_json::from_value::<Part>(d.value).ok())
            .filter(|p| p.id == id && p.save == save)
            .collect())
    }

    /// Checkpoint `id`, or `None`.
    pub fn get(&self, id: &str) -> Result<Option<Stored>> {
        let mut tries = 0;
        loop {
            let Some((chain, _, entry, read)) = self.locate_reading(id)? else {
                return Ok(None);
            };
            let parts = if read.len() as u64 == u64::from(entry.parts) {
                read
            } else {
                self.parts_of(id, &entry.save)?
            };
            let refs: Vec<&Part> = parts.iter().collect();
            match self.stored(&chain, &entry, &refs) {
                // A save of the same id may have replaced it (and removed
                // its parts) between the two reads: read its listing again.
                Err(_) if tries == 0 && (parts.len() as u64) < u64::from(entry.parts) => {
                    tries += 1;
                }
                other => return other.map(Some),
            }
        }
    }

    /// Takes (or renews) the lease on the chain checkpoint `id` is in, as a
    /// resume from it does; `false` when there is no such checkpoint. Held
    /// when another live storage holds the chain.
    pub fn claim(&self, id: &str) -> Result<bool> {
        self.check_process()?;
        for _ in 0..RETRIES {
            let Some((mut doc, version, _)) = self.locate(id)? else {
                return Ok(false);
            };
            let generation = self.decide(&doc, now_ms(), None)?;
            doc.holder = self.me.text();
            doc.until = now_ms().saturating_add(self.lease_ms);
            doc.local_until = self.local_until();
            doc.generation = generation;
            if self.write_chain(&doc, Some(version))? {
                self.took(&doc.chain, generation, None);
                return Ok(true);
            }
        }
        Err(GraphError::Store {
            kind: StoreErrorKind::Conflict,
            message: format!("the workflow run of checkpoint {id:?} kept changing; not claimed"),
        })
    }

    /// Every checkpoint of `workflow` (each, or why it cannot be read),
    /// chain by chain in save order.
    pub fn list(&self, workflow: &str) -> Result<Vec<Result<Stored>>> {
        let chains = block(self.docs().list_documents(&format!("{}/chain/", self.ns)))
            .map_err(|e| store_err(&e))?;
        let mut out = Vec::new();
        let mut mine: Vec<Chain> = Vec::new();
        for d in chains {
            match serde_json::from_value::<Chain>(d.value) {
                Ok(c) if c.workflow == workflow => mine.push(c),
                Ok(_) => {}
                // Whose it is cannot be told: every listing says so, rather
                // than leave its checkpoints out without a word.
                Err(e) => out.push(Err(store_err(&StoreError::Corrupt {
                    location: format!("document {:?}", d.key),
                    reason: format!("is not a chain of checkpoints: {e}"),
                }))),
            }
        }
        if mine.is_empty() {
            return Ok(out);
        }
        // A few checkpoints: their own parts; many: every part of the
        // namespace in one listing.
        let mut every: Vec<(&Chain, Vec<Entry>)> = Vec::new();
        for c in &mine {
            match self.entries_of(c) {
                Ok(entries) => every.push((c, entries)),
                Err(e) => out.push(Err(e)),
            }
        }
        let wanted: usize = every.iter().map(|(_, e)| e.len()).sum();
        let parts: Vec<Part> = if wanted <= FEW {
            let mut all = Vec::new();
            for (_, entries) in &every {
                for e in entries {
                    all.extend(self.parts_of(&e.id, &e.save)?);
                }
            }
            all
        } else {
            block(self.docs().list_documents(&format!("{}/part/", self.ns)))
                .map_err(|e| store_err(&e))?
                .into_iter()
                .filter_map(|d| serde_json::from_value::<Part>(d.value).ok())
                .collect()
        };
        let mut by_save: HashMap<(&str, &str), Vec<&Part>> = HashMap::new();
        for p in &parts {
            by_save
                .entry((p.id.as_str(), p.save.as_str()))
                .or_default()
                .push(p);
        }
        for (c, entries) in &every {
            for e in entries {
                let found = by_save
                    .get(&(e.id.as_str(), e.save.as_str()))
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                let mut one = self.stored(c, e, found);
                if one.is_err() && (found.len() as u64) < u64::from(e.parts) {
                    // Replaced or deleted since the listing was read: read
                    // it alone.
                    match self.get(&e.id) {
                        Ok(Some(again)) => one = Ok(again),
                        Ok(None) => continue,
                        Err(_) => {}
                    }
                }
                out.push(one);
                self.remember(&e.id, &c.chain);
            }
        }
        Ok(out)
    }

    /// Deletes checkpoint `id`; `false` when there is none. Held when
    /// another live storage holds its chain.
    pub fn delete(&self, id: &str) -> Result<bool> {
        self.check_process()?;
        for _ in 0..RETRIES {
            let Some((mut doc, version, entry)) = self.locate(id)? else {
                return Ok(false);
            };
            self.decide(&doc, now_ms(), None)?;
            let (mut written, mut retired) = (None, Vec::new());
            match self.find_in(&doc, id)? {
                Some((Some(i), _)) => {
                    let mut entries = (*self.listed_segment(&doc.chain, &doc.segments[i])?).clone();
                    entries.retain(|e| e.id != id);
                    (written, retired) = self.rewrite_segment(&mut doc, i, &entries)?;
                }
                _ => doc.entries.retain(|e| e.id != id),
            }
            let outcome = (|| -> Result<(bool, bool)> {
                if doc.head.as_deref() == Some(id) {
                    doc.head = match (doc.entries.last(), doc.segments.last()) {
                        (Some(e), _) => Some(e.id.clone()),
                        (None, Some(key)) => self
                            .listed_segment(&doc.chain, key)?
                            .last()
                            .map(|e| e.id.clone()),
                        (None, None) => None,
                    };
                }
                let empty = doc.entries.is_empty() && doc.segments.is_empty();
                let done = if empty && doc.holder.is_empty() {
                    block(
                        self.docs()
                            .delete_document(&self.chain_key(&doc.chain), version),
                    )
                    .map_err(|e| store_err(&e))?
                } else {
                    self.write_chain(&doc, Some(version))?
                };
                Ok((empty, done))
            })();
            let (empty, done) = match outcome {
                Ok(x) => x,
                Err(e) => {
                    // A refusal wrote nothing: the new segment is no one's.
                    // After a store error the write may have landed.
                    if !matches!(e, GraphError::Store { .. }) {
                        if let Some(key) = &written {
                            self.drop_segment(key);
                        }
                    }
                    return Err(e);
                }
            };
            if !done {
                if let Some(key) = written {
                    self.drop_segment(&key);
                }
                continue;
            }
            for key in &retired {
                self.drop_segment(key);
            }
            if empty && doc.holder.is_empty() {
                // The document is gone: nothing lists its retired segments.
                for r in &doc.retired {
                    self.drop_segment(&r.key);
                }
            }
            self.delete_parts(id, &entry.save, entry.parts);
            if let Some(o) = &entry.older {
                self.delete_parts(id, &o.save, o.parts);
            }
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
            return Ok(true);
        }
        Err(GraphError::Store {
            kind: StoreErrorKind::Conflict,
            message: format!("the workflow run of checkpoint {id:?} kept changing; not deleted"),
        })
    }

    fn release_chain(&self, chain: &str) -> Result<()> {
        for _ in 0..RETRIES {
            let Some((mut doc, version)) = self.read_chain(chain)? else {
                return Ok(());
            };
            if doc.holder != self.me.text() {
                return Ok(());
            }
            doc.holder = String::new();
            doc.until = 0;
            doc.local_until = None;
            let gone = doc.entries.is_empty() && doc.segments.is_empty();
            let done = if gone {
                block(self.docs().delete_document(&self.chain_key(chain), version))
                    .map_err(|e| store_err(&e))?
            } else {
                self.write_chain(&doc, Some(version))?
            };
            if done {
                if gone {
                    for r in &doc.retired {
                        self.drop_segment(&r.key);
                    }
                }
                return Ok(());
            }
        }
        Err(GraphError::Store {
            kind: StoreErrorKind::Conflict,
            message: format!("workflow run {chain:?} kept changing; not released"),
        })
    }

    /// Gives up this store's lease on the chain checkpoint `id` is in.
    pub fn release(&self, id: &str) -> Result<()> {
        self.check_process()?;
        let chain = match self.locate(id)? {
            Some((doc, _, _)) => Some(doc.chain),
            // Deleted since: the run this store knew it in.
            None => self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(id)
                .cloned()
                .or_else(|| self.saved_in(id)),
        };
        if let Some(chain) = chain {
            self.release_chain(&chain)?;
            self.holding
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&chain);
        }
        Ok(())
    }

    /// Gives up every chain this store holds; it stays usable.
    pub fn close(&self) -> Result<()> {
        self.check_process()?;
        let chains: Vec<String> = self
            .holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let mut first = None;
        for c in chains {
            match self.release_chain(&c) {
                Ok(()) => {
                    self.holding
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&c);
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_every_character_and_bounds_each_piece() {
        let text: String = "a\"\u{1}é😀".repeat(PART_BYTES / 3);
        let pieces = split(&text);
        assert!(pieces.len() > 1);
        assert_eq!(pieces.concat(), text);
        for p in &pieces {
            let json = serde_json::to_string(p).unwrap();
            assert!(json.len() <= PART_BYTES + 2, "{}", json.len());
        }
        assert_eq!(split(""), vec![""]);
    }
}
