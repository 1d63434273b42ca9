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
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
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

/// Tells an asyncio loop that results are ready, without touching the
/// interpreter: a runtime thread that finishes an operation pushes its token
/// here and writes one byte to a pipe the loop watches (`add_reader`); the
/// loop, on its own thread, takes the tokens and the results. So a native
/// call costs the loop one wake-up, not a waiter thread's two.
///
/// A byte is in the pipe exactly while tokens are waiting (both change under
/// one lock), so reading it never blocks.
#[pyclass(frozen, module = "steadfast._native")]
pub struct Notifier {
    inner: Arc<NotifierInner>,
}

/// The pipe's ends are used only under the `ready` lock.
struct NotifierInner {
    ready: Mutex<Vec<u64>>,
    reader: std::io::PipeReader,
    writer: std::io::PipeWriter,
}

impl NotifierInner {
    fn ready(&self, token: u64) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        if ready.is_empty() {
            // The pipe holds at most this one byte: the write cannot block.
            let _ = (&self.writer).write_all(&[1]);
        }
        ready.push(token);
    }
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, writer) = std::io::pipe()?;
        Ok(Notifier {
            inner: Arc::new(NotifierInner {
                ready: Mutex::new(Vec::new()),
                reader,
                writer,
            }),
        })
    }

    /// The file descriptor the loop watches for readability.
    fn fileno(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.inner.reader.as_raw_fd()
    }

    /// The tokens of the operations finished since the last call.
    fn take_ready(&self) -> Vec<u64> {
        let mut ready = self.inner.ready.lock().unwrap_or_else(|p| p.into_inner());
        if ready.is_empty() {
            return Vec::new();
        }
        let mut byte = [0u8; 1];
        let _ = (&self.inner.reader).read_exact(&mut byte);
        std::mem::take(&mut *ready)
    }
}

/// Whether an operation has finished, and who to tell when it does.
#[derive(Default)]
struct Watch {
    done: bool,
    /// Whether a notifier was asked to be told (once only).
    watched: bool,
    notify: Option<(Arc<NotifierInner>, u64)>,
}

/// The sending end of an operation, which marks it finished when dropped:
/// after its result was sent, or when its task was aborted (then `wait`
/// reports the cancellation). The sender goes first, so that `wait` never
/// waits once the operation is marked finished.
struct Finished {
    tx: Option<mpsc::Sender<Finish>>,
    watch: Arc<Mutex<Watch>>,
}

impl Finished {
    fn send(mut self, finish: Finish) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(finish);
        }
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        drop(self.tx.take());
        let notify = {
            let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            w.done = true;
            w.notify.take()
        };
        if let Some((n, token)) = notify {
            n.ready(token);
        }
    }
}

/// A result being computed by the engine: `wait()` for it from a Python
/// thread, or have a [`Notifier`] told when it is there.
#[pyclass(frozen, module = "steadfast._native")]
pub struct Pending {
    rx: Mutex<Option<mpsc::Receiver<Finish>>>,
    watch: Arc<Mutex<Watch>>,
    abort: Abort,
}

/// Stops an operation at its next await point: its runtime task is
/// aborted, and an operation still in its first poll on a blocking thread
/// (see [`spawn_first_here`]) is stopped as soon as that poll ends.
#[derive(Clone, Default)]
pub struct Abort {
    inner: Arc<AbortInner>,
}

#[derive(Default)]
struct AbortInner {
    cancelled: AtomicBool,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The waker of a thread that drives the operation itself
    /// ([`drive_here`]), or of an operation parked by [`start_here`], woken
    /// to see that it was stopped.
    driver: Mutex<Option<std::task::Waker>>,
    /// An exception that stops the operation instead of being recorded (a
    /// `KeyboardInterrupt` or `SystemExit` out of a function called on the
    /// driving thread): raised by the operation's result.
    interrupt: Mutex<Option<PyErr>>,
}

impl Abort {
    /// Stops the operation.
    pub fn abort(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let task = self.inner.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = task.as_ref() {
            h.abort();
        }
        drop(task);
        let driver = self.inner.driver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = driver.as_ref() {
            w.wake_by_ref();
        }
    }

    /// Stops the operation with `e`, which its result raises.
    pub fn interrupt(&self, e: PyErr) {
        *self
            .inner
            .interrupt
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
        self.abort();
    }

