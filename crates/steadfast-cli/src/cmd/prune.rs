//! `steadfast prune ID|--all [--keep-history N]`: fold old per-step history.

use anyhow::Context;
use steadfast::{ops, Error, ListFilter};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `prune`.
#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// The run to prune (or --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub id: Option<String>,
    /// Prune every run.
    #[arg(long)]
    pub all: bool,
    /// Keep the history rows of the last N steps as they are (rewind and
    /// fork can name those steps); fold every older row into one.
    #[arg(long, default_value_t = 0)]
    pub keep_history: usize,
    /// Who prunes (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Prunes one run, or all of them page by page; progress on stderr.
pub async fn run(args: PruneArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let clock = ctx.clock();
    if let Some(id) = args.id {
        match ops::prune(&*ctx.store, &id, args.keep_history, &by, &*clock).await? {
            Some(p) => output::note(format_args!(
                "pruned run {id:?}: {} history row(s) deleted, their updates folded into the row of step {}",
                p.rows_deleted, p.folded_into
            )),
            None => output::note(format_args!(
                "run {id:?} has no more than {} history row(s) to keep: nothing to prune",
                args.keep_history.saturating_add(1)
            )),
        }
        return Ok(exit::OK);
    }
    if !args.all {
        return Err(usage("name a run, or pass --all".into()));
    }
    let (mut runs, mut rows, mut held) = (0u64, 0u64, 0u64);
    let mut filter = ListFilter::new().limit(500);
    loop {
        let page = filter
            .next_page(&*ctx.store)
            .await
            .context("listing runs")?;
        if page.is_empty() {
            break;
        }
        for r in &page {
            match ops::prune(&*ctx.store, &r.run_id, args.keep_history, &by, &*clock).await {
                Ok(Some(p)) => {
                    runs += 1;
                    rows += p.rows_deleted as u64;
                }
                Ok(None) | Err(Error::NoSuchRun { .. }) => {}
                Err(e) if e.is_held_elsewhere() => held += 1,
                Err(e) => return Err(e.into()),
            }
        }
        output::note(format_args!(
            "prune: {runs} run(s) pruned, {rows} row(s) deleted so far"
        ));
    }
    output::note(format_args!(
        "prune: {runs} run(s) pruned, {rows} history row(s) deleted; {held} run(s) held by a live process left alone"
    ));
    Ok(exit::OK)
}
