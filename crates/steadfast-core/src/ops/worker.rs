//! Workers: processes that share a store, take the runs that are due, run
//! them under a lease, and take over each other's runs when a holder dies.
//!
//! A run is recorded by [`start`] (status `pending`) and picked up by any
//! [`Worker`] whose [`Registry`] has its workflow. Who advances a run is
//! decided by the lease the run loop claims by compare-and-swap: a worker
//! paused past its lease loses its next save or renewal (a conflict) and
//! drops the run, so nothing it does afterwards reaches the store.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinSet;

use crate::engine::durable::DurableCtx;
use crate::engine::workflow::Workflow;
use crate::engine::{store_error, Runner};
use crate::record::checkpoint::Owner;
use crate::record::error::Error;
use crate::record::outcome::Outcome;
use crate::store::{DueRequest, SaveRequest, Store};

/// Re-exported where 0.1 had them (starting runs has its own module now).
pub use crate::ops::start::{start, start_listed, start_steps, start_with, StartOptions};
/// Re-exported where 0.1 had it.
pub use crate::record::keys::START_KEY;
use crate::store::StoreExt as _;

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
    /// The versions of a listed workflow, newest last.
    Listed(Vec<Arc<Workflow>>),
    Durable(DurableEntry),
}

/// What a registry gives a run of a workflow it has.
enum Pick {
    Listed(Arc<Workflow>),
    Durable(DurableEntry),
    /// The run was started under a version the registry does not have; it
    /// has these.
    Missing(Vec<String>),
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

    /// Adds a listed workflow under its name, as the newest of its
    /// versions. A workflow of the same name and version
    /// ([`Workflow::version`], none being one) replaces the one there (and
    /// so becomes the newest); one of another version joins it: each run
    /// then goes to the version it was started with, and runs started
    /// without a version, and new runs started by a worker's schedules, to
    /// the newest. A worker passes over a run whose version it does not
    /// have ([`WorkerReport::passed_over`]) and leaves it for one that has.
    ///
    /// ```
    /// use serde_json::json;
    /// use steadfast_core::{update, Registry, Workflow};
    ///
    /// let version = |v: &str| {
    ///     Workflow::builder("ingest")
    ///         .version(v)
    ///         .step("fetch", |_, _| async { update(json!({})) })
    ///         .build()
    /// };
    /// let registry = Registry::new().workflow(version("1")?).workflow(version("2")?);
    /// assert_eq!(registry.versions("ingest"), [Some("1"), Some("2")]);
    /// # Ok::<(), steadfast_core::Error>(())
    /// ```
    pub fn workflow(mut self, workflow: Workflow) -> Self {
        let name = workflow.name().to_string();
        let workflow = Arc::new(workflow);
        match self.entries.get_mut(&name) {
            Some(Entry::Listed(versions)) => {
                versions.retain(|w| w.version() != workflow.version());
                versions.push(workflow);
            }
            _ => {
                self.entries.insert(name, Entry::Listed(vec![workflow]));
            }
        }
        self
    }

    /// The versions of listed workflow `name` it holds, oldest first (none
    /// for a workflow without a version); empty when `name` is not a
    /// listed workflow of it.
    pub fn versions(&self, name: &str) -> Vec<Option<&str>> {
        match self.entries.get(name) {
            Some(Entry::Listed(versions)) => versions.iter().map(|w| w.version()).collect(),
            _ => Vec::new(),
        }
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

    /// `None` when `name` is not registered; else the newest version of
    /// the listed workflow, or `None` inside for a durable function.
    pub(crate) fn listed(&self, name: &str) -> Option<Option<&Workflow>> {
        self.entries.get(name).map(|e| match e {
            Entry::Listed(versions) => versions.last().map(|w| &**w),
            Entry::Durable(_) => None,
        })
    }

    /// What runs a run of `name` started under workflow version `version`
    /// (none: any version, the newest); `None` when `name` is not here.
    fn pick(&self, name: &str, version: Option<&str>) -> Option<Pick> {
        Some(match self.entries.get(name)? {
            Entry::Durable(f) => Pick::Durable(Arc::clone(f)),
            Entry::Listed(versions) => {
                let found = match version {
                    None => versions.last(),
                    Some(v) => versions.iter().rev().find(|w| w.version() == Some(v)),
                };
                match found {
                    Some(w) => Pick::Listed(Arc::clone(w)),
                    None => Pick::Missing(
                        versions
                            .iter()
                            .filter_map(|w| w.version().map(str::to_string))
                            .collect(),
                    ),
                }
            }
        })
    }
}

type ScheduleLook = Result<crate::ops::schedules::Fired, Error>;
type GcPass = Result<crate::ops::retention::GcReport, Error>;

/// How often a worker looks for due schedule slots, at most.
pub const SCHEDULE_LOOK: Duration = Duration::from_secs(1);

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
    /// Calls that lost a run they held: another worker took it over (this
    /// one was fenced out at a save or renewal), or it was deleted or
    /// replaced underneath.
    pub lost: u64,
    /// Calls that never had the run: another worker or process held it,
    /// or claimed it first (two looked at it at once). Nothing ran.
    pub missed: u64,
    /// Calls that found the run cancelled, or stopped because it was.
    pub cancelled: u64,
    /// Finished runs deleted by the worker's retention policy.
    pub collected: u64,
    /// Runs still going when the grace period ran out, stopped, and their
    /// leases released.
    pub abandoned: u64,
    /// Runs this worker started for due slots of schedules
    /// ([`schedule_ops`](crate::schedule_ops)).
    pub scheduled: u64,
    /// Calls that found the run started under a version of its workflow
    /// this worker does not have: the run was left for a worker that has
    /// it, marked so ([`Checkpoint::passed_over`](crate::Checkpoint::passed_over)),
    /// and is left alone by this worker for [`PASSED_OVER_REST`].
    pub passed_over: u64,
}

