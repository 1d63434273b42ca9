//! Workflows: a name and an ordered list of named steps, each with its retry
//! policy and timeout.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::ctx::StepCtx;
use crate::record::checkpoint::OnTimeout;
use crate::record::error::{Error, StepError};
use crate::record::ids::check_step_name;
use crate::record::state::{State, Update};
use crate::record::version::StepVersion;

/// The future a step returns once boxed.
pub type StepFuture = Pin<Box<dyn Future<Output = Result<Update, StepError>> + Send + 'static>>;

type StepFn = Arc<dyn Fn(StepCtx, Arc<State>) -> StepFuture + Send + Sync>;

/// How often, and how patiently, a failing step is tried.
///
/// The delay before attempt `n + 1` is `initial_backoff * 2^(n - 1)`, capped at
/// `max_backoff`, then (with jitter) scaled by a random factor in `[0.5, 1.0]` so
/// that many runs failing together do not retry in lockstep.
///
/// ```
/// use std::time::Duration;
/// use steadfast_core::RetryPolicy;
/// let policy = RetryPolicy::new(5).backoff(Duration::from_millis(100), Duration::from_secs(5));
/// assert_eq!(policy.max_attempts(), 5);
/// assert_eq!(policy.delay_before(2, false), Duration::from_millis(100));
/// assert_eq!(policy.delay_before(4, false), Duration::from_millis(400));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    jitter: bool,
}

impl Default for RetryPolicy {
    /// Three attempts, 200 ms then 400 ms apart (with jitter), at most 30 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// At most `max_attempts` attempts per call of the run loop (at least one).
    pub fn new(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            ..Self::default()
        }
    }

    /// One attempt, no retries.
    pub fn none() -> Self {
        Self::new(1)
    }

    /// The first delay between attempts when none is given: 200 ms.
    pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(200);

    /// The policy a step's options describe, as flow files and the bindings
    /// give them: `retries` extra attempts (none given: the default three
    /// attempts), the first delay `backoff` ([`DEFAULT_BACKOFF`](Self::DEFAULT_BACKOFF)
    /// when not given), doubling with jitter up to `max_backoff` (when not
    /// given: 64 times the first delay, at least 30 s, at most a day). Each
    /// is checked against its range ([`limits`](crate::limits)); the error
    /// names the option.
    ///
    /// ```
    /// use std::time::Duration;
    /// use steadfast_core::RetryPolicy;
    /// let p = RetryPolicy::from_options(Some(2), None, None).unwrap();
    /// assert_eq!(p.max_attempts(), 3);
    /// assert!(RetryPolicy::from_options(Some(5000), None, None).unwrap_err().contains("retries"));
    /// assert!(RetryPolicy::from_options(Some(-1), None, None).is_err());
    /// assert!(RetryPolicy::from_options(None, Some(Duration::from_secs(90_000)), None).is_err());
    /// ```
    pub fn from_options(
        retries: Option<i64>,
        backoff: Option<Duration>,
        max_backoff: Option<Duration>,
    ) -> Result<Self, String> {
        let attempts = match retries {
            Some(r) => u32::try_from(r)
                .ok()
                .filter(|r| *r < crate::limits::MAX_ATTEMPTS)
                .map(|r| r + 1)
                .ok_or_else(|| {
                    format!(
                        "retries = {r} is out of range: 0 to {}",
                        crate::limits::MAX_ATTEMPTS - 1
                    )
                })?,
            None => Self::default().max_attempts,
        };
        let initial = match backoff {
            Some(b) => crate::limits::BACKOFF.check("backoff", b)?,
            None => Self::DEFAULT_BACKOFF,
        };
        let max = match max_backoff {
            Some(m) => crate::limits::BACKOFF.check("max_backoff", m)?,
            None => initial
                .saturating_mul(64)
                .max(Duration::from_secs(30))
                .min(crate::limits::BACKOFF.max),
        };
        Ok(Self::new(attempts).backoff(initial, max.max(initial)))
    }

    /// Sets the first delay and the cap. Each must lie in
    /// [`limits::BACKOFF`](crate::record::limits::BACKOFF) (0 to 1 day); building a
    /// workflow (or running a durable step) with one outside it is an error.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Turns the random scaling of delays on or off.
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// Checks both delays against [`crate::record::limits::BACKOFF`].
    pub(crate) fn check(&self) -> Result<(), String> {
        use crate::record::limits::{BACKOFF, MAX_ATTEMPTS};
        if self.max_attempts > MAX_ATTEMPTS {
            return Err(format!(
                "{} attempts is out of range: at most {MAX_ATTEMPTS}",
                self.max_attempts
            ));
        }
        BACKOFF.check("backoff", self.initial_backoff)?;
        BACKOFF.check("largest backoff", self.max_backoff)?;
        Ok(())
    }

    /// The attempt limit.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay before attempt `attempt` (2 or more) of this call, optionally jittered.
    pub fn delay_before(&self, attempt: u32, jitter: bool) -> Duration {
        let doublings = attempt.saturating_sub(2).min(30);
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff);
        if jitter && self.jitter {
            base.mul_f64(0.5 + fastrand::f64() * 0.5)
        } else {
            base
        }
    }
}

