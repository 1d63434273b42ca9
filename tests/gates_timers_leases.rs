//! Gates, durable timers and leases in the run loop.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use steadfast::store::SaveRequest;
use steadfast::StoreExt as _;
use steadfast::{
    approve, current_owner, reject, update, Checkpoint, Clock, Error, Lease, ManualClock,
    MemoryStore, OnTimeout, Outcome, Owner, RunStatus, Runner, Step, Store, Timestamp, Workflow,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_unix_millis(
        1_800_000_000_000,
    )))
}

fn gated(counter: &Arc<AtomicU32>, gate: Step) -> Workflow {
    let c = Arc::clone(counter);
    Workflow::builder("gated")
        .step("draft", |_, _| async { update(json!({"draft": 1})) })
        .push(gate)
        .step("publish", move |_, s| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { update(json!({"published": s["review"].clone()})) }
        })
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_gate_waits_and_an_approval_merges_its_data_and_continues() -> TestResult {
    let (store, clock, n) = (MemoryStore::new(), clock(), Arc::new(AtomicU32::new(0)));
    let wf = gated(&n, Step::gate("review"));
    let runner = Runner::new(&store).clock(clock.clone());
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: "review".into()
        }
    );
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: "review".into()
        },
        "still waiting"
    );
    let cp = store.load("r").await?.expect("run");
    assert_eq!((cp.status, cp.next), (RunStatus::Waiting, 1));
    assert!(matches!(
        approve(&store, "r", "draft", None, "ada", &*clock).await,
        Err(Error::NotWaiting { .. })
    ));
    approve(
        &store,
        "r",
        "review",
        Some(json!({"ok": true})),
        "ada",
        &*clock,
    )
    .await?;
    assert!(
        matches!(
            approve(&store, "r", "review", None, "bo", &*clock).await,
            Err(Error::NotWaiting { .. })
        ),
        "a second decision is refused"
    );
    let state = runner.run("r", &wf).await?.completed().expect("completed");
    assert_eq!(state["published"], json!({"ok": true}));
    assert_eq!(n.load(Ordering::SeqCst), 1);
    let cp = store.load("r").await?.expect("run");
    assert_eq!(cp.decisions.len(), 1);
    assert_eq!(
        (cp.decisions[0].by.as_str(), cp.decisions[0].approved),
        ("ada", true)
    );
    let history = store.history("r").await?.expect("history");
    assert_eq!(history[1].name, "review");
    assert_eq!(history[1].update["review"], json!({"ok": true}));
    Ok(())
}

#[tokio::test]
async fn a_rejection_ends_the_run() -> TestResult {
    let (store, clock, n) = (MemoryStore::new(), clock(), Arc::new(AtomicU32::new(0)));
    let wf = gated(&n, Step::gate("review"));
    let runner = Runner::new(&store).clock(clock.clone());
    runner.run("r", &wf).await?;
    reject(
        &store,
        "r",
        "review",
        Some("too long".into()),
        "bo",
        &*clock,
    )
    .await?;
    let rejected = Outcome::Rejected {
        gate: "review".into(),
        reason: Some("too long".into()),
    };
    assert_eq!(runner.run("r", &wf).await?, rejected);
    assert_eq!(
        store.load("r").await?.map(|c| c.status),
        Some(RunStatus::Rejected)
    );
    assert_eq!(n.load(Ordering::SeqCst), 0, "nothing after the gate ran");
    Ok(())
}

