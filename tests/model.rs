//! A model-based test of the run loop: random sequences of actions (run and
//! resume by either of two workers, a step that fails, a crash in the middle
//! of a step or of a save, a changed workflow, gate approvals, rejections and
//! timeouts, a durable timer, time passing, lease expiry and takeover) on the
//! memory, file and SQLite stores (and PostgreSQL when `STEADFAST_TEST_PG` is
//! set), checked after every action against a small reference model.
//!
//! The model predicts the outcome of every clean run (completed, waiting,
//! sleeping, rejected, failed, held by the other worker, workflow changed),
//! which steps it executes, and what the store holds after it. After a crash,
//! where the model cannot know which save landed, it checks the invariants
//! (nothing acknowledged lost, no checkpointed step run again, the state
//! after exactly `next` steps) and takes up the stored record.
//!
//! `STEADFAST_MODEL_CASES` sets the number of sequences per store (default 128;
//! each up to 30 actions).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use steadfast::store::SaveRequest;

use steadfast::{
    approve, reject, Checkpoint, Clock, Error, ListFilter, ManualClock, OnTimeout, Outcome, Owner,
    RetryPolicy, RunStatus, RunSummary, Runner, Step, StepError, Store, StoreError, Timestamp,
    Wait, Workflow,
};
use tokio::sync::Notify;

const TTL: Duration = Duration::from_secs(60);
const GATE_TIMEOUT: Duration = Duration::from_secs(90);
const NAP: Duration = Duration::from_secs(30);
/// The steps: 0 `a`, 1 gate `g`, 2 `b`, 3 timer `t`, 4 `c`.
const NAMES: [&str; 5] = ["a", "g", "b", "t", "c"];
const FALLIBLE: [usize; 3] = [0, 2, 4];

#[derive(Clone, Debug)]
enum Action {
    Run { who: usize, fail: bool },
    CrashMidStep { who: usize },
    CrashMidSave { who: usize, after: u32, land: bool },
    ChangedWorkflow,
    Approve(u8),
    Reject,
    Advance(u64),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..2usize, prop::bool::weighted(0.2)).prop_map(|(who, fail)| Action::Run { who, fail }),
        1 => (0..2usize).prop_map(|who| Action::CrashMidStep { who }),
        1 => (0..2usize, 0..5u32, any::<bool>()).prop_map(|(who, after, land)| Action::CrashMidSave { who, after, land }),
        1 => Just(Action::ChangedWorkflow),
        2 => (0..3u8).prop_map(Action::Approve),
        1 => Just(Action::Reject),
        2 => prop_oneof![Just(1u64), Just(25), Just(45), Just(70), Just(100)].prop_map(Action::Advance),
    ]
}

/// A store that can die in the middle of a save: after `left` more saves,
/// the next one lands or not (`land`), and from then on nothing reaches the
/// store, as if the process were gone.
struct Crashable {
    inner: Arc<dyn Store>,
    plan: Mutex<Option<(u32, bool)>>,
    dead: AtomicBool,
}

impl Crashable {
    fn dead_error() -> StoreError {
        StoreError::backend(steadfast::StoreErrorKind::Unavailable, "the process died")
    }
}

#[steadfast::async_trait]
impl Store for Crashable {
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::dead_error());
        }
        self.inner.load(run_id).await
    }
    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::dead_error());
        }
        let crash = {
            let mut plan = self.plan.lock().unwrap();
            match plan.as_mut() {
                Some((0, land)) => Some(*land),
                Some((left, _)) => {
                    *left -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(land) = crash {
            self.dead.store(true, Ordering::SeqCst);
            if land {
                let _ = self.inner.save(req).await;
            }
            return Err(Self::dead_error());
        }
        self.inner.save(req).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.inner.list(filter).await
    }
    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.inner.delete_if(run_id, version).await
    }
    fn capabilities(&self) -> steadfast::Capabilities<'_> {
        self.inner.capabilities()
    }
}

/// What the steps share with the test: executions per step, and whether the
/// next step fails or hangs (and says so when it starts hanging).
type Flags<'a> = (
    &'a Arc<Mutex<[u32; 5]>>,
    &'a Arc<AtomicBool>,
    &'a Arc<AtomicBool>,
    &'a Arc<Notify>,
);

