//! The store conformance suite on `FileStore`.

use steadfast_conformance::fixtures::remove_blob_files;
use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_file::{FileStore, FileStoreOptions, OsFs};

fn make(cfg: Config) -> TestStore {
    let dir = tempfile::tempdir().expect("a temp dir");
    // A small threshold, so that the checks' large values are blobs.
    let opts = FileStoreOptions::default()
        .max_state_bytes(cfg.state_limit)
        .blob_threshold(1024);
    let store = FileStore::open_with(OsFs, dir.path().join("runs.json"), opts).expect("open");
    let blobs = dir.path().join("runs.json.blobs");
    TestStore::with_guard(store, dir).with_blob_loss(move || {
        let blobs = blobs.clone();
        async move { remove_blob_files(&blobs) }
    })
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);