/// How long a worker leaves alone a run it passed over (its version of the
/// workflow missing) before it looks at it again.
pub const PASSED_OVER_REST: Duration = Duration::from_secs(300);

/// A worker: takes the due runs of its registry's workflows from a store,
/// runs up to `concurrency` of them at once under a lease each, and stops
/// when told to.
///
/// ```no_run
/// # async fn demo(store: steadfast_core::worker::SharedStore, registry: steadfast_core::Registry) -> Result<(), steadfast_core::Error> {
/// use steadfast_core::Worker;
/// // Stop after an hour (a real worker waits for a signal).
/// let shutdown = tokio::time::sleep(std::time::Duration::from_secs(3600));
/// let report = Worker::new(store, registry).concurrency(8).run(shutdown).await?;
/// # Ok(())
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
    retention: Option<(crate::ops::retention::Retention, Duration)>,
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
    /// The worker held the run and lost it: another worker took it over
    /// (this one was fenced out: its save or renewal was refused), or it
    /// was deleted or replaced underneath ([`Error::Removed`]).
    Lost(Error),
    /// The worker never had the run: another worker or process held it,
    /// or claimed it first ([`Error::Held`], [`Error::ClaimLost`]).
    /// Nothing ran; a normal race between workers, not a fault.
    Missed(Error),
    /// The run was cancelled, before or during the call.
    Cancelled(Error),
    /// The run was started under version `version` of its workflow, which
    /// this worker does not have (it has `available`): nothing ran, and the
    /// run waits for a worker with that version.
    PassedOver {
        /// The version the run needs.
        version: String,
        /// The versions this worker has.
        available: Vec<String>,
    },
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
            owner: crate::engine::process::current_owner(),
            concurrency: 1,
            lease: DEFAULT_WORKER_LEASE,
            poll: DEFAULT_POLL,
            grace: DEFAULT_GRACE,
            configure: None,
            on_end: None,
            retention: None,
        }
    }

    /// Applies `policy` every `every` (at least a second) while the worker
    /// runs: finished runs older than the policy's age are deleted in the
    /// background, in batches, as [`retention::collect`](crate::ops::retention::collect)
    /// does. Several workers may share the duty: a run deleted by one is
    /// skipped by the others. The runs deleted are counted in
    /// [`WorkerReport::collected`]; a policy out of range fails
    /// [`run`](Worker::run) before anything is taken.
    pub fn retention(mut self, policy: crate::ops::retention::Retention, every: Duration) -> Self {
        self.retention = Some((policy, every.max(Duration::from_secs(1))));
        self
    }

    /// Runs up to `n` runs at once (at least 1, at most 10,000).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.clamp(1, 10_000);
        self
    }

    /// The lease each run is claimed with; see [`Runner::lease`]. It must lie
    /// in [`limits::LEASE`](crate::record::limits::LEASE), or every run fails with
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
    /// never fatal: a run whose call failed or was lost to another worker is
    /// left alone for a while (from one poll interval, doubling to a minute)
    /// before this worker takes it again. A store that cannot be reached is
    /// retried at the poll interval.
    ///
    /// Fails with [`Error::InvalidInput`] before taking anything when the
    /// lease lies outside [`limits::LEASE`](crate::record::limits::LEASE).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<WorkerReport, Error> {
        crate::record::limits::LEASE
            .check("lease", self.lease)
            .map_err(|reason| Error::InvalidInput {
                what: "the worker's lease".into(),
                reason,
            })?;
        if let Some((policy, _)) = &self.retention {
            policy.check()?;
        }
        let mut report = WorkerReport::default();
        let worker = Arc::new(self);
        // At most one retention pass at a time; dropped with the worker's
        // future, the set stops it.
        let mut gc: JoinSet<GcPass> = JoinSet::new();
        let mut next_gc = tokio::time::Instant::now();
        let names: Vec<String> = worker
            .registry
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        let owner_text = worker.owner.to_string();
        // A reservation only bridges the moment between finding a run and
        // saving the lease on it.
        let hold = worker.lease.min(Duration::from_secs(10));
        let mut tasks: JoinSet<(String, Verdict)> = JoinSet::new();
        let mut state = Book::default();
        let mut next_schedules = tokio::time::Instant::now();
        // At most one look at a time; dropped with the worker's future, the
        // set stops it.
        let mut schedules: JoinSet<ScheduleLook> = JoinSet::new();
        tokio::pin!(shutdown);
        'taking: loop {
            worker
                .tend_retention(&mut gc, &mut next_gc, &mut report)
                .await;
            worker
                .tend_schedules(&mut schedules, &mut next_schedules, &mut report)
                .await;
            // Take what is due, up to the free slots, leaving out the runs
            // this worker has in hand or is leaving alone for a while.
            let free = worker.concurrency.saturating_sub(state.running.len());
            let mut took = 0;
            if free > 0 {
                let workflows: Vec<&str> = names.iter().map(String::as_str).collect();
                let skip = state.skip();
                let skip: Vec<&str> = skip.iter().map(String::as_str).collect();
                let now = Runner::new(&*worker.store).now();
                let mut ask = DueRequest::new(&owner_text, &workflows, now, hold, free);
                ask.skip = &skip;
                let found = tokio::select! {
                    biased;
                    () = &mut shutdown => break 'taking,
                    found = tracing::Instrument::instrument(
                        worker.store.claim_due(&ask),
                        tracing::debug_span!("steadfast.store", op = "claim_due", worker = %owner_text),
                    ) => found,
                };
                match found {
                    Ok(due) => {
                        for summary in due {
                            if state.running.values().any(|r| *r == summary.run_id) {
                                continue;
                            }
                            took += 1;
                            report.taken += 1;
                            let w = Arc::clone(&worker);
                            let run_id = summary.run_id.clone();
                            let handle = tasks.spawn(async move {
                                let verdict = w
                                    .run_one(
                                        &summary.run_id,
                                        &summary.workflow,
                                        summary.workflow_version.as_deref(),
                                        summary.version,
                                    )
                                    .await;
                                (summary.run_id, verdict)
                            });
                            state.running.insert(handle.id(), run_id);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::record::error::chain(&e), "could not look for due runs; trying again");
                    }
                }
            }
            // Wait for a slot, for work, or for the end.
            let idle = took == 0 || state.running.len() >= worker.concurrency;
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    worker.settle(done, &mut state, &mut report).await;
                }
                () = worker.store.wait_for_work(worker.poll), if idle => {}
                () = std::future::ready(()), if !idle => {}
            }
        }
        gc.abort_all();
        while let Some(done) = gc.join_next().await {
            if let Ok(Ok(done)) = done {
                report.collected += done.deleted;
            }
        }
        // A look at the schedules under way may end within the grace period
        // (so that the runs it started are counted); else it is stopped and
        // leaves its slots to the next worker (their starts are safe to
        // repeat).
        if let Ok(Some(Ok(Ok(fired)))) =
            tokio::time::timeout(worker.grace, schedules.join_next()).await
        {
            report.scheduled += fired.started;
        }
        schedules.abort_all();
        // Shutdown: no more taking; the running calls get the grace period.
        let deadline = tokio::time::sleep(worker.grace);
        tokio::pin!(deadline);
        while !tasks.is_empty() {
            tokio::select! {
                Some(done) = tasks.join_next_with_id() => worker.settle(done, &mut state, &mut report).await,
                () = &mut deadline => break,
            }
        }
        tasks.abort_all();
        while let Some(done) = tasks.join_next_with_id().await {
            match done {
                Err(e) if e.is_cancelled() => {
                    if let Some(run_id) = state.running.remove(&e.id()) {
                        report.abandoned += 1;
                        worker.release_quietly(&run_id).await;
                    }
                }
                done => worker.settle(done, &mut state, &mut report).await,
            }
        }
        Ok(report)
    }

    /// Starts the retention pass when it is due, and books one that ended.
    async fn tend_retention(
        &self,
        gc: &mut JoinSet<GcPass>,
        next: &mut tokio::time::Instant,
        report: &mut WorkerReport,
    ) {
        let Some((policy, every)) = &self.retention else {
            return;
        };
        if let Some(done) = gc.try_join_next() {
            match done {
                Ok(Ok(done)) => {
                    report.collected += done.deleted;
                    if done.deleted > 0 {
                        tracing::info!(deleted = done.deleted, "retention deleted finished runs");
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::record::error::chain(&e), "retention failed; trying again at its next turn")
                }
                Err(e) => tracing::error!(error = %e, "the retention task panicked"),
            }
        }
        let now = tokio::time::Instant::now();
        if !gc.is_empty() || now < *next {
            return;
        }
        *next = now + *every;
        let store = Arc::clone(&self.store);
        let policy = policy.clone();
        gc.spawn(async move {
            let now = Runner::new(&*store).now();
            crate::ops::retention::collect(&*store, &policy, now, |_| {}).await
        });
    }

    /// Books a look at the schedules that ended, and starts the next (in a
    /// task of its own, beside the claims) at most once per
    /// [`SCHEDULE_LOOK`], and so at this worker's poll when that is longer.
    async fn tend_schedules(
        &self,
        task: &mut JoinSet<ScheduleLook>,
        next: &mut tokio::time::Instant,
        report: &mut WorkerReport,
    ) {
        if let Some(done) = task.try_join_next() {
            match done {
                Ok(Ok(fired)) => report.scheduled += fired.started,
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::record::error::chain(&e), "could not look at the schedules; trying again")
                }
                Err(e) => tracing::error!(error = %e, "the look at the schedules panicked"),
            }
        }
        let now = tokio::time::Instant::now();
        if !task.is_empty() || now < *next || self.store.capabilities().documents.is_none() {
            return;
        }
        *next = now + SCHEDULE_LOOK;
        let (store, registry) = (Arc::clone(&self.store), Arc::clone(&self.registry));
        task.spawn(async move {
            let at = Runner::new(&*store).now();
            crate::ops::schedules::fire(&*store, |name| registry.listed(name), at).await
        });
    }

    async fn release_quietly(&self, run_id: &str) {
        if let Err(e) = release(&*self.store, run_id, &self.owner).await {
            tracing::warn!(run_id, error = %e, "could not release the lease of a stopped run; it lapses by itself");
        }
    }

    async fn settle(
        &self,
        done: Result<(tokio::task::Id, (String, Verdict)), tokio::task::JoinError>,
        state: &mut Book,
        report: &mut WorkerReport,
    ) {
        match done {
            Ok((id, (run_id, verdict))) => {
                state.running.remove(&id);
                match verdict {
                    Verdict::Completed => report.completed += 1,
                    Verdict::Suspended => report.suspended += 1,
                    Verdict::Failed => report.failed += 1,
                    Verdict::Lost => report.lost += 1,
                    Verdict::Missed => report.missed += 1,
                    Verdict::Cancelled => report.cancelled += 1,
                    Verdict::PassedOver => report.passed_over += 1,
                }
                match verdict {
                    Verdict::Failed | Verdict::Lost | Verdict::Missed => {
                        state.back_off(run_id, self.poll)
                    }
                    Verdict::PassedOver => state.rest(run_id, PASSED_OVER_REST),
                    _ => {
                        state.resting.remove(&run_id);
                    }
                }
            }
            Err(e) => {
                // A panicking workflow: free its slot, give its lease back and
                // leave the run alone for a while.
                report.failed += 1;
                if let Some(run_id) = state.running.remove(&e.id()) {
                    tracing::error!(run_id, error = %e, "a run's task panicked");
                    self.release_quietly(&run_id).await;
                    state.back_off(run_id, self.poll);
                }
            }
        }
    }

    /// Runs `run_id` of `workflow`, found due (at record version `seen`)
    /// started under `version`.
    async fn run_one(
        &self,
        run_id: &str,
        workflow: &str,
        version: Option<&str>,
        seen: u64,
    ) -> Verdict {
        let Some(entry) = self.registry.pick(workflow, version) else {
            return Verdict::Lost;
        };
        let entry = match entry {
            Pick::Missing(available) => {
                let version = version.unwrap_or_default();
                return self.pass_over(run_id, version, available, seen).await;
            }
            entry => entry,
        };
        let outcome: Result<RunEnd, Error>;
        let mut runner = Runner::new(&self.store);
        if let Some(f) = &self.configure {
            runner = f(run_id, runner);
        }
        let mut runner = runner.lease(self.owner.clone(), self.lease);
        runner.found_due_at = Some(seen);
        outcome = match entry {
            Pick::Listed(wf) => runner.run(run_id, &wf).await.map(|o| verdict_of(&o)),
            Pick::Durable(f) => runner
                .durable(run_id, workflow, |ctx| f(ctx))
                .await
                .map(|o| verdict_of(&o)),
            Pick::Missing(_) => unreachable!("handled above"),
        };
        let end = match outcome {
            Ok(v) => v,
            Err(e @ Error::Cancelled { .. }) => RunEnd::Cancelled(e),
            Err(e) if e.is_claim_missed() => RunEnd::Missed(e),
            Err(e) if e.is_held_elsewhere() => RunEnd::Lost(e),
            Err(e) => RunEnd::Failed(e),
        };
        match &end {
            RunEnd::Lost(e) => {
                tracing::info!(run_id, error = %crate::record::error::chain(e), "lost a run this worker held")
            }
            RunEnd::Missed(e) => {
                tracing::debug!(run_id, error = %crate::record::error::chain(e), "another worker had this run first")
            }
            RunEnd::Failed(e) => {
                tracing::warn!(run_id, error = %crate::record::error::chain(e), "run failed")
            }
            RunEnd::Cancelled(e) => {
                tracing::info!(run_id, error = %crate::record::error::chain(e), "run cancelled")
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
            RunEnd::Missed(_) => Verdict::Missed,
            RunEnd::Cancelled(_) => Verdict::Cancelled,
            RunEnd::PassedOver { .. } => Verdict::PassedOver,
        }
    }

    /// Leaves a due run started under `version`, which this worker lacks,
    /// for a worker that has it: marks the run so
    /// ([`Checkpoint::passed_over`](crate::Checkpoint::passed_over)), which
    /// also gives up a store's reservation of it. A run that changed since
    /// the look (`seen` is the record version then: another worker ran it,
    /// parked it at a gate, finished or migrated it) is not marked, and is
    /// left alone only for a moment, as a claim another worker won.
    async fn pass_over(
        &self,
        run_id: &str,
        version: &str,
        available: Vec<String>,
        seen: u64,
    ) -> Verdict {
        match self
            .mark_passed_over(run_id, version, &available, seen)
            .await
        {
            Ok(true) => {
                tracing::info!(run_id, version, "passed over a run started under a version of its workflow this worker does not have");
            }
            Ok(false) => {
                let e = Error::ClaimLost {
                    run_id: run_id.to_string(),
                };
                tracing::debug!(
                    run_id,
                    "a run to pass over changed since the look; left for now"
                );
                if let Some(f) = &self.on_end {
                    f(run_id, &RunEnd::Missed(e));
                }
                return Verdict::Missed;
            }
            Err(e) => {
                tracing::warn!(run_id, error = %crate::record::error::chain(&e), "could not mark a run passed over; it is left alone all the same");
            }
        }
        if let Some(f) = &self.on_end {
            f(
                run_id,
                &RunEnd::PassedOver {
                    version: version.to_string(),
                    available,
                },
            );
        }
        Verdict::PassedOver
    }

    /// Writes the mark of [`pass_over`](Self::pass_over) by compare-and-swap
    /// on record version `seen`; false when the run changed since then, is
    /// gone, or no longer needs `version`.
    async fn mark_passed_over(
        &self,
        run_id: &str,
        version: &str,
        available: &[String],
        seen: u64,
    ) -> Result<bool, Error> {
        let Some(mut cp) = self
            .store
            .load(run_id)
            .await
            .map_err(|e| store_error(run_id, "load", e))?
        else {
            return Ok(false);
        };
        let still = cp
            .origin
            .as_ref()
            .and_then(|o| o.version.as_deref())
            .is_some_and(|v| v == version);
        if cp.version != seen || !still {
            return Ok(false);
        }
        let now = Runner::new(&*self.store).now();
        let by = self.owner.to_string();
        let names: Vec<&str> = available.iter().map(String::as_str).collect();
        // Written again at each pass (its time says when the run was last
        // passed over), so that the save also ends a store's reservation.
        cp.passed_over = Some(Box::new(crate::record::checkpoint::PassedOver::new(
            version, &names, &by, now,
        )));
        match self
            .store
            .save(SaveRequest::new(&cp, Some(seen)).head_only())
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == crate::StoreErrorKind::Conflict => Ok(false),
            Err(e) => Err(store_error(run_id, "mark of a run passed over", e)),
        }
    }
}

