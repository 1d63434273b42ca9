//! Durable functions written in JavaScript.
//!
//! A run's body is a JavaScript function called with a number, the handle of
//! the run's context in [`LIVE`]; the context's calls (`ctxStep`, `ctxGate`,
//! ...) name it. Every call is a task on the runtime, so that the calls the
//! function leaves unawaited when it returns can be stopped, as Python's are.
//! Engine errors a call rejects with are kept by number: when the function
//! lets one propagate, the run ends with that same error.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use napi::bindgen_prelude::FnArgs;
use napi_derive::napi;
use serde::Deserialize;
use serde_json::{json, Value};
use steadfast::{limits, DurableCtx, Error, OnTimeout, Outcome, RetryPolicy, Runner, StepError};
use steadfast::{StepOptions, Store, Suspension};

use crate::{engine_err, invalid, millis, text, JsCall};

/// Options of a run, as JSON from the JavaScript layer.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunOpts {
    #[serde(default)]
    accept_changed: bool,
    #[serde(default)]
    wait_for_timers: bool,
    /// The run's lease in milliseconds: another process running it meanwhile
    /// gets `Held`.
    lease_ms: Option<f64>,
    /// Budgets of a run that has none yet.
    budget: Option<std::collections::BTreeMap<String, f64>>,
}

impl RunOpts {
    /// The options in `text`, checked.
    pub fn parse(text: &str) -> napi::Result<Self> {
        let o: RunOpts =
            serde_json::from_str(text).map_err(|e| invalid(format!("the run's options: {e}")))?;
        if let Some(b) = &o.budget {
            steadfast::Spend::with_budget(b.clone())
                .check()
                .map_err(|r| invalid(format!("the budget: {r}")))?;
        }
        if let Some(ms) = o.lease_ms {
            millis("leaseMs", ms, Some(limits::LEASE))?;
        }
        Ok(o)
    }

    /// A runner on `store` with these options.
    pub fn runner<'s>(
        &self,
        store: &'s Arc<dyn Store>,
    ) -> napi::Result<Runner<'s, Arc<dyn Store>>> {
        let r = Runner::new(store)
            .accept_changed_workflow(self.accept_changed)
            .wait_for_timers(self.wait_for_timers);
        let r = match &self.budget {
            Some(b) => r.budget(b.clone()),
            None => r,
        };
        Ok(match self.lease_ms {
            Some(ms) => r.lease(
                steadfast::current_owner(),
                millis("leaseMs", ms, Some(limits::LEASE))?,
            ),
            None => r,
        })
    }

    /// Whether the run is leased.
    pub fn leased(&self) -> bool {
        self.lease_ms.is_some()
    }
}

/// What the context of one running durable function keeps.
struct Live {
    /// The durable function's name, for errors.
    workflow: String,
    ctx: DurableCtx<'static, Arc<dyn Store>>,
    state: Mutex<Raised>,
}

/// Engine errors raised to the function, by number; whether the run stopped
/// at a gate or timer; the calls still running.
#[derive(Default)]
struct Raised {
    next: u64,
    errors: HashMap<u64, Error>,
    /// Set when a gate or timer stopped the run: every later call stops too,
    /// and the run ends with this outcome whatever the function did after
    /// catching it.
    stopped: Option<Suspension>,
    /// Set when the function has returned: later calls are refused.
    closed: bool,
    running: HashMap<u64, tokio::task::AbortHandle>,
}

