//! The store conformance suite on `FileStore`.

use steadfast_conformance::{
    history_conformance, history_rewrite_conformance, store_conformance, Config, TestStore,
};
use steadfast_file::{FileStore, FileStoreOptions, OsFs};

fn make(cfg: Config) -> TestStore {
    let dir = tempfile::tempdir().expect("a temp dir");
    let opts = FileStoreOptions::default().max_state_bytes(cfg.state_limit);
    let store = FileStore::open_with(OsFs, dir.path().join("runs.json"), opts).expect("open");
    TestStore::with_guard(store, dir)
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
