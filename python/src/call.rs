//! Calling Python step functions from the engine: sync functions on a blocking
//! thread, coroutines on the caller's asyncio loop, cancelled when the engine
//! gives up on them (a timeout).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use serde_json::Value;
use steadfast::StepError;

use crate::convert::to_json;

/// What the engine needs to call into Python: the running asyncio loop and
/// the package's `_invoke(loop, step, fn, *args)` helper, which calls `fn`
/// (with `step` the current step, or None) and, when
/// it returns an awaitable, schedules it on the loop and hands back a
/// future of it (a `concurrent.futures.Future`, or on the loop's own thread
/// a task's wrapper) with `add_done_callback` and a `cancel` that any
/// thread may call.
#[derive(Clone)]
pub struct Caller {
    pub event_loop: Arc<Py<PyAny>>,
    pub invoke: Arc<Py<PyAny>>,
    /// The last exception each step raised, by step name: the cause of the
    /// `StepFailed` that ends its attempts.
    pub causes: Arc<std::sync::Mutex<std::collections::HashMap<String, PyErr>>>,
}

impl Caller {
    /// A caller on `event_loop` through `invoke`.
    pub fn new(event_loop: Py<PyAny>, invoke: Py<PyAny>) -> Self {
        Caller {
            event_loop: Arc::new(event_loop),
            invoke: Arc::new(invoke),
            causes: Arc::default(),
        }
    }

    /// Sets the Python exception a failed step raised as the `__cause__`
    /// of `err`, the exception for the engine's `error`.
    pub fn with_cause(&self, py: Python<'_>, err: PyErr, error: &steadfast::Error) -> PyErr {
        if let steadfast::Error::StepFailed { step, .. } = error {
            // Kept, not taken: the same failure may be raised again when it
            // propagates out of a durable function.
            let cause = self
                .causes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(step)
                .map(|c| c.clone_ref(py));
            if let Some(cause) = cause {
                err.set_cause(py, Some(cause));
            }
        }
        err
    }
}

/// Cancels a scheduled coroutine when the step's future is dropped before it
/// finished (the engine's timeout, or the run being abandoned).
struct CancelOnDrop(Arc<Mutex<Option<Py<PyAny>>>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(fut) = pending {
            let _inside = crate::pending::InPython::enter();
            Python::attach(|py| {
                let _ = fut.bind(py).call_method0("cancel");
            });
        }
    }
}

/// A Python exception raised by a step, as a step error: terminal when it is
/// a `steadfast.TerminalError`, retryable otherwise. The message is the
/// exception's type and text.
///
/// A retryable exception with a `retry_after` attribute holding a finite
/// number of seconds from 0 (a provider's HTTP 429 `Retry-After`) becomes
/// [`StepError::retry_after`]: the next attempt, and every step holding the
/// same shared limit, waits that long (at most a day). Any other value of the
/// attribute (a bool, NaN, a negative number, a string) is ignored.
pub fn step_error(py: Python<'_>, e: PyErr) -> StepError {
    let terminal = py
        .import("steadfast._errors")
        .and_then(|m| m.getattr("TerminalError"))
        .map(|t| e.is_instance(py, &t))
        .unwrap_or(false);
    let name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    let msg = if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    };
    if terminal {
        return StepError::terminal(msg);
    }
    match retry_after(py, &e) {
        Some(after) => StepError::retry_after(msg, after),
        None => StepError::retryable(msg),
    }
}

/// The exception's `retry_after` attribute as a duration, when it is a
/// finite number of seconds from 0 (not a bool); capped at a day.
fn retry_after(py: Python<'_>, e: &PyErr) -> Option<std::time::Duration> {
    let value = e.value(py);
    let attr = value.getattr("retry_after").ok()?;
    if attr.is_instance_of::<pyo3::types::PyBool>() {
        return None;
    }
    let secs: f64 = attr.extract().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // Cut before the conversion, which panics on a value past its range.
    Some(std::time::Duration::from_secs_f64(
        secs.min(steadfast::MAX_RETRY_AFTER.as_secs_f64()),
    ))
}

/// Why a call into Python gave no value.
pub enum CallError {
    /// The function raised.
    Raised(PyErr),
    /// Its value is not JSON that can be stored.
    Value(crate::convert::Unstorable),
    /// The thread that called it stopped.
    Thread(String),
}

impl Caller {
    /// Calls `f` with the arguments `args` makes, waits for its value (on the
    /// loop if it is a coroutine) and converts it to JSON; a Python exception
    /// becomes a step error (see [`step_error`]).
    pub async fn call<A>(&self, step: &str, f: Arc<Py<PyAny>>, args: A) -> Result<Value, StepError>
    where
        A: for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Py<PyAny>>> + Send + 'static,
    {
        self.call_raw(f, args).await.map_err(|e| match e {
            CallError::Raised(e) => {
                // Counted for `drain`: a runtime thread in Python.
                let _inside = crate::pending::InPython::enter();
                Python::attach(|py| {
                    let out = step_error(py, e.clone_ref(py));
                    self.causes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(step.to_string(), e);
                    out
                })
            }
            CallError::Value(u) => {
                StepError::invalid_value(crate::convert::shorten(&u.path), u.reason)
            }
            CallError::Thread(why) => StepError::retryable(why),
        })
    }

