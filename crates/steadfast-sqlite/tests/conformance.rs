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
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open_with(&db, opts).expect("open");
    TestStore::with_guard(store, dir).with_blob_loss(move || lose_blobs(db.clone()))
}

/// Deletes every blob's rows behind the store's back (the references stay),
/// and says how many blobs there were.
async fn lose_blobs(db: std::path::PathBuf) -> Result<u64, String> {
    let conn = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    conn.execute("DELETE FROM blob_chunks", [])
        .map_err(|e| e.to_string())?;
    conn.execute("DELETE FROM blobs", [])
        .map(|n| n as u64)
        .map_err(|e| e.to_string())
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);