/// The contexts of the durable functions running in this process, by handle.
static LIVE: LazyLock<Mutex<HashMap<u32, Arc<Live>>>> = LazyLock::new(Default::default);
static NEXT: AtomicU32 = AtomicU32::new(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn live(handle: u32) -> napi::Result<Arc<Live>> {
    lock(&LIVE).get(&handle).cloned().ok_or_else(|| {
        engine_err(
            &Error::InvalidInput {
                what: "a context call".into(),
                reason: "the durable function has returned: its context takes no more calls".into(),
            },
            None,
        )
    })
}

impl Live {
    /// The rejection for `e`, kept under a number so that it maps back.
    fn raise(&self, e: Error) -> napi::Error {
        let mut r = lock(&self.state);
        r.next += 1;
        let id = r.next;
        let out = engine_err(&e, Some(id));
        r.errors.insert(id, e);
        out
    }

    /// Runs `op` on the context as a call of the function.
    async fn call<F, Fut>(self: Arc<Self>, op: F) -> napi::Result<Value>
    where
        F: FnOnce(DurableCtx<'static, Arc<dyn Store>>) -> Fut,
        Fut: Future<Output = Result<Value, Error>> + Send + 'static,
    {
        let (id, task) = {
            let mut r = lock(&self.state);
            if r.closed {
                drop(r);
                return Err(self.raise(Error::InvalidWorkflow {
                    workflow: self.workflow.clone(),
                    reason: "the durable function has returned: its context takes no more calls"
                        .into(),
                }));
            }
            if let Some(s) = r.stopped.clone() {
                drop(r);
                return Err(self.raise(Error::Suspended(s)));
            }
            if !r.running.is_empty() {
                // Two calls at once would be recorded in the order they
                // end, which a resume cannot reproduce.
                drop(r);
                return Err(self.raise(Error::InvalidWorkflow {
                    workflow: self.workflow.clone(),
                    reason: "another context call of this run is still running: await each call before making the next (a step's function makes none), and run steps at once with ctx.parallel".into(),
                }));
            }
            r.next += 1;
            let id = r.next;
            // Counted as running before it can finish.
            let task = tokio::spawn(op(self.ctx.clone()));
            r.running.insert(id, task.abort_handle());
            (id, task)
        };
        let out = task.await;
        {
            let mut r = lock(&self.state);
            r.running.remove(&id);
            if let Ok(Err(Error::Suspended(s))) = &out {
                r.stopped.get_or_insert_with(|| s.clone());
            }
        }
        match out {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.raise(e)),
            Err(_) => Err(self.raise(Error::InvalidWorkflow {
                workflow: self.workflow.clone(),
                reason: "the durable function returned before this call finished: it was stopped and nothing of it was recorded as complete; await every ctx call".into(),
            })),
        }
    }
}

/// Step options as JSON from the JavaScript layer; durations in
/// milliseconds.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StepOpts {
    pub retries: Option<i64>,
    pub backoff_ms: Option<f64>,
    pub max_backoff_ms: Option<f64>,
    pub timeout_ms: Option<f64>,
    pub limit: Option<String>,
    pub version: Option<String>,
}

impl StepOpts {
    /// The retry policy these options ask for, if any.
    pub fn policy(&self, name: &str) -> napi::Result<Option<RetryPolicy>> {
        if self.retries.is_none() && self.backoff_ms.is_none() && self.max_backoff_ms.is_none() {
            return Ok(None);
        }
        let ms = |what: &str, v: Option<f64>| {
            v.map(|v| millis(&format!("step {name:?}: {what}"), v, None))
                .transpose()
        };
        let (b, m) = (
            ms("backoffMs", self.backoff_ms)?,
            ms("maxBackoffMs", self.max_backoff_ms)?,
        );
        RetryPolicy::from_options(self.retries, b, m)
            .map(Some)
            .map_err(|e| invalid(format!("step {name:?}: {e}")))
    }

    /// The engine's options of step `name`.
    fn options(&self, name: &str) -> napi::Result<StepOptions> {
        let mut o = StepOptions::new();
        if let Some(v) = &self.version {
            o = o.version(v.clone());
        }
        if let Some(l) = &self.limit {
            o = o.limit(limit_of(name, l)?);
        }
        if let Some(p) = self.policy(name)? {
            o = o.retry(p);
        }
        if let Some(t) = self.timeout_ms {
            let what = format!("step {name:?}: timeoutMs");
            o = o.timeout(millis(&what, t, Some(limits::STEP_TIMEOUT))?);
        }
        Ok(o)
    }
}

