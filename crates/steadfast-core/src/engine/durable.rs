//! Durable functions: ordinary async code whose steps are recorded by name.
//!
//! On the first call each `ctx.step` runs and its output is saved; when the
//! same run is called again the code runs from the top, recorded steps return
//! their saved outputs without running, and execution goes live at the first
//! step without a record. Steps, gates, timers, leases, retries and history are
//! the run loop's own, on the same record format and every store.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use crate::engine::ctx::StepCtx;
use crate::engine::emit::{pump, Sink};
use crate::engine::session::{Session, Timer};
use crate::engine::spend::SpendLine;
use crate::engine::workflow::{RetryPolicy, Step};
use crate::engine::{store_error, Runner};
use crate::record::checkpoint::{Checkpoint, OnTimeout, RunStatus, StepFailure, StepRecord, Wait};
use crate::record::clock::Timestamp;
use crate::record::error::{Error, StepError, StepErrorKind};
use crate::record::ids::{preview, validate_run_id};
use crate::record::outcome::{rejected, Event, Outcome};
use crate::record::state::Update;
use crate::record::version::{StepVersion, STEP_KEY};
use crate::store::Store;
use crate::{StoreError, StoreErrorKind};

mod child;
pub use child::{ChildOptions, ChildSpec, MAX_CHILDREN};

/// Step names starting with this are the context's own (`now`, `random`, the
/// result): user steps may not use it.
const RESERVED: &str = "__";
/// Where a completed durable function's return value is kept in the state.
use crate::record::keys::RESULT_KEY;

/// How a durable step is tried: its retry policy and timeout.
#[derive(Clone, Debug, Default)]
pub struct StepOptions {
    retry: Option<RetryPolicy>,
    timeout: Option<Duration>,
    limit: Option<crate::record::limit::LimitSpec>,
    version: Option<String>,
}

impl StepOptions {
    /// The default: [`RetryPolicy::default`], no timeout.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
    /// Cancels an attempt that runs longer than `d`, which must lie in
    /// [`limits::STEP_TIMEOUT`](crate::record::limits::STEP_TIMEOUT) (checked when the
    /// step runs).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
    /// Holds a slot of a shared limit while each attempt runs (see
    /// [`Step::limit`]).
    pub fn limit(mut self, limit: crate::record::limit::LimitSpec) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Declares the version of the step's code, recorded with its value
    /// (see [`Step::version`]); checked when the step runs.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    fn check(&self) -> Result<(), String> {
        if let Some(v) = &self.version {
            StepVersion::declared(v)?;
        }
        if let Some(t) = self.timeout {
            crate::record::limits::STEP_TIMEOUT.check("timeout", t)?;
        }
        match &self.retry {
            Some(policy) => policy.check(),
            None => Ok(()),
        }
    }
}

/// How [`DurableCtx::attempts`] tries a step.
struct Attempts<'a> {
    name: &'a str,
    policy: RetryPolicy,
    timeout: Option<Duration>,
    /// Lend the run's state to each attempt (a listed step reads it); only
    /// where no other step of the run is running meanwhile.
    lend_state: bool,
    /// A parallel branch, with the index it reports: tried once, its failure
    /// recorded by its group.
    branch: Option<usize>,
    /// The shared limit each attempt holds a slot of.
    limit: Option<&'a crate::record::limit::LimitSpec>,
    /// What the step runs as, recorded with its completion.
    version: Option<StepVersion>,
}

/// The longest patch id, in bytes.
pub const MAX_PATCH_ID_BYTES: usize = 100;

/// The step name that records patch `id` ([`DurableCtx::patched`]), once
/// `id` is checked.
fn patch_marker(id: &str) -> Result<String, String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_PATCH_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
    if !ok {
        return Err(format!(
            "patch id {:?}: use 1 to {MAX_PATCH_ID_BYTES} letters, digits, '_', '.', ':' or '-'",
            crate::record::ids::preview(id)
        ));
    }
    Ok(format!("__patch:{id}"))
}

/// The update a durable step's output makes: the output under the step's name.
fn output_update<T: Serialize + DeserializeOwned>(
    value: &T,
    run_id: &str,
    name: &str,
) -> Result<Update, StepError> {
    let json = to_json(value, run_id, 0, name).map_err(|e| StepError {
        source: e.to_string().into(),
        terminal: true,
        kind: StepErrorKind::InvalidValue(String::new()),
        retry_after: None,
    })?;
    let mut update = Update::new();
    update.insert(name.to_string(), json);
    Ok(update)
}

/// Why a step, or a parallel branch, did not produce its output.
enum Branch {
    /// The step itself failed.
    Step(StepError),
    /// Saving, replaying or renewing failed.
    Engine(Error),
    /// The step finished but its checkpoint was not saved; recorded as the
    /// run's failure once every branch is over.
    Unsaved(Error),
}

impl Branch {
    /// The error of a step that is not a branch: its failures are recorded
    /// in the loop, so each is already an [`Error`].
    fn into_error(self) -> Error {
        match self {
            Branch::Engine(e) | Branch::Unsaved(e) => e,
            Branch::Step(e) => Error::StepFailed {
                run_id: String::new(),
                index: 0,
                step: String::new(),
                attempts: 1,
                timed_out: e.is_timeout(),
                source: e.into_inner(),
            },
        }
    }
}

struct Shared<'s, S: Store + ?Sized> {
    runner: Runner<'s, S>,
    /// The run's id, readable without the session's lock.
    run_id: String,
    /// The workflow's name, for errors, readable without the session's lock.
    workflow: String,
    session: tokio::sync::Mutex<Session>,
    counters: std::sync::Mutex<HashMap<String, u32>>,
    /// Steps of this call under way (from their first attempt to their
    /// saved outcome): a wait that stops the run must not begin beside one.
    running: std::sync::atomic::AtomicUsize,
    /// A wait of this call stopped the run: no other wait may begin (it
    /// would save a wait of its own over the first).
    stopped: std::sync::atomic::AtomicBool,
}

/// Counts a step under way for as long as it lives.
struct Underway<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Underway<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Underway(count)
    }
}

impl Drop for Underway<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What a durable function's code uses to make steps. Cheap to clone.
///
/// Code between steps must be deterministic: the same inputs and the same
/// recorded outputs must lead it to ask for the same steps in the same order.
/// Take time and randomness from [`now`](DurableCtx::now),
/// [`random`](DurableCtx::random) and [`uuid`](DurableCtx::uuid), which are
/// recorded like steps; do every side effect inside a step.
pub struct DurableCtx<'s, S: Store + ?Sized> {
    shared: Arc<Shared<'s, S>>,
}

impl<S: Store + ?Sized> Clone for DurableCtx<'_, S> {
    fn clone(&self) -> Self {
        DurableCtx {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store + ?Sized> std::fmt::Debug for DurableCtx<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableCtx").finish_non_exhaustive()
    }
}

