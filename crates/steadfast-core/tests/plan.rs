//! The resume plan: for a run waiting at a gate, each way its workflow can
//! change (a definition edited, a step renamed, removed, inserted before or
//! after the gate, moved, another workflow) is reported as what a resume
//! would do, and nothing is written.

use serde_json::json;
use steadfast_core::ops::plan::{plan, ResumePlan, StepAction};
use steadfast_core::{run, update, Error, MemoryStore, Outcome, Step, Workflow};

/// A step named `name` returning `{name: 1}`, of version `v`.
fn step(name: &str, v: &str) -> Step {
    let key = name.to_string();
    Step::new(name, move |_, _| {
        let key = key.clone();
        async move { update(json!({ key: 1 })) }
    })
    .version(v)
}

fn wf(name: &str, steps: Vec<Step>) -> Workflow {
    Workflow::new(name, steps).unwrap()
}

/// fetch, summarize, gate approve, publish.
fn v1() -> Workflow {
    wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    )
}

/// A store with run "r" of [`v1`] waiting at its gate.
async fn waiting() -> MemoryStore {
    let store = MemoryStore::new();
    let out = run("r", &v1(), &store).await.unwrap();
    assert_eq!(
        out,
        Outcome::Waiting {
            gate: "approve".into()
        }
    );
    store
}

fn actions(p: &ResumePlan) -> Vec<(String, StepAction)> {
    p.steps.iter().map(|s| (s.name.clone(), s.action)).collect()
}

fn names(list: &[(&str, StepAction)]) -> Vec<(String, StepAction)> {
    list.iter().map(|(n, a)| (n.to_string(), *a)).collect()
}

#[tokio::test]
async fn the_same_workflow_is_a_clean_plan() {
    let store = waiting().await;
    let p = plan(&store, "r", &v1()).await.unwrap();
    assert!(p.clean, "{p:?}");
    assert_eq!(p.waiting_at.as_deref(), Some("approve"));
    assert_eq!(
        actions(&p),
        names(&[
            ("fetch", StepAction::Skip),
            ("summarize", StepAction::Skip),
            ("approve", StepAction::Run),
            ("publish", StepAction::Run),
        ])
    );
    assert!(p.stops_at.is_none() && p.accept.is_none() && p.notes.is_empty());
}

#[tokio::test]
async fn an_edited_step_is_changed_with_the_field_that_changed() {
    let store = waiting().await;
    let edited = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "2"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    );
    let p = plan(&store, "r", &edited).await.unwrap();
    assert!(!p.clean && p.stops_at.is_none(), "{p:?}");
    assert_eq!(p.steps[1].action, StepAction::Changed);
    let change = &p.steps[1].changes[0];
    assert_eq!(
        (
            change.field.as_str(),
            change.was.clone(),
            change.now.clone()
        ),
        ("version", Some(json!("1")), Some(json!("2")))
    );
    assert_ne!(p.steps[1].fingerprint, p.steps[1].recorded_fingerprint);
    // A changed step after the run's place is not in the record: not changed.
    let later = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("publish", "9"),
        ],
    );
    assert!(plan(&store, "r", &later).await.unwrap().clean);
}

/// A step defined by a command (as a flow file's are), named `name`.
fn command_step(name: &str, command: &str) -> Step {
    let fields = std::collections::BTreeMap::from([(
        "command".to_string(),
        json!(steadfast_core::StepVersion::digest(command)),
    )]);
    Step::new(name, |_, _| async { update(json!({})) })
        .defined_as(steadfast_core::StepVersion::of_fields(fields).unwrap())
}

