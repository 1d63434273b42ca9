//! Child runs started by a durable function's steps (and a listed
//! workflow's child steps): started once, waited for without a process,
//! their results recorded as the parent's steps.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::DurableCtx;
use crate::engine::family::{
    parent_retries, retry_child, start_child, CHILDREN_RECHECK, MAX_CHILD_ATTEMPTS,
};
use crate::engine::session::Session;
use crate::engine::store_error;
use crate::engine::workflow::{RetryPolicy, Step};
use crate::record::checkpoint::{RunStatus, StepRecord, Wait};
use crate::record::error::{Error, StepError};
use crate::record::family::{child_failure, child_id, child_result, ended, ParentLink, CHILD_KEY};
use crate::record::outcome::{Event, Suspension};
use crate::record::state::Update;
use crate::store::Store;

/// The most children one call of [`DurableCtx::children`] starts: 1,000.
pub const MAX_CHILDREN: usize = 1000;

/// One child run for [`DurableCtx::children`]: the parent's step that
/// records its result, the workflow it runs (by the name a worker's
/// [`Registry`](crate::Registry) knows it by), and its input.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    name: String,
    workflow: String,
    input: Result<Value, String>,
}

impl ChildSpec {
    /// Step `name` starts a run of `workflow` with `input` (for a durable
    /// function, [`DurableCtx::input`]; for a listed workflow, a JSON object
    /// that becomes its first state).
    pub fn new(
        name: impl Into<String>,
        workflow: impl Into<String>,
        input: impl Serialize,
    ) -> Self {
        ChildSpec {
            name: name.into(),
            workflow: workflow.into(),
            input: serde_json::to_value(input).map_err(|e| e.to_string()),
        }
    }

