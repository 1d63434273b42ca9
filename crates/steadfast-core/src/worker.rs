//! Workers: processes that share a store, take the runs that are due, run
//! them under a lease, and take over each other's runs when a holder dies.
//!
//! A run is recorded by [`start`] (status `pending`) and picked up by any
//! [`Worker`] whose [`Registry`] has its workflow. Who advances a run is
//! decided by the lease the run loop claims by compare-and-swap: a worker
//! paused past its lease loses its next save or renewal (a conflict) and
//! drops the run, so nothing it does afterwards reaches the store.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinSet;

use crate::checkpoint::{Checkpoint, Owner, RunStatus};
use crate::durable::DurableCtx;
use crate::engine::{store_error, Runner};
use crate::error::Error;
use crate::ids::validate_run_id;
use crate::outcome::Outcome;
use crate::state::State;
use crate::store::{DueRequest, SaveRequest, Store};
use crate::workflow::Workflow;

/// The key under which [`start`] keeps a durable function's input.
pub(crate) const INPUT_KEY: &str = "__input";

/// The store a worker runs on: any store, shared.
pub type SharedStore = Arc<dyn Store>;

type DurableEntry = Arc<
    dyn Fn(
            DurableCtx<'static, SharedStore>,
        ) -> Pin<Box<dyn Future<Output = Result<Value, Error>> + Send>>
        + Send
        + Sync,
>;

#[derive(Clone)]
enum Entry {
    Listed(Arc<Workflow>),
    Durable(DurableEntry),
}

/// The workflows a worker can run, by name: listed workflows and durable
/// functions.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::{update, Registry, StepError, Workflow};
///
/// let wf = Workflow::builder("ingest")
///     .step("fetch", |_, _| async { update(json!({"rows": 3})) })
///     .build()?;
/// let registry = Registry::new()
///     .workflow(wf)
///     .durable("greet", |ctx| async move {
///         let name = ctx.input().await.unwrap_or(json!("world"));
///         ctx.step("hello", move || {
///             let name = name.clone();
///             async move { Ok::<_, StepError>(format!("hello {name}")) }
///         })
///         .await
///     });
/// assert_eq!(registry.names(), ["greet", "ingest"]);
/// # Ok::<(), steadfast_core::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workflows", &self.names())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a listed workflow under its name (replacing one of that name).
    pub fn workflow(mut self, workflow: Workflow) -> Self {
        self.entries.insert(
            workflow.name().to_string(),
            Entry::Listed(Arc::new(workflow)),
        );
        self
    }

    /// Adds a durable function under `name` (replacing one of that name).
    /// Its input, given to [`start`], is [`DurableCtx::input`]; its result
    /// is saved as JSON.
    pub fn durable<T, F, Fut>(mut self, name: impl Into<String>, f: F) -> Self
    where
        T: serde::Serialize + 'static,
        F: Fn(DurableCtx<'static, SharedStore>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let f = Arc::new(f);
        let entry: DurableEntry = Arc::new(move |ctx| {
            let fut = f(ctx);
            Box::pin(async move {
                let value = fut.await?;
                serde_json::to_value(value).map_err(|e| Error::InvalidInput {
                    what: "a durable function's result".into(),
                    reason: e.to_string(),
                })
            })
        });
        self.entries.insert(name.into(), Entry::Durable(entry));
        self
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
}

