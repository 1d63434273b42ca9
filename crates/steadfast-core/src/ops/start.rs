//! Recording a run as pending for a worker to pick up: [`start`],
//! [`start_listed`], [`start_steps`], and [`start_with`] with
//! [`StartOptions`] (durable or listed, priority and partition). A start is
//! safe to repeat: the same start again changes nothing, another is refused.

use serde_json::Value;

use crate::engine::workflow::Workflow;
use crate::engine::{store_error, Runner};
use crate::record::checkpoint::{Checkpoint, Origin, RunStatus};
use crate::record::error::Error;
use crate::record::ids::validate_run_id;
use crate::record::keys::{INPUT_KEY, RESERVED_KEYS, START_KEY};
use crate::record::queue::Queue;
use crate::record::state::State;
use crate::store::{SaveRequest, Store};

/// Records a new run with `start` when `run_id` is not in the store yet, as
/// the language bindings do before they run a workflow with an input; a run
/// that is there is left as it is (it resumes with the input it was started
/// with, and the input given now is neither used nor compared: [`start`] is
/// the call that refuses another input). Returns whether `start` was called.
pub async fn start_if_new<'a, S, F, Fut>(
    store: &'a S,
    run_id: &str,
    start: F,
) -> Result<bool, Error>
where
    S: Store + ?Sized,
    F: FnOnce(&'a S) -> Fut,
    Fut: std::future::Future<Output = Result<bool, Error>>,
{
    let there = store
        .load(run_id)
        .await
        .map_err(|e| store_error(run_id, "load", e))?;
    if there.is_some() {
        return Ok(false);
    }
    start(store).await?;
    Ok(true)
}

/// Records run `run_id` of `workflow` as `pending`, for a worker to pick up.
/// Returns whether it was recorded now: starting again with the same
/// workflow and input finds it there and returns `false`, so that starting
/// is safe to repeat.
///
/// A run of that id that exists with another workflow, or was started
/// with another input, is refused with [`Error::InvalidInput`] and left
/// as it is. `start` names the workflow only; [`start_listed`] also
/// records the steps of a listed workflow, so that a worker or a `run`
/// with other steps is refused before any step runs
/// ([`Error::WorkflowChanged`]).
///
/// `input` is the run's first state: for a listed workflow it must be a JSON
/// object (or null, for none); a durable function reads it back with
/// [`DurableCtx::input`](crate::DurableCtx::input). A listed workflow's input is also kept whole under
/// the state key [`START_KEY`], so that [`rewind`](crate::ops::rewind) and
/// [`fork`](crate::ops::fork) can rebuild the state before a step that
/// overwrote one of its values; an input may not use the engine's keys
/// (`__start`, `__input`, `__result`) itself.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{start, Error, MemoryStore, RunStatus, Store};
///
/// let store = MemoryStore::new();
/// let input = json!({"url": "https://example.com"});
/// assert!(start(&store, "ingest", "r1", input.clone(), false).await?);
/// assert!(!start(&store, "ingest", "r1", input, false).await?);
/// let other = start(&store, "ingest", "r1", json!({"url": "elsewhere"}), false).await;
/// assert!(matches!(other, Err(Error::InvalidInput { .. })));
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
    start_run(
        store,
        workflow,
        None,
        run_id,
        input,
        durable,
        &Queue::default(),
    )
    .await
}

/// [`start`] for a listed workflow, recording its step names with the run:
/// a worker or a `run` given the same workflow name with other steps
/// refuses the run as changed code ([`Error::WorkflowChanged`], with the
/// same override as for a run with completed steps), and a start of the
/// same id with other steps is refused.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{run, start_listed, update, Error, MemoryStore, Workflow};
///
/// let wf = |steps: &[&str]| {
///     let mut b = Workflow::builder("ingest");
///     for s in steps {
///         b = b.step(*s, |_, _| async { update(json!({})) });
///     }
///     b.build().unwrap()
/// };
/// let store = MemoryStore::new();
/// assert!(start_listed(&store, &wf(&["fetch", "write"]), "r1", json!(null)).await?);
/// // Other steps under the same name: refused, nothing runs.
/// let other = run("r1", &wf(&["drop-tables"]), &store).await;
/// assert!(matches!(other, Err(Error::WorkflowChanged { at: 0, .. })));
/// assert!(run("r1", &wf(&["fetch", "write"]), &store).await?.completed().is_some());
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn start_listed<S: Store + ?Sized>(
    store: &S,
    workflow: &Workflow,
    run_id: &str,
    input: Value,
) -> Result<bool, Error> {
    start_with(
        store,
        workflow.name(),
        run_id,
        input,
        &StartOptions::new().listed(workflow),
    )
    .await
}

