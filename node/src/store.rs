//! A store opened from a URL, and the operations the CLI has on runs:
//! approve, reject, signal, show, history, runs, start; and running durable
//! functions and listed workflows on it.

use std::sync::Arc;

use napi_derive::napi;
use serde_json::Value;
use steadfast::{ListFilter, RunStatus, Store, StoreExt as _, SystemClock};

use crate::{engine_err, invalid, parse, store_err, text, JsCall};

/// Opens (creating when missing) the store a URL names.
#[napi]
pub async fn open_store(url: String) -> napi::Result<NativeStore> {
    let inner = steadfast::open_store(&url)
        .await
        .map_err(|e| store_err(&e))?;
    Ok(NativeStore {
        inner,
        url: steadfast::store::redact_url(&url),
    })
}

/// The kinds of store this build opens, as JSON text:
/// `[{"name", "schemes", "url", "summary"}]`.
#[napi]
pub fn backends() -> napi::Result<String> {
    let list: Vec<Value> = steadfast::BACKENDS
        .iter()
        .map(|b| {
            serde_json::json!({
                "name": b.name, "schemes": b.schemes, "url": b.url, "summary": b.summary,
            })
        })
        .collect();
    text(&list)
}

/// A store, opened from a URL by `openStore`.
#[napi(js_name = "NativeStore")]
pub struct NativeStore {
    pub(crate) inner: Arc<dyn Store>,
    url: String,
}

/// Who decides or sends: the name given, else the login name.
fn decider(by: Option<String>) -> String {
    by.unwrap_or_else(steadfast::default_decider)
}

fn opt_json(what: &str, v: Option<String>) -> napi::Result<Option<Value>> {
    v.map(|t| parse(what, &t)).transpose()
}

fn check_run_id(run_id: &str) -> napi::Result<()> {
    steadfast::validate_run_id(run_id).map_err(|e| engine_err(&e, None))
}

fn found<T: serde::Serialize>(run_id: &str, v: Option<T>) -> napi::Result<String> {
    match v {
        Some(v) => text(&v),
        None => Err(engine_err(
            &steadfast::Error::NoSuchRun {
                run_id: run_id.to_string(),
            },
            None,
        )),
    }
}

/// Options of `runs`, as JSON from the JavaScript layer.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RunsFilter {
    status: Option<String>,
    workflow: Option<String>,
    after: Option<String>,
    limit: Option<u64>,
}

/// Options of `start`, as JSON from the JavaScript layer.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StartOpts {
    #[serde(default)]
    durable: bool,
    steps: Option<Vec<String>>,
    #[serde(default)]
    priority: i32,
    partition: Option<String>,
    version: Option<String>,
}

#[napi]
impl NativeStore {
    /// The URL the store was opened from, with any password hidden.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Records an approval of gate `gate` of waiting run `runId`; the run's
    /// record after it, as JSON text.
    #[napi]
    pub async fn approve(
        &self,
        run_id: String,
        gate: String,
        data: Option<String>,
        by: Option<String>,
    ) -> napi::Result<String> {
        let data = opt_json(&format!("the data approving gate {gate:?}"), data)?;
        let cp = steadfast::approve(
            &*self.inner,
            &run_id,
            &gate,
            data,
            &decider(by),
            &SystemClock,
        )
        .await
        .map_err(|e| engine_err(&e, None))?;
        text(&cp)
    }

    /// Rejects gate `gate` of waiting run `runId`: the run ends as rejected.
    #[napi]
    pub async fn reject(
        &self,
        run_id: String,
        gate: String,
        reason: Option<String>,
        by: Option<String>,
    ) -> napi::Result<String> {
        let cp = steadfast::reject(
            &*self.inner,
            &run_id,
            &gate,
            reason,
            &decider(by),
            &SystemClock,
        )
        .await
        .map_err(|e| engine_err(&e, None))?;
        text(&cp)
    }

    /// Sends signal `name` to run `runId`; its number in the run's event log.
    #[napi]
    pub async fn signal(
        &self,
        run_id: String,
        name: String,
        data: Option<String>,
        by: Option<String>,
    ) -> napi::Result<f64> {
        let data = opt_json(&format!("the data of signal {name:?}"), data)?;
        let n = steadfast::signal(
            &*self.inner,
            &run_id,
            &name,
            data,
            &decider(by),
            &SystemClock,
        )
        .await
        .map_err(|e| engine_err(&e, None))?;
        Ok(n as f64)
    }

