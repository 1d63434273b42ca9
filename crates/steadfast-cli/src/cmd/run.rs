//! `steadfast run FLOW... --run-id ID`: start or resume a run of a flow
//! file, under the version of the flow the run was started with.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast::{
    current_owner, Checkpoint, Clock, Outcome, RunStatus, Runner, SystemClock, Workflow,
};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::{command, flow, output};

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The flow file (TOML); several versions of one flow may be given,
    /// oldest first: an existing run resumes under the version it was
    /// started with, a new run starts under the last.
    #[arg(required = true, value_name = "FLOW")]
    pub flows: Vec<PathBuf>,
    /// The run's id: the same id resumes the same run.
    #[arg(long)]
    pub run_id: String,
    /// Print the final state as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Sleep through timers instead of stopping at them.
    #[arg(long)]
    pub wait: bool,
    /// How long a claim on the run lasts without renewal (100ms to 1day).
    #[arg(long, default_value = "30s", value_parser = parse_lease)]
    pub lease: Duration,
    /// Resume even though the flow's steps differ from the recorded ones.
    #[arg(long)]
    pub accept_changed_workflow: bool,
    /// When the run is cancelled while a step runs, how long the step may
    /// go on before its process group is killed (0 to 1h).
    #[arg(long, default_value = "10s", value_parser = super::worker::parse_grace)]
    pub cancel_grace: Duration,
    /// Budgets for a new run (`tokens=200000,usd=5`): past one, the run
    /// stops at its `budget` gate before its next step. It takes the place
    /// of the flow's `[budget]`; a run keeps the budget it started with.
    #[arg(long, value_parser = parse_budget)]
    pub budget: Option<Budget>,
}

/// Budgets given on the command line.
pub type Budget = std::collections::BTreeMap<String, f64>;

/// Parses `--budget NAME=AMOUNT,...`.
pub(crate) fn parse_budget(text: &str) -> Result<Budget, String> {
    let b = steadfast::parse_amounts(text)?;
    if b.is_empty() {
        return Err("give at least one NAME=AMOUNT".into());
    }
    Ok(b)
}

/// Parses `--lease`: a duration within [`steadfast::limits::LEASE`].
pub(crate) fn parse_lease(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    steadfast::limits::LEASE.check("the lease", d)
}

/// The runner for run `run_id` with the command's options.
fn runner_for<'a>(args: &RunArgs, ctx: &'a Ctx, run_id: &str) -> Runner<'a, dyn steadfast::Store> {
    let runner = Runner::new(&*ctx.store);
    // The budget given is the named run's; its children have their flows'.
    let runner = match &args.budget {
        Some(b) if run_id == args.run_id => runner.budget(b.clone()),
        _ => runner,
    };
    runner
        .lease(current_owner(), args.lease)
        .wait_for_timers(args.wait)
        .accept_changed_workflow(args.accept_changed_workflow)
        .cancel_grace(args.cancel_grace)
        .on_takeover({
            let run_id = run_id.to_string();
            move |old| command::stop_steps_of(&old.owner, &run_id)
        })
        .on_slot_reclaimed(command::stop_steps_of)
        .observer(output::progress)
}

/// Runs `run_id` of `workflow`; while it waits for child runs of flows in
/// `family`, runs those children here (one after another, each the same
/// way) and then the run again, until it ends or waits for something else
/// (a child at a gate, a signal or a timer, or a child of another flow,
/// which a worker runs).
async fn drive(
    args: &RunArgs,
    ctx: &Ctx,
    run_id: &str,
    workflow: &Workflow,
    family: &[Workflow],
    depth: usize,
) -> Result<Outcome, steadfast::Error> {
    let ended = |s: RunStatus| {
        matches!(
            s,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Rejected | RunStatus::Cancelled
        )
    };
    loop {
        let out = runner_for(args, ctx, run_id).run(run_id, workflow).await?;
        if !matches!(out, Outcome::Waiting { .. }) || depth >= 64 {
            return Ok(out);
        }
        let runs = match ctx.store.load(run_id).await {
            Ok(Some(cp)) => match cp.wait {
                Some(steadfast::Wait::Children { runs, .. }) => runs,
                _ => return Ok(out),
            },
            _ => return Ok(out),
        };
        // Only a child that ended in this round can move the parent on: one
        // that had ended before is one the parent could not take yet (held
        // by someone).
        let mut moved = false;
        for child in &runs {
            let Ok(Some(cp)) = ctx.store.load(child).await else {
                continue;
            };
            let Some(wf) = version_for(family, &cp) else {
                continue;
            };
            if ended(cp.status) {
                continue;
            }
            match Box::pin(drive(args, ctx, child, wf, family, depth + 1)).await {
                Ok(Outcome::Completed(_)) => moved = true,
                Ok(_) => {}
                Err(e) => {
                    output::note(format_args!(
                        "child run {child:?}: {}",
                        output::clean(&steadfast::error_chain(&e))
                    ));
                    moved |= matches!(
                        ctx.store.load(child).await,
                        Ok(Some(cp)) if ended(cp.status)
                    );
                }
            }
        }
        if !moved {
            return Ok(out);
        }
    }
}

