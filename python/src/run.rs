//! Running listed workflows and durable functions of Python callables.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use serde_json::Value;
use steadfast::{
    limits, DurableCtx, Error, OnTimeout, Outcome, RetryPolicy, Runner, Step, StepError,
    StepOptions, Store, Suspension, Workflow,
};

use crate::call::{CallError, Caller};
use crate::convert::to_py;
use crate::errors::{err, InvalidInput};
use crate::pending::{spawn, spawn_first_here, start_here, Finish, Pending};
use crate::store::{json_arg, PyStore};

/// A duration in seconds from Python, checked: finite, not negative, in range.
pub fn secs(what: &str, s: f64) -> PyResult<Duration> {
    let shown = if s.is_finite() && s.abs() >= 1e9 {
        format!("{s:e}")
    } else {
        format!("{s}")
    };
    Duration::try_from_secs_f64(s).map_err(|_| {
        InvalidInput::new_err(format!(
            "{what}: {shown} is not a duration in seconds (a finite number, 0 or more)"
        ))
    })
}

/// A duration in seconds checked against its range in `steadfast::limits`.
fn ranged(what: &str, s: f64, range: limits::DurationRange) -> PyResult<Duration> {
    let d = secs(what, s)?;
    range.check(what, d).map_err(InvalidInput::new_err)?;
    Ok(d)
}

fn opt_ranged(
    what: &str,
    s: Option<f64>,
    range: limits::DurationRange,
) -> PyResult<Option<Duration>> {
    s.map(|s| ranged(what, s, range)).transpose()
}

/// A retry policy from `retries` (extra attempts) and backoff bounds: the
/// numbers converted here, their ranges checked where the library builds a
/// policy from options ([`RetryPolicy::from_options`]).
fn policy(
    name: &str,
    retries: Option<i64>,
    backoff: Option<f64>,
    max_backoff: Option<f64>,
) -> PyResult<Option<RetryPolicy>> {
    if retries.is_none() && backoff.is_none() && max_backoff.is_none() {
        return Ok(None);
    }
    let secs_of = |what: &str, s: Option<f64>| {
        s.map(|s| secs(&format!("step {name:?}: {what}"), s))
            .transpose()
    };
    let (backoff, max) = (
        secs_of("backoff", backoff)?,
        secs_of("max_backoff", max_backoff)?,
    );
    RetryPolicy::from_options(retries, backoff, max)
        .map(Some)
        .map_err(|e| InvalidInput::new_err(format!("step {name:?}: {e}")))
}

fn on_timeout(name: &str, s: Option<&str>) -> PyResult<OnTimeout> {
    s.map_or(Ok(OnTimeout::default()), str::parse)
        .map_err(|e: String| InvalidInput::new_err(format!("gate {name:?}: {e}")))
}

/// One step of a listed workflow, as the Python `Workflow` describes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct StepSpec {
    kind: String,
    name: String,
    func: Option<Py<PyAny>>,
    retries: Option<i64>,
    backoff: Option<f64>,
    max_backoff: Option<f64>,
    timeout: Option<f64>,
    on_timeout: Option<String>,
    seconds: Option<f64>,
    signal: Option<String>,
    workflow: Option<String>,
    limit: Option<String>,
    version: Option<String>,
}

/// The step context a listed step function gets.
#[pyclass(frozen, module = "steadfast._native", name = "StepContext")]
pub struct PyStepCtx {
    /// The run's id.
    #[pyo3(get)]
    run_id: String,
    /// The step's name.
    #[pyo3(get)]
    step: String,
    /// The step's index in the workflow.
    #[pyo3(get)]
    index: usize,
    /// This attempt's number, from 1.
    #[pyo3(get)]
    attempt: u32,
    /// `run_id/step`: the same on every attempt and every resume; pass it to
    /// external services so that a repeat is a no-op.
    #[pyo3(get)]
    idempotency_key: String,
    /// The engine's context of the step, which takes what it emits.
    inner: steadfast::StepCtx,
}

impl PyStepCtx {
    /// The Python view of `ctx`.
    pub fn of(ctx: &steadfast::StepCtx) -> Self {
        PyStepCtx {
            run_id: ctx.run_id().to_string(),
            step: ctx.step().to_string(),
            index: ctx.index(),
            attempt: ctx.attempt(),
            idempotency_key: ctx.idempotency_key(),
            inner: ctx.clone(),
        }
    }
}

