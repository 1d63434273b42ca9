//! The store conformance suite through `SealedStore`, over the memory, SQLite
//! and file stores: sealing changes nothing a store promises.

use std::sync::Arc;

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_core::MemoryStore;
use steadfast_seal::{Keyring, SealedStore};

const KEYS: &str = "k2:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=,k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn sealed(inner: impl steadfast_core::Store + 'static, cfg: &Config) -> SealedStore {
    SealedStore::new(Arc::new(inner), Keyring::parse(KEYS).unwrap())
        .max_state_bytes(cfg.state_limit)
}

mod memory {
    use super::*;
    fn make(cfg: Config) -> TestStore {
        // Sealed values are larger than plain ones: the limit applies below.
        TestStore::new(sealed(
            MemoryStore::with_state_limit(cfg.state_limit * 2),
            &cfg,
        ))
    }
    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}

mod sqlite {
    use super::*;
    use steadfast_sqlite::{SqliteOptions, SqliteStore};
    fn make(cfg: Config) -> TestStore {
        let dir = tempfile::tempdir().expect("a temp dir");
        // A low threshold, so that sealed values are blobs underneath.
        let opts = SqliteOptions::default()
            .max_state_bytes(cfg.state_limit * 2)
            .blob_threshold(1024);
        let db = dir.path().join("runs.db");
        let store = SqliteStore::open_with(&db, opts).expect("open");
        TestStore::with_guard(sealed(store, &cfg), dir).with_blob_loss(move || {
            let db = db.clone();
            async move {
                let conn = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
                conn.busy_timeout(std::time::Duration::from_secs(10))
                    .map_err(|e| e.to_string())?;
                conn.execute_batch("DELETE FROM blob_chunks")
                    .map_err(|e| e.to_string())?;
                conn.execute("DELETE FROM blobs", [])
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string())
            }
        })
    }
    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}

mod file {
    use super::*;
    use steadfast_file::{FileStore, FileStoreOptions, OsFs};
    fn make(cfg: Config) -> TestStore {
        let dir = tempfile::tempdir().expect("a temp dir");
        let opts = FileStoreOptions::default()
            .max_state_bytes(cfg.state_limit * 2)
            .blob_threshold(1024);
        let store = FileStore::open_with(OsFs, dir.path().join("runs.json"), opts).expect("open");
        let blobs = dir.path().join("runs.json.blobs");
        TestStore::with_guard(sealed(store, &cfg), dir).with_blob_loss(move || {
            let blobs = blobs.clone();
            async move { steadfast_conformance::fixtures::remove_blob_files(&blobs) }
        })
    }
    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}

/// The sealing wrapper and the one that refuses sealed records keep every
/// capability of the store under them (history, a state limit; scheduling
/// and the server's clock on PostgreSQL).
mod capabilities {
    use super::*;
    use steadfast_conformance::keeps_capabilities;
    use steadfast_seal::RefuseSealed;

    fn both(inner: Arc<dyn steadfast_core::Store>) {
        let keys = Keyring::parse(KEYS).unwrap();
        let sealed = SealedStore::new(Arc::clone(&inner), keys);
        keeps_capabilities(&*inner, &sealed).unwrap();
        let refusing = RefuseSealed::new(Arc::clone(&inner));
        keeps_capabilities(&*inner, &refusing).unwrap();
    }

    /// Under a store that keeps blobs and finds leftovers, the sealing
    /// wrapper (which implements the blob capability itself) passes the
    /// look for them on, and says the same of sharing.
    #[tokio::test]
    async fn the_blob_duties_pass_through() {
        let found = steadfast_core::Leftovers::new(2, 5);
        let inner: Arc<dyn steadfast_core::Store> = Arc::new(
            steadfast_conformance::Bounded::new(
                MemoryStore::with_blobs(1024).unwrap(),
                (99, 800_000),
            )
            .leaving(found),
        );
        let keys = Keyring::parse(KEYS).unwrap();
        let sealed = SealedStore::new(Arc::clone(&inner), keys);
        steadfast_conformance::keeps_blob_duties(&*inner, &sealed)
            .await
            .unwrap();
        let refusing = RefuseSealed::new(Arc::clone(&inner));
        steadfast_conformance::keeps_blob_duties(&*inner, &refusing)
            .await
            .unwrap();
        // The check can fail: a store that finds nothing is not one that
        // finds two.
        let plain = MemoryStore::with_blobs(1024).unwrap();
        assert!(steadfast_conformance::keeps_blob_duties(&*inner, &plain)
            .await
            .is_err());
    }

    #[test]
    fn on_memory_sqlite_and_file() {
        both(Arc::new(MemoryStore::new()));
        // Below them, a store whose appends are bounded (as Cosmos DB's
        // are): the wrappers pass the bounds on.
        both(Arc::new(steadfast_conformance::Bounded::new(
            MemoryStore::new(),
            (99, 800_000),
        )));
        let dir = tempfile::tempdir().expect("a temp dir");
        both(Arc::new(
            steadfast_sqlite::SqliteStore::open(dir.path().join("runs.db")).expect("open"),
        ));
        both(Arc::new(
            steadfast_file::FileStore::open(dir.path().join("runs.json")).expect("open"),
        ));
    }
}
