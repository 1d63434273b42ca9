//! Workers on every store: runs recorded with `start` are taken, run once,
//! resumed after a gate's decision, and a durable function gets its input.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use steadfast_conformance::runtime as rt;

use serde_json::json;
use steadfast::{
    approve, start, start_listed, update, ListFilter, Owner, Registry, RunStatus, Step, StepError,
    Store, Worker, Workflow,
};
use support::PgSchema;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Counts = Arc<Mutex<BTreeMap<String, u32>>>;

/// A store's kind, the store, and what must outlive it.
type Kind = (&'static str, Arc<dyn Store>, Box<dyn std::any::Any>);

/// A store of each kind, with what must outlive it.
fn stores() -> Vec<Kind> {
    let mut out: Vec<Kind> = Vec::new();
    out.push(("memory", support::open("memory:"), Box::new(())));
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite = support::open(&support::store_url("sqlite", dir.path()));
    out.push(("sqlite", sqlite, Box::new(dir)));
    let pg = PgSchema::new();
    out.push(("postgres", support::open(&pg.url), Box::new(pg)));
    out
}

/// A worker running in the background until the returned sender says stop.
fn background(
    worker: Worker,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<steadfast::WorkerReport, steadfast::Error>>,
) {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }));
    (tx, handle)
}

fn counted(name: &str, steps: usize, counts: &Counts) -> Workflow {
    let mut b = Workflow::builder(name);
    for i in 0..steps {
        let counts = Arc::clone(counts);
        b = b.step(format!("s{i}"), move |ctx, _| {
            let counts = Arc::clone(&counts);
            let key = format!("{}/{}", ctx.run_id(), i);
            async move {
                *counts.lock().unwrap().entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
                update(json!({ format!("s{i}"): i }))
            }
        });
    }
    b.build().expect("a valid workflow")
}