#[pymethods]
impl PyStepCtx {
    /// Emits `value` (JSON-like) into the run's event log while the step
    /// runs; see `steadfast watch`.
    fn emit(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = crate::convert::to_json(value).map_err(|u| {
            crate::errors::InvalidInput::new_err(format!(
                "an event emitted by step {:?}: the value at {}: {}",
                self.step,
                crate::convert::shorten(&u.path),
                u.reason
            ))
        })?;
        self.inner.emit(value).map_err(|e| crate::errors::err(&e))
    }

    /// Reports that this attempt spent `amount` of `what`: added to the
    /// run's spend and saved in its record as the step goes on (at the
    /// latest with its checkpoint); past a budget, the run stops at its
    /// `budget` gate before its next step.
    fn spend(&self, what: &str, amount: &Bound<'_, PyAny>) -> PyResult<()> {
        use pyo3::types::{PyBool, PyFloat, PyInt};
        if amount.is_instance_of::<PyBool>()
            || !(amount.is_instance_of::<PyInt>() || amount.is_instance_of::<PyFloat>())
        {
            return Err(InvalidInput::new_err(format!(
                "ctx.spend({what:?}, ...): the amount is not a number"
            )));
        }
        let amount: f64 = amount.extract()?;
        // Not waited for: the step's function may run in the very poll that
        // saves the report (its first poll on a blocking thread).
        drop(
            self.inner
                .spend(what, amount)
                .map_err(|e| crate::errors::err(&e))?,
        );
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "StepContext(run_id={:?}, step={:?}, index={}, attempt={})",
            self.run_id, self.step, self.index, self.attempt
        )
    }
}

/// The workflow of a Python `Workflow`'s name and steps, for reading only
/// (a plan): its functions are never called.
pub fn build_unrun(
    py: Python<'_>,
    name: &str,
    version: Option<String>,
    specs: Vec<StepSpec>,
) -> PyResult<Workflow> {
    build(name, version, specs, &Caller::new(py.None(), py.None()))
}

fn build(
    name: &str,
    version: Option<String>,
    specs: Vec<StepSpec>,
    caller: &Caller,
) -> PyResult<Workflow> {
    let mut b = Workflow::builder(name);
    if let Some(v) = version {
        b = b.version(v);
    }
    for spec in specs {
        let step = match spec.kind.as_str() {
            "step" => {
                let Some(func) = spec.func else {
                    return Err(InvalidInput::new_err(format!(
                        "step {:?} has no function",
                        spec.name
                    )));
                };
                let func = Arc::new(func);
                let caller = caller.clone();
                let mut step = Step::new(spec.name.clone(), move |ctx, state| {
                    let (func, caller) = (Arc::clone(&func), caller.clone());
                    let step_name = ctx.step().to_string();
                    async move {
                        let out = caller
                            .call(&step_name, func, move |py| {
                                let c = PyStepCtx::of(&ctx);
                                let state = to_py(py, &Value::Object((*state).clone()))?;
                                Ok(vec![Py::new(py, c)?.into_any(), state])
                            })
                            .await?;
                        match out {
                            Value::Null => Ok(Default::default()),
                            // The engine's own keys are dropped by the run
                            // loop (a step that returns its state with a
                            // change gives them back); the key that marks
                            // bytes is Python's, and refused here.
                            Value::Object(map) => {
                                match map.keys().find(|k| k.as_str() == crate::convert::MARK) {
                                    Some(k) => Err(StepError::invalid_value(
                                        format!("$.{k}"),
                                        "the key marks bytes in Python's values; rename it"
                                            .to_string(),
                                    )),
                                    None => Ok(map),
                                }
                            }
                            other => Err(StepError::invalid_value(
                                String::new(),
                                format!(
                                    "a step returns a dict of updates or None, not {}",
                                    kind_of(&other)
                                ),
                            )),
                        }
                    }
                });
                if let Some(p) = policy(&spec.name, spec.retries, spec.backoff, spec.max_backoff)? {
                    step = step.retry(p);
                }
                let what = format!("step {:?}: timeout", spec.name);
                if let Some(t) = opt_ranged(&what, spec.timeout, limits::STEP_TIMEOUT)? {
                    step = step.timeout(t);
                }
                if let Some(l) = &spec.limit {
                    step = step.limit(limit_of(&spec.name, l)?);
                }
                if let Some(v) = &spec.version {
                    step = step.version(v.clone());
                }
                step
            }
            "gate" => {
                let mut step = Step::gate(spec.name.clone());
                let on = on_timeout(&spec.name, spec.on_timeout.as_deref())?;
                let what = format!("gate {:?}: timeout", spec.name);
                if let Some(t) = opt_ranged(&what, spec.timeout, limits::GATE_TIMEOUT)? {
                    step = step.gate_timeout(t, on);
                }
                step
            }
            "wait" => {
                let Some(signal) = spec.signal.clone() else {
                    return Err(InvalidInput::new_err(format!(
                        "wait {:?} names no signal",
                        spec.name
                    )));
                };
                let mut step = Step::wait_for(spec.name.clone(), signal);
                let what = format!("wait {:?}: timeout", spec.name);
                if let Some(t) = opt_ranged(&what, spec.timeout, limits::GATE_TIMEOUT)? {
                    step = step.signal_timeout(t);
                }
                step
            }
            "child" => {
                let Some(workflow) = spec.workflow.clone() else {
                    return Err(InvalidInput::new_err(format!(
                        "child {:?} names no workflow",
                        spec.name
                    )));
                };
                let mut step = Step::child(spec.name.clone(), workflow);
                if let Some(p) = policy(&spec.name, spec.retries, None, None)? {
                    step = step.retry(p);
                }
                step
            }
            "sleep" => {
                let what = format!("sleep {:?}", spec.name);
                let d = ranged(&what, spec.seconds.unwrap_or(-1.0), limits::SLEEP)?;
                Step::sleep(spec.name.clone(), d)
            }
            other => {
                return Err(InvalidInput::new_err(format!(
                    "unknown step kind {other:?}"
                )))
            }
        };
        b = b.push(step);
    }
    b.build().map_err(|e| err(&e))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "None",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a str",
        Value::Array(_) => "a list",
        Value::Object(_) => "a dict",
    }
}

