//! Several processes doing compare-and-swap increments on one file store, of a
//! run they share and of a run of their own: no update is lost. With the lock removed or put on the data file
//! instead of the sidecar (test-only mutants), updates are lost, which shows
//! that the test can fail.

mod support;

use std::time::Duration;

use serde_json::json;
use steadfast::file::{FileStore, FileStoreOptions, OsFs};
use steadfast::store::SaveRequest;
use steadfast::{Checkpoint, Store, StoreErrorKind, Timestamp};
use support::{child_store_url, count_from_env, fresh_store_url, open, role, runtime, spawn_child};

const TEST: &str = "concurrent_processes_lose_no_update";

fn mutated() -> bool {
    std::env::var("STEADFAST_TEST_MUTANT").is_ok_and(|m| !m.is_empty())
}

fn options_from_env() -> FileStoreOptions {
    let mut opts = FileStoreOptions::default();
    let mutant = std::env::var("STEADFAST_TEST_MUTANT").unwrap_or_default();
    opts.mutants.no_lock = mutant == "no_lock";
    opts.mutants.lock_data_file = mutant == "lock_data_file";
    // Widen the window between reading the file and replacing it, so that a
    // missing lock shows up as lost updates every time, not by luck.
    opts.mutants.pause_before_rename = Some(Duration::from_millis(1));
    opts
}

async fn increment_loop(
    store: &dyn Store,
    own: &str,
    times: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    for _ in 0..times {
        increment(store, "shared").await?;
        increment(store, own).await?;
    }
    Ok(())
}

/// One compare-and-swap increment of run `run_id`'s `n`, retried on conflict.
async fn increment(store: &dyn Store, run_id: &str) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        let cp = store
            .load(run_id)
            .await?
            .ok_or("the counter run is missing")?;
        let mut next = cp.clone();
        let n = cp.state["n"].as_u64().ok_or("n is not a number")?;
        next.state.insert("n".into(), json!(n + 1));
        match store.save(SaveRequest::new(&next, Some(cp.version))).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == StoreErrorKind::Conflict => {}
            // Without the lock, another process's start-up sweep can remove a
            // temp file in flight: the mutants' own breakage, not under test.
            Err(e) if mutated() && e.kind() == StoreErrorKind::Unavailable => {}
            Err(e) => return Err(e.into()),
        }
    }
}

struct Counts {
    shared: u64,
    shared_version: u64,
    own: Vec<u64>,
}

/// Runs `procs` children of `each` increments of the shared run and of their own.
fn contend(
    scheme: &str,
    procs: usize,
    each: usize,
    mutant: &str,
) -> Result<Counts, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let (url, _schema) = fresh_store_url(scheme, dir.path());
    let store = open(&url);
    let rt = runtime();
    let runs: Vec<String> = std::iter::once("shared".to_string())
        .chain((0..procs).map(|i| format!("own-{i}")))
        .collect();
    for run_id in &runs {
        let mut cp = Checkpoint::new(run_id.as_str(), "count", Timestamp::from_unix_millis(0));
        cp.state.insert("n".into(), json!(0));
        rt.block_on(store.save(SaveRequest::new(&cp, None)))?;
    }
    let children: Vec<_> = (0..procs)
        .map(|i| {
            let env = [
                ("STEADFAST_TEST_MUTANT", mutant.to_string()),
                ("STEADFAST_TEST_EACH", each.to_string()),
                ("STEADFAST_TEST_OWN", format!("own-{i}")),
            ];
            spawn_child(TEST, "increment", &url, &env)
        })
        .collect();
    for mut c in children {
        let status = c.wait()?;
        assert!(status.success(), "an incrementing child failed: {status}");
    }
    let mut counts = Vec::new();
    for run_id in &runs {
        let cp = rt
            .block_on(store.load(run_id))?
            .ok_or("a counter vanished")?;
        counts.push((cp.state["n"].as_u64().unwrap_or(0), cp.version));
    }
    Ok(Counts {
        shared: counts[0].0,
        shared_version: counts[0].1,
        own: counts[1..].iter().map(|c| c.0).collect(),
    })
}

/// The child's part: open the store (the file store with the test's switches)
/// and run the increments.
fn child() -> Result<(), Box<dyn std::error::Error>> {
    let url = child_store_url();
    let store: std::sync::Arc<dyn Store> = match url.strip_prefix("file:") {
        Some(path) => std::sync::Arc::new(FileStore::open_with(OsFs, path, options_from_env())?),
        None => open(&url),
    };
    let each = count_from_env("STEADFAST_TEST_EACH", 200);
    let own = std::env::var("STEADFAST_TEST_OWN")?;
    runtime().block_on(increment_loop(&*store, &own, each))?;
    std::process::exit(0);
}

#[test]
fn concurrent_processes_lose_no_update() -> Result<(), Box<dyn std::error::Error>> {
    if role().as_deref() == Some("increment") {
        return child();
    }
    let c = contend("file", 2, 200, "")?;
    assert_eq!(c.shared, 400, "updates of the shared run were lost");
    assert_eq!(c.shared_version, 401, "one version per save");
    assert_eq!(
        c.own,
        [200, 200],
        "updates of a process's own run were lost"
    );
    Ok(())
}

#[test]
fn control_without_the_lock_updates_are_lost() -> Result<(), Box<dyn std::error::Error>> {
    let c = contend("file", 2, 100, "no_lock")?;
    let total = c.shared + c.own.iter().sum::<u64>();
    assert!(
        total < 400,
        "without a lock every update survived; the contention test would not notice"
    );
    Ok(())
}

#[test]
fn control_locking_the_data_file_instead_of_the_sidecar_loses_updates(
) -> Result<(), Box<dyn std::error::Error>> {
    let c = contend("file", 3, 100, "lock_data_file")?;
    let total = c.shared + c.own.iter().sum::<u64>();
    assert!(
        total < 600,
        "locking the renamed file kept every update; the test would not notice"
    );
    Ok(())
}

#[test]
fn four_processes_on_sqlite_lose_no_update() -> Result<(), Box<dyn std::error::Error>> {
    let c = contend("sqlite", 4, 200, "")?;
    assert_eq!(c.shared, 800, "updates of the shared run were lost");
    assert_eq!(c.shared_version, 801, "one version per save");
    assert_eq!(c.own, [200; 4], "updates of a process's own run were lost");
    Ok(())
}

#[test]
fn four_processes_on_postgres_lose_no_update() -> Result<(), Box<dyn std::error::Error>> {
    let c = contend("postgres", 4, 200, "")?;
    assert_eq!(c.shared, 800, "updates of the shared run were lost");
    assert_eq!(c.shared_version, 801, "one version per save");
    assert_eq!(c.own, [200; 4], "updates of a process's own run were lost");
    Ok(())
}