/// Starts or resumes run `run_id` of the durable function `f`, named
/// `workflow`, on `store`, with default options; see [`Runner::durable`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use steadfast_core::{durable, MemoryStore, Outcome, StepError};
///
/// let store = MemoryStore::new();
/// let out = durable("run-1", &store, "count-to-three", |ctx| async move {
///     let mut total = 0;
///     for i in 1..=3u64 {
///         total += ctx.step(format!("add-{i}"), || async move { Ok::<_, StepError>(i) }).await?;
///     }
///     Ok(total)
/// })
/// .await?;
/// assert_eq!(out, Outcome::Completed(6));
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn durable<S, T, F, Fut>(
    run_id: &str,
    store: &S,
    workflow: &str,
    f: F,
) -> Result<Outcome<T>, Error>
where
    S: Store + Clone + 'static,
    T: Serialize + DeserializeOwned,
    F: FnOnce(DurableCtx<'static, S>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    Runner::new(store).durable(run_id, workflow, f).await
}

impl<S: Store + Clone + 'static> Runner<'_, S> {
    /// Starts or resumes run `run_id` of the durable function `f`, named
    /// `workflow`, with this runner's options (clock, lease, observer, timers,
    /// accepting changed code).
    ///
    /// `f` gets a [`DurableCtx`] and runs from the top on every call. When it
    /// returns, its value is saved and the run is completed; a completed run
    /// returns the saved value without calling `f`. A gate or timer that stops
    /// the run makes the context's call return [`Error::Suspended`]: pass it on
    /// with `?`, and this method turns it into [`Outcome::Waiting`],
    /// [`Outcome::Sleeping`] or [`Outcome::Rejected`].
    ///
    /// When the code asks for steps in an order that contradicts the record (a
    /// renamed, removed or reordered step), the call fails with
    /// [`Error::WorkflowChanged`] naming the first difference, before any new
    /// step runs. With [`accept_changed_workflow`](Runner::accept_changed_workflow),
    /// the record is cut at the first difference instead and the code goes live
    /// from there.
    pub async fn durable<T, F, Fut>(
        &self,
        run_id: &str,
        workflow: &str,
        f: F,
    ) -> Result<Outcome<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(DurableCtx<'static, S>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let span = tracing::info_span!(
            "steadfast.run",
            run_id,
            workflow,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let began = std::time::Instant::now();
        let out = self
            .run_durable(run_id, workflow, f)
            .instrument(span.clone())
            .await;
        span.record("outcome", crate::engine::label(&out));
        span.record("duration_ms", began.elapsed().as_millis() as u64);
        out
    }

    async fn run_durable<T, F, Fut>(
        &self,
        run_id: &str,
        workflow: &str,
        f: F,
    ) -> Result<Outcome<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(DurableCtx<'static, S>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        validate_run_id(run_id)?;
        self.check_options()?;
        crate::record::ids::check_step_name(workflow).map_err(|reason| Error::InvalidWorkflow {
            workflow: workflow.to_string(),
            reason,
        })?;
        let runner = self.to_shared();
        let loaded = runner
            .store_ref()
            .load(run_id)
            .await
            .map_err(|e| store_error(run_id, "load", e))?;
        let (mut cp, expected) = match loaded {
            None => {
                self.check_due_absent(run_id)?;
                (Checkpoint::new(run_id, workflow, runner.now()), None)
            }
            Some(cp) => {
                self.check_due(&cp)?;
                let cp =
                    match crate::engine::family::orphaned(runner.store_ref(), &cp, &*runner.clock)
                        .await
                        .map_err(|e| store_error(run_id, "look at the parent", e))?
                    {
                        Some(cancelled) => cancelled,
                        None => cp,
                    };
                let v = cp.version;
                (cp, Some(v))
            }
        };
        runner.give_budget(&mut cp, None);
        if cp.workflow != workflow {
            if !runner.accepts_changed_workflow() {
                return Err(Error::WorkflowChanged {
                    run_id: run_id.to_string(),
                    at: 0,
                    stored: Some(format!("workflow {:?}", cp.workflow)),
                    given: Some(format!("workflow {workflow:?}")),
                });
            }
            cp.workflow = workflow.to_string();
        }
        match cp.status {
            RunStatus::Completed => {
                let value = cp.state.get(RESULT_KEY).cloned().unwrap_or(Value::Null);
                return serde_json::from_value(value)
                    .map(Outcome::Completed)
                    .map_err(|e| Error::InvalidValue {
                        run_id: run_id.to_string(),
                        index: cp.next,
                        step: RESULT_KEY.into(),
                        path: String::new(),
                        reason: format!("the saved result does not fit the function's type: {e}"),
                    });
            }
            RunStatus::Rejected => return Ok(rejected(&cp).into()),
            RunStatus::Cancelled => return Err(crate::record::error::cancelled(&cp)),
            _ => {}
        }
        let created_at = cp.created_at;
        let mut session = Session::new(cp, expected, usize::MAX, 0);
        if let Err(e) = session.claim(&runner).await {
            return Err(runner.explain_conflict(run_id, created_at, e).await);
        }
        let ctx = DurableCtx::new(runner, session);
        let result = f(ctx.clone()).await;
        let shared = &ctx.shared;
        let mut s = shared.session.lock().await;
        match result {
            Ok(value) => {
                if s.cursor < s.cp.next {
                    // The record has steps the code no longer asked for.
                    return Err(Error::WorkflowChanged {
                        run_id: run_id.to_string(),
                        at: s.cursor,
                        stored: Some(s.cp.completed[s.cursor].clone()),
                        given: None,
                    });
                }
                let json = to_json(&value, run_id, s.cp.next, RESULT_KEY)?;
                let s = &mut *s;
                s.cp.state.insert(RESULT_KEY.into(), json);
                s.cp.status = RunStatus::Completed;
                s.cp.lease = None;
                s.cp.error = None;
                s.cp.updated_at = shared.runner.now();
                let saved = s.save(&shared.runner, None).await;
                if let Err(e) = saved {
                    let e = store_error(run_id, "save of the result", e);
                    s.cp.state.remove(RESULT_KEY);
                    let index = s.cp.next;
                    s.record_unsaved(&shared.runner, index, RESULT_KEY, 1, &e)
                        .await;
                    return Err(shared.runner.explain_conflict(run_id, created_at, e).await);
                }
                Ok(Outcome::Completed(value))
            }
            Err(Error::Suspended(suspension)) => Ok(suspension.into()),
            Err(e) => Err(shared.runner.explain_conflict(run_id, created_at, e).await),
        }
    }
}

fn to_json<T: Serialize + DeserializeOwned>(
    value: &T,
    run_id: &str,
    index: usize,
    step: &str,
) -> Result<Value, Error> {
    let invalid = |path: String, reason: String| Error::InvalidValue {
        run_id: run_id.to_string(),
        index,
        step: step.to_string(),
        path,
        reason,
    };
    let json = serde_json::to_value(value).map_err(|e| invalid(String::new(), e.to_string()))?;
    let mut wrapper = Update::new();
    wrapper.insert(step.to_string(), json);
    crate::record::state::check_update(&wrapper).map_err(|p| invalid(p.path, p.reason))?;
    let json = wrapper.remove(step).unwrap_or(Value::Null);
    // NaN and infinities become null on the way in; reading the value back
    // into its type is what finds them. Without a null there is nothing to find.
    if contains_null(&json) {
        serde_path_to_error::deserialize::<_, T>(json.clone()).map_err(|e| {
            invalid(
                e.path().to_string(),
                format!(
                    "{} (it would not load back; NaN and infinite floats are stored as null)",
                    e.inner()
                ),
            )
        })?;
    }
    Ok(json)
}

