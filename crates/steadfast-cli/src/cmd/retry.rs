//! `steadfast retry ID`: give a failed run's step a fresh attempt budget.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `retry`.
#[derive(clap::Args, Debug)]
pub struct RetryArgs {
    /// The run's id.
    pub id: String,
    /// Who retries (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Clears the failed run's error and attempts; the next `run` or worker
/// tries the failed step again.
pub async fn run(args: RetryArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let id = args.id;
    let cp = steadfast::ops::retry(&*ctx.store, &id, &by, &*ctx.clock()).await?;
    output::note(format_args!(
        "run {id:?} will try step {} again; run it, or let a worker take it",
        cp.next
    ));
    Ok(exit::OK)
}
