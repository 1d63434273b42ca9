//! The store conformance suite on a `MemoryStore` that keeps large values as
//! blobs, with a threshold low enough that every check goes through them.

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_core::MemoryStore;

fn make(cfg: Config) -> TestStore {
    let store = MemoryStore::with_state_limit(cfg.state_limit)
        .blob_threshold(1024)
        .expect("a threshold in range");
    let lose = store.clone();
    TestStore::new(store).with_blob_loss(move || {
        let n = lose.lose_blobs();
        async move { Ok(n) }
    })
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);
