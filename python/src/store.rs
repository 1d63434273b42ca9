//! Stores opened from URLs, and the module-level commands that take a store
//! first as the CLI's do: approve, reject, show, runs, history, start.

use std::sync::Arc;

use pyo3::prelude::*;
use serde_json::Value;
use steadfast::{ListFilter, RunStatus, Store, SystemClock};

use crate::convert::{serde_to_py, to_json, to_py};
use crate::errors::{err, store_err, InvalidInput};
use crate::pending::rt;
use steadfast::StoreExt as _;

/// Runs `fut` to its end on the runtime with the GIL released.
pub fn block<F: std::future::Future + Send>(py: Python<'_>, fut: F) -> F::Output
where
    F::Output: Send,
{
    py.detach(|| rt().block_on(fut))
}

/// A store, opened from a URL by `open_store`.
#[pyclass(frozen, module = "steadfast._native", name = "Store")]
pub struct PyStore {
    pub(crate) inner: Arc<dyn Store>,
    url: String,
}

#[pymethods]
impl PyStore {
    /// The URL the store was opened from, with any password hidden.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    fn __repr__(&self) -> String {
        format!("<steadfast.Store {}>", self.url)
    }
}

/// The kinds of store this build opens, from the library's one list:
/// `[{"name", "schemes", "url", "summary"}]`.
#[pyfunction]
pub fn backends(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let list: Vec<Value> = steadfast::BACKENDS
        .iter()
        .map(|b| {
            serde_json::json!({
                "name": b.name, "schemes": b.schemes, "url": b.url, "summary": b.summary,
            })
        })
        .collect();
    to_py(py, &Value::Array(list))
}

/// Opens (creating when missing) the store a URL names.
#[pyfunction]
pub fn open_store(py: Python<'_>, url: &str) -> PyResult<PyStore> {
    let owned = url.to_string();
    let inner =
        block(py, async move { steadfast::open_store(&owned).await }).map_err(|e| store_err(&e))?;
    Ok(PyStore {
        inner,
        url: steadfast::store::redact_url(url),
    })
}

/// Converts a Python value to JSON, or an InvalidInput naming `what`.
pub fn json_arg(what: &str, v: &Bound<'_, PyAny>) -> PyResult<Value> {
    to_json(v)
        .map_err(|reason| InvalidInput::new_err(format!("{what}: {reason}; nothing was written")))
}

