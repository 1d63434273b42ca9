//! `steadfast rewind ID --to STEP`: run a run again from one of its steps.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `rewind`.
#[derive(clap::Args, Debug)]
pub struct RewindArgs {
    /// The run's id.
    pub id: String,
    /// The completed step to run next (its name, or its index).
    #[arg(long)]
    pub to: String,
    /// Who rewinds (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Sets the run back: STEP and the steps after it run again, on the state
/// as it was before STEP.
pub async fn run(args: RewindArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let id = args.id;
    let cp = steadfast::ops::rewind(&*ctx.store, &id, &args.to, &by, &*ctx.clock()).await?;
    let text = cp
        .audit
        .last()
        .map(|e| e.action.describe())
        .unwrap_or_default();
    output::note(format_args!(
        "run {id:?}: {}; run it again, or let a worker take it",
        output::clean(&text)
    ));
    Ok(exit::OK)
}
