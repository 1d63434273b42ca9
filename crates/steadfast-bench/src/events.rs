//! Events: how many one step can emit per second with a watcher attached,
//! and how long an event takes from `emit` to the watcher (p50, p99).
//!
//! Throughput: one durable run whose one step emits N small events, awaiting
//! (`yield_now`) after every 100 as a streaming step would; timed from the
//! run's start until the watcher, a task of the same process on the same
//! store, has read the last event. Latency: one step emits an event every
//! 20 ms carrying the instant it was emitted; the watcher records how long
//! each took to reach it. Both include the batching (an event waits in its
//! step's buffer up to 100 ms) and the watcher's poll (5 ms here; PostgreSQL
//! wakes it by NOTIFY).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast::watch::{Watch, WatchItem};
use steadfast::{durable, open_store, StepCtx, StepError, Store};

use crate::workloads::{fresh_url, Res};
use crate::{durability, emit, median, Args};

/// The watcher's poll in these measurements.
const POLL: Duration = Duration::from_millis(5);

/// Measures `kind` (`sqlite`, `postgres`, `memory`).
pub async fn measure(kind: &str, args: &Args) -> Res<()> {
    let n: u64 = if args.quick { 500 } else { 20_000 };
    let spaced: u64 = if args.quick { 10 } else { 150 };
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    for rep in 0..args.reps() {
        let url = fresh_url(kind, &args.dir, &format!("events-{rep}"));
        let store = open_store(&url).await?;
        rates.push(throughput(&store, n).await?);
        let mut lat = latencies(&store, spaced).await?;
        lat.sort_by(|a, b| a.total_cmp(b));
        p50s.push(percentile(&lat, 0.50));
        p99s.push(percentile(&lat, 0.99));
    }
    emit(
        "steadfast",
        kind,
        "events",
        durability(kind),
        json!({
            "events_per_run": n,
            "events_per_sec": median(rates).round(),
            "latency_events": spaced,
            "emit_to_watch_p50_ms": round2(median(p50s)),
            "emit_to_watch_p99_ms": round2(median(p99s)),
            "batch_every_ms": steadfast::watch::FLUSH_EVERY.as_millis() as u64,
            "watch_poll_ms": POLL.as_millis() as u64,
            "reps": args.reps(),
            "notes": "one step emitting, a watcher in the same process; medians over the repetitions",
        }),
    );
    Ok(())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Events per second from the run's start to the watcher's reading of the
/// last one.
async fn throughput(store: &Arc<dyn Store>, n: u64) -> Res<f64> {
    let watcher = watch_until(Arc::clone(store), "burst", n);
    let start = Instant::now();
    let s = Arc::clone(store);
    let out = durable("burst", &s, "events", |ctx| async move {
        ctx.step("emit", || async move {
            let step = StepCtx::current().expect("inside a step");
            for i in 0..n {
                step.emit(json!({ "i": i }))
                    .map_err(|e| StepError::terminal(e.to_string()))?;
                if i % 100 == 99 {
                    tokio::task::yield_now().await;
                }
            }
            Ok::<_, StepError>(n)
        })
        .await
    })
    .await?;
    if out.completed() != Some(n) {
        return Err("the burst run did not complete".into());
    }
    watcher.await??;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Milliseconds from each emit to the watcher.
async fn latencies(store: &Arc<dyn Store>, n: u64) -> Res<Vec<f64>> {
    let base = Instant::now();
    let s = Arc::clone(store);
    let watcher = tokio::spawn(async move {
        let mut w = Watch::new(&*s, "spaced").poll_every(POLL)?;
        let mut out = Vec::new();
        while let Some(item) = w.next().await? {
            if let WatchItem::Event { event } = item {
                let sent = event.value["us"].as_f64().unwrap_or(f64::NAN);
                let now = base.elapsed().as_secs_f64() * 1e6;
                out.push((now - sent) / 1000.0);
            }
        }
        Ok::<_, steadfast::Error>(out)
    });
    let s = Arc::clone(store);
    durable("spaced", &s, "events", |ctx| async move {
        ctx.step("emit", || async move {
            let step = StepCtx::current().expect("inside a step");
            for _ in 0..n {
                let us = base.elapsed().as_secs_f64() * 1e6;
                step.emit(json!({ "us": us }))
                    .map_err(|e| StepError::terminal(e.to_string()))?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok::<_, StepError>(())
        })
        .await
    })
    .await?;
    Ok(watcher.await??)
}

/// A watcher task that ends once it has read `n` events of `run_id`.
fn watch_until(
    store: Arc<dyn Store>,
    run_id: &'static str,
    n: u64,
) -> tokio::task::JoinHandle<Result<(), steadfast::Error>> {
    tokio::spawn(async move {
        let mut w = Watch::new(&*store, run_id).poll_every(POLL)?;
        let mut seen = 0;
        while let Some(item) = w.next().await? {
            if matches!(item, WatchItem::Event { .. }) {
                seen += 1;
                if seen == n {
                    return Ok(());
                }
            }
        }
        Ok(())
    })
}
