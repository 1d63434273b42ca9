//! The store conformance suite on `CosmosStore`, against the local Cosmos
//! protocol server, each check in a database of its own.

mod support;

use steadfast_conformance::{history_conformance, store_conformance, Config, TestStore};
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
        .store(CosmosOptions::default().max_state_bytes(cfg.state_limit))
        .await;
    TestStore::with_guard(store, db)
}

store_conformance!(make);
history_conformance!(make);
