//! Encryption at rest and tamper evidence for every Steadfast store.
//!
//! [`SealedStore`] wraps any [`Store`]: before a save it encrypts each
//! top-level state value, each step's update and each gate's decision data
//! with AES-256-GCM under the current key of a [`Keyring`]; after a load it
//! opens them and checks them. The stores below see only sealed strings and
//! work as before (deltas, history, group commit, workers).
//!
//! What each seal binds as associated data, so that moving a valid
//! ciphertext is detected:
//! - a state value or step update: the run id, its key and the step that wrote
//!   it (a history record's values must name that record's step);
//! - a gate's data: the run id, the gate and the decision's place;
//! - the whole state: a seal over the run id, the number of completed steps
//!   and every value of the state (in plain text), kept under the state key
//!   `steadfast:seal`. A value changed, removed, added, copied from another
//!   run, or rolled back to an older ciphertext breaks it.
//!
//! Run ids, workflow names, statuses, step names, times, leases, errors and
//! rejection reasons stay in clear text, so that `runs`, `show` and workers
//! work without a key. A whole record replaced by an older copy of itself is
//! not detected (nothing inside the record can tell); see `docs/security.md`.
//!
//! A record that fails to open is [`StoreError::Corrupt`] naming the run and
//! the value, never a fresh start and never a half-opened state. A record
//! written without encryption is refused unless the store was told to
//! [`accept_plaintext`](SealedStore::accept_plaintext) (for a migration).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use serde_json::json;
//! use steadfast_core::{run, update, MemoryStore, Store, Workflow};
//! use steadfast_seal::{Keyring, SealedStore};
//!
//! let keys = Keyring::parse("k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")?;
//! let raw = Arc::new(MemoryStore::new());
//! let store = SealedStore::new(raw.clone(), keys);
//! let wf = Workflow::builder("w")
//!     .step("secret", |_, _| async { update(json!({"token": "hunter2"})) })
//!     .build()?;
//! let state = run("r", &wf, &store).await?.completed().unwrap();
//! assert_eq!(state["token"], "hunter2");
//! // What the store below holds is sealed.
//! let stored = raw.load("r").await?.unwrap();
//! assert!(!serde_json::to_string(&stored.state)?.contains("hunter2"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod blob;
mod keys;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use ring::aead::{Aad, Nonce, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;
use steadfast_core::store::{
    check_head, check_size, check_state, history_of, state_size, Rewrite, RunCache, SaveRequest,
};
use steadfast_core::{
    Blobs, Capabilities, DueRequest, Events, History, NewEvent, RunEvent, Schedule,
};
use steadfast_core::{
    Checkpoint, Clock, ListFilter, RunSummary, State, StepRecord, Store, StoreError,
    StoreErrorKind, StoreExt, SystemClock, Update,
};

pub use crate::blob::{is_sealed_blob, open_blob, seal_blob};
pub use crate::keys::{KeyError, Keyring, KEY_ENV, KEY_FILE_ENV};

/// The state key under which the seal over the whole state is kept.
pub const SEAL_KEY: &str = "steadfast:seal";

/// How every sealed value starts.
const PREFIX: &str = "sf1:";

/// What the seal is of; part of the associated data.
#[derive(Clone, Copy)]
enum Purpose {
    Value,
    State,
    Gate,
    Head,
    Event,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Value => "value",
            Purpose::State => "state",
            Purpose::Gate => "gate",
            Purpose::Head => "head",
            Purpose::Event => "event",
        }
    }
}

/// The associated data: each part length-prefixed, so no two different lists
/// of parts give the same bytes.
fn aad(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// JSON with every object's keys in sorted order, whatever order the map
/// keeps them in: the bytes the state's seal is computed over.
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).expect("a string serializes");
                out.push(b':');
                canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(v, out);
            }
            out.push(b']');
        }
        other => serde_json::to_writer(&mut *out, other).expect("a JSON value serializes"),
    }
}

fn canonical_state(state: &State) -> Vec<u8> {
    let mut out = Vec::new();
    canonical(&Value::Object(state.clone()), &mut out);
    out
}

/// JSON bytes of a part of the head (plain data: it always serializes).
fn json_bytes<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// A sealed value taken apart.
struct Envelope<'a> {
    key_id: &'a str,
    ctx: u64,
    body: &'a str,
}

/// The shortest body: a nonce and a tag, in base64 without padding.
const MIN_BODY: usize = (NONCE_LEN + 16) * 4 / 3 + 1;

/// Takes a sealed value apart, or `None` for anything not shaped exactly as
/// this crate writes them (so that a plain string that merely starts with
/// the prefix is not taken for one).
fn parse_envelope(text: &str) -> Option<Envelope<'_>> {
    let rest = text.strip_prefix(PREFIX)?;
    let mut parts = rest.splitn(3, ':');
    let key_id = parts.next().filter(|id| keys::valid_id(id))?;
    let ctx = parts
        .next()
        .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()?;
    let body = parts.next().filter(|b| {
        b.len() >= MIN_BODY
            && b.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
    })?;
    Some(Envelope { key_id, ctx, body })
}

/// The id of the key `value` was sealed with, if it is sealed.
fn key_of(value: &Value) -> Option<&str> {
    value.as_str().and_then(parse_envelope).map(|e| e.key_id)
}

