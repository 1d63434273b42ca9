//! What a step knows about itself while it runs.

use std::sync::Arc;

use crate::engine::emit::Sink;
use crate::record::error::{Error, StoreError};
use crate::record::ids::idempotency_key;

/// What a step knows about itself while it runs.
#[derive(Clone)]
pub struct StepCtx {
    run_id: Arc<str>,
    step: Arc<str>,
    index: usize,
    attempt: u32,
    sink: Option<SinkRef>,
}

/// The step's event buffer, shared. A panic while a value is put in it
/// leaves it whole (its lock is taken back from poisoning), so a context
/// stays unwind safe as it was before it carried one.
#[derive(Clone)]
struct SinkRef(Arc<Sink>);

impl std::panic::UnwindSafe for SinkRef {}
impl std::panic::RefUnwindSafe for SinkRef {}

impl std::fmt::Debug for StepCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepCtx")
            .field("run_id", &self.run_id)
            .field("step", &self.step)
            .field("index", &self.index)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

tokio::task_local! {
    static CURRENT: StepCtx;
}

impl StepCtx {
    /// The context of the step running now, inside a durable function's step
    /// (whose closure takes no arguments); `None` outside a step.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use steadfast_core::{durable, MemoryStore, StepCtx, StepError};
    /// let store = MemoryStore::new();
    /// let out = durable("r", &store, "keys", |ctx| async move {
    ///     ctx.step("charge", || async {
    ///         let key = StepCtx::current().map(|c| c.idempotency_key());
    ///         Ok::<_, StepError>(key)
    ///     })
    ///     .await
    /// })
    /// .await?;
    /// assert_eq!(out.completed(), Some(Some("r/charge".to_string())));
    /// # Ok::<(), steadfast_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn current() -> Option<StepCtx> {
        CURRENT.try_with(|c| c.clone()).ok()
    }

    /// Runs `fut` with `self` as the [`current`](StepCtx::current) step.
    pub(crate) async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }

    /// A context, as the run loop builds it (public for testing steps directly).
    pub fn new(run_id: &str, step: &str, index: usize, attempt: u32) -> Self {
        StepCtx {
            run_id: run_id.into(),
            step: step.into(),
            index,
            attempt,
            sink: None,
        }
    }

    /// The run's id and the step's name, shared.
    pub(crate) fn names(&self) -> (Arc<str>, Arc<str>) {
        (Arc::clone(&self.run_id), Arc::clone(&self.step))
    }

    /// The same context with `sink` taking what the step emits.
    pub(crate) fn with_sink(mut self, sink: Arc<Sink>) -> Self {
        self.sink = Some(SinkRef(sink));
        self
    }

    /// Emits `value` while the step runs: it lands in the run's event log
    /// (numbered, with this step, this attempt and the time), where
    /// `steadfast watch` and [`Watch`](crate::watch::Watch) show it as it
    /// happens. Events are written in batches, at most
    /// [`FLUSH_EVERY`](crate::watch::FLUSH_EVERY) after they are emitted
    /// and all of them before the step's checkpoint; a crash loses only
    /// those of an unfinished step emitted since its last batch.
    ///
    /// Errors: a value that cannot be stored (not JSON, nested deeper than
    /// [`MAX_VALUE_DEPTH`](crate::MAX_VALUE_DEPTH), over
    /// [`MAX_EVENT_BYTES`](crate::store::MAX_EVENT_BYTES) as JSON), a store
    /// that keeps no events, a context made outside a run
    /// ([`StepCtx::new`]), or a log that refused an earlier batch of this
    /// step. A step may ignore them: events are its running commentary,
    /// its update is its result.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use serde_json::json;
    /// use steadfast_core::{durable, store::Events, MemoryStore, StepCtx, StepError};
    /// let store = MemoryStore::new();
    /// durable("r", &store, "agent", |ctx| async move {
    ///     ctx.step("answer", || async {
    ///         let step = StepCtx::current().expect("inside a step");
    ///         for token in ["Hel", "lo"] {
    ///             step.emit(json!({ "token": token })).expect("emitted");
    ///         }
    ///         Ok::<_, StepError>("Hello".to_string())
    ///     })
    ///     .await
    /// })
    /// .await?;
    /// let log = store.read_events("r", 0, 10).await?;
    /// assert_eq!(log.len(), 2);
    /// assert_eq!((log[1].seq, &log[1].value), (2, &json!({ "token": "lo" })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn emit(&self, value: impl serde::Serialize) -> Result<(), Error> {
        let value = serde_json::to_value(value).map_err(|e| Error::InvalidInput {
            what: format!(
                "an event emitted by step {:?} of run {:?}",
                self.step, self.run_id
            ),
            reason: format!("it is not JSON: {e}"),
        })?;
        match &self.sink {
            Some(sink) => sink.0.emit(value),
            None => Err(Error::Store {
                run_id: self.run_id.to_string(),
                op: format!("emitting an event from step {:?}", self.step),
                source: StoreError::Unsupported(
                    "the store keeps no events (or the step runs outside a run)".into(),
                ),
            }),
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// The step's index in the workflow.
    pub fn index(&self) -> usize {
        self.index
    }

    /// This attempt's number, 1-based, counted across resumes.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A key that names this step of this run, the same on every attempt, every
    /// resume and every machine: pass it to external services so a repeated call
    /// becomes a no-op. See [`idempotency_key`](crate::idempotency_key).
    pub fn idempotency_key(&self) -> String {
        idempotency_key(&self.run_id, &self.step)
    }
}
