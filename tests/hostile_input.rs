//! Hostile input through the library: clocks that lie, saves that fail, and
//! arbitrary durations, ids, names and values. Each ends in an error or a
//! success, never a panic, a hang or a store that stops loading.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use steadfast::{
    approve, current_owner, Clock, Error, ManualClock, MemoryStore, OnTimeout, Outcome, Owner,
    RetryPolicy, RunStatus, Runner, Step, Store, SystemClock, Timestamp, Workflow,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Finding 11: a live holder on this host keeps its lease even when its wall
/// clock is an hour behind (its lease looks expired by another's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_with_a_slow_clock_keeps_its_lease() -> TestResult {
    let store = Arc::new(MemoryStore::new());
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let release = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
    let r = Arc::clone(&release);
    let wf = Workflow::builder("slow")
        .step("wait", move |_, _| {
            let entered = Arc::clone(&entered);
            let r = Arc::clone(&r);
            async move {
                if let Some(tx) = entered.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                r.notified().await;
                steadfast::update(json!({"done": true}))
            }
        })
        .build()?;
    let hour = Duration::from_secs(3600);
    let behind =
        Timestamp::from_unix_millis(SystemClock.now().unix_millis() - hour.as_millis() as u64);
    let (s, w) = (Arc::clone(&store), wf.clone());
    let holder = tokio::spawn(async move {
        Runner::new(&*s)
            .clock(Arc::new(ManualClock::new(behind)))
            .lease(current_owner(), Duration::from_secs(30))
            .run("r", &w)
            .await
    });
    entered_rx.await?;
    let me = current_owner();
    let other = Owner::new(me.host.clone(), me.pid.wrapping_add(1), 1);
    let taker = Runner::new(&*store)
        .lease(other, Duration::from_secs(30))
        .run("r", &wf)
        .await;
    assert!(
        matches!(taker, Err(Error::Held { .. })),
        "taken over: {taker:?}"
    );
    release.notify_one();
    assert!(holder.await??.completed().is_some());
    Ok(())
}

/// Finding 11: a timer set while the clock was a day ahead does not wait the
/// extra day once the clock is set right; neither does a gate's timeout.
#[tokio::test]
async fn a_clock_set_back_does_not_stretch_timers_or_gate_timeouts() -> TestResult {
    let day = Duration::from_secs(86_400);
    let hour = Duration::from_secs(3600);
    let now = Timestamp::from_unix_millis(1_800_000_000_000);
    let clock = Arc::new(ManualClock::new(now.saturating_add(day)));
    let store = MemoryStore::new();
    let wf = Workflow::builder("t")
        .push(Step::sleep("nap", hour))
        .push(Step::gate("review").gate_timeout(hour, OnTimeout::Approve))
        .build()?;
    let runner = Runner::new(&store).clock(clock.clone());
    assert!(matches!(
        runner.run("r", &wf).await?,
        Outcome::Sleeping { .. }
    ));
    clock.set(now);
    match runner.run("r", &wf).await? {
        Outcome::Sleeping { until } => assert!(until <= now.saturating_add(hour), "{until}"),
        other => panic!("expected Sleeping, got {other:?}"),
    }
    clock.set(now.saturating_add(hour));
    assert!(matches!(
        runner.run("r", &wf).await?,
        Outcome::Waiting { .. }
    ));
    // The gate's wait began an hour after `now`; a day-ahead clock there, then
    // set right, must not push its timeout a day out.
    store.delete("r").await?;
    clock.set(now.saturating_add(day));
    assert!(matches!(
        runner.run("r", &wf).await?,
        Outcome::Sleeping { .. }
    ));
    clock.set(now.saturating_add(day + hour));
    assert!(matches!(
        runner.run("r", &wf).await?,
        Outcome::Waiting { .. }
    ));
    clock.set(now.saturating_add(hour));
    assert!(matches!(
        runner.run("r", &wf).await?,
        Outcome::Waiting { .. }
    ));
    clock.set(now.saturating_add(hour * 2 + Duration::from_secs(1)));
    assert!(
        runner.run("r", &wf).await?.completed().is_some(),
        "the gate timed out within its hour"
    );
    Ok(())
}