    /// Like [`call`](Self::call), keeping the Python exception as it is.
    ///
    /// A sync function runs on a blocking thread. An async one only starts
    /// there: its coroutine runs on the loop, and its end, on the loop's
    /// thread, converts the value and wakes this call, so no thread waits
    /// for it.
    pub async fn call_raw<A>(&self, f: Arc<Py<PyAny>>, args: A) -> Result<Value, CallError>
    where
        A: for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Py<PyAny>>> + Send + 'static,
    {
        // The step being run, if this is a step's function: `_invoke` makes
        // it the current one while the function (or its coroutine) runs, for
        // `DurableContext.emit`.
        let current = steadfast::StepCtx::current();
        let slot = Arc::new(Mutex::new(None));
        let guard = CancelOnDrop(Arc::clone(&slot));
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<Value, CallError>>();
        let me = self.clone();
        // In an operation's first poll on a blocking thread, or on the
        // thread of a sync durable function, the function runs right here;
        // otherwise on a blocking thread of its own.
        let here = crate::pending::inline();
        // A runtime thread in Python is counted for `drain`; a sync durable
        // function's own thread is Python's, which the interpreter knows.
        let counted = !here.as_ref().is_some_and(|h| h.caller);
        let work = move || {
            let _inside = counted.then(crate::pending::InPython::enter);
            Python::attach(|py| -> Result<Option<Value>, CallError> {
                let raised = CallError::Raised;
                let step = match &current {
                    Some(ctx) => Py::new(py, crate::run::PyStepCtx::of(ctx))
                        .map_err(raised)?
                        .into_any(),
                    None => py.None(),
                };
                let mut all: Vec<Py<PyAny>> =
                    vec![me.event_loop.clone_ref(py), step, f.clone_ref(py)];
                all.extend(args(py).map_err(raised)?);
                let tuple = pyo3::types::PyTuple::new(py, all).map_err(raised)?;
                let got = me.invoke.bind(py).call1(tuple).map_err(raised)?;
                let (is_future, value): (bool, Bound<'_, PyAny>) = got.extract().map_err(raised)?;
                if !is_future {
                    return to_json(&value).map(Some).map_err(CallError::Value);
                }
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value.clone().unbind());
                let reply = Mutex::new(Some(tx));
                let running = Arc::clone(&slot);
                let done = pyo3::types::PyCFunction::new_closure(
                    py,
                    None,
                    None,
                    move |args: &Bound<'_, pyo3::types::PyTuple>,
                          _: Option<&Bound<'_, pyo3::types::PyDict>>|
                          -> PyResult<()> {
                        // Finished: nothing is left to cancel (and no
                        // runtime thread need take the GIL to try).
                        drop(running.lock().unwrap_or_else(|p| p.into_inner()).take());
                        let fut = args.get_item(0)?;
                        let out = match fut.call_method0("result") {
                            Ok(v) => to_json(&v).map_err(CallError::Value),
                            Err(e) => Err(CallError::Raised(e)),
                        };
                        if let Some(tx) = reply.lock().unwrap_or_else(|p| p.into_inner()).take() {
                            let _ = tx.send(out);
                        }
                        Ok(())
                    },
                )
                .map_err(raised)?;
                value
                    .call_method1("add_done_callback", (done,))
                    .map_err(raised)?;
                Ok(None)
            })
        };
        let called = match here {
            Some(here) => {
                let got = match work() {
                    Err(CallError::Raised(e))
                        if here.caller
                            && Python::attach(|py| {
                                e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
                                    || e.is_instance_of::<pyo3::exceptions::PySystemExit>(py)
                            }) =>
                    {
                        // Ctrl-C or `sys.exit()` on a sync durable
                        // function's thread: not the step's failure to
                        // record, but the end of the call, raised to it.
                        // The driving thread drops this operation.
                        here.stop.interrupt(e);
                        std::future::pending().await
                    }
                    got => got,
                };
                if here.stop.is_stopped() {
                    // Stopped while the function ran (its caller cancelled,
                    // or the durable function returned without awaiting
                    // it): neither its value nor its failure may go on to
                    // be recorded. The operation is dropped at its next
                    // await, this one (a coroutine it scheduled is
                    // cancelled then).
                    std::future::pending::<()>().await;
                }
                if here.on_loop && !matches!(got, Ok(None)) {
                    // A value or a failure at once, on the event loop's
                    // thread: recording it is a store write, for the
                    // runtime to make, not the loop.
                    tokio::task::yield_now().await;
                }
                Ok(got)
            }
            None => tokio::task::spawn_blocking(work).await,
        };
        let out = match called {
            Ok(Ok(Some(value))) => Ok(value),
            Ok(Ok(None)) => rx.await.unwrap_or_else(|_| {
                Err(CallError::Thread(
                    "the coroutine's result was lost before it was read".into(),
                ))
            }),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(CallError::Thread(format!("the step's thread stopped: {e}"))),
        };
        drop(guard);
        out
    }
}
