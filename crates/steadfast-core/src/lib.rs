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

// The layers, each importing only those above it in this list: the record
// of a run and its checks; the store seam and the toolkit stores share; the
// engine that runs workflows and durable functions; the operations on runs.
// `tests/structure.rs` fails on an import cycle or a layer imported upward.
mod engine;
pub mod ops;
mod record;
pub mod store;

pub use engine::metrics;
pub use ops::limits as limits_ops;
pub use ops::schedules as schedule_ops;
pub use ops::{retention, stuck, transfer, watch, worker};
pub use record::limits;
pub use record::version;
pub use store::local;

pub use engine::ctx::{Charge, StepCtx};
pub use engine::decide::{approve, default_decider, reject};
pub use engine::durable::{
    durable, ChildOptions, ChildSpec, DurableCtx, StepOptions, MAX_CHILDREN, MAX_PATCH_ID_BYTES,
};
pub use engine::family::{CHILDREN_RECHECK, MAX_CHILD_ATTEMPTS};
pub use engine::process::{current_owner, holder_is_running, local_deadline};
pub use engine::run::run;
pub use engine::signal::{signal, SIGNAL_RECHECK};
pub use engine::typed::{TypedWorkflow, TypedWorkflowBuilder};
pub use engine::workflow::{update, RetryPolicy, Step, StepFuture, Workflow, WorkflowBuilder};
pub use engine::{lease_holds, Runner, DEFAULT_CANCEL_GRACE};
pub use ops::start::{start, start_if_new, start_listed, start_steps, start_with, StartOptions};
pub use ops::worker::{
    release, LeaseGuard, Registry, RunEnd, Worker, WorkerReport, PASSED_OVER_REST,
};
pub use record::checkpoint::{
    AuditAction, AuditEntry, Checkpoint, Decision, Lease, OnTimeout, Origin, Owner, PassedOver,
    RewoundStep, RunStatus, StepFailure, StepRecord, Wait, CHECKPOINT_FORMAT, MAX_AUDIT_ENTRIES,
    MAX_PASSED_OVER_BY_BYTES, MAX_PASSED_OVER_VERSIONS,
};
pub use record::clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use record::error::{
    error_chain, BoxError, Error, Removal, StepError, StoreError, StoreErrorKind, MAX_RETRY_AFTER,
};
pub use record::events::{NewEvent, RunEvent};
pub use record::family::{child_id, child_result, children_of, ChildRef, ParentLink};
pub use record::ids::{
    check_step_name, idempotency_key, validate_run_id, MAX_RUN_ID_BYTES, MAX_STEP_NAME_BYTES,
};
pub use record::keys::{CHILD_KEY, INPUT_KEY, PARENT_KEY, RESERVED_KEYS, RESULT_KEY, START_KEY};
pub use record::limit::{
    check_limit_key, LimitDoc, LimitSpec, Rate, Reservation, Slot, Taken, LIMIT_PREFIX,
    LIMIT_RECHECK, MAX_LIMIT_SIZE, RESERVATION_KEPT, SLOT_LEASE,
};
pub use record::outcome::{Event, Outcome, Suspension};
pub use record::queue::{fair_order, partition_rank, Queue, MAX_PARTITION_BYTES, MAX_PRIORITY};
pub use record::schedule::{
    check_schedule_name, CronSchedule, Due, DEFAULT_CATCH_UP, MAX_CATCH_UP,
    MAX_SCHEDULE_NAME_BYTES, SCHEDULE_PREFIX,
};
pub use record::signal::{Signal, SIGNALS_KEY, SIGNAL_STEP};
pub use record::spend::{
    amounts_of, check_spend_name, parse_amounts, Spend, BUDGET_GATE, MAX_SPEND_AMOUNT,
    MAX_SPEND_NAMES, SPEND_KEY,
};
pub use record::state::{merge, State, Update, MAX_VALUE_DEPTH};
pub use record::version::{FieldChange, StepVersion, STEP_KEY};
pub use store::memory::{MemoryStore, DEFAULT_MEMORY_STATE_LIMIT};
pub use store::{
    BlobTotals, Blobs, Capabilities, Document, Documents, DueRequest, Events, History, Leftovers,
    ListFilter, RunSummary, Schedule, Store, StoreExt, Usage,
};

/// Re-exported so that stores and tests name the same versions.
pub use async_trait::async_trait;