/// Whether `value` is a sealed value, as this crate writes them.
pub fn is_sealed(value: &Value) -> bool {
    value.as_str().is_some_and(|s| parse_envelope(s).is_some())
}

/// Seals and opens the values of one run.
struct Sealer<'a> {
    keys: &'a Keyring,
    run_id: &'a str,
}

impl Sealer<'_> {
    fn corrupt(&self, place: &str, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            location: format!("run {:?} {place}", self.run_id),
            reason: reason.into(),
        }
    }

    /// What a seal of this run binds besides its plain text.
    fn aad(&self, purpose: Purpose, name: &str, ctx: u64, extra: &[u8]) -> Vec<u8> {
        aad(&[
            b"steadfast-seal-1",
            purpose.as_str().as_bytes(),
            self.run_id.as_bytes(),
            name.as_bytes(),
            ctx.to_string().as_bytes(),
            extra,
        ])
    }

    fn seal(
        &self,
        purpose: Purpose,
        name: &str,
        ctx: u64,
        plain: &[u8],
        extra: &[u8],
    ) -> Result<String, StoreError> {
        let (key_id, key) = self.keys.current_key();
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| {
            StoreError::Unsupported("the system's random number generator failed".into())
        })?;
        let data = self.aad(purpose, name, ctx, extra);
        let mut body = Vec::with_capacity(NONCE_LEN + plain.len() + 16);
        body.extend_from_slice(&nonce);
        body.extend_from_slice(plain);
        let mut sealed = body.split_off(NONCE_LEN);
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(data),
            &mut sealed,
        )
        .map_err(|_| StoreError::InvalidInput("a value is too large to encrypt".into()))?;
        body.extend_from_slice(&sealed);
        Ok(format!(
            "{PREFIX}{key_id}:{ctx}:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(body)
        ))
    }

    /// Opens `text`, sealed for `purpose` and `name`; returns the plain bytes
    /// and the context number it was sealed with.
    fn open(
        &self,
        place: &str,
        purpose: Purpose,
        name: &str,
        text: &str,
        extra: &[u8],
    ) -> Result<(Vec<u8>, u64), StoreError> {
        let env =
            parse_envelope(text).ok_or_else(|| self.corrupt(place, "is not a sealed value"))?;
        let key = self.keys.get(env.key_id).ok_or_else(|| {
            self.corrupt(
                place,
                format!(
                    "was sealed with key {:?}, which is not among the keys given ({})",
                    env.key_id,
                    self.keys.ids().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let mut body = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(env.body)
            .map_err(|_| self.corrupt(place, "is damaged (not base64)"))?;
        if body.len() < NONCE_LEN + 16 {
            return Err(self.corrupt(place, "is damaged (too short)"));
        }
        let mut sealed = body.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&body)
            .map_err(|_| self.corrupt(place, "is damaged (nonce)"))?;
        let data = self.aad(purpose, name, env.ctx, extra);
        let plain = key
            .open_in_place(nonce, Aad::from(data), &mut sealed)
            .map_err(|_| {
                self.corrupt(
                    place,
                    format!(
                        "does not open with key {:?}: it was changed, or moved from another run, step or place",
                        env.key_id
                    ),
                )
            })?;
        Ok((plain.to_vec(), env.ctx))
    }

    /// What the head seal covers, besides the run id: the workflow, status,
    /// wait, decisions (their data sealed), last error, attempts, lease,
    /// spend and the state's seal (which covers the step count and every
    /// value).
    fn head_material(cp: &Checkpoint, state_tag: &str) -> Vec<u8> {
        let audit = json_bytes(&cp.audit);
        let mut parts: Vec<&[u8]> = vec![cp.workflow.as_bytes(), cp.status.as_str().as_bytes()];
        let (wait, decisions, error, attempts, lease) = (
            json_bytes(&cp.wait),
            json_bytes(&cp.decisions),
            json_bytes(&cp.error),
            cp.attempts.to_string(),
            json_bytes(&cp.lease),
        );
        parts.extend([
            &wait[..],
            &decisions[..],
            &error[..],
            attempts.as_bytes(),
            &lease[..],
            state_tag.as_bytes(),
        ]);
        // The audit entries (cancel, retry, rewind, fork) and the origin,
        // when there are any: a head sealed before they existed has the
        // same material.
        if !cp.audit.is_empty() {
            parts.push(&audit);
        }
        let origin = json_bytes(&cp.origin);
        if cp.origin.is_some() {
            parts.push(&origin);
        }
        // The spend record too (a budget raised or a spend lowered in the
        // store would let a run past its budget), when there is one.
        let spend = json_bytes(&cp.spend);
        if cp.spend.is_some() {
            parts.push(b"spend");
            parts.push(&spend);
        }
        // And the place in the queue (a priority raised in the store would
        // let a run jump ahead of others).
        let queue = json_bytes(&cp.queue);
        if cp.queue.is_some() {
            parts.push(b"queue");
            parts.push(&queue);
        }
        aad(&parts)
    }

    fn seal_head(
        &self,
        cp: &Checkpoint,
        version: u64,
        state_tag: &str,
    ) -> Result<String, StoreError> {
        self.seal(
            Purpose::Head,
            "",
            version,
            b"",
            &Self::head_material(cp, state_tag),
        )
    }

    fn seal_value(&self, key: &str, ctx: u64, value: &Value) -> Result<Value, StoreError> {
        let plain = serde_json::to_vec(value).map_err(|e| {
            StoreError::InvalidInput(format!("run {:?}: value {key:?}: {e}", self.run_id))
        })?;
        self.seal(Purpose::Value, key, ctx, &plain, b"")
            .map(Value::String)
    }

    fn open_value(
        &self,
        place: &str,
        key: &str,
        value: &Value,
    ) -> Result<(Value, u64), StoreError> {
        let text = value
            .as_str()
            .ok_or_else(|| self.corrupt(place, "is not a sealed value"))?;
        let (plain, ctx) = self.open(place, Purpose::Value, key, text, b"")?;
        let value = serde_json::from_slice(&plain)
            .map_err(|e| self.corrupt(place, format!("opens to bytes that are not JSON: {e}")))?;
        Ok((value, ctx))
    }
}

/// A store for callers without keys: a record written through a
/// [`SealedStore`] is refused with what to set, instead of being read as
/// plain values (and then resumed, decided or overwritten in clear). Records
/// written without encryption, and listing, work as before.
pub struct RefuseSealed {
    inner: Arc<dyn Store>,
}

impl std::fmt::Debug for RefuseSealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefuseSealed").finish_non_exhaustive()
    }
}