/// A step's `limit: "KEY"` or `"KEY:N"`.
pub fn limit_of(name: &str, text: &str) -> napi::Result<steadfast::LimitSpec> {
    steadfast::LimitSpec::parse(text)
        .map_err(|e| invalid(format!("step {name:?}: limit {text:?}: {e}")))
}

/// What a step's JavaScript function came back with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
enum StepReply {
    #[serde(rename = "ok")]
    Ok(Value),
    #[serde(rename = "err")]
    Err {
        message: String,
        #[serde(default)]
        terminal: bool,
        #[serde(rename = "retryAfterMs")]
        retry_after_ms: Option<f64>,
    },
    #[serde(rename = "invalid")]
    Invalid { path: String, reason: String },
}

/// A step's information for its function, as JSON text.
pub fn info_of(c: &steadfast::StepCtx) -> String {
    json!({
        "runId": c.run_id(), "step": c.step(), "index": c.index(),
        "attempt": c.attempt(), "idempotencyKey": c.idempotency_key(),
    })
    .to_string()
}

/// The information of the step being run, as JSON text.
fn step_info() -> String {
    steadfast::StepCtx::current().map_or_else(|| "null".into(), |c| info_of(&c))
}

/// Calls a step's function through `f` and reads its reply: a value, a
/// thrown error (terminal, retryable, or retryable after a wait), or a value
/// that cannot be stored.
pub async fn call_step<A>(f: &JsCall<A>, arg: A) -> Result<Value, StepError>
where
    A: 'static + napi::bindgen_prelude::JsValuesTupleIntoVec,
{
    let promise = f.call_async_catch(arg).await.map_err(|e| {
        StepError::retryable(format!("the step's function could not be called: {e}"))
    })?;
    let reply = promise
        .await
        .map_err(|e| StepError::retryable(format!("the step's function failed: {e}")))?;
    match serde_json::from_str::<StepReply>(&reply) {
        Ok(StepReply::Ok(v)) => Ok(v),
        Ok(StepReply::Err {
            message,
            terminal,
            retry_after_ms,
        }) => {
            if terminal {
                return Err(StepError::terminal(message));
            }
            match retry_after_ms.filter(|ms| ms.is_finite() && *ms >= 0.0) {
                Some(ms) => Err(StepError::retry_after(
                    message,
                    std::time::Duration::from_secs_f64(
                        (ms / 1000.0).min(steadfast::MAX_RETRY_AFTER.as_secs_f64()),
                    ),
                )),
                None => Err(StepError::retryable(message)),
            }
        }
        Ok(StepReply::Invalid { path, reason }) => Err(StepError::invalid_value(path, reason)),
        Err(e) => Err(StepError::retryable(format!(
            "the step's reply could not be read: {e}"
        ))),
    }
}

/// Runs step `name` of the function whose context is `handle`; its value
/// (recorded, or `f`'s) as JSON text.
#[napi]
pub async fn ctx_step(
    handle: u32,
    name: String,
    options: String,
    f: JsCall<String>,
) -> napi::Result<String> {
    let o: StepOpts = serde_json::from_str(&options)
        .map_err(|e| invalid(format!("step {name:?}: the options: {e}")))?;
    let opts = o.options(&name)?;
    let f = Arc::new(f);
    let v = live(handle)?
        .call(move |ctx| async move {
            ctx.step_with(name, opts, move || {
                let f = Arc::clone(&f);
                async move { call_step(&f, step_info()).await }
            })
            .await
        })
        .await?;
    text(&v)
}

/// Runs the steps `names` at once; `f(i, info)` runs the function of the
/// `i`th. Their values in order, as JSON text.
#[napi]
pub async fn ctx_parallel(
    handle: u32,
    names: Vec<String>,
    f: JsCall<FnArgs<(u32, String)>>,
) -> napi::Result<String> {
    let count = u32::try_from(names.len()).map_err(|_| invalid("parallel: too many branches"))?;
    let f = Arc::new(f);
    let v = live(handle)?
        .call(move |ctx| async move {
            let branches = names.into_iter().zip(0..count).map(|(name, i)| {
                let f = Arc::clone(&f);
                (
                    name,
                    async move { call_step(&f, (i, step_info()).into()).await },
                )
            });
            ctx.parallel(branches).await.map(Value::Array)
        })
        .await?;
    text(&v)
}