/// A run's input from Python: None for none, else checked JSON.
fn input_arg(input: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Value>> {
    input
        .filter(|v| !v.is_none())
        .map(|v| json_arg("the run's input", v))
        .transpose()
}

/// Options of one run call.
#[derive(Clone)]
struct RunOpts {
    accept_changed: bool,
    wait_for_timers: bool,
    /// Budgets of a run that has none yet.
    budget: Option<std::collections::BTreeMap<String, f64>>,
    /// The run's lease, as `steadfast run --lease` takes it: another process
    /// running the same run meanwhile gets `Held`. None: no lease.
    lease: Option<Duration>,
}

impl RunOpts {
    fn new(
        accept_changed: bool,
        wait_for_timers: bool,
        lease: Option<f64>,
        budget: Option<std::collections::BTreeMap<String, f64>>,
    ) -> PyResult<Self> {
        if let Some(b) = &budget {
            steadfast::Spend::with_budget(b.clone())
                .check()
                .map_err(|r| InvalidInput::new_err(format!("the budget: {r}")))?;
        }
        Ok(RunOpts {
            accept_changed,
            wait_for_timers,
            budget,
            lease: opt_ranged("the lease", lease, limits::LEASE)?,
        })
    }
}

fn runner<'s>(store: &'s Arc<dyn Store>, o: RunOpts) -> Runner<'s, Arc<dyn Store>> {
    let r = Runner::new(store)
        .accept_changed_workflow(o.accept_changed)
        .wait_for_timers(o.wait_for_timers);
    let r = match o.budget {
        Some(b) => r.budget(b),
        None => r,
    };
    match o.lease {
        Some(ttl) => r.lease(steadfast::current_owner(), ttl),
        None => r,
    }
}

/// An outcome as the tuple the Python `Outcome` is made from.
fn outcome_tuple(py: Python<'_>, o: Outcome<Value>) -> PyResult<Py<PyAny>> {
    let t = match o {
        Outcome::Completed(v) => ("completed", to_py(py, &v)?, py.None(), py.None()),
        Outcome::Waiting { gate } => (
            "waiting",
            py.None(),
            gate.into_pyobject(py)?.into_any().unbind(),
            py.None(),
        ),
        Outcome::Sleeping { until } => (
            "sleeping",
            py.None(),
            py.None(),
            until.unix_millis().into_pyobject(py)?.into_any().unbind(),
        ),
        Outcome::Rejected { gate, reason } => (
            "rejected",
            reason.into_pyobject(py)?.into_any().unbind(),
            gate.into_pyobject(py)?.into_any().unbind(),
            py.None(),
        ),
        other => {
            return Err(crate::errors::SteadfastError::new_err(format!(
                "an outcome this version does not know: {other:?}"
            )))
        }
    };
    Ok(t.into_pyobject(py)?.into_any().unbind())
}