impl RefuseSealed {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        RefuseSealed { inner }
    }

    fn refused(run_id: &str) -> StoreError {
        StoreError::InvalidInput(format!(
            "run {run_id:?} is encrypted: set {KEY_ENV} or {KEY_FILE_ENV} to read or change it"
        ))
    }
}

#[async_trait]
impl Events for RefuseSealed {
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        inner_events(&*self.inner)?
            .append_events(run_id, events)
            .await
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let events = inner_events(&*self.inner)?
            .read_events(run_id, after, limit)
            .await?;
        if events.iter().any(|e| is_sealed(&e.value)) {
            return Err(Self::refused(run_id));
        }
        Ok(events)
    }

    async fn wait_for_events(&self, run_id: &str, timeout: std::time::Duration) {
        inner_wait(&*self.inner, run_id, timeout).await;
    }

    fn append_bounds(&self) -> (usize, u64) {
        inner_bounds(&*self.inner)
    }
}

/// A watcher's pause as the store below makes it (a wrapper declares an
/// event log only when the store below keeps one).
async fn inner_wait(inner: &dyn Store, run_id: &str, timeout: std::time::Duration) {
    if let Some(log) = inner.capabilities().events {
        log.wait_for_events(run_id, timeout).await;
    }
}

/// How much one append to the store below takes.
fn inner_bounds(inner: &dyn Store) -> (usize, u64) {
    inner.capabilities().events.map_or(
        (steadfast_core::store::MAX_EVENTS_PER_APPEND, u64::MAX),
        |l| l.append_bounds(),
    )
}

/// The event log of the store a wrapper wraps (declared: the wrapper
/// declares one only then).
fn inner_events(inner: &dyn Store) -> Result<&dyn Events, StoreError> {
    inner
        .capabilities()
        .events
        .ok_or_else(|| StoreError::Unsupported("the store keeps no event log".into()))
}

/// Whether anything in `cp` was written by a [`SealedStore`].
pub fn is_sealed_record(cp: &Checkpoint) -> bool {
    cp.seal.is_some()
        || cp.state.contains_key(SEAL_KEY)
        || cp.state.values().any(is_sealed)
        || cp
            .decisions
            .iter()
            .any(|d| d.data.as_ref().is_some_and(is_sealed))
}

#[async_trait]
impl Store for RefuseSealed {
    fn capabilities(&self) -> Capabilities<'_> {
        let mut caps = self.inner.capabilities();
        // Its own history: rows pass its check on their way. Its own
        // scheduling: due runs are found on the store underneath, records
        // as stored, so that one record this store refuses never stops a
        // worker from finding the others.
        caps.history = caps.history.map(|_| self as &dyn History);
        caps.schedule = Some(self as &dyn Schedule);
        // Its own event log: sealed events are refused on their way out.
        caps.events = caps.events.map(|_| self as &dyn Events);
        caps
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        match self.inner.load(run_id).await? {
            Some(cp) if is_sealed_record(&cp) => Err(Self::refused(run_id)),
            other => Ok(other),
        }
    }
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        self.inner.save(req).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.inner.list(filter).await
    }
    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.inner.delete_if(run_id, version).await
    }
}

#[async_trait]
impl History for RefuseSealed {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let history = self.inner.history(run_id).await?;
        if history
            .iter()
            .flatten()
            .any(|r| r.update.values().any(is_sealed))
        {
            return Err(Self::refused(run_id));
        }
        Ok(history)
    }
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        // Replaced rows are plain: a sealed row never reaches them, as the
        // history is read (and refused) before anything is rewritten.
        history_of(&*self.inner)?
            .rewrite(run_id, expected, rewrite)
            .await
    }
}

/// What this store last wrote or read of a run's state at `version`: each
/// value in plain text and as sealed, so that a save can keep the sealed form
/// of every value that did not change instead of sealing it again.
struct Known {
    version: u64,
    values: HashMap<String, (Value, Value)>,
    /// Each decision's gate and data, in plain text and as sealed, by
    /// place: a decision's sealed data is kept from save to save (sealed
    /// anew, its nonce would make it new content each time, and a store
    /// with blobs would keep each copy of large data).
    decisions: Arc<[Option<(String, Value, Value)>]>,
}

