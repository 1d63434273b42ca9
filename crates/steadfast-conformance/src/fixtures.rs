//! Workloads the stores' own tests share.

use serde_json::json;
use steadfast_core::{update, Step, Workflow};

/// A large value, the same for the same `k`: about `kb` KB of JSON text.
pub fn doc(k: usize, kb: usize) -> String {
    format!("{k:04}").repeat(kb * 256)
}

/// An agent that rereads documents: steps `s0`..`s{n-1}`, where step `i`
/// returns the shared document `i % 2` (100 KB) and a document of its own
/// (20 KB, the same for the same `run` and step).
pub fn rereading_agent(n: usize, run: usize) -> Workflow {
    let mut b = Workflow::builder("agent");
    for i in 0..n {
        b = b.push(Step::new(format!("s{i}"), move |_, _| async move {
            update(json!({
                format!("shared{}", i % 2): doc(i % 2, 100),
                format!("own{i}"): doc(1000 + run * 100 + i, 20),
                "i": i,
            }))
        }));
    }
    b.build().expect("a valid workflow")
}