/// Starts or resumes a listed workflow; an awaitable of the outcome tuple.
#[pyfunction]
#[pyo3(signature = (event_loop, invoke, run_id, name, steps, store, input=None, accept_changed=false, wait_for_timers=false, lease=None, budget=None, version=None))]
#[allow(clippy::too_many_arguments)]
pub fn run_workflow<'py>(
    event_loop: Py<PyAny>,
    invoke: Py<PyAny>,
    run_id: String,
    name: String,
    steps: Vec<StepSpec>,
    store: &PyStore,
    input: Option<&Bound<'py, PyAny>>,
    accept_changed: bool,
    wait_for_timers: bool,
    lease: Option<f64>,
    budget: Option<std::collections::BTreeMap<String, f64>>,
    version: Option<String>,
) -> PyResult<Pending> {
    let caller = Caller::new(event_loop, invoke);
    let wf = build(&name, version, steps, &caller)?;
    let input = input_arg(input)?;
    let store = Arc::clone(&store.inner);
    let opts = RunOpts::new(accept_changed, wait_for_timers, lease, budget)?;
    Ok(spawn(async move {
        if let Some(input) = input {
            if let Err(e) = steadfast::start_if_new(&*store, &run_id, |s| {
                steadfast::start_listed(s, &wf, &run_id, input)
            })
            .await
            {
                return finish_err(e);
            }
        }
        let guard = steadfast::LeaseGuard::new(&store, &run_id, opts.lease.is_some());
        let out = runner(&store, opts).run(&run_id, &wf).await;
        guard.finish(&out).await;
        Box::new(move |py: Python<'_>| match out {
            Ok(o) => outcome_tuple(py, o.map(Value::Object)),
            Err(e) => Err(caller.with_cause(py, err(&e), &e)),
        }) as Finish
    }))
}

/// Engine errors raised inside a durable function, kept so that the same
/// error comes back out when the function lets the exception propagate.
#[derive(Default)]
struct Raised {
    next: u64,
    errors: HashMap<u64, Error>,
    /// The exception the function's own code raised, re-raised to the caller.
    own: Option<PyErr>,
    /// Set when a gate or timer stopped the run: every later context call
    /// stops too, and the call ends with this outcome whatever the function
    /// did after catching it.
    stopped: Option<Suspension>,
    /// Set when the function has returned: later context calls are refused.
    closed: bool,
    /// Context calls still running, by number, to stop if the function
    /// returns without awaiting them.
    running: HashMap<u64, crate::pending::Abort>,
}

/// The context of a durable function in Python.
#[pyclass(frozen, module = "steadfast._native", name = "DurableContext")]
pub struct PyDurableCtx {
    ctx: DurableCtx<'static, Arc<dyn Store>>,
    caller: Caller,
    raised: Arc<Mutex<Raised>>,
    /// Whether the run is leased (its lease renewed while steps run).
    leased: bool,
    /// Whether the function is sync: every call blocks its thread until it
    /// is done, and a step's function runs on that thread.
    blocking: bool,
}

/// The Python exception for `e`, tagged so that it maps back to `e`.
fn raise(py: Python<'_>, raised: &Mutex<Raised>, caller: &Caller, e: Error) -> PyErr {
    let pyerr = caller.with_cause(py, err(&e), &e);
    let mut r = raised.lock().unwrap_or_else(|p| p.into_inner());
    r.next += 1;
    let id = r.next;
    r.errors.insert(id, e);
    let _ = pyerr.value(py).setattr("_steadfast_error", id);
    pyerr
}

impl PyDurableCtx {
    fn awaitable<F>(&self, fut: F) -> PyResult<Pending>
    where
        F: std::future::Future<Output = Result<Value, Error>> + Send + 'static,
    {
        let start: crate::pending::Start = if self.blocking {
            crate::pending::block_apart
        } else {
            crate::pending::spawn_as
        };
        self.awaitable_by(fut, start)
    }

