//! Power loss and I/O errors under the file store, on a simulated disk.
//!
//! A process kill cannot show a missing `fsync` (the page cache survives it), so
//! these tests run the store on a disk that tracks what is durable, take a
//! snapshot before every write, rename and sync, and check every state a power
//! loss at that point could leave. Mutants without the file or directory `fsync`
//! must fail the same check.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use steadfast::file::{FileStore, FileStoreOptions};
use steadfast::store::SaveRequest;
use steadfast::{
    async_trait, run, update, Checkpoint, ListFilter, RetryPolicy, RunSummary, Step, Store,
    StoreError, StoreErrorKind, Workflow,
};
use support::simfs::{Op, SimFs};

const PATH: &str = "/sim/runs.json";
type Counts = Arc<Mutex<BTreeMap<usize, u32>>>;

/// Counts acknowledged saves, so a snapshot knows what had been promised.
struct Acking<S> {
    inner: S,
    acked: Arc<AtomicUsize>,
}

#[async_trait]
impl<S: Store> Store for Acking<S> {
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load(run_id).await
    }
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let v = self.inner.save(req).await?;
        self.acked.fetch_add(1, Ordering::SeqCst);
        Ok(v)
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
    fn capabilities(&self) -> steadfast::Capabilities<'_> {
        self.inner.capabilities()
    }
}

fn workflow(steps: usize, counts: &Counts) -> Workflow {
    let mut b = Workflow::builder("power");
    for i in 0..steps {
        let counts = Arc::clone(counts);
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| {
                *counts.lock().unwrap().entry(i).or_default() += 1;
                async move { update(json!({ format!("s{i}"): i, "pad": "p".repeat(300) })) }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().unwrap()
}

fn state_after(steps: usize) -> Value {
    let mut m: serde_json::Map<String, Value> =
        (0..steps).map(|i| (format!("s{i}"), json!(i))).collect();
    if steps > 0 {
        m.insert("pad".into(), json!("p".repeat(300)));
    }
    Value::Object(m)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `steps` steps on a store built with `opts`, then checks every crash image
/// of every snapshot. Returns the number of images checked, or the first violation.
fn enumerate_crashes(steps: usize, opts: FileStoreOptions) -> Result<usize, String> {
    let rt = rt();
    let fs = SimFs::default();
    fs.record_snapshots();
    let store = FileStore::open_with(fs.clone(), PATH, opts).map_err(|e| e.to_string())?;
    let store = Acking {
        inner: store,
        acked: Arc::clone(&fs.acked),
    };
    let counts = Counts::default();
    rt.block_on(run("r", &workflow(steps, &counts), &store))
        .map_err(|e| e.to_string())?;
    fs.snapshot_now();

    let mut checked = 0;
    for (k, snap) in fs.take_snapshots().into_iter().enumerate() {
        for image in snap.disk.crash_images() {
            checked += 1;
            let at = || {
                format!(
                    "crash before operation {k} ({} saves acknowledged)",
                    snap.acked
                )
            };
            let disk = SimFs::with_image(&image);
            let store = FileStore::open_with(disk.clone(), PATH, FileStoreOptions::default())
                .map_err(|e| format!("{}: reopen failed: {e}", at()))?;
            let cp = rt
                .block_on(store.load("r"))
                .map_err(|e| format!("{}: load failed: {e}", at()))?;
            let next = cp.as_ref().map_or(0, |c| c.next);
            if next < snap.acked {
                return Err(format!(
                    "{}: an acknowledged save was lost: the store has {next} steps",
                    at()
                ));
            }
            let state = cp.map(|c| Value::Object(c.state)).unwrap_or(json!({}));
            if state != state_after(next) {
                return Err(format!("{}: state after {next} steps is {state}", at()));
            }
            let counts = Counts::default();
            let out = rt
                .block_on(run("r", &workflow(steps, &counts), &store))
                .map_err(|e| format!("{}: resume failed: {e}", at()))?;
            if out.completed().map(Value::Object) != Some(state_after(steps)) {
                return Err(format!("{}: resume ended in the wrong state", at()));
            }
            let expected: BTreeMap<usize, u32> = (next..steps).map(|i| (i, 1)).collect();
            if *counts.lock().unwrap() != expected {
                return Err(format!(
                    "{}: resume ran {:?}, expected {expected:?}",
                    at(),
                    counts.lock().unwrap()
                ));
            }
            if disk
                .names()
                .iter()
                .any(|n| n.to_string_lossy().contains(".tmp-"))
            {
                return Err(format!("{}: a temp file survived the reopen", at()));
            }
        }
    }
    Ok(checked)
}

#[test]
fn power_loss_at_any_point_keeps_every_acknowledged_step() {
    for steps in [1, 3, 5] {
        match enumerate_crashes(steps, FileStoreOptions::default()) {
            Ok(n) => assert!(n > steps * 10, "{steps} steps: only {n} crash images"),
            Err(e) => panic!("{steps} steps: {e}"),
        }
    }
}

/// The same with every state's padding stored as a blob beside the file:
/// no crash leaves a record that refers to a blob the disk lost.
#[test]
fn power_loss_at_any_point_keeps_every_acknowledged_step_with_blobs() {
    for steps in [1, 3] {
        let opts = FileStoreOptions::default().blob_threshold(256);
        match enumerate_crashes(steps, opts) {
            Ok(n) => assert!(n > steps * 10, "{steps} steps: only {n} crash images"),
            Err(e) => panic!("{steps} steps: {e}"),
        }
    }
}

#[test]
fn control_without_blob_directory_fsync_power_loss_loses_a_blob() {
    let mut opts = FileStoreOptions::default().blob_threshold(256);
    opts.mutants.no_blob_dir_fsync = true;
    let r = enumerate_crashes(3, opts);
    assert!(
        r.as_ref().is_err_and(|e| e.contains("not in the store")),
        "the crash enumeration did not notice a missing blob directory fsync: {r:?}"
    );
}

#[test]
fn control_without_blob_file_fsync_power_loss_damages_a_blob() {
    let mut opts = FileStoreOptions::default().blob_threshold(256);
    opts.mutants.no_blob_fsync = true;
    let r = enumerate_crashes(3, opts);
    // The blob's name was synced with its directory, its bytes were not.
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("where its reference says")),
        "the crash enumeration did not notice a missing blob file fsync: {r:?}"
    );
}

#[test]
fn control_without_file_fsync_power_loss_corrupts_the_store() {
    let mut opts = FileStoreOptions::default();
    opts.mutants.no_file_fsync = true;
    let r = enumerate_crashes(3, opts);
    assert!(
        r.is_err(),
        "the crash enumeration did not notice a missing file fsync"
    );
}

#[test]
fn control_without_directory_fsync_power_loss_loses_an_acknowledged_step() {
    let mut opts = FileStoreOptions::default();
    opts.mutants.no_dir_fsync = true;
    let r = enumerate_crashes(3, opts);
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("acknowledged save was lost")),
        "the crash enumeration did not notice a missing directory fsync: {r:?}"
    );
}

