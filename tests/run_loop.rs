//! Behaviour of the run loop on the memory store: resume, failure records,
//! retries, timeouts, changed workflows, values that cannot be stored.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use steadfast::{
    run, update, Error, MemoryStore, Outcome, RetryPolicy, RunStatus, Runner, Step, StepError,
    Store, TypedWorkflow, Workflow,
};

type Log = Arc<Mutex<Vec<String>>>;
type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A workflow of steps `s0..s{n}`; step i returns `{"s<i>": i}` and logs its name.
/// `fail` decides, from (step index, attempt), whether an attempt fails.
fn counting(
    n: usize,
    log: &Log,
    fail: impl Fn(usize, u32) -> Option<StepError> + Send + Sync + 'static,
) -> Workflow {
    let fail = Arc::new(fail);
    let mut b = Workflow::builder("counting");
    for i in 0..n {
        let log = Arc::clone(log);
        let fail = Arc::clone(&fail);
        b = b.push(
            Step::new(format!("s{i}"), move |ctx, state| {
                let log = Arc::clone(&log);
                let fail = Arc::clone(&fail);
                async move {
                    log.lock().unwrap().push(ctx.step().to_string());
                    if i > 0 && state.get(&format!("s{}", i - 1)) != Some(&json!(i - 1)) {
                        return Err(StepError::terminal(format!(
                            "step {i} did not see step {}'s update",
                            i - 1
                        )));
                    }
                    if let Some(e) = fail(i, ctx.attempt()) {
                        return Err(e);
                    }
                    update(json!({ format!("s{i}"): i }))
                }
            })
            .retry(RetryPolicy::new(1)),
        );
    }
    b.build().unwrap()
}

fn expected_state(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("s{i}"), json!(i))).collect())
}

fn ran(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test]
async fn failed_step_is_recorded_and_resume_skips_completed_steps() -> TestResult {
    let store = MemoryStore::new();
    let log = Log::default();
    let flaky = Arc::new(AtomicU32::new(0));
    let f = Arc::clone(&flaky);
    let wf = counting(4, &log, move |i, _| {
        (i == 2 && f.fetch_add(1, Ordering::SeqCst) == 0)
            .then(|| StepError::retryable("tool is down"))
    });
    let err = run("r1", &wf, &store).await.unwrap_err();
    match &err {
        Error::StepFailed {
            index,
            step,
            attempts,
            ..
        } => {
            assert_eq!((*index, step.as_str(), *attempts), (2, "s2", 1));
        }
        other => panic!("expected StepFailed, got {other}"),
    }
    assert!(err.to_string().contains("step 2 (s2)"), "{err}");
    let cp = store.load("r1").await?.expect("a checkpoint");
    assert_eq!(cp.status, RunStatus::Failed);
    assert_eq!(cp.completed, ["s0", "s1"]);
    let failure = cp.error.as_ref().expect("the error is recorded");
    assert_eq!((failure.index, failure.attempt), (2, 1));
    assert!(failure.message.contains("tool is down"));
    assert_eq!(ran(&log), ["s0", "s1", "s2"]);

    let out = run("r1", &wf, &store).await?;
    assert_eq!(
        ran(&log),
        ["s2", "s3"],
        "only the failed step and later ones run"
    );
    assert_eq!(out.completed().map(Value::Object), Some(expected_state(4)));
    let cp = store.load("r1").await?.expect("a checkpoint");
    assert_eq!(
        (cp.status, cp.error.is_none(), cp.next),
        (RunStatus::Completed, true, 4)
    );
    Ok(())
}

#[tokio::test]
async fn completed_run_returns_its_state_without_running_anything() -> TestResult {
    let store = MemoryStore::new();
    let log = Log::default();
    let wf = counting(3, &log, |_, _| None);
    run("r", &wf, &store).await?;
    ran(&log);
    let version = store.load("r").await?.map(|c| c.version);
    let out = run("r", &wf, &store).await?;
    assert!(ran(&log).is_empty());
    assert_eq!(
        out,
        Outcome::Completed(expected_state(3).as_object().unwrap().clone())
    );
    assert_eq!(
        store.load("r").await?.map(|c| c.version),
        version,
        "nothing was saved"
    );
    Ok(())
}

