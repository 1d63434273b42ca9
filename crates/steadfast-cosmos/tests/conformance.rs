//! The store conformance suite on `CosmosStore`, against the local Cosmos
//! protocol server, each check in a database of its own.

mod support;

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_cosmos::CosmosOptions;

async fn make(cfg: Config) -> TestStore {
    let Some(server) = support::server() else {
        // Outside CI without a server: an empty memory store keeps the
        // check from failing for want of it (the skip is printed).
        return TestStore::new(steadfast_core::MemoryStore::with_state_limit(
            cfg.state_limit,
        ));
    };
    let db = support::TestDb::new(&server);
    let store = db
        .store(
            CosmosOptions::default()
                .max_state_bytes(cfg.state_limit)
                .blob_threshold(1024),
        )
        .await;
    let name = db.name().to_string();
    TestStore::with_guard(store, db)
        .with_blob_loss(move || support::lose_blobs(server.clone(), name.clone()))
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
        let keys =
            steadfast_seal::Keyring::parse("k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")
                .expect("a test key");
        let Some(server) = support::server() else {
            return TestStore::new(steadfast_core::MemoryStore::with_state_limit(
                cfg.state_limit,
            ));
        };
        let db = support::TestDb::new(&server);
        let store = db
            .store(
                CosmosOptions::default()
                    .max_state_bytes(cfg.state_limit * 2)
                    .blob_threshold(1024),
            )
            .await;
        let sealed = steadfast_seal::SealedStore::new(std::sync::Arc::new(store), keys)
            .max_state_bytes(cfg.state_limit);
        let name = db.name().to_string();
        TestStore::with_guard(sealed, db)
            .with_blob_loss(move || support::lose_blobs(server.clone(), name.clone()))
    }

    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}