/// Options of a gate or a wait, as JSON from the JavaScript layer.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GateOpts {
    timeout_ms: Option<f64>,
    on_timeout: Option<String>,
}

/// Stops the run at gate `name` until it is approved or rejected; the
/// approval's data as JSON text.
#[napi]
pub async fn ctx_gate(handle: u32, name: String, options: String) -> napi::Result<String> {
    let o: GateOpts = serde_json::from_str(&options)
        .map_err(|e| invalid(format!("gate {name:?}: the options: {e}")))?;
    let on: OnTimeout = o
        .on_timeout
        .as_deref()
        .map_or(Ok(OnTimeout::default()), str::parse)
        .map_err(|e: String| invalid(format!("gate {name:?}: {e}")))?;
    let timeout = o
        .timeout_ms
        .map(|t| {
            millis(
                &format!("gate {name:?}: timeoutMs"),
                t,
                Some(limits::GATE_TIMEOUT),
            )
        })
        .transpose()?;
    let v = live(handle)?
        .call(move |ctx| async move {
            let got = ctx.gate_with(&name, timeout, on).await?;
            Ok(got.unwrap_or(Value::Null))
        })
        .await?;
    text(&v)
}

/// Waits for signal `name`; the delivery, or null when `timeoutMs` passed
/// first, as JSON text.
#[napi]
pub async fn ctx_wait_for(
    handle: u32,
    name: String,
    timeout_ms: Option<f64>,
) -> napi::Result<String> {
    let timeout = timeout_ms
        .map(|t| {
            millis(
                &format!("wait {name:?}: timeoutMs"),
                t,
                Some(limits::GATE_TIMEOUT),
            )
        })
        .transpose()?;
    let v = live(handle)?
        .call(move |ctx| async move {
            let got = ctx.wait_for(&name, timeout).await?;
            serde_json::to_value(got).map_err(|e| Error::InvalidInput {
                what: format!("wait {name:?}"),
                reason: e.to_string(),
            })
        })
        .await?;
    text(&v)
}

/// A durable timer of `ms` milliseconds named `name`.
#[napi]
pub async fn ctx_sleep(handle: u32, name: String, ms: f64) -> napi::Result<()> {
    let d = millis(&format!("sleep {name:?}"), ms, Some(limits::SLEEP))?;
    live(handle)?
        .call(move |ctx| async move { ctx.sleep(&name, d).await.map(|()| Value::Null) })
        .await?;
    Ok(())
}

/// The recorded time of this point of the run, in milliseconds since 1970.
#[napi]
pub async fn ctx_now(handle: u32) -> napi::Result<f64> {
    let v = live(handle)?
        .call(|ctx| async move { ctx.now().await.map(|t| json!(t.unix_millis())) })
        .await?;
    Ok(v.as_f64().unwrap_or_default())
}

/// A recorded random number in [0, 1), from 53 random bits.
#[napi]
pub async fn ctx_random(handle: u32) -> napi::Result<f64> {
    let v = live(handle)?
        .call(|ctx| async move {
            ctx.random()
                .await
                .map(|n| json!((n >> 11) as f64 / (1u64 << 53) as f64))
        })
        .await?;
    Ok(v.as_f64().unwrap_or_default())
}

/// A recorded random UUID (version 4).
#[napi]
pub async fn ctx_uuid(handle: u32) -> napi::Result<String> {
    let v = live(handle)?
        .call(|ctx| async move { ctx.uuid().await.map(Value::String) })
        .await?;
    Ok(v.as_str().unwrap_or_default().to_string())
}

/// The run's input, as JSON text (`null` when it has none).
#[napi]
pub async fn ctx_input(handle: u32) -> napi::Result<String> {
    let ctx = live(handle)?.ctx.clone();
    text(&ctx.input().await.unwrap_or(Value::Null))
}

