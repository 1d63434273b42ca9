//! `steadfast approve ID GATE`: record an approval at the gate a run waits at.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `approve`.
#[derive(clap::Args, Debug)]
pub struct ApproveArgs {
    /// The run's id.
    pub id: String,
    /// The gate step's name.
    pub gate: String,
    /// JSON merged into the state under the gate's name.
    #[arg(long)]
    pub data: Option<String>,
    /// Who approves (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Saves the approval; the next `run` goes on past the gate.
pub async fn run(args: ApproveArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let data = super::data_arg(args.data.as_deref())?;
    let (id, gate) = (args.id, args.gate);
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    steadfast::approve(&*ctx.store, &id, &gate, data, &by, &*ctx.clock()).await?;
    output::note(format_args!(
        "approved gate {gate:?} of run {id:?} as {by:?}; run it again to continue"
    ));
    Ok(exit::OK)
}