fn contains_null(v: &Value) -> bool {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Null => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    false
}

impl<'s, S: Store + ?Sized> DurableCtx<'s, S> {
    /// One listed step, through the one attempt loop: it reads the run's
    /// state (lent to each attempt) and its update is merged key by key.
    pub(crate) async fn listed_step(&self, step: &Step) -> Result<(), Error> {
        let how = Attempts {
            name: step.name(),
            policy: *step.retry_policy(),
            timeout: step.timeout_after(),
            lend_state: true,
            branch: None,
            limit: step.limit_spec(),
            version: step.definition().cloned(),
        };
        // Boxed, as in `run_step`.
        Box::pin(self.attempts(
            how,
            |ctx, state| {
                let state = state.unwrap_or_default();
                let before = state.get(crate::record::spend::SPEND_KEY).cloned();
                let call = step.call_untimed(ctx.clone(), state);
                async move {
                    let mut update = call.await?;
                    // A step reports its spend in its update (a flow step
                    // in its output): charged with its checkpoint.
                    let amounts = crate::engine::spend::reported(&mut update, before.as_ref())
                        .map_err(|r| StepError::invalid_value("", r))?;
                    ctx.charge_later(&amounts);
                    Ok(update)
                }
            },
            |mut update: Update| {
                // The engine's own keys are not a step's to change: a step
                // that echoes its state (a `jq` filter over stdin) gives
                // them back, and they are dropped.
                update.retain(|k, _| {
                    !crate::record::keys::RESERVED_KEYS.contains(&k.as_str()) && k != STEP_KEY
                });
                match crate::record::state::check_update(&update) {
                    Ok(()) => Ok(((), update)),
                    Err(p) => Err(StepError::invalid_value(p.path, p.reason)),
                }
            },
        ))
        .await
        .map_err(Branch::into_error)
    }

    /// One listed gate.
    pub(crate) async fn listed_gate(
        &self,
        step: &Step,
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
    ) -> Result<(), Error> {
        let mut s = self.shared.session.lock().await;
        self.pass_gate(&mut s, step, timeout, on_timeout).await
    }

    /// One listed durable timer.
    pub(crate) async fn listed_sleep(&self, step: &Step, duration: Duration) -> Result<(), Error> {
        let s = self.shared.session.lock().await;
        self.pass_timer(s, step, duration).await
    }

    /// A gate at the live end of the record: passes on an approval, or stops
    /// the run with [`Error::Suspended`].
    async fn pass_gate(
        &self,
        s: &mut Session,
        step: &Step,
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
    ) -> Result<(), Error> {
        self.alone(s, step.name())?;
        let total = s.total;
        match s
            .gate(self.runner(), step, timeout, on_timeout, total)
            .await?
        {
            Some(outcome) => Err(self.stop(outcome)),
            None => {
                s.cursor = s.cp.next;
                Ok(())
            }
        }
    }

    /// A timer at the live end of the record: passes once it has fired, or
    /// stops the run with [`Error::Suspended`]. A runner that waits for
    /// timers waits here without holding the session, renewing its lease.
    async fn pass_timer(
        &self,
        mut guard: tokio::sync::MutexGuard<'_, Session>,
        step: &Step,
        duration: Duration,
    ) -> Result<(), Error> {
        let runner = self.runner();
        let s = &mut *guard;
        self.not_stopped(s, step.name())?;
        let total = s.total;
        match s.sleep(runner, step, duration, total).await? {
            Timer::Stop(suspension) => return Err(self.stop(suspension)),
            Timer::Passed => {}
            Timer::Wait { set, left } => {
                drop(guard);
                self.with_renewals(tokio::time::sleep(left)).await?;
                guard = self.shared.session.lock().await;
                let s = &mut *guard;
                s.timer_fired(runner, step.name(), set, total).await?;
            }
        }
        guard.cursor = guard.cp.next;
        Ok(())
    }

