//! The commit timings the benchmark's breakdown reads: each commit made
//! while they are on counts once, with time in each phase, and nothing
//! counts while they are off. (A test binary of its own: the sums are the
//! process's.)

use serde_json::json;
use steadfast_core::store::SaveRequest;
use steadfast_core::{Checkpoint, RunStatus, StepRecord, Store, Timestamp};
use steadfast_sqlite::{timings, SqliteStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Saves steps `from..to` of `cp` (as the engine would), from `version`.
async fn save_steps(
    store: &SqliteStore,
    cp: &mut Checkpoint,
    mut version: Option<u64>,
    from: usize,
    to: usize,
) -> Result<Option<u64>, Box<dyn std::error::Error>> {
    let at = Timestamp::from_unix_millis(1_700_000_000_000);
    for i in from..to {
        let up = json!({ format!("s{i}"): i });
        let up = up.as_object().cloned().unwrap_or_default();
        cp.state.extend(up.clone());
        cp.completed.push(format!("s{i}"));
        cp.next = i + 1;
        cp.writer = u64::MAX - i as u64;
        let rec = StepRecord::new(i, &format!("s{i}"), up, 1, at, at);
        version = Some(
            store
                .save(SaveRequest::new(cp, version).with_step(&rec))
                .await?,
        );
    }
    Ok(version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_commit_counts_once_with_its_phases_and_none_while_off() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("t.db"))?;
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1_700_000_000_000));
    cp.status = RunStatus::Running;
    // Never turned on: nothing counted.
    let version = save_steps(&store, &mut cp, None, 0, 2).await?;
    assert_eq!(timings::stop(), timings::Phases::default());
    timings::start();
    let version = save_steps(&store, &mut cp, version, 2, 7).await?;
    let on = timings::stop();
    assert_eq!(on.batches, 5, "{on:?}");
    for (phase, ns) in [
        ("begin", on.begin_ns),
        ("statements", on.statements_ns),
        ("commit", on.commit_ns),
        ("answer", on.answer_ns),
        ("log", on.log_ns),
    ] {
        assert!(ns > 0, "no time in {phase}: {on:?}");
    }
    // After: the sums stay as they were.
    save_steps(&store, &mut cp, version, 7, 9).await?;
    assert_eq!(timings::stop(), on);
    // Started again: from zero.
    timings::start();
    assert_eq!(timings::stop(), timings::Phases::default());
    assert_eq!(
        store.load("r").await?.ok_or("the run is gone")?.next,
        9,
        "every save landed"
    );
    Ok(())
}
