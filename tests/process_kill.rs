//! The seed's claim, proven with real processes: a process that dies in the middle
//! of a run loses no finished step, and the next process resumes at the next one.

mod support;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use steadfast::{run, update, RetryPolicy, RunStatus, Step, Workflow};
use support::{child_store_url, count_from_env, fresh_store_url, open, role, runtime, spawn_child};

#[test]
fn checkpoint_survives_process_exit() -> Result<(), Box<dyn std::error::Error>> {
    seed_test("file", "checkpoint_survives_process_exit")
}

#[test]
fn checkpoint_survives_process_exit_on_sqlite() -> Result<(), Box<dyn std::error::Error>> {
    seed_test("sqlite", "checkpoint_survives_process_exit_on_sqlite")
}

#[test]
fn checkpoint_survives_process_exit_on_postgres() -> Result<(), Box<dyn std::error::Error>> {
    seed_test("postgres", "checkpoint_survives_process_exit_on_postgres")
}

/// Step `a` checkpoints; step `b` kills its process with exit code 3. A fresh
/// store on the same file then runs only `b`, and the state is `{a: 1, b: 2}`.
fn seed_test(scheme: &str, test: &str) -> Result<(), Box<dyn std::error::Error>> {
    if role().as_deref() == Some("exit_in_b") {
        let store = open(&child_store_url());
        let wf = Workflow::builder("seed")
            .step("a", |_, _| async { update(json!({"a": 1})) })
            .step("b", |_, _| async {
                std::process::exit(3);
                #[allow(unreachable_code)]
                update(json!({}))
            })
            .build()?;
        let _ = runtime().block_on(run("r", &wf, &*store));
        unreachable!("step b exits the process");
    }

    let dir = tempfile::tempdir()?;
    let (url, _schema) = fresh_store_url(scheme, dir.path());
    let status = spawn_child(test, "exit_in_b", &url, &[]).wait()?;
    assert_eq!(status.code(), Some(3), "the child died in step b");

    let ran = Arc::new(Mutex::new(Vec::new()));
    let (ra, rb) = (Arc::clone(&ran), Arc::clone(&ran));
    let wf = Workflow::builder("seed")
        .step("a", move |_, _| {
            ra.lock().unwrap().push("a");
            async { update(json!({"a": 1})) }
        })
        .step("b", move |_, _| {
            rb.lock().unwrap().push("b");
            async { update(json!({"b": 2})) }
        })
        .build()?;
    let store = open(&url);
    let state = runtime()
        .block_on(run("r", &wf, &*store))?
        .completed()
        .expect("completed");
    assert_eq!(*ran.lock().unwrap(), ["b"], "only b ran on resume");
    assert_eq!(serde_json::Value::Object(state), json!({"a": 1, "b": 2}));
    Ok(())
}

const TORTURE_STEPS: usize = 12;

/// The large value `k` of the torture with large values: 100 KB of JSON text,
/// over the default blob threshold, the same in every run that uses it.
fn doc(k: usize) -> String {
    format!("{k}-").repeat(50_000)
}

