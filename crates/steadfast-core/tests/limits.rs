//! Shared limits: at most N steps holding a key run at once across runs
//! and runners; a step that finds no slot waits (durably, or in-process
//! when the runner waits for timers); a provider's "retry after" holds the
//! key for everyone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use steadfast_core::{
    update, Error, LimitDoc, LimitSpec, MemoryStore, Outcome, RunStatus, Runner, Step, StepError,
    Store, Wait, Workflow,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A workflow of one step holding `spec` for `hold`, counting how many run
/// at once.
fn holder(spec: &str, hold: Duration, now: Arc<AtomicUsize>, most: Arc<AtomicUsize>) -> Workflow {
    Workflow::builder("holder")
        .push(
            Step::new("call", move |_, _| {
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                async move {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    update(json!({"called": true}))
                }
            })
            .limit(LimitSpec::parse(spec).unwrap()),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_the_size_run_at_once_and_every_run_finishes() -> TestResult {
    let store = MemoryStore::new();
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let wf = Arc::new(holder(
        "model:2",
        Duration::from_millis(40),
        now,
        Arc::clone(&most),
    ));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (store, wf) = (store.clone(), Arc::clone(&wf));
        tasks.push(tokio::spawn(async move {
            Runner::new(&store)
                .wait_for_timers(true)
                .run(&format!("r{i}"), &wf)
                .await
        }));
    }
    for t in tasks {
        assert!(t.await??.completed().is_some());
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "never more than the size");
    let docs = steadfast_core::store::documents_of(&store)?;
    let doc = docs
        .get_document("limit:model")
        .await?
        .expect("the limit's document");
    assert!(
        LimitDoc::from_value(&doc.value)?.held.is_empty(),
        "every slot given back"
    );
    Ok(())
}

#[tokio::test]
async fn a_run_without_a_slot_sleeps_durably_and_takes_one_later() -> TestResult {
    let store = MemoryStore::new();
    // Someone else holds the only slot, until 300 ms from now.
    let docs = steadfast_core::store::documents_of(&store)?;
    let now = steadfast_core::Clock::now(&steadfast_core::SystemClock);
    let other = steadfast_core::Owner::new("elsewhere", 1, 1);
    let mut doc = LimitDoc::default();
    doc.take(
        steadfast_core::Slot::new(
            "other",
            "call",
            other,
            now.saturating_add(Duration::from_millis(300)),
        ),
        Some(1),
        now,
    )?;
    docs.put_document("limit:model", &doc.to_value(), None)
        .await?;

    let (c, m) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let wf = holder("model:1", Duration::from_millis(1), c, m);
    let out = Runner::new(&store).run("r", &wf).await?;
    let Outcome::Sleeping { until } = out else {
        panic!("expected a sleep: {out:?}")
    };
    let cp = store.load("r").await?.unwrap();
    assert_eq!(cp.status, RunStatus::Sleeping);
    assert!(
        matches!(&cp.wait, Some(Wait::Limit { step, key, .. }) if step == "call" && key == "model")
    );
    assert_eq!(cp.runnable_at(), Some(until));
    assert_eq!(cp.next, 0, "the step did not run");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let out = Runner::new(&store).run("r", &wf).await?;
    assert!(matches!(out, Outcome::Completed(_)), "{out:?}");
    let cp = store.load("r").await?.unwrap();
    assert_eq!((cp.status, cp.wait), (RunStatus::Completed, None));
    Ok(())
}

#[tokio::test]
async fn a_retry_after_holds_the_key_for_everyone() -> TestResult {
    let store = MemoryStore::new();
    let tries = Arc::new(AtomicUsize::new(0));
    let t = Arc::clone(&tries);
    let wf = Workflow::builder("limited")
        .push(
            Step::new("call", move |_, _| {
                let t = Arc::clone(&t);
                async move {
                    if t.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err(StepError::retry_after("429", Duration::from_millis(400)));
                    }
                    update(json!({}))
                }
            })
            .limit(LimitSpec::parse("api:4").unwrap()),
        )
        .build()?;
    let started = std::time::Instant::now();
    let out = Runner::new(&store)
        .wait_for_timers(true)
        .run("r", &wf)
        .await?;
    assert!(out.completed().is_some());
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let docs = steadfast_core::store::documents_of(&store)?;
    let doc = LimitDoc::from_value(&docs.get_document("limit:api").await?.unwrap().value)?;
    assert!(
        doc.paused_until.is_some(),
        "the key was paused for everyone"
    );
    // Another run of the key, meanwhile paused, sleeps instead of calling.
    let d = docs.get_document("limit:api").await?.unwrap();
    let mut paused = doc.clone();
    paused.pause(
        steadfast_core::Clock::now(&steadfast_core::SystemClock)
            .saturating_add(Duration::from_secs(60)),
    );
    docs.put_document("limit:api", &paused.to_value(), Some(d.version))
        .await?;
    let out = Runner::new(&store).run("other", &wf).await?;
    assert!(matches!(out, Outcome::Sleeping { .. }), "{out:?}");
    Ok(())
}