/// A named step: an async function of the step's context and the run's state that
/// returns an [`Update`], plus its retry policy and timeout.
///
/// The step receives the state as an `Arc`, read-only; what it returns is merged
/// into the state key by key. Execution is at least once: a step can run again
/// after a crash that came between its return and its checkpoint, so steps must be
/// idempotent ([`StepCtx::idempotency_key`] helps make side effects so).
///
/// ```
/// use std::time::Duration;
/// use serde_json::json;
/// use steadfast_core::{RetryPolicy, Step, update};
///
/// let step = Step::new("fetch", |ctx, _state| async move {
///     Ok(update(json!({"fetched_by": ctx.idempotency_key()}))?)
/// })
/// .retry(RetryPolicy::new(5))
/// .timeout(Duration::from_secs(30));
/// assert_eq!(step.name(), "fetch");
/// ```
#[derive(Clone)]
pub struct Step {
    name: String,
    kind: StepKind,
    retry: RetryPolicy,
    timeout: Option<Duration>,
    limit: Option<crate::record::limit::LimitSpec>,
    /// What the step runs as, recorded with each completion.
    definition: Option<StepVersion>,
    /// The version its author declared, checked when the workflow is built.
    declared: Option<String>,
}

/// What a step does.
#[derive(Clone)]
pub(crate) enum StepKind {
    /// Runs a function.
    Run(StepFn),
    /// Waits for a decision; after `timeout`, decides `on_timeout` by itself.
    Gate {
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
    },
    /// Waits until a durable timer fires.
    Sleep(Duration),
    /// Waits for a signal; after `timeout`, records `null` and goes on.
    Signal {
        signal: String,
        timeout: Option<Duration>,
    },
    /// Runs a workflow as a child run and waits for its result.
    Child { workflow: String },
}

impl Step {
    /// A step named `name` running `f`, with the default [`RetryPolicy`] and no timeout.
    pub fn new<F, Fut>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepCtx, Arc<State>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Update, StepError>> + Send + 'static,
    {
        Step {
            name: name.into(),
            kind: StepKind::Run(Arc::new(move |ctx, state| Box::pin(f(ctx, state)))),
            retry: RetryPolicy::default(),
            timeout: None,
            limit: None,
            definition: None,
            declared: None,
        }
    }