    /// The run's record as JSON text; `NoSuchRun` when missing.
    #[napi]
    pub async fn show(&self, run_id: String) -> napi::Result<String> {
        check_run_id(&run_id)?;
        let cp = self.inner.load(&run_id).await.map_err(|e| store_err(&e))?;
        found(&run_id, cp)
    }

    /// The run's step records, oldest first, as JSON text.
    #[napi]
    pub async fn history(&self, run_id: String) -> napi::Result<String> {
        check_run_id(&run_id)?;
        let rows = self
            .inner
            .history(&run_id)
            .await
            .map_err(|e| store_err(&e))?;
        found(&run_id, rows)
    }

    /// Runs in id order, filtered as `steadfast runs` filters them.
    #[napi]
    pub async fn runs(&self, filter: String) -> napi::Result<String> {
        let f: RunsFilter =
            serde_json::from_str(&filter).map_err(|e| invalid(format!("runs: the filter: {e}")))?;
        let mut lf = ListFilter::new();
        if let Some(st) = &f.status {
            let parsed: RunStatus = st.parse().map_err(|_: String| {
                invalid(format!(
                    "runs: status {st:?}: expected one of pending, running, waiting, sleeping, completed, failed, rejected, cancelled"
                ))
            })?;
            lf = lf.status(parsed);
        }
        if let Some(w) = f.workflow {
            lf = lf.workflow(w);
        }
        if let Some(a) = f.after {
            lf = lf.after(a);
        }
        if let Some(n) = f.limit {
            let n =
                usize::try_from(n).map_err(|_| invalid(format!("runs: limit {n} is too large")))?;
            lf = lf.limit(n);
        }
        let rows = self.inner.list(&lf).await.map_err(|e| store_err(&e))?;
        text(&rows)
    }

    /// Records a new run of `workflow` with `input` for a worker or a later
    /// run to take; false when it is there already, started the same way.
    #[napi]
    pub async fn start(
        &self,
        workflow: String,
        run_id: String,
        input: Option<String>,
        options: String,
    ) -> napi::Result<bool> {
        let input = opt_json("the run's input", input)?
            .unwrap_or_else(|| Value::Object(Default::default()));
        let o: StartOpts = serde_json::from_str(&options)
            .map_err(|e| invalid(format!("start: the options: {e}")))?;
        let mut options = steadfast::StartOptions::new().priority(o.priority);
        if o.durable {
            options = options.durable();
        }
        options.version = o.version.filter(|_| o.steps.is_some());
        options.steps = o.steps;
        if let Some(p) = o.partition {
            options = options.partition(p);
        }
        steadfast::start_with(&*self.inner, &workflow, &run_id, input, &options)
            .await
            .map_err(|e| engine_err(&e, None))
    }

    /// Starts or resumes run `runId` of the durable function `name`; `body`
    /// is called with the number of the run's context and resolves to the
    /// function's result (see `durable.rs`). The outcome as JSON text.
    #[napi]
    pub async fn run_durable(
        &self,
        run_id: String,
        name: String,
        input: Option<String>,
        options: String,
        body: JsCall<u32>,
    ) -> napi::Result<String> {
        let input = opt_json("the run's input", input)?;
        let opts = crate::durable::RunOpts::parse(&options)?;
        crate::durable::run(Arc::clone(&self.inner), run_id, name, input, opts, body).await
    }

    /// Starts or resumes run `runId` of a listed workflow: `spec` is its
    /// steps as JSON, `call` runs step number `i` of it on a state. The
    /// outcome as JSON text.
    #[napi]
    pub async fn run_workflow(
        &self,
        run_id: String,
        spec: String,
        input: Option<String>,
        options: String,
        call: crate::workflow::StepCall,
    ) -> napi::Result<String> {
        let input = opt_json("the run's input", input)?;
        let opts = crate::durable::RunOpts::parse(&options)?;
        crate::workflow::run(Arc::clone(&self.inner), run_id, &spec, input, opts, call).await
    }
}