#[tokio::test]
async fn a_limit_without_a_size_is_a_clear_error() -> TestResult {
    let store = MemoryStore::new();
    let (c, m) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let wf = holder("unsized", Duration::from_millis(1), c, m);
    let e = Runner::new(&store).run("r", &wf).await.unwrap_err();
    assert!(matches!(e, Error::InvalidWorkflow { .. }), "{e}");
    assert!(e.to_string().contains("no size"), "{e}");
    Ok(())
}

/// A slot whose holder is a dead process on this host is freed at once,
/// and the runner's hook hears of it (holder and run) before the step that
/// takes the slot runs: the command kills the dead holder's step processes
/// there, which would otherwise run on until their supervisors heard.
#[tokio::test]
async fn a_dead_holders_slot_is_reported_before_the_step_that_takes_it_runs() -> TestResult {
    let store = MemoryStore::new();
    let docs = steadfast_core::store::documents_of(&store)?;
    let now = steadfast_core::Clock::now(&steadfast_core::SystemClock);
    let mut child = std::process::Command::new("true").spawn()?;
    let dead_pid = child.id();
    child.wait()?;
    let dead = steadfast_core::Owner::new(steadfast_core::current_owner().host, dead_pid, 1);
    let mut doc = LimitDoc::default();
    doc.take(
        steadfast_core::Slot::new(
            "other",
            "call",
            dead.clone(),
            now.saturating_add(Duration::from_secs(600)),
        ),
        Some(1),
        now,
    )?;
    docs.put_document("limit:model", &doc.to_value(), None)
        .await?;

    let heard: Arc<std::sync::Mutex<Vec<(u32, String)>>> = Arc::default();
    let heard_when_run = Arc::new(AtomicUsize::new(usize::MAX));
    let wf = Workflow::builder("holder")
        .push(
            Step::new("call", {
                let (heard, when) = (Arc::clone(&heard), Arc::clone(&heard_when_run));
                move |_, _| {
                    when.store(heard.lock().unwrap().len(), Ordering::SeqCst);
                    async move { update(json!({"called": true})) }
                }
            })
            .limit(LimitSpec::parse("model:1")?),
        )
        .build()?;
    let out = Runner::new(&store)
        .on_slot_reclaimed({
            let heard = Arc::clone(&heard);
            move |owner, run| heard.lock().unwrap().push((owner.pid, run.to_string()))
        })
        .run("r", &wf)
        .await?;
    assert!(matches!(out, Outcome::Completed(_)), "{out:?}");
    assert_eq!(
        heard_when_run.load(Ordering::SeqCst),
        1,
        "the hook heard of the dead holder before the step ran"
    );
    assert_eq!(*heard.lock().unwrap(), [(dead_pid, "other".to_string())]);
    Ok(())
}
