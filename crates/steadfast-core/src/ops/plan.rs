//! What resuming a run with a given workflow would do, without doing it:
//! which recorded steps it skips, which of them ran under a definition that
//! has changed since, which steps were removed, added or moved, where the
//! resume would stop with [`Error::WorkflowChanged`], and what accepting the
//! change would cut.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::ops::plan::{plan, StepAction};
//! use steadfast_core::{run, update, MemoryStore, Step, Workflow};
//!
//! let v1 = Workflow::new("agent", vec![
//!     Step::new("plan", |_, _| async { update(json!({"plan": 1})) }).version("1"),
//!     Step::gate("review"),
//!     Step::new("write", |_, _| async { update(json!({})) }),
//! ])?;
//! let store = MemoryStore::new();
//! run("r", &v1, &store).await?; // waits at "review"
//! assert!(plan(&store, "r", &v1).await?.clean);
//!
//! let v2 = Workflow::new("agent", vec![
//!     Step::new("plan", |_, _| async { update(json!({"plan": 2})) }).version("2"),
//!     Step::gate("review"),
//!     Step::new("write", |_, _| async { update(json!({})) }),
//! ])?;
//! let p = plan(&store, "r", &v2).await?;
//! assert!(!p.clean && p.stops_at.is_none());
//! assert_eq!(p.steps[0].action, StepAction::Changed);
//! assert_eq!(p.steps[0].changes[0].field, "version");
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

use std::collections::HashMap;

use serde::Serialize;

use crate::engine::workflow::Workflow;
use crate::record::checkpoint::{Origin, RunStatus, StepRecord};
use crate::record::error::{store_error, Error, StoreErrorKind};
use crate::record::version::{FieldChange, StepVersion, STEP_KEY};
use crate::store::Store;
use crate::store::StoreExt as _;

/// What a resume would do with one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAction {
    /// Recorded and unchanged (or recorded before fingerprints existed):
    /// skipped.
    Skip,
    /// Recorded, but its definition has changed since it ran: skipped all
    /// the same (its value stands); see the step's `changes`.
    Changed,
    /// Recorded under this name at this place, and the workflow has no
    /// step of that name any more.
    Removed,
    /// Recorded at this place under an old name; the workflow's step here
    /// has another name and the same definition.
    Renamed,
    /// In the workflow at a place the record has already passed, and not
    /// recorded under its name there.
    Added,
    /// Recorded, but the workflow has it at another place.
    Moved,
    /// Not recorded yet: the resume runs it (the first such step is where
    /// the run stands).
    Run,
}

/// One line of a [`ResumePlan`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedStep {
    /// Its index in the workflow given, if it is there.
    pub index: Option<usize>,
    /// Its index in the run's record, if it was recorded.
    pub recorded_index: Option<usize>,
    /// Its name (in the workflow given; the recorded name for a removed
    /// step).
    pub name: String,
    /// The recorded name, where it differs (a renamed step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_name: Option<String>,
    /// What a resume does with it.
    pub action: StepAction,
    /// For a changed step, the fields of its definition that differ.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<FieldChange>,
    /// The fingerprint recorded when it ran, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_fingerprint: Option<String>,
    /// The fingerprint of its definition in the workflow given, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// Where a resume would stop with [`Error::WorkflowChanged`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StopPoint {
    /// The index of the first difference.
    pub at: usize,
    /// What the record has there.
    pub recorded: Option<String>,
    /// What the workflow given has there.
    pub given: Option<String>,
}

/// What resuming with `--accept-changed-workflow` would do instead of
/// stopping: the record's first `kept` steps count as the workflow's first
/// `kept` steps (relabelled where their names differ), recorded steps past
/// them are no longer counted, and the run goes on at step `kept`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AcceptEffect {
    /// How many recorded steps still count.
    pub kept: usize,
    /// Recorded steps taken as another step of the workflow: (recorded, as).
    pub relabelled: Vec<(String, String)>,
    /// Recorded steps no longer counted (past the workflow's end).
    pub dropped: Vec<String>,
    /// The step the run would go on at, if any is left.
    pub resumes_at: Option<String>,
}

