//! Listed workflows written in JavaScript: a list of named steps, each a
//! function of the state returning updates, and gates, timers, waits for a
//! signal and child runs between them.

use std::sync::Arc;

use napi::bindgen_prelude::FnArgs;
use serde::Deserialize;
use serde_json::Value;
use steadfast::{limits, OnTimeout, Step, StepError, Store, Workflow};

use crate::durable::{call_step, info_of, limit_of, outcome_text, RunOpts};
use crate::{engine_err, invalid, millis, JsCall};

/// The function that runs step `i` of a listed workflow on a state (JSON
/// text), given the step's information (JSON text).
pub type StepCall = JsCall<FnArgs<(u32, String, String)>>;

/// A listed workflow as the JavaScript `Workflow` describes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    name: String,
    version: Option<String>,
    steps: Vec<StepSpec>,
}

/// One step of it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StepSpec {
    kind: String,
    name: String,
    #[serde(flatten)]
    options: crate::durable::StepOpts,
    on_timeout: Option<String>,
    ms: Option<f64>,
    signal: Option<String>,
    workflow: Option<String>,
}

/// The workflow `spec` describes, its step number `i` calling `call(i, ..)`.
fn build(spec: Spec, call: &Arc<StepCall>) -> napi::Result<Workflow> {
    let mut b = Workflow::builder(&spec.name);
    if let Some(v) = spec.version {
        b = b.version(v);
    }
    for (i, s) in spec.steps.into_iter().enumerate() {
        let i = u32::try_from(i).map_err(|_| invalid("too many steps"))?;
        let name = s.name.clone();
        let what = |field: &str| format!("{} {name:?}: {field}", s.kind);
        let step = match s.kind.as_str() {
            "step" => {
                let call = Arc::clone(call);
                let mut step = Step::new(name.clone(), move |ctx, state| {
                    let call = Arc::clone(&call);
                    async move {
                        let info = info_of(&ctx);
                        let state = serde_json::to_string(&*state)
                            .map_err(|e| StepError::retryable(e.to_string()))?;
                        match call_step(&call, (i, state, info).into()).await? {
                            Value::Null => Ok(Default::default()),
                            Value::Object(m) => Ok(m),
                            _ => Err(StepError::invalid_value(
                                String::new(),
                                "a step returns an object of updates, or nothing".to_string(),
                            )),
                        }
                    }
                });
                if let Some(p) = s.options.policy(&name)? {
                    step = step.retry(p);
                }
                if let Some(t) = s.options.timeout_ms {
                    step = step.timeout(millis(&what("timeoutMs"), t, Some(limits::STEP_TIMEOUT))?);
                }
                if let Some(l) = &s.options.limit {
                    step = step.limit(limit_of(&name, l)?);
                }
                if let Some(v) = &s.options.version {
                    step = step.version(v.clone());
                }
                step
            }
            "gate" => {
                let mut step = Step::gate(name.clone());
                let on: OnTimeout = s
                    .on_timeout
                    .as_deref()
                    .map_or(Ok(OnTimeout::default()), str::parse)
                    .map_err(|e: String| invalid(format!("gate {name:?}: {e}")))?;
                if let Some(t) = s.options.timeout_ms {
                    step = step.gate_timeout(
                        millis(&what("timeoutMs"), t, Some(limits::GATE_TIMEOUT))?,
                        on,
                    );
                }
                step
            }
            "wait" => {
                let Some(signal) = s.signal.clone() else {
                    return Err(invalid(format!("wait {name:?} names no signal")));
                };
                let mut step = Step::wait_for(name.clone(), signal);
                if let Some(t) = s.options.timeout_ms {
                    step = step.signal_timeout(millis(
                        &what("timeoutMs"),
                        t,
                        Some(limits::GATE_TIMEOUT),
                    )?);
                }
                step
            }
            "child" => {
                let Some(workflow) = s.workflow.clone() else {
                    return Err(invalid(format!("child {name:?} names no workflow")));
                };
                let mut step = Step::child(name.clone(), workflow);
                if let Some(p) = s.options.policy(&name)? {
                    step = step.retry(p);
                }
                step
            }
            "sleep" => {
                let ms = s.ms.unwrap_or(-1.0);
                Step::sleep(name.clone(), millis(&what("ms"), ms, Some(limits::SLEEP))?)
            }
            other => return Err(invalid(format!("step {name:?}: unknown kind {other:?}"))),
        };
        b = b.push(step);
    }
    b.build().map_err(|e| engine_err(&e, None))
}

/// Starts or resumes run `run_id` of the listed workflow `spec`.
pub async fn run(
    store: Arc<dyn Store>,
    run_id: String,
    spec: &str,
    input: Option<Value>,
    opts: RunOpts,
    call: StepCall,
) -> napi::Result<String> {
    let spec: Spec =
        serde_json::from_str(spec).map_err(|e| invalid(format!("the workflow: {e}")))?;
    let wf = build(spec, &Arc::new(call))?;
    if let Some(input) = input {
        steadfast::start_if_new(&*store, &run_id, |s| {
            steadfast::start_listed(s, &wf, &run_id, input)
        })
        .await
        .map_err(|e| engine_err(&e, None))?;
    }
    let guard = steadfast::LeaseGuard::new(&store, &run_id, opts.leased());
    let out = opts.runner(&store)?.run(&run_id, &wf).await;
    guard.finish(&out).await;
    match out {
        Ok(o) => outcome_text(o.map(Value::Object)),
        Err(e) => Err(engine_err(&e, None)),
    }
}