    /// Like [`awaitable`](Self::awaitable), started by `start`.
    fn awaitable_by<F>(&self, fut: F, start: crate::pending::Start) -> PyResult<Pending>
    where
        F: std::future::Future<Output = Result<Value, Error>> + Send + 'static,
    {
        let raised = Arc::clone(&self.raised);
        let caller = self.caller.clone();
        let mut r = self.raised.lock().unwrap_or_else(|p| p.into_inner());
        if r.closed {
            return Err(crate::errors::InvalidWorkflow::new_err(
                "the durable function has returned: its context takes no more calls",
            ));
        }
        if let Some(s) = r.stopped.clone() {
            // The run is stopped at a gate or timer: nothing more may run.
            return Ok(spawn(async move {
                Box::new(move |py: Python<'_>| {
                    Err(raise(py, &raised, &caller, Error::Suspended(s)))
                }) as Finish
            }));
        }
        if !r.running.is_empty() {
            // Two calls at once would be recorded in the order they end,
            // which a resume cannot reproduce.
            return Err(crate::errors::InvalidWorkflow::new_err(
                "another context call of this run is still running: await each call before making the next (a step's function makes none), and run steps at once with ctx.parallel",
            ));
        }
        r.next += 1;
        let id = r.next;
        // Counted as running before it starts, and the lock let go: an
        // operation may finish within `start`, on this thread.
        let abort = crate::pending::Abort::default();
        r.running.insert(id, abort.clone());
        drop(r);
        let mark = Arc::clone(&self.raised);
        let pending = start(
            abort,
            Box::pin(async move {
                let out = fut.await;
                {
                    let mut r = mark.lock().unwrap_or_else(|p| p.into_inner());
                    r.running.remove(&id);
                    if let Err(Error::Suspended(s)) = &out {
                        r.stopped.get_or_insert_with(|| s.clone());
                    }
                }
                Box::new(move |py: Python<'_>| match out {
                    Ok(v) => to_py(py, &v),
                    Err(e) => Err(raise(py, &raised, &caller, e)),
                }) as Finish
            }),
        );
        Ok(pending)
    }
}

/// A step's `limit="KEY"` or `"KEY:N"`.
fn limit_of(name: &str, text: &str) -> PyResult<steadfast::LimitSpec> {
    steadfast::LimitSpec::parse(text)
        .map_err(|e| InvalidInput::new_err(format!("step {name:?}: limit {text:?}: {e}")))
}

fn options(
    name: &str,
    retries: Option<i64>,
    backoff: Option<f64>,
    max_backoff: Option<f64>,
    timeout: Option<f64>,
    limit: Option<&str>,
    version: Option<&str>,
) -> PyResult<StepOptions> {
    let mut o = StepOptions::new();
    if let Some(v) = version {
        o = o.version(v);
    }
    if let Some(l) = limit {
        o = o.limit(limit_of(name, l)?);
    }
    if let Some(p) = policy(name, retries, backoff, max_backoff)? {
        o = o.retry(p);
    }
    if let Some(t) = opt_ranged(
        &format!("step {name:?}: timeout"),
        timeout,
        limits::STEP_TIMEOUT,
    )? {
        o = o.timeout(t);
    }
    Ok(o)
}

/// Refuses a step name that would be a state key marking bytes (`$py`, see
/// `convert`).
fn mark_free(name: &str) -> PyResult<()> {
    if name == crate::convert::MARK {
        return Err(crate::errors::InvalidInput::new_err(format!(
            "step name {name:?} is the key that marks bytes in Python's values; rename the step"
        )));
    }
    Ok(())
}

