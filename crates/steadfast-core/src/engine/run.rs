//! The run loop of a listed workflow: load, verify, run the remaining steps,
//! checkpoint after each.

use crate::engine::durable::DurableCtx;
use crate::engine::session::Session;
use crate::engine::workflow::{StepKind, Workflow};
use crate::engine::{store_error, Runner};
use crate::record::checkpoint::{Checkpoint, RunStatus};
use crate::record::error::Error;
use crate::record::ids::validate_run_id;
use crate::record::outcome::{rejected, Event, Outcome};
use crate::store::Store;
use serde_json::Value;
use tracing::Instrument;

/// Starts or resumes run `run_id` of `workflow` on `store` with default options.
///
/// Loads the run's checkpoint (none: a fresh start), checks that the steps it
/// records as done are the first steps of `workflow`, runs the remaining steps in
/// order and saves a checkpoint after each. A run that is already complete
/// returns its final state without running anything.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{run, update, MemoryStore, Outcome, Workflow};
///
/// let wf = Workflow::builder("count")
///     .step("one", |_, _| async { update(json!({"one": 1})) })
///     .step("two", |_, _| async { update(json!({"two": 2})) })
///     .build()?;
/// let store = MemoryStore::new();
/// let Outcome::Completed(state) = run("run-1", &wf, &store).await? else { unreachable!() };
/// assert_eq!(serde_json::Value::Object(state), json!({"one": 1, "two": 2}));
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn run<S: Store + ?Sized>(
    run_id: &str,
    workflow: &Workflow,
    store: &S,
) -> Result<Outcome, Error> {
    Runner::new(store).run(run_id, workflow).await
}

impl<S: Store + ?Sized> Runner<'_, S> {
    /// Starts or resumes `run_id`. See [`run`].
    ///
    /// The call is a `tracing` span `steadfast.run` (run id, workflow,
    /// outcome); each step attempt inside it a span `steadfast.step` (step,
    /// index, attempt, outcome, duration), each save a debug span
    /// `steadfast.store`.
    pub async fn run(&self, run_id: &str, workflow: &Workflow) -> Result<Outcome, Error> {
        let span = tracing::info_span!(
            "steadfast.run",
            run_id,
            workflow = workflow.name(),
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let began = std::time::Instant::now();
        let out = self
            .run_listed(run_id, workflow)
            .instrument(span.clone())
            .await;
        span.record("outcome", crate::engine::label(&out));
        span.record("duration_ms", began.elapsed().as_millis() as u64);
        out
    }

    async fn run_listed(&self, run_id: &str, workflow: &Workflow) -> Result<Outcome, Error> {
        validate_run_id(run_id)?;
        self.check_options()?;
        let loaded = self
            .store_ref()
            .load(run_id)
            .instrument(tracing::debug_span!("steadfast.store", op = "load", run_id))
            .await
            .map_err(|e| store_error(run_id, "load", e))?;
        let (cp, expected, relabelled) = match loaded {
            None => {
                self.check_due_absent(run_id)?;
                let mut cp = Checkpoint::new(run_id, workflow.name(), self.now());
                cp.origin = Some(
                    crate::Origin::listed(workflow.step_names()).versioned(workflow.version()),
                );
                (cp, None, false)
            }
            Some(cp) => {
                self.check_due(&cp)?;
                let cp = match crate::engine::family::orphaned(self.store_ref(), &cp, &*self.clock)
                    .await
                    .map_err(|e| store_error(run_id, "look at the parent", e))?
                {
                    Some(cancelled) => cancelled,
                    None => cp,
                };
                let version = cp.version;
                let (names, name) = (cp.completed.clone(), cp.workflow.clone());
                let cp = self.verify(cp, workflow)?;
                let had_input = cp.state.contains_key(crate::record::keys::INPUT_KEY);
                let cp = match listed_input(cp) {
                    Ok(cp) => cp,
                    Err(refused) => {
                        let (cp, e) = *refused;
                        return Err(self.refuse_input(cp, workflow, e).await);
                    }
                };
                // An input made the first state is saved whole, as new names are.
                let converted = had_input && !cp.state.contains_key(crate::record::keys::INPUT_KEY);
                let relabelled = cp.completed != names || cp.workflow != name || converted;
                (cp, Some(version), relabelled)
            }
        };
        let mut cp = cp;
        self.give_budget(&mut cp, Some(workflow.budget()));
        if cp.status == RunStatus::Cancelled {
            return Err(crate::record::error::cancelled(&cp));
        }
        for (index, step) in cp.completed.iter().enumerate() {
            self.emit(Event::Skipped { index, step });
        }
        if cp.status == RunStatus::Rejected {
            return Ok(rejected(&cp).into());
        }

        if cp.status == RunStatus::Completed || cp.next >= workflow.steps().len() {
            return Ok(Outcome::Completed(cp.state));
        }
        let created_at = cp.created_at;
        match self.run_steps(cp, expected, workflow, relabelled).await {
            Err(e) => Err(self.explain_conflict(run_id, created_at, e).await),
            done => done,
        }
    }

    /// Records pending run `cp` as failed at its first step for input `e`
    /// it cannot start with (so that a parent waiting for it hears of it),
    /// and returns `e`.
    async fn refuse_input(&self, cp: Checkpoint, workflow: &Workflow, e: Error) -> Error {
        let now = self.now();
        let first = workflow.steps().first().map_or("", |s| s.name());
        let expected = cp.version;
        let mut session = Session::new(cp, Some(expected), workflow.steps().len(), 0);
        session.cp.status = RunStatus::Failed;
        session.cp.updated_at = now;
        session.cp.error = Some(crate::record::checkpoint::StepFailure::new(
            0,
            first,
            e.to_string(),
            1,
            true,
            now,
        ));
        if let Err(err) = session.save(self, None).await {
            tracing::warn!(run_id = %session.cp.run_id, error = %err, "could not record that the run's input does not fit its workflow");
        }
        e
    }

    /// Runs the steps from `cp.next` on.
    async fn run_steps(
        &self,
        cp: Checkpoint,
        expected: Option<u64>,
        workflow: &Workflow,
        relabelled: bool,
    ) -> Result<Outcome, Error> {
        // The listed steps as a durable function over the same record: each
        // step, gate and timer is the context's, in order.
        let total = workflow.steps().len();
        let start = cp.next;
        let mut session = Session::new(cp, expected, total, start);
        session.claim(self).await?;
        if relabelled && self.lease.is_none() {
            // The new names (or a child's input made its state) are saved
            // whole before a step appends to them (a claim's save does it
            // when leases are on): stores that keep deltas would otherwise
            // keep the old record.
            session.save(self, None).await.map_err(|e| {
                store_error(run_id_of(&session), "save of the relabelled record", e)
            })?;
        }
        let ctx = DurableCtx::new(self.reborrow(), session);
        for step in &workflow.steps()[start..] {
            let done = match step.kind() {
                StepKind::Run(_) => ctx.listed_step(step).await,
                StepKind::Gate {
                    timeout,
                    on_timeout,
                } => ctx.listed_gate(step, *timeout, *on_timeout).await,
                StepKind::Sleep(d) => ctx.listed_sleep(step, *d).await,
                StepKind::Signal { signal, timeout } => {
                    ctx.listed_signal(step, signal, *timeout).await
                }
                StepKind::Child { workflow } => ctx.listed_child(step, workflow).await,
            };
            match done {
                Ok(()) => {}
                Err(Error::Suspended(suspension)) => return Ok(suspension.into()),
                Err(e) => return Err(e),
            }
        }
        Ok(Outcome::Completed(ctx.into_state().await))
    }
}