/// The system under test: one run `r` of the five-step workflow.
struct World {
    store: Arc<Crashable>,
    clock: Arc<ManualClock>,
    wf: Workflow,
    changed: Workflow,
    execs: Arc<Mutex<[u32; 5]>>,
    fail_next: Arc<AtomicBool>,
    hang_next: Arc<AtomicBool>,
    started: Arc<Notify>,
}

fn workflow(world_flags: Flags<'_>, first: &str) -> Workflow {
    let (execs, fail, hang, started) = world_flags;
    let step = |i: usize, name: &str| {
        let (execs, fail, hang, started) = (
            Arc::clone(execs),
            Arc::clone(fail),
            Arc::clone(hang),
            Arc::clone(started),
        );
        let key = NAMES[i];
        Step::new(name, move |_, _| {
            execs.lock().unwrap()[i] += 1;
            let hang = hang.swap(false, Ordering::SeqCst);
            let fail = !hang && fail.swap(false, Ordering::SeqCst);
            let started = Arc::clone(&started);
            async move {
                if hang {
                    started.notify_one();
                    std::future::pending::<()>().await;
                }
                if fail {
                    return Err(StepError::terminal("a planned failure"));
                }
                steadfast::update(json!({ key: format!("v{i}") }))
            }
        })
        .retry(RetryPolicy::none())
    };
    Workflow::builder("model")
        .push(step(0, first))
        .push(Step::gate("g").gate_timeout(GATE_TIMEOUT, OnTimeout::Approve))
        .push(step(2, "b"))
        .push(Step::sleep("t", NAP))
        .push(step(4, "c"))
        .build()
        .unwrap()
}

impl World {
    fn new(inner: Arc<dyn Store>) -> World {
        let execs = Arc::new(Mutex::new([0; 5]));
        let fail_next = Arc::new(AtomicBool::new(false));
        let hang_next = Arc::new(AtomicBool::new(false));
        let started = Arc::new(Notify::new());
        let flags = (&execs, &fail_next, &hang_next, &started);
        World {
            store: Arc::new(Crashable {
                inner,
                plan: Mutex::new(None),
                dead: AtomicBool::new(false),
            }),
            clock: Arc::new(ManualClock::new(Timestamp::from_unix_millis(
                1_800_000_000_000,
            ))),
            wf: workflow(flags, "a"),
            changed: workflow(flags, "a-renamed"),
            execs,
            fail_next,
            hang_next,
            started,
        }
    }

    fn runner(&self, who: usize) -> Runner<'_, Crashable> {
        Runner::new(&*self.store)
            .clock(self.clock.clone())
            .lease(Owner::new(["host-a", "host-b"][who], 1, 1), TTL)
    }

    fn now(&self) -> u64 {
        self.clock.now().unix_millis()
    }

    async fn stored(&self) -> Option<Checkpoint> {
        self.store.inner.load("r").await.expect("the store loads")
    }
}

/// What the model knows of the run, taken from the store after each action
/// and checked against its predictions.
#[derive(Clone, Debug, Default)]
struct Model {
    exists: bool,
    next: usize,
    status: Option<RunStatus>,
    /// The gate's wait: since, timeout at (ms).
    gate: Option<(u64, u64)>,
    /// Whether a decision answers the current gate wait: approved and data.
    decision: Option<(bool, Option<Value>)>,
    timer_until: Option<u64>,
    /// Lease holder (host) and until (ms).
    lease: Option<(String, u64)>,
}

impl Model {
    fn sync(cp: Option<&Checkpoint>) -> Model {
        let Some(cp) = cp else {
            return Model::default();
        };
        let gate = match &cp.wait {
            Some(Wait::Gate {
                since, timeout_at, ..
            }) => Some((
                since.unix_millis(),
                timeout_at.map_or(u64::MAX, |t| t.unix_millis()),
            )),
            _ => None,
        };
        let decision = gate.and_then(|(since, _)| {
            cp.decisions
                .iter()
                .rev()
                .find(|d| d.gate == "g" && d.waited_since.map(|t| t.unix_millis()) == Some(since))
                .map(|d| (d.approved, d.data.clone()))
        });
        Model {
            exists: true,
            next: cp.next,
            status: Some(cp.status),
            gate,
            decision,
            timer_until: match &cp.wait {
                Some(Wait::Timer { until, .. }) => Some(until.unix_millis()),
                _ => None,
            },
            lease: cp
                .lease
                .as_ref()
                .map(|l| (l.owner.host.clone(), l.until.unix_millis())),
        }
    }
}