/// Finding 7: a checkpoint that the store refuses leaves the run failed, with
/// the cause, the state as before the step, and no lease.
#[tokio::test]
async fn a_refused_checkpoint_is_recorded_as_the_failure() -> TestResult {
    let store = MemoryStore::with_state_limit(1024);
    let wf = Workflow::builder("big")
        .step("small", |_, _| async {
            steadfast::update(json!({"small": 1}))
        })
        .step("huge", |_, _| async {
            steadfast::update(json!({"huge": "x".repeat(4096)}))
        })
        .build()?;
    let err = Runner::new(&store)
        .lease(current_owner(), Duration::from_secs(30))
        .run("r", &wf)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("save after step 1"), "{err}");
    let cp = store.load("r").await?.expect("recorded");
    assert_eq!(cp.status, RunStatus::Failed);
    assert_eq!(cp.next, 1);
    assert_eq!(Value::Object(cp.state), json!({"small": 1}));
    assert!(cp.lease.is_none());
    let msg = cp.error.expect("an error").message;
    assert!(
        msg.contains("could not be saved") && msg.contains("over the limit"),
        "{msg}"
    );
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => steadfast_conformance::checks::json_value(),
        1 => (0usize..140).prop_map(|d| {
            let mut v = json!(0);
            for _ in 0..d {
                v = json!([v]);
            }
            v
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary durations, run ids, names, step outputs and decision data
    /// through the run loop on the file store: an error or a success, never a
    /// panic; what was accepted loads back, and the store keeps loading.
    #[test]
    fn hostile_input_through_the_run_loop_never_breaks_the_store(
        timeout_ms in prop_oneof![1 => Just(0u64), 6 => 1u64..100_000, 1 => Just(u64::MAX)],
        sleep_ms in prop_oneof![2 => Just(0u64), 4 => 0u64..10_000, 1 => Just(u64::MAX / 3)],
        backoff_ms in prop_oneof![2 => Just(0u64), 4 => 0u64..1_000, 1 => Just(u64::MAX)],
        lease_ms in prop_oneof![1 => Just(0u64), 6 => 50u64..5_000, 1 => Just(u64::MAX)],
        run_id in prop_oneof![2 => ".{0,20}", 4 => "[a-z]{1,8}", 1 => Just("x".repeat(201))],
        step_name in prop_oneof![1 => ".{0,12}", 3 => "[a-z]{1,6}"],
        output in json_value(),
        data in json_value(),
        by in ".{0,10}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = open_now(&format!("file:{}/runs.json", dir.path().display())).unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp::from_unix_millis(1_800_000_000_000)));
        let out = output.clone();
        let built = Workflow::builder("hostile")
            .push(
                Step::new(step_name.clone(), move |_, _| {
                    let out = out.clone();
                    async move { steadfast::update(json!({"out": out})) }
                })
                .timeout(Duration::from_millis(timeout_ms))
                .retry(RetryPolicy::new(1).backoff(Duration::from_millis(backoff_ms), Duration::from_millis(backoff_ms))),
            )
            .push(Step::gate("review"))
            .push(Step::sleep("nap", Duration::from_millis(sleep_ms)))
            .build();
        let Ok(wf) = built else { return Ok(()) };
        rt().block_on(async {
            let runner = Runner::new(&*store)
                .clock(clock.clone())
                .lease(current_owner(), Duration::from_millis(lease_ms));
            let first = runner.run(&run_id, &wf).await;
            if let Ok(Outcome::Waiting { .. }) = first {
                let decided = approve(&*store, &run_id, "review", Some(data.clone()), &by, &*clock).await;
                let again = runner.run(&run_id, &wf).await;
                if decided.is_ok() {
                    if let Ok(Outcome::Sleeping { .. } | Outcome::Completed(_)) = &again {
                        let cp = store.load(&run_id).await.unwrap().unwrap();
                        let expect = if data.is_null() { Value::Null } else { data.clone() };
                        prop_assert_eq!(&cp.state["review"], &expect);
                    }
                }
            }
            // Whatever happened, the store still loads and lists.
            store.list(&steadfast::ListFilter::new()).await.unwrap();
            if steadfast::validate_run_id(&run_id).is_ok() {
                if let Some(cp) = store.load(&run_id).await.unwrap() {
                    if cp.next >= 1 {
                        prop_assert_eq!(&cp.state["out"], &output);
                    }
                }
            }
            Ok(())
        })?;
    }
}

/// Far-future durations saturate timestamps instead of panicking.
#[test]
fn the_largest_allowed_durations_format_and_load_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open_now(&format!("sqlite:{}/runs.db", dir.path().display()))?;
    let hour_before_the_end = Timestamp::from_unix_millis(Timestamp::MAX.unix_millis() - 3_600_000);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(hour_before_the_end));
    let wf = Workflow::builder("far")
        .push(Step::sleep("nap", steadfast::limits::SLEEP.max))
        .build()?;
    let out = rt().block_on(
        Runner::new(&*store)
            .clock(clock)
            .lease(current_owner(), steadfast::limits::LEASE.max)
            .run("r", &wf),
    )?;
    assert_eq!(
        out,
        Outcome::Sleeping {
            until: Timestamp::MAX
        }
    );
    assert!(rt().block_on(store.load("r"))?.is_some());
    Ok(())
}

