//! The typed façade: a workflow over a serde type instead of a JSON object.
//!
//! The state is stored as the same JSON object the untyped engine keeps, so the
//! stores, the history and the tooling see no difference.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::engine::ctx::StepCtx;
use crate::engine::workflow::{json_kind, Step, Workflow};
use crate::engine::Runner;
use crate::record::error::{Error, StepError};
use crate::record::outcome::Outcome;
use crate::record::state::{State, Update};
use crate::store::Store;

/// A workflow whose state is a type `S` (stored as JSON).
///
/// A fresh run starts from `S::default()`. A step either returns a new `S`
/// ([`TypedWorkflowBuilder::step`]) or a partial update of any serializable type
/// that is merged key by key ([`TypedWorkflowBuilder::patch`]). After every step
/// the merged state is read back into `S`; a value that would not survive that
/// (a NaN or infinite float, which JSON stores as `null`) fails the step before
/// anything is saved, naming the key path.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use serde::{Deserialize, Serialize};
/// use steadfast_core::{MemoryStore, Outcome, TypedWorkflow};
///
/// #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
/// struct Order { items: u32, total_cents: u64 }
///
/// let wf = TypedWorkflow::<Order>::builder("checkout")
///     .step("count", |_ctx, o| async move { Ok(Order { items: 3, ..o }) })
///     .step("price", |_ctx, o| async move { Ok(Order { total_cents: 450 * o.items as u64, ..o }) })
///     .build()?;
/// let store = MemoryStore::new();
/// let done = wf.run("order-1", &store).await?;
/// assert_eq!(done, Outcome::Completed(Order { items: 3, total_cents: 1350 }));
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct TypedWorkflow<S> {
    inner: Workflow,
    _state: PhantomData<fn() -> S>,
}

impl<S> TypedWorkflow<S>
where
    S: Serialize + DeserializeOwned + Default + Send + 'static,
{
    /// Starts building a typed workflow named `name`.
    pub fn builder(name: impl Into<String>) -> TypedWorkflowBuilder<S> {
        TypedWorkflowBuilder {
            name: name.into(),
            steps: Vec::new(),
            _state: PhantomData,
        }
    }

    /// The untyped workflow underneath, for [`Runner`] and tooling.
    pub fn workflow(&self) -> &Workflow {
        &self.inner
    }

    /// Starts or resumes `run_id` on `store`; see [`run`](crate::run).
    pub async fn run<St: Store + ?Sized>(
        &self,
        run_id: &str,
        store: &St,
    ) -> Result<Outcome<S>, Error> {
        self.run_with(&Runner::new(store), run_id).await
    }

    /// Like [`TypedWorkflow::run`], with a configured [`Runner`].
    pub async fn run_with<St: Store + ?Sized>(
        &self,
        runner: &Runner<'_, St>,
        run_id: &str,
    ) -> Result<Outcome<S>, Error> {
        let outcome = runner.run(run_id, &self.inner).await?;
        outcome.try_map(|state| {
            from_state::<S>(&state).map_err(|(path, reason)| Error::InvalidValue {
                run_id: run_id.to_string(),
                index: self.inner.steps().len().saturating_sub(1),
                step: "(final state)".into(),
                path,
                reason,
            })
        })
    }
}

/// Builds a [`TypedWorkflow`].
#[must_use]
pub struct TypedWorkflowBuilder<S> {
    name: String,
    steps: Vec<Step>,
    _state: PhantomData<fn() -> S>,
}

impl<S> TypedWorkflowBuilder<S>
where
    S: Serialize + DeserializeOwned + Default + Send + 'static,
{
    /// Appends a step that returns the new state. Keys the new state no longer has
    /// are stored as `null`.
    pub fn step<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepCtx, S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, StepError>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.push(Step::new(name, move |ctx, state: Arc<State>| {
            let f = Arc::clone(&f);
            async move {
                let input = read_state::<S>(&state)?;
                let next = to_object(&f(ctx, input).await?)?;
                let mut update = Update::new();
                for (k, v) in &next {
                    if state.get(k) != Some(v) {
                        update.insert(k.clone(), v.clone());
                    }
                }
                for k in state.keys() {
                    if !next.contains_key(k) {
                        update.insert(k.clone(), Value::Null);
                    }
                }
                check_reads_back::<S>(next)?;
                Ok(update)
            }
        }))
    }

    /// Appends a step that returns a partial update (any type that serializes to
    /// a JSON object), merged key by key.
    pub fn patch<F, Fut, U>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepCtx, S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<U, StepError>> + Send + 'static,
        U: Serialize,
    {
        let f = Arc::new(f);
        self.push(Step::new(name, move |ctx, state: Arc<State>| {
            let f = Arc::clone(&f);
            async move {
                let input = read_state::<S>(&state)?;
                let update = to_object(&f(ctx, input).await?)?;
                let mut merged = (*state).clone();
                crate::record::state::merge(&mut merged, update.clone());
                check_reads_back::<S>(merged)?;
                Ok(update)
            }
        }))
    }

    /// Appends a step built with [`Step::new`] working on the JSON state directly.
    pub fn push(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// Checks the names and returns the workflow.
    pub fn build(self) -> Result<TypedWorkflow<S>, Error> {
        Ok(TypedWorkflow {
            inner: Workflow::new(self.name, self.steps)?,
            _state: PhantomData,
        })
    }
}

fn read_state<S: DeserializeOwned + Default>(state: &State) -> Result<S, StepError> {
    from_state(state).map_err(|(path, reason)| {
        StepError::terminal(format!(
            "the stored state does not fit the workflow's type at `{path}`: {reason}"
        ))
    })
}

fn from_state<S: DeserializeOwned + Default>(state: &State) -> Result<S, (String, String)> {
    if state.is_empty() {
        return Ok(S::default());
    }
    serde_path_to_error::deserialize(Value::Object(state.clone()))
        .map_err(|e| (e.path().to_string(), e.inner().to_string()))
}

fn check_reads_back<S: DeserializeOwned>(state: State) -> Result<(), StepError> {
    serde_path_to_error::deserialize::<_, S>(Value::Object(state))
        .map(drop)
        .map_err(|e| {
            StepError::invalid_value(
                e.path().to_string(),
                format!(
                    "{} (after a save it would not load back; NaN and infinite floats are stored as null)",
                    e.inner()
                ),
            )
        })
}

fn to_object<T: Serialize>(value: &T) -> Result<Update, StepError> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(StepError::terminal(format!(
            "a typed step must serialize to a JSON object, got {}",
            json_kind(&other)
        ))),
        Err(e) => Err(StepError::invalid_value("", e.to_string())),
    }
}