/// What a clean run predicts.
#[derive(Debug, PartialEq)]
enum Expect {
    Completed,
    Waiting,
    Sleeping,
    Rejected,
    Failed,
    Held,
}

/// Walks the workflow from the model's `next` as the run loop should.
/// Returns the outcome, the `next` it ends at and the steps it executes.
fn predict(m: &Model, who: usize, now: u64, fail: bool) -> (Expect, usize, Vec<usize>) {
    let me = ["host-a", "host-b"][who];
    if let Some((holder, until)) = &m.lease {
        if holder != me && *until > now {
            return (Expect::Held, m.next, vec![]);
        }
    }
    match m.status {
        Some(RunStatus::Completed) => return (Expect::Completed, m.next, vec![]),
        Some(RunStatus::Rejected) => return (Expect::Rejected, m.next, vec![]),
        _ => {}
    }
    let mut next = m.next;
    let mut ran = Vec::new();
    let mut fail = fail;
    while next < 5 {
        match next {
            1 => match (&m.decision, m.gate) {
                (Some((true, _)), _) => {}
                (Some((false, _)), _) => return (Expect::Rejected, next, ran),
                (None, Some((_, at))) if now >= at => {}
                _ => return (Expect::Waiting, next, ran),
            },
            3 => {
                let until = m.timer_until.unwrap_or(now + NAP.as_millis() as u64);
                if now < until {
                    return (Expect::Sleeping, next, ran);
                }
            }
            i => {
                ran.push(i);
                if fail {
                    return (Expect::Failed, next, ran);
                }
            }
        }
        fail = fail && !FALLIBLE.contains(&next);
        next += 1;
    }
    (Expect::Completed, next, ran)
}

fn expect_of(result: &Result<Outcome, Error>) -> Option<Expect> {
    match result {
        Ok(Outcome::Completed(_)) => Some(Expect::Completed),
        Ok(Outcome::Waiting { .. }) => Some(Expect::Waiting),
        Ok(Outcome::Sleeping { .. }) => Some(Expect::Sleeping),
        Ok(Outcome::Rejected { .. }) => Some(Expect::Rejected),
        Err(Error::StepFailed { .. }) => Some(Expect::Failed),
        Err(Error::Held { .. }) => Some(Expect::Held),
        _ => None,
    }
}

/// The state after exactly `next` steps.
fn expected_state(next: usize, gate_data: &Option<Value>) -> Value {
    let mut s = serde_json::Map::new();
    for i in 0..next {
        match i {
            1 => {
                s.insert("g".into(), gate_data.clone().unwrap_or(Value::Null));
            }
            3 => {}
            i => {
                s.insert(NAMES[i].into(), json!(format!("v{i}")));
            }
        }
    }
    Value::Object(s)
}

/// The invariants that hold after every action, crash or not.
fn check_record(cp: &Checkpoint, before: &Model) -> Result<(), String> {
    if cp.next < before.next {
        return Err(format!(
            "next went back from {} to {}",
            before.next, cp.next
        ));
    }
    let names: Vec<&str> = cp.completed.iter().map(String::as_str).collect();
    if names != NAMES[..cp.next] {
        return Err(format!("completed {names:?} at next {}", cp.next));
    }
    let state = Value::Object(cp.state.clone());
    // The gate's value is the data of the approval that passed it (a timeout
    // approves with none).
    let approval = cp
        .decisions
        .iter()
        .rev()
        .find(|d| d.gate == "g" && d.approved)
        .map(|d| d.data.clone().unwrap_or(Value::Null));
    let want = expected_state(cp.next, &approval);
    if state != want {
        return Err(format!(
            "state {state} is not the state after {} steps ({want})",
            cp.next
        ));
    }
    if cp.next == 5 && cp.status != RunStatus::Completed {
        return Err(format!("all steps done but status {:?}", cp.status));
    }
    if cp.status == RunStatus::Completed && cp.next != 5 {
        return Err(format!("completed at next {}", cp.next));
    }
    Ok(())
}

