//! An in-process store for tests and examples.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::record::events::{NewEvent, RunEvent};
use crate::store::blob::{self, Blob, BlobHash, Resolver};
use crate::store::image::{RunImage, Write};
use crate::store::rows::Place;
use crate::store::{
    BlobTotals, Blobs, Capabilities, Document, Documents, Events, History, ListFilter, Rewrite,
    RunSummary, SaveRequest, Store, Usage,
};

/// The default state size limit of [`MemoryStore`]: 64 MiB.
pub const DEFAULT_MEMORY_STATE_LIMIT: u64 = 64 << 20;

/// A store that keeps checkpoints in this process's memory. Nothing survives the
/// process: use it for tests and examples (URL `memory:`). Clones share the
/// same runs.
///
/// By default values are kept as given. [`MemoryStore::with_blobs`] (URL
/// `memory:?blob_threshold=SIZE`) keeps values whose JSON text is longer
/// than a threshold as blobs, as the durable stores do: each content once
/// for the whole store, the record holding a reference, the blob freed when
/// no record or history row refers to it any more; loads put the values
/// back.
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
    kept: Arc<Mutex<Kept>>,
    state_limit: u64,
    /// Values longer than this are kept as blobs (`None`: kept as given).
    blob_threshold: Option<u64>,
}

/// What a [`MemoryStore`] holds: its records (with references in place of
/// large values, when it keeps blobs) and its blobs' JSON texts.
#[derive(Debug, Default)]
struct Kept {
    image: RunImage,
    blobs: BTreeMap<BlobHash, Arc<String>>,
}

impl Kept {
    /// Changes run `run_id`'s records with `change`, which gives back its
    /// result and the blobs the change refers to; keeps those blobs and
    /// frees what no record refers to any more ([`sweep_after`](Self::sweep_after)).
    /// The writes of a run that may bring or drop references go through
    /// here, in one locked section. Only a blob the store holds can be
    /// freed: while it holds none, the run's references are not walked (a
    /// store without blobs never holds one).
    fn update<R>(
        &mut self,
        run_id: &str,
        change: impl FnOnce(&mut RunImage) -> Result<(R, Vec<Blob>), StoreError>,
    ) -> Result<R, StoreError> {
        let before = if self.blobs.is_empty() {
            Vec::new()
        } else {
            self.image.refs_of_run(run_id)
        };
        let (out, blobs) = change(&mut self.image)?;
        let added = self.add(blobs);
        self.sweep_after(run_id, &before, &added);
        Ok(out)
    }

    /// Keeps `blobs` (each content once); returns their names.
    fn add(&mut self, blobs: Vec<Blob>) -> Vec<BlobHash> {
        let mut names = Vec::with_capacity(blobs.len());
        for b in blobs {
            names.push(b.hash);
            self.blobs.entry(b.hash).or_insert(b.text);
        }
        names
    }

    /// Frees the blobs no record or history row refers to any more, after a
    /// write that changed run `run_id` alone: `before` is what the run
    /// referred to before it, `added` the blobs the write brought. Only a
    /// reference the run dropped, or a blob of the write that the run does
    /// not refer to after all (a row the write did not keep), can have left
    /// a blob without one; otherwise nothing is looked at.
    fn sweep_after(&mut self, run_id: &str, before: &[(BlobHash, u64)], added: &[BlobHash]) {
        if before.is_empty() && added.is_empty() {
            return;
        }
        let now = self.image.refs_of_run(run_id);
        let dropped = before.iter().any(|r| !now.contains(r));
        let unused = added.iter().any(|h| !now.iter().any(|(n, _)| n == h));
        if !dropped && !unused {
            return;
        }
        let live = self.image.all_refs();
        self.blobs.retain(|hash, _| live.contains_key(hash));
    }

    /// The texts of the blobs `refs` name, those the store holds: taken
    /// under the lock, so that the values can be put back without it.
    fn texts(&self, refs: Vec<(BlobHash, u64)>) -> BTreeMap<BlobHash, Arc<String>> {
        refs.into_iter()
            .filter_map(|(h, _)| self.blobs.get(&h).map(|t| (h, Arc::clone(t))))
            .collect()
    }
}