async fn wait_until(
    store: &dyn Store,
    what: &str,
    done: impl Fn(&[steadfast::RunSummary]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs = store.list(&ListFilter::new()).await.expect("list");
        if done(&runs) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn all_completed(n: usize) -> impl Fn(&[steadfast::RunSummary]) -> bool {
    move |runs| runs.len() == n && runs.iter().all(|r| r.status == RunStatus::Completed)
}

/// Two workers (as two owners on other hosts) share a store: every started
/// run completes, and every step of every run ran exactly once.
#[test]
fn two_workers_run_every_started_run_once() -> TestResult {
    for (kind, store, _guard) in stores() {
        let counts: Counts = Arc::default();
        let rt = rt();
        rt.block_on(async {
            for i in 0..24 {
                assert!(
                    start(
                        &*store,
                        "three",
                        &format!("r{i:02}"),
                        json!({"i": i}),
                        false
                    )
                    .await?
                );
            }
            // Starting again the same way changes nothing; with another
            // input it is refused.
            assert!(!start(&*store, "three", "r00", json!({"i": 0}), false).await?);
            assert!(matches!(
                start(&*store, "three", "r00", json!({"i": 99}), false).await,
                Err(steadfast::Error::InvalidInput { .. })
            ));
            let mut workers = Vec::new();
            let mut stops = Vec::new();
            for host in ["worker-a", "worker-b"] {
                let registry = Registry::new().workflow(counted("three", 3, &counts));
                let (tx, handle) = background(
                    Worker::new(Arc::clone(&store), registry)
                        .owner(Owner::new(host, 1, 1))
                        .concurrency(4)
                        .poll(Duration::from_millis(20)),
                );
                stops.push(tx);
                workers.push(handle);
            }
            wait_until(&*store, "every run to complete", all_completed(24)).await;
            for stop in &stops {
                stop.send(true)?;
            }
            let mut completed = 0;
            for w in workers {
                let report = w.await??;
                assert_eq!(report.abandoned, 0, "{kind}: {report:?}");
                completed += report.completed;
            }
            assert_eq!(completed, 24, "{kind}");
            let state = store.load("r00").await?.expect("r00").state;
            assert_eq!(
                state.get("i"),
                Some(&json!(0)),
                "{kind}: the first start's input stays"
            );
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        let counts = counts.lock().unwrap();
        assert_eq!(counts.len(), 24 * 3, "{kind}: {counts:?}");
        assert!(
            counts.values().all(|&n| n == 1),
            "{kind}: a step ran twice: {counts:?}"
        );
    }
    Ok(())
}

/// A run stops at its gate; once approved, a worker takes it again and
/// finishes it with the decision's data.
#[test]
fn an_approved_gate_is_taken_up_again() -> TestResult {
    for (kind, store, _guard) in stores() {
        let rt = rt();
        rt.block_on(async {
            let wf = Workflow::builder("gated")
                .step("draft", |_, _| async { update(json!({"draft": "text"})) })
                .push(Step::gate("review"))
                .step("publish", |_, state| {
                    let note = state.get("review").cloned();
                    async move { update(json!({"published": note})) }
                })
                .build()?;
            start(&*store, "gated", "g1", json!({}), false).await?;
            let (tx, worker) = background(
                Worker::new(Arc::clone(&store), Registry::new().workflow(wf))
                    .poll(Duration::from_millis(50)),
            );
            wait_until(&*store, "the gate", |runs| {
                runs.iter().any(|r| r.status == RunStatus::Waiting)
            })
            .await;
            approve(
                &*store,
                "g1",
                "review",
                Some(json!({"ok": true})),
                "ada",
                &steadfast::SystemClock,
            )
            .await?;
            wait_until(&*store, "the run to finish", all_completed(1)).await;
            tx.send(true)?;
            let report = worker.await??;
            assert_eq!(
                (report.suspended, report.completed),
                (1, 1),
                "{kind}: {report:?}"
            );
            let cp = store.load("g1").await?.expect("g1");
            assert_eq!(
                cp.state.get("published"),
                Some(&json!({"ok": true})),
                "{kind}"
            );
            assert!(cp.lease.is_none(), "{kind}: the lease is released");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// A durable function registered by name gets the input it was started with.
#[test]
fn a_durable_function_gets_its_input() -> TestResult {
    for (kind, store, _guard) in stores() {
        let rt = rt();
        rt.block_on(async {
            let registry = Registry::new().durable("double", |ctx| async move {
                let n = ctx.input().await.and_then(|v| v.as_i64()).unwrap_or(0);
                ctx.step("double", || async move { Ok::<_, StepError>(n * 2) })
                    .await
            });
            start(&*store, "double", "d1", json!(21), true).await?;
            let (tx, worker) = background(
                Worker::new(Arc::clone(&store), registry).poll(Duration::from_millis(20)),
            );
            wait_until(&*store, "the run to finish", all_completed(1)).await;
            tx.send(true)?;
            worker.await??;
            let out: steadfast::Outcome<i64> =
                steadfast::durable("d1", &store, "double", |_ctx| async {
                    Ok::<i64, steadfast::Error>(-1)
                })
                .await?;
            assert_eq!(out, steadfast::Outcome::Completed(42), "{kind}");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// Bad starts are refused with what is wrong, and record nothing.
#[test]
fn bad_starts_are_refused() -> TestResult {
    let store = support::open("memory:");
    let rt = support::runtime();
    let e = rt
        .block_on(start(&*store, "wf", "r", json!([1]), false))
        .unwrap_err();
    assert!(e.to_string().contains("JSON object"), "{e}");
    let e = rt
        .block_on(start(&*store, "wf", "bad\nid", json!({}), false))
        .unwrap_err();
    assert!(matches!(e, steadfast::Error::InvalidRunId { .. }), "{e}");
    let e = rt
        .block_on(start(&*store, "", "r", json!({}), false))
        .unwrap_err();
    assert!(matches!(e, steadfast::Error::InvalidWorkflow { .. }), "{e}");
    assert!(rt.block_on(store.list(&ListFilter::new()))?.is_empty());
    Ok(())
}

/// A run whose call panics frees its slot and is left alone for a while, so
/// a worker with one slot goes on with the other runs instead of spinning on
/// it or stalling.
#[test]
fn a_panicking_run_frees_its_slot_and_is_left_alone() -> TestResult {
    let store = support::open("memory:");
    let rt = rt();
    let booms = Arc::new(Mutex::new(0u32));
    let seen = Arc::clone(&booms);
    rt.block_on(async {
        let boom = Workflow::builder("boom")
            .step("explode", move |_, _| {
                *seen.lock().unwrap() += 1;
                async { panic!("a bug in a step") }
            })
            .build()?;
        let counts: Counts = Arc::default();
        let registry = Registry::new()
            .workflow(boom)
            .workflow(counted("ok", 2, &counts));
        start(&*store, "boom", "b1", json!({}), false).await?;
        for i in 0..3 {
            start(&*store, "ok", &format!("o{i}"), json!({}), false).await?;
        }
        let (tx, worker) = background(
            Worker::new(Arc::clone(&store), registry)
                .concurrency(1)
                .poll(Duration::from_millis(20)),
        );
        wait_until(&*store, "the other runs", |runs| {
            runs.iter()
                .filter(|r| r.workflow == "ok" && r.status == RunStatus::Completed)
                .count()
                == 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.send(true)?;
        let report = worker.await??;
        assert!(report.failed >= 1, "{report:?}");
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let booms = *booms.lock().unwrap();
    // Each call makes the step's attempts (3 by default); the rests between
    // calls double from the poll interval. A worker that took the run again
    // at once would make thousands in this time.
    assert!(
        (1..=60).contains(&booms),
        "the panicking step ran {booms} times: the run should rest between calls"
    );
    Ok(())
}

/// A lease outside its range is refused before anything is taken.
#[test]
fn a_worker_with_a_bad_lease_is_refused() -> TestResult {
    let store = support::open("memory:");
    let rt = support::runtime();
    let err = rt
        .block_on(
            Worker::new(store, Registry::new())
                .lease(Duration::from_millis(5))
                .run(async {}),
        )
        .unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    Ok(())
}

/// Two workers look at the same schedules every second: each slot starts
/// one run (counted once between them), slots missed before either looked
/// start up to the catch-up, listed workflows and durable functions alike,
/// and a schedule of a workflow neither worker has is left alone.
#[test]
fn two_workers_start_each_schedule_slot_once() -> TestResult {
    use steadfast::{schedule_ops, Clock as _, CronSchedule, ManualClock, Timestamp};
    for (kind, store, _guard) in stores() {
        let counts: Counts = Arc::default();
        let calls: Counts = Arc::default();
        let mut durable_runs = 0;
        let rt = rt();
        rt.block_on(async {
            // Added ten seconds ago: ten slots missed.
            let then = ManualClock::new(Timestamp::from(
                std::time::SystemTime::now() - Duration::from_secs(10),
            ));
            for (name, workflow) in [("listed", "three"), ("fn", "double"), ("none", "other")] {
                let s = CronSchedule::new(name, workflow, "* * * * * *", "UTC")?
                    .catch_up(2)
                    .input(json!({"n": 21}));
                schedule_ops::add_schedule(&*store, s, &then).await?;
            }
            let up = Timestamp::from(std::time::SystemTime::now());
            let mut workers = Vec::new();
            let mut stops = Vec::new();
            for host in ["worker-a", "worker-b"] {
                let calls = Arc::clone(&calls);
                let registry = Registry::new()
                    .workflow(counted("three", 3, &counts))
                    .durable("double", move |ctx| {
                        let calls = Arc::clone(&calls);
                        async move {
                            *calls.lock().unwrap().entry("all".into()).or_default() += 1;
                            let input = ctx.input().await.unwrap_or_default();
                            Ok::<_, steadfast::Error>(input["n"].as_i64().unwrap_or(0) * 2)
                        }
                    });
                let (tx, handle) = background(
                    Worker::new(Arc::clone(&store), registry)
                        .owner(Owner::new(host, 1, 1))
                        .concurrency(4)
                        .poll(Duration::from_millis(50)),
                );
                stops.push(tx);
                workers.push(handle);
            }
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            for name in ["listed", "fn"] {
                assert!(schedule_ops::remove_schedule(&*store, name).await?);
            }
            wait_until(&*store, "every scheduled run to complete", |runs| {
                runs.iter().all(|r| r.status == RunStatus::Completed)
            })
            .await;
            for stop in &stops {
                stop.send(true)?;
            }
            let mut scheduled = 0;
            for w in workers {
                scheduled += w.await??.scheduled;
            }
            let runs = store.list(&ListFilter::new()).await?;
            assert_eq!(
                scheduled,
                runs.len() as u64,
                "{kind}: each start counted once"
            );
            for name in ["listed", "fn"] {
                let mut slots: Vec<u64> = runs
                    .iter()
                    .filter_map(|r| r.run_id.strip_prefix(&format!("{name}@")))
                    .map(|t| {
                        serde_json::from_value::<Timestamp>(json!(t))
                            .unwrap()
                            .unix_millis()
                    })
                    .collect();
                slots.sort_unstable();
                assert!(slots.len() >= 3, "{kind}/{name}: {slots:?}");
                for pair in slots.windows(2) {
                    assert_eq!(pair[1] - pair[0], 1_000, "{kind}/{name}: {slots:?}");
                }
                let missed = slots.iter().filter(|s| **s <= up.unix_millis()).count();
                assert!(
                    (1..=3).contains(&missed),
                    "{kind}/{name}: {missed} missed slots started: {slots:?}"
                );
            }
            durable_runs = runs.iter().filter(|r| r.run_id.starts_with("fn@")).count() as u32;
            let durable = runs.iter().find(|r| r.run_id.starts_with("fn@")).unwrap();
            let out = store.load(&durable.run_id).await?.unwrap();
            assert_eq!(
                out.state.get(steadfast::RESULT_KEY),
                Some(&json!(42)),
                "{kind}"
            );
            // The schedule no worker could run was not moved on.
            let left = schedule_ops::list_schedules(&*store).await?;
            assert_eq!(left.len(), 1, "{kind}");
            assert_eq!(left[0].schedule.name, "none");
            assert_eq!(left[0].schedule.since, then.now(), "{kind}");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        let counts = counts.lock().unwrap();
        assert!(
            counts.values().all(|&n| n == 1),
            "{kind}: a step ran twice: {counts:?}"
        );
        assert_eq!(
            calls.lock().unwrap().get("all").copied(),
            Some(durable_runs),
            "{kind}: the durable function ran once per run"
        );
    }
    Ok(())
}

/// One worker taking one run at a time claims the higher priority first,
/// and within a priority shares its claims between the partitions: a
/// tenant's three runs started after another's sixty do not wait for all
/// sixty. (Each claim draws which partition goes first; the three are all
/// taken within thirty claims but once in a billion.)
#[test]
fn workers_claim_by_priority_then_by_turns_over_partitions() -> TestResult {
    use steadfast::{start_with, StartOptions};
    for (kind, store, _guard) in stores() {
        let order: Arc<Mutex<Vec<String>>> = Arc::default();
        let rt = rt();
        rt.block_on(async {
            let seen = Arc::clone(&order);
            let wf = Workflow::builder("queued")
                .step("note", move |ctx, _| {
                    let seen = Arc::clone(&seen);
                    let id = ctx.run_id().to_string();
                    async move {
                        seen.lock().unwrap().push(id);
                        update(json!({}))
                    }
                })
                .build()?;
            let listed = StartOptions::new().listed(&wf);
            for i in 0..60 {
                let opts = listed.clone().partition("big");
                start_with(&*store, "queued", &format!("big-{i:02}"), json!({}), &opts).await?;
            }
            for i in 0..3 {
                let opts = listed.clone().partition("small");
                start_with(&*store, "queued", &format!("small-{i}"), json!({}), &opts).await?;
            }
            for i in 0..2 {
                let opts = listed.clone().priority(5);
                start_with(&*store, "queued", &format!("urgent-{i}"), json!({}), &opts).await?;
            }
            // Started again the same way: nothing changes; in another place
            // of the queue: refused.
            let again = listed.clone().priority(5);
            assert!(!start_with(&*store, "queued", "urgent-0", json!({}), &again).await?);
            assert!(matches!(
                start_with(&*store, "queued", "urgent-0", json!({}), &listed).await,
                Err(steadfast::Error::InvalidInput { .. })
            ));
            assert!(matches!(
                start_with(
                    &*store,
                    "queued",
                    "x",
                    json!({}),
                    &listed.clone().priority(1_001)
                )
                .await,
                Err(steadfast::Error::InvalidInput { .. })
            ));
            let summaries = store.list(&ListFilter::new()).await?;
            let urgent = summaries.iter().find(|s| s.run_id == "urgent-1").unwrap();
            assert_eq!(urgent.queue.as_ref().map(|q| q.priority), Some(5), "{kind}");
            let (tx, handle) = background(
                Worker::new(Arc::clone(&store), Registry::new().workflow(wf))
                    .concurrency(1)
                    .poll(Duration::from_millis(20)),
            );
            wait_until(&*store, "every run to complete", all_completed(65)).await;
            tx.send(true)?;
            handle.await??;
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 65, "{kind}: {order:?}");
        let mut first: Vec<&str> = order[..2].iter().map(String::as_str).collect();
        first.sort_unstable();
        assert_eq!(first, ["urgent-0", "urgent-1"], "{kind}: {order:?}");
        let last_small = order.iter().rposition(|s| s.starts_with("small")).unwrap();
        assert!(
            last_small < 2 + 30,
            "{kind}: the small tenant waited behind the big one: {order:?}"
        );
        let smalls: Vec<&String> = order.iter().filter(|s| s.starts_with("small")).collect();
        assert_eq!(smalls, ["small-0", "small-1", "small-2"], "{kind}");
        // Within a partition, in the order they were started.
        let bigs: Vec<&String> = order.iter().filter(|s| s.starts_with("big")).collect();
        let mut sorted = bigs.clone();
        sorted.sort();
        assert_eq!(bigs, sorted, "{kind}");
    }
    Ok(())
}

/// One version of workflow "agent": its steps (named alike in every
/// version) count which version ran them, per run.
fn agent(version: &str, counts: &Counts) -> Workflow {
    let mut b = Workflow::builder("agent").version(version);
    for i in 0..2 {
        let counts = Arc::clone(counts);
        let version = version.to_string();
        b = b.step(format!("s{i}"), move |ctx, _| {
            let counts = Arc::clone(&counts);
            let key = format!("{}/v{version}/{i}", ctx.run_id());
            async move {
                *counts.lock().unwrap().entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
                update(json!({ format!("s{i}"): i }))
            }
        });
    }
    b.build().expect("a valid workflow")
}

/// Two workers, one with version 1 of a workflow and one with version 2,
/// share a store: every run is run by the version it was started with (a
/// run started before versions were recorded by either), each step once.
/// A run whose version no worker has is passed over with a stuck label,
/// never failed, until a worker with both versions takes it.
#[test]
fn two_workers_with_v1_and_v2_route_every_run_to_its_version() -> TestResult {
    for (kind, store, _guard) in stores() {
        let counts: Counts = Arc::default();
        let rt = rt();
        rt.block_on(async {
            let (v1, v2) = (agent("1", &counts), agent("2", &counts));
            for i in 0..6 {
                assert!(start_listed(&*store, &v1, &format!("a{i}"), json!({})).await?);
                assert!(start_listed(&*store, &v2, &format!("b{i}"), json!({})).await?);
            }
            // Started by name only: no version recorded, any version runs it.
            assert!(start(&*store, "agent", "c0", json!({}), false).await?);
            assert_eq!(
                store
                    .load("a0")
                    .await?
                    .expect("a0")
                    .origin
                    .and_then(|o| o.version),
                Some("1".to_string())
            );
            // Starting an existing run again under another version is
            // refused, and changes nothing.
            assert!(matches!(
                start_listed(&*store, &v2, "a0", json!({})).await,
                Err(steadfast::Error::InvalidInput { .. })
            ));
            let mut workers = Vec::new();
            let mut stops = Vec::new();
            for (host, wf) in [("old", v1.clone()), ("new", v2.clone())] {
                let (tx, handle) = background(
                    Worker::new(Arc::clone(&store), Registry::new().workflow(wf))
                        .owner(Owner::new(host, 1, 1))
                        .concurrency(4)
                        .poll(Duration::from_millis(20)),
                );
                stops.push(tx);
                workers.push(handle);
            }
            wait_until(&*store, "every run to complete", all_completed(13)).await;
            for stop in &stops {
                stop.send(true)?;
            }
            let mut completed = 0;
            for w in workers {
                let report = w.await??;
                assert_eq!(
                    (report.failed, report.abandoned),
                    (0, 0),
                    "{kind}: {report:?}"
                );
                completed += report.completed;
            }
            assert_eq!(completed, 13, "{kind}");
            for i in 0..6 {
                for (run, version) in [(format!("a{i}"), "1"), (format!("b{i}"), "2")] {
                    let cp = store.load(&run).await?.expect("the run");
                    assert!(
                        cp.passed_over.is_none(),
                        "{kind}: {run}: the mark is cleared"
                    );
                    for step in 0..2 {
                        let key = format!("{run}/v{version}/{step}");
                        assert_eq!(
                            counts.lock().unwrap().get(&key),
                            Some(&1),
                            "{kind}: {key}: {:?}",
                            counts.lock().unwrap()
                        );
                    }
                }
            }
            let listed = store.list(&ListFilter::new()).await?;
            let version_of = |id: &str| {
                listed
                    .iter()
                    .find(|r| r.run_id == id)
                    .and_then(|r| r.workflow_version.clone())
            };
            assert_eq!(version_of("a3").as_deref(), Some("1"), "{kind}");
            assert_eq!(version_of("b3").as_deref(), Some("2"), "{kind}");
            // The run started by name alone is pinned to the version that ran it.
            let pinned = version_of("c0").ok_or("c0 was not pinned")?;
            for step in 0..2 {
                assert_eq!(
                    counts.lock().unwrap().get(&format!("c0/v{pinned}/{step}")),
                    Some(&1),
                    "{kind}: {pinned}"
                );
            }

            // Version 1 is retired while a run of it is still pending: the
            // worker with version 2 passes it over and says why.
            assert!(start_listed(&*store, &v1, "late", json!({})).await?);
            let (tx, handle) = background(
                Worker::new(Arc::clone(&store), Registry::new().workflow(v2.clone()))
                    .owner(Owner::new("new", 1, 1))
                    .poll(Duration::from_millis(20)),
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            let mark = loop {
                let cp = store.load("late").await?.expect("late");
                if let Some(mark) = cp.passed_over.clone() {
                    break (cp, mark);
                }
                assert!(Instant::now() < deadline, "{kind}: never passed over");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            tx.send(true)?;
            let report = handle.await??;
            assert_eq!(report.failed, 0, "{kind}: {report:?}");
            assert!(report.passed_over >= 1, "{kind}: {report:?}");
            let (cp, mark) = mark;
            assert_eq!(cp.status, RunStatus::Pending, "{kind}: nothing ran");
            assert_eq!(cp.next, 0, "{kind}");
            assert_eq!(
                (mark.version.as_str(), mark.available.clone()),
                ("1", vec!["2".to_string()])
            );
            let stuck = steadfast::stuck::diagnose(
                &cp,
                steadfast::Timestamp::from_unix_millis(cp.updated_at.unix_millis()),
                Duration::from_secs(60),
                None,
            )
            .expect("a stuck label");
            assert_eq!(stuck.label(), "version-missing", "{kind}: {stuck}");
            assert!(stuck.to_string().contains("version \"1\""), "{stuck}");
            assert!(!counts
                .lock()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("late/")));

            // A worker with both versions takes it under version 1.
            let (tx, handle) = background(
                Worker::new(
                    Arc::clone(&store),
                    Registry::new().workflow(v1.clone()).workflow(v2.clone()),
                )
                .owner(Owner::new("both", 1, 1))
                .poll(Duration::from_millis(20)),
            );
            wait_until(&*store, "the late run to complete", all_completed(14)).await;
            tx.send(true)?;
            handle.await??;
            let cp = store.load("late").await?.expect("late");
            assert!(cp.passed_over.is_none(), "{kind}");
            let counts = counts.lock().unwrap();
            assert_eq!(counts.get("late/v1/0"), Some(&1), "{kind}: {counts:?}");
            assert!(!counts.contains_key("late/v2/0"), "{kind}");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}