    /// The parent's step name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// How a parent runs its children: how many run at once, and how often a
/// failed one is tried.
#[derive(Clone, Copy, Debug)]
pub struct ChildOptions {
    at_once: usize,
    retry: RetryPolicy,
}

impl Default for ChildOptions {
    fn default() -> Self {
        ChildOptions {
            at_once: 10,
            retry: RetryPolicy::none(),
        }
    }
}

impl ChildOptions {
    /// At most 10 children under way at once; a failed child fails the
    /// step at once (its own steps retried as its workflow says).
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` children under way at once (1 to [`MAX_CHILDREN`]); the
    /// rest start as earlier ones end.
    pub fn at_once(mut self, n: usize) -> Self {
        self.at_once = n;
        self
    }

    /// A failed child is retried (its run resumed at the step that failed)
    /// while `policy` allows attempts (at most
    /// [`MAX_CHILD_ATTEMPTS`](crate::MAX_CHILD_ATTEMPTS)); then the parent's
    /// step fails. The policy's delays do not apply: a child is retried when
    /// its parent next looks at it. A child whose step failed for good (a
    /// terminal error), or that was rejected or cancelled, is not retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    fn check(&self) -> Result<(), String> {
        if !(1..=MAX_CHILDREN).contains(&self.at_once) {
            return Err(format!(
                "at_once is {}; it must lie in 1..={MAX_CHILDREN}",
                self.at_once
            ));
        }
        if self.retry.max_attempts() > MAX_CHILD_ATTEMPTS {
            return Err(format!(
                "the retry policy allows {} attempts; a child is tried at most {MAX_CHILD_ATTEMPTS} times",
                self.retry.max_attempts()
            ));
        }
        self.retry.check()
    }
}

impl<'s, S: Store + ?Sized> DurableCtx<'s, S> {
    /// Runs `workflow` as a child run of this one, with `input`, and
    /// returns its result ([`child_with`](Self::child_with) with the default
    /// options).
    pub async fn child<T: DeserializeOwned>(
        &self,
        name: impl Into<String>,
        workflow: &str,
        input: impl Serialize,
    ) -> Result<T, Error> {
        self.child_with(name, workflow, input, ChildOptions::new())
            .await
    }

    /// Runs one child; see [`children`](Self::children).
    pub async fn child_with<T: DeserializeOwned>(
        &self,
        name: impl Into<String>,
        workflow: &str,
        input: impl Serialize,
        options: ChildOptions,
    ) -> Result<T, Error> {
        let mut out = self
            .children([ChildSpec::new(name, workflow, input)], options)
            .await?;
        out.pop().ok_or_else(|| Error::InvalidInput {
            what: "a child run".into(),
            reason: "no result came back".into(),
        })
    }

    /// Starts child runs, waits for them, and returns their results in the
    /// order given.
    ///
    /// Each child is a run of its own, with the id
    /// [`child_id`](crate::child_id)`(this run, step name)`, recorded
    /// pending for a worker whose [`Registry`](crate::Registry) has its
    /// workflow (`steadfast worker`, [`Worker`](crate::Worker)). At most
    /// [`at_once`](ChildOptions::at_once) are under way at a time. While
    /// any is, this run stops ([`Outcome::Waiting`](crate::Outcome::Waiting)
    /// at the first unfinished child's step) and holds no process or worker
    /// slot; a child's end marks it due, and a worker resumes it. Each
    /// child's result is recorded as a step of this run when it is found
    /// ended (in the order they end), so calling the run again returns it
    /// without running the child again, and the child is started once
    /// whatever crashes.
    ///
    /// A child that failed, was rejected or was cancelled fails the step
    /// that started it ([`Error::StepFailed`], naming the child and its
    /// error), after the retries [`ChildOptions::retry`] allows. Cancelling
    /// this run cancels its children under way.
    ///
    /// Errors before anything starts: a step name used before in this call
    /// or starting with `__`, a workflow name that is not a name, an input
    /// that cannot be stored, more than [`MAX_CHILDREN`] children, options
    /// out of range, or another step of this call under way (a wait must
    /// not stand beside a running step).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use serde_json::{json, Value};
    /// use steadfast_core::{durable, ChildOptions, ChildSpec, DurableCtx, MemoryStore, Outcome, StepError};
    ///
    /// let store = MemoryStore::new();
    /// let parent = |ctx: DurableCtx<'static, MemoryStore>| async move {
    ///     let docs = ["a", "b", "c"];
    ///     let specs = docs.iter().map(|d| ChildSpec::new(format!("summary-{d}"), "summarise", json!(d)));
    ///     let summaries: Vec<String> = ctx.children(specs, ChildOptions::new().at_once(2)).await?;
    ///     Ok::<_, steadfast_core::Error>(summaries.join(" "))
    /// };
    /// let summarise = |ctx: DurableCtx<'static, MemoryStore>| async move {
    ///     let doc = ctx.input().await.unwrap_or(Value::Null);
    ///     ctx.step("summarise", move || {
    ///         let doc = doc.clone();
    ///         async move { Ok::<_, StepError>(format!("<{}>", doc.as_str().unwrap_or(""))) }
    ///     })
    ///     .await
    /// };
    /// // The parent starts two children and waits, holding nothing.
    /// assert!(matches!(durable("job", &store, "parent", parent).await?, Outcome::Waiting { .. }));
    /// // A worker would run them; here they run by hand, then the parent again.
    /// for doc in ["a", "b", "c"] {
    ///     let id = steadfast_core::child_id("job", &format!("summary-{doc}"));
    ///     durable(&id, &store, "summarise", summarise).await?;
    ///     durable("job", &store, "parent", parent).await?;
    /// }
    /// let done = durable("job", &store, "parent", parent).await?;
    /// assert_eq!(done.completed().as_deref(), Some("<a> <b> <c>"));
    /// # Ok::<(), steadfast_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn children<T: DeserializeOwned>(
        &self,
        specs: impl IntoIterator<Item = ChildSpec>,
        options: ChildOptions,
    ) -> Result<Vec<T>, Error> {
        let specs: Vec<ChildSpec> = specs.into_iter().collect();
        let invalid = |reason: String| self.invalid(reason);
        if specs.len() > MAX_CHILDREN {
            return Err(invalid(format!(
                "{} children in one call; at most {MAX_CHILDREN}",
                specs.len()
            )));
        }
        options
            .check()
            .map_err(|r| invalid(format!("the children's options: {r}")))?;
        let mut inputs = Vec::with_capacity(specs.len());
        for spec in &specs {
            self.check_user_name(&spec.name)?;
            inputs.push(checked_input(spec)?);
        }
        let values = self.family(&specs, inputs, options).await?;
        let s = self.shared.session.lock().await;
        specs
            .iter()
            .zip(values)
            .map(|(spec, v)| self.decode(&s.cp.run_id, 0, &spec.name, v))
            .collect()
    }

    /// One listed child step: the run's state (without the engine's keys)
    /// is the child's input, and the child's result is merged into the
    /// state under the step's name.
    pub(crate) async fn listed_child(&self, step: &Step, workflow: &str) -> Result<(), Error> {
        let input = {
            let s = self.shared.session.lock().await;
            let mut state = s.cp.state.clone();
            state.retain(|k, _| !crate::record::keys::RESERVED_KEYS.contains(&k.as_str()));
            Value::Object(state)
        };
        let spec = ChildSpec::new(step.name(), workflow, input);
        let checked = checked_input(&spec)?;
        let options = ChildOptions::new().retry(*step.retry_policy());
        self.family(&[spec], vec![checked], options).await.map(drop)
    }

    /// The children's results, in order, once every one is recorded; or
    /// the run stopped waiting for them.
    async fn family(
        &self,
        specs: &[ChildSpec],
        inputs: Vec<Value>,
        options: ChildOptions,
    ) -> Result<Vec<Value>, Error> {
        let runner = self.runner();
        let mut guard = self.shared.session.lock().await;
        let s = &mut *guard;
        for spec in specs {
            if !s.seen.insert(spec.name.clone()) {
                return Err(Error::InvalidWorkflow {
                    workflow: s.cp.workflow.clone(),
                    reason: format!(
                        "step name {:?} is used twice in one run; use DurableCtx::numbered",
                        spec.name
                    ),
                });
            }
        }
        // Children end in any order: the group's records are the next
        // ones, whatever their order.
        let mut values: HashMap<String, Value> = HashMap::new();
        let group: std::collections::HashSet<&str> =
            specs.iter().map(|c| c.name.as_str()).collect();
        while s.cursor < s.cp.next && group.contains(s.cp.completed[s.cursor].as_str()) {
            let name = s.cp.completed[s.cursor].clone();
            let value = s.cp.state.get(&name).cloned().unwrap_or(Value::Null);
            runner.emit(Event::Skipped {
                index: s.cursor,
                step: &name,
            });
            values.insert(name, value);
            s.cursor += 1;
        }
        let missing = specs
            .iter()
            .find(|c| !values.contains_key(&c.name))
            .map(|c| c.name.clone());
        let Some(first) = missing else {
            return Ok(in_order(specs, values));
        };
        if s.cursor < s.cp.next {
            self.diverged(s, Some(&first))?;
        }
        self.alone(s, &first)?;
        let parent = s.cp.run_id.clone();
        let created = s.cp.created_at;
        let store = &*runner.store;
        let mut running: Vec<String> = Vec::new();
        for (spec, input) in specs.iter().zip(inputs) {
            if values.contains_key(&spec.name) {
                continue;
            }
            s.renew_if_due(runner).await?;
            let id = child_id(&parent, &spec.name);
            let link = ParentLink::new(&parent, &spec.name, created);
            let op = |what: &str| format!("{what} of child run {id:?} (step {:?})", spec.name);
            let found = store
                .load(&id)
                .await
                .map_err(|e| store_error(&parent, &op("load"), e))?;
            let child = match found {
                Some(child) => child,
                // Children start in the order given: once one cannot
                // start yet, none after it has started.
                None if running.len() >= options.at_once => break,
                None => {
                    let started = start_child(
                        store,
                        &id,
                        &spec.workflow,
                        input,
                        &link,
                        runner.now(),
                        s.cp.queue.as_ref(),
                    )
                    .await
                    .map_err(|e| store_error(&parent, &op("start"), e))?;
                    match started {
                        None => {
                            tracing::info!(run_id = %parent, child = %id, workflow = %spec.workflow, "started a child run");
                            runner.emit(Event::Started {
                                index: s.cp.next,
                                step: &spec.name,
                                attempt: 1,
                            });
                            running.push(id);
                            continue;
                        }
                        Some(child) => child,
                    }
                }
            };
            if ParentLink::of(&child.state).as_ref() != Some(&link)
                || child.workflow != spec.workflow
            {
                let err = StepError::terminal(format!(
                    "run {id:?} exists, and is not this step's child run of workflow {:?} (it is a run of {:?}{}); delete it, or name the step otherwise",
                    spec.workflow,
                    child.workflow,
                    match ParentLink::of(&child.state) {
                        Some(l) if l.run == parent && l.step == spec.name => {
                            format!(", child of an earlier run {parent:?} created at {}", l.created)
                        }
                        Some(l) => format!(", child of step {:?} of run {:?}", l.step, l.run),
                        None => String::new(),
                    }
                ));
                return Err(self.give_up(s, &spec.name, 1, err).await);
            }
            let attempt = parent_retries(&child).saturating_add(1);
            match child.status {
                RunStatus::Completed => {
                    let value = child_result(&child);
                    self.record_child(s, &spec.name, &id, value.clone(), attempt, &child)
                        .await?;
                    values.insert(spec.name.clone(), value);
                }
                RunStatus::Failed => {
                    let terminal = child.error.as_ref().is_some_and(|e| e.terminal);
                    let message = child_failure(&child);
                    if terminal || attempt >= options.retry.max_attempts() {
                        let err = StepError::terminal(message);
                        return Err(self.give_up(s, &spec.name, attempt, err).await);
                    }
                    runner.emit(Event::Failed {
                        index: s.cp.next,
                        step: &spec.name,
                        attempt,
                        error: &message,
                        retry_in: Some(std::time::Duration::ZERO),
                    });
                    tracing::info!(run_id = %parent, child = %id, attempt, "retrying a failed child run");
                    retry_child(store, &id, runner.now())
                        .await
                        .map_err(|e| store_error(&parent, &op("retry"), e))?;
                    running.push(id);
                }
                RunStatus::Rejected | RunStatus::Cancelled => {
                    let err = StepError::terminal(child_failure(&child));
                    return Err(self.give_up(s, &spec.name, attempt, err).await);
                }
                _ => running.push(id),
            }
        }
        let Some(first) = specs
            .iter()
            .find(|c| !values.contains_key(&c.name))
            .map(|c| c.name.clone())
        else {
            return Ok(in_order(specs, values));
        };
        self.wait_children(s, first, running).await
    }

    /// Records child `id`'s result `value` as step `name`.
    async fn record_child(
        &self,
        s: &mut Session,
        name: &str,
        id: &str,
        value: Value,
        attempt: u32,
        child: &crate::record::checkpoint::Checkpoint,
    ) -> Result<(), Error> {
        let runner = self.runner();
        let mut update = Update::new();
        update.insert(name.to_string(), value);
        update.insert(CHILD_KEY.to_string(), Value::from(id));
        if let Err(p) = crate::record::state::check_update(&update) {
            let err = StepError::invalid_value(
                p.path,
                format!("the result of child run {id:?}: {}", p.reason),
            );
            return Err(self.give_up(s, name, attempt, err).await);
        }
        let index = s.cp.next;
        let now = runner.now();
        let record = StepRecord::new(index, name, update, attempt, child.created_at, now);
        let total = s.total;
        s.complete(runner, record, total).await?;
        s.cursor = s.cp.next;
        runner.emit(Event::Completed {
            index,
            step: name,
            attempt,
            took: child.updated_at.saturating_since(child.created_at),
        });
        Ok(())
    }

    /// Fails step `name` for good: recorded as the run's failure.
    async fn give_up(&self, s: &mut Session, name: &str, attempt: u32, err: StepError) -> Error {
        let index = s.cp.next;
        let at = self.runner().now();
        self.runner().emit(Event::Failed {
            index,
            step: name,
            attempt,
            error: &err.to_string(),
            retry_in: None,
        });
        if let Err(e) = self
            .record_attempt(s, name, index, attempt, &err, true, at)
            .await
        {
            return e;
        }
        crate::engine::step_failed(&s.cp.run_id, index, name, attempt, err)
    }

    /// Saves the run waiting for children `running` at step `first`, then
    /// looks at them again: one that ended meanwhile found the run not yet
    /// waiting, so the run marks itself due.
    async fn wait_children<T>(
        &self,
        s: &mut Session,
        first: String,
        running: Vec<String>,
    ) -> Result<T, Error> {
        let runner = self.runner();
        let now = runner.now();
        let since = match &s.cp.wait {
            Some(Wait::Children { since, .. }) => *since,
            _ => now,
        };
        s.cp.wait = Some(Wait::Children {
            step: first.clone(),
            runs: running.clone(),
            since,
            arrived: false,
            recheck_at: Some(now.saturating_add(CHILDREN_RECHECK)),
        });
        s.cp.status = RunStatus::Waiting;
        s.cp.lease = None;
        s.cp.updated_at = now;
        s.save(runner, None).await.map_err(|e| {
            store_error(
                &s.cp.run_id,
                &format!("save of the wait for child runs at {first}"),
                e,
            )
        })?;
        let store = &*runner.store;
        for id in &running {
            match store.load(id).await {
                Ok(Some(child)) if ended(child.status) => {
                    if let Err(e) =
                        crate::engine::family::wake_parent(store, &s.cp.run_id, id, &*runner.clock)
                            .await
                    {
                        tracing::warn!(run_id = %s.cp.run_id, child = %id, error = %e, "a child that ended as the run began to wait did not mark it due; a worker looks again at the recheck time");
                    }
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(run_id = %s.cp.run_id, child = %id, error = %e, "after saving the wait, a child run could not be read again; a worker looks again at the recheck time");
                    break;
                }
            }
        }
        Err(self.stop(Suspension::Waiting { gate: first }))
    }
}

/// The values of `specs`, in their order.
fn in_order(specs: &[ChildSpec], mut values: HashMap<String, Value>) -> Vec<Value> {
    specs
        .iter()
        .map(|c| values.remove(&c.name).unwrap_or(Value::Null))
        .collect()
}

/// The child's workflow name and input, checked before anything is
/// written: the input as a run's state would keep it.
fn checked_input(spec: &ChildSpec) -> Result<Value, Error> {
    crate::record::ids::check_step_name(&spec.workflow).map_err(|r| Error::InvalidWorkflow {
        workflow: spec.workflow.clone(),
        reason: format!("the workflow of child step {:?}: {r}", spec.name),
    })?;
    let what = || format!("the input of child step {:?}", spec.name);
    let input = spec.input.clone().map_err(|reason| Error::InvalidInput {
        what: what(),
        reason,
    })?;
    crate::record::state::check_entries(std::iter::once(("input", &input))).map_err(|p| {
        Error::InvalidInput {
            what: what(),
            reason: format!("at `{}`: {}", p.path, p.reason),
        }
    })?;
    Ok(input)
}
