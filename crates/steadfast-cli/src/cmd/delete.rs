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
    /// Delete the run even while a live process holds it. That process's
    /// running step goes on (its side effects happen) but its result is
    /// never saved: its next save is refused and it stops, saying the run
    /// was deleted. Without it, a held run is refused with exit code 3.
    #[arg(long)]
    pub force: bool,
}

/// Deletes the run, or says there is none; a run a live process holds is
/// refused (exit 3) unless forced.
pub async fn run(args: DeleteArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let id = args.id.as_str();
    // The raw store: the lease is in the head, readable without the key.
    let existed = steadfast::ops::delete(&*ctx.raw, id, args.force, &*ctx.clock())
        .await
        .with_context(|| format!("deleting run {id:?}"))?;
    if !existed {
        return Err(no_such_run(id, ctx));
    }
    output::note(format_args!("deleted run {id:?}"));
    Ok(exit::OK)
}
