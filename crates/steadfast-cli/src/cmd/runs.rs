//! `steadfast runs`: list runs, filtered.

use anyhow::Context;
use steadfast::{ListFilter, RunStatus};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

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
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints the runs that match.
pub async fn run(args: RunsArgs, ctx: &Ctx) -> Result<i32, Failure> {
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
    if let Some(n) = args.limit {
        filter = filter.limit(n);
    }
    let runs = ctx.store.list(&filter).await.context("listing runs")?;
    output::runs(&runs, args.json);
    Ok(exit::OK)
}
