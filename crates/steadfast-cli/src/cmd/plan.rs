//! `steadfast plan ID --flow FLOW.toml`: what resuming a run with a flow
//! would do, without doing it.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::flow;
use crate::output::out;
use steadfast::ops::plan::{PlannedStep, ResumePlan, StepAction};

/// Arguments of `plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The run's id.
    pub id: String,
    /// The flow file a resume would run it with.
    #[arg(long, value_name = "FLOW")]
    pub flow: std::path::PathBuf,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints the plan; exits 0 when the resume is clean and
/// [`exit::CHANGED`] when anything recorded differs from the flow.
pub async fn run(args: PlanArgs, ctx: &Ctx) -> Result<i32, Failure> {
    steadfast::validate_run_id(&args.id)?;
    let workflow = flow::load(&args.flow)?;
    let plan = steadfast::ops::plan::plan(&*ctx.store, &args.id, &workflow).await?;
    if args.json {
        out!("{}", serde_json::to_value(&plan).unwrap_or_default());
    } else {
        print(&plan, &args.flow);
    }
    Ok(if plan.clean { exit::OK } else { exit::CHANGED })
}

fn print(p: &ResumePlan, flow: &std::path::Path) {
    let standing = match &p.waiting_at {
        Some(w) => format!("waits at {w:?}"),
        None => format!("{:?}", p.status).to_lowercase(),
    };
    out!(
        "run {:?} (workflow {:?}, {standing}, {} step(s) done), resumed with {}:",
        p.run_id,
        p.workflow,
        p.next,
        flow.display()
    );
    let width = p
        .steps
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .min(40);
    if p.recorded_version.is_some() || p.given_version.is_some() {
        let name = |v: &Option<String>| {
            v.as_deref().map_or("none".to_string(), |v| {
                format!("{:?}", crate::output::clean(v))
            })
        };
        out!(
            "  version: started under {}; the flow is {}",
            name(&p.recorded_version),
            name(&p.given_version)
        );
    }
    for s in &p.steps {
        let index = s.index.map_or("-".to_string(), |i| i.to_string());
        out!("  {index:>3}  {:<width$}  {}", s.name, describe(s, p));
    }
    for note in &p.notes {
        out!("note: {note}");
    }
    if let Some(stop) = &p.stops_at {
        out!(
            "a resume stops at step {} (workflow changed): the record has {} where the flow has {}",
            stop.at,
            stop.recorded
                .as_deref()
                .map_or("nothing".into(), |s| format!("{s:?}")),
            stop.given
                .as_deref()
                .map_or("nothing".into(), |s| format!("{s:?}")),
        );
    }
    if let Some(a) = &p.accept {
        let mut parts = vec![format!("{} recorded step(s) count", a.kept)];
        for (was, now) in &a.relabelled {
            parts.push(format!("{was:?} counts as {now:?}"));
        }
        if !a.dropped.is_empty() {
            parts.push(format!("no longer counted: {:?}", a.dropped));
        }
        parts.push(match &a.resumes_at {
            Some(s) => format!("goes on at {s:?}"),
            None => "nothing is left to run".to_string(),
        });
        out!("with --accept-changed-workflow: {}", parts.join("; "));
    }
    out!(
        "{}",
        if p.clean {
            "clean: the resume skips what is recorded and runs the rest"
        } else {
            "changed: see above (exit 7)"
        }
    );
}

fn describe(s: &PlannedStep, p: &ResumePlan) -> String {
    match s.action {
        StepAction::Skip => "skip (recorded)".into(),
        StepAction::Changed => {
            let changes: Vec<String> = s
                .changes
                .iter()
                .map(|c| {
                    format!(
                        "{} {} -> {}",
                        crate::output::clean(&c.field),
                        shown(&c.was),
                        shown(&c.now)
                    )
                })
                .collect();
            format!("changed since it ran, skipped: {}", changes.join("; "))
        }
        StepAction::Removed => format!(
            "removed (recorded as step {})",
            s.recorded_index.unwrap_or_default()
        ),
        StepAction::Renamed => format!(
            "renamed from {:?} (same definition)",
            s.recorded_name.as_deref().unwrap_or_default()
        ),
        StepAction::Added => "added before the run's place: never ran in this run".into(),
        StepAction::Moved => format!(
            "moved (recorded as step {})",
            s.recorded_index.unwrap_or_default()
        ),
        StepAction::Run if s.index == Some(p.next) => match &p.waiting_at {
            Some(w) if *w == s.name => "run (the run waits here)".into(),
            Some(w) => format!("run (next; the run waited at {w:?})"),
            None => "run (next)".into(),
        },
        StepAction::Run => "run".into(),
    }
}

fn shown(v: &Option<serde_json::Value>) -> String {
    match v {
        None => "(none)".into(),
        Some(serde_json::Value::String(s)) => crate::output::clean(s).to_string(),
        Some(v) => crate::output::clean(&v.to_string()).to_string(),
    }
}

/// Arguments of `migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The run's id.
    pub id: String,
    /// The flow file of the version to move the run to.
    #[arg(long, value_name = "FLOW")]
    pub flow: std::path::PathBuf,
    /// A recorded step now known by another name (repeatable).
    #[arg(long = "rename", value_name = "OLD=NEW", value_parser = parse_rename)]
    pub renames: Vec<(String, String)>,
    /// Who moves it (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
    /// Print the plan after the move as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_rename(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((old, new)) if !old.is_empty() && !new.is_empty() => {
            Ok((old.to_string(), new.to_string()))
        }
        _ => Err(format!("{text:?}: write OLD=NEW, both step names")),
    }
}

/// Moves the run to the flow's version when its plan is clean (after the
/// renames); prints the plan after the move.
pub async fn migrate(args: MigrateArgs, ctx: &Ctx) -> Result<i32, Failure> {
    steadfast::validate_run_id(&args.id)?;
    let workflow = flow::load(&args.flow)?;
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let clock = ctx.clock();
    let (_, plan) = steadfast::ops::plan::migrate(
        &*ctx.store,
        &args.id,
        &workflow,
        &args.renames,
        &by,
        &*clock,
    )
    .await?;
    if args.json {
        out!("{}", serde_json::to_value(&plan).unwrap_or_default());
    } else {
        crate::output::note(format_args!(
            "run {:?} moved to {} (audit: migrate, by {by})",
            args.id,
            args.flow.display()
        ));
        print(&plan, &args.flow);
    }
    Ok(if plan.clean { exit::OK } else { exit::CHANGED })
}