    fn take_interrupt(&self) -> Option<PyErr> {
        self.inner
            .interrupt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Whether the operation was stopped; for a step function that ran on a
    /// blocking thread in the operation's first poll, checked before its
    /// value goes on to be recorded.
    pub fn is_stopped(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Hands the operation's runtime task over; aborts it at once when the
    /// operation was stopped before.
    fn set_task(&self, h: tokio::task::AbortHandle) {
        let mut task = self.inner.task.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_stopped() {
            h.abort();
        }
        *task = Some(h);
    }
}

/// A new operation's two ends: where its result goes, and what Python holds.
fn channel(abort: Abort) -> (Finished, Pending) {
    let (tx, rx) = mpsc::channel();
    let watch = Arc::new(Mutex::new(Watch::default()));
    let finished = Finished {
        tx: Some(tx),
        watch: Arc::clone(&watch),
    };
    let pending = Pending {
        rx: Mutex::new(Some(rx)),
        watch,
        abort,
    };
    (finished, pending)
}

/// An operation's future, boxed.
pub type Op = std::pin::Pin<Box<dyn Future<Output = Finish> + Send>>;

/// A way to start an operation, stopped by the [`Abort`] it is given.
pub type Start = fn(Abort, Op) -> Pending;

/// Starts `fut` on the runtime.
pub fn spawn<F>(fut: F) -> Pending
where
    F: Future<Output = Finish> + Send + 'static,
{
    spawn_as(Abort::default(), Box::pin(fut))
}

/// Starts `fut` on the runtime, stopped by `abort`.
pub fn spawn_as(abort: Abort, fut: Op) -> Pending {
    let (finished, pending) = channel(abort.clone());
    finish_or_spawn(&abort, fut, finished, std::task::Poll::Pending);
    pending
}

thread_local! {
    /// Set while [`spawn_first_here`] or [`start_here`] polls an operation
    /// for the first time: a step function called then runs on this thread
    /// (see [`inline`]).
    static INLINE: std::cell::RefCell<Option<Inline>> = const { std::cell::RefCell::new(None) };
}

/// A first poll's leave to call into Python on its own thread.
pub struct Inline {
    /// The operation's stop flag.
    pub stop: Abort,
    /// Whether the thread is the event loop's, which must not wait for a
    /// store: whatever follows the call is then left to the runtime.
    pub on_loop: bool,
    /// Whether the thread is the one a sync durable function runs on (see
    /// [`block_inline`]): a Python thread, which the interpreter waits for
    /// by itself, and the one a `KeyboardInterrupt` comes to.
    pub caller: bool,
}

/// The leave of the operation in its first poll on this thread
/// ([`poll_once`]), taken so that only the first call into Python of that
/// poll runs here; `None` elsewhere.
pub fn inline() -> Option<Inline> {
    INLINE.with(|i| i.borrow_mut().take())
}

/// Clears [`INLINE`] when the poll ends, a panic included.
struct InlineGuard;

impl Drop for InlineGuard {
    fn drop(&mut self) {
        INLINE.with(|i| i.borrow_mut().take());
    }
}

/// Polls `fut` once on this thread with `waker`, the first call into
/// Python it makes run here ([`inline`]).
fn poll_once(
    abort: &Abort,
    fut: &mut Op,
    on_loop: bool,
    waker: &std::task::Waker,
) -> std::task::Poll<Finish> {
    let _guard = InlineGuard;
    let here = Inline {
        stop: abort.clone(),
        on_loop,
        caller: false,
    };
    INLINE.with(|i| *i.borrow_mut() = Some(here));
    let mut cx = std::task::Context::from_waker(waker);
    fut.as_mut().poll(&mut cx)
}

/// After [`poll_once`] (or in place of it): the result sent, or the
/// operation handed to a runtime task, which polls it (again) at once and so
/// registers its own waker wherever the first poll's (a noop one, or a
/// [`SpawnOnWake`]) stood.
fn finish_or_spawn(abort: &Abort, fut: Op, finished: Finished, polled: std::task::Poll<Finish>) {
    match polled {
        std::task::Poll::Ready(finish) => finished.send(finish),
        std::task::Poll::Pending => {
            let handle = rt().spawn(async move {
                let finished = finished;
                finished.send(fut.await);
            });
            abort.set_task(handle.abort_handle());
        }
    }
}

/// Starts `fut` on a blocking thread and polls it there once, with a step
/// function it calls first run on that same thread ([`inline`]): a sync
/// step and its checkpoint then cost one hand-off from the caller and one
/// back, not a trip through the runtime's workers each. Whatever the
/// operation still waits for after that poll, it waits for as a runtime
/// task.
pub fn spawn_first_here(abort: Abort, fut: Op) -> Pending {
    let (finished, pending) = channel(abort.clone());
    // The blocking task is not aborted: it looks at the stop flag itself.
    drop(rt().spawn_blocking(move || {
        if abort.is_stopped() {
            return; // dropping `finished` reports the cancellation
        }
        let mut fut = fut;
        let polled = poll_once(&abort, &mut fut, false, std::task::Waker::noop());
        finish_or_spawn(&abort, fut, finished, polled);
    }));
    pending
}

/// Polls `fut` once on the calling thread, the event loop's, with the
/// interpreter's lock released and the first call into Python made here
/// ([`inline`]); whatever it waits for after that it waits for as a runtime
/// task. For an async step: its coroutine is scheduled on the loop without a
/// trip through other threads, and a step recorded before (a resume) is
/// answered at once. Only for operations that write nothing to the store
/// before that call (a step of a run without a lease, whose start renews
/// nothing); what follows the call (recording a value or a failure) is left
/// to the runtime, so that the loop does not wait for a disk.
///
/// The operation becomes a runtime task only when something it waits for
/// wakes it (most often the coroutine's end; see [`SpawnOnWake`]): while the
/// coroutine runs, no runtime thread is woken to poll an operation that has
/// nothing to do yet.
pub fn start_here(py: Python<'_>, abort: Abort, fut: Op) -> Pending {
    let (finished, pending) = channel(abort.clone());
    if abort.is_stopped() {
        return pending; // `finished` dropped: reported as cancelled
    }
    let parked = Arc::new(SpawnOnWake {
        state: Mutex::new(Parked::Polling { woken: false }),
    });
    let waker = std::task::Waker::from(Arc::clone(&parked));
    let mut fut = fut;
    let polled = py.detach(|| {
        let _runtime = rt().enter();
        poll_once(&abort, &mut fut, true, &waker)
    });
    if polled.is_pending() {
        // A stop wakes it too: the task it becomes is aborted at once.
        *abort.inner.driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker);
        let mut state = parked.state.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, Parked::Polling { woken: false }) && !abort.is_stopped() {
            *state = Parked::Waiting(fut, finished, abort);
            return pending;
        }
        // Woken during the poll, or stopped: on to the runtime now.
        *state = Parked::Gone;
    }
    finish_or_spawn(&abort, fut, finished, polled);
    pending
}

