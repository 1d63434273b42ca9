//! Parents and children: a run started by another run's step
//! ([`DurableCtx::child`](crate::DurableCtx::child)).
//!
//! A child's id is made from its parent's id and the step's name, so the
//! parent finds the same child on every call. The child keeps its parent
//! (its id, its step, and when the parent was created, which tells a run
//! of the same id made later apart) under [`PARENT_KEY`] in its state; each
//! child step's record keeps the child's id under [`CHILD_KEY`]. A child's result
//! is what its run returned: a durable function's value, or a listed
//! workflow's final state without the engine's keys.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::record::checkpoint::{Checkpoint, RunStatus, StepRecord};
use crate::record::clock::Timestamp;
pub use crate::record::keys::{CHILD_KEY, PARENT_KEY};
use crate::record::keys::{RESERVED_KEYS, RESULT_KEY};
use crate::record::state::State;

/// Who a child run belongs to: the parent run and the parent's step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ParentLink {
    /// The parent run's id.
    pub run: String,
    /// The parent's step that started the child.
    pub step: String,
    /// When the parent run was created: a run made later under the same
    /// id (after a delete) is another parent.
    pub created: Timestamp,
}

impl ParentLink {
    /// The link to step `step` of run `run`, created at `created`.
    pub fn new(run: &str, step: &str, created: Timestamp) -> Self {
        ParentLink {
            run: run.to_string(),
            step: step.to_string(),
            created,
        }
    }

    /// The parent a run's state names, if it is a child.
    pub fn of(state: &State) -> Option<ParentLink> {
        serde_json::from_value(state.get(PARENT_KEY)?.clone()).ok()
    }

    /// The link as the child's state keeps it.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The id of the child run that step `step` of run `parent` starts:
/// `PARENT~STEP`, or, when that would be longer than a run id may be
/// ([`MAX_RUN_ID_BYTES`](crate::record::ids::MAX_RUN_ID_BYTES)), the start
/// of it followed by a hash of both. The same on every call.
///
/// ```
/// use steadfast_core::child_id;
/// assert_eq!(child_id("order-7", "summarise"), "order-7~summarise");
/// let long = child_id(&"p".repeat(200), "step");
/// assert!(long.len() <= 200 && long.starts_with("ppp"));
/// assert_ne!(long, child_id(&"p".repeat(200), "other"));
/// ```
pub fn child_id(parent: &str, step: &str) -> String {
    let max = crate::record::ids::MAX_RUN_ID_BYTES;
    let plain = format!("{parent}~{step}");
    if plain.len() <= max {
        return plain;
    }
    let mut hash = Sha256::new();
    hash.update(parent.as_bytes());
    hash.update([0]);
    hash.update(step.as_bytes());
    let digest = hash.finalize();
    let tag: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    // `~` and 24 hex digits after as much of the plain id as fits.
    let mut keep = max - 1 - tag.len();
    while !plain.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}~{tag}", &plain[..keep])
}

/// What a completed child returns to its parent's step: a durable
/// function's result, or a listed workflow's final state without the
/// engine's keys.
pub fn child_result(cp: &Checkpoint) -> Value {
    if let Some(v) = cp.state.get(RESULT_KEY) {
        return v.clone();
    }
    let mut state = cp.state.clone();
    state.retain(|k, _| !RESERVED_KEYS.contains(&k.as_str()));
    Value::Object(state)
}

/// Whether `status` is an end: a run that reached it never runs again by
/// itself (a failed run may be retried by hand or by its parent).
pub fn ended(status: RunStatus) -> bool {
    matches!(
        status,
        RunStatus::Completed | RunStatus::Failed | RunStatus::Rejected | RunStatus::Cancelled
    )
}

