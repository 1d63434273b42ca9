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

/// The suite's cut check on a current-thread runtime. On the suite's
/// multi-threaded runtime a lone save commits within its first poll, so the
/// check never cuts one; here a save goes to a blocking thread, and the
/// check drops it after each poll in turn while its job may still commit.
#[test]
fn saves_cut_off_anywhere_on_a_current_thread_runtime_leave_whole_runs() {
    use steadfast_conformance::Cut;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, Store, Timestamp};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        // Here a save is cut at its first poll: the check below cuts.
        let ts = make(Config::default());
        let cp = Checkpoint::new("probe", "w", Timestamp::from_unix_millis(0));
        let cut = Cut::new(ts.store.save(SaveRequest::new(&cp, None)), 1).await;
        assert!(cut.is_none(), "a save finished in its first poll: {cut:?}");
        let ts = make(Config::default());
        if let Err(e) =
            steadfast_conformance::checks::saves_cut_off_anywhere_leave_whole_runs(ts).await
        {
            panic!("saves_cut_off_anywhere_leave_whole_runs, current-thread runtime: {e}");
        }
    });
}