/// The waker of an operation polled once by [`start_here`]: the operation
/// waits in it, polled by nobody, until something it waits for wakes it,
/// and is then handed to a runtime task (which polls it at once, and so
/// registers its own waker wherever this one stood).
struct SpawnOnWake {
    state: Mutex<Parked>,
}

/// Where an operation parked in a [`SpawnOnWake`] is.
enum Parked {
    /// In its first poll; `woken`: a wake-up came meanwhile.
    Polling { woken: bool },
    /// Waiting for its first wake-up.
    Waiting(Op, Finished, Abort),
    /// Handed to the runtime (later wake-ups are its task's business).
    Gone,
}

impl std::task::Wake for SpawnOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, Parked::Gone) {
            Parked::Polling { .. } => *state = Parked::Polling { woken: true },
            Parked::Waiting(fut, finished, abort) => {
                drop(state);
                finish_or_spawn(&abort, fut, finished, std::task::Poll::Pending);
            }
            Parked::Gone => {}
        }
    }
}

/// Runs `fut` to its end on the calling thread, a sync durable function's,
/// with the interpreter's lock released while it waits, and gives back a
/// finished [`Pending`]. Each call into Python that a poll of it makes first
/// runs on this thread ([`inline`]): the function of a step, with its
/// checkpoint, costs no hand-off to another thread, as in a Rust durable
/// function. For a step whose function must be given up on (a timeout) or
/// must not hold the thread (a leased run's, whose lease is renewed while it
/// runs), see [`block_apart`].
pub fn block_inline(abort: Abort, fut: Op) -> Pending {
    block_here(abort, fut, true)
}

