//! `steadfast reject ID GATE`: record a rejection, which ends the run.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `reject`.
#[derive(clap::Args, Debug)]
pub struct RejectArgs {
    /// The run's id.
    pub id: String,
    /// The gate step's name.
    pub gate: String,
    /// Why.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who rejects (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Saves the rejection; the run is over.
pub async fn run(args: RejectArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let (id, gate) = (args.id, args.gate);
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    steadfast::reject(&*ctx.store, &id, &gate, args.reason, &by, &*ctx.clock()).await?;
    output::note(format_args!(
        "rejected gate {gate:?} of run {id:?} as {by:?}; the run is over"
    ));
    Ok(exit::OK)
}