    /// A context over `session`, for the listed-workflow driver.
    pub(crate) fn new(runner: Runner<'s, S>, session: Session) -> Self {
        DurableCtx {
            shared: Arc::new(Shared {
                runner,
                run_id: session.cp.run_id.clone(),
                workflow: session.cp.workflow.clone(),
                session: tokio::sync::Mutex::new(session),
                counters: std::sync::Mutex::new(HashMap::new()),
                running: std::sync::atomic::AtomicUsize::new(0),
                stopped: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The checkpoint as it stands (for the listed driver's final state).
    pub(crate) async fn into_state(self) -> crate::State {
        let mut s = self.shared.session.lock().await;
        std::mem::take(&mut s.cp.state)
    }

    fn runner(&self) -> &Runner<'s, S> {
        &self.shared.runner
    }

    /// `base` the first time it is asked for in this call, then `base#2`,
    /// `base#3`, ...: names for steps made in a loop. The numbering follows
    /// the code, so it is the same on every call.
    pub fn numbered(&self, base: &str) -> String {
        let mut counters = self
            .shared
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = counters.entry(base.to_string()).or_insert(0);
        *n += 1;
        if *n == 1 {
            base.to_string()
        } else {
            format!("{base}#{n}")
        }
    }

    /// Looks the next name up in the record. `Some(output)` when it is
    /// recorded there; `None` when the code is past the record (go live).
    fn replay(&self, s: &mut Session, name: &str) -> Result<Option<Value>, Error> {
        if !s.seen.insert(name.to_string()) {
            return Err(Error::InvalidWorkflow {
                workflow: s.cp.workflow.clone(),
                reason: format!(
                    "step name {name:?} is used twice in one run; use DurableCtx::numbered"
                ),
            });
        }
        if s.cursor < s.cp.next {
            if s.cp.completed[s.cursor] == name {
                s.cursor += 1;
                let at = s.cursor - 1;
                self.runner().emit(Event::Skipped {
                    index: at,
                    step: name,
                });
                return Ok(Some(s.cp.state.get(name).cloned().unwrap_or(Value::Null)));
            }
            self.diverged(s, Some(name))?;
        }
        Ok(None)
    }

    /// The code asked for something other than what the record has next.
    fn diverged(&self, s: &mut Session, given: Option<&str>) -> Result<(), Error> {
        if !self.runner().accepts_changed_workflow() {
            return Err(Error::WorkflowChanged {
                run_id: s.cp.run_id.clone(),
                at: s.cursor,
                stored: Some(s.cp.completed[s.cursor].clone()),
                given: given.map(String::from),
            });
        }
        tracing::warn!(run_id = %s.cp.run_id, at = s.cursor, "cutting the record where the code diverged, as asked");
        s.cp.completed.truncate(s.cursor);
        s.cp.next = s.cursor;
        Ok(())
    }

    /// The error for a call this durable function made wrongly.
    pub(crate) fn invalid(&self, reason: String) -> Error {
        Error::InvalidWorkflow {
            workflow: self.shared.workflow.clone(),
            reason,
        }
    }

    fn check_duration(&self, name: &str, checked: Result<Duration, String>) -> Result<(), Error> {
        checked
            .map(drop)
            .map_err(|r| self.invalid(format!("step {:?}: {r}", preview(name))))
    }

    fn check_user_name(&self, name: &str) -> Result<(), Error> {
        // The name is not checked yet: quoted as far as an error may show it.
        let bad = |reason: String| self.invalid(format!("step name {:?}: {reason}", preview(name)));
        crate::record::ids::check_step_name(name).map_err(bad)?;
        if name.starts_with(RESERVED) {
            return Err(bad(format!(
                "names starting with {RESERVED:?} are reserved"
            )));
        }
        Ok(())
    }

    /// Runs step `name` with the default options; see [`step_with`](Self::step_with).
    pub async fn step<T, F, Fut, E>(&self, name: impl Into<String>, f: F) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<StepError>,
    {
        self.step_with(name, StepOptions::new(), f).await
    }

    /// Runs step `name`: the first time, calls `f` (retrying and timing out as
    /// `options` say), saves its output and returns it; on later calls of the
    /// same run, returns the saved output without calling `f`.
    pub async fn step_with<T, F, Fut, E>(
        &self,
        name: impl Into<String>,
        options: StepOptions,
        f: F,
    ) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<StepError>,
    {
        let name = name.into();
        self.check_user_name(&name)?;
        options
            .check()
            .map_err(|r| self.invalid(format!("step {name:?}: {r}")))?;
        self.run_step(name, options, f).await
    }

    async fn run_step<T, F, Fut, E>(
        &self,
        name: String,
        options: StepOptions,
        mut f: F,
    ) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<StepError>,
    {
        let run_id = {
            let mut s = self.shared.session.lock().await;
            if let Some(value) = self.replay(&mut s, &name)? {
                return self.decode(&s.cp.run_id, s.cursor - 1, &name, value);
            }
            s.cp.run_id.clone()
        };
        let how = Attempts {
            name: &name,
            policy: options.retry.unwrap_or_default(),
            timeout: options.timeout,
            lend_state: false,
            branch: None,
            limit: options.limit.as_ref(),
            version: options
                .version
                .as_deref()
                .and_then(|v| StepVersion::declared(v).ok()),
        };
        // Boxed: the attempt loop's future is some 18 KB, and a step's
        // future is moved a few times before it is polled (into the caller's
        // own future, a binding's wrappers): each move copied all of it
        // (the step future is 728 bytes boxed, 18,296 not).
        Box::pin(self.attempts(
            how,
            |_, _| {
                let fut = f();
                async move { fut.await.map_err(Into::into) }
            },
            |value: T| output_update(&value, &run_id, &name).map(|u| (value, u)),
        ))
        .await
        .map_err(Branch::into_error)
    }

    /// The one attempt loop, for listed steps, durable steps and parallel
    /// branches alike. Before each attempt the lease is renewed if a third of
    /// it is spent; the attempt runs under its timeout with the lease renewed
    /// meanwhile; a success is checkpointed; a failure is recorded in the run
    /// (attempts count across calls and crashes) and retried after its
    /// backoff while the policy allows. A parallel branch (`branch`) is tried
    /// once, and its failure is left to its group to record.
    async fn attempts<T, R, F, Fut>(
        &self,
        how: Attempts<'_>,
        mut call: F,
        finish: impl Fn(T) -> Result<(R, Update), StepError>,
    ) -> Result<R, Branch>
    where
        F: FnMut(StepCtx, Option<Arc<crate::State>>) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
    {
        let runner = self.runner();
        let name = how.name;
        let _underway = Underway::new(&self.shared.running);
        if how.branch.is_none() {
            // The attempts counted so far belong to another step (a durable
            // function that went on after a failure): this one starts afresh.
            let mut s = self.shared.session.lock().await;
            if s.budget_step.as_deref() != Some(name) {
                if s.budget_step.is_some() {
                    s.used = 0;
                    s.cp.attempts = 0;
                }
                s.budget_step = Some(name.to_string());
            }
        }
        loop {
            if how.branch.is_none() {
                let mut s = self.shared.session.lock().await;
                // A run over its budget stops before its next step or
                // attempt; a step running beside this one (joined futures)
                // is let finish, and the next step alone stops it.
                if self
                    .shared
                    .running
                    .load(std::sync::atomic::Ordering::SeqCst)
                    == 1
                {
                    if let Some(stop) = s.budget_stop(runner).await.map_err(Branch::Engine)? {
                        return Err(Branch::Engine(self.stop(stop)));
                    }
                }
            }
            // The lease first (a run taken over or cancelled stops here),
            // then a slot of the step's shared limit: none free, the run
            // waits for one (durably, unless this runner waits in-process).
            // Nothing between taking the slot and the attempt's end returns
            // early, so the slot is always given back.
            self.shared
                .session
                .lock()
                .await
                .renew_if_due(runner)
                .await
                .map_err(Branch::Engine)?;
            let held = match how.limit {
                None => None,
                Some(spec) => Some(self.slot(spec, name, how.branch.is_some()).await?),
            };
            let (run_id, index, attempt, lent) = {
                let mut s = self.shared.session.lock().await;
                let s = &mut *s;
                if held.is_some() && matches!(s.cp.wait, Some(Wait::Limit { .. })) {
                    // It has its slot: no longer waiting for one.
                    s.cp.wait = None;
                    s.cp.status = RunStatus::Running;
                }
                let index = how.branch.unwrap_or(s.cp.next);
                let attempt = match how.branch {
                    Some(_) => 1,
                    None => s.cp.attempts.saturating_add(1),
                };
                let lent = how
                    .lend_state
                    .then(|| Arc::new(std::mem::take(&mut s.cp.state)));
                if how.branch.is_none() && std::mem::take(&mut s.interrupted) {
                    // The call before this one stopped without saving here.
                    crate::engine::metrics::reexecution();
                    tracing::info!(run_id = %s.cp.run_id, step = name, index, "running a step again: the call that ran the run before was cut off");
                }
                (s.cp.run_id.clone(), index, attempt, lent)
            };
            // What the step emits goes to the store's event log, if it
            // keeps one.
            let log = runner.store.capabilities().events;
            let (line, mut reports) = SpendLine::new();
            let line = Arc::new(line);
            let ctx = StepCtx::new(&run_id, name, index, attempt).with_spend(Arc::clone(&line));
            let sink =
                log.map(|_| Arc::new(Sink::new(ctx.names(), attempt, Arc::clone(&runner.clock))));
            let ctx = match &sink {
                Some(sink) => ctx.with_sink(Arc::clone(sink)),
                None => ctx,
            };
            let span = tracing::info_span!(
                "steadfast.step",
                run_id = %run_id,
                step = name,
                index,
                attempt,
                outcome = tracing::field::Empty,
                duration_ms = tracing::field::Empty,
            );
            crate::engine::metrics::step_started();
            runner.emit(Event::Started {
                index,
                step: name,
                attempt,
            });
            let started = runner.now();
            let timer = std::time::Instant::now();
            let fut = call(ctx.clone(), lent.clone());
            let timed = async {
                match how.timeout {
                    None => fut.await,
                    Some(d) => match tokio::time::timeout(d, fut).await {
                        Ok(r) => r,
                        Err(_) => Err(StepError::timed_out(d)),
                    },
                }
            };
            let scoped = ctx.scope(timed);
            // Boxed: the attempt and its events' pump are some 7 KB, and
            // the futures around it (spend and slot renewals, the lease's,
            // tracing's span) each held and moved a copy of it: a step's
            // future was 18 KB, copied whole at every move.
            let pumped = Box::pin(async {
                match (log, sink.as_deref()) {
                    (Some(log), Some(sink)) => pump(log, sink, scoped).await,
                    _ => scoped.await,
                }
            });
            // Spend reports are saved as they come, and those left when the
            // attempt returns before its end is recorded; a slot of a limit
            // is renewed as the step runs.
            let renew_slot = held
                .as_ref()
                .map_or(Duration::from_secs(86_400), |h| h.renew_every());
            let stepped = async {
                // Owned here, not borrowed: when a renewal goes unanswered,
                // `with_renewals` drops this future to stop the step, and
                // the step must go with it then, before the look at the
                // store that follows (a borrow left it running until that
                // look ended, a third of the lease later: past the lease).
                let mut pumped = pumped;
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + renew_slot, renew_slot);
                let out = loop {
                    tokio::select! {
                        biased;
                        r = &mut pumped => break r,
                        Some(report) = reports.recv() => {
                            crate::engine::budget::serve(runner, &self.shared.session, &line, report).await;
                        }
                        _ = tick.tick(), if held.is_some() => {
                            if let Some(h) = &held {
                                crate::engine::limit::renew(runner, h).await;
                            }
                        }
                    }
                };
                reports.close();
                while let Ok(report) = reports.try_recv() {
                    crate::engine::budget::serve(runner, &self.shared.session, &line, report).await;
                }
                out
            };
            let result = self.with_renewals(stepped).instrument(span.clone()).await;
            // The slot goes back as soon as the step returns: its checkpoint
            // needs none. A provider's "retry after" holds the key for
            // everyone first.
            if let Some(h) = held {
                if let (Some(spec), Ok(Err(e))) = (how.limit, &result) {
                    if let Some(after) = e.retry_after_hint() {
                        crate::engine::limit::pause(
                            runner,
                            spec,
                            runner.now().saturating_add(after),
                        )
                        .await;
                    }
                }
                crate::engine::limit::release(runner, h).await;
            }
            span.record("duration_ms", timer.elapsed().as_millis() as u64);
            if result.is_err() {
                // Cut off: cancelled, or fenced out by another owner.
                span.record("outcome", "stopped");
            }
            if let Some(lent) = lent {
                let mut s = self.shared.session.lock().await;
                s.cp.state = Arc::try_unwrap(lent).unwrap_or_else(|kept| (*kept).clone());
            }
            let result = result.map_err(Branch::Engine)?.and_then(&finish);
            let finished = runner.now();
            let err = match result {
                Ok((value, mut update)) => {
                    let mut s = self.shared.session.lock().await;
                    let s = &mut *s;
                    let at = s.cp.next;
                    let (spend_before, unsaved, whole) =
                        crate::engine::budget::charge_ending(&mut s.cp, &line);
                    crate::engine::spend::record_in(&mut update, at, name, whole);
                    if let Some(v) = &how.version {
                        update.insert(STEP_KEY.into(), v.to_value());
                    }
                    let record = StepRecord::new(at, name, update, attempt, started, finished);
                    let total = s.total;
                    let saved = if how.branch.is_some() {
                        s.complete_unrecorded(runner, record, total)
                            .instrument(span.clone())
                            .await
                            .map_err(Branch::Unsaved)
                    } else {
                        s.complete(runner, record, total)
                            .instrument(span.clone())
                            .await
                            .map_err(Branch::Engine)
                    };
                    if let Err(e) = saved {
                        s.cp.spend = spend_before;
                        line.put_back(unsaved);
                        span.record("outcome", "unsaved");
                        return Err(e);
                    }
                    crate::engine::metrics::spent(&s.cp.workflow, &unsaved);
                    span.record("outcome", "completed");
                    crate::engine::metrics::step_completed();
                    s.cursor = s.cp.next;
                    s.used = 0;
                    s.budget_step = None;
                    runner.emit(Event::Completed {
                        index: at,
                        step: name,
                        attempt,
                        took: timer.elapsed(),
                    });
                    return Ok(value);
                }
                Err(err) => err,
            };
            {
                // A failed attempt is charged for what it reported, with the
                // record of its failure (a branch's, with its group's).
                let mut s = self.shared.session.lock().await;
                let (_, unsaved, _) = crate::engine::budget::charge_ending(&mut s.cp, &line);
                crate::engine::metrics::spent(&s.cp.workflow, &unsaved);
            }
            crate::engine::metrics::step_failed();
            if how.branch.is_some() {
                span.record("outcome", "failed");
                runner.emit(Event::Failed {
                    index,
                    step: name,
                    attempt,
                    error: &err.to_string(),
                    retry_in: None,
                });
                return Err(Branch::Step(err));
            }
            let retry_in = {
                let mut s = self.shared.session.lock().await;
                let s = &mut *s;
                s.used += 1;
                let exhausted = err.terminal || s.used >= how.policy.max_attempts();
                self.record_attempt(s, name, index, attempt, &err, exhausted, finished)
                    .await
                    .map_err(Branch::Engine)?;
                (!exhausted).then(|| {
                    let backoff = how.policy.delay_before(s.used + 1, true);
                    err.retry_after_hint()
                        .map_or(backoff, |after| backoff.max(after))
                })
            };
            span.record(
                "outcome",
                if retry_in.is_some() {
                    "retrying"
                } else {
                    "failed"
                },
            );
            runner.emit(Event::Failed {
                index,
                step: name,
                attempt,
                error: &err.to_string(),
                retry_in,
            });
            match retry_in {
                None => {
                    return Err(Branch::Engine(crate::engine::step_failed(
                        &run_id, index, name, attempt, err,
                    )))
                }
                Some(d) => {
                    self.with_renewals(tokio::time::sleep(d))
                        .await
                        .map_err(Branch::Engine)?;
                }
            }
        }
    }

    /// A slot of `spec` for step `name`: taken at once, or after waiting.
    /// A runner that waits for timers (and a parallel branch, or a step
    /// beside others) waits here, renewing its lease; otherwise the run is
    /// saved sleeping until the time to look again and stops
    /// ([`Error::Suspended`]), holding no process.
    async fn slot(
        &self,
        spec: &crate::record::limit::LimitSpec,
        name: &str,
        branch: bool,
    ) -> Result<crate::engine::limit::Held, Branch> {
        use crate::engine::limit::{take, Take};
        let runner = self.runner();
        let run_id = self.shared.session.lock().await.cp.run_id.clone();
        loop {
            let at = match take(runner, spec, &run_id, name)
                .await
                .map_err(Branch::Engine)?
            {
                Take::Held(h) => return Ok(h),
                Take::Wait(at) => at,
            };
            let alone = self
                .shared
                .running
                .load(std::sync::atomic::Ordering::SeqCst)
                <= 1;
            if runner.wait_for_timers || branch || !alone {
                let left = Duration::from_millis(
                    at.unix_millis().saturating_sub(runner.now().unix_millis()),
                )
                .max(Duration::from_millis(1));
                self.with_renewals(crate::engine::limit::until_free(left))
                    .await
                    .map_err(Branch::Engine)?;
                continue;
            }
            let mut s = self.shared.session.lock().await;
            let stop = s
                .wait_for_slot(runner, name, &spec.key, at)
                .await
                .map_err(Branch::Engine)?;
            return Err(Branch::Engine(self.stop(stop)));
        }
    }

    /// Records a failed attempt in the run: its count, the error, and, when
    /// no attempt is left, `failed` with the lease released. A conflict means
    /// another owner has the run: an error, as everywhere.
    #[allow(clippy::too_many_arguments)]
    async fn record_attempt(
        &self,
        s: &mut Session,
        name: &str,
        index: usize,
        attempt: u32,
        err: &StepError,
        exhausted: bool,
        at: Timestamp,
    ) -> Result<(), Error> {
        s.cp.attempts = attempt;
        s.cp.status = if exhausted {
            RunStatus::Failed
        } else {
            RunStatus::Running
        };
        if exhausted {
            s.cp.lease = None;
        }
        s.cp.error = Some(StepFailure::new(
            index,
            name,
            err.to_string(),
            attempt,
            err.terminal,
            at,
        ));
        s.cp.updated_at = at;
        s.record_failure(self.runner(), name, index).await
    }

    /// Awaits `fut`, renewing the lease every third of its time meanwhile.
    ///
    /// The step goes on while a renewal is under way (it may itself be
    /// waiting for the session, to report spend). A renewal the store has
    /// not answered within a third of the lease's time, or by a tenth of it
    /// before the recorded lease runs out (a partition, a server gone
    /// without a word), stops the step and fails the call: by then another
    /// worker may take the run, and a step must not run on beside it. Only
    /// once the step is stopped does it look (as briefly) whether another
    /// worker has the run: then the call reports the run lost. A step that
    /// ends while a renewal is under way returns once the renewal is
    /// answered.
    async fn with_renewals<R>(&self, fut: impl Future<Output = R>) -> Result<R, Error> {
        let Some(every) = self.runner().renew_every() else {
            return Ok(fut.await);
        };
        let margin = self.runner().lease.as_ref().map_or(every, |(_, ttl)| {
            crate::engine::session::renewal_margin(*ttl)
        });
        // Boxed, so that it can be dropped (the step stopped) before the
        // look that follows an unanswered renewal.
        let mut fut = Box::pin(fut);
        let mut done: Option<R> = None;
        loop {
            if done.is_none() {
                tokio::select! {
                    r = &mut fut => return Ok(r),
                    _ = tokio::time::sleep(every) => {}
                }
            }
            let by = tokio::time::Instant::now() + every;
            let renewal = async {
                let mut guard = self.shared.session.lock().await;
                let s = &mut *guard;
                let out = s.renew_by(self.runner(), by).await;
                (out, s.cp.created_at, s.cp.version)
            };
            // The session's own wait is bounded by `by`; this bound is for
            // the wait for the session, a little later so as never to cut a
            // renewal short before it puts the old lease back.
            let renewal = tokio::time::timeout_at(by + margin, renewal);
            tokio::pin!(renewal);
            let answered = loop {
                tokio::select! {
                    out = &mut renewal => break out,
                    r = &mut fut, if done.is_none() => done = Some(r),
                }
            };
            let (out, created_at) = match answered {
                Ok((Ok(true), _, _)) => match done.take() {
                    Some(r) => return Ok(r),
                    None => continue,
                },
                Ok((Ok(false), created_at, version)) => {
                    drop(fut);
                    return Err(self.unanswered(every, margin, created_at, version).await);
                }
                Err(_) => {
                    drop(fut);
                    return Err(unanswered_renewal(&self.shared.run_id, every, margin));
                }
                Ok((Err(e), created_at, _)) => (e, created_at),
            };
            // The store answered, and another owner may have the run now.
            // A step still running when a renewal's time has gone by in the
            // look at who does is stopped then, not left beside the new
            // holder's while the look goes on (it is bounded, more
            // generously: a cancelled run is still told from a lost one).
            let explain = self
                .runner()
                .explain_conflict(&self.shared.run_id, created_at, out);
            tokio::pin!(explain);
            let e = match tokio::time::timeout(every, &mut explain).await {
                Ok(e) => e,
                Err(_) => {
                    drop(fut);
                    return Err(explain.await);
                }
            };
            if matches!(e, Error::Cancelled { .. }) && done.is_none() {
                // Cancelled: the step may finish within the grace period;
                // its result is not saved.
                let _ = tokio::time::timeout(self.runner().cancel_grace, &mut fut).await;
            }
            return Err(e);
        }
    }

    /// The error of a renewal the store did not answer in time, the step
    /// already stopped: a run another worker holds now (a process that stood
    /// still past its lease, woken) is reported lost, as a conflict; else
    /// the store did not answer. The look is bounded like the renewal.
    async fn unanswered(
        &self,
        every: Duration,
        margin: Duration,
        created_at: Timestamp,
        version: u64,
    ) -> Error {
        let r = self.runner();
        let run_id = &self.shared.run_id;
        let me = r.lease.as_ref().map(|(owner, _)| owner);
        // Briefly: the store may be the trouble. The lease decides, not the
        // version, which this call's own late renewal or a parallel branch's
        // save may have moved on.
        let look = every.min(Duration::from_secs(10));
        match tokio::time::timeout(look, r.store.load(run_id)).await {
            Ok(Ok(Some(stored))) if stored.lease.as_ref().map(|l| &l.owner) != me => {
                let taken = || {
                    store_error(
                        run_id,
                        "renewal of the lease",
                        StoreError::Conflict {
                            run_id: run_id.clone(),
                            expected: Some(version),
                            found: Some(stored.version),
                        },
                    )
                };
                tokio::time::timeout(look, r.explain_conflict(run_id, created_at, taken()))
                    .await
                    .unwrap_or_else(|_| taken())
            }
            _ => unanswered_renewal(run_id, every, margin),
        }
    }

    /// Records a parallel branch's failure as the run's and builds the error
    /// to return (a conflict instead, if another owner has the run).
    async fn fail(&self, name: &str, index: usize, attempt: u32, err: StepError) -> Error {
        let at = self.runner().now();
        let mut s = self.shared.session.lock().await;
        if let Err(e) = self
            .record_attempt(&mut s, name, index, attempt, &err, true, at)
            .await
        {
            return e;
        }
        crate::engine::step_failed(&s.cp.run_id, index, name, attempt, err)
    }

    fn decode<T: DeserializeOwned>(
        &self,
        run_id: &str,
        index: usize,
        name: &str,
        value: Value,
    ) -> Result<T, Error> {
        serde_path_to_error::deserialize(value).map_err(|e| Error::InvalidValue {
            run_id: run_id.to_string(),
            index,
            step: name.to_string(),
            path: e.path().to_string(),
            reason: format!(
                "the recorded output does not fit the type asked for: {}",
                e.inner()
            ),
        })
    }

    /// Runs several steps at once. Each output is saved as soon as its step
    /// finishes, so a crash during the fan-out re-runs only the unfinished
    /// ones. Returns the outputs in input order; if a step fails, the others
    /// still finish and are saved, and the first failure is returned.
    ///
    /// Each branch is a future, tried once (a future cannot be started again);
    /// calling the run again retries the branches that failed.
    pub async fn parallel<T, I, Fut, E>(&self, branches: I) -> Result<Vec<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        I: IntoIterator<Item = (String, Fut)>,
        Fut: Future<Output = Result<T, E>>,
        E: Into<StepError>,
    {
        let branches: Vec<(String, Fut)> = branches.into_iter().collect();
        for (name, _) in &branches {
            self.check_user_name(name)?;
        }
        let mut recorded: HashMap<String, Value> = HashMap::new();
        let (run_id, start) = {
            let mut s = self.shared.session.lock().await;
            let s = &mut *s;
            let group: HashSet<&str> = branches.iter().map(|(n, _)| n.as_str()).collect();
            for (name, _) in &branches {
                if !s.seen.insert(name.clone()) {
                    return Err(Error::InvalidWorkflow {
                        workflow: s.cp.workflow.clone(),
                        reason: format!("step name {name:?} is used twice in one run"),
                    });
                }
            }
            // Branches finish in any order: the group's records are the next
            // ones, whatever their order.
            while s.cursor < s.cp.next && group.contains(s.cp.completed[s.cursor].as_str()) {
                let name = s.cp.completed[s.cursor].clone();
                let value = s.cp.state.get(&name).cloned().unwrap_or(Value::Null);
                self.runner().emit(Event::Skipped {
                    index: s.cursor,
                    step: &name,
                });
                recorded.insert(name, value);
                s.cursor += 1;
            }
            if recorded.len() < branches.len() {
                s.renew_if_due(self.runner()).await?;
                // A run over its budget stops before the group starts (one
                // beside other running steps is let go on: see `attempts`).
                if self
                    .shared
                    .running
                    .load(std::sync::atomic::Ordering::SeqCst)
                    == 0
                {
                    if let Some(stop) = s.budget_stop(self.runner()).await? {
                        return Err(self.stop(stop));
                    }
                }
            }
            if s.cursor < s.cp.next && recorded.len() < branches.len() {
                let first_missing = branches
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .find(|n| !recorded.contains_key(*n));
                self.diverged(s, first_missing)?;
            }
            (s.cp.run_id.clone(), s.cp.next)
        };
        // A branch reports the index its record would have if the branches
        // finished in the order given; records are appended as they finish.
        let mut position = 0;
        let runs = branches.into_iter().map(|(name, fut)| {
            let recorded = recorded.remove(&name);
            let run_id = run_id.clone();
            let index = start + position;
            if recorded.is_none() {
                position += 1;
            }
            async move {
                if let Some(value) = recorded {
                    return self
                        .decode::<T>(&run_id, 0, &name, value)
                        .map_err(|e| (name, Branch::Engine(e)));
                }
                let how = Attempts {
                    name: &name,
                    policy: RetryPolicy::none(),
                    timeout: None,
                    lend_state: false,
                    branch: Some(index),
                    limit: None,
                    version: None,
                };
                let mut once = Some(fut);
                // Boxed, as in `run_step`: the branches are joined, and
                // each unboxed one made the joined future that much larger.
                let out = Box::pin(self.attempts(
                    how,
                    |_, _| {
                        let fut = once.take();
                        async move {
                            match fut {
                                Some(fut) => fut.await.map_err(Into::into),
                                None => Err(StepError::terminal("a branch is tried once")),
                            }
                        }
                    },
                    |value: T| output_update(&value, &run_id, &name).map(|u| (value, u)),
                ))
                .await;
                out.map_err(|failure| (name, failure))
            }
        });
        let results = futures_util::future::join_all(runs).await;
        let mut out = Vec::with_capacity(results.len());
        let mut first_error = None;
        let mut unsaved_recorded = false;
        for r in results {
            let (name, failure) = match r {
                Ok(v) => {
                    out.push(v);
                    continue;
                }
                Err(e) => e,
            };
            let error = match failure {
                Branch::Step(err) if first_error.is_none() => {
                    let index = self.shared.session.lock().await.cp.next;
                    self.fail(&name, index, 1, err).await
                }
                Branch::Step(_) => continue,
                Branch::Engine(e) => e,
                Branch::Unsaved(e) => {
                    if !unsaved_recorded {
                        unsaved_recorded = true;
                        let runner = self.runner();
                        let mut s = self.shared.session.lock().await;
                        let s = &mut *s;
                        let index = s.cp.next;
                        s.record_unsaved(runner, index, &name, 1, &e).await;
                    }
                    e
                }
            };
            first_error.get_or_insert(error);
        }
        match first_error {
            None => Ok(out),
            Some(e) => Err(e),
        }
    }

    /// A gate: the first call stops the run ([`Error::Suspended`], which the
    /// durable call turns into [`Outcome::Waiting`]) until
    /// [`approve`](crate::approve) or [`reject`](crate::reject); once approved,
    /// returns the approval's data (recorded, so later calls return it too).
    pub async fn gate(&self, name: &str) -> Result<Option<Value>, Error> {
        self.gate_with(name, None, OnTimeout::Reject).await
    }

    /// A gate that decides `on_timeout` by itself `timeout` after the run
    /// first reaches it.
    pub async fn gate_with(
        &self,
        name: &str,
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
    ) -> Result<Option<Value>, Error> {
        self.check_user_name(name)?;
        if let Some(t) = timeout {
            self.check_duration(
                name,
                crate::record::limits::GATE_TIMEOUT.check("gate timeout", t),
            )?;
        }
        let mut s = self.shared.session.lock().await;
        let s = &mut *s;
        if let Some(value) = self.replay(s, name)? {
            return Ok((!value.is_null()).then_some(value));
        }
        let step = match timeout {
            Some(t) => Step::gate(name).gate_timeout(t, on_timeout),
            None => Step::gate(name),
        };
        self.pass_gate(s, &step, timeout, on_timeout).await?;
        let value = s.cp.state.get(name).cloned().unwrap_or(Value::Null);
        Ok((!value.is_null()).then_some(value))
    }

    /// Waits for a signal named `signal` ([`signal`](crate::signal) sends
    /// one): the oldest one no earlier wait of the run took, or one sent
    /// later. Without one the run stops ([`Outcome::Waiting`] at this step)
    /// and holds no process; running it again after the signal was sent (a
    /// worker does so at once) goes on. Each signal is taken by one wait.
    /// Returns the signal, or `None` when `timeout` passed first (counted
    /// from when the run first reached the wait).
    ///
    /// The step is named after the signal ([`numbered`](Self::numbered):
    /// `signal`, then `signal#2` for the second wait of one call); the
    /// delivery (name, data, who sent it, when, its number) is its recorded
    /// value, in the state under that name.
    pub async fn wait_for(
        &self,
        signal: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<crate::record::signal::Signal>, Error> {
        self.check_user_name(signal)?;
        if let Some(t) = timeout {
            self.check_duration(
                signal,
                crate::record::limits::GATE_TIMEOUT.check("signal timeout", t),
            )?;
        }
        let name = self.numbered(signal);
        let mut s = self.shared.session.lock().await;
        let s = &mut *s;
        let value = match self.replay(s, &name)? {
            Some(value) => value,
            None => {
                // Boxed: the wait's future is large, and a function's future
                // holds one per wait in its body.
                Box::pin(self.pass_signal(s, &name, signal, timeout)).await?;
                s.cp.state.get(&name).cloned().unwrap_or(Value::Null)
            }
        };
        if value.is_null() {
            return Ok(None);
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| Error::InvalidInput {
                what: format!("the recorded delivery of step {name:?}"),
                reason: format!("it is not a signal: {e}"),
            })
    }

    /// One listed wait for a signal.
    pub(crate) async fn listed_signal(
        &self,
        step: &Step,
        signal: &str,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        let mut s = self.shared.session.lock().await;
        self.pass_signal(&mut s, step.name(), signal, timeout).await
    }

    /// Refuses a wait (a gate, a wait for a signal) that would stop the run
    /// while other steps of this call are under way: the run would stand at
    /// the wait, holding no lease, with those steps still running, and a
    /// worker could take it up and run them a second time.
    fn alone(&self, s: &Session, name: &str) -> Result<(), Error> {
        self.not_stopped(s, name)?;
        let n = self
            .shared
            .running
            .load(std::sync::atomic::Ordering::SeqCst);
        if n == 0 {
            return Ok(());
        }
        Err(Error::InvalidWorkflow {
            workflow: s.cp.workflow.clone(),
            reason: format!(
                "the wait {name:?} began while {n} step(s) of the same call were still under way; await them before waiting (a wait stops the run, and must not stand beside a running step)"
            ),
        })
    }

    /// Refuses a wait (a gate, a timer, a wait for a signal or for child
    /// runs) begun after another wait of this call stopped the run: it
    /// would save its wait over the first.
    fn not_stopped(&self, s: &Session, name: &str) -> Result<(), Error> {
        if self
            .shared
            .stopped
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::InvalidWorkflow {
                workflow: s.cp.workflow.clone(),
                reason: format!(
                    "the wait {name:?} began after another wait of the same call had stopped the run (waits run one at a time; wait for several child runs with DurableCtx::children)"
                ),
            });
        }
        Ok(())
    }

    /// The error that stops the run at a wait, noted so that no other wait
    /// of this call begins.
    fn stop(&self, outcome: crate::record::outcome::Suspension) -> Error {
        self.shared
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Error::Suspended(outcome)
    }

    /// A wait for a signal at the live end of the record: passes when it
    /// takes one (or times out), or stops the run with [`Error::Suspended`].
    async fn pass_signal(
        &self,
        s: &mut Session,
        name: &str,
        signal: &str,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        self.alone(s, name)?;
        let total = s.total;
        match s
            .wait_signal(self.runner(), name, signal, timeout, total)
            .await?
        {
            Some(outcome) => Err(self.stop(outcome)),
            None => {
                s.cursor = s.cp.next;
                Ok(())
            }
        }
    }

    /// A durable timer: the first call records when it wakes and stops the run
    /// ([`Outcome::Sleeping`]) unless the runner waits for timers; a call after
    /// the wake-up time goes on. A crash does not restart the timer.
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), Error> {
        self.check_user_name(name)?;
        self.check_duration(name, crate::record::limits::SLEEP.check("sleep", duration))?;
        let mut s = self.shared.session.lock().await;
        if self.replay(&mut s, name)?.is_some() {
            return Ok(());
        }
        self.pass_timer(s, &Step::sleep(name, duration), duration)
            .await
    }

    /// The input the run was [`start`](crate::start)ed with, if it was
    /// started that way (a worker's run); `None` otherwise.
    pub async fn input(&self) -> Option<Value> {
        let s = self.shared.session.lock().await;
        s.cp.state.get(crate::record::keys::INPUT_KEY).cloned()
    }

    /// The current time, recorded: the same on every call of the run.
    pub async fn now(&self) -> Result<Timestamp, Error> {
        let name = self.numbered("__now");
        let clock_now = self.runner().now();
        self.run_step(name, StepOptions::new(), move || async move {
            Ok::<_, StepError>(clock_now)
        })
        .await
    }

    /// Whether this run takes the new branch of patch `id`: true for a run
    /// that reaches this point under code that has the patch, false for a
    /// run that already passed it under older code (its record has another
    /// step here). The answer is recorded (a step `__patch:ID` when true),
    /// so a replay gives the same, and asking again for `id` in the same
    /// call gives the same answer. `id` is 1 to 100 bytes of letters, digits
    /// and `_ . : -`.
    ///
    /// Once no run needs the old branch, replace the call with
    /// [`deprecate_patch`](Self::deprecate_patch) and keep only the new
    /// branch; once no run recorded the patch, remove that too.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use steadfast_core::{durable, MemoryStore, Outcome, StepError};
    /// let store = MemoryStore::new();
    /// let out = durable("r", &store, "agent", |ctx| async move {
    ///     let prompt = if ctx.patched("fix-123").await? { "v2" } else { "v1" };
    ///     ctx.step("ask", move || async move { Ok::<_, StepError>(prompt.to_string()) }).await
    /// })
    /// .await?;
    /// assert_eq!(out, Outcome::Completed("v2".to_string()));
    /// # Ok::<(), steadfast_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn patched(&self, id: &str) -> Result<bool, Error> {
        let marker = patch_marker(id).map_err(|r| self.invalid(r))?;
        let unpatched = format!("__unpatched:{id}");
        {
            let mut s = self.shared.session.lock().await;
            if s.seen.contains(&marker) {
                return Ok(true);
            }
            if s.seen.contains(&unpatched) {
                return Ok(false);
            }
            if s.cursor < s.cp.next && s.cp.completed[s.cursor] != marker {
                // Passed under code without the patch: the old branch.
                s.seen.insert(unpatched);
                return Ok(false);
            }
        }
        self.run_step(marker, StepOptions::new(), || async {
            Ok::<_, StepError>(true)
        })
        .await
    }