#[tokio::test]
async fn a_renamed_step_stops_the_resume_and_accepting_relabels_it() {
    let store = MemoryStore::new();
    let flow = |second: &str| {
        wf(
            "review",
            vec![
                command_step("fetch", "curl"),
                command_step(second, "summarize.sh"),
                Step::gate("approve"),
                command_step("publish", "post"),
            ],
        )
    };
    run("r", &flow("summarize"), &store).await.unwrap();
    let renamed = flow("digest");
    // A declared version alone is no identity: many steps share "1".
    let versioned = wf("review", vec![step("fetch", "1"), step("digest", "1")]);
    let p = plan(&store, "r", &versioned).await.unwrap();
    assert_eq!(p.steps[1].action, StepAction::Removed, "{p:?}");
    let p = plan(&store, "r", &renamed).await.unwrap();
    assert!(!p.clean);
    assert_eq!(p.steps[1].action, StepAction::Renamed);
    assert_eq!(p.steps[1].recorded_name.as_deref(), Some("summarize"));
    let stop = p.stops_at.as_ref().unwrap();
    assert_eq!(
        (stop.at, stop.recorded.as_deref(), stop.given.as_deref()),
        (1, Some("summarize"), Some("digest"))
    );
    let accept = p.accept.as_ref().unwrap();
    assert_eq!(accept.kept, 2);
    assert_eq!(
        accept.relabelled,
        vec![("summarize".to_string(), "digest".to_string())]
    );
    assert_eq!(accept.resumes_at.as_deref(), Some("approve"));
    // What the plan says is what a resume does.
    let refused = run("r", &renamed, &store).await;
    assert!(
        matches!(refused, Err(Error::WorkflowChanged { at: 1, .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_renamed_and_edited_step_is_removed_and_added() {
    let store = waiting().await;
    let replaced = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("digest", "2"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    );
    let p = plan(&store, "r", &replaced).await.unwrap();
    assert_eq!(
        actions(&p),
        names(&[
            ("fetch", StepAction::Skip),
            ("summarize", StepAction::Removed),
            ("digest", StepAction::Added),
            ("approve", StepAction::Run),
            ("publish", StepAction::Run),
        ])
    );
    assert_eq!(p.stops_at.as_ref().unwrap().at, 1);
}

#[tokio::test]
async fn a_step_inserted_before_the_gate_runs_next_and_one_after_it_runs_later() {
    let store = waiting().await;
    let before = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            step("lint", "1"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    );
    let p = plan(&store, "r", &before).await.unwrap();
    assert!(!p.clean && p.stops_at.is_none(), "{p:?}");
    assert_eq!(p.steps[2].name, "lint");
    assert_eq!(p.steps[2].action, StepAction::Run);
    assert!(
        p.notes.iter().any(|n| n.contains("waits at \"approve\"")),
        "{:?}",
        p.notes
    );
    let after = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("notify", "1"),
            step("publish", "1"),
        ],
    );
    let p = plan(&store, "r", &after).await.unwrap();
    assert!(p.stops_at.is_none(), "{p:?}");
    assert_eq!(p.steps[3].action, StepAction::Run);
    // Not the steps the run was started with: said, and not clean.
    assert!(
        !p.clean && p.notes[0].contains("started with 4 step(s)"),
        "{p:?}"
    );
}

#[tokio::test]
async fn a_step_inserted_at_the_start_moves_the_recorded_ones() {
    let store = waiting().await;
    let first = wf(
        "review",
        vec![
            step("setup", "1"),
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    );
    let p = plan(&store, "r", &first).await.unwrap();
    assert_eq!(
        actions(&p),
        names(&[
            ("setup", StepAction::Added),
            ("fetch", StepAction::Moved),
            ("summarize", StepAction::Moved),
            ("approve", StepAction::Run),
            ("publish", StepAction::Run),
        ])
    );
    assert_eq!(p.steps[1].recorded_index, Some(0));
    assert_eq!(p.stops_at.as_ref().unwrap().at, 0);
}

#[tokio::test]
async fn a_removed_step_and_a_shorter_workflow_are_reported() {
    let store = waiting().await;
    let short = wf("review", vec![step("fetch", "1")]);
    let p = plan(&store, "r", &short).await.unwrap();
    assert_eq!(
        actions(&p),
        names(&[
            ("fetch", StepAction::Skip),
            ("summarize", StepAction::Removed),
        ])
    );
    let stop = p.stops_at.as_ref().unwrap();
    assert_eq!((stop.at, stop.given.as_deref()), (1, None));
    let accept = p.accept.as_ref().unwrap();
    assert_eq!(
        (
            accept.kept,
            accept.dropped.clone(),
            accept.resumes_at.clone()
        ),
        (1, vec!["summarize".to_string()], None)
    );
}

#[tokio::test]
async fn another_workflow_stops_at_once_and_an_absent_run_is_an_error() {
    let store = waiting().await;
    let other = wf("other", vec![step("fetch", "1")]);
    let p = plan(&store, "r", &other).await.unwrap();
    assert!(!p.clean && p.stops_at.as_ref().unwrap().at == 0, "{p:?}");
    assert!(p.notes[0].contains("\"review\""), "{:?}", p.notes);
    assert!(matches!(
        plan(&store, "nobody", &v1()).await,
        Err(Error::NoSuchRun { .. })
    ));
}

#[tokio::test]
async fn steps_recorded_without_a_definition_count_as_unchanged() {
    let store = MemoryStore::new();
    let plain = wf(
        "review",
        vec![
            Step::new("fetch", |_, _| async { update(json!({})) }),
            Step::gate("approve"),
        ],
    );
    run("r", &plain, &store).await.unwrap();
    let versioned = wf("review", vec![step("fetch", "7"), Step::gate("approve")]);
    let p = plan(&store, "r", &versioned).await.unwrap();
    assert!(p.clean, "{p:?}");
}

#[tokio::test]
async fn bad_versions_are_refused_when_the_workflow_is_built() {
    for bad in ["", "a\u{7}b", &"v".repeat(101)] {
        let r = Workflow::new("w", vec![step("a", bad)]);
        assert!(
            matches!(r, Err(Error::InvalidWorkflow { .. })),
            "{bad:?}: {r:?}"
        );
    }
}

#[tokio::test]
async fn a_durable_step_records_its_declared_version() {
    use steadfast_core::{durable, StepError, StepOptions, STEP_KEY};
    let store = MemoryStore::new();
    let out = durable("d", &store, "agent", |ctx| async move {
        ctx.step_with("ask", StepOptions::new().version("3"), || async {
            Ok::<_, StepError>(5)
        })
        .await
    })
    .await
    .unwrap();
    assert_eq!(out, Outcome::Completed(5));
    let history = steadfast_core::StoreExt::history(&store, "d")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history[0].update[STEP_KEY]["fields"]["version"], "3");
    // A bad version is refused before the step runs.
    let bad = durable("e", &store, "agent", |ctx| async move {
        ctx.step_with("ask", StepOptions::new().version(""), || async {
            Ok::<_, StepError>(5)
        })
        .await
    })
    .await;
    assert!(matches!(bad, Err(Error::InvalidWorkflow { .. })), "{bad:?}");
}

#[tokio::test]
async fn migrate_with_a_rename_resumes_without_running_the_renamed_step_again() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use steadfast_core::ops::plan::migrate;
    use steadfast_core::{approve, AuditAction, SystemClock};
    let store = waiting().await;
    let digested = Arc::new(AtomicU32::new(0));
    let d = Arc::clone(&digested);
    let v2 = wf(
        "review",
        vec![
            step("fetch", "1"),
            Step::new("digest", move |_, _| {
                d.fetch_add(1, Ordering::SeqCst);
                async { update(json!({"digest": 1})) }
            })
            .version("1"),
            Step::gate("approve"),
            step("publish", "1"),
            step("notify", "1"),
        ],
    );
    // Without the rename: refused, nothing written.
    let before = steadfast_core::Store::load(&store, "r")
        .await
        .unwrap()
        .unwrap();
    let refused = migrate(&store, "r", &v2, &[], "ada", &SystemClock).await;
    assert!(
        matches!(&refused, Err(Error::InvalidInput { reason, .. }) if reason.contains("\"summarize\"")),
        "{refused:?}"
    );
    let after = steadfast_core::Store::load(&store, "r")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.version, before.version);
    // Bad renames: an unknown old name, a new name the flow lacks, twice.
    for renames in [
        vec![("nope", "digest")],
        vec![("summarize", "nope")],
        vec![("summarize", "digest"), ("summarize", "fetch")],
    ] {
        let renames: Vec<(String, String)> = renames
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let r = migrate(&store, "r", &v2, &renames, "ada", &SystemClock).await;
        assert!(
            matches!(r, Err(Error::InvalidInput { .. })),
            "{renames:?}: {r:?}"
        );
    }
    let renames = [("summarize".to_string(), "digest".to_string())];
    let (cp, p) = migrate(&store, "r", &v2, &renames, "ada", &SystemClock)
        .await
        .unwrap();
    assert_eq!(cp.completed, ["fetch", "digest"]);
    assert!(p.clean, "{p:?}");
    match cp.audit.last().map(|e| &e.action) {
        Some(AuditAction::Migrate {
            steps: 5, renamed, ..
        }) => {
            assert_eq!(renamed, &[("summarize".to_string(), "digest".to_string())])
        }
        other => panic!("no migrate entry: {other:?}"),
    }
    approve(&store, "r", "approve", None, "ada", &SystemClock)
        .await
        .unwrap();
    let out = run("r", &v2, &store).await.unwrap();
    assert!(matches!(out, Outcome::Completed(_)), "{out:?}");
    assert_eq!(
        digested.load(Ordering::SeqCst),
        0,
        "the renamed step ran again"
    );
    // A completed run is not moved.
    let done = migrate(&store, "r", &v2, &[], "ada", &SystemClock).await;
    assert!(matches!(done, Err(Error::InvalidInput { .. })), "{done:?}");
}

#[tokio::test]
async fn migrate_refuses_a_step_whose_definition_changed() {
    use steadfast_core::ops::plan::migrate;
    use steadfast_core::SystemClock;
    let store = waiting().await;
    let edited = wf(
        "review",
        vec![
            step("fetch", "2"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("publish", "1"),
        ],
    );
    let r = migrate(&store, "r", &edited, &[], "ada", &SystemClock).await;
    assert!(
        matches!(&r, Err(Error::InvalidInput { reason, .. }) if reason.contains("\"fetch\"") && reason.contains("version")),
        "{r:?}"
    );
}

#[tokio::test]
async fn accepting_a_changed_workflow_makes_the_next_plan_clean() {
    use steadfast_core::Runner;
    let store = waiting().await;
    let v2 = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("approve"),
            step("publish", "1"),
            step("notify", "1"),
        ],
    );
    assert!(!plan(&store, "r", &v2).await.unwrap().clean);
    let other = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("digest", "1"),
            Step::gate("approve"),
            step("publish", "1"),
            step("notify", "1"),
        ],
    );
    Runner::new(&store)
        .accept_changed_workflow(true)
        .run("r", &other)
        .await
        .unwrap();
    let p = plan(&store, "r", &other).await.unwrap();
    assert!(p.clean, "{p:?}");
}