/// The flow of `cp`'s workflow in `family` that the run was started under:
/// the newest of that name whose version it resumes under, else the
/// newest of that name (whose run then refuses the other version).
pub(crate) fn version_for<'a>(family: &'a [Workflow], cp: &Checkpoint) -> Option<&'a Workflow> {
    let named = || family.iter().rev().filter(|w| w.name() == cp.workflow);
    named()
        .find(|w| cp.origin.as_ref().is_none_or(|o| o.runs_under(w.version())))
        .or_else(|| named().next())
}

/// The flows given, oldest version first, and every flow they and the
/// flows their child steps run (each file once). Two files of one name
/// must differ in version.
pub(crate) fn load_versions(paths: &[PathBuf]) -> Result<(Vec<Workflow>, Vec<Workflow>), Failure> {
    let mut given = Vec::new();
    let mut family: Vec<(PathBuf, Workflow)> = Vec::new();
    for path in paths {
        for (i, (file, wf)) in flow::load_family(path)?.into_iter().enumerate() {
            if i == 0 {
                given.push(wf.clone());
            }
            if family.iter().any(|(f, _)| *f == file) {
                continue;
            }
            if let Some((had, _)) = family
                .iter()
                .find(|(_, w)| w.name() == wf.name() && w.version() == wf.version())
            {
                return Err(usage(format!(
                    "{}: {} is also flow {:?} at version {:?}; two versions of a flow need versions of their own",
                    file.display(),
                    had.display(),
                    wf.name(),
                    wf.version().unwrap_or_default()
                )));
            }
            family.push((file, wf));
        }
    }
    Ok((given, family.into_iter().map(|(_, wf)| wf).collect()))
}

/// Runs the flow; the exit code says how the run stopped.
pub async fn run(args: RunArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let run_id = args.run_id.as_str();
    steadfast::validate_run_id(run_id)?;
    let (given, family) = load_versions(&args.flows)?;
    let newest = given
        .last()
        .ok_or_else(|| usage("no flow file was given".to_string()))?;
    if let Some(other) = given.iter().find(|w| w.name() != newest.name()) {
        return Err(usage(format!(
            "the flow files given are flows {:?} and {:?}: give one flow, in one or more versions",
            other.name(),
            newest.name()
        )));
    }
    // An existing run resumes under its version; a new one starts under
    // the newest given.
    let existing = ctx.store.load(run_id).await?;
    let workflow = existing
        .as_ref()
        .filter(|cp| cp.workflow == newest.name())
        .and_then(|cp| version_for(&given, cp))
        .unwrap_or(newest);
    let outcome = drive(&args, ctx, run_id, workflow, &family, 0).await?;
    let json = args.json;
    match outcome {
        Outcome::Completed(state) => {
            if json {
                output::out!("{}", Value::Object(state));
            }
            output::note(format_args!("run {run_id:?} completed"));
            Ok(exit::OK)
        }
        Outcome::Waiting { gate } => {
            // A wait for a signal or for child runs stops the run as a
            // gate does; say which.
            let wait = match ctx.store.load(run_id).await {
                Ok(Some(cp)) => cp.wait,
                _ => None,
            };
            let signal = match &wait {
                Some(steadfast::Wait::Signal { signal, .. }) => Some(signal.clone()),
                _ => None,
            };
            if let Some(steadfast::Wait::Children { runs, .. }) = &wait {
                output::note(format_args!(
                    "run {run_id:?} waits at {gate:?} for {} child run(s) that wait themselves (steadfast show {} lists them)",
                    runs.len(),
                    output::shell_quote(run_id)
                ));
                if json {
                    output::out!(
                        "{}",
                        json!({"status": "waiting", "gate": gate, "children": runs})
                    );
                }
                return Ok(exit::WAITING);
            }
            match &signal {
                Some(signal) => output::note(format_args!(
                    "run {run_id:?} waits at {gate:?} for signal {signal:?}: steadfast signal {} {} --data JSON",
                    output::shell_quote(run_id),
                    output::shell_quote(signal)
                )),
                None => output::note(format_args!(
                    "run {run_id:?} waits at gate {gate:?}: steadfast approve {} {}  (or reject)",
                    output::shell_quote(run_id),
                    output::shell_quote(&gate)
                )),
            }
            if json {
                let mut out = json!({"status": "waiting", "gate": gate});
                if let Some(signal) = signal {
                    out["signal"] = json!(signal);
                }
                output::out!("{}", out);
            }
            Ok(exit::WAITING)
        }
        Outcome::Sleeping { until } => {
            let left = until.saturating_since(SystemClock.now());
            output::note(format_args!(
                "run {run_id:?} sleeps until {until} ({} from now); run again then, or with --wait",
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            ));
            if json {
                output::out!("{}", json!({"status": "sleeping", "until": until}));
            }
            Ok(exit::WAITING)
        }
        Outcome::Rejected { gate, reason } => {
            output::note(format_args!(
                "run {run_id:?} was rejected at gate {gate:?}{}",
                reason
                    .map(|r| format!(": {}", output::clean(&r)))
                    .unwrap_or_default()
            ));
            if json {
                output::out!("{}", json!({"status": "rejected", "gate": gate}));
            }
            Ok(exit::REJECTED)
        }
        _ => Ok(exit::FAILED),
    }
}