#[tokio::test]
async fn changed_workflow_is_refused_before_any_step_runs() -> TestResult {
    let store = MemoryStore::new();
    let log = Log::default();
    let wf = counting(3, &log, |i, _| {
        (i == 2).then(|| StepError::terminal("stop"))
    });
    let _ = run("r", &wf, &store).await;
    ran(&log);

    let renamed = Workflow::builder("counting")
        .step("s0", |_, _| async { update(json!({})) })
        .step("renamed", |_, _| async { update(json!({})) })
        .step("s2", |_, _| async { update(json!({})) })
        .build()?;
    match run("r", &renamed, &store).await {
        Err(Error::WorkflowChanged {
            at, stored, given, ..
        }) => {
            assert_eq!(
                (at, stored.as_deref(), given.as_deref()),
                (1, Some("s1"), Some("renamed"))
            );
        }
        other => panic!("expected WorkflowChanged, got {other:?}"),
    }
    let shorter = counting(1, &log, |_, _| None);
    assert!(matches!(
        run("r", &shorter, &store).await,
        Err(Error::WorkflowChanged { at: 1, .. })
    ));
    let other_name = Workflow::builder("other")
        .step("s0", |_, _| async { update(json!({})) })
        .build()?;
    assert!(matches!(
        run("r", &other_name, &store).await,
        Err(Error::WorkflowChanged { .. })
    ));
    assert!(ran(&log).is_empty(), "no step ran");

    // With the override, the record is relabelled and the run goes on.
    let out = Runner::new(&store)
        .accept_changed_workflow(true)
        .run("r", &renamed)
        .await?;
    assert!(out.completed().is_some());
    assert_eq!(
        store.load("r").await?.map(|c| c.completed),
        Some(vec!["s0".into(), "renamed".into(), "s2".into()])
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn retryable_errors_are_retried_with_backoff_and_terminal_ones_are_not() -> TestResult {
    let store = MemoryStore::new();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    let wf = Workflow::builder("retry")
        .push(
            Step::new("flaky", move |ctx, _| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().unwrap().push(ctx.attempt());
                    if ctx.attempt() < 3 {
                        return Err(StepError::retryable("try again"));
                    }
                    update(json!({"ok": ctx.attempt()}))
                }
            })
            .retry(RetryPolicy::new(5).backoff(Duration::from_secs(1), Duration::from_secs(10))),
        )
        .build()?;
    let start = tokio::time::Instant::now();
    let out = run("r", &wf, &store).await?;
    assert_eq!(*attempts.lock().unwrap(), [1, 2, 3]);
    assert_eq!(out.completed().map(|s| s["ok"].clone()), Some(json!(3)));
    // Two waits: 1 s then 2 s, each jittered into [50%, 100%].
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited <= Duration::from_secs(3),
        "{waited:?}"
    );

    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let wf = Workflow::builder("terminal")
        .push(
            Step::new("doomed", move |_, _| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Err::<steadfast::Update, _>(StepError::terminal("no such document")) }
            })
            .retry(RetryPolicy::new(5)),
        )
        .build()?;
    assert!(matches!(
        run("t", &wf, &store).await,
        Err(Error::StepFailed { attempts: 1, .. })
    ));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a terminal error is not retried"
    );
    assert!(store
        .load("t")
        .await?
        .and_then(|c| c.error)
        .is_some_and(|e| e.terminal));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn timeout_cancels_the_attempt_and_counts_as_a_failure() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("slow")
        .push(
            Step::new("hang", |_, _| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                update(json!({}))
            })
            .timeout(Duration::from_secs(2))
            .retry(
                RetryPolicy::new(2).backoff(Duration::from_millis(10), Duration::from_millis(10)),
            ),
        )
        .build()?;
    match run("r", &wf, &store).await {
        Err(Error::StepFailed {
            attempts,
            timed_out,
            ..
        }) => assert_eq!((attempts, timed_out), (2, true)),
        other => panic!("expected a timeout failure, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn attempt_counts_survive_an_interrupted_call() -> TestResult {
    let store = MemoryStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let wf = Workflow::builder("interrupted")
        .push(
            Step::new("step", move |ctx, _| {
                let s = Arc::clone(&s);
                async move {
                    s.lock().unwrap().push(ctx.attempt());
                    if ctx.attempt() == 1 {
                        return Err(StepError::retryable("first attempt fails"));
                    }
                    // Attempt 2 hangs: the call is dropped mid-step, like a crash.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    update(json!({}))
                }
            })
            .retry(RetryPolicy::new(3).backoff(Duration::from_millis(1), Duration::from_millis(1))),
        )
        .build()?;
    let cut = tokio::time::timeout(Duration::from_secs(10), run("r", &wf, &store)).await;
    assert!(cut.is_err(), "the call was cut short");
    let cp = store
        .load("r")
        .await?
        .expect("the failed attempt was saved");
    assert_eq!((cp.attempts, cp.status), (1, RunStatus::Running));
    let _ = tokio::time::timeout(Duration::from_secs(10), run("r", &wf, &store)).await;
    // Attempt numbering continues after the recorded failure.
    assert_eq!(*seen.lock().unwrap(), [1, 2, 2]);
    Ok(())
}

#[tokio::test]
async fn values_too_deep_to_load_are_refused_naming_step_and_path() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("deep")
        .step("ok", |_, _| async { update(json!({"fine": 1})) })
        .step("nest", |_, _| async {
            let mut v = json!(0);
            for _ in 0..150 {
                v = json!([v]);
            }
            update(json!({"report": {"rows": v}}))
        })
        .build()?;
    match run("r", &wf, &store).await {
        Err(Error::InvalidValue {
            index, step, path, ..
        }) => {
            assert_eq!((index, step.as_str()), (1, "nest"));
            assert!(path.starts_with("report.rows[0]"), "{path}");
        }
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    let cp = store.load("r").await?.expect("checkpoint");
    assert_eq!((cp.next, cp.status), (1, RunStatus::Failed));
    assert!(!cp.state.contains_key("report"));
    Ok(())
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Scores {
    #[serde(default)]
    count: u32,
    #[serde(default)]
    mean: f64,
}

#[tokio::test]
async fn typed_nan_is_refused_before_it_is_saved() -> TestResult {
    let store = MemoryStore::new();
    let wf = TypedWorkflow::<Scores>::builder("scores")
        .step("count", |_, s| async move { Ok(Scores { count: 0, ..s }) })
        .step("mean", |_, s| async move {
            Ok(Scores {
                mean: 0.0 / s.count as f64,
                ..s
            })
        })
        .build()?;
    match wf.run("r", &store).await {
        Err(Error::InvalidValue {
            step, path, reason, ..
        }) => {
            assert_eq!((step.as_str(), path.as_str()), ("mean", "mean"));
            assert!(reason.contains("NaN"), "{reason}");
        }
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    let cp = store.load("r").await?.expect("checkpoint");
    assert_eq!(cp.next, 1, "the bad value was not checkpointed");
    Ok(())
}

#[tokio::test]
async fn typed_patch_steps_merge_into_the_typed_state() -> TestResult {
    #[derive(Serialize)]
    struct MeanOnly {
        mean: f64,
    }
    let store = MemoryStore::new();
    let wf = TypedWorkflow::<Scores>::builder("scores")
        .step("count", |_, s| async move { Ok(Scores { count: 4, ..s }) })
        .patch("mean", |_, s| async move {
            Ok(MeanOnly {
                mean: 10.0 / s.count as f64,
            })
        })
        .build()?;
    assert_eq!(
        wf.run("r", &store).await?,
        Outcome::Completed(Scores {
            count: 4,
            mean: 2.5
        })
    );
    Ok(())
}

#[tokio::test]
async fn bad_run_ids_and_workflows_are_refused_with_reasons() {
    let store = MemoryStore::new();
    let log = Log::default();
    let wf = counting(1, &log, |_, _| None);
    for bad in ["", "line\nbreak", &"x".repeat(201)] {
        assert!(
            matches!(run(bad, &wf, &store).await, Err(Error::InvalidRunId { .. })),
            "{bad:?}"
        );
    }
    let dup = Workflow::builder("dup")
        .step("a", |_, _| async { update(json!({})) })
        .step("a", |_, _| async { update(json!({})) })
        .build();
    assert!(dup
        .unwrap_err()
        .to_string()
        .contains("step 1 is named \"a\""));
    let empty_name = Workflow::builder("w")
        .step("", |_, _| async { update(json!({})) })
        .build();
    assert!(empty_name.unwrap_err().to_string().contains("empty"));
    assert!(Workflow::builder("none").build().is_err());
}

#[tokio::test]
async fn steps_see_their_context() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("ctx")
        .step("first", |_, _| async { update(json!({})) })
        .step("second/part", |ctx, _| async move {
            update(json!({"ctx": [ctx.run_id(), ctx.step(), ctx.index(), ctx.attempt(), ctx.idempotency_key()]}))
        })
        .build()?;
    let state = run("run/7", &wf, &store).await?.completed().unwrap();
    assert_eq!(
        state["ctx"],
        json!(["run/7", "second/part", 1, 1, "run%2F7/second%2Fpart"])
    );
    Ok(())
}