#[tokio::test]
async fn migrate_refuses_a_wait_the_new_flow_moved_and_a_renamed_gate() {
    use steadfast_core::ops::plan::migrate;
    use steadfast_core::SystemClock;
    let store = waiting().await;
    // The gate the run waits at is renamed: refused, decide it first.
    let gate_renamed = wf(
        "review",
        vec![
            step("fetch", "1"),
            step("summarize", "1"),
            Step::gate("sign-off"),
            step("publish", "1"),
        ],
    );
    let r = migrate(&store, "r", &gate_renamed, &[], "ada", &SystemClock).await;
    assert!(
        matches!(&r, Err(Error::InvalidInput { reason, .. }) if reason.contains("waits at \"approve\"")),
        "{r:?}"
    );
    // Renaming onto a gate is refused: its value lives under its name.
    let renames = [("summarize".to_string(), "approve".to_string())];
    let r = migrate(&store, "r", &v1(), &renames, "ada", &SystemClock).await;
    assert!(
        matches!(&r, Err(Error::InvalidInput { reason, .. }) if reason.contains("only steps that run a function")),
        "{r:?}"
    );
    // A durable function's run records no list of steps: refused.
    let out = steadfast_core::durable("d", &store, "review", |ctx| async move {
        ctx.step("fetch", || async { Ok::<_, steadfast_core::StepError>(1) })
            .await?;
        ctx.gate("approve").await
    })
    .await
    .unwrap();
    assert!(matches!(out, Outcome::Waiting { .. }), "{out:?}");
    let r = migrate(&store, "d", &v1(), &[], "ada", &SystemClock).await;
    assert!(
        matches!(&r, Err(Error::InvalidInput { reason, .. }) if reason.contains("only listed runs")),
        "{r:?}"
    );
}

#[tokio::test]
async fn too_many_renames_are_refused_and_nothing_is_written() {
    use steadfast_core::ops::plan::{migrate, MAX_RENAMES};
    use steadfast_core::SystemClock;
    let store = waiting().await;
    let before = steadfast_core::Store::load(&store, "r")
        .await
        .unwrap()
        .unwrap();
    let renames: Vec<(String, String)> = (0..=MAX_RENAMES)
        .map(|i| (format!("s{i}"), "fetch".to_string()))
        .collect();
    let r = migrate(&store, "r", &v1(), &renames, "ada", &SystemClock).await;
    assert!(
        matches!(&r, Err(Error::InvalidInput { reason, .. }) if reason.contains("at most")),
        "{r:?}"
    );
    let after = steadfast_core::Store::load(&store, "r")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.version, before.version);
    // An empty operator name is refused too.
    let r = migrate(&store, "r", &v1(), &[], "", &SystemClock).await;
    assert!(matches!(r, Err(Error::InvalidInput { .. })), "{r:?}");
}