/// The runs a worker has in hand, by task, and those it leaves alone for a
/// while after their call failed or was lost: until when, and how many times
/// in a row.
#[derive(Default)]
struct Book {
    running: HashMap<tokio::task::Id, String>,
    resting: HashMap<String, (std::time::Instant, u32)>,
}

impl Book {
    /// The run ids not to take now. A run's strikes are kept for a while
    /// after its rest is over, so that failing again doubles the next rest.
    fn skip(&mut self) -> Vec<String> {
        let now = std::time::Instant::now();
        let forget = Duration::from_secs(300);
        self.resting.retain(|_, (until, _)| *until + forget > now);
        self.running
            .values()
            .cloned()
            .chain(
                self.resting
                    .iter()
                    .filter(|(_, (until, _))| *until > now)
                    .map(|(id, _)| id.clone()),
            )
            .collect()
    }

    /// Leaves `run_id` alone for `wait`, whatever its strikes.
    fn rest(&mut self, run_id: String, wait: Duration) {
        self.resting
            .insert(run_id, (std::time::Instant::now() + wait, 0));
    }

    fn back_off(&mut self, run_id: String, poll: Duration) {
        let strikes = self
            .resting
            .get(&run_id)
            .map_or(0, |r| r.1)
            .saturating_add(1);
        let wait = (poll * 2u32.saturating_pow(strikes.min(16) - 1)).min(Duration::from_secs(60));
        self.resting
            .insert(run_id, (std::time::Instant::now() + wait, strikes));
    }
}