/// A run started with its input whole under `__input` (a child run, which
/// its parent starts without knowing its kind) taken up by a listed
/// workflow before its first step: the input, a JSON object, becomes the
/// first state, as [`start`](crate::start) makes it. Another input fails
/// with [`Error::InvalidInput`], and the run keeps it as it was.
fn listed_input(mut cp: Checkpoint) -> Result<Checkpoint, Box<(Checkpoint, Error)>> {
    use crate::record::keys::{INPUT_KEY, RESERVED_KEYS, START_KEY};
    if cp.next > 0
        || matches!(
            cp.status,
            RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
        )
    {
        return Ok(cp);
    }
    let refuse = |reason: String| Error::InvalidInput {
        what: format!("the input of run {:?}", cp.run_id),
        reason,
    };
    let problem = match cp.state.get(INPUT_KEY) {
        None => return Ok(cp),
        Some(Value::Object(map)) => RESERVED_KEYS
            .iter()
            .chain([&crate::record::state::STEP_KEY])
            .find(|k| map.contains_key(**k))
            .map(|k| refuse(format!("the key {k:?} is the engine's; rename it"))),
        Some(Value::Null) => None,
        Some(other) => Some(refuse(format!(
            "a listed workflow's input must be a JSON object, not {}",
            crate::engine::workflow::json_kind(other)
        ))),
    };
    if let Some(e) = problem {
        // Kept as it was, for whoever looks at the failed run.
        return Err(Box::new((cp, e)));
    }
    let map = match cp.state.remove(INPUT_KEY) {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    if !map.is_empty() {
        cp.state
            .insert(START_KEY.into(), Value::Object(map.clone()));
    }
    cp.state.extend(map);
    Ok(cp)
}

fn run_id_of(s: &Session) -> &str {
    &s.cp.run_id
}