#[pymethods]
impl PyDurableCtx {
    /// Runs `func` (no arguments, sync or async) as the step `name`, or
    /// returns its recorded output on a resume.
    ///
    /// `on_loop`: `func` is a coroutine function, and this is called on the
    /// event loop's thread.
    #[pyo3(signature = (name, func, retries=None, backoff=None, max_backoff=None, timeout=None, on_loop=false, limit=None, version=None))]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        name: String,
        func: Py<PyAny>,
        retries: Option<i64>,
        backoff: Option<f64>,
        max_backoff: Option<f64>,
        timeout: Option<f64>,
        on_loop: bool,
        limit: Option<String>,
        version: Option<String>,
    ) -> PyResult<Pending> {
        mark_free(&name)?;
        let opts = options(
            &name,
            retries,
            backoff,
            max_backoff,
            timeout,
            limit.as_deref(),
            version.as_deref(),
        )?;
        let (ctx, caller, func) = (self.ctx.clone(), self.caller.clone(), Arc::new(func));
        let step = name.clone();
        // A step without a timeout starts on a blocking thread that calls a
        // sync function itself and records its value (see
        // `spawn_first_here`), or, for a coroutine function, on the loop's
        // thread, which schedules the coroutine right there (`start_here`);
        // one with a timeout needs its function on a thread of its own, so
        // that the engine can give up on it, and so does a leased run's.
        // A leased run's lease is renewed while a step waits: not while its
        // function holds the thread that would renew it.
        // (A leased run's async step starts on a blocking thread: its start
        // may renew the lease, a write the loop should not wait for.)
        // A sync durable function's step runs on its thread, the function's
        // own, with its checkpoint; with a timeout, a lease or a shared
        // limit (whose slot is renewed while the step runs), on a thread of
        // its own while the function's thread drives the engine.
        let limited = limit.is_some();
        let start: crate::pending::Start = match (timeout, on_loop, self.leased) {
            _ if self.blocking && on_loop => {
                return Err(InvalidInput::new_err(format!(
                    "step {name:?}: its function is a coroutine function, and a sync durable function (a plain `def`) waits for each step on its own thread: give a sync function, or make the durable function an `async def`"
                )))
            }
            (None, _, false) if self.blocking && !limited => crate::pending::block_inline,
            _ if self.blocking => crate::pending::block_apart,
            (Some(_), _, _) | (None, false, true) => crate::pending::spawn_as,
            (None, false, false) | (None, true, true) => spawn_first_here,
            (None, true, false) => |abort, fut| Python::attach(|py| start_here(py, abort, fut)),
        };
        self.awaitable_by(
            async move {
                ctx.step_with(name, opts, move || {
                    let (caller, func) = (caller.clone(), Arc::clone(&func));
                    let step = step.clone();
                    async move { caller.call(&step, func, |_| Ok(vec![])).await }
                })
                .await
            },
            start,
        )
    }

    /// Runs several steps at once: `branches` is a list of (name, func).
    fn parallel(&self, branches: Vec<(String, Py<PyAny>)>) -> PyResult<Pending> {
        for (name, _) in &branches {
            mark_free(name)?;
        }
        let (ctx, caller) = (self.ctx.clone(), self.caller.clone());
        self.awaitable(async move {
            let futs = branches.into_iter().map(|(name, func)| {
                let caller = caller.clone();
                let func = Arc::new(func);
                let step = name.clone();
                (name, async move {
                    caller.call(&step, func, |_| Ok(vec![])).await
                })
            });
            ctx.parallel(futs).await.map(Value::Array)
        })
    }

    /// Waits at gate `name`: the approval's data (or None) once decided.
    #[pyo3(signature = (name, timeout=None, on_timeout=None))]
    fn gate(
        &self,
        name: String,
        timeout: Option<f64>,
        on_timeout: Option<&str>,
    ) -> PyResult<Pending> {
        let t = opt_ranged(
            &format!("gate {name:?}: timeout"),
            timeout,
            limits::GATE_TIMEOUT,
        )?;
        let on = on_timeout_arg(&name, on_timeout)?;
        let ctx = self.ctx.clone();
        self.awaitable(async move {
            ctx.gate_with(&name, t, on)
                .await
                .map(|v| v.unwrap_or(Value::Null))
        })
    }

    /// Waits for signal `name`: its delivery (signal, data, by, at, seq),
    /// or None when `timeout` seconds passed first.
    #[pyo3(signature = (name, timeout=None))]
    fn wait_for(&self, name: String, timeout: Option<f64>) -> PyResult<Pending> {
        let t = opt_ranged(
            &format!("wait for {name:?}: timeout"),
            timeout,
            limits::GATE_TIMEOUT,
        )?;
        let ctx = self.ctx.clone();
        self.awaitable(async move {
            ctx.wait_for(&name, t)
                .await
                .map(|s| s.map_or(Value::Null, |s| s.delivery()))
        })
    }

    /// Starts child runs and waits for their results: `children` is a list
    /// of (name, workflow, input); at most `at_once` are under way at a
    /// time, and a failed one is tried up to `retries` more times.
    #[pyo3(signature = (children, at_once=None, retries=None))]
    fn children(
        &self,
        children: Vec<(String, String, Option<Bound<'_, PyAny>>)>,
        at_once: Option<i64>,
        retries: Option<i64>,
    ) -> PyResult<Pending> {
        let mut specs = Vec::with_capacity(children.len());
        for (name, workflow, input) in &children {
            mark_free(name)?;
            let input = input
                .as_ref()
                .filter(|v| !v.is_none())
                .map(|v| json_arg(&format!("the input of child {name:?}"), v))
                .transpose()?
                .unwrap_or(Value::Null);
            specs.push(steadfast::ChildSpec::new(
                name.clone(),
                workflow.clone(),
                input,
            ));
        }
        let mut options = steadfast::ChildOptions::new();
        if let Some(n) = at_once {
            let most = steadfast::MAX_CHILDREN;
            let n = usize::try_from(n)
                .ok()
                .filter(|n| (1..=most).contains(n))
                .ok_or_else(|| {
                    InvalidInput::new_err(format!("at_once is {n}; it must lie in 1..={most}"))
                })?;
            options = options.at_once(n);
        }
        let first = children.first().map_or("children", |c| c.0.as_str());
        if let Some(p) = policy(first, retries, None, None)? {
            options = options.retry(p);
        }
        let ctx = self.ctx.clone();
        self.awaitable(async move {
            ctx.children::<Value>(specs, options)
                .await
                .map(Value::Array)
        })
    }

    /// A durable timer named `name`.
    fn sleep(&self, name: String, seconds: f64) -> PyResult<Pending> {
        let d = ranged(&format!("sleep {name:?}"), seconds, limits::SLEEP)?;
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.sleep(&name, d).await.map(|()| Value::Null) })
    }

    /// The time, recorded: milliseconds since the Unix epoch.
    fn now(&self) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.now().await.map(|t| Value::from(t.unix_millis())) })
    }

    /// Whether this run takes the new branch of patch `id`, recorded.
    fn patched(&self, id: String) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.patched(&id).await.map(Value::from) })
    }

    /// Steps over a recorded patch `id`, if the record has it here.
    fn deprecate_patch(&self, id: String) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.deprecate_patch(&id).await.map(|()| Value::Null) })
    }

    /// A random 64-bit number, recorded.
    fn random(&self) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.random().await.map(Value::from) })
    }

    /// A random UUID (version 4), recorded.
    fn uuid(&self) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { ctx.uuid().await.map(Value::from) })
    }

    /// The run's input, as recorded when it started (None without one).
    fn input(&self) -> PyResult<Pending> {
        let ctx = self.ctx.clone();
        self.awaitable(async move { Ok(ctx.input().await.unwrap_or(Value::Null)) })
    }

    /// `base` the first time it is asked for in this call, then `base#2`,
    /// `base#3`…: names for steps in a loop.
    fn numbered(&self, base: &str) -> String {
        self.ctx.numbered(base)
    }
}

