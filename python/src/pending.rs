//! Handing results from the engine's threads to Python without those threads
//! touching the interpreter at the end.
//!
//! A Rust future runs on the runtime; a Python thread (from the package's
//! waiter pool, so one the interpreter knows and joins at exit) blocks in
//! [`Pending::wait`] with the GIL released and turns the result into Python
//! objects itself. A runtime thread that delivered a result into an asyncio
//! loop would have to take the GIL again after the loop saw it, and an
//! interpreter shutting down in between kills such a thread mid-call.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// What a finished future leaves: a conversion to run under the GIL.
pub type Finish = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// The runtime every store and run uses: a store's connections live on it.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("steadfast-rt")
            // Step functions (Python code) run on these threads: give them
            // the stack a Python main thread has, not a runtime's 2 MiB.
            .thread_stack_size(8 << 20)
            .build()
            .expect("the async runtime starts")
    })
}

/// Calls into Python from the runtime's threads that have not returned yet.
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// Counts a runtime thread's stay in Python, for [`drain`].
pub struct InPython;

impl InPython {
    /// Marks the start of a call into Python.
    pub fn enter() -> Self {
        IN_PYTHON.fetch_add(1, Ordering::SeqCst);
        InPython
    }
}

impl Drop for InPython {
    fn drop(&mut self) {
        IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits for runtime threads still running Python code (a sync step
/// abandoned after its timeout) to return, so that the interpreter does not
/// shut down under them; after `warn_after` seconds it says on stderr what it
/// waits for. Registered with `atexit` by the package: like a thread that is
/// not a daemon, an abandoned step keeps the process until it returns.
#[pyfunction]
pub fn drain(py: Python<'_>, warn_after: f64) {
    let warn = Duration::try_from_secs_f64(warn_after).unwrap_or(Duration::ZERO);
    let start = Instant::now();
    let mut warned = false;
    py.detach(|| loop {
        let n = IN_PYTHON.load(Ordering::SeqCst);
        if n == 0 {
            return;
        }
        if !warned && start.elapsed() >= warn {
            eprintln!("steadfast: waiting for {n} step function(s) abandoned after their timeout to return before exiting");
            warned = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    })
}

/// A result being computed by the engine; `wait()` it from a Python thread.
#[pyclass(frozen, module = "steadfast._native")]
pub struct Pending {
    rx: Mutex<Option<mpsc::Receiver<Finish>>>,
    abort: tokio::task::AbortHandle,
}

/// Starts `fut` on the runtime.
pub fn spawn<F>(fut: F) -> Pending
where
    F: Future<Output = Finish> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = rt().spawn(async move {
        let _ = tx.send(fut.await);
    });
    Pending {
        rx: Mutex::new(Some(rx)),
        abort: handle.abort_handle(),
    }
}

impl Pending {
    /// A handle that stops the operation.
    pub fn abort_handle(&self) -> tokio::task::AbortHandle {
        self.abort.clone()
    }
}

#[pymethods]
impl Pending {
    /// Blocks (GIL released) until the result is there and returns it, or
    /// raises what it raised. Only the first call waits.
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rx = self
            .rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("this result was already taken")
            })?;
        match py.detach(move || rx.recv()) {
            Ok(finish) => finish(py),
            Err(_) => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the operation was cancelled before it finished",
            )),
        }
    }

    /// Stops the operation at its next await point (when the coroutine that
    /// awaited it was cancelled).
    fn cancel(&self) {
        self.abort.abort();
    }
}