/// What resuming a run with a given workflow would do ([`plan`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResumePlan {
    /// The run.
    pub run_id: String,
    /// The workflow the run records.
    pub workflow: String,
    /// The workflow given.
    pub given_workflow: String,
    /// The version of the workflow the run was started with, if it
    /// records one ([`Origin::version`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_version: Option<String>,
    /// The version of the workflow given, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_version: Option<String>,
    /// Where the run stands.
    pub status: RunStatus,
    /// Steps the record has completed.
    pub next: usize,
    /// The gate, timer or signal wait the run is stopped at, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_at: Option<String>,
    /// Every step, in the order of the workflow given, with removed steps
    /// where the record had them.
    pub steps: Vec<PlannedStep>,
    /// Where a resume would stop with [`Error::WorkflowChanged`], if it
    /// would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stops_at: Option<StopPoint>,
    /// What accepting the change would do, when a resume would stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accept: Option<AcceptEffect>,
    /// Other differences, in words (a changed workflow name, a changed
    /// list of steps before any ran, a wait for a step the workflow has
    /// not at that place).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// True when nothing recorded is contradicted: same workflow, every
    /// recorded step in place with its definition unchanged (or unknown),
    /// and the list of steps as the run was started with (when it says).
    /// A finished run's plan can be clean; a note says it runs nothing.
    pub clean: bool,
}

/// What resuming `run_id` with `workflow` would do, read from its record
/// and history; nothing is written. [`Error::NoSuchRun`] for a run that is
/// not there. A store that keeps no per-step history gives no
/// fingerprints: every recorded step then counts as unchanged.
pub async fn plan<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    workflow: &Workflow,
) -> Result<ResumePlan, Error> {
    let cp = store
        .load(run_id)
        .await
        .map_err(|e| store_error(run_id, "load", e))?
        .ok_or_else(|| Error::NoSuchRun {
            run_id: run_id.to_string(),
        })?;
    let history = history_or_none(store, run_id).await?;
    Ok(plan_of(&cp, &history, workflow))
}

/// The history of `run_id`, empty on a store that keeps none.
async fn history_or_none<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
) -> Result<Vec<StepRecord>, Error> {
    match store.history(run_id).await {
        Ok(h) => Ok(h.unwrap_or_default()),
        Err(e) if e.kind() == StoreErrorKind::Unsupported => Ok(Vec::new()),
        Err(e) => Err(store_error(run_id, "reading the history", e)),
    }
}

