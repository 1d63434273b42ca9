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

/// W1 and W2, with the request charge per checkpoint the server reported,
/// and W7 when asked for.
pub async fn measure(args: &Args) -> Res<()> {
    let Some(base) = std::env::var(ENV).ok().filter(|u| !u.is_empty()) else {
        eprintln!("cosmos: skipped; set {ENV} to cosmos://HOST:PORT?keyfile=PATH[&cafile=PATH] to measure it");
        return Ok(());
    };
    let (host, query) = base.split_once('?').unwrap_or((base.as_str(), ""));
    if args.wants("W7") {
        w7(host, query, args).await?;
    }
    if !args.wants("W1") && !args.wants("W2") {
        return Ok(());
    }
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

/// W7 (see `large.rs`) on the server: 100 runs of 10 steps of 1 MiB
/// values. What is stored is the store's own count (each run's record and
/// the blob items it holds, which on Cosmos DB are once per run), as the
/// server does not say what it keeps.
async fn w7(host: &str, query: &str, args: &Args) -> Res<()> {
    use crate::large::{
        peak_rss, raw_write, reset_peak, w7_figures, workflow, RawAppend, VALUE_BYTES,
    };
    use steadfast::Store;
    let runs = if args.quick { 4 } else { 100 };
    let (mut per_step, mut raw, mut stored, mut peaks, mut charge) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut before, mut appends) = (Vec::new(), Vec::new());
    for rep in 0..args.reps() {
        let url = format!("{host}/bench{:08x}/w7r{rep}?{query}", fastrand_u32());
        let store = CosmosStore::open_with(&url, CosmosOptions::default()).await?;
        // Made before the peak is reset: its buffer is not the store's.
        let mut append = RawAppend::new(&args.dir)?;
        before.push(reset_peak() as f64);
        let charged = store.request_charge().0;
        let mut took = 0.0;
        for r in 0..runs {
            let wf = workflow(r);
            let t = std::time::Instant::now();
            steadfast::run(&format!("w7-{r}"), &wf, &store).await?;
            took += t.elapsed().as_secs_f64();
            append.append(5)?;
        }
        appends.push(append.finish());
        charge.push((store.request_charge().0 - charged) / (runs * STEPS) as f64);
        per_step.push(took * 1e6 / (runs * STEPS) as f64);
        peaks.push(peak_rss().unwrap_or(0) as f64);
        let blobs = store
            .capabilities()
            .blobs
            .ok_or("the Cosmos DB store keeps no blobs")?;
        let mut bytes = 0u64;
        for r in 0..runs {
            if let Some(u) = blobs.usage(&format!("w7-{r}")).await? {
                bytes += u.record_bytes + u.blob_bytes;
            }
        }
        stored.push(bytes as f64);
        store.drop_database().await?;
        raw.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
    }
    let mut figures = w7_figures(runs, &per_step, &raw, &appends, &stored, &peaks, &before);
    figures.insert("ru_per_step".into(), json!(round(median(charge))));
    figures.insert("notes".into(), json!("step i returns document i % 5 of its run (1 MiB each, incompressible); protocol overhead against the local test server, not Azure figures; raw = write 1 MiB + fsync to the local disk over pages the page cache holds, median of 100; raw_append = 1 MiB appended to a growing file + fsync, five after each run; stored = the store's count of each run's record and blob items (the server does not say what it keeps); peak_rss_bytes = the process's peak resident memory during the runs, rss_before_bytes = what was resident when they began; medians of the repetitions"));
    emit(
        "steadfast",
        "cosmos",
        "W7",
        "one transactional batch per checkpoint, blob items written before it (local protocol server, in memory)",
        serde_json::Value::Object(figures),
    );
    Ok(())
}

fn fastrand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