impl Known {
    /// What a record's decisions are, in plain text (`plain`) and sealed
    /// (`sealed`, the same decisions as stored).
    fn decisions_of(
        plain: &[steadfast_core::Decision],
        sealed: &[Option<Value>],
    ) -> Arc<[Option<(String, Value, Value)>]> {
        plain
            .iter()
            .zip(sealed)
            .map(|(d, s)| match (&d.data, s) {
                (Some(p), Some(s)) if is_sealed(s) => Some((d.gate.clone(), p.clone(), s.clone())),
                _ => None,
            })
            .collect()
    }
}

/// What [`SealedStore::rekey`] did with one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rekeyed {
    /// Everything in it (record and step history) was already sealed with
    /// the current key.
    Current,
    /// It was rewritten under the current key.
    Rewritten,
    /// A live lease holds it, or it changed while being rewritten: left
    /// alone; rekey again later.
    Busy,
    /// No such run.
    Absent,
}

/// A store that seals what it is given and opens what it loads; see the
/// crate's documentation.
pub struct SealedStore {
    inner: Arc<dyn Store>,
    keys: Arc<Keyring>,
    accept_plaintext: bool,
    max_state_bytes: Option<u64>,
    /// Per run: the last version seen and the state's seal then, for the
    /// head seal of a head-only save (whose state the store keeps).
    tags: RunCache<(u64, String)>,
    /// Per run: the sealed values last written or read (see [`Known`]).
    known: RunCache<Arc<Known>>,
}

impl std::fmt::Debug for SealedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedStore")
            .field("keys", &self.keys)
            .field("accept_plaintext", &self.accept_plaintext)
            .finish_non_exhaustive()
    }
}

impl SealedStore {
    /// Wraps `inner`: what is saved through this is sealed with `keys`.
    pub fn new(inner: Arc<dyn Store>, keys: Keyring) -> Self {
        SealedStore {
            inner,
            keys: Arc::new(keys),
            accept_plaintext: false,
            max_state_bytes: None,
            tags: RunCache::new(4096),
            known: RunCache::new(1024),
        }
    }

