//! The store conformance suite on `PgStore`, each check in a schema of its own.

mod support;

use steadfast_conformance::{history_conformance, store_conformance, Config, TestStore};
use steadfast_postgres::PgOptions;

async fn make(cfg: Config) -> TestStore {
    let opts = PgOptions::default()
        .max_state_bytes(cfg.state_limit)
        .pool_size(4);
    let (store, guard) = support::fresh_store(opts).await;
    TestStore::with_guard(store, guard)
}

store_conformance!(make);
history_conformance!(make);