    /// A human-in-the-loop gate: the run stops with
    /// [`Outcome::Waiting`](crate::Outcome::Waiting) until [`approve`](crate::approve)
    /// or [`reject`](crate::reject) decides it. An approval's data is merged
    /// into the state under the gate's name.
    ///
    /// ```
    /// use std::time::Duration;
    /// use steadfast_core::{OnTimeout, Step};
    /// let review = Step::gate("review").gate_timeout(Duration::from_secs(3600), OnTimeout::Reject);
    /// assert_eq!(review.name(), "review");
    /// ```
    pub fn gate(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            kind: StepKind::Gate {
                timeout: None,
                on_timeout: OnTimeout::Reject,
            },
            retry: RetryPolicy::none(),
            timeout: None,
            limit: None,
            definition: None,
            declared: None,
        }
    }

    /// A durable timer: the run records when it wakes, then stops with
    /// [`Outcome::Sleeping`](crate::Outcome::Sleeping) (or, with
    /// [`Runner::wait_for_timers`](crate::Runner::wait_for_timers), sleeps for
    /// what remains). A crash does not restart the timer. The duration must
    /// lie in [`limits::SLEEP`](crate::record::limits::SLEEP), checked when the
    /// workflow is built.
    pub fn sleep(name: impl Into<String>, duration: Duration) -> Self {
        Step {
            name: name.into(),
            kind: StepKind::Sleep(duration),
            retry: RetryPolicy::none(),
            timeout: None,
            limit: None,
            definition: None,
            declared: None,
        }
    }

    /// A wait for signal `signal` ([`signal`](crate::signal) sends one): the
    /// run takes the oldest one no earlier wait took, or stops with
    /// [`Outcome::Waiting`](crate::Outcome::Waiting) at this step until one
    /// is sent. The delivery (name, data, who sent it, when, its number) is
    /// merged into the state under the step's name.
    ///
    /// ```
    /// use steadfast_core::Step;
    /// let answer = Step::wait_for("answer", "reply");
    /// assert_eq!(answer.name(), "answer");
    /// ```
    pub fn wait_for(name: impl Into<String>, signal: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            kind: StepKind::Signal {
                signal: signal.into(),
                timeout: None,
            },
            retry: RetryPolicy::none(),
            timeout: None,
            limit: None,
            definition: None,
            declared: None,
        }
    }

    /// A child step: starts a run of `workflow` (by the name a worker's
    /// [`Registry`](crate::Registry) knows it by) as a child of this run,
    /// with this run's state (without the engine's keys) as its input, and
    /// waits for it without holding a process; its result is merged into
    /// the state under the step's name. See
    /// [`DurableCtx::children`](crate::DurableCtx::children) for the child's
    /// id, the wait, failures and cancelling. The step's
    /// [`retry`](Step::retry) policy says how many attempts a failed child
    /// gets, at most [`MAX_CHILD_ATTEMPTS`](crate::MAX_CHILD_ATTEMPTS) (one
    /// by default, so no retry: a child's own steps retry as its workflow
    /// says).
    ///
    /// ```
    /// use steadfast_core::Step;
    /// let review = Step::child("review", "review-draft");
    /// assert_eq!(review.name(), "review");
    /// ```
    pub fn child(name: impl Into<String>, workflow: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            kind: StepKind::Child {
                workflow: workflow.into(),
            },
            retry: RetryPolicy::none(),
            timeout: None,
            limit: None,
            definition: None,
            declared: None,
        }
    }

    /// For a wait for a signal: give up `after` the run reached it, with
    /// `null` under the step's name. No effect on other steps. `after` must
    /// lie in [`limits::GATE_TIMEOUT`](crate::record::limits::GATE_TIMEOUT),
    /// checked when the workflow is built.
    pub fn signal_timeout(mut self, after: Duration) -> Self {
        if let StepKind::Signal { timeout, .. } = &mut self.kind {
            *timeout = Some(after);
        }
        self
    }

    /// For a gate: decide `on_timeout` when no decision came within `after`
    /// of the run reaching it. No effect on other steps. `after` must lie in
    /// [`limits::GATE_TIMEOUT`](crate::record::limits::GATE_TIMEOUT), checked when the
    /// workflow is built.
    pub fn gate_timeout(mut self, after: Duration, on_timeout: OnTimeout) -> Self {
        if let StepKind::Gate { .. } = self.kind {
            self.kind = StepKind::Gate {
                timeout: Some(after),
                on_timeout,
            };
        }
        self
    }

    /// Checks every duration of the step against its range in [`crate::limits`].
    pub(crate) fn check_durations(&self) -> Result<(), String> {
        use crate::record::limits::{GATE_TIMEOUT, SLEEP, STEP_TIMEOUT};
        match &self.kind {
            StepKind::Run(_) => {
                if let Some(t) = self.timeout {
                    STEP_TIMEOUT.check("timeout", t)?;
                }
                self.retry.check()
            }
            StepKind::Gate {
                timeout: Some(t), ..
            } => GATE_TIMEOUT.check("gate timeout", *t).map(drop),
            StepKind::Gate { timeout: None, .. } => Ok(()),
            StepKind::Sleep(d) => SLEEP.check("sleep", *d).map(drop),
            StepKind::Child { workflow } => {
                crate::record::ids::check_step_name(workflow)
                    .map_err(|r| format!("the workflow of its child run: {r}"))?;
                let most = crate::engine::family::MAX_CHILD_ATTEMPTS;
                if self.retry.max_attempts() > most {
                    return Err(format!(
                        "its retry policy allows {} attempts; a child is tried at most {most} times",
                        self.retry.max_attempts()
                    ));
                }
                self.retry.check()
            }
            StepKind::Signal { signal, timeout: t } => {
                crate::record::ids::check_step_name(signal)
                    .map_err(|r| format!("the signal it waits for: {r}"))?;
                match t {
                    Some(t) => GATE_TIMEOUT.check("signal timeout", *t).map(drop),
                    None => Ok(()),
                }
            }
        }
    }

    pub(crate) fn kind(&self) -> &StepKind {
        &self.kind
    }

    /// Sets the retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Cancels an attempt that runs longer than `d` (a retryable failure).
    /// `d` must lie in [`limits::STEP_TIMEOUT`](crate::record::limits::STEP_TIMEOUT),
    /// checked when the workflow is built.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Holds a slot of a shared limit while each attempt runs: at most
    /// its size of steps holding `limit`'s key run at once across every
    /// process on the store, and with a rate set on the store
    /// (`steadfast limits set KEY --rate 500/min`), at most that many start
    /// per period. A step that finds no slot free waits durably (the run
    /// sleeps and looks again) instead of running. Only steps that run a
    /// function take a slot.
    ///
    /// ```
    /// use steadfast_core::{update, LimitSpec, Step, Workflow};
    /// let ask = Step::new("ask", |_, _| async { update(serde_json::json!({})) })
    ///     .limit(LimitSpec::parse("openai:8").unwrap());
    /// assert_eq!(ask.limit_spec().unwrap().size, Some(8));
    /// ```
    pub fn limit(mut self, limit: crate::record::limit::LimitSpec) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Declares the version of the step's code (`"2"`, `"2026-12-03"`): 1 to
    /// [`MAX_VERSION_BYTES`](crate::record::version::MAX_VERSION_BYTES)
    /// bytes without control characters, checked when the workflow is
    /// built. Each completion records it ([`STEP_KEY`](crate::STEP_KEY)),
    /// so a [`plan`](crate::ops::plan::plan) shows a step whose code changed
    /// since it ran. Raise it when a change matters to runs in flight, or
    /// take it from the code, where the step lives in a file of its own:
    /// `.version(StepVersion::digest(include_str!("fetch.rs")))` (any edit
    /// of the file is then a new version).
    ///
    /// ```
    /// use steadfast_core::{update, Step, Workflow};
    /// let ask = Step::new("ask", |_, _| async { update(serde_json::json!({})) }).version("2");
    /// let wf = Workflow::new("agent", vec![ask])?;
    /// let def = wf.steps()[0].definition().unwrap();
    /// assert_eq!(def.fields()["version"], "2");
    /// # Ok::<(), steadfast_core::Error>(())
    /// ```
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.declared = Some(version.into());
        self
    }

    /// Sets what the step runs as, for a front end that builds steps from a
    /// definition of its own (a flow file's command, environment, timeout,
    /// ...); a declared [`version`](Self::version) is added to its fields.
    pub fn defined_as(mut self, definition: StepVersion) -> Self {
        self.definition = Some(definition);
        self
    }

    /// What the step runs as, if known: its definition with its declared
    /// version (once the workflow is built).
    pub fn definition(&self) -> Option<&StepVersion> {
        self.definition.as_ref()
    }

    /// The definition with the declared version in it.
    fn settle_definition(&mut self) -> Result<(), String> {
        if !matches!(self.kind, StepKind::Run(_))
            && (self.declared.is_some() || self.definition.is_some())
        {
            return Err("a version applies only to steps that run a function; a gate, timer, wait or child is known by its name".into());
        }
        let Some(v) = self.declared.take() else {
            return Ok(());
        };
        let declared = StepVersion::declared(&v)?;
        self.definition = Some(match self.definition.take() {
            None => declared,
            Some(d) => {
                let mut fields = d.fields().clone();
                fields.extend(declared.fields().clone());
                StepVersion::of_fields(fields)?
            }
        });
        Ok(())
    }

    /// The shared limit the step holds while it runs, if any.
    pub fn limit_spec(&self) -> Option<&crate::record::limit::LimitSpec> {
        self.limit.as_ref()
    }

    /// Whether the step runs a function (not a gate, timer, wait or child).
    pub fn runs_a_function(&self) -> bool {
        matches!(self.kind, StepKind::Run(_))
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The step's retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The step's timeout.
    pub fn timeout_after(&self) -> Option<Duration> {
        self.timeout
    }

    /// Calls the step's function; its timeout is the caller's to apply.
    pub(crate) async fn call_untimed(
        &self,
        ctx: StepCtx,
        state: Arc<State>,
    ) -> Result<Update, StepError> {
        let StepKind::Run(f) = &self.kind else {
            return Err(StepError::terminal(
                "a gate or timer step has no function to call",
            ));
        };
        f(ctx, state).await
    }
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Converts a JSON value into an [`Update`], failing unless it is an object.
///
/// ```
/// use serde_json::json;
/// assert!(steadfast_core::update(json!({"a": 1})).is_ok());
/// assert!(steadfast_core::update(json!([1, 2])).is_err());
/// ```
pub fn update(value: serde_json::Value) -> Result<Update, StepError> {
    match value {
        serde_json::Value::Object(map) => Ok(map),
        other => Err(StepError::terminal(format!(
            "a step update must be a JSON object, got {}",
            json_kind(&other)
        ))),
    }
}

pub(crate) use crate::record::state::json_kind;

/// A name and an ordered list of uniquely named steps.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::{update, Workflow};
///
/// let wf = Workflow::builder("greet")
///     .step("hello", |_ctx, _state| async { update(json!({"greeting": "hello"})) })
///     .step("world", |_ctx, _state| async { update(json!({"target": "world"})) })
///     .build()
///     .unwrap();
/// assert_eq!(wf.step_names().collect::<Vec<_>>(), ["hello", "world"]);
/// ```
#[derive(Clone, Debug)]
pub struct Workflow {
    name: String,
    steps: Vec<Step>,
    budget: BTreeMap<String, f64>,
    version: Option<String>,
}

impl Workflow {
    /// Starts building a workflow named `name`.
    pub fn builder(name: impl Into<String>) -> WorkflowBuilder {
        WorkflowBuilder {
            name: name.into(),
            steps: Vec::new(),
            budget: BTreeMap::new(),
            version: None,
        }
    }

    /// A workflow from a list of steps; fails on an empty list, an empty or
    /// duplicate step name, or a bad workflow name.
    pub fn new(name: impl Into<String>, mut steps: Vec<Step>) -> Result<Self, Error> {
        let name = name.into();
        let invalid = |reason: String| Error::InvalidWorkflow {
            workflow: name.clone(),
            reason,
        };
        check_step_name(&name)
            .map_err(|r| invalid(format!("the workflow name is invalid: {r}")))?;
        if steps.is_empty() {
            return Err(invalid("a workflow needs at least one step".into()));
        }
        let mut seen = HashSet::new();
        for (i, step) in steps.iter_mut().enumerate() {
            step.settle_definition()
                .map_err(|r| invalid(format!("step {i} ({}): {r}", step.name)))?;
        }
        for (i, step) in steps.iter().enumerate() {
            check_step_name(&step.name)
                .map_err(|r| invalid(format!("step {i} has an invalid name: {r}")))?;
            // A gate's or a wait's name is a state key, and a step's events
            // under the signals' step would read as signals.
            if crate::record::keys::RESERVED_KEYS.contains(&step.name.as_str())
                || step.name == crate::record::signal::SIGNAL_STEP
                || step.name == crate::record::version::STEP_KEY
            {
                return Err(invalid(format!(
                    "step {i} is named {:?}, a name the engine keeps for itself",
                    step.name
                )));
            }
            if !seen.insert(step.name.as_str()) {
                return Err(invalid(format!(
                    "step {i} is named {:?}, like an earlier step; step names must be unique",
                    step.name
                )));
            }
            step.check_durations()
                .map_err(|r| invalid(format!("step {i} ({}): {r}", step.name)))?;
        }
        Ok(Workflow {
            name,
            steps,
            budget: BTreeMap::new(),
            version: None,
        })
    }

    /// The same workflow declared as version `version` (1 to 100 bytes, no
    /// control characters). A run records the version of the workflow it
    /// was started with ([`Origin::version`](crate::Origin::version)), and
    /// resumes only under that version: a [`Registry`](crate::Registry)
    /// holding several versions of one workflow gives each run its own and
    /// new runs the newest, and a [`run`](crate::run) with another version
    /// is refused as changed code ([`Error::WorkflowChanged`]). A workflow
    /// without a version runs any run, as before versions existed, and a
    /// run started without one (or before versions were recorded) runs
    /// under any version.
    ///
    /// ```
    /// use steadfast_core::{update, Workflow};
    /// let wf = Workflow::builder("ingest")
    ///     .version("2026-12-01")
    ///     .step("fetch", |_, _| async { update(serde_json::json!({})) })
    ///     .build()?;
    /// assert_eq!(wf.version(), Some("2026-12-01"));
    /// assert!(wf.clone().with_version("").is_err());
    /// # Ok::<(), steadfast_core::Error>(())
    /// ```
    pub fn with_version(mut self, version: impl Into<String>) -> Result<Self, Error> {
        let version = version.into();
        crate::record::version::check_version("the workflow's version", &version).map_err(
            |reason| Error::InvalidWorkflow {
                workflow: self.name.clone(),
                reason,
            },
        )?;
        self.version = Some(version);
        Ok(self)
    }

    /// The version it was declared as ([`with_version`](Self::with_version)).
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The same workflow with budgets for its runs (`{"tokens": 200000.0,
    /// "usd": 5.0}`): a run started without budgets of its own records
    /// these, and stops at its [`budget`](crate::BUDGET_GATE) gate when its
    /// steps' spend passes one ([`StepCtx::spend`]). Refused for names or
    /// amounts out of range, and for a workflow with a step named `budget`
    /// (the gate's name).
    pub fn with_budget(mut self, budget: BTreeMap<String, f64>) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidWorkflow {
            workflow: self.name.clone(),
            reason,
        };
        crate::record::spend::Spend::with_budget(budget.clone())
            .check()
            .map_err(|r| invalid(format!("its budget: {r}")))?;
        if !budget.is_empty()
            && self
                .step_names()
                .any(|n| n == crate::record::spend::BUDGET_GATE)
        {
            return Err(invalid(format!(
                "a step is named {:?}, the name of the gate a run over its budget stops at; rename it",
                crate::record::spend::BUDGET_GATE
            )));
        }
        self.budget = budget;
        Ok(self)
    }

    /// The budgets its runs start with, if they have none of their own
    /// ([`with_budget`](Self::with_budget)).
    pub fn budget(&self) -> &BTreeMap<String, f64> {
        &self.budget
    }

    /// The workflow's name, stored with every run.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The step names, in order.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|s| s.name.as_str())
    }
}

