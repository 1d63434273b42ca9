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

/// The blob checks pass by doing nothing on a store without blobs: this one
/// must have them.
#[test]
fn the_store_under_test_keeps_blobs() {
    let ts = make(Config::default());
    let blobs = ts.store.capabilities().blobs.map(|b| b.threshold());
    assert_eq!(blobs, Some(1024));
    assert!(ts.lose_blobs.is_some());
}
