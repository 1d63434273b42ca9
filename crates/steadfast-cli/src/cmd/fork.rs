//! `steadfast fork ID --at STEP --as NEW_ID`: copy a run's first steps to a
//! new run.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `fork`.
#[derive(clap::Args, Debug)]
pub struct ForkArgs {
    /// The run to copy.
    pub id: String,
    /// The completed step the new run resumes at (its name, or its index);
    /// the steps before it are copied.
    #[arg(long)]
    pub at: String,
    /// The new run's id.
    #[arg(long = "as", value_name = "NEW_ID")]
    pub new_id: String,
    /// Who forks (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Writes the new run; the original is left as it is.
pub async fn run(args: ForkArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let cp = steadfast::ops::fork(
        &*ctx.store,
        &args.id,
        &args.at,
        &args.new_id,
        &by,
        &*ctx.clock(),
    )
    .await?;
    output::note(format_args!(
        "forked run {:?} as {:?} with its first {} step(s); it resumes at step {}",
        args.id, args.new_id, cp.next, cp.next
    ));
    Ok(exit::OK)
}
