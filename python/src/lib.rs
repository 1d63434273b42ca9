//! The native part of the `steadfast` Python package: the Rust engine, its
//! stores and a LangGraph checkpoint store, exposed to the pure-Python layer
//! in `steadfast/`, which is the documented API.

mod baseline;
mod call;
mod convert;
mod errors;
mod graph;
mod pending;
mod run;
mod store;
mod watch;

use pyo3::prelude::*;

/// The native module `steadfast._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<run::PyStepCtx>()?;
    m.add_class::<run::PyDurableCtx>()?;
    m.add_class::<graph::GraphStore>()?;
    m.add_class::<graph::ChainStore>()?;
    m.add_class::<pending::Pending>()?;
    m.add_class::<pending::Notifier>()?;
    m.add_class::<watch::PyWatch>()?;
    m.add_function(wrap_pyfunction!(watch::watch, m)?)?;
    m.add_function(wrap_pyfunction!(pending::drain, m)?)?;
    m.add_function(wrap_pyfunction!(store::open_store, m)?)?;
    m.add_function(wrap_pyfunction!(store::approve, m)?)?;
    m.add_function(wrap_pyfunction!(store::signal, m)?)?;
    m.add_function(wrap_pyfunction!(store::child_id, m)?)?;
    m.add_function(wrap_pyfunction!(store::reject, m)?)?;
    m.add_function(wrap_pyfunction!(store::show, m)?)?;
    m.add_function(wrap_pyfunction!(store::history, m)?)?;
    m.add_function(wrap_pyfunction!(store::plan, m)?)?;
    m.add_function(wrap_pyfunction!(store::migrate, m)?)?;
    m.add_function(wrap_pyfunction!(store::runs, m)?)?;
    m.add_function(wrap_pyfunction!(store::start, m)?)?;
    m.add_function(wrap_pyfunction!(store::add_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(store::schedules, m)?)?;
    m.add_function(wrap_pyfunction!(store::remove_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(run::run_workflow, m)?)?;
    m.add_function(wrap_pyfunction!(run::run_durable, m)?)?;
    m.add_function(wrap_pyfunction!(run::run_durable_sync, m)?)?;
    m.add_function(wrap_pyfunction!(store::backends, m)?)?;
    m.add_function(wrap_pyfunction!(baseline::ten_steps_in_rust, m)?)?;
    m.add("DEFAULT_STORE_URL", steadfast::DEFAULT_STORE_URL)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