    /// Marks where patch `id` was, once no run needs its old branch: a run
    /// that recorded the patch here steps over its record, any other run
    /// goes on as if the call were not there. Nothing is recorded.
    pub async fn deprecate_patch(&self, id: &str) -> Result<(), Error> {
        let marker = patch_marker(id).map_err(|r| self.invalid(r))?;
        let mut s = self.shared.session.lock().await;
        if s.cursor < s.cp.next && s.cp.completed[s.cursor] == marker {
            s.seen.insert(marker.clone());
            s.cursor += 1;
            let at = s.cursor - 1;
            self.runner().emit(Event::Skipped {
                index: at,
                step: &marker,
            });
        }
        Ok(())
    }

    /// A random number, recorded: the same on every call of the run.
    pub async fn random(&self) -> Result<u64, Error> {
        let name = self.numbered("__random");
        self.run_step(name, StepOptions::new(), || async {
            Ok::<_, StepError>(fastrand::u64(..))
        })
        .await
    }

    /// A random UUID (version 4), recorded: the same on every call of the run.
    pub async fn uuid(&self) -> Result<String, Error> {
        let name = self.numbered("__uuid");
        self.run_step(name, StepOptions::new(), || async {
            let (a, b) = (fastrand::u64(..), fastrand::u64(..));
            let a = (a & 0xffff_ffff_ffff_0fff) | 0x0000_0000_0000_4000;
            let b = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
            Ok::<_, StepError>(format!(
                "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xffff,
                b >> 48,
                b & 0xffff_ffff_ffff
            ))
        })
        .await
    }
}

/// A renewal the store did not answer in time; the step was stopped.
fn unanswered_renewal(run_id: &str, every: Duration, margin: Duration) -> Error {
    store_error(
        run_id,
        "renewal of the lease",
        StoreError::backend(
            StoreErrorKind::Unavailable,
            format!(
                "the store did not answer in time ({every:?} at most, and {margin:?} before the lease runs out); the step was stopped so that it does not run on beside a worker that takes the run over"
            ),
        ),
    )
}