fn on_timeout_arg(name: &str, s: Option<&str>) -> PyResult<OnTimeout> {
    on_timeout(name, s)
}

/// Starts or resumes a durable function; an awaitable of the outcome tuple.
/// `body(ctx)` returns the function's coroutine, made on the blocking
/// thread that starts the run (see `spawn_first_here`).
#[pyfunction]
#[pyo3(signature = (event_loop, invoke, run_id, name, body, store, input=None, accept_changed=false, wait_for_timers=false, lease=None, budget=None))]
#[allow(clippy::too_many_arguments)]
pub fn run_durable<'py>(
    event_loop: Py<PyAny>,
    invoke: Py<PyAny>,
    run_id: String,
    name: String,
    body: Py<PyAny>,
    store: &PyStore,
    input: Option<&Bound<'py, PyAny>>,
    accept_changed: bool,
    wait_for_timers: bool,
    lease: Option<f64>,
    budget: Option<std::collections::BTreeMap<String, f64>>,
) -> PyResult<Pending> {
    let caller = Caller::new(event_loop, invoke);
    let opts = RunOpts::new(accept_changed, wait_for_timers, lease, budget)?;
    let op = durable_op(
        caller,
        run_id,
        name,
        body,
        store,
        input_arg(input)?,
        opts,
        false,
    );
    Ok(spawn_first_here(crate::pending::Abort::default(), op))
}

/// Starts or resumes a sync durable function on the calling thread and
/// returns the outcome tuple when the call ends. `body(ctx)` calls the
/// function, on this thread; so does each step without a timeout (of a run
/// without a lease), which is then recorded on this thread too.
#[pyfunction]
#[pyo3(signature = (invoke, run_id, name, body, store, input=None, accept_changed=false, wait_for_timers=false, lease=None, budget=None))]
#[allow(clippy::too_many_arguments)]
pub fn run_durable_sync<'py>(
    py: Python<'py>,
    invoke: Py<PyAny>,
    run_id: String,
    name: String,
    body: Py<PyAny>,
    store: &PyStore,
    input: Option<&Bound<'py, PyAny>>,
    accept_changed: bool,
    wait_for_timers: bool,
    lease: Option<f64>,
    budget: Option<std::collections::BTreeMap<String, f64>>,
) -> PyResult<Py<PyAny>> {
    let caller = Caller::new(py.None(), invoke);
    let opts = RunOpts::new(accept_changed, wait_for_timers, lease, budget)?;
    let op = durable_op(
        caller,
        run_id,
        name,
        body,
        store,
        input_arg(input)?,
        opts,
        true,
    );
    crate::pending::block_inline(crate::pending::Abort::default(), op).wait(py)
}

