//! The store conformance suite on `SqliteStore`.

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_sqlite::{SqliteOptions, SqliteStore};

fn make(cfg: Config) -> TestStore {
    let dir = tempfile::tempdir().expect("a temp dir");
    // A low blob threshold, so that every check also goes through blobs.
    let opts = SqliteOptions::default()
        .max_state_bytes(cfg.state_limit)
        .blob_threshold(1024);
    let store = SqliteStore::open_with(dir.path().join("runs.db"), opts).expect("open");
    TestStore::with_guard(store, dir)
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);