/// `big`: each step also returns one of three large values (so that runs and
/// steps share them).
fn torture_workflow(log: &Path, big: bool) -> Workflow {
    let mut b = Workflow::builder("torture");
    for i in 0..TORTURE_STEPS {
        let log = log.to_path_buf();
        b = b.push(
            Step::new(format!("s{i}"), move |ctx, state| {
                let log = log.clone();
                async move {
                    let saw_previous =
                        i == 0 || state.get(&format!("s{}", i - 1)) == Some(&json!(i - 1));
                    let line = format!(
                        "{} {i} {}\n",
                        ctx.run_id(),
                        if saw_previous { "ok" } else { "MISSING" }
                    );
                    // One write(2) of one line: it reaches the page cache before
                    // the step returns, so a kill cannot lose it.
                    OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&log)?
                        .write_all(line.as_bytes())?;
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3000))).await;
                    if big {
                        return update(
                            json!({ format!("s{i}"): i, format!("doc{}", i % 3): doc(i % 3) }),
                        );
                    }
                    update(json!({ format!("s{i}"): i }))
                }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().unwrap()
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn sigkill_at_random_moments_never_reruns_or_skips_a_saved_step() -> TestResult {
    torture(
        "file",
        "sigkill_at_random_moments_never_reruns_or_skips_a_saved_step",
    )
}

#[test]
fn sigkill_at_random_moments_never_reruns_or_skips_a_saved_step_on_postgres() -> TestResult {
    torture(
        "postgres",
        "sigkill_at_random_moments_never_reruns_or_skips_a_saved_step_on_postgres",
    )
}

#[test]
fn sigkill_at_random_moments_never_reruns_or_skips_a_saved_step_on_sqlite() -> TestResult {
    torture(
        "sqlite",
        "sigkill_at_random_moments_never_reruns_or_skips_a_saved_step_on_sqlite",
    )
}

/// The same with large values stored as blobs: a kill at any moment leaves
/// no record referring to a blob that is not there.
#[test]
fn sigkill_at_random_moments_with_large_values_on_sqlite() -> TestResult {
    torture_with(
        "sqlite",
        "sigkill_at_random_moments_with_large_values_on_sqlite",
        true,
    )
}

/// The same on the file store, whose blobs are files fsynced (with their
/// directory) before the store file that refers to them is renamed into
/// place.
#[test]
fn sigkill_at_random_moments_with_large_values_on_the_file_store() -> TestResult {
    torture_with(
        "file",
        "sigkill_at_random_moments_with_large_values_on_the_file_store",
        true,
    )
}

/// The same on PostgreSQL, whose blobs go in the record's transaction.
#[test]
fn sigkill_at_random_moments_with_large_values_on_postgres() -> TestResult {
    torture_with(
        "postgres",
        "sigkill_at_random_moments_with_large_values_on_postgres",
        true,
    )
}

/// Runs are killed with SIGKILL at random moments and restarted until they finish.
/// Every step runs, in order; a step runs again at most once per kill; no step
/// sees a state without its predecessor's update; the store opens cleanly.
fn torture(scheme: &str, test: &str) -> TestResult {
    torture_with(scheme, test, false)
}

/// How a torture child says its save met a commit of the process killed
/// before it (see [`torture_with`]).
const CONFLICT_EXIT: i32 = 75;

fn torture_with(scheme: &str, test: &str, big: bool) -> TestResult {
    if role().as_deref() == Some("torture") {
        let store = open(&child_store_url());
        let run_id = std::env::var("STEADFAST_TEST_RUN")?;
        let log = std::env::var("STEADFAST_TEST_LOG")?;
        let wf = torture_workflow(Path::new(&log), big);
        match runtime().block_on(run(&run_id, &wf, &*store)) {
            Ok(_) => std::process::exit(0),
            // The killed predecessor's last commit can reach PostgreSQL
            // after this process loaded the run (a run without a lease
            // claims nothing first): this process's next save then
            // conflicts, nothing is lost, and running again resumes after
            // that commit.
            Err(steadfast::Error::Store { source, .. })
                if source.kind() == steadfast::StoreErrorKind::Conflict =>
            {
                std::process::exit(CONFLICT_EXIT)
            }
            Err(e) => return Err(e.into()),
        }
    }

    let min_kills = count_from_env("STEADFAST_TEST_KILLS", if big { 40 } else { 60 });
    let dir = tempfile::tempdir()?;
    let (url, _schema) = fresh_store_url(scheme, dir.path());
    let log = dir.path().join("steps.log");
    let mut kills_per_run = Vec::new();
    let mut total_kills = 0;
    for r in 0.. {
        if total_kills >= min_kills {
            break;
        }
        let run_id = format!("run-{r}");
        let mut kills = 0;
        let mut conflicts = 0;
        loop {
            let env = [
                ("STEADFAST_TEST_RUN", run_id.clone()),
                ("STEADFAST_TEST_LOG", log.display().to_string()),
            ];
            let mut child = spawn_child(test, "torture", &url, &env);
            // After 30 kills of one run, let it finish so the test always ends.
            if kills < 30 {
                std::thread::sleep(Duration::from_millis(fastrand::u64(5..60)));
                if child.try_wait()?.is_none() {
                    child.kill()?; // SIGKILL
                    child.wait()?;
                    kills += 1;
                    continue;
                }
            }
            let status = child.wait()?;
            if status.code() == Some(CONFLICT_EXIT) && conflicts < 5 {
                conflicts += 1;
                continue;
            }
            assert!(
                status.success(),
                "{run_id}: the child failed on its own: {status}"
            );
            break;
        }
        total_kills += kills;
        kills_per_run.push((run_id, kills));
    }

    let text = std::fs::read_to_string(&log)?;
    let store = open(&url);
    let rt = runtime();
    for (run_id, kills) in &kills_per_run {
        let steps: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{run_id} ")))
            .map(|rest| {
                assert!(
                    rest.ends_with(" ok"),
                    "{run_id}: a step ran without its predecessor's update: {rest}"
                );
                rest.split(' ').next().unwrap().parse().unwrap()
            })
            .collect();
        assert_eq!(steps.first(), Some(&0), "{run_id}: {steps:?}");
        assert_eq!(
            steps.last(),
            Some(&(TORTURE_STEPS - 1)),
            "{run_id}: {steps:?}"
        );
        let mut reruns = 0;
        for pair in steps.windows(2) {
            match pair[1] as isize - pair[0] as isize {
                0 => reruns += 1,
                1 => {}
                _ => panic!(
                    "{run_id}: step {} followed by {}: skipped or went back: {steps:?}",
                    pair[0], pair[1]
                ),
            }
        }
        assert!(
            reruns <= *kills,
            "{run_id}: {reruns} re-executions after {kills} kills: {steps:?}"
        );
        let cp = rt.block_on(store.load(run_id))?.expect("the run is stored");
        assert_eq!(
            (cp.status, cp.next),
            (RunStatus::Completed, TORTURE_STEPS),
            "{run_id}"
        );
        if big {
            for k in 0..3 {
                assert!(
                    cp.state.get(&format!("doc{k}")) == Some(&json!(doc(k))),
                    "{run_id}: large value doc{k} did not load back whole"
                );
            }
            assert_eq!(cp.state.len(), TORTURE_STEPS + 3);
        } else {
            assert_eq!(cp.state.len(), TORTURE_STEPS);
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temp files survived a clean open: {leftovers:?}"
    );
    if big && scheme == "file" {
        // Every run refers to the same three documents: one file each, and
        // nothing else (no temp file of a killed write, no blob left
        // without a reference) once the runs have completed.
        let mut blobs: Vec<String> = std::fs::read_dir(dir.path().join("runs.json.blobs"))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        blobs.sort();
        let mut wanted: Vec<String> = (0..3)
            .map(|k| {
                steadfast::store::blob::BlobHash::of(json!(doc(k)).to_string().as_bytes()).hex()
            })
            .collect();
        wanted.sort();
        assert_eq!(
            blobs, wanted,
            "the blob directory holds the three documents only"
        );
    }
    eprintln!(
        "{total_kills} kills over {} runs: {kills_per_run:?}",
        kills_per_run.len()
    );
    Ok(())
}