async fn apply(w: &World, m: &Model, a: &Action) -> Result<(), String> {
    let before_execs = *w.execs.lock().unwrap();
    let now = w.now();
    let mut predicted: Option<(Expect, usize, Vec<usize>)> = None;
    match a {
        Action::Advance(s) => w.clock.advance(Duration::from_secs(*s)),
        Action::Approve(k) => {
            let data = Some(json!({ "k": k }));
            let ok = approve(&*w.store, "r", "g", data.clone(), "ada", &*w.clock)
                .await
                .is_ok();
            if ok {
                let cp = w.stored().await.ok_or("approved a missing run")?;
                let d = cp.decisions.last().ok_or("no decision recorded")?;
                if !(d.gate == "g" && d.approved && d.by == "ada" && d.data == data) {
                    return Err(format!("the approval was recorded as {d:?}"));
                }
            }
            let should =
                m.status == Some(RunStatus::Waiting) && m.gate.is_some() && m.decision.is_none();
            if ok != should {
                return Err(format!("approve returned ok={ok}, model says {should}"));
            }
        }
        Action::Reject => {
            let ok = reject(&*w.store, "r", "g", Some("no".into()), "bob", &*w.clock)
                .await
                .is_ok();
            if ok {
                let cp = w.stored().await.ok_or("rejected a missing run")?;
                let d = cp.decisions.last().ok_or("no decision recorded")?;
                if !(d.gate == "g" && !d.approved && d.by == "bob")
                    || cp.status != RunStatus::Rejected
                {
                    return Err(format!(
                        "the rejection was recorded as {d:?}, status {:?}",
                        cp.status
                    ));
                }
            }
            let should =
                m.status == Some(RunStatus::Waiting) && m.gate.is_some() && m.decision.is_none();
            if ok != should {
                return Err(format!("reject returned ok={ok}, model says {should}"));
            }
        }
        Action::ChangedWorkflow => {
            if m.next == 0 {
                return Ok(());
            }
            let result = w.runner(0).run("r", &w.changed).await;
            let held = matches!(&m.lease, Some((h, until)) if h != "host-a" && *until > now);
            let fine = match &result {
                Err(Error::WorkflowChanged { .. }) => true,
                Err(Error::Held { .. }) => held,
                _ => false,
            };
            if !fine {
                return Err(format!("a changed workflow gave {result:?}"));
            }
            if *w.execs.lock().unwrap() != before_execs {
                return Err("a changed workflow ran a step".into());
            }
        }
        Action::Run { who, fail } => {
            let p = predict(m, *who, now, *fail);
            w.fail_next.store(*fail, Ordering::SeqCst);
            let result = w.runner(*who).run("r", &w.wf).await;
            w.fail_next.store(false, Ordering::SeqCst);
            let got = expect_of(&result);
            if got.as_ref() != Some(&p.0) {
                return Err(format!("predicted {:?}, the run gave {result:?}", p.0));
            }
            predicted = Some(p);
        }
        Action::CrashMidStep { who } => {
            let p = predict(m, *who, now, false);
            if p.2.is_empty() {
                return Ok(());
            }
            w.hang_next.store(true, Ordering::SeqCst);
            let runner = w.runner(*who);
            tokio::select! {
                r = runner.run("r", &w.wf) => return Err(format!("the hanging step returned {r:?}")),
                _ = w.started.notified() => {}
            }
            let first = p.2[0];
            let mut ran = [0u32; 5];
            ran[first] = 1;
            let now_execs = *w.execs.lock().unwrap();
            for i in 0..5 {
                if now_execs[i] - before_execs[i] != ran[i] {
                    return Err(format!("crash mid-step: executions {now_execs:?} from {before_execs:?}, expected only step {first}"));
                }
            }
        }
        Action::CrashMidSave { who, after, land } => {
            *w.store.plan.lock().unwrap() = Some((*after, *land));
            let _ = w.runner(*who).run("r", &w.wf).await;
            *w.store.plan.lock().unwrap() = None;
            w.store.dead.store(false, Ordering::SeqCst);
        }
    }
    let cp = w.stored().await;
    if let Some(cp) = &cp {
        check_record(cp, m)?;
    } else if m.exists {
        return Err("the run vanished".into());
    }
    let after = *w.execs.lock().unwrap();
    // A checkpointed step never runs again.
    for (i, (b, a)) in before_execs.iter().zip(after.iter()).enumerate() {
        if i < m.next && a != b {
            return Err(format!(
                "step {i} ran again though {} steps were done",
                m.next
            ));
        }
        if a - b > 1 {
            return Err(format!("step {i} ran {} times in one action", a - b));
        }
    }
    if let Some((expect, next, ran)) = predicted {
        let cp = cp.as_ref().ok_or("a run left no record")?;
        if cp.next != next {
            return Err(format!("predicted next {next}, stored {}", cp.next));
        }
        for i in 0..5 {
            let want = u32::from(ran.contains(&i));
            if after[i] - before_execs[i] != want {
                return Err(format!(
                    "step {i}: executions {after:?} from {before_execs:?}, predicted {ran:?}"
                ));
            }
        }
        match (&expect, &cp.wait) {
            (Expect::Sleeping, Some(Wait::Timer { until, .. })) => {
                let want = m.timer_until.unwrap_or(now + NAP.as_millis() as u64);
                if until.unix_millis() != want {
                    return Err(format!("the timer ends at {until}, expected {want} ms"));
                }
            }
            (Expect::Waiting, Some(Wait::Gate { timeout_at, .. })) => {
                let want = m
                    .gate
                    .map_or(now + GATE_TIMEOUT.as_millis() as u64, |(_, at)| at);
                if timeout_at.map(|t| t.unix_millis()) != Some(want) {
                    return Err(format!(
                        "the gate times out at {timeout_at:?}, expected {want} ms"
                    ));
                }
            }
            (Expect::Sleeping | Expect::Waiting, other) => {
                return Err(format!("{expect:?} but the record waits at {other:?}"));
            }
            _ => {}
        }
        if expect != Expect::Held && cp.lease.is_some() {
            return Err(format!("a run that returned {expect:?} kept its lease"));
        }
    }
    Ok(())
}