    /// Limits a run's state before it is sealed (sealing makes it about a
    /// third larger; the store below applies its own limit to that).
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = Some(bytes);
        self
    }

    /// Whether a record written without encryption loads (as it is) instead
    /// of being refused. Off by default; for migrating a store, together
    /// with [`rekey`](Self::rekey).
    pub fn accept_plaintext(mut self, yes: bool) -> Self {
        self.accept_plaintext = yes;
        self
    }

    /// The store below, which holds sealed values.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The keys.
    pub fn keys(&self) -> &Keyring {
        &self.keys
    }

    /// Rewrites run `run_id` under the current key if anything in it was
    /// sealed with another key (or, with
    /// [`accept_plaintext`](Self::accept_plaintext), not sealed at all), by
    /// compare-and-swap. A run running under a live lease is left alone, so
    /// that its worker is not disturbed. Repeating it is harmless: a run
    /// already current is not written.
    pub async fn rekey(&self, run_id: &str) -> Result<Rekeyed, StoreError> {
        let Some(raw) = self.inner.load(run_id).await? else {
            return Ok(Rekeyed::Absent);
        };
        let history = match self.inner.history(run_id).await {
            Ok(h) => h.unwrap_or_default(),
            Err(e) if e.kind() == StoreErrorKind::Unsupported => Vec::new(),
            Err(e) => return Err(e),
        };
        let current = self.keys.current();
        let history_current = history
            .iter()
            .all(|r| r.update.values().all(|v| key_of(v) == Some(current)));
        if self.is_current(&raw) && history_current {
            return Ok(Rekeyed::Current);
        }
        let now = self
            .inner
            .clock()
            .map_or_else(|| SystemClock.now(), |c| c.now());
        // Any live lease: a run loop that holds it (running, or waiting for
        // its timer in process) would lose its next save to the rewrite.
        if raw.lease.as_ref().is_some_and(|l| l.until > now) {
            return Ok(Rekeyed::Busy);
        }
        // The record first: a save without a step also snapshots the state,
        // so that no step record is merged into it by a load any more.
        let plain = self.unseal(raw.clone())?;
        let version = match Store::save(self, SaveRequest::new(&plain, Some(raw.version))).await {
            Ok(v) => v,
            Err(e) if e.kind() == StoreErrorKind::Conflict => return Ok(Rekeyed::Busy),
            Err(e) => return Err(e),
        };
        if history_current || history.is_empty() {
            return Ok(Rekeyed::Rewritten);
        }
        // Then the step records, under the version just written.
        let plain = self.unseal_history(run_id, history)?;
        let resealed = self.seal_history(run_id, &plain)?;
        match self.inner.rewrite_history(run_id, version, &resealed).await {
            Ok(()) => Ok(Rekeyed::Rewritten),
            Err(e) if e.kind() == StoreErrorKind::Conflict => Ok(Rekeyed::Busy),
            // A store that cannot rewrite its history keeps it under the
            // keys it was written with.
            Err(e) if e.kind() == StoreErrorKind::Unsupported => Ok(Rekeyed::Rewritten),
            Err(e) => Err(e),
        }
    }

    /// Step records with each update value sealed for its step.
    fn seal_history(
        &self,
        run_id: &str,
        records: &[StepRecord],
    ) -> Result<Vec<StepRecord>, StoreError> {
        let s = self.sealer(run_id);
        records
            .iter()
            .map(|r| {
                check_state(run_id, "step's update", &r.update)?;
                let mut sealed = r.clone();
                sealed.update = r
                    .update
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), s.seal_value(k, r.index as u64, v)?)))
                    .collect::<Result<_, StoreError>>()?;
                Ok(sealed)
            })
            .collect()
    }

    fn sealer<'a>(&'a self, run_id: &'a str) -> Sealer<'a> {
        Sealer {
            keys: &self.keys,
            run_id,
        }
    }

    /// Whether every sealed part of `raw` uses the current key.
    fn is_current(&self, raw: &Checkpoint) -> bool {
        let current = self.keys.current();
        let ok = |v: &Value| key_of(v) == Some(current);
        raw.state.contains_key(SEAL_KEY)
            && raw
                .seal
                .as_deref()
                .and_then(parse_envelope)
                .map(|e| e.key_id)
                == Some(current)
            && raw.state.values().all(ok)
            && raw.decisions.iter().all(|d| d.data.as_ref().is_none_or(ok))
    }

    /// The sealed form of `cp` (and of the step record it completes).
    fn seal_checkpoint(
        &self,
        cp: &Checkpoint,
        step: Option<&StepRecord>,
        head_only: bool,
        known: Option<&Known>,
    ) -> Result<(Checkpoint, Option<StepRecord>), StoreError> {
        // The store below sees only sealed strings: check what they hide as
        // it would, so that nothing is accepted that cannot be loaded back.
        check_head(cp)?;
        if !head_only {
            check_state(&cp.run_id, "state", &cp.state)?;
            if let Some(limit) = self.max_state_bytes {
                check_size(&cp.run_id, "state", state_size(&cp.state), limit)?;
            }
            if let Some(rec) = step {
                check_state(&cp.run_id, "step's update", &rec.update)?;
            }
        }
        let s = self.sealer(&cp.run_id);
        let mut out = Checkpoint::new(&cp.run_id, cp.workflow.clone(), cp.created_at);
        out.format = cp.format;
        out.status = cp.status;
        out.next = cp.next;
        out.completed = cp.completed.clone();
        out.version = cp.version;
        out.updated_at = cp.updated_at;
        out.attempts = cp.attempts;
        out.error = cp.error.clone();
        out.writer = cp.writer;
        out.lease = cp.lease.clone();
        out.wait = cp.wait.clone();
        out.decisions = cp.decisions.clone();
        out.audit = cp.audit.clone();
        out.origin = cp.origin.clone();
        out.spend = cp.spend.clone();
        out.queue = cp.queue.clone();
        // Not sealed: a forged mark only changes a stuck label.
        out.passed_over = cp.passed_over.clone();
        let current = self.keys.current();
        for (i, d) in out.decisions.iter_mut().enumerate() {
            // Data unchanged since this store last saw the run keeps its
            // sealed form (if sealed with the current key).
            let kept = known
                .and_then(|kn| kn.decisions.get(i)?.as_ref())
                .filter(|(gate, plain, sealed)| {
                    *gate == d.gate
                        && d.data.as_ref() == Some(plain)
                        && key_of(sealed) == Some(current)
                })
                .map(|(_, _, sealed)| sealed.clone());
            if let Some(sealed) = kept {
                d.data = Some(sealed);
                continue;
            }
            if let Some(data) = &d.data {
                let plain = serde_json::to_vec(data).map_err(|e| {
                    StoreError::InvalidInput(format!("run {:?}: gate data: {e}", cp.run_id))
                })?;
                let sealed = s.seal(Purpose::Gate, &d.gate, i as u64, &plain, b"")?;
                d.data = Some(Value::String(sealed));
            }
        }
        if head_only {
            return Ok((out, None));
        }
        if cp.state.contains_key(SEAL_KEY) {
            return Err(StoreError::InvalidInput(format!(
                "run {:?}: the state key {SEAL_KEY:?} is reserved for the seal; nothing was written",
                cp.run_id
            )));
        }
        let tag = Value::String(s.seal(
            Purpose::State,
            "",
            cp.next as u64,
            b"",
            &canonical_state(&cp.state),
        )?);
        let mut sealed_step = None;
        let mut from_step = State::new();
        if let Some(rec) = step {
            let mut update = Update::new();
            for (k, v) in &rec.update {
                let sealed = s.seal_value(k, rec.index as u64, v)?;
                from_step.insert(k.clone(), sealed.clone());
                update.insert(k.clone(), sealed);
            }
            update.insert(SEAL_KEY.into(), tag.clone());
            let mut r = rec.clone();
            r.update = update;
            sealed_step = Some(r);
        }
        let current = self.keys.current();
        for (k, v) in &cp.state {
            // A value unchanged since this store last saw the run keeps its
            // sealed form (if sealed with the current key, for a step the
            // record still has: a rewind lowers `next`); the state's seal
            // still covers it.
            let kept = known
                .and_then(|kn| kn.values.get(k))
                .filter(|(plain, sealed)| {
                    plain == v
                        && key_of(sealed) == Some(current)
                        && sealed
                            .as_str()
                            .and_then(parse_envelope)
                            .is_some_and(|e| e.ctx <= cp.next as u64)
                })
                .map(|(_, sealed)| sealed.clone());
            let sealed = match (from_step.remove(k), kept) {
                (Some(sealed), _) => sealed,
                (None, Some(sealed)) => sealed,
                (None, None) => s.seal_value(k, cp.next as u64, v)?,
            };
            out.state.insert(k.clone(), sealed);
        }
        out.state.insert(SEAL_KEY.into(), tag);
        Ok((out, sealed_step))
    }

    /// Opens a loaded record; see the crate's documentation.
    fn unseal(&self, cp: Checkpoint) -> Result<Checkpoint, StoreError> {
        // Plain text is taken as it is only for a record that has nothing
        // sealed in it at all: one that was written without encryption. A
        // sealed record with plain values in it was tampered with.
        if self.accept_plaintext && !is_sealed_record(&cp) {
            return Ok(cp);
        }
        self.open_record(cp)
    }

    /// The seal of the state stored at version `expected`, from what this
    /// store last saw of the run, or else read from the store. A mismatch
    /// gives an empty seal: the save then conflicts in the store below.
    async fn stored_tag(&self, run_id: &str, expected: Option<u64>) -> Result<String, StoreError> {
        let Some(expected) = expected else {
            return Ok(String::new());
        };
        if let Some((v, tag)) = self.tags.get(run_id) {
            if v == expected {
                return Ok(tag);
            }
        }
        Ok(match self.inner.load(run_id).await? {
            Some(raw) if raw.version == expected => raw
                .state
                .get(SEAL_KEY)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        })
    }

    fn open_record(&self, mut cp: Checkpoint) -> Result<Checkpoint, StoreError> {
        let run_id = cp.run_id.clone();
        let s = self.sealer(&run_id);
        // What the head seal covers, taken before anything is opened; it is
        // checked last, so that a changed value is named as such.
        let state_tag = cp
            .state
            .get(SEAL_KEY)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let head_seal = cp.seal.take();
        let material = Sealer::head_material(&cp, &state_tag);
        let plaintext = |place: String| {
            s.corrupt(
                &place,
                "is not encrypted although encryption is on (written without a key?); \
                 to encrypt such records, run `steadfast rekey --migrate-plaintext` \
                 (SealedStore::accept_plaintext)",
            )
        };
        for (i, d) in cp.decisions.iter_mut().enumerate() {
            let Some(data) = &d.data else { continue };
            let place = format!("gate {:?} data", d.gate);
            match data.as_str().filter(|t| parse_envelope(t).is_some()) {
                Some(text) => {
                    let (plain, ctx) = s.open(&place, Purpose::Gate, &d.gate, text, b"")?;
                    if ctx != i as u64 {
                        return Err(s.corrupt(&place, "belongs to another decision"));
                    }
                    d.data = Some(serde_json::from_slice(&plain).map_err(|e| {
                        s.corrupt(&place, format!("opens to bytes that are not JSON: {e}"))
                    })?);
                }
                None => return Err(plaintext(place)),
            }
        }
        let tag = cp.state.remove(SEAL_KEY);
        let mut state = State::new();
        for (k, v) in std::mem::take(&mut cp.state) {
            let place = format!("state[{k:?}]");
            if !is_sealed(&v) {
                return Err(plaintext(place));
            }
            let (value, ctx) = s.open_value(&place, &k, &v)?;
            if ctx > cp.next as u64 {
                return Err(s.corrupt(&place, "was sealed for a later step than the record has"));
            }
            state.insert(k, value);
        }
        match tag.as_ref().and_then(Value::as_str) {
            Some(text) => {
                let (_, ctx) = s
                    .open("state", Purpose::State, "", text, &canonical_state(&state))
                    .map_err(|_| {
                        s.corrupt(
                            "state",
                            "does not match its seal: a value was changed, removed, added, \
                         or rolled back to an older one",
                        )
                    })?;
                if ctx != cp.next as u64 {
                    return Err(s.corrupt(
                        "state",
                        format!(
                            "was sealed after step {ctx} but the record says {} steps are done: \
                             a state was rolled back or moved",
                            cp.next
                        ),
                    ));
                }
            }
            None => return Err(plaintext("state".into())),
        }
        // The head: status, wait, decisions, lease, error and, through the
        // state's seal, the step count and every value.
        let Some(head_seal) = head_seal else {
            return Err(plaintext("head".into()));
        };
        let (_, ctx) = s
            .open("head", Purpose::Head, "", &head_seal, &material)
            .map_err(|e| match e {
                StoreError::Corrupt { reason, .. } if reason.contains("does not open") => s
                    .corrupt(
                    "head",
                    "does not match its seal: its status, wait, decisions, lease, error, audit or step \
                     count was changed, or its state was replaced",
                ),
                other => other,
            })?;
        if ctx != cp.version {
            return Err(s.corrupt(
                "head",
                format!(
                    "was sealed for version {ctx} but is stored as version {}: a record was moved or rolled back",
                    cp.version
                ),
            ));
        }
        cp.state = state;
        Ok(cp)
    }

    fn unseal_history(
        &self,
        run_id: &str,
        records: Vec<StepRecord>,
    ) -> Result<Vec<StepRecord>, StoreError> {
        let s = self.sealer(run_id);
        records
            .into_iter()
            .map(|mut r| {
                // A record written without encryption, taken as it is only
                // when migrating, and only if nothing in it is sealed.
                if self.accept_plaintext && !r.update.values().any(is_sealed) {
                    return Ok(r);
                }
                let mut update = Update::new();
                for (k, v) in std::mem::take(&mut r.update) {
                    if k == SEAL_KEY {
                        continue;
                    }
                    let place = format!("step {} update[{k:?}]", r.index);
                    let (value, ctx) = s.open_value(&place, &k, &v)?;
                    if ctx != r.index as u64 {
                        return Err(s.corrupt(&place, format!("was sealed for step {ctx}")));
                    }
                    update.insert(k, value);
                }
                r.update = update;
                Ok(r)
            })
            .collect()
    }
}