/// An error with its causes, as a reporter would print it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}

fn open(fs: &SimFs) -> FileStore<SimFs> {
    FileStore::open_with(fs.clone(), PATH, FileStoreOptions::default()).unwrap()
}

#[test]
fn failed_fsync_of_the_temp_file_poisons_the_handle_and_keeps_the_old_file() {
    let rt = rt();
    let fs = SimFs::default();
    let store = open(&fs);
    let counts = Counts::default();
    let wf = workflow(3, &counts);
    fs.fail(Op::SyncFile, 2);
    let err = rt.block_on(run("r", &wf, &store)).unwrap_err();
    assert!(chain(&err).contains("injected EIO on sync_file"), "{err}");
    let cp: Checkpoint = serde_json::from_value::<Value>(
        serde_json::from_slice(&fs.contents(Path::new(PATH)).unwrap()).unwrap(),
    )
    .map(|v| serde_json::from_value(v["runs"]["r"].clone()).unwrap())
    .unwrap();
    assert_eq!(cp.next, 1, "the file still holds the last good save");
    fs.heal();
    let again = Checkpoint::new("other", "w", steadfast::Timestamp::from_unix_millis(0));
    let refused = rt
        .block_on(store.save(SaveRequest::new(&again, None)))
        .unwrap_err();
    assert!(matches!(refused, StoreError::Poisoned { .. }), "{refused}");
    let out = rt.block_on(run("r", &wf, &open(&fs))).unwrap();
    assert_eq!(
        out.completed().map(Value::Object),
        Some(state_after(3)),
        "a reopened store resumes"
    );
    assert_eq!(
        counts.lock().unwrap().values().sum::<u32>(),
        4,
        "only the step in flight ran again"
    );
}

#[test]
fn failed_directory_sync_after_rename_is_recognised_as_our_own_write() {
    let rt = rt();
    let fs = SimFs::default();
    let store = open(&fs);
    let counts = Counts::default();
    let wf = workflow(4, &counts);
    fs.fail(Op::SyncDir, 2);
    let err = rt.block_on(run("r", &wf, &store)).unwrap_err();
    // Save 2 landed (the rename happened); the run loop recognised it, ran step 2,
    // and stopped at the poisoned handle, not at a conflict with itself.
    let source = err.store_error().expect("a store error");
    assert!(matches!(source, StoreError::Poisoned { .. }), "{err}");
    assert_ne!(source.kind(), StoreErrorKind::Conflict);
    fs.heal();
    let out = rt.block_on(run("r", &wf, &open(&fs))).unwrap();
    assert_eq!(out.completed().map(Value::Object), Some(state_after(4)));
    let c = counts.lock().unwrap().clone();
    assert_eq!(
        c,
        BTreeMap::from([(0, 1), (1, 1), (2, 2), (3, 1)]),
        "only step 2 ran twice"
    );
}

#[test]
fn failed_write_or_rename_changes_nothing_and_does_not_poison() {
    for op in [Op::Write, Op::Rename] {
        let rt = rt();
        let fs = SimFs::default();
        let store = open(&fs);
        let counts = Counts::default();
        let wf = workflow(3, &counts);
        fs.fail(op, 2);
        let err = rt.block_on(run("r", &wf, &store)).unwrap_err();
        assert!(chain(&err).contains("injected EIO"), "{op:?}: {err}");
        assert!(
            fs.names()
                .iter()
                .all(|n| !n.to_string_lossy().contains(".tmp-")),
            "{op:?}: temp left"
        );
        fs.heal();
        // Same handle: a write error before the rename is not a durability failure.
        let out = rt.block_on(run("r", &wf, &store)).unwrap();
        assert_eq!(
            out.completed().map(Value::Object),
            Some(state_after(3)),
            "{op:?}"
        );
    }
}
