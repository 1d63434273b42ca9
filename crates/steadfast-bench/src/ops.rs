//! The cost of operating runs: retention (`gc`) on 100,000 finished runs,
//! and what `prune` does to the size of a long run's history.
//!
//! ```text
//! cargo run --release -p steadfast-bench -- --workloads gc,prune --stores sqlite,postgres
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast::retention::{collect, Retention};
use steadfast::{open_store, ops, update, Clock, Runner, Store, SystemClock, Workflow};

use crate::workloads::{fresh_url, ten_steps, Res};
use crate::{durability, emit, Args};

/// Deletes `n` finished runs of the ten-step workflow (each with its ten
/// history rows) with the default retention policy and reports the cost
/// per deleted run. One measurement per store: filling the store takes
/// most of the time.
pub async fn gc(kind: &str, args: &Args) -> Res<()> {
    let n = match (args.quick, kind) {
        (true, _) => 1_000,
        (false, "file") => 1_000,
        _ => 100_000,
    };
    let url = fresh_url(kind, &args.dir, &format!("gc-{n}"));
    let store = open_store(&url).await?;
    let wf = Arc::new(ten_steps());
    let fill = Instant::now();
    crate::workloads::drive_pub("old", n, 64, {
        let (store, wf) = (Arc::clone(&store), Arc::clone(&wf));
        move |id| {
            let (store, wf) = (Arc::clone(&store), Arc::clone(&wf));
            async move { Runner::new(&*store).run(&id, &wf).await.map(|_| ()) }
        }
    })
    .await?;
    let filled = fill.elapsed();
    // Everything finished before now counts as old.
    let later = SystemClock.now().saturating_add(Duration::from_secs(3600));
    let policy = Retention::new(Duration::from_secs(60));
    let t = Instant::now();
    let report = collect(&*store, &policy, later, |_| {}).await?;
    let took = t.elapsed();
    let left = store.list(&steadfast::ListFilter::new().limit(1)).await?;
    emit(
        "steadfast",
        kind,
        &format!("gc@{n}"),
        durability(kind),
        json!({
            "runs_deleted": report.deleted,
            "batches": report.batches,
            "us_per_deleted_run": took.as_secs_f64() * 1e6 / report.deleted.max(1) as f64,
            "seconds": took.as_secs_f64(),
            "left": left.len(),
            "fill_seconds": filled.as_secs_f64(),
            "notes": if kind == "file" && !args.quick {
                "1,000 runs instead of 100,000: every delete rewrites the whole file"
            } else {
                "one measurement: filling the store takes most of the time; batches of 500, 256 deletes in flight"
            },
        }),
    );
    drop(store);
    if kind == "postgres" {
        crate::pg::drop_schema(&url);
    }
    Ok(())
}

/// A run of `steps` steps whose state carries a growing list of messages
/// (as an agent's does), then `prune --keep-history 10`: the space its
/// history takes before and after, and the time the prune took.
pub async fn prune(kind: &str, args: &Args) -> Res<()> {
    if !matches!(kind, "sqlite" | "postgres") {
        return Ok(());
    }
    let steps = if args.quick { 50 } else { 500 };
    let url = fresh_url(kind, &args.dir, &format!("prune-{steps}"));
    let store = open_store(&url).await?;
    let mut b = Workflow::builder("agent");
    for i in 0..steps {
        b = b.step(format!("turn-{i:04}"), move |_, s| {
            let mut messages = s
                .get("messages")
                .and_then(|m| m.as_array())
                .cloned()
                .unwrap_or_default();
            messages.push(json!(format!("message {i:04}: {}", "x".repeat(90))));
            async move { update(json!({"messages": messages, "turn": i})) }
        });
    }
    let wf = b.build()?;
    Runner::new(&*store).run("long", &wf).await?;
    let before = used_bytes(kind, &url, &store).await?;
    let t = Instant::now();
    let pruned = ops::prune(&*store, "long", 10, "bench", &SystemClock).await?;
    let took = t.elapsed();
    let after = used_bytes(kind, &url, &store).await?;
    emit(
        "steadfast",
        kind,
        &format!("prune@{steps}"),
        durability(kind),
        json!({
            "bytes_before": before,
            "bytes_after": after,
            "rows_deleted": pruned.map_or(0, |p| p.rows_deleted),
            "prune_ms": took.as_secs_f64() * 1e3,
            "notes": "each step appends a 100-byte message to a list in the state; --keep-history 10; bytes in use: SQLite, the database's pages not free; PostgreSQL, the steps table with its indexes and TOAST after VACUUM",
        }),
    );
    drop(store);
    if kind == "postgres" {
        crate::pg::drop_schema(&url);
    }
    Ok(())
}

/// The bytes the store's history takes: SQLite, the pages in use;
/// PostgreSQL, the steps table with its TOAST and indexes (after a VACUUM,
/// so that deleted rows count as freed).
async fn used_bytes(kind: &str, url: &str, store: &Arc<dyn Store>) -> Res<u64> {
    let _ = store;
    if kind == "sqlite" {
        let path = url.trim_start_matches("sqlite:").to_string();
        let conn = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        let get = |p: &str| -> rusqlite::Result<i64> {
            conn.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))
        };
        let used = (get("page_count")? - get("freelist_count")?) * get("page_size")?;
        return Ok(used as u64);
    }
    crate::pg::steps_bytes(url).await
}