#[tokio::test]
async fn a_gate_past_its_timeout_decides_by_itself() -> TestResult {
    for (on_timeout, approved) in [(OnTimeout::Reject, false), (OnTimeout::Approve, true)] {
        let (store, clock, n) = (MemoryStore::new(), clock(), Arc::new(AtomicU32::new(0)));
        let gate = Step::gate("review").gate_timeout(Duration::from_secs(60), on_timeout);
        let wf = gated(&n, gate);
        let runner = Runner::new(&store).clock(clock.clone());
        runner.run("r", &wf).await?;
        clock.advance(Duration::from_secs(59));
        assert!(
            matches!(runner.run("r", &wf).await?, Outcome::Waiting { .. }),
            "not yet"
        );
        clock.advance(Duration::from_secs(2));
        let out = runner.run("r", &wf).await?;
        assert_eq!(
            matches!(out, Outcome::Completed(_)),
            approved,
            "{on_timeout:?}: {out:?}"
        );
        let cp = store.load("r").await?.expect("run");
        assert_eq!(
            cp.decisions.last().map(|d| (d.by.as_str(), d.approved)),
            Some(("timeout", approved))
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_timer_records_its_wake_up_time_once_and_fires_after_it() -> TestResult {
    let (store, clock) = (MemoryStore::new(), clock());
    let wf = Workflow::builder("timed")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .push(Step::sleep("cooldown", Duration::from_secs(600)))
        .step("b", |_, _| async { update(json!({"b": 2})) })
        .build()?;
    let runner = Runner::new(&store).clock(clock.clone());
    let Outcome::Sleeping { until } = runner.run("r", &wf).await? else {
        panic!("expected Sleeping")
    };
    assert_eq!(
        until.saturating_since(clock.now()),
        Duration::from_secs(600)
    );
    clock.advance(Duration::from_secs(300));
    // Running again (after a crash, say) does not restart the timer.
    assert_eq!(runner.run("r", &wf).await?, Outcome::Sleeping { until });
    clock.advance(Duration::from_secs(301));
    let state = runner.run("r", &wf).await?.completed().expect("completed");
    assert_eq!(state["b"], json!(2));
    Ok(())
}

#[tokio::test]
async fn wait_for_timers_sleeps_only_for_what_remains() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("timed")
        .push(Step::sleep("nap", Duration::from_millis(300)))
        .step("b", |_, _| async { update(json!({"b": 2})) })
        .build()?;
    assert!(matches!(
        steadfast::run("r", &wf, &store).await?,
        Outcome::Sleeping { .. }
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = std::time::Instant::now();
    let out = Runner::new(&store)
        .wait_for_timers(true)
        .run("r", &wf)
        .await?;
    assert!(out.completed().is_some());
    assert!(
        start.elapsed() < Duration::from_millis(280),
        "slept the whole timer again: {:?}",
        start.elapsed()
    );
    Ok(())
}

async fn hold(store: &MemoryStore, owner: Owner, until: Timestamp) -> TestResult {
    let mut cp = Checkpoint::new("r", "held", Timestamp::from_unix_millis(0));
    cp.lease = Some(Lease::new(owner, until));
    store.save(SaveRequest::new(&cp, None)).await?;
    Ok(())
}

fn one_step() -> Workflow {
    Workflow::builder("held")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_live_lease_is_refused_and_an_expired_or_orphaned_one_is_taken_over() -> TestResult {
    let clock = clock();
    let me = current_owner();
    let ttl = Duration::from_secs(30);

    let store = MemoryStore::new();
    let other_host = Owner::new("elsewhere", 1, 1);
    hold(&store, other_host.clone(), clock.now().saturating_add(ttl)).await?;
    let runner = Runner::new(&store)
        .clock(clock.clone())
        .lease(me.clone(), ttl);
    match runner.run("r", &one_step()).await {
        Err(e @ Error::Held { .. }) => assert!(e.to_string().contains("pid 1 on elsewhere"), "{e}"),
        other => panic!("expected Held, got {other:?}"),
    }
    clock.advance(ttl + Duration::from_secs(1));
    assert!(
        runner.run("r", &one_step()).await?.completed().is_some(),
        "an expired lease is taken over"
    );
    assert_eq!(
        store.load("r").await?.and_then(|c| c.lease),
        None,
        "released at the end"
    );

    // A process on this host that no longer exists: taken over at once.
    let store = MemoryStore::new();
    let dead = Owner::new(me.host.clone(), 4_000_000, 1);
    hold(&store, dead, clock.now().saturating_add(ttl)).await?;
    let runner = Runner::new(&store)
        .clock(clock.clone())
        .lease(me.clone(), ttl);
    assert!(runner.run("r", &one_step()).await?.completed().is_some());
    Ok(())
}

/// A runs a 400 ms step with a 300 ms lease (renewed every 100 ms); 150 ms in,
/// B takes the run over. Returns A's result and whether A went on to step `b`.
async fn takeover_during_a_step(
    blind_renewal: bool,
) -> Result<(Result<Outcome, Error>, u32), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::new());
    let ran_b = Arc::new(AtomicU32::new(0));
    let rb = Arc::clone(&ran_b);
    let wf = Workflow::builder("fenced")
        .step("slow", |_, _| async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            update(json!({"slow": 1}))
        })
        .step("b", move |_, _| {
            rb.fetch_add(1, Ordering::SeqCst);
            async { update(json!({"b": 1})) }
        })
        .build()?;
    let a = Owner::new("host-a", 1, 1);
    let (s, w) = (Arc::clone(&store), wf.clone());
    let first = tokio::spawn(async move {
        let runner = Runner::new(&*s).lease(a, Duration::from_millis(300));
        let runner = if blind_renewal {
            runner.mutant_blind_lease_renewal()
        } else {
            runner
        };
        runner.run("r", &w).await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Another worker takes the run over (as if A's lease had expired).
    let mut cp = store.load("r").await?.expect("claimed");
    cp.lease = Some(Lease::new(
        Owner::new("host-b", 2, 2),
        Timestamp::from_unix_millis(u64::MAX / 2),
    ));
    store.save(SaveRequest::new(&cp, Some(cp.version))).await?;
    let out = first.await?;
    Ok((out, ran_b.load(Ordering::SeqCst)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_taken_is_fenced_out() -> TestResult {
    let (out, ran_b) = takeover_during_a_step(false).await?;
    assert!(
        matches!(&out, Err(e) if e.is_held_elsewhere()),
        "A must lose at its next renewal: {out:?}"
    );
    assert_eq!(ran_b, 0, "A did not go on past the takeover");
    Ok(())
}

/// Negative control: a renewal without compare-and-swap lets the zombie go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_blind_lease_renewal_lets_the_old_holder_go_on() -> TestResult {
    let (out, ran_b) = takeover_during_a_step(true).await?;
    assert!(
        out.is_ok() && ran_b == 1,
        "the mutant was fenced too: {out:?}"
    );
    Ok(())
}

/// A store where every save loses a race to another writer.
struct AlwaysContended(MemoryStore);

#[steadfast::async_trait]
impl Store for AlwaysContended {
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, steadfast::StoreError> {
        self.0.load(run_id).await
    }
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, steadfast::StoreError> {
        Err(steadfast::StoreError::Conflict {
            run_id: req.checkpoint.run_id.clone(),
            expected: req.expected,
            found: req.expected.map(|v| v + 1),
        })
    }
    async fn list(
        &self,
        filter: &steadfast::ListFilter,
    ) -> Result<Vec<steadfast::RunSummary>, steadfast::StoreError> {
        self.0.list(filter).await
    }
    async fn delete(&self, run_id: &str) -> Result<bool, steadfast::StoreError> {
        self.0.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, steadfast::StoreError> {
        self.0.delete_if(run_id, version).await
    }
}

/// A decision that keeps losing to other writers is contention (the run is
/// busy: try again), not "not waiting" (a decision given at the wrong place).
#[tokio::test]
async fn a_decision_that_keeps_losing_races_reports_contention() -> TestResult {
    let inner = MemoryStore::new();
    let counter = Arc::new(AtomicU32::new(0));
    let wf = gated(&counter, Step::gate("review"));
    assert!(matches!(
        Runner::new(&inner).run("r", &wf).await?,
        Outcome::Waiting { .. }
    ));
    let store = AlwaysContended(inner);
    for result in [
        approve(&store, "r", "review", None, "ada", &*clock()).await,
        reject(&store, "r", "review", None, "ada", &*clock()).await,
    ] {
        let err = result.unwrap_err();
        assert!(err.is_held_elsewhere(), "{err:?}");
        assert!(!matches!(err, Error::NotWaiting { .. }), "{err:?}");
    }
    Ok(())
}
