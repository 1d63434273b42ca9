//! The benchmark's yardstick: the durable function that
//! `python/bench/test_step_cost.py` writes in Python, written in Rust and run
//! by this module's runtime, so that both are measured in one process, on
//! one store, in the same minutes.

use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::err;
use crate::pending::rt;
use crate::store::PyStore;

/// The steps of each run: `s0` to `s9`, step `s<i>` returning `i`.
const STEPS: usize = 10;

/// The most runs one call makes.
const MAX_RUNS: usize = 1_000_000;

/// Runs `runs` runs, `{prefix}-0` onwards, of a durable function named `w`
/// whose ten steps each return their number, written in Rust, one run after
/// another on a worker of the runtime (as the benchmark harness runs W1 as
/// a durable function); returns the seconds they took. A run that does not
/// complete is an error naming it.
#[pyfunction]
#[pyo3(name = "_ten_steps_in_rust")]
pub fn ten_steps_in_rust(
    py: Python<'_>,
    store: &PyStore,
    prefix: String,
    runs: usize,
) -> PyResult<f64> {
    if !(1..=MAX_RUNS).contains(&runs) {
        return Err(PyValueError::new_err(format!(
            "runs is {runs}; it must lie in 1..={MAX_RUNS}"
        )));
    }
    let store = store.inner.clone();
    let work = async move {
        let start = Instant::now();
        for r in 0..runs {
            let run_id = format!("{prefix}-{r}");
            steadfast::durable(&run_id, &store, "w", |ctx| async move {
                for i in 0..STEPS {
                    ctx.step(format!("s{i}"), || async move {
                        Ok::<_, steadfast::StepError>(i)
                    })
                    .await?;
                }
                Ok(())
            })
            .await
            .map_err(|e| (run_id, e))?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let joined = crate::store::block(py, rt().spawn(work));
    match joined {
        Ok(Ok(secs)) => Ok(secs),
        Ok(Err((run_id, e))) => {
            let e = err(&e);
            let note = format!("run {run_id:?} of the Rust yardstick");
            let _ = e.value(py).call_method1("add_note", (note,));
            Err(e)
        }
        Err(e) => Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
            "the Rust yardstick's task ended without an answer: {e}"
        ))),
    }
}