/// [`plan`] of a record and history already read (a page that shows them
/// too): nothing is read or written.
pub fn plan_of(
    cp: &crate::record::checkpoint::Checkpoint,
    history: &[StepRecord],
    workflow: &Workflow,
) -> ResumePlan {
    let mut versions = versions_of(history);
    let recorded: Vec<Recorded> = cp
        .completed
        .iter()
        .take(cp.next)
        .enumerate()
        .map(|(i, name)| Recorded {
            name: name.clone(),
            version: versions.remove(&i),
        })
        .collect();
    let waiting_at = cp.wait.as_ref().map(|w| w.step().to_string());
    let mut p = compare(&recorded, workflow, cp.origin.as_ref());
    if cp.workflow != workflow.name() {
        p.notes.insert(
            0,
            format!(
                "the run records workflow {:?}, not {:?}",
                cp.workflow,
                workflow.name()
            ),
        );
        p.stops_at = Some(StopPoint {
            at: 0,
            recorded: Some(format!("workflow {:?}", cp.workflow)),
            given: Some(format!("workflow {:?}", workflow.name())),
        });
        p.accept = Some(accept_effect(&recorded, workflow));
    }
    let recorded_version = cp.origin.as_ref().and_then(|o| o.version.clone());
    let given_version = workflow.version().map(str::to_string);
    if cp.workflow == workflow.name()
        && cp
            .origin
            .as_ref()
            .is_some_and(|o| !o.runs_under(workflow.version()))
    {
        let had = recorded_version.as_deref().unwrap_or_default();
        let given = given_version
            .as_deref()
            .map_or("a workflow without a version".to_string(), |v| {
                format!("version {v:?}")
            });
        p.notes.insert(
            0,
            format!("the run was started under version {had:?} of the workflow; this is {given}: run it with that version, or migrate it"),
        );
        if p.stops_at.is_none() {
            p.stops_at = Some(StopPoint {
                at: 0,
                recorded: Some(format!("version {had}")),
                given: Some(
                    given_version
                        .as_deref()
                        .map_or("no version".to_string(), |v| format!("version {v}")),
                ),
            });
            p.accept = Some(accept_effect(&recorded, workflow));
        }
    }
    if let Some(w) = &waiting_at {
        let here = workflow.steps().get(cp.next).map(|s| s.name());
        if here != Some(w.as_str()) {
            p.notes.push(format!(
                "the run waits at {w:?}, but the workflow's step {} is {}",
                cp.next,
                here.map_or("missing".to_string(), |n| format!("{n:?}"))
            ));
        }
    }
    let clean = p.stops_at.is_none()
        && p.notes.is_empty()
        && p.steps
            .iter()
            .all(|s| matches!(s.action, StepAction::Skip | StepAction::Run));
    // A finished run resumes to nothing, whatever the workflow: said, but
    // not a change.
    if matches!(
        cp.status,
        RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
    ) {
        p.notes
            .push(format!("the run is {}: a resume runs no step", cp.status));
    }
    ResumePlan {
        run_id: cp.run_id.clone(),
        workflow: cp.workflow.clone(),
        given_workflow: workflow.name().to_string(),
        recorded_version,
        given_version,
        status: cp.status,
        next: cp.next,
        waiting_at,
        steps: p.steps,
        stops_at: p.stops_at,
        accept: p.accept,
        notes: p.notes,
        clean,
    }
}

/// A recorded step: its name and what it ran as, if it says.
struct Recorded {
    name: String,
    version: Option<StepVersion>,
}

/// The plan's parts that come from comparing the record with the workflow.
struct Compared {
    steps: Vec<PlannedStep>,
    stops_at: Option<StopPoint>,
    accept: Option<AcceptEffect>,
    notes: Vec<String>,
}

/// The definition each step of `history` ran as, by index, where it
/// recorded one (the last row of an index wins).
fn versions_of(history: &[StepRecord]) -> HashMap<usize, StepVersion> {
    history
        .iter()
        .filter_map(|r| {
            let v = StepVersion::from_value(r.update.get(STEP_KEY)?)?;
            Some((r.index, v))
        })
        .collect()
}