/// [`start_listed`] by the workflow's name and its step names, for
/// bindings that hold a workflow's definition without a [`Workflow`].
pub async fn start_steps<S: Store + ?Sized>(
    store: &S,
    workflow: &str,
    steps: &[&str],
    run_id: &str,
    input: Value,
) -> Result<bool, Error> {
    start_run(
        store,
        workflow,
        Some(Origin::listed(steps.iter().copied())),
        run_id,
        input,
        false,
        &Queue::default(),
    )
    .await
}

/// How [`start_with`] starts a run: as a durable function or a listed
/// workflow with its step names, and its place in the workers' queue.
///
/// ```
/// use steadfast_core::StartOptions;
/// let opts = StartOptions::new().priority(5).partition("tenant-7");
/// assert_eq!(opts.queue.priority, 5);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StartOptions {
    /// Whether the workflow is a durable function (its input kept whole).
    pub durable: bool,
    /// A listed workflow's step names, recorded as [`start_listed`] does.
    pub steps: Option<Vec<String>>,
    /// The version of the listed workflow
    /// ([`Workflow::with_version`]), recorded with the steps: the run
    /// resumes only under that version. Checked, but recorded only with
    /// `steps` (a durable function's run records no steps nor version).
    pub version: Option<String>,
    /// Its priority and partition ([`Queue`]).
    pub queue: Queue,
}

impl StartOptions {
    /// A listed workflow's run, no steps recorded, priority 0, no partition.
    pub fn new() -> Self {
        Self::default()
    }

    /// The run of a durable function.
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// The run of listed workflow `workflow`, its step names and version
    /// recorded.
    pub fn listed(mut self, workflow: &Workflow) -> Self {
        self.steps = Some(workflow.step_names().map(str::to_string).collect());
        self.version = workflow.version().map(str::to_string);
        self
    }

    /// Claimed before runs of lower priority (-1000 to 1000; default 0).
    pub fn priority(mut self, priority: i32) -> Self {
        self.queue.priority = priority;
        self
    }

    /// Taking turns with the runs of other partitions of its priority.
    pub fn partition(mut self, key: impl Into<String>) -> Self {
        self.queue.partition = Some(key.into());
        self
    }
}

/// [`start`] with [`StartOptions`]: a durable function or a listed
/// workflow, and a priority and partition that workers claim by: higher
/// priorities first, and within a priority the partitions in turn, so one
/// tenant's ten thousand runs do not hold back another's ten
/// ([`fair_order`](crate::fair_order)). A start of an existing id with
/// another priority or partition is refused like one with another input.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{start_with, MemoryStore, StartOptions, Store};
///
/// let store = MemoryStore::new();
/// let urgent = StartOptions::new().priority(10).partition("acme");
/// assert!(start_with(&store, "ingest", "r1", json!({}), &urgent).await?);
/// assert_eq!(store.load("r1").await?.unwrap().queue.unwrap().priority, 10);
/// assert!(start_with(&store, "ingest", "r1", json!({}), &StartOptions::new()).await.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub async fn start_with<S: Store + ?Sized>(
    store: &S,
    workflow: &str,
    run_id: &str,
    input: Value,
    options: &StartOptions,
) -> Result<bool, Error> {
    options
        .queue
        .check()
        .map_err(|reason| Error::InvalidInput {
            what: format!("the start of run {run_id:?}"),
            reason,
        })?;
    if let Some(v) = &options.version {
        crate::record::version::check_version("the workflow's version", v).map_err(|reason| {
            Error::InvalidInput {
                what: format!("the start of run {run_id:?}"),
                reason,
            }
        })?;
    }
    let origin = options
        .steps
        .as_ref()
        .filter(|_| !options.durable)
        .map(|names| {
            Origin::listed(names.iter().map(String::as_str)).versioned(options.version.as_deref())
        });
    start_run(
        store,
        workflow,
        origin,
        run_id,
        input,
        options.durable,
        &options.queue,
    )
    .await
}

