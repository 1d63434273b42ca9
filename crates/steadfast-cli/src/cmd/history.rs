//! `steadfast history ID`: the per-step records of a run.

use super::{no_such_run, Ctx, Failure};
use crate::args::exit;
use crate::output;
use steadfast::StoreExt as _;

/// Arguments of `history`.
#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    /// The run's id.
    pub id: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints each completed step: attempt, times and update.
pub async fn run(args: HistoryArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let id = args.id.as_str();
    steadfast::validate_run_id(id)?;
    let history = match ctx.store.history(id).await {
        Ok(Some(h)) => h,
        Ok(None) => return Err(no_such_run(id, ctx)),
        Err(e) => return Err(read_error(id, e)),
    };
    // The audit entries live in the run's record.
    let audit = match ctx.store.load(id).await {
        Ok(Some(cp)) => cp.audit,
        Ok(None) => Vec::new(),
        Err(e) => return Err(read_error(id, e)),
    };
    output::history(&history, &audit, args.json);
    Ok(exit::OK)
}

/// A failure to read a run's history.
pub(crate) fn read_error(id: &str, e: steadfast::StoreError) -> Failure {
    anyhow::Error::new(e)
        .context(format!("reading the history of {id:?}"))
        .into()
}