fn compare(recorded: &[Recorded], workflow: &Workflow, origin: Option<&Origin>) -> Compared {
    let given = workflow.steps();
    let given_at: HashMap<&str, usize> = given
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name(), i))
        .collect();
    let recorded_at: HashMap<&str, usize> = recorded
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let next = recorded.len();
    let mut steps = Vec::new();
    let mut stops_at = None;
    let fp = |v: Option<&StepVersion>| v.map(|v| v.fingerprint().to_string());
    for i in 0..next.max(given.len()) {
        let r = recorded.get(i);
        let g = given.get(i);
        match (r, g) {
            (Some(r), Some(g)) if r.name == g.name() => {
                let changes = match (&r.version, g.definition()) {
                    (Some(was), Some(now)) if was.fingerprint() != now.fingerprint() => {
                        was.changes_to(now)
                    }
                    _ => Vec::new(),
                };
                steps.push(PlannedStep {
                    index: Some(i),
                    recorded_index: Some(i),
                    name: r.name.clone(),
                    recorded_name: None,
                    action: if changes.is_empty() {
                        StepAction::Skip
                    } else {
                        StepAction::Changed
                    },
                    changes,
                    recorded_fingerprint: fp(r.version.as_ref()),
                    fingerprint: fp(g.definition()),
                });
            }
            (Some(r), g) => {
                if stops_at.is_none() {
                    stops_at = Some(StopPoint {
                        at: i,
                        recorded: Some(r.name.clone()),
                        given: g.map(|g| g.name().to_string()),
                    });
                }
                // The recorded step: moved, renamed or removed.
                // The same definition under another name: only a definition
                // that says what the step does (a flow step's command), not a
                // declared version alone, which many steps share.
                let same_definition = match (g.and_then(|g| g.definition()), &r.version) {
                    (Some(now), Some(was)) => {
                        now.fingerprint() == was.fingerprint()
                            && now.fields().contains_key("command")
                    }
                    _ => false,
                };
                if let Some(&j) = given_at.get(r.name.as_str()) {
                    steps.push(PlannedStep {
                        index: Some(j),
                        recorded_index: Some(i),
                        name: r.name.clone(),
                        recorded_name: None,
                        action: StepAction::Moved,
                        changes: Vec::new(),
                        recorded_fingerprint: fp(r.version.as_ref()),
                        fingerprint: fp(given[j].definition()),
                    });
                } else if let Some(g) =
                    g.filter(|g| same_definition && !recorded_at.contains_key(g.name()))
                {
                    steps.push(PlannedStep {
                        index: Some(i),
                        recorded_index: Some(i),
                        name: g.name().to_string(),
                        recorded_name: Some(r.name.clone()),
                        action: StepAction::Renamed,
                        changes: Vec::new(),
                        recorded_fingerprint: fp(r.version.as_ref()),
                        fingerprint: fp(g.definition()),
                    });
                    continue;
                } else {
                    steps.push(PlannedStep {
                        index: None,
                        recorded_index: Some(i),
                        name: r.name.clone(),
                        recorded_name: None,
                        action: StepAction::Removed,
                        changes: Vec::new(),
                        recorded_fingerprint: fp(r.version.as_ref()),
                        fingerprint: None,
                    });
                }
                // The workflow's step at this place, unless it is recorded
                // elsewhere (listed there as moved).
                if let Some(g) = g {
                    if !recorded_at.contains_key(g.name()) {
                        steps.push(PlannedStep {
                            index: Some(i),
                            recorded_index: None,
                            name: g.name().to_string(),
                            recorded_name: None,
                            action: StepAction::Added,
                            changes: Vec::new(),
                            recorded_fingerprint: None,
                            fingerprint: fp(g.definition()),
                        });
                    }
                }
            }
            (None, Some(g)) => {
                // Past the record: run, unless it is recorded at another
                // place (then it moved, and runs again here).
                let moved = recorded_at.get(g.name()).copied();
                steps.push(PlannedStep {
                    index: Some(i),
                    recorded_index: moved,
                    name: g.name().to_string(),
                    recorded_name: None,
                    action: if moved.is_some() {
                        StepAction::Moved
                    } else {
                        StepAction::Run
                    },
                    changes: Vec::new(),
                    recorded_fingerprint: None,
                    fingerprint: fp(g.definition()),
                });
            }
            (None, None) => {}
        }
    }
    // A moved step appears twice (where it was and where it is): keep one.
    let mut seen = std::collections::HashSet::new();
    steps.retain(|s| {
        s.action != StepAction::Moved || seen.insert((s.name.clone(), s.index, s.recorded_index))
    });
    // In the order of the workflow; a removed step where the record had it.
    steps.sort_by_key(|s| s.index.or(s.recorded_index));
    let mut notes = Vec::new();
    let now = Origin::listed(workflow.step_names());
    if let Some(o) = origin.filter(|o| !o.same_steps(&now)) {
        let text = format!(
            "the run was started with {} step(s) (fingerprint {}); the workflow has {} (fingerprint {})",
            o.steps, o.steps_sha256, now.steps, now.steps_sha256
        );
        if next == 0 && stops_at.is_none() {
            stops_at = Some(StopPoint {
                at: 0,
                recorded: Some(format!("{} step(s) at start", o.steps)),
                given: Some(format!("{} step(s)", now.steps)),
            });
        }
        notes.push(text);
    }
    let accept = stops_at.as_ref().map(|_| accept_effect(recorded, workflow));
    Compared {
        steps,
        stops_at,
        accept,
        notes,
    }
}

