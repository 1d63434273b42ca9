//! The engine's own cost per step, on the in-memory store: the run loop (clone,
//! merge, checkpoint bookkeeping) without any I/O.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::json;
use steadfast::{update, MemoryStore, RetryPolicy, Step, Workflow};

fn ten_steps() -> Workflow {
    let mut b = Workflow::builder("w");
    for i in 0..10 {
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| async move {
                update(json!({ format!("s{i}"): i }))
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

fn engine(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let wf = ten_steps();
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(10));
    group.bench_function("w1_run_of_10_steps_on_memory", |b| {
        b.iter_batched(
            MemoryStore::new,
            |store| rt.block_on(steadfast::run("r", &wf, &store)).expect("run"),
            BatchSize::SmallInput,
        )
    });
    group.finish();

    let mut state = serde_json::Map::new();
    for i in 0..10 {
        state.insert(format!("s{i}"), json!(i));
    }
    c.bench_function("clone_state_of_10_keys", |b| b.iter(|| state.clone()));
    c.bench_function("merge_one_key", |b| {
        b.iter_batched(
            || {
                (
                    state.clone(),
                    json!({"s3": 33}).as_object().cloned().unwrap_or_default(),
                )
            },
            |(mut s, u)| steadfast::merge(&mut s, u),
            BatchSize::SmallInput,
        )
    });
    c.bench_function("serialize_state_of_10_keys", |b| {
        b.iter(|| serde_json::to_vec(&state).expect("json"))
    });
}

criterion_group!(benches, engine);
criterion_main!(benches);
