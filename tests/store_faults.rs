//! Crash tests at the store boundary: a store that fails, loses or mis-reports
//! the N-th save, for every N of a reference workflow.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use steadfast::{update, Error, MemoryStore, RetryPolicy, Runner, Step, Store, Workflow};
use steadfast_conformance::{Fault, FaultyStore};

mod support;

const STEPS: usize = 6;
type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A fresh store of each kind, with what must outlive it (its directory,
/// its PostgreSQL schema).
fn stores() -> Vec<(&'static str, Arc<dyn Store>, Keep)> {
    ["memory", "file", "sqlite", "postgres"]
        .into_iter()
        .map(|kind| {
            let dir = tempfile::tempdir().expect("a temp dir");
            let (url, schema) = match kind {
                "memory" => ("memory:".to_string(), None),
                other => support::fresh_store_url(other, dir.path()),
            };
            let store = support::open(&url);
            (kind, store, (dir, schema))
        })
        .collect()
}

type Keep = (tempfile::TempDir, Option<support::PgSchema>);
type Counts = Arc<Mutex<BTreeMap<String, u32>>>;

fn reference(counts: &Counts) -> Workflow {
    let mut b = Workflow::builder("reference");
    for i in 0..STEPS {
        let counts = Arc::clone(counts);
        b = b.push(
            Step::new(format!("s{i}"), move |ctx, state| {
                let counts = Arc::clone(&counts);
                async move {
                    *counts
                        .lock()
                        .unwrap()
                        .entry(ctx.step().to_string())
                        .or_default() += 1;
                    let prev = if i == 0 {
                        json!(0)
                    } else {
                        state[&format!("s{}", i - 1)].clone()
                    };
                    update(json!({ format!("s{i}"): prev.as_u64().unwrap_or(1000) + i as u64 }))
                }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().unwrap()
}

fn reference_state() -> Value {
    let mut acc = 0;
    let mut m = serde_json::Map::new();
    for i in 0..STEPS {
        acc += i as u64;
        m.insert(format!("s{i}"), json!(acc));
    }
    Value::Object(m)
}

fn total_runs(counts: &Counts) -> (u32, u32) {
    let c = counts.lock().unwrap();
    (c.values().sum(), c.values().copied().max().unwrap_or(0))
}

#[tokio::test]
async fn resume_reaches_the_reference_state_after_a_failure_at_every_save() -> TestResult {
    for (kind, inner, _dir) in stores() {
        for n in 0..STEPS {
            let run_id = format!("fail-{n}");
            let counts = Counts::default();
            let wf = reference(&counts);
            let faulty = FaultyStore::new(Arc::clone(&inner), n, Fault::FailFromHere);
            let first = Runner::new(&faulty).run(&run_id, &wf).await;
            assert!(
                first.is_err(),
                "{kind}: save {n} failed, the call must fail"
            );
            // A new process, on the same durable store, with the fault gone.
            let out = Runner::new(faulty.inner()).run(&run_id, &wf).await?;
            let at = format!("{kind}: fault at save {n}");
            assert_eq!(
                out.completed().map(Value::Object),
                Some(reference_state()),
                "{at}"
            );
            let (total, max) = total_runs(&counts);
            assert!(total <= STEPS as u32 + 1 && max <= 2, "{at}: {counts:?}");
            assert_eq!(
                counts.lock().unwrap().len(),
                STEPS,
                "{at}: a step was skipped"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_save_that_landed_but_reported_an_error_is_recognised() -> TestResult {
    for (kind, inner, _dir) in stores() {
        for n in 0..STEPS {
            let run_id = format!("landed-{n}");
            let counts = Counts::default();
            let wf = reference(&counts);
            let faulty = FaultyStore::new(Arc::clone(&inner), n, Fault::LandButReportUnknown);
            let out = Runner::new(&faulty).run(&run_id, &wf).await?;
            let at = format!("{kind}: unknown outcome at save {n}");
            assert_eq!(
                out.completed().map(Value::Object),
                Some(reference_state()),
                "{at}"
            );
            assert_eq!(
                total_runs(&counts),
                (STEPS as u32, 1),
                "{at}: a step ran twice"
            );
            let cp = faulty.inner().load(&run_id).await?.expect("checkpoint");
            assert_eq!(
                cp.version, STEPS as u64,
                "{at}: a save was repeated or lost"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_lost_save_with_unknown_outcome_fails_the_call_and_resume_recovers() -> TestResult {
    for (kind, inner, _dir) in stores() {
        for n in 0..STEPS {
            let run_id = format!("lost-{n}");
            let counts = Counts::default();
            let wf = reference(&counts);
            let faulty = FaultyStore::new(Arc::clone(&inner), n, Fault::LoseButReportUnknown);
            let first = Runner::new(&faulty).run(&run_id, &wf).await;
            let at = format!("{kind}: lost save {n}");
            assert!(matches!(first, Err(Error::Store { .. })), "{at}: {first:?}");
            let out = Runner::new(&faulty).run(&run_id, &wf).await?;
            assert_eq!(
                out.completed().map(Value::Object),
                Some(reference_state()),
                "{at}"
            );
            assert_eq!(
                total_runs(&counts).0,
                STEPS as u32 + 1,
                "{at}: not only the step in flight ran again"
            );
        }
    }
    Ok(())
}

/// Negative control: without the reload after an unknown outcome, the run loop
/// conflicts with its own write, which the test above would catch.
#[tokio::test]
async fn control_without_reload_the_run_conflicts_with_itself() {
    let counts = Counts::default();
    let wf = reference(&counts);
    let faulty = FaultyStore::new(MemoryStore::new(), 1, Fault::LandButReportUnknown);
    let out = Runner::new(&faulty)
        .mutant_skip_reload_after_unknown()
        .run("r", &wf)
        .await;
    assert!(
        out.is_err(),
        "the mutant must fail where the real run loop succeeds"
    );
}

/// A store cut off from a chosen save on. That save and every later one
/// never answer (as through a partition that drops every packet) or, when
/// `fenced`, are answered with a conflict and not made (as when another
/// worker took the run over). Unless `loads_answer`, a load made after the
/// first such save never answers either. Records when the first such load
/// began.
struct CutOff {
    inner: MemoryStore,
    at: usize,
    fenced: bool,
    loads_answer: bool,
    saves: std::sync::atomic::AtomicUsize,
    load_hung: Mutex<Option<std::time::Instant>>,
}

impl CutOff {
    fn new(at: usize, fenced: bool, loads_answer: bool) -> Self {
        CutOff {
            inner: MemoryStore::new(),
            at,
            fenced,
            loads_answer,
            saves: Default::default(),
            load_hung: Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl Store for CutOff {
    async fn load(
        &self,
        run_id: &str,
    ) -> Result<Option<steadfast::Checkpoint>, steadfast::StoreError> {
        if !self.loads_answer && self.saves.load(std::sync::atomic::Ordering::SeqCst) > self.at {
            self.load_hung
                .lock()
                .unwrap()
                .get_or_insert_with(std::time::Instant::now);
            std::future::pending::<()>().await;
        }
        self.inner.load(run_id).await
    }
    async fn save(
        &self,
        req: steadfast::store::SaveRequest<'_>,
    ) -> Result<u64, steadfast::StoreError> {
        let n = self.saves.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n < self.at {
            return self.inner.save(req).await;
        }
        if !self.fenced {
            std::future::pending::<()>().await;
        }
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
        self.inner.list(filter).await
    }
    async fn delete(&self, run_id: &str) -> Result<bool, steadfast::StoreError> {
        self.inner.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, steadfast::StoreError> {
        self.inner.delete_if(run_id, version).await
    }
    fn capabilities(&self) -> steadfast::Capabilities<'_> {
        self.inner.capabilities()
    }
}

/// A worker cut off from its store mid-step (its renewals never answered,
/// as through a partition that drops packets) stops the step before the
/// lease it could not renew runs out, and fails the call with an error
/// that says so; it never reports the run done. When the store's loads
/// hang too, the step is stopped before the look at the store that follows
/// (that look used to come first, and the step ran on through it, a third
/// of the lease, past the lease: seen as two workers running one step in
/// the partition harness). `fenced`: the renewals are answered with a
/// conflict instead (another worker took the run), and the step must still
/// stop within its lease.
async fn cut_off_mid_step(fenced: bool, loads_answer: bool) -> TestResult {
    struct Stopped(Arc<Mutex<Option<std::time::Instant>>>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(std::time::Instant::now());
        }
    }
    let stopped: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let began: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let (s, b) = (Arc::clone(&stopped), Arc::clone(&began));
    let wf = Workflow::builder("cut-off")
        .step("first", |_, _| async { update(json!({"first": 1})) })
        .step("long", move |_, _| {
            let guard = Stopped(Arc::clone(&s));
            *b.lock().unwrap() = Some(std::time::Instant::now());
            async move {
                let _guard = guard;
                tokio::time::sleep(std::time::Duration::from_secs(600)).await;
                update(json!({"long": 1}))
            }
        })
        .build()?;
    // Saves: the claim, the first step, then the renewals during the long
    // one, which never answer.
    let store = CutOff::new(2, fenced, loads_answer);
    let lease = std::time::Duration::from_millis(600);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        Runner::new(&store)
            .lease(steadfast::Owner::new("host", 1, 1), lease)
            .run("r", &wf),
    )
    .await
    .map_err(|_| "the call waited for ever on a store that does not answer")?;
    let e = out.expect_err("a call cut off from its store fails");
    let mut said = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        said.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let why = if fenced { "conflict" } else { "did not answer" };
    assert!(
        said.contains("renewal of the lease") && said.contains(why),
        "{said}"
    );
    let (began, stopped) = (began.lock().unwrap().unwrap(), stopped.lock().unwrap());
    let stopped = stopped.expect("the step was stopped");
    let ran = stopped - began;
    assert!(
        ran < lease,
        "the step ran {ran:?}, past the lease of {lease:?} it could not renew"
    );
    if fenced && !loads_answer {
        assert!(
            store.load_hung.lock().unwrap().is_some(),
            "the call never looked who has the run now"
        );
    }
    if !loads_answer && !fenced {
        let looked = store
            .load_hung
            .lock()
            .unwrap()
            .expect("after the renewal went unanswered, the store was looked at");
        assert!(
            stopped <= looked,
            "the step was stopped {:?} after the look at the store began: it ran on while the call waited for a store that does not answer",
            stopped - looked
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_renewal_the_store_never_answers_stops_the_step() -> TestResult {
    cut_off_mid_step(false, true).await
}

#[tokio::test]
async fn a_worker_cut_off_altogether_stops_the_step_before_it_looks_at_the_store() -> TestResult {
    cut_off_mid_step(false, false).await
}

/// A renewal answered with a conflict (another worker has the run), then a
/// store that answers nothing more: the step is stopped once the look at
/// who has the run now has taken a renewal's time (a third of the lease),
/// within its lease, and the call ends with the conflict once the looks
/// give up (10 s each). It used to wait on the first look for ever, its
/// step running beside the new holder's.
#[tokio::test]
async fn a_worker_fenced_out_by_a_store_that_then_hangs_stops_the_step() -> TestResult {
    cut_off_mid_step(true, false).await
}

/// A step that reports spend (each report a save of the run's head, made
/// while the step runs and holding the run's session) on a slow store, so
/// that renewals come due while a report is being saved: the step goes on
/// while the renewal waits for the session, and the run completes (the
/// renewal used to wait for a session the paused step held, for ever).
#[tokio::test]
async fn a_renewal_waits_for_a_step_saving_its_spend() -> TestResult {
    let wf = Workflow::builder("spender")
        .step("spend", |ctx, _| async move {
            for _ in 0..12 {
                ctx.spend("tokens", 1.0)
                    .map_err(steadfast::StepError::terminal)?
                    .saved()
                    .await
                    .map_err(steadfast::StepError::terminal)?;
            }
            update(json!({"spent": 12}))
        })
        .build()?;
    let slow = Fault::SlowFromHere(std::time::Duration::from_millis(60));
    let faulty = FaultyStore::new(MemoryStore::new(), 0, slow);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        Runner::new(&faulty)
            .lease(
                steadfast::Owner::new("host", 1, 1),
                std::time::Duration::from_millis(900),
            )
            .run("r", &wf),
    )
    .await
    .map_err(|_| "the renewal waited for the step, and the step for the renewal")??;
    assert_eq!(
        out.completed().and_then(|s| s.get("spent").cloned()),
        Some(json!(12))
    );
    Ok(())
}
