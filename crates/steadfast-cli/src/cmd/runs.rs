//! `steadfast runs`: list runs, filtered, each labelled when it is stuck.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steadfast::stuck::{diagnose, Stuck};
use steadfast::{ListFilter, RunStatus, Workflow};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::{flow, output};

/// Arguments of `runs`.
#[derive(clap::Args, Debug)]
pub struct RunsArgs {
    /// Only runs with this status.
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs of this workflow.
    #[arg(long)]
    pub workflow: Option<String>,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only runs that cannot make progress by themselves, with the reason.
    #[arg(long)]
    pub stuck: bool,
    /// How long past its time a run may be before it counts as stuck.
    #[arg(long, default_value = "1m", value_parser = parse_after)]
    pub stuck_after: Duration,
    /// Flow files to check the records against: a run whose recorded steps
    /// or version differ from its flow's is labelled workflow-changed
    /// (several versions of one flow may be given).
    #[arg(long = "flow", value_name = "FLOW")]
    pub flows: Vec<PathBuf>,
    /// Only runs started under this version of their workflow (a flow's
    /// declared `version`, or the digest `runs` shows).
    #[arg(long = "version", value_name = "VERSION")]
    pub version: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses `--stuck-after`: 0 to 30 days.
pub(crate) fn parse_after(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d > Duration::from_secs(30 * 24 * 3600) {
        return Err("it must be at most 30 days".into());
    }
    Ok(d)
}

/// The flows given with `--flow`; two of one name must differ in version.
pub(crate) fn load_flows(paths: &[PathBuf]) -> Result<Vec<Workflow>, Failure> {
    let mut out: Vec<Workflow> = Vec::new();
    for p in paths {
        let wf = flow::load(p)?;
        if out
            .iter()
            .any(|w| w.name() == wf.name() && w.version() == wf.version())
        {
            return Err(usage(format!(
                "{}: another flow file given is also flow {:?} at version {:?}",
                p.display(),
                wf.name(),
                wf.version().unwrap_or_default()
            )));
        }
        out.push(wf);
    }
    Ok(out)
}

/// Prints the runs that match.
pub async fn run(args: RunsArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let flows = load_flows(&args.flows)?;
    let mut filter = ListFilter::new();
    if let Some(s) = args.status {
        let status = s
            .parse::<RunStatus>()
            .map_err(|e| usage(format!("--status: {e}")))?;
        filter = filter.status(status);
    }
    if let Some(w) = args.workflow {
        filter = filter.workflow(w);
    }
    if let Some(v) = &args.version {
        steadfast::version::check_version("--version", v).map_err(usage)?;
    }
    // Stuck runs and versions are picked out here: the limit counts those.
    let picked_here = args.stuck || args.version.is_some();
    if let Some(n) = args.limit.filter(|_| !picked_here) {
        filter = filter.limit(n);
    }
    let mut runs = ctx.store.list(&filter).await.context("listing runs")?;
    if let Some(v) = &args.version {
        runs.retain(|r| r.workflow_version.as_deref() == Some(v.as_str()));
    }
    let now = ctx.clock().now();
    let mut labelled = Vec::with_capacity(runs.len());
    let mut unreadable = false;
    for r in runs {
        let finished = matches!(
            r.status,
            RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
        );
        let stuck = if finished {
            None
        } else {
            match label(ctx, &r.run_id, now, args.stuck_after, &flows).await {
                Ok(s) => s,
                // Encrypted without the keys, or unreadable: listed, with
                // no label, and said once.
                Err(e) => {
                    if !unreadable {
                        unreadable = true;
                        output::note(format_args!(
                            "runs: some runs could not be read to label them (first: {}: {:#})",
                            output::clean(&r.run_id),
                            e.error
                        ));
                    }
                    None
                }
            }
        };
        if args.stuck && stuck.is_none() {
            continue;
        }
        labelled.push((r, stuck));
        if picked_here && args.limit.is_some_and(|n| labelled.len() >= n) {
            break;
        }
    }
    output::runs(&labelled, args.json);
    Ok(exit::OK)
}

/// The stuck label of one run (loaded again: a list carries no lease or
/// wait). A run deleted meanwhile has none.
pub(crate) async fn label(
    ctx: &Ctx,
    run_id: &str,
    now: steadfast::Timestamp,
    after: Duration,
    flows: &[Workflow],
) -> Result<Option<Stuck>, Failure> {
    let Some(cp) = ctx
        .store
        .load(run_id)
        .await
        .with_context(|| format!("loading run {run_id:?}"))?
    else {
        return Ok(None);
    };
    let wf = super::run::version_for(flows, &cp);
    Ok(diagnose(&cp, now, after, wf))
}
