//! The store conformance suite on `PgStore`, each check in a schema of its own.

mod support;

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_postgres::PgOptions;

async fn make(cfg: Config) -> TestStore {
    // A small threshold, so that the checks' large values are blobs.
    let opts = PgOptions::default()
        .max_state_bytes(cfg.state_limit)
        .blob_threshold(1024)
        .pool_size(4);
    let (store, guard) = support::fresh_store(opts).await;
    let handle = store.clone();
    TestStore::with_guard(store, guard).with_blob_loss(move || lose_blobs(handle.clone()))
}

/// Deletes every blob's rows behind the store's back (the references stay,
/// their foreign key set aside as damage would), and says how many blobs
/// there were.
async fn lose_blobs(store: steadfast_postgres::PgStore) -> Result<u64, String> {
    let q = store.quoted_schema();
    let client = store.connection().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!(
            "ALTER TABLE {q}.blob_refs DROP CONSTRAINT IF EXISTS blob_refs_hash_fkey;
             DELETE FROM {q}.blob_chunks;"
        ))
        .await
        .map_err(|e| e.to_string())?;
    client
        .execute(&format!("DELETE FROM {q}.blobs"), &[])
        .await
        .map_err(|e| e.to_string())
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);

/// The same suite through the encryption seal: sealing changes nothing the
/// store promises.
mod sealed {
    use super::*;

    async fn make(cfg: Config) -> TestStore {
        let opts = PgOptions::default()
            .max_state_bytes(cfg.state_limit * 2)
            .blob_threshold(1024)
            .pool_size(4);
        let (store, guard) = support::fresh_store(opts).await;
        let keys =
            steadfast_seal::Keyring::parse("k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")
                .expect("a test key");
        let handle = store.clone();
        let sealed = steadfast_seal::SealedStore::new(std::sync::Arc::new(store), keys)
            .max_state_bytes(cfg.state_limit);
        TestStore::with_guard(sealed, guard).with_blob_loss(move || lose_blobs(handle.clone()))
    }

    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}
