//! What a step knows about itself while it runs.

use std::sync::Arc;

use crate::engine::emit::Sink;
use crate::engine::spend::SpendLine;
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
    spend: Option<SpendRef>,
}

/// The step's event buffer, shared. A panic while a value is put in it
/// leaves it whole (its lock is taken back from poisoning), so a context
/// stays unwind safe as it was before it carried one.
#[derive(Clone)]
struct SinkRef(Arc<Sink>);

impl std::panic::UnwindSafe for SinkRef {}
impl std::panic::RefUnwindSafe for SinkRef {}

/// The attempt's line to the loop that saves its spend, shared; unwind
/// safe for the same reason as the sink.
#[derive(Clone)]
struct SpendRef(Arc<SpendLine>);

impl std::panic::UnwindSafe for SpendRef {}
impl std::panic::RefUnwindSafe for SpendRef {}

/// A spend report on its way into the run's record
/// ([`StepCtx::spend`]): await [`saved`](Charge::saved) to know it landed.
/// Dropped, the report is saved all the same.
#[must_use = "the spend is charged either way; await `saved()` to know when it is durable"]
pub struct Charge {
    done: tokio::sync::oneshot::Receiver<Result<(), Error>>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").finish_non_exhaustive()
    }
}

impl Charge {
    /// Waits until the report is saved in the run's record (one save of
    /// the run's head), so that a crash from now on still charges it.
    /// An error says it was not saved now; it is then charged with the
    /// step's checkpoint, if that lands.
    pub async fn saved(self) -> Result<(), Error> {
        self.done.await.unwrap_or_else(|_| {
            Err(Error::InvalidInput {
                what: "a spend report".into(),
                reason: "the run stopped before it was saved".into(),
            })
        })
    }

    /// [`saved`](Charge::saved) for a thread outside the async runtime (a
    /// binding's synchronous step); it must not be called on a runtime
    /// thread.
    pub fn wait_saved(self) -> Result<(), Error> {
        self.done.blocking_recv().unwrap_or_else(|_| {
            Err(Error::InvalidInput {
                what: "a spend report".into(),
                reason: "the run stopped before it was saved".into(),
            })
        })
    }
}

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
            spend: None,
        }
    }

    /// The run's id and the step's name, shared.
    pub(crate) fn names(&self) -> (Arc<str>, Arc<str>) {
        (Arc::clone(&self.run_id), Arc::clone(&self.step))
    }

    /// The same context with `line` taking what the step spends.
    pub(crate) fn with_spend(mut self, line: Arc<SpendLine>) -> Self {
        self.spend = Some(SpendRef(line));
        self
    }

    /// Adds `amounts` to what this attempt's checkpoint charges (a listed
    /// step's own `__spend`). Outside a run, nothing.
    pub(crate) fn charge_later(&self, amounts: &std::collections::BTreeMap<String, f64>) {
        if let Some(line) = &self.spend {
            line.0.charge_later(amounts);
        }
    }

    /// Reports that this attempt spent `amount` of `what` (`"tokens"`,
    /// `"usd"`, any name of 1 to 64 letters, digits, `_`, `-` or `.`). The
    /// amount is added to the run's spend and saved in its record at once,
    /// so a step cut off by a crash after reporting is still charged; a
    /// step whose checkpoint landed is replayed, never run again, and so
    /// never charged twice. Await [`Charge::saved`] to know the report is
    /// durable (one save); dropped, it is saved all the same.
    ///
    /// When the run's spend passes one of its budgets, the run stops at its
    /// [`budget`](crate::BUDGET_GATE) gate before its next step, until
    /// someone approves more (or rejects). The step itself finishes.
    ///
    /// Errors: a name or amount out of range (negative, not finite, over
    /// [`MAX_SPEND_AMOUNT`](crate::MAX_SPEND_AMOUNT)), a context made
    /// outside a run ([`StepCtx::new`]).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use steadfast_core::{durable, MemoryStore, StepCtx, StepError, Store};
    /// let store = MemoryStore::new();
    /// durable("r", &store, "agent", |ctx| async move {
    ///     ctx.step("answer", || async {
    ///         let step = StepCtx::current().expect("inside a step");
    ///         step.spend("tokens", 1234.0).map_err(StepError::terminal)?.saved().await.map_err(StepError::terminal)?;
    ///         Ok::<_, StepError>("Hello".to_string())
    ///     })
    ///     .await
    /// })
    /// .await?;
    /// let cp = store.load("r").await?.unwrap();
    /// assert_eq!(cp.spend.unwrap().spent["tokens"], 1234.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn spend(&self, what: &str, amount: f64) -> Result<Charge, Error> {
        let refuse = |reason: String| Error::InvalidInput {
            what: format!(
                "spend reported by step {:?} of run {:?}",
                self.step, self.run_id
            ),
            reason,
        };
        crate::record::spend::check_spend_name(what).map_err(refuse)?;
        if !amount.is_finite() || !(0.0..=crate::record::spend::MAX_SPEND_AMOUNT).contains(&amount)
        {
            return Err(refuse(format!(
                "the amount {amount} is not a number from 0 to {}",
                crate::record::spend::MAX_SPEND_AMOUNT
            )));
        }
        let Some(line) = &self.spend else {
            return Err(refuse(
                "the step runs outside a run (a context made by StepCtx::new)".into(),
            ));
        };
        let mut amounts = std::collections::BTreeMap::new();
        amounts.insert(what.to_string(), amount);
        Ok(Charge {
            done: line.0.report(amounts),
        })
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