/// `value` with its references put back from `texts` (what
/// [`Kept::texts`] took for it), outside the store's lock.
fn resolved<T>(
    run_id: &str,
    texts: &BTreeMap<BlobHash, Arc<String>>,
    mut value: T,
    resolve: impl FnOnce(&mut T, &Place<'_>, &mut Resolver<'_>) -> Result<(), StoreError>,
) -> Result<T, StoreError> {
    let locate = |column: &str| format!("memory store, run {run_id:?}, {column}");
    let place = Place::new(run_id, &locate);
    let mut fetch = |h: &BlobHash, _: u64| Ok(texts.get(h).map(|t| t.as_bytes().to_vec()));
    let mut resolver = Resolver::new(&mut fetch);
    resolve(&mut value, &place, &mut resolver)?;
    Ok(value)
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
            kept: Arc::new(Mutex::new(Kept::default())),
            state_limit: bytes,
            blob_threshold: None,
        }
    }

    /// An empty store (with the default state limit) that keeps values
    /// whose JSON text is longer than `threshold` bytes as blobs, each
    /// content once (see [the type](MemoryStore)). A threshold out of
    /// [`MIN_BLOB_THRESHOLD`](blob::MIN_BLOB_THRESHOLD)`..=`[`MAX_BLOB_BYTES`](blob::MAX_BLOB_BYTES)
    /// is refused.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use steadfast_core::{Checkpoint, MemoryStore, Store, StoreExt, Timestamp};
    /// use steadfast_core::store::SaveRequest;
    /// let store = MemoryStore::with_blobs(64 << 10).unwrap();
    /// let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(0));
    /// cp.state.insert("doc".into(), "x".repeat(100_000).into());
    /// store.save(SaveRequest::new(&cp, None)).await.unwrap();
    /// assert_eq!(store.load("r").await.unwrap().unwrap().state, cp.state);
    /// assert_eq!(store.blob_totals().await.unwrap().unwrap().blobs, 1);
    /// # });
    /// ```
    pub fn with_blobs(threshold: u64) -> Result<Self, StoreError> {
        Self::new().blob_threshold(threshold)
    }

    /// This new store, keeping values whose JSON text is longer than
    /// `threshold` bytes as blobs ([`with_blobs`](Self::with_blobs), with
    /// the state limit this store was made with). Refused for a store that
    /// holds anything already (its records were kept without references)
    /// or that has clones (they would read the same records without
    /// blobs): call it on the store just made.
    pub fn blob_threshold(self, threshold: u64) -> Result<Self, StoreError> {
        let threshold = blob::check_threshold(threshold)?;
        let empty = {
            let kept = self.kept();
            kept.image.runs.is_empty()
                && kept.image.events.is_empty()
                && kept.image.documents.is_empty()
        };
        if !empty || Arc::strong_count(&self.kept) > 1 {
            return Err(StoreError::InvalidInput(
                "only a memory store just made, with no clone, can start keeping blobs: make a new one".into(),
            ));
        }
        Ok(MemoryStore {
            blob_threshold: Some(threshold),
            ..self
        })
    }

    /// Removes every blob the store holds, as a damaged disk would, and
    /// returns how many; for the conformance suite's check that a missing
    /// blob is damage, never a value.
    #[doc(hidden)]
    pub fn lose_blobs(&self) -> u64 {
        let mut kept = self.kept();
        let n = kept.blobs.len() as u64;
        kept.blobs.clear();
        n
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while holding the lock cannot leave a half-written record:
        // the image checks everything before it changes anything, and a
        // write's blobs are added in the same locked section as the records
        // that refer to them (nothing between the two can panic).
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities<'_> {
        let caps = Capabilities::none()
            .history(self)
            .max_state_bytes(self.state_limit)
            .events(self)
            .documents(self);
        match self.blob_threshold {
            Some(_) => caps.blobs(self),
            None => caps,
        }
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let (cp, texts) = {
            let kept = self.kept();
            let Some(cp) = kept.image.runs.get(run_id).cloned() else {
                return Ok(None);
            };
            if self.blob_threshold.is_none() || !blob::record_holds_marks(&cp) {
                return Ok(Some(cp));
            }
            let texts = kept.texts(kept.image.refs_of_record(run_id));
            (cp, texts)
        };
        resolved(run_id, &texts, cp, |cp, place, resolver| {
            resolver.resolve_record(cp, place)
        })
        .map(Some)
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        // Nothing here is serialized, but a record that another store could
        // not read back is refused alike, so tests on memory catch it.
        let Some(threshold) = self.blob_threshold else {
            let write = Write::checked(&req, self.state_limit)?;
            return self.kept().image.save(write);
        };
        let run_id = req.checkpoint.run_id.as_str();
        // As the file store: a step after the stored one writes only its
        // update's values; should the stored record not be the one it
        // follows, the whole state is written below.
        if let Some((write, blobs)) =
            Write::after_step_with_blobs(&req, self.state_limit, threshold)?
        {
            let saved = self.kept().update(run_id, |image| {
                Ok(match image.try_save(write)? {
                    Some(version) => (Some(version), blobs),
                    None => (None, Vec::new()),
                })
            })?;
            if let Some(version) = saved {
                return Ok(version);
            }
        }
        let (write, blobs) = Write::checked_with_blobs(&req, self.state_limit, threshold)?;
        self.kept()
            .update(run_id, |image| Ok((image.save(write)?, blobs)))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self.kept().image.list(filter))
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.kept()
            .update(run_id, |image| Ok((image.delete(run_id), Vec::new())))
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.kept().update(run_id, |image| {
            Ok((image.delete_if(run_id, version)?, Vec::new()))
        })
    }
}