/// Why child `cp` did not complete, for its parent's step error.
pub fn child_failure(cp: &Checkpoint) -> String {
    let why = match (&cp.status, &cp.error) {
        (RunStatus::Failed, Some(e)) => {
            format!("failed at step {} ({}): {}", e.index, e.step, e.message)
        }
        (RunStatus::Rejected, _) => match cp.decisions.iter().rev().find(|d| !d.approved) {
            Some(d) => format!(
                "was rejected at gate {:?}{}",
                d.gate,
                d.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            None => "was rejected".into(),
        },
        (status, _) => format!("is {status}"),
    };
    format!("child run {:?} ({}) {why}", cp.run_id, cp.workflow)
}

/// One child run of a parent, as the parent's record names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChildRef {
    /// The parent's step that started it.
    pub step: String,
    /// The child run's id.
    pub run: String,
    /// Whether its result is recorded in the parent (else it is under way).
    pub recorded: bool,
}

/// The children run `cp` names: those whose results its steps recorded
/// (each record's [`CHILD_KEY`], from its per-step `history` when the store
/// keeps one, else the last one in the state), then those its wait lists as
/// under way.
pub fn children_of(cp: &Checkpoint, history: Option<&[StepRecord]>) -> Vec<ChildRef> {
    let recorded = |step: &str, run: Option<&Value>| {
        Some(ChildRef {
            step: step.to_string(),
            run: run?.as_str()?.to_string(),
            recorded: true,
        })
    };
    let mut out: Vec<ChildRef> = match history {
        Some(h) => h
            .iter()
            .filter(|r| r.index < cp.next)
            .filter_map(|r| recorded(&r.name, r.update.get(CHILD_KEY)))
            .collect(),
        None => cp
            .completed
            .iter()
            .rev()
            .find_map(|step| {
                let run = cp.state.get(CHILD_KEY)?;
                (run.as_str() == Some(child_id(&cp.run_id, step).as_str()))
                    .then(|| recorded(step, Some(run)))
                    .flatten()
            })
            .into_iter()
            .collect(),
    };
    if let Some(crate::record::checkpoint::Wait::Children { runs, .. }) = &cp.wait {
        for run in runs {
            if out.iter().any(|c| c.run == *run) {
                continue;
            }
            // The step is the id's tail after the parent's id and `~`
            // (unknown for an id shortened by a hash).
            let step = run
                .strip_prefix(&format!("{}~", cp.run_id))
                .filter(|s| child_id(&cp.run_id, s) == *run)
                .unwrap_or("")
                .to_string();
            out.push(ChildRef {
                step,
                run: run.clone(),
                recorded: false,
            });
        }
    }
    out
}

/// The name under which the engine writes a child's audit entries (a
/// retry by its parent, a cancel because its parent was cancelled).
pub const PARENT_AUDITOR: &str = "parent run";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_bounded_and_distinct() {
        let max = crate::record::ids::MAX_RUN_ID_BYTES;
        for (p, s) in [
            ("a", "b"),
            (&*"é".repeat(100), "x"),
            (&*"p".repeat(200), &*"s".repeat(200)),
        ] {
            let id = child_id(p, s);
            assert!(id.len() <= max, "{id}");
            assert_eq!(id, child_id(p, s));
            crate::record::ids::validate_run_id(&id).expect("a valid run id");
        }
        let long = "p".repeat(199);
        assert_ne!(child_id(&long, "a"), child_id(&long, "b"));
        assert_ne!(child_id(&long, "a~b"), child_id(&format!("{long}~a"), "b"));
    }

    #[test]
    fn results_leave_the_engines_keys_out() {
        let mut cp = Checkpoint::new("c", "wf", crate::record::clock::Timestamp::EPOCH);
        cp.state.insert("rows".into(), Value::from(3));
        let link = ParentLink::new("p", "s", Timestamp::from_unix_millis(7));
        cp.state.insert(PARENT_KEY.into(), link.to_value());
        assert_eq!(child_result(&cp), serde_json::json!({"rows": 3}));
        cp.state.insert(RESULT_KEY.into(), Value::from("done"));
        assert_eq!(child_result(&cp), Value::from("done"));
        assert_eq!(ParentLink::of(&cp.state), Some(link));
    }
}
