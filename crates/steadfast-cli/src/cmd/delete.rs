//! `steadfast delete ID`: remove a run from the store.

use anyhow::Context;

use super::{no_such_run, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `delete`.
#[derive(clap::Args, Debug)]
pub struct DeleteArgs {
    /// The run's id.
    pub id: String,
}

/// Deletes the run, or says there is none.
pub async fn run(args: DeleteArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let id = args.id.as_str();
    steadfast::validate_run_id(id)?;
    let existed = ctx
        .store
        .delete(id)
        .await
        .with_context(|| format!("deleting run {id:?}"))?;
    if !existed {
        return Err(no_such_run(id, ctx));
    }
    output::note(format_args!("deleted run {id:?}"));
    Ok(exit::OK)
}