/// Like [`block_inline`], with every call into Python made on a blocking
/// thread of its own (this one only drives the operation): for parallel
/// branches, and for steps that [`block_inline`] must not run here.
pub fn block_apart(abort: Abort, fut: Op) -> Pending {
    block_here(abort, fut, false)
}

fn block_here(abort: Abort, fut: Op, inline: bool) -> Pending {
    let (finished, pending) = channel(abort.clone());
    let out = Python::attach(|py| py.detach(|| drive_here(&abort, fut, inline)));
    match (out, abort.take_interrupt()) {
        (_, Some(e)) => finished.send(Box::new(move |_py: Python<'_>| Err(e))),
        (Some(finish), None) => finished.send(finish),
        // Stopped: dropping `finished` reports the cancellation.
        (None, None) => {}
    }
    pending
}

/// Wakes the thread that drives an operation in [`drive_here`]. The flag
/// says the wake-up is this operation's: an operation driven by a nested
/// call on the same thread (a step inside a durable function's body) may
/// take the thread's unpark meant for the outer one, never its flag.
struct Wakeup {
    woken: AtomicBool,
    thread: std::thread::Thread,
}

impl std::task::Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// How long a driving thread parks before it looks for a signal (Ctrl-C)
/// the interpreter has to act on.
const SIGNAL_LOOK: Duration = Duration::from_millis(50);

/// Polls `fut` on this thread until it is ready, parked in between, or
/// until it is stopped (`None`; the future is dropped, so nothing more of it
/// is recorded). The runtime is entered, so timers, I/O and spawned tasks
/// work as on its own threads (its workers drive them). While parked it
/// looks for signals every [`SIGNAL_LOOK`]: a `KeyboardInterrupt` raised by
/// a handler stops the operation with that exception.
fn drive_here(abort: &Abort, mut fut: Op, inline: bool) -> Option<Finish> {
    let wakeup = Arc::new(Wakeup {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = std::task::Waker::from(Arc::clone(&wakeup));
    *abort.inner.driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let _runtime = rt().enter();
    loop {
        if abort.is_stopped() {
            return None;
        }
        let polled = {
            let _guard = InlineGuard;
            if inline {
                let here = Inline {
                    stop: abort.clone(),
                    on_loop: false,
                    caller: true,
                };
                INLINE.with(|i| *i.borrow_mut() = Some(here));
            }
            fut.as_mut().poll(&mut cx)
        };
        if let std::task::Poll::Ready(finish) = polled {
            return Some(finish);
        }
        while !wakeup.woken.swap(false, Ordering::SeqCst) {
            if abort.is_stopped() {
                return None;
            }
            std::thread::park_timeout(SIGNAL_LOOK);
            if !wakeup.woken.load(Ordering::SeqCst) {
                if let Err(e) = Python::attach(|py| py.check_signals()) {
                    abort.interrupt(e);
                    return None;
                }
            }
        }
    }
}

#[pymethods]
impl Pending {
    /// Blocks (GIL released) until the result is there and returns it, or
    /// raises what it raised. Only the first call waits.
    pub fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rx = self
            .rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("this result is already awaited")
            })?;
        // A notified result is there already: take it without giving the
        // GIL up and waiting to have it back.
        let got = match rx.try_recv() {
            Ok(finish) => Ok(finish),
            Err(mpsc::TryRecvError::Empty) => py.detach(move || rx.recv()),
            Err(mpsc::TryRecvError::Disconnected) => Err(mpsc::RecvError),
        };
        match got {
            Ok(finish) => finish(py),
            Err(_) => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the operation was cancelled before it finished",
            )),
        }
    }

    /// Whether the result is there: then `wait` returns without blocking.
    fn done(&self) -> bool {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).done
    }

    /// Has `notifier` told (with `token`) when the result is there; at once
    /// if it is already. Then `wait` returns without blocking.
    fn notify(&self, notifier: &Notifier, token: u64) -> PyResult<()> {
        let now = {
            let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            if w.watched {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "this result is already awaited",
                ));
            }
            w.watched = true;
            if w.done {
                true
            } else {
                w.notify = Some((Arc::clone(&notifier.inner), token));
                false
            }
        };
        if now {
            notifier.inner.ready(token);
        }
        Ok(())
    }

    /// Stops the operation at its next await point (when the coroutine that
    /// awaited it was cancelled).
    fn cancel(&self) {
        self.abort.abort();
    }
}