/// Finding 7, for durable functions: a result or a parallel branch whose
/// checkpoint the store refuses leaves the run failed with the cause (once
/// every branch is over), not running.
#[tokio::test]
async fn durable_results_and_branches_that_cannot_be_saved_fail_the_run() -> TestResult {
    let store = MemoryStore::with_state_limit(1024);
    let err = Runner::new(&store)
        .lease(current_owner(), Duration::from_secs(30))
        .durable("result", "big", |ctx| async move {
            let a: u32 = ctx
                .step("a", || async { Ok::<_, steadfast::StepError>(1) })
                .await?;
            Ok(format!("{a}{}", "x".repeat(4096)))
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("save of the result"), "{err}");
    let cp = store.load("result").await?.expect("recorded");
    assert_eq!(cp.status, RunStatus::Failed);
    assert!(cp.lease.is_none());
    assert!(cp
        .error
        .expect("an error")
        .message
        .contains("could not be saved"));

    let err = Runner::new(&store)
        .lease(current_owner(), Duration::from_secs(30))
        .durable("branches", "big", |ctx| async move {
            let out: Vec<String> = ctx
                .parallel(vec![
                    (
                        "small".to_string(),
                        Box::pin(async { Ok::<_, steadfast::StepError>("s".to_string()) })
                            as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
                    ),
                    (
                        "huge".to_string(),
                        Box::pin(async {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, steadfast::StepError>("x".repeat(4096))
                        }),
                    ),
                ])
                .await?;
            Ok(out.len())
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("huge"), "{err}");
    let cp = store.load("branches").await?.expect("recorded");
    assert_eq!(cp.status, RunStatus::Failed, "{cp:?}");
    assert_eq!(cp.completed, vec!["small".to_string()]);
    assert!(cp.lease.is_none());
    Ok(())
}

/// Review finding: a runner held up between two steps (stopped, or slow code
/// between them) past a third of its lease renews before its next step, so it
/// learns it was taken over before it starts that step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_held_up_between_steps_checks_its_lease_before_the_next() -> TestResult {
    use std::sync::atomic::{AtomicU32, Ordering};
    let store = MemoryStore::new();
    let ran_b = Arc::new(AtomicU32::new(0));
    let (s, rb) = (store.clone(), Arc::clone(&ran_b));
    let holder = tokio::spawn(async move {
        Runner::new(&s)
            .lease(Owner::new("host-a", 1, 1), Duration::from_millis(300))
            .durable("r", "held-up", |ctx| async move {
                ctx.step("a", || async { Ok::<_, steadfast::StepError>(1) })
                    .await?;
                // Held up between steps, with no step running to renew.
                tokio::time::sleep(Duration::from_millis(250)).await;
                ctx.step("b", || {
                    let rb = Arc::clone(&rb);
                    async move {
                        rb.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, steadfast::StepError>(2)
                    }
                })
                .await
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut cp = store.load("r").await?.expect("claimed");
    cp.lease = Some(steadfast::Lease::new(
        Owner::new("host-b", 2, 2),
        Timestamp::MAX,
    ));
    store
        .save(steadfast::store::SaveRequest::new(&cp, Some(cp.version)))
        .await?;
    let out = holder.await?;
    assert!(matches!(&out, Err(e) if e.is_held_elsewhere()), "{out:?}");
    assert_eq!(
        ran_b.load(Ordering::SeqCst),
        0,
        "step b started after the takeover"
    );
    Ok(())
}

/// An attempt count past the limit is refused when the workflow is built.
#[test]
fn attempt_counts_past_the_limit_are_refused() {
    let limit = steadfast::limits::MAX_ATTEMPTS;
    let build = |attempts: u32| {
        Workflow::builder("w")
            .push(
                Step::new("a", |_, _| async { steadfast::update(json!({})) })
                    .retry(RetryPolicy::new(attempts)),
            )
            .build()
    };
    assert!(build(limit).is_ok());
    let err = build(limit + 1).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
}

/// Opens a store from a test that has no runtime of its own.
fn open_now(url: &str) -> Result<Arc<dyn steadfast::Store>, steadfast::StoreError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(steadfast::open_store(url))
}