#[derive(Clone, Copy)]
enum Verdict {
    Completed,
    Suspended,
    Failed,
    Lost,
    Missed,
    Cancelled,
    PassedOver,
}

fn verdict_of<T>(o: &Outcome<T>) -> RunEnd {
    match o {
        Outcome::Completed(_) => RunEnd::Completed,
        _ => RunEnd::Suspended,
    }
}

/// Gives this process's lease on a run up when a leased call ends without
/// the engine having done so: after an error not caused by another holder
/// (as a worker does), or when the call is dropped unfinished (its caller in
/// another language gave up on it). Another process then need not wait for
/// the lease to lapse. A run held elsewhere is left alone ([`release`]
/// compares the owner); a release that fails is no loss (the lease lapses by
/// itself). The language bindings wrap each leased run in one.
pub struct LeaseGuard {
    store: Arc<dyn Store>,
    run_id: String,
    armed: bool,
}

impl LeaseGuard {
    /// A guard of `run_id`'s lease, doing nothing unless `leased`.
    pub fn new(store: &Arc<dyn Store>, run_id: &str, leased: bool) -> Self {
        LeaseGuard {
            store: Arc::clone(store),
            run_id: run_id.to_string(),
            armed: leased,
        }
    }

    /// The call ended with `out`: an error not caused by another holder
    /// gives the lease up now.
    pub async fn finish<T>(mut self, out: &Result<T, Error>) {
        let armed = std::mem::take(&mut self.armed);
        if let Err(e) = out {
            if armed && !e.is_held_elsewhere() {
                let owner = crate::engine::process::current_owner();
                let _ = release(&*self.store, &self.run_id, &owner).await;
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, run_id) = (Arc::clone(&self.store), std::mem::take(&mut self.run_id));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let owner = crate::engine::process::current_owner();
                let _ = release(&*store, &run_id, &owner).await;
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that fails again after its rest rests twice as long (up to a
    /// minute), and is skipped only while it rests.
    #[test]
    fn rests_double_and_end() {
        let mut book = Book::default();
        let poll = Duration::from_millis(20);
        let rest = |book: &Book| {
            let (until, strikes) = book.resting["r"];
            (
                until.saturating_duration_since(std::time::Instant::now()),
                strikes,
            )
        };
        book.back_off("r".into(), poll);
        assert_eq!(rest(&book).1, 1);
        assert!(rest(&book).0 <= poll);
        assert_eq!(book.skip(), ["r"]);
        std::thread::sleep(poll + Duration::from_millis(5));
        assert!(book.skip().is_empty(), "the rest is over");
        book.back_off("r".into(), poll);
        let (left, strikes) = rest(&book);
        assert_eq!(strikes, 2, "the strikes outlive the rest");
        assert!(left > poll && left <= poll * 2, "{left:?}");
        for _ in 0..20 {
            book.back_off("r".into(), poll);
        }
        assert!(rest(&book).0 <= Duration::from_secs(60));
        assert!(rest(&book).0 > Duration::from_secs(50));
    }

    /// A registry keeps one workflow per name and version, newest last: a
    /// run goes to its own version, a run without one to the newest, and a
    /// run of a version it lacks is told which versions it has.
    #[test]
    fn a_registry_picks_the_version_a_run_was_started_with() {
        let wf = |v: Option<&str>, step: &str| {
            let mut b = crate::Workflow::builder("agent");
            if let Some(v) = v {
                b = b.version(v);
            }
            b.step(step, |_, _| async { crate::update(serde_json::json!({})) })
                .build()
                .expect("a workflow")
        };
        let steps_of = |p: Option<Pick>| match p {
            Some(Pick::Listed(w)) => w.step_names().collect::<Vec<_>>().join(","),
            Some(Pick::Missing(had)) => format!("missing, has {had:?}"),
            Some(Pick::Durable(_)) => "durable".into(),
            None => "absent".into(),
        };
        let r = Registry::new()
            .workflow(wf(None, "plain"))
            .workflow(wf(Some("1"), "one"))
            .workflow(wf(Some("2"), "two"))
            // The same version again replaces it, and becomes the newest.
            .workflow(wf(Some("1"), "one-again"));
        assert_eq!(r.versions("agent"), [None, Some("2"), Some("1")]);
        assert_eq!(steps_of(r.pick("agent", Some("1"))), "one-again");
        assert_eq!(steps_of(r.pick("agent", Some("2"))), "two");
        assert_eq!(steps_of(r.pick("agent", None)), "one-again");
        assert_eq!(
            steps_of(r.pick("agent", Some("3"))),
            "missing, has [\"2\", \"1\"]"
        );
        assert_eq!(steps_of(r.pick("other", None)), "absent");
        assert_eq!(
            r.listed("agent").flatten().map(|w| w.version()),
            Some(Some("1"))
        );
        // Without versions, a workflow of the same name replaces the one
        // there, as before versions existed.
        let r = Registry::new()
            .workflow(wf(None, "a"))
            .workflow(wf(None, "b"));
        assert_eq!(r.versions("agent"), [None]);
        assert_eq!(steps_of(r.pick("agent", Some("1"))), "missing, has []");
        assert_eq!(steps_of(r.pick("agent", None)), "b");
        // A durable function of the name replaces the listed versions.
        let r = r.durable("agent", |_ctx: DurableCtx<'static, SharedStore>| async {
            Ok::<_, Error>(1u8)
        });
        assert!(r.versions("agent").is_empty());
        assert_eq!(steps_of(r.pick("agent", Some("1"))), "durable");
    }

    /// A worker lacking a run's version marks it only if it has not changed
    /// since the look; the mark gives the run its stuck label until a
    /// migration (or a worker with the version) clears it. A run started
    /// by name alone takes any version, and is pinned to the one that
    /// first runs it.
    #[tokio::test]
    async fn a_run_is_passed_over_only_as_it_was_found() {
        let store = Arc::new(crate::MemoryStore::new());
        let agent = |v: &str| {
            crate::Workflow::builder("agent")
                .version(v)
                .step("a", |_, _| async {
                    crate::update(serde_json::json!({"a": 1}))
                })
                .build()
                .expect("a workflow")
        };
        let (v1, v2) = (agent("1"), agent("2"));
        crate::start_listed(&*store, &v1, "r", serde_json::json!({}))
            .await
            .expect("starts");
        let seen = store.load("r").await.expect("loads").expect("r").version;
        let worker = Worker::new(store.clone(), Registry::new().workflow(v2.clone()));
        // Changed since the look: not marked, a missed claim.
        assert!(matches!(
            worker.run_one("r", "agent", Some("1"), seen + 1).await,
            Verdict::Missed
        ));
        assert!(store
            .load("r")
            .await
            .unwrap()
            .unwrap()
            .passed_over
            .is_none());
        assert!(matches!(
            worker.run_one("r", "agent", Some("1"), seen).await,
            Verdict::PassedOver
        ));
        let cp = store.load("r").await.unwrap().unwrap();
        let mark = cp.passed_over.clone().expect("marked");
        assert_eq!(
            (mark.version.as_str(), mark.available.as_slice()),
            ("1", &["2".to_string()][..])
        );
        let label = |cp: &crate::Checkpoint| {
            crate::ops::stuck::diagnose(cp, cp.updated_at, Duration::from_secs(60), None)
                .map(|s| s.label())
        };
        assert_eq!(label(&cp), Some("version-missing"));
        // Migrated to version 2: the mark goes, and version 2 runs it.
        crate::ops::plan::migrate(&*store, "r", &v2, &[], "ada", &crate::SystemClock)
            .await
            .expect("migrates");
        let cp = store.load("r").await.unwrap().unwrap();
        assert!(cp.passed_over.is_none());
        assert_eq!(label(&cp), None);
        assert!(matches!(
            worker.run_one("r", "agent", Some("2"), cp.version).await,
            Verdict::Completed
        ));
        // A stale mark of another version than the run records is not shown.
        let mut stale = store.load("r").await.unwrap().unwrap();
        stale.status = crate::RunStatus::Pending;
        stale.passed_over = Some(Box::new(crate::PassedOver::new(
            "1",
            &[],
            "w",
            stale.updated_at,
        )));
        assert_eq!(label(&stale), None);

        // Started by name alone: any version runs it, and pins it.
        crate::start(&*store, "agent", "named", serde_json::json!({}), false)
            .await
            .expect("starts");
        // Starting it again with steps and a version is the same start.
        assert!(
            !crate::start_listed(&*store, &v1, "named", serde_json::json!({}))
                .await
                .expect("the same start")
        );
        assert!(matches!(
            worker.run_one("named", "agent", None, 1).await,
            Verdict::Completed
        ));
        let origin = store
            .load("named")
            .await
            .unwrap()
            .unwrap()
            .origin
            .expect("pinned");
        assert_eq!(origin.version.as_deref(), Some("2"));

        // Found due with no version, then pinned to version 1 by another
        // worker before this one (which has only version 2) loads it: a
        // missed claim, looked at again, never a failed run.
        crate::start(&*store, "agent", "raced", serde_json::json!({}), false)
            .await
            .expect("starts");
        let mut cp = store.load("raced").await.unwrap().unwrap();
        let seen = cp.version;
        cp.origin = Some(crate::Origin::listed(v1.step_names()).versioned(Some("1")));
        store
            .save(SaveRequest::new(&cp, Some(seen)).head_only())
            .await
            .expect("pinned elsewhere");
        assert!(matches!(
            worker.run_one("raced", "agent", None, seen).await,
            Verdict::Missed
        ));
        let cp = store.load("raced").await.unwrap().unwrap();
        assert_eq!(cp.status, crate::RunStatus::Pending);
    }

    /// A run that another worker finished between this worker's look and
    /// its load is a missed claim, not one more completed run, for listed
    /// workflows and durable functions alike; a due run is still run.
    #[tokio::test]
    async fn a_run_finished_elsewhere_is_missed_not_completed() {
        let store = Arc::new(crate::MemoryStore::new());
        let listed = crate::Workflow::builder("listed")
            .step("a", |_, _| async {
                crate::update(serde_json::json!({"a": 1}))
            })
            .build()
            .expect("a workflow");
        let registry = Registry::new()
            .workflow(listed.clone())
            .durable("durable", |_ctx: DurableCtx<'static, SharedStore>| async {
                Ok::<_, Error>(7u32)
            });
        crate::run("done-listed", &listed, &*store)
            .await
            .expect("runs");
        Runner::new(&*store)
            .durable("done-durable", "durable", |_| async {
                Ok::<_, Error>(7u32)
            })
            .await
            .expect("runs");
        let worker = Worker::new(store.clone(), registry);
        assert!(matches!(
            worker.run_one("done-listed", "listed", None, 1).await,
            Verdict::Missed
        ));
        assert!(matches!(
            worker.run_one("done-durable", "durable", None, 1).await,
            Verdict::Missed
        ));
        // A run deleted after the look is not run afresh.
        assert!(matches!(
            worker.run_one("deleted", "listed", None, 1).await,
            Verdict::Missed
        ));
        assert!(matches!(
            worker.run_one("deleted", "durable", None, 1).await,
            Verdict::Missed
        ));
        assert!(store.load("deleted").await.expect("loads").is_none());
        crate::start(&*store, "listed", "due", serde_json::json!({}), false)
            .await
            .expect("starts");
        assert!(matches!(
            worker.run_one("due", "listed", None, 1).await,
            Verdict::Completed
        ));
    }
}