/// Records run `run_id` of `workflow` as `pending`, for a worker to pick up.
/// Returns whether it was recorded now: a run id that already exists is left
/// as it is (whatever its workflow or input) and is not an error, so that
/// starting is safe to repeat.
///
/// `input` is the run's first state: for a listed workflow it must be a JSON
/// object (or null, for none); a durable function reads it back with
/// [`DurableCtx::input`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{start, MemoryStore, RunStatus, Store};
///
/// let store = MemoryStore::new();
/// assert!(start(&store, "ingest", "r1", json!({"url": "https://example.com"}), false).await?);
/// assert!(!start(&store, "ingest", "r1", json!({}), false).await?);
/// assert_eq!(store.load("r1").await.unwrap().unwrap().status, RunStatus::Pending);
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
///
/// `durable` says whether `workflow` is a durable function (its input is
/// kept whole) or a listed workflow (its input becomes the state).
pub async fn start<S: Store + ?Sized>(
    store: &S,
    workflow: &str,
    run_id: &str,
    input: Value,
    durable: bool,
) -> Result<bool, Error> {
    validate_run_id(run_id)?;
    crate::ids::check_step_name(workflow).map_err(|reason| Error::InvalidWorkflow {
        workflow: workflow.to_string(),
        reason,
    })?;
    let state: State = match (durable, input) {
        (false, Value::Object(map)) => map,
        (false, Value::Null) => State::new(),
        (false, other) => {
            return Err(Error::InvalidInput {
                what: format!("the input of run {run_id:?}"),
                reason: format!(
                    "a listed workflow's input must be a JSON object, not {}",
                    match other {
                        Value::Array(_) => "an array",
                        Value::String(_) => "a string",
                        Value::Number(_) => "a number",
                        _ => "a boolean",
                    }
                ),
            })
        }
        (true, value) => State::from_iter([(INPUT_KEY.to_string(), value)]),
    };
    let now = Runner::new(store).now();
    let mut cp = Checkpoint::new(run_id, workflow, now);
    cp.status = RunStatus::Pending;
    cp.state = state;
    match store.save(SaveRequest::new(&cp, None)).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == crate::StoreErrorKind::Conflict => Ok(false),
        Err(e) => Err(store_error(run_id, "start", e)),
    }
}

/// What a [`Worker`] did, returned when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Runs taken (a run taken again after a gate or timer counts again).
    pub taken: u64,
    /// Calls that ended with the run completed.
    pub completed: u64,
    /// Calls that stopped at a gate or timer, or were rejected.
    pub suspended: u64,
    /// Calls that failed (a step out of attempts, a store error).
    pub failed: u64,
    /// Calls that found the run held by another worker, or lost it to one.
    pub lost: u64,
    /// Runs still going when the grace period ran out, stopped, and their
    /// leases released.
    pub abandoned: u64,
}

/// A worker: takes the due runs of its registry's workflows from a store,
/// runs up to `concurrency` of them at once under a lease each, and stops
/// when told to.
///
/// ```no_run
/// # async fn demo(store: steadfast_core::worker::SharedStore, registry: steadfast_core::Registry) {
/// use steadfast_core::Worker;
/// // Stop after an hour (a real worker waits for a signal).
/// let shutdown = tokio::time::sleep(std::time::Duration::from_secs(3600));
/// let report = Worker::new(store, registry).concurrency(8).run(shutdown).await;
/// # }
/// ```
pub struct Worker {
    store: SharedStore,
    registry: Arc<Registry>,
    owner: Owner,
    concurrency: usize,
    lease: Duration,
    poll: Duration,
    grace: Duration,
    configure: Option<Configure>,
    on_end: Option<OnEnd>,
}

type OnEnd = Arc<dyn Fn(&str, &RunEnd) + Send + Sync>;

/// How a worker's call of one run ended; see [`Worker::on_run_end`].
#[derive(Debug)]
#[non_exhaustive]
pub enum RunEnd {
    /// The run completed.
    Completed,
    /// It stopped at a gate or a timer, or was rejected.
    Suspended,
    /// A step ran out of attempts, or the store failed.
    Failed(Error),
    /// Another worker holds the run, or took it over (this worker was fenced
    /// out: its save or renewal was refused).
    Lost(Error),
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.owner)
            .field("registry", &self.registry)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("poll", &self.poll)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

type Configure =
    Arc<dyn for<'a> Fn(&str, Runner<'a, SharedStore>) -> Runner<'a, SharedStore> + Send + Sync>;

/// The default lease of a worker's run: 30 seconds.
pub const DEFAULT_WORKER_LEASE: Duration = Duration::from_secs(30);
/// The default longest wait between two looks for due runs: 1 second.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);
/// The default time running steps get to finish at shutdown: 30 seconds.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