/// An optional value as JSON (`None` and Python's None are no value).
fn opt_json_arg(what: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Value>> {
    v.filter(|d| !d.is_none())
        .map(|d| json_arg(what, d))
        .transpose()
}

/// Who decides or sends: the name given, else the login name.
fn decider(by: Option<&str>) -> String {
    by.map_or_else(steadfast::default_decider, String::from)
}

/// Records an approval of gate `gate` of waiting run `run_id`, as
/// `steadfast approve` does.
#[pyfunction]
#[pyo3(signature = (store, run_id, gate, data=None, by=None))]
pub fn approve(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    gate: &str,
    data: Option<&Bound<'_, PyAny>>,
    by: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let data = opt_json_arg(&format!("the data approving gate {gate:?}"), data)?;
    let by = decider(by);
    let s = Arc::clone(&store.inner);
    let (run_id, gate) = (run_id.to_string(), gate.to_string());
    let cp = block(py, async move {
        steadfast::approve(&*s, &run_id, &gate, data, &by, &SystemClock).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &cp)
}

/// The id of the child run that step `step` of run `parent` starts.
#[pyfunction]
pub fn child_id(parent: &str, step: &str) -> String {
    steadfast::child_id(parent, step)
}

/// Sends signal `name` to run `run_id`, as `steadfast signal` does; returns
/// its number in the run's event log.
#[pyfunction]
#[pyo3(signature = (store, run_id, name, data=None, by=None))]
pub fn signal(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    name: &str,
    data: Option<&Bound<'_, PyAny>>,
    by: Option<&str>,
) -> PyResult<u64> {
    let data = opt_json_arg(&format!("the data of signal {name:?}"), data)?;
    let by = decider(by);
    let s = Arc::clone(&store.inner);
    let (run_id, name) = (run_id.to_string(), name.to_string());
    block(py, async move {
        steadfast::signal(&*s, &run_id, &name, data, &by, &SystemClock).await
    })
    .map_err(|e| err(&e))
}

/// Rejects gate `gate` of waiting run `run_id`: the run ends as rejected.
#[pyfunction]
#[pyo3(signature = (store, run_id, gate, reason=None, by=None))]
pub fn reject(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    gate: &str,
    reason: Option<String>,
    by: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let by = decider(by);
    let s = Arc::clone(&store.inner);
    let (run_id, gate) = (run_id.to_string(), gate.to_string());
    let cp = block(py, async move {
        steadfast::reject(&*s, &run_id, &gate, reason, &by, &SystemClock).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &cp)
}

/// `value` as Python values; NoSuchRun naming `run_id` when it is `None`.
fn found<T: serde::Serialize>(
    py: Python<'_>,
    run_id: &str,
    value: Option<T>,
) -> PyResult<Py<PyAny>> {
    match value {
        Some(v) => serde_to_py(py, &v),
        None => Err(err(&steadfast::Error::NoSuchRun {
            run_id: run_id.to_string(),
        })),
    }
}

/// The run's record (its checkpoint) as a dict; NoSuchRun when missing.
#[pyfunction]
pub fn show(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Py<PyAny>> {
    steadfast::validate_run_id(run_id).map_err(|e| err(&e))?;
    let s = Arc::clone(&store.inner);
    let id = run_id.to_string();
    let cp = block(py, async move { s.load(&id).await }).map_err(|e| store_err(&e))?;
    found(py, run_id, cp)
}

/// The run's step records, oldest first; NoSuchRun when missing.
#[pyfunction]
pub fn history(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Py<PyAny>> {
    steadfast::validate_run_id(run_id).map_err(|e| err(&e))?;
    let s = Arc::clone(&store.inner);
    let id = run_id.to_string();
    let rows = block(py, async move { s.history(&id).await }).map_err(|e| store_err(&e))?;
    found(py, run_id, rows)
}

/// What resuming `run_id` with the workflow of `name` and `steps` would do
/// (`steadfast plan`), as a dict; nothing is written or run.
#[pyfunction]
#[pyo3(signature = (store, run_id, name, steps, version=None))]
pub fn plan(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    name: &str,
    steps: Vec<crate::run::StepSpec>,
    version: Option<String>,
) -> PyResult<Py<PyAny>> {
    let (s, id, wf) = listed_run(py, store, run_id, name, version, steps)?;
    let p = block(py, async move {
        steadfast::ops::plan::plan(&*s, &id, &wf).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &p)
}

/// The store, the checked run id and the workflow (never run) that
/// [`plan`] and [`migrate`] work on.
fn listed_run(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    name: &str,
    version: Option<String>,
    steps: Vec<crate::run::StepSpec>,
) -> PyResult<(Arc<dyn Store>, String, steadfast::Workflow)> {
    steadfast::validate_run_id(run_id).map_err(|e| err(&e))?;
    let wf = crate::run::build_unrun(py, name, version, steps)?;
    Ok((Arc::clone(&store.inner), run_id.to_string(), wf))
}

/// Moves `run_id` to the workflow of `name` and `steps` (`steadfast
/// migrate`): the plan after the move, as a dict.
#[pyfunction]
#[pyo3(signature = (store, run_id, name, steps, renames, by=None, version=None))]
#[allow(clippy::too_many_arguments)]
pub fn migrate(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    name: &str,
    steps: Vec<crate::run::StepSpec>,
    renames: Vec<(String, String)>,
    by: Option<String>,
    version: Option<String>,
) -> PyResult<Py<PyAny>> {
    let (s, id, wf) = listed_run(py, store, run_id, name, version, steps)?;
    let by = by.unwrap_or_else(steadfast::default_decider);
    let (_, p) = block(py, async move {
        steadfast::ops::plan::migrate(&*s, &id, &wf, &renames, &by, &SystemClock).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &p)
}

/// Runs in id order, filtered like `steadfast runs` (`version`: only runs
/// started under that version of their workflow).
#[pyfunction]
#[pyo3(signature = (store, status=None, workflow=None, after=None, limit=None, version=None))]
pub fn runs(
    py: Python<'_>,
    store: &PyStore,
    status: Option<&str>,
    workflow: Option<String>,
    after: Option<String>,
    limit: Option<i64>,
    version: Option<String>,
) -> PyResult<Py<PyAny>> {
    if let Some(v) = &version {
        steadfast::version::check_version("version", v)
            .map_err(|r| InvalidInput::new_err(format!("runs: {r}")))?;
    }
    let limit = limit
        .map(|n| {
            usize::try_from(n)
                .map_err(|_| InvalidInput::new_err(format!("limit={n}: expected 0 or more")))
        })
        .transpose()?;
    let mut filter = ListFilter::new();
    if let Some(st) = status {
        let parsed: RunStatus = st.parse().map_err(|_: String| {
            InvalidInput::new_err(format!(
                "status {st:?}: expected one of pending, running, waiting, sleeping, completed, failed, rejected, cancelled"
            ))
        })?;
        filter = filter.status(parsed);
    }
    if let Some(w) = workflow {
        filter = filter.workflow(w);
    }
    if let Some(a) = after {
        filter = filter.after(a);
    }
    // The version is picked out here: the limit counts those.
    if let Some(n) = limit.filter(|_| version.is_none()) {
        filter = filter.limit(n);
    }
    let s = Arc::clone(&store.inner);
    let mut rows = block(py, async move { s.list(&filter).await }).map_err(|e| store_err(&e))?;
    if let Some(v) = &version {
        rows.retain(|r| r.workflow_version.as_deref() == Some(v.as_str()));
        if let Some(n) = limit {
            rows.truncate(n);
        }
    }
    serde_to_py(py, &rows)
}

/// Records a new run of `workflow` with `input` (a dict) for a worker or a
/// later `run` to take; False when the run already exists as started the
/// same way (InvalidInput when it was started with another workflow, other
/// steps or another input). `steps`, a listed workflow's step names, are
/// recorded so that a run with other steps is refused as changed code.
#[pyfunction]
#[pyo3(signature = (store, workflow, run_id, input=None, durable=false, steps=None, priority=0, partition=None, version=None))]
#[allow(clippy::too_many_arguments)]
pub fn start(
    py: Python<'_>,
    store: &PyStore,
    workflow: &str,
    run_id: &str,
    input: Option<&Bound<'_, PyAny>>,
    durable: bool,
    steps: Option<Vec<String>>,
    priority: i32,
    partition: Option<String>,
    version: Option<String>,
) -> PyResult<bool> {
    let input = match input {
        Some(v) => json_arg("the run's input", v)?,
        None => Value::Object(Default::default()),
    };
    let mut options = steadfast::StartOptions::new().priority(priority);
    if durable {
        options = options.durable();
    }
    options.version = version.filter(|_| steps.is_some());
    options.steps = steps;
    if let Some(p) = partition {
        options = options.partition(p);
    }
    let s = Arc::clone(&store.inner);
    let (w, id) = (workflow.to_string(), run_id.to_string());
    block(py, async move {
        steadfast::start_with(&*s, &w, &id, input, &options).await
    })
    .map_err(|e| err(&e))
}

/// Adds a schedule, as `steadfast schedule add` does: workers with
/// `workflow` start one run per slot of `cron` read in time zone `tz`.
#[pyfunction]
#[pyo3(signature = (store, name, workflow, cron, tz="UTC", input=None, catch_up=steadfast::DEFAULT_CATCH_UP))]
#[allow(clippy::too_many_arguments)]
pub fn add_schedule(
    py: Python<'_>,
    store: &PyStore,
    name: &str,
    workflow: &str,
    cron: &str,
    tz: &str,
    input: Option<&Bound<'_, PyAny>>,
    catch_up: u32,
) -> PyResult<Py<PyAny>> {
    let input =
        opt_json_arg(&format!("the input of schedule {name:?}"), input)?.unwrap_or(Value::Null);
    let schedule = steadfast::CronSchedule::new(name, workflow, cron, tz)
        .map_err(|r| InvalidInput::new_err(format!("schedule {name:?}: {r}; nothing was written")))?
        .input(input)
        .catch_up(catch_up);
    let s = Arc::clone(&store.inner);
    let entry = block(py, async move {
        // The store's clock, which workers judge slots by.
        let clock = s.clock().unwrap_or_else(|| Arc::new(SystemClock));
        steadfast::schedule_ops::add_schedule(&*s, schedule, &*clock).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &entry)
}

/// The store's schedules, as `steadfast schedule list --json` prints them.
#[pyfunction]
pub fn schedules(py: Python<'_>, store: &PyStore) -> PyResult<Py<PyAny>> {
    let s = Arc::clone(&store.inner);
    let all = block(py, async move {
        steadfast::schedule_ops::list_schedules(&*s).await
    })
    .map_err(|e| err(&e))?;
    serde_to_py(py, &all)
}

/// Removes schedule `name`; False when there is none.
#[pyfunction]
pub fn remove_schedule(py: Python<'_>, store: &PyStore, name: &str) -> PyResult<bool> {
    let s = Arc::clone(&store.inner);
    let name = name.to_string();
    block(py, async move {
        steadfast::schedule_ops::remove_schedule(&*s, &name).await
    })
    .map_err(|e| err(&e))
}
