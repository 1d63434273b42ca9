//! W1 and W2 on a Cosmos DB protocol server (`STEADFAST_BENCH_COSMOS`, a
//! `cosmos://HOST:PORT?keyfile=…&cafile=…` base without database and
//! container). Against the local test server these figures are the client's
//! protocol overhead, not Azure's: the server keeps everything in memory and
//! runs on the same machine.

use std::sync::Arc;

use serde_json::json;
use steadfast::cosmos::{CosmosOptions, CosmosStore};

use crate::baseline::round;
use crate::workloads::{run_many, Res, STEPS};
use crate::{emit, median, Args};

/// The environment variable naming the server.
pub const ENV: &str = "STEADFAST_BENCH_COSMOS";

/// W1 and W2, with the request charge per checkpoint the server reported.
pub async fn measure(args: &Args) -> Res<()> {
    let Some(base) = std::env::var(ENV).ok().filter(|u| !u.is_empty()) else {
        eprintln!("cosmos: skipped; set {ENV} to cosmos://HOST:PORT?keyfile=PATH[&cafile=PATH] to measure it");
        return Ok(());
    };
    let (host, query) = base.split_once('?').unwrap_or((base.as_str(), ""));
    let runs = if args.quick { 10 } else { 200 };
    for concurrency in [1usize, 16] {
        let mut per_step = Vec::new();
        let mut charge = Vec::new();
        for rep in 0..args.reps() {
            let url = format!(
                "{host}/bench{:08x}/w{concurrency}r{rep}?{query}",
                fastrand_u32()
            );
            let store = CosmosStore::open_with(&url, CosmosOptions::default()).await?;
            let before = store.request_charge().0;
            let wall = run_many(Arc::new(store.clone()), "run", runs, concurrency).await?;
            let after = store.request_charge().0;
            per_step.push(wall.as_secs_f64() * 1e6 / (runs * STEPS) as f64);
            charge.push((after - before) / (runs * STEPS) as f64);
            store.drop_database().await?;
        }
        let us = median(per_step);
        emit(
            "steadfast",
            "cosmos",
            if concurrency == 1 { "W1" } else { "W2" },
            "one transactional batch per checkpoint (local protocol server, in memory)",
            json!({"runs": runs, "steps": runs * STEPS, "concurrency": concurrency, "us_per_step": round(us),
                   "steps_per_s": round(1e6 / us), "ru_per_checkpoint": round(median(charge)),
                   "notes": "protocol overhead against the local test server, not Azure figures; RU as the server reports them (it charges 1 per request)"}),
        );
    }
    Ok(())
}

fn fastrand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