async fn start_run<S: Store + ?Sized>(
    store: &S,
    workflow: &str,
    origin: Option<Origin>,
    run_id: &str,
    input: Value,
    durable: bool,
    queue: &Queue,
) -> Result<bool, Error> {
    validate_run_id(run_id)?;
    crate::record::ids::check_step_name(workflow).map_err(|reason| Error::InvalidWorkflow {
        workflow: workflow.to_string(),
        reason,
    })?;
    let given = input_of(&input, durable);
    let state: State = match (durable, input) {
        (false, Value::Object(map)) => {
            if let Some(k) = RESERVED_KEYS
                .iter()
                .chain([&crate::record::state::STEP_KEY])
                .find(|k| map.contains_key(**k))
            {
                return Err(Error::InvalidInput {
                    what: format!("the input of run {run_id:?}"),
                    reason: format!("the key {k:?} is the engine's; rename it"),
                });
            }
            let mut state = map.clone();
            if !map.is_empty() {
                state.insert(START_KEY.into(), Value::Object(map));
            }
            state
        }
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
    cp.origin = origin.clone();
    cp.queue = Some(queue.clone()).filter(|q| !q.is_default());
    // A run deleted between a conflict and the look at it: start again.
    for _ in 0..3 {
        match store.save(SaveRequest::new(&cp, None)).await {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == crate::StoreErrorKind::Conflict => {
                let existing = store
                    .load(run_id)
                    .await
                    .map_err(|e| store_error(run_id, "load of the run that exists", e))?;
                if let Some(existing) = existing {
                    return same_start(&existing, workflow, origin.as_ref(), &given, durable)
                        .and_then(|()| same_queue(&existing, queue))
                        .map(|()| false);
                }
            }
            Err(e) => return Err(store_error(run_id, "start", e)),
        }
    }
    Err(store_error(
        run_id,
        "start",
        crate::StoreError::Conflict {
            run_id: run_id.to_string(),
            expected: None,
            found: None,
        },
    ))
}

/// The input a run was started with, as its state keeps it: a durable
/// function's under [`INPUT_KEY`] (none: `null`), a listed workflow's whole
/// under [`START_KEY`] (none: it started with none, `{}`).
fn recorded_input(cp: &Checkpoint, durable: bool) -> Value {
    let (key, none) = if durable {
        (INPUT_KEY, Value::Null)
    } else {
        (START_KEY, Value::Object(Default::default()))
    };
    cp.state.get(key).cloned().unwrap_or(none)
}

/// `input` as [`recorded_input`] reads it back: a listed workflow's `null`
/// is no input, `{}`.
fn input_of(input: &Value, durable: bool) -> Value {
    match input {
        Value::Null if !durable => Value::Object(Default::default()),
        other => other.clone(),
    }
}

/// Refuses a start of `existing` with another workflow, other steps or
/// another input than it was started with. Steps are compared when both
/// starts named them (a record written before runs kept an origin names
/// none).
fn same_start(
    existing: &Checkpoint,
    workflow: &str,
    origin: Option<&Origin>,
    input: &Value,
    durable: bool,
) -> Result<(), Error> {
    let refuse = |what: String| {
        Error::InvalidInput {
        what: format!("the start of run {:?}", existing.run_id),
        reason: format!("it exists already with {what}; it was left as it is (start it under another id, or delete it first)"),
    }
    };
    if existing.workflow != workflow {
        return Err(refuse(format!(
            "workflow {:?}, not {workflow:?}",
            existing.workflow
        )));
    }
    if let (Some(had), Some(now)) = (&existing.origin, origin) {
        if !had.same_steps(now) {
            return Err(refuse(format!(
                "other steps ({} step(s), fingerprint {}; these are {} step(s), fingerprint {})",
                had.steps, had.steps_sha256, now.steps, now.steps_sha256
            )));
        }
        // A run started without a version takes any (and is pinned when it
        // first runs); one started under a version, only that version.
        if had.version.is_some() && had.version != now.version {
            let name = |v: &Option<String>| {
                v.as_deref()
                    .map_or("no version".to_string(), |v| format!("version {v:?}"))
            };
            return Err(refuse(format!(
                "{} of its workflow, not {}",
                name(&had.version),
                name(&now.version)
            )));
        }
    }
    if recorded_input(existing, durable) != *input {
        return Err(refuse("another input".into()));
    }
    Ok(())
}

/// Refuses a start of `existing` in another place of the queue.
fn same_queue(existing: &Checkpoint, queue: &Queue) -> Result<(), Error> {
    let had = existing.queue.clone().unwrap_or_default();
    if had != *queue {
        return Err(Error::InvalidInput {
            what: format!("the start of run {:?}", existing.run_id),
            reason: format!(
                "it exists already with priority {} and partition {:?}, not {} and {:?}; it was left as it is",
                had.priority, had.partition, queue.priority, queue.partition
            ),
        });
    }
    Ok(())
}