#[async_trait]
impl Blobs for MemoryStore {
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError> {
        Ok(self.kept().image.usage(run_id))
    }

    async fn blob_totals(&self) -> Result<BlobTotals, StoreError> {
        let kept = self.kept();
        let bytes = kept.blobs.values().map(|t| t.len() as u64).sum();
        Ok(BlobTotals::new(kept.blobs.len() as u64, bytes))
    }

    fn threshold(&self) -> u64 {
        self.blob_threshold.unwrap_or(blob::MAX_BLOB_BYTES)
    }
}

#[async_trait]
impl Events for MemoryStore {
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        self.kept().image.append_events(run_id, events)
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        Ok(self.kept().image.read_events(run_id, after, limit))
    }
}

#[async_trait]
impl Documents for MemoryStore {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        Ok(self.kept().image.get_document(key))
    }

    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.kept().image.put_document(key, value, expected)
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        Ok(self.kept().image.list_documents(prefix))
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        Ok(self.kept().image.delete_document(key, expected))
    }
}

#[async_trait]
impl History for MemoryStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let (rows, texts) = {
            let kept = self.kept();
            let Some(rows) = kept.image.history(run_id) else {
                return Ok(None);
            };
            if self.blob_threshold.is_none() || !rows.iter().any(|r| blob::holds_marks(&r.update)) {
                return Ok(Some(rows));
            }
            let refs = rows.iter().flat_map(|r| blob::refs_of(&r.update)).collect();
            let texts = kept.texts(refs);
            (rows, texts)
        };
        resolved(run_id, &texts, rows, |rows, place, resolver| {
            resolver.resolve_rows(rows, place, |i| format!("history[{i}].update"))
        })
        .map(Some)
    }

    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let Some(threshold) = self.blob_threshold else {
            return self.kept().image.rewrite(run_id, expected, rewrite);
        };
        // The rows as the store keeps them: large values as references.
        let mut blobs = Vec::new();
        let records = blob::encode_rows(rewrite.records(), threshold, run_id, &mut blobs)?;
        let rewrite = rewrite.with_records(run_id, &records)?;
        self.kept().update(run_id, |image| {
            Ok((image.rewrite(run_id, expected, rewrite)?, blobs))
        })
    }
}

/// The memory store as a backend: `memory:`, or `memory:?blob_threshold=SIZE`
/// for one that keeps large values as blobs ([`MemoryStore::with_blobs`]).
pub const BACKEND: crate::store::backend::Backend = crate::store::backend::Backend::new(
    "memory",
    &["memory"],
    "memory:[?blob_threshold=SIZE]",
    "in this process only, for tests and examples",
    |_, rest, _| Box::pin(std::future::ready(open(rest))),
);

