//! Property test of the state a rewind, a fork and a prune rebuild: for
//! random listed workflows (each step overwriting a random few of a small
//! set of keys, some of them the input's), random inputs and random
//! targets, the state before step k is exactly the input merged with the
//! updates of steps 0..k, on the memory and SQLite stores, before and after
//! a prune that keeps the target nameable.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use steadfast::{ops, start, update, MemoryStore, Runner, Store, SystemClock, Workflow};

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Clone, Debug)]
struct Case {
    input: Map<String, Value>,
    /// Per step, the keys it writes and the values.
    steps: Vec<Vec<(usize, i64)>>,
    target: usize,
    keep: usize,
}

fn case() -> impl Strategy<Value = Case> {
    let step = prop::collection::vec((0..KEYS.len(), -5i64..5), 0..3);
    (
        prop::collection::btree_map(0..KEYS.len(), -5i64..5, 0..3),
        prop::collection::vec(step, 1..8),
        any::<prop::sample::Index>(),
        0usize..8,
    )
        .prop_map(|(input, steps, at, keep)| Case {
            input: input
                .into_iter()
                .map(|(k, v)| (KEYS[k].to_string(), json!(v)))
                .collect(),
            target: at.index(steps.len()),
            steps,
            keep,
        })
}

fn workflow(c: &Case) -> Workflow {
    let mut b = Workflow::builder("w");
    for (i, writes) in c.steps.iter().enumerate() {
        let update_of: Map<String, Value> = writes
            .iter()
            .map(|(k, v)| (KEYS[*k].to_string(), json!(v)))
            .chain([(format!("step{i}"), json!(i))])
            .collect();
        b = b.step(format!("s{i}"), move |_, _| {
            let u = update_of.clone();
            async move { update(Value::Object(u)) }
        });
    }
    b.build().expect("a workflow")
}

/// The model: the input, the kept input, then the first `k` updates.
fn expected(c: &Case, k: usize) -> Map<String, Value> {
    let mut state = c.input.clone();
    if !c.input.is_empty() {
        state.insert("__start".into(), Value::Object(c.input.clone()));
    }
    for (i, writes) in c.steps.iter().take(k).enumerate() {
        for (key, v) in writes {
            state.insert(KEYS[*key].to_string(), json!(v));
        }
        state.insert(format!("step{i}"), json!(i));
    }
    state
}

async fn check(store: Arc<dyn Store>, c: Case) -> Result<(), TestCaseError> {
    let wf = workflow(&c);
    start(&*store, "w", "r", Value::Object(c.input.clone()), false)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Runner::new(&*store)
        .run("r", &wf)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let n = c.steps.len();
    let err = |e: steadfast::Error| TestCaseError::fail(e.to_string());
    let fork = ops::fork(&*store, "r", &c.target.to_string(), "f", "t", &SystemClock)
        .await
        .map_err(err)?;
    prop_assert_eq!(&fork.state, &expected(&c, c.target), "fork at {}", c.target);
    // Prune, then rewind to the target if it can still be named.
    ops::prune(&*store, "r", c.keep, "t", &SystemClock)
        .await
        .map_err(err)?;
    // A prune folds only when it deletes a row: n >= keep + 2.
    let nameable = n < c.keep + 2 || c.target + c.keep >= n;
    let rewound = ops::rewind(&*store, "r", &c.target.to_string(), "t", &SystemClock).await;
    match rewound {
        Ok(cp) => {
            prop_assert_eq!(&cp.state, &expected(&c, c.target), "rewind to {}", c.target);
            // And forward again to the same end.
            let done = Runner::new(&*store).run("r", &wf).await.map_err(err)?;
            prop_assert_eq!(done.completed(), Some(expected(&c, n)));
        }
        Err(steadfast::Error::InvalidInput { reason, .. }) => {
            prop_assert!(
                !nameable,
                "step {} was refused after keeping {}: {}",
                c.target,
                c.keep,
                reason
            );
            prop_assert!(reason.contains("pruned"), "{}", reason);
        }
        Err(e) => return Err(err(e)),
    }
    // The fork runs to the same end as the original.
    let done = Runner::new(&*store).run("f", &wf).await.map_err(err)?;
    prop_assert_eq!(done.completed(), Some(expected(&c, n)));
    Ok(())
}

fn cases() -> u32 {
    std::env::var("STEADFAST_REWIND_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn rewind_fork_and_prune_rebuild_the_state_before_a_step_on_memory(c in case()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check(Arc::new(MemoryStore::new()), c))?;
    }

    #[test]
    fn rewind_fork_and_prune_rebuild_the_state_before_a_step_on_sqlite(c in case()) {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(steadfast::sqlite::SqliteStore::open(dir.path().join("runs.db")).unwrap());
        rt.block_on(check(store, c))?;
    }
}