/// The stores the model runs on.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    File,
    Sqlite,
    Postgres,
}

async fn run_sequence(kind: Kind, actions: Vec<Action>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut pg = None;
    let store: Arc<dyn Store> = match kind {
        Kind::Memory => Arc::new(steadfast::MemoryStore::new()),
        Kind::File => {
            Arc::new(steadfast::file::FileStore::open(dir.path().join("runs.json")).unwrap())
        }
        Kind::Sqlite => {
            Arc::new(steadfast::sqlite::SqliteStore::open(dir.path().join("runs.db")).unwrap())
        }
        Kind::Postgres => {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let url = std::env::var("STEADFAST_TEST_PG").expect("STEADFAST_TEST_PG");
            let schema = format!(
                "model_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let sep = if url.contains('?') { '&' } else { '?' };
            let store =
                steadfast::postgres::PgStore::connect(&format!("{url}{sep}schema={schema}"))
                    .await
                    .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
            let store = Arc::new(store);
            pg = Some(Arc::clone(&store));
            store
        }
    };
    let w = World::new(store);
    let mut m = Model::default();
    let mut result = Ok(());
    for (n, a) in actions.iter().enumerate() {
        if let Err(e) = apply(&w, &m, a).await {
            result = Err(format!("action {n} {a:?} (model {m:?}): {e}"));
            break;
        }
        m = Model::sync(w.stored().await.as_ref());
    }
    if let Some(pg) = pg {
        pg.drop_schema()
            .await
            .map_err(|e| format!("dropping the schema: {e}"))?;
    }
    result
}

fn cases() -> u32 {
    std::env::var("STEADFAST_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(128)
}

fn check_store(kind: Kind, cases: u32) {
    let rt = steadfast_conformance::runtime();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let actions = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&prop::collection::vec(action(), 1..30), |seq| {
        actions.fetch_add(seq.len(), Ordering::Relaxed);
        let r = rt.block_on(run_sequence(kind, seq));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{kind:?}: {e}");
    }
    eprintln!(
        "{kind:?}: {cases} sequences, {} actions, all matched the model",
        actions.load(Ordering::Relaxed)
    );
}

#[test]
fn the_run_loop_matches_the_model_on_the_memory_store() {
    check_store(Kind::Memory, cases());
}

#[test]
fn the_run_loop_matches_the_model_on_the_sqlite_store() {
    check_store(Kind::Sqlite, cases());
}

#[test]
fn the_run_loop_matches_the_model_on_the_file_store() {
    check_store(Kind::File, cases());
}

/// On PostgreSQL (each sequence in a schema of its own) when
/// `STEADFAST_TEST_PG` is set; CI sets it, and fails if it is missing.
#[test]
fn the_run_loop_matches_the_model_on_the_postgres_store() {
    if std::env::var_os("STEADFAST_TEST_PG").is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must set STEADFAST_TEST_PG"
        );
        eprintln!("skipped: STEADFAST_TEST_PG is not set");
        return;
    }
    check_store(Kind::Postgres, cases().div_ceil(2));
}