/// A memory store from what follows `memory:` in its URL.
fn open(rest: &str) -> Result<Arc<dyn Store>, StoreError> {
    let (path, threshold) = blob::split_url_options("memory:", rest)?;
    if !path.is_empty() {
        return Err(StoreError::InvalidInput(
            "memory: takes nothing after the colon but ?blob_threshold=SIZE".into(),
        ));
    }
    Ok(match threshold {
        Some(t) => Arc::new(MemoryStore::with_blobs(t)?),
        None => Arc::new(MemoryStore::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    fn run_with(id: &str, key: &str, value: &str) -> Checkpoint {
        let mut cp = Checkpoint::new(id, "w", Timestamp::from_unix_millis(0));
        cp.state.insert(key.into(), value.into());
        cp
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    /// One content held by two runs is kept once, counted as shared by
    /// both, and freed with the last run that refers to it; values come
    /// back as saved.
    #[test]
    fn a_content_is_kept_once_and_freed_with_its_last_reference() {
        block(async {
            let store = MemoryStore::with_blobs(1024).unwrap();
            let doc = "d".repeat(10_000);
            let (a, b) = (run_with("a", "doc", &doc), run_with("b", "doc", &doc));
            let va = store.save(SaveRequest::new(&a, None)).await.unwrap();
            store.save(SaveRequest::new(&b, None)).await.unwrap();
            let totals = Blobs::blob_totals(&store).await.unwrap();
            assert_eq!((totals.blobs, totals.bytes), (1, 10_002));
            let usage = Blobs::usage(&store, "a").await.unwrap().unwrap();
            assert_eq!(
                (usage.blobs, usage.blob_bytes, usage.shared_bytes),
                (1, 10_002, 10_002)
            );
            assert!(usage.record_bytes < 1_000, "{usage:?}");
            assert_eq!(store.load("a").await.unwrap().unwrap().state, a.state);
            // A new value in place of the document: still held by b.
            let mut a2 = a.clone();
            a2.state.insert("doc".into(), "small".into());
            store.save(SaveRequest::new(&a2, Some(va))).await.unwrap();
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 1);
            let usage = Blobs::usage(&store, "b").await.unwrap().unwrap();
            assert_eq!(usage.shared_bytes, 0, "b alone refers to it now");
            assert!(store.delete("b").await.unwrap());
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 0);
            assert_eq!(store.load("a").await.unwrap().unwrap().state, a2.state);
        })
    }

    /// Values that look like references are kept as given, with blobs or
    /// without; a lost blob is damage naming the run.
    #[test]
    fn look_alikes_come_back_and_a_lost_blob_is_damage() {
        block(async {
            let fake = r#"{"$blob":"sha256:0000000000000000000000000000000000000000000000000000000000000000","bytes":3}"#;
            for store in [MemoryStore::new(), MemoryStore::with_blobs(1024).unwrap()] {
                let mut cp = run_with("r", "x", "y");
                cp.state
                    .insert("fake".into(), serde_json::from_str(fake).unwrap());
                store.save(SaveRequest::new(&cp, None)).await.unwrap();
                assert_eq!(store.load("r").await.unwrap().unwrap().state, cp.state);
            }
            let store = MemoryStore::with_blobs(1024).unwrap();
            let cp = run_with("r", "doc", &"d".repeat(5_000));
            store.save(SaveRequest::new(&cp, None)).await.unwrap();
            assert_eq!(store.lose_blobs(), 1);
            let err = store.load("r").await.unwrap_err();
            assert_eq!(err.kind(), crate::StoreErrorKind::Corrupt, "{err}");
            assert!(err.to_string().contains("\"r\""), "{err}");
        })
    }

    /// Steps whose updates are large: the step-only save, its history read
    /// back, a rewrite and a fold, a delete_if, and a step row the save does
    /// not keep (its index past the run's next), whose blob goes with it.
    #[test]
    fn steps_rewrites_and_rows_not_kept_free_what_they_leave() {
        block(async {
            let store = MemoryStore::with_blobs(1024).unwrap();
            let at = Timestamp::from_unix_millis(0);
            let mut cp = run_with("r", "k", "v");
            let mut version = None;
            let mut rows = Vec::new();
            for i in 0..3usize {
                let doc = format!("{i}").repeat(3_000);
                let mut update = serde_json::Map::new();
                update.insert(format!("s{i}"), doc.clone().into());
                cp.state.insert(format!("s{i}"), doc.into());
                cp.completed.push(format!("s{i}"));
                cp.next = i + 1;
                let row = StepRecord::new(i, &format!("s{i}"), update, 1, at, at);
                version = Some(
                    store
                        .save(SaveRequest::new(&cp, version).with_step(&row))
                        .await
                        .unwrap(),
                );
                rows.push(row);
            }
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 3);
            assert_eq!(store.load("r").await.unwrap().unwrap().state, cp.state);
            let history = History::history(&store, "r").await.unwrap().unwrap();
            assert_eq!(history, rows);
            // Rows 1 and 2 replaced by one small row: their contents stay
            // while the state holds them, and go with the run.
            let mut small = serde_json::Map::new();
            small.insert("s1".into(), 1.into());
            let replaced = vec![
                rows[0].clone(),
                StepRecord::new(1, "s1", small, 1, at, at),
                rows[2].clone(),
            ];
            let v = version.unwrap();
            History::rewrite(&store, "r", v, Rewrite::replace("r", &replaced).unwrap())
                .await
                .unwrap();
            assert_eq!(
                History::history(&store, "r").await.unwrap().unwrap(),
                replaced
            );
            let v = store.load("r").await.unwrap().unwrap().version;
            assert!(
                store.delete_if("r", v + 1).await.is_err(),
                "a stale version"
            );
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 3);
            assert!(store.delete_if("r", v).await.unwrap());
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 0);

            // A step row past the record's next is not kept: nor is its blob.
            let mut update = serde_json::Map::new();
            update.insert("late".into(), "z".repeat(3_000).into());
            let row = StepRecord::new(5, "late", update, 1, at, at);
            let lone = run_with("q", "k", "v");
            store
                .save(SaveRequest::new(&lone, None).with_step(&row))
                .await
                .unwrap();
            assert_eq!(History::history(&store, "q").await.unwrap(), Some(vec![]));
            assert_eq!(Blobs::blob_totals(&store).await.unwrap().blobs, 0);
        })
    }

    #[test]
    fn urls_and_thresholds_are_checked() {
        block(async {
            let store = open("?blob_threshold=1KiB").unwrap();
            assert_eq!(
                store.capabilities().blobs.map(|b| b.threshold()),
                Some(1024)
            );
            assert!(open("").unwrap().capabilities().blobs.is_none());
            for (rest, says) in [
                ("x", "nothing after the colon"),
                ("?colour=red", "is not known"),
                ("?blob_threshold=12", "blob_threshold"),
                ("?blob_threshold=", "blob_threshold"),
                ("?blob_threshold=2GiB", "blob_threshold"),
                ("?blob_threshold=99999999999999999999999", "blob_threshold"),
                ("?blob_threshold=-1", "blob_threshold"),
                ("?", "is not known"),
                ("x?blob_threshold=1KiB", "nothing after the colon"),
            ] {
                let err = open(rest).err().map(|e| e.to_string()).unwrap_or_default();
                assert!(err.contains(says), "memory:{rest}: {err}");
            }
            let used = MemoryStore::new();
            used.save(SaveRequest::new(&run_with("r", "k", "v"), None))
                .await
                .unwrap();
            let err = used.blob_threshold(1024).unwrap_err().to_string();
            assert!(err.contains("just made"), "{err}");
            // A clone would read the same records without blobs.
            let fresh = MemoryStore::new();
            let _clone = fresh.clone();
            assert!(fresh.blob_threshold(1024).is_err());
            // Events alone are something held already.
            let logged = MemoryStore::new();
            let event = NewEvent::new("s", 1, Timestamp::from_unix_millis(0), "x".into());
            Events::append_events(&logged, "r", &[event]).await.unwrap();
            assert!(logged.blob_threshold(1024).is_err());
        })
    }
}