/// `base`, then `base#2`, `base#3`... for repeated names in one call.
#[napi]
pub fn ctx_numbered(handle: u32, base: String) -> napi::Result<String> {
    Ok(live(handle)?.ctx.numbered(&base))
}

/// What the function's body came back with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
enum BodyReply {
    /// Its return value.
    #[serde(rename = "ok")]
    Ok(Value),
    /// It threw the error a context call rejected with, this number.
    #[serde(rename = "engine")]
    Engine(u64),
    /// It threw an error of its own (kept by the JavaScript layer).
    #[serde(rename = "own")]
    Own(String),
    /// Its return value cannot be stored.
    #[serde(rename = "invalid")]
    Invalid { path: String, reason: String },
}

/// Starts or resumes run `run_id` of the durable function `name`.
pub async fn run(
    store: Arc<dyn Store>,
    run_id: String,
    name: String,
    input: Option<Value>,
    opts: RunOpts,
    body: JsCall<u32>,
) -> napi::Result<String> {
    if let Some(input) = input {
        steadfast::start_if_new(&*store, &run_id, |s| {
            steadfast::start(s, &name, &run_id, input, true)
        })
        .await
        .map_err(|e| engine_err(&e, None))?;
    }
    let guard = steadfast::LeaseGuard::new(&store, &run_id, opts.leased());
    let (wf, rid) = (name.clone(), run_id.clone());
    let out = opts
        .runner(&store)?
        .durable(&run_id, &name, move |ctx| async move {
            let live = Arc::new(Live {
                workflow: wf.clone(),
                ctx,
                state: Mutex::default(),
            });
            let handle = NEXT.fetch_add(1, Ordering::Relaxed);
            lock(&LIVE).insert(handle, Arc::clone(&live));
            let reply = match body.call_async_catch(handle).await {
                Ok(p) => p.await,
                Err(e) => Err(e),
            };
            lock(&LIVE).remove(&handle);
            let (stopped, unfinished) = {
                let mut r = lock(&live.state);
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
                    workflow: wf,
                    reason: format!(
                        "the function returned while {unfinished} context call(s) it made were still running; they were stopped and nothing was recorded as complete: await every ctx call"
                    ),
                });
            }
            let own = |reason: String| Error::InvalidInput {
                what: "the durable function".into(),
                reason,
            };
            let reply = reply.map_err(|e| own(format!("its body could not be called: {e}")))?;
            match serde_json::from_str::<BodyReply>(&reply) {
                Ok(BodyReply::Ok(v)) => Ok(v),
                Ok(BodyReply::Engine(id)) => Err(lock(&live.state)
                    .errors
                    .remove(&id)
                    .unwrap_or_else(|| own("it threw an error of an earlier run".into()))),
                Ok(BodyReply::Own(message)) => Err(own(format!("it threw: {message}"))),
                Ok(BodyReply::Invalid { path, reason }) => Err(Error::InvalidValue {
                    run_id: rid,
                    index: 0,
                    step: "__result".into(),
                    path,
                    reason: format!("the durable function's return value: {reason}"),
                }),
                Err(e) => Err(own(format!("its reply could not be read: {e}"))),
            }
        })
        .await;
    guard.finish(&out).await;
    match out {
        Ok(o) => outcome_text(o),
        Err(e) => Err(engine_err(&e, None)),
    }
}

/// An outcome as JSON text: `{status, value?, gate?, until?, reason?}`.
pub fn outcome_text(o: Outcome<Value>) -> napi::Result<String> {
    let v = match o {
        Outcome::Completed(v) => json!({ "status": "completed", "value": v }),
        Outcome::Waiting { gate } => json!({ "status": "waiting", "gate": gate }),
        Outcome::Sleeping { until } => {
            json!({ "status": "sleeping", "until": until.unix_millis() })
        }
        Outcome::Rejected { gate, reason } => {
            json!({ "status": "rejected", "gate": gate, "reason": reason })
        }
        other => {
            return Err(napi::Error::from_reason(format!(
                "an outcome this version does not know: {other:?}"
            )))
        }
    };
    text(&v)
}
