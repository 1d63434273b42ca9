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
    TestStore::with_guard(store, guard)
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
        let sealed = steadfast_seal::SealedStore::new(std::sync::Arc::new(store), keys)
            .max_state_bytes(cfg.state_limit);
        TestStore::with_guard(sealed, guard)
    }

    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}
