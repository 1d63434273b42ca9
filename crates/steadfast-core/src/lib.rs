//! The core of Steadfast: the run loop, the [`Store`] trait, checkpoints, errors,
//! an in-memory store and an injectable clock.
//!
//! Most users depend on the `steadfast` facade crate, which re-exports all of this
//! and opens stores from URLs.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::{run, update, MemoryStore, Outcome, Workflow};
//!
//! let wf = Workflow::builder("greet")
//!     .step("hello", |_ctx, _state| async { update(json!({"hello": true})) })
//!     .step("name", |ctx, state| async move {
//!         assert_eq!(state["hello"], json!(true));
//!         update(json!({"key": ctx.idempotency_key()}))
//!     })
//!     .build()?;
//! let store = MemoryStore::new();
//! let outcome = run("run-1", &wf, &store).await?;
//! assert_eq!(outcome.completed().unwrap()["key"], json!("run-1/name"));
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

mod checkpoint;
mod clock;
mod ctx;
mod decide;
mod durable;
mod engine;
mod error;
mod head;
mod ids;
pub mod limits;
pub mod local;
mod memory;
pub mod metrics;
pub mod ops;
mod outcome;
mod process;
pub mod retention;
mod run;
mod session;
mod state;
pub mod store;
pub mod stuck;
pub mod transfer;
mod typed;
pub mod worker;
mod workflow;

pub use checkpoint::{
    AuditAction, AuditEntry, Checkpoint, Decision, Lease, OnTimeout, Origin, Owner, RewoundStep,
    RunStatus, StepFailure, StepRecord, Wait, CHECKPOINT_FORMAT, MAX_AUDIT_ENTRIES,
};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use ctx::StepCtx;
pub use decide::{approve, reject};
pub use durable::{durable, DurableCtx, StepOptions};
pub use engine::{Runner, DEFAULT_CANCEL_GRACE};
pub use error::{error_chain, BoxError, Error, Removal, StepError, StoreError, StoreErrorKind};
pub use ids::{
    check_step_name, idempotency_key, validate_run_id, MAX_RUN_ID_BYTES, MAX_STEP_NAME_BYTES,
};
pub use memory::{MemoryStore, DEFAULT_MEMORY_STATE_LIMIT};
pub use outcome::{Event, Outcome, Suspension};
pub use process::{current_owner, holder_is_running};
pub use run::run;
pub use state::{merge, State, Update, MAX_VALUE_DEPTH};
pub use store::{DueRequest, ListFilter, RunSummary, Store};
pub use typed::{TypedWorkflow, TypedWorkflowBuilder};
pub use worker::{
    release, start, start_listed, start_steps, Registry, RunEnd, Worker, WorkerReport, START_KEY,
};
pub use workflow::{update, RetryPolicy, Step, StepFuture, Workflow, WorkflowBuilder};

/// Re-exported so that stores and tests name the same versions.
pub use async_trait::async_trait;