/// What [`Runner::accept_changed_workflow`](crate::Runner::accept_changed_workflow)
/// does to the record: the first `min(next, steps)` recorded steps are
/// taken as the workflow's steps at the same places.
fn accept_effect(recorded: &[Recorded], workflow: &Workflow) -> AcceptEffect {
    let given: Vec<&str> = workflow.step_names().collect();
    let kept = recorded.len().min(given.len());
    AcceptEffect {
        kept,
        relabelled: recorded[..kept]
            .iter()
            .zip(&given)
            .filter(|(r, g)| r.name != **g)
            .map(|(r, g)| (r.name.clone(), g.to_string()))
            .collect(),
        dropped: recorded[kept..].iter().map(|r| r.name.clone()).collect(),
        resumes_at: given.get(kept).map(|s| s.to_string()),
    }
}

/// The most renames one migration takes (each is listed in the run's
/// audit).
pub const MAX_RENAMES: usize = 100;

/// Moves run `run_id` to `workflow`, a newer version of its workflow, on
/// purpose: its recorded steps are renamed as `renames` says (old name,
/// new name), the steps it was started with become `workflow`'s, and an
/// audit entry ([`AuditAction::Migrate`](crate::AuditAction::Migrate), by
/// `by`) records it. Refused, with nothing written, unless the plan is then
/// clean for every recorded step: the same workflow name, every recorded
/// step (after the renames) at its place with an unchanged definition. A
/// completed run, a run a live process holds ([`Error::Held`]) and renames
/// that name no recorded step or no step of `workflow` are refused too.
/// Returns the record as saved and the plan it was checked against.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::ops::plan::{migrate, plan};
/// use steadfast_core::{run, update, MemoryStore, Outcome, Step, SystemClock, Workflow};
///
/// let s = |name: &str| Step::new(name, |_, _| async { update(json!({})) });
/// let v1 = Workflow::new("agent", vec![s("plan"), Step::gate("review"), s("write")])?;
/// let store = MemoryStore::new();
/// run("r", &v1, &store).await?; // waits at "review"
/// let v2 = Workflow::new("agent", vec![s("draft"), Step::gate("review"), s("write")])?;
/// let renames = [("plan".to_string(), "draft".to_string())];
/// let (cp, _) = migrate(&store, "r", &v2, &renames, "ada", &SystemClock).await?;
/// assert_eq!(cp.completed, ["draft"]);
/// assert!(plan(&store, "r", &v2).await?.clean);
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn migrate<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    workflow: &Workflow,
    renames: &[(String, String)],
    by: &str,
    clock: &dyn crate::record::clock::Clock,
) -> Result<(crate::record::checkpoint::Checkpoint, ResumePlan), Error> {
    super::check_operator(run_id, "migrate", by)?;
    let refuse = |why: String| super::refused(run_id, "migrate", why);
    if renames.len() > MAX_RENAMES {
        return Err(refuse(format!(
            "{} renames given, at most {MAX_RENAMES}",
            renames.len()
        )));
    }
    let mut map: HashMap<&str, &str> = HashMap::new();
    let given: std::collections::HashSet<&str> = workflow.step_names().collect();
    for (old, new) in renames {
        if map.insert(old.as_str(), new.as_str()).is_some() {
            return Err(refuse(format!("step {old:?} is renamed twice")));
        }
        if !given.contains(new.as_str()) {
            return Err(refuse(format!(
                "rename {old:?}={new:?}: the workflow has no step {new:?}"
            )));
        }
        // A gate, timer, wait or child keeps its value in the state under
        // its name: renamed, the value would be left under the old one.
        let runs_a_function = workflow
            .steps()
            .iter()
            .find(|s| s.name() == new.as_str())
            .is_some_and(|s| s.runs_a_function());
        if !runs_a_function {
            return Err(refuse(format!(
                "rename {old:?}={new:?}: only steps that run a function are renamed; a gate, timer, wait or child keeps its value under its name"
            )));
        }
    }
    let history = history_or_none(store, run_id).await?;
    // Read before the record: steps completed since have no row in it.
    let covered = history.iter().map(|r| r.index + 1).max().unwrap_or(0);
    let versions = versions_of(&history);
    let cp = super::modify(store, run_id, "migrate", clock, |cp, now| {
        super::check_not_held(cp, now)?;
        super::check_not_building(cp, "migrate")?;
        if cp.status == RunStatus::Completed {
            return Err(refuse("the run has completed: nothing is left to run".into()));
        }
        if cp.origin.is_none() {
            return Err(refuse(
                "the run records no list of steps it started with (a durable function, or a run started before 0.2): only listed runs are migrated".into(),
            ));
        }
        if !history.is_empty() && covered < cp.next {
            return Err(refuse(
                "the run took steps while it was being checked; try again".into(),
            ));
        }
        if let Some(w) = &cp.wait {
            let here = workflow.steps().get(cp.next).map(|s| s.name());
            if here != Some(w.step()) {
                return Err(refuse(format!(
                    "the run waits at {:?}, but the workflow's step {} is {}: decide or let the wait end first",
                    w.step(),
                    cp.next,
                    here.map_or("missing".to_string(), |n| format!("{n:?}"))
                )));
            }
        }
        if cp.workflow != workflow.name() {
            return Err(refuse(format!(
                "the run records workflow {:?}, not {:?}",
                cp.workflow,
                workflow.name()
            )));
        }
        let done = &cp.completed[..cp.next.min(cp.completed.len())];
        for old in map.keys() {
            if !done.iter().any(|n| n == old) {
                return Err(refuse(format!(
                    "rename of {old:?}: the run has no completed step of that name"
                )));
            }
        }
        let recorded: Vec<Recorded> = done
            .iter()
            .enumerate()
            .map(|(i, name)| Recorded {
                name: map.get(name.as_str()).map_or(name.clone(), |n| n.to_string()),
                version: versions.get(&i).cloned(),
            })
            .collect();
        let c = compare(&recorded, workflow, None);
        if let Some(stop) = &c.stops_at {
            return Err(refuse(format!(
                "at step {} the record has {} where the workflow has {} (a plan shows the rest; rename with old=new)",
                stop.at,
                stop.recorded.as_deref().map_or("nothing".into(), |s| format!("{s:?}")),
                stop.given.as_deref().map_or("nothing".into(), |s| format!("{s:?}")),
            )));
        }
        if let Some(s) = c.steps.iter().find(|s| s.action == StepAction::Changed) {
            let fields: Vec<&str> = s.changes.iter().map(|c| c.field.as_str()).collect();
            return Err(refuse(format!(
                "step {:?} ran under another definition ({} changed since); rewind it to run it again under this one instead",
                s.name,
                fields.join(", ")
            )));
        }
        let renamed: Vec<(String, String)> = done
            .iter()
            .filter_map(|n| map.get(n.as_str()).map(|m| (n.clone(), m.to_string())))
            .filter(|(a, b)| a != b)
            .collect();
        for (i, r) in recorded.iter().enumerate() {
            cp.completed[i] = r.name.clone();
        }
        let origin = Origin::listed(workflow.step_names()).versioned(workflow.version());
        cp.push_audit(crate::record::checkpoint::AuditEntry::new(
            crate::record::checkpoint::AuditAction::Migrate {
                steps: origin.steps,
                steps_sha256: origin.steps_sha256.clone(),
                renamed,
                version: origin.version.clone(),
            },
            by,
            now,
        ));
        cp.origin = Some(origin);
        // A worker's mark that it lacked the old version no longer holds.
        cp.passed_over = None;
        Ok(())
    })
    .await?;
    let plan = plan(store, run_id, workflow).await?;
    Ok((cp, plan))
}