/// The blobs of the store underneath (sealed values are stored there, each
/// once), for `show` and `gc`.
#[async_trait]
impl Blobs for SealedStore {
    async fn usage(&self, run_id: &str) -> Result<Option<steadfast_core::Usage>, StoreError> {
        self.inner.usage(run_id).await
    }

    async fn blob_totals(&self) -> Result<steadfast_core::BlobTotals, StoreError> {
        Ok(self.inner.blob_totals().await?.unwrap_or_default())
    }

    /// Every plain value counts in full: the store underneath applies its
    /// threshold to sealed values, which are larger and not known before
    /// they are sealed, and this store's own limit is on the plain state.
    fn threshold(&self) -> u64 {
        u64::MAX
    }

    fn shared_across_runs(&self) -> bool {
        self.inner
            .capabilities()
            .blobs
            .is_none_or(|b| b.shared_across_runs())
    }

    /// The store underneath's: what it leaves is sealed or not alike.
    async fn collect_leftovers(
        &self,
        dry_run: bool,
    ) -> Result<steadfast_core::Leftovers, StoreError> {
        self.inner.collect_leftovers(dry_run).await
    }
}

#[async_trait]
impl Events for SealedStore {
    /// Checks the plain events, then seals each value for its run, step,
    /// attempt, time and mark of an execution's first event (not its
    /// number, which the store below gives it: events of one execution can
    /// be reordered among themselves by someone who can write the store):
    /// the store below sees sealed strings (whose size, larger
    /// than the plain value's, its own limit applies to).
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        steadfast_core::store::check_events(run_id, events)?;
        let s = self.sealer(run_id);
        let sealed = events
            .iter()
            .map(|e| {
                let plain = serde_json::to_vec(&e.value).map_err(|err| {
                    StoreError::InvalidInput(format!("run {run_id:?}: an event's value: {err}"))
                })?;
                let mut out = e.clone();
                out.value = Value::String(s.seal(
                    Purpose::Event,
                    &e.step,
                    u64::from(e.attempt),
                    &plain,
                    &event_material(e.at, e.first),
                )?);
                Ok(out)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        inner_events(&*self.inner)?
            .append_events(run_id, &sealed)
            .await
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let s = self.sealer(run_id);
        inner_events(&*self.inner)?
            .read_events(run_id, after, limit)
            .await?
            .into_iter()
            .map(|mut e| {
                let place = format!("event {}", e.seq);
                let text = e
                    .value
                    .as_str()
                    .ok_or_else(|| s.corrupt(&place, "is not a sealed value"))?;
                let (plain, ctx) = s.open(
                    &place,
                    Purpose::Event,
                    &e.step,
                    text,
                    &event_material(e.at, e.first),
                )?;
                if ctx != u64::from(e.attempt) {
                    return Err(s.corrupt(&place, "was sealed for another attempt of its step"));
                }
                e.value = serde_json::from_slice(&plain).map_err(|err| {
                    s.corrupt(&place, format!("opens to bytes that are not JSON: {err}"))
                })?;
                Ok(e)
            })
            .collect()
    }

    async fn wait_for_events(&self, run_id: &str, timeout: std::time::Duration) {
        inner_wait(&*self.inner, run_id, timeout).await;
    }

    /// The store below's, in plain bytes: a sealed value is its plain
    /// JSON's base64 (a third more) and an envelope.
    fn append_bounds(&self) -> (usize, u64) {
        let (n, bytes) = inner_bounds(&*self.inner);
        if bytes == u64::MAX {
            return (n, bytes);
        }
        (n, (bytes / 4 * 3).saturating_sub(n as u64 * 256))
    }
}

/// What an event's seal binds besides its run, step and attempt: its time
/// and whether it opens an execution (its number is given by the store
/// below, after it was sealed).
fn event_material(at: steadfast_core::Timestamp, first: bool) -> Vec<u8> {
    format!("{}:{}", at.unix_millis(), u8::from(first)).into_bytes()
}

#[async_trait]
impl Store for SealedStore {
    fn capabilities(&self) -> Capabilities<'_> {
        let mut caps = self.inner.capabilities();
        // Its own history: rows are sealed and opened on their way. Its own
        // scheduling: due runs are found on the store underneath (heads
        // need no key), so that one record that does not open never stops a
        // worker from finding the others, and nothing is opened to look.
        caps.history = caps.history.map(|_| self as &dyn History);
        caps.schedule = Some(self as &dyn Schedule);
        // Its own limit on the plain state, else the inner store's, which
        // limits the sealed state (larger): a further limit within that.
        caps.max_state_bytes = self.max_state_bytes.or(caps.max_state_bytes);
        // The inner store's blobs, with the threshold its own limit counts.
        caps.blobs = caps.blobs.map(|_| self as &dyn Blobs);
        // Its own event log: each value sealed for its run, step and
        // attempt on the way in, opened on the way out.
        caps.events = caps.events.map(|_| self as &dyn Events);
        caps
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        match self.inner.load(run_id).await? {
            Some(cp) => {
                // A version this store neither wrote nor read before: its
                // history rows are opened too, so that a row moved from
                // another run or step is Corrupt here, before a run goes
                // on (or a gate is decided) on top of a history that could
                // never be shown or exported again.
                let verify_rows = cp.next > 0
                    && self
                        .known
                        .get(run_id)
                        .is_none_or(|k| k.version != cp.version);
                let tag = cp
                    .state
                    .get(SEAL_KEY)
                    .and_then(Value::as_str)
                    .map(String::from);
                let version = cp.version;
                let sealed_state = cp.state.clone();
                let sealed_decisions: Vec<Option<Value>> =
                    cp.decisions.iter().map(|d| d.data.clone()).collect();
                let opened = self.unseal(cp)?;
                if verify_rows {
                    match StoreExt::history(self, run_id).await {
                        Ok(_) => {}
                        Err(e) if e.kind() == StoreErrorKind::Unsupported => {}
                        Err(e) => return Err(e),
                    }
                }
                self.tags.set(run_id, tag.map(|t| (version, t)));
                let values = opened
                    .state
                    .iter()
                    .filter_map(|(k, plain)| {
                        sealed_state
                            .get(k)
                            .filter(|v| is_sealed(v))
                            .map(|sealed| (k.clone(), (plain.clone(), sealed.clone())))
                    })
                    .collect();
                let decisions = Known::decisions_of(&opened.decisions, &sealed_decisions);
                self.known.set(
                    run_id,
                    Some(Arc::new(Known {
                        version,
                        values,
                        decisions,
                    })),
                );
                Ok(Some(opened))
            }
            None => Ok(None),
        }
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let run_id = req.checkpoint.run_id.as_str();
        let known = self
            .known
            .get(run_id)
            .filter(|k| Some(k.version) == req.expected);
        let (mut cp, step) =
            self.seal_checkpoint(req.checkpoint, req.step, req.head_only, known.as_deref())?;
        // The head seal covers the state's seal: a head-only save keeps the
        // stored state, so it takes the stored state's seal.
        let state_tag = if req.head_only {
            self.stored_tag(run_id, req.expected).await?
        } else {
            cp.state
                .get(SEAL_KEY)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        cp.seal = Some(
            self.sealer(run_id)
                .seal_head(&cp, req.new_version(), &state_tag)?,
        );
        let mut sealed = SaveRequest::new(&cp, req.expected);
        sealed.write_version = req.write_version;
        if req.head_only {
            sealed = sealed.head_only();
        }
        if let Some(step) = &step {
            sealed = sealed.with_step(step);
        }
        let version = match self.inner.save(sealed).await {
            Ok(v) => v,
            Err(e) => {
                self.known.set(run_id, None);
                return Err(e);
            }
        };
        self.tags.set(run_id, Some((version, state_tag)));
        let sealed_decisions: Vec<Option<Value>> =
            cp.decisions.iter().map(|d| d.data.clone()).collect();
        let decisions = Known::decisions_of(&req.checkpoint.decisions, &sealed_decisions);
        let now_known = if req.head_only {
            known.map(|k| Known {
                version,
                values: k.values.clone(),
                decisions,
            })
        } else {
            Some(Known {
                version,
                decisions,
                values: req
                    .checkpoint
                    .state
                    .iter()
                    .filter_map(|(k, plain)| {
                        cp.state
                            .get(k)
                            .map(|sealed| (k.clone(), (plain.clone(), sealed.clone())))
                    })
                    .collect(),
            })
        };
        self.known.set(run_id, now_known.map(Arc::new));
        Ok(version)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.inner.list(filter).await
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.inner.delete_if(run_id, version).await
    }
}

#[async_trait]
impl History for SealedStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        match self.inner.history(run_id).await? {
            Some(records) => self.unseal_history(run_id, records).map(Some),
            None => Ok(None),
        }
    }
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let sealed = self.seal_history(run_id, rewrite.records())?;
        let rewrite = rewrite.with_records(run_id, &sealed)?;
        history_of(&*self.inner)?
            .rewrite(run_id, expected, rewrite)
            .await
    }
}

/// Due runs of a wrapping store are found on the store underneath: nothing
/// is opened to look, so one run that cannot be opened stops no worker.
macro_rules! schedule_underneath {
    ($($wrapper:ty),*) => {$(
        #[async_trait]
        impl Schedule for $wrapper {
            async fn claim_due(&self, due: &DueRequest<'_>) -> Result<Vec<RunSummary>, StoreError> {
                self.inner.claim_due(due).await
            }
            async fn wait_for_work(&self, timeout: std::time::Duration) {
                self.inner.wait_for_work(timeout).await
            }
        }
    )*};
}

schedule_underneath!(RefuseSealed, SealedStore);
