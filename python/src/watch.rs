//! Watching a run from Python: an async iterator over what
//! `steadfast watch` prints, one dict per item.

use std::sync::Arc;

use pyo3::prelude::*;
use steadfast::watch::Watch;

use crate::convert::to_py;
use crate::errors::err;
use crate::pending::{spawn, Finish, Pending};
use crate::store::PyStore;

/// A watch of one run; `next()` gives the next item (a dict), or None once
/// the run has ended or stopped.
#[pyclass(frozen, module = "steadfast._native", name = "Watch")]
pub struct PyWatch {
    inner: Arc<tokio::sync::Mutex<Watch<'static>>>,
}

/// Watches run `run_id` from the event after `after`, looking every `poll`
/// seconds.
#[pyfunction]
#[pyo3(signature = (store, run_id, after=0, poll=0.05))]
pub fn watch(store: &PyStore, run_id: &str, after: u64, poll: f64) -> PyResult<PyWatch> {
    steadfast::validate_run_id(run_id).map_err(|e| err(&e))?;
    let poll = crate::run::secs("poll", poll)?;
    let w = Watch::shared(Arc::clone(&store.inner), run_id)
        .after(after)
        .poll_every(poll)
        .map_err(|e| err(&e))?;
    Ok(PyWatch {
        inner: Arc::new(tokio::sync::Mutex::new(w)),
    })
}

#[pymethods]
impl PyWatch {
    /// The next item, as a dict with a `kind`; None at the end.
    fn next(&self) -> Pending {
        let w = Arc::clone(&self.inner);
        spawn(async move {
            let out = w.lock().await.next().await;
            Box::new(move |py: Python<'_>| match out {
                Ok(Some(item)) => {
                    let value = serde_json::to_value(&item).map_err(|e| {
                        pyo3::exceptions::PyRuntimeError::new_err(format!(
                            "a watch item did not convert: {e}"
                        ))
                    })?;
                    to_py(py, &value)
                }
                Ok(None) => Ok(py.None()),
                Err(e) => Err(err(&e)),
            }) as Finish
        })
    }
}