/// The operation that runs a durable function: records the run with its
/// input when new, runs the body under the engine, and gives the outcome.
#[allow(clippy::too_many_arguments)]
fn durable_op(
    caller: Caller,
    run_id: String,
    name: String,
    body: Py<PyAny>,
    store: &PyStore,
    input: Option<Value>,
    opts: RunOpts,
    blocking: bool,
) -> crate::pending::Op {
    let outer = caller.clone();
    let store = Arc::clone(&store.inner);
    let raised = Arc::new(Mutex::new(Raised::default()));
    Box::pin(async move {
        if let Some(input) = input {
            if let Err(e) = steadfast::start_if_new(&*store, &run_id, |s| {
                steadfast::start(s, &name, &run_id, input, true)
            })
            .await
            {
                return finish_err(e);
            }
        }
        let r2 = Arc::clone(&raised);
        let body = Arc::new(body);
        let (workflow_name, result_run) = (name.clone(), run_id.clone());
        let leased = opts.lease.is_some();
        let guard = steadfast::LeaseGuard::new(&store, &run_id, leased);
        let out = runner(&store, opts)
        .durable(&run_id, &name, move |ctx| {
            let c = PyDurableCtx {
                ctx,
                caller: caller.clone(),
                raised: Arc::clone(&r2),
                leased,
                blocking,
            };
            async move {
                let raised = Arc::clone(&c.raised);
                let res = caller
                    .call_raw(body, move |py| Ok(vec![Py::new(py, c)?.into_any()]))
                    .await;
                let (stopped, unfinished) = {
                    let mut r = raised.lock().unwrap_or_else(|p| p.into_inner());
                    r.closed = true;
                    let running = std::mem::take(&mut r.running);
                    for h in running.values() {
                        h.abort();
                    }
                    (r.stopped.clone(), running.len())
                };
                if let Some(s) = stopped {
                    return Err(Error::Suspended(s));
                }
                if unfinished > 0 {
                    return Err(Error::InvalidWorkflow {
                        workflow: workflow_name,
                        reason: format!(
                            "the function returned while {unfinished} context call(s) it made were still running; they were stopped and nothing was recorded as complete: await every ctx call"
                        ),
                    });
                }
                res.map_err(|e| body_error(&raised, &result_run, e))
            }
        })
        .await;
        guard.finish(&out).await;
        let own = raised.lock().unwrap_or_else(|p| p.into_inner()).own.take();
        Box::new(move |py: Python<'_>| match out {
            Ok(o) => outcome_tuple(py, o),
            Err(e) => Err(own.unwrap_or_else(|| outer.with_cause(py, err(&e), &e))),
        }) as Finish
    })
}

fn finish_err(e: Error) -> Finish {
    Box::new(move |_py: Python<'_>| Err(err(&e)))
}

/// The engine error for an exception out of a durable function: the error a
/// context call raised, when that is what propagated (a gate's suspension, a
/// changed workflow, a failed step); otherwise the function's own exception,
/// kept to be raised to the caller unchanged.
fn body_error(raised: &Arc<Mutex<Raised>>, run_id: &str, e: CallError) -> Error {
    let own = |reason: String| Error::InvalidInput {
        what: "the durable function".into(),
        reason,
    };
    match e {
        CallError::Raised(pyerr) => {
            // The GIL before the lock, as everywhere else; counted for
            // `drain` (a runtime thread in Python).
            let _inside = crate::pending::InPython::enter();
            let tagged = Python::attach(|py| {
                pyerr
                    .value(py)
                    .getattr("_steadfast_error")
                    .and_then(|v| v.extract::<u64>())
                    .ok()
            });
            let mut r = raised.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(engine) = tagged.and_then(|id| r.errors.remove(&id)) {
                return engine;
            }
            r.own = Some(pyerr);
            own("it raised an exception".into())
        }
        CallError::Value(u) => Error::InvalidValue {
            run_id: run_id.to_string(),
            index: 0,
            step: "__result".into(),
            path: crate::convert::shorten(&u.path),
            reason: format!("the durable function's return value: {}", u.reason),
        },
        CallError::Thread(why) => own(why),
    }
}
