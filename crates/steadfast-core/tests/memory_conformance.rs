//! The store conformance suite on `MemoryStore`.

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_core::MemoryStore;

fn make(cfg: Config) -> TestStore {
    TestStore::new(MemoryStore::with_state_limit(cfg.state_limit))
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);