impl Worker {
    /// A worker on `store` for the workflows of `registry`, as this process
    /// ([`current_owner`](crate::current_owner)), one run at a time.
    pub fn new(store: SharedStore, registry: Registry) -> Self {
        Worker {
            store,
            registry: Arc::new(registry),
            owner: crate::process::current_owner(),
            concurrency: 1,
            lease: DEFAULT_WORKER_LEASE,
            poll: DEFAULT_POLL,
            grace: DEFAULT_GRACE,
            configure: None,
            on_end: None,
        }
    }

    /// Runs up to `n` runs at once (at least 1, at most 10,000).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.clamp(1, 10_000);
        self
    }

    /// The lease each run is claimed with; see [`Runner::lease`]. It must lie
    /// in [`limits::LEASE`](crate::limits::LEASE), or every run fails with
    /// [`Error::InvalidInput`].
    pub fn lease(mut self, ttl: Duration) -> Self {
        self.lease = ttl;
        self
    }

    /// The longest wait between two looks for due runs, when the store does
    /// not wake the worker sooner (at least 10 ms).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(10));
        self
    }

    /// How long running steps get to finish once shutdown is asked for;
    /// after it they are stopped (their futures dropped) and their leases
    /// released.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs as `owner` instead of this process.
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = owner;
        self
    }

    /// Sets more options on the [`Runner`] of each run taken, given the
    /// run's id (an observer, a takeover hook). The lease is the worker's.
    pub fn configure(
        mut self,
        f: impl for<'a> Fn(&str, Runner<'a, SharedStore>) -> Runner<'a, SharedStore>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// Calls `f` with each run's id and how the worker's call of it ended,
    /// for logs and metrics.
    pub fn on_run_end(mut self, f: impl Fn(&str, &RunEnd) + Send + Sync + 'static) -> Self {
        self.on_end = Some(Arc::new(f));
        self
    }

    /// Takes and runs due runs until `shutdown` completes; then stops taking
    /// runs, gives the running ones the grace period, stops the rest and
    /// releases their leases. Errors of single runs are logged and counted,
    /// never fatal; a store that cannot be reached is retried at the poll
    /// interval.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        let mut report = WorkerReport::default();
        let worker = Arc::new(self);
        let names: Vec<String> = worker
            .registry
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        let owner_text = worker.owner.to_string();
        let mut tasks: JoinSet<(String, Verdict)> = JoinSet::new();
        let mut running: HashSet<String> = HashSet::new();
        tokio::pin!(shutdown);
        loop {
            // Take what is due, up to the free slots.
            let free = worker.concurrency.saturating_sub(running.len());
            let mut took = 0;
            if free > 0 {
                let workflows: Vec<&str> = names.iter().map(String::as_str).collect();
                let now = Runner::new(&*worker.store).now();
                let ask = DueRequest::new(&owner_text, &workflows, now, worker.lease, free);
                match worker.store.claim_due(&ask).await {
                    Ok(due) => {
                        for summary in due {
                            if !running.insert(summary.run_id.clone()) {
                                continue;
                            }
                            took += 1;
                            report.taken += 1;
                            let w = Arc::clone(&worker);
                            tasks.spawn(async move {
                                let verdict = w.run_one(&summary.run_id, &summary.workflow).await;
                                (summary.run_id, verdict)
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error::chain(&e), "could not look for due runs; trying again");
                    }
                }
            }
            // Wait for a slot, for work, or for the end.
            let idle = took == 0 || running.len() >= worker.concurrency;
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    worker.settle(done, &mut running, &mut report);
                }
                () = worker.store.wait_for_work(worker.poll), if idle => {}
                () = std::future::ready(()), if !idle => {}
            }
        }
        // Shutdown: no more taking; the running calls get the grace period.
        let deadline = tokio::time::sleep(worker.grace);
        tokio::pin!(deadline);
        while !tasks.is_empty() {
            tokio::select! {
                Some(done) = tasks.join_next() => worker.settle(done, &mut running, &mut report),
                () = &mut deadline => break,
            }
        }
        tasks.abort_all();
        while let Some(done) = tasks.join_next().await {
            if done.is_ok() {
                worker.settle(done, &mut running, &mut report);
            }
        }
        for run_id in running {
            report.abandoned += 1;
            if let Err(e) = release(&*worker.store, &run_id, &worker.owner).await {
                tracing::warn!(run_id, error = %e, "could not release the lease of a stopped run; it lapses by itself");
            }
        }
        report
    }

    fn settle(
        &self,
        done: Result<(String, Verdict), tokio::task::JoinError>,
        running: &mut HashSet<String>,
        report: &mut WorkerReport,
    ) {
        match done {
            Ok((run_id, verdict)) => {
                running.remove(&run_id);
                match verdict {
                    Verdict::Completed => report.completed += 1,
                    Verdict::Suspended => report.suspended += 1,
                    Verdict::Failed => report.failed += 1,
                    Verdict::Lost => report.lost += 1,
                }
            }
            Err(e) => {
                // A panicking workflow: its run id is lost with the task, so
                // its lease lapses by itself.
                tracing::error!(error = %e, "a run's task failed");
                report.failed += 1;
            }
        }
    }

    async fn run_one(&self, run_id: &str, workflow: &str) -> Verdict {
        let Some(entry) = self.registry.entries.get(workflow).cloned() else {
            return Verdict::Lost;
        };
        let outcome: Result<RunEnd, Error>;
        let mut runner = Runner::new(&self.store);
        if let Some(f) = &self.configure {
            runner = f(run_id, runner);
        }
        let runner = runner.lease(self.owner.clone(), self.lease);
        outcome = match entry {
            Entry::Listed(wf) => runner.run(run_id, &wf).await.map(|o| verdict_of(&o)),
            Entry::Durable(f) => runner
                .durable(run_id, workflow, |ctx| f(ctx))
                .await
                .map(|o| verdict_of(&o)),
        };
        let end = match outcome {
            Ok(v) => v,
            Err(e) if e.is_held_elsewhere() => RunEnd::Lost(e),
            Err(e) => RunEnd::Failed(e),
        };
        match &end {
            RunEnd::Lost(e) => {
                tracing::info!(run_id, error = %crate::error::chain(e), "another worker has this run")
            }
            RunEnd::Failed(e) => {
                tracing::warn!(run_id, error = %crate::error::chain(e), "run failed")
            }
            _ => {}
        }
        if let Some(f) = &self.on_end {
            f(run_id, &end);
        }
        match end {
            RunEnd::Completed => Verdict::Completed,
            RunEnd::Suspended => Verdict::Suspended,
            RunEnd::Failed(_) => Verdict::Failed,
            RunEnd::Lost(_) => Verdict::Lost,
        }
    }
}

enum Verdict {
    Completed,
    Suspended,
    Failed,
    Lost,
}

fn verdict_of<T>(o: &Outcome<T>) -> RunEnd {
    match o {
        Outcome::Completed(_) => RunEnd::Completed,
        _ => RunEnd::Suspended,
    }
}

/// Gives up `owner`'s lease on `run_id`, if it still holds it: a head-only
/// compare-and-swap save, so a run someone else took meanwhile is left alone.
/// Returns whether a lease was released.
pub async fn release<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    owner: &Owner,
) -> Result<bool, Error> {
    let Some(mut cp) = store
        .load(run_id)
        .await
        .map_err(|e| store_error(run_id, "load", e))?
    else {
        return Ok(false);
    };
    if cp.lease.as_ref().is_none_or(|l| l.owner != *owner) {
        return Ok(false);
    }
    cp.lease = None;
    let expected = cp.version;
    match store
        .save(SaveRequest::new(&cp, Some(expected)).head_only())
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == crate::StoreErrorKind::Conflict => Ok(false),
        Err(e) => Err(store_error(run_id, "release of the lease", e)),
    }
}
