//! What a step knows about itself while it runs.

use std::sync::Arc;

use crate::record::ids::idempotency_key;

/// What a step knows about itself while it runs.
#[derive(Clone, Debug)]
pub struct StepCtx {
    run_id: Arc<str>,
    step: Arc<str>,
    index: usize,
    attempt: u32,
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