/// Builds a [`Workflow`]; names are checked by [`WorkflowBuilder::build`].
#[derive(Debug)]
#[must_use]
pub struct WorkflowBuilder {
    name: String,
    steps: Vec<Step>,
    budget: BTreeMap<String, f64>,
    version: Option<String>,
}

impl WorkflowBuilder {
    /// Appends a step with the default retry policy and no timeout.
    pub fn step<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepCtx, Arc<State>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Update, StepError>> + Send + 'static,
    {
        self.push(Step::new(name, f))
    }

    /// Appends a step built with [`Step::new`].
    pub fn push(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// Checks the names and returns the workflow.
    pub fn build(self) -> Result<Workflow, Error> {
        let wf = Workflow::new(self.name, self.steps)?.with_budget(self.budget)?;
        match self.version {
            Some(v) => wf.with_version(v),
            None => Ok(wf),
        }
    }

    /// Declares the workflow's version ([`Workflow::with_version`]; checked
    /// by [`build`](Self::build)).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// A budget for the workflow's runs: at most `amount` of `what`
    /// ([`Workflow::with_budget`]; checked by [`build`](Self::build)).
    ///
    /// ```
    /// use steadfast_core::{update, Workflow};
    /// let wf = Workflow::builder("agent")
    ///     .budget("usd", 5.0)
    ///     .step("ask", |_, _| async { update(serde_json::json!({})) })
    ///     .build()?;
    /// assert_eq!(wf.budget()["usd"], 5.0);
    /// # Ok::<(), steadfast_core::Error>(())
    /// ```
    pub fn budget(mut self, what: &str, amount: f64) -> Self {
        self.budget.insert(what.to_string(), amount);
        self
    }
}
