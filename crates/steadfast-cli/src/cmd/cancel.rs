//! `steadfast cancel ID`: stop a run for good.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `cancel`.
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// The run's id.
    pub id: String,
    /// Why (kept in the run's audit entry).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who cancels (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Marks the run cancelled; a process running it stops at its next step
/// boundary, or after its grace period.
pub async fn run(args: CancelArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let id = args.id;
    let cp = steadfast::ops::cancel(&*ctx.store, &id, args.reason, &by, &*ctx.clock()).await?;
    let was = match cp.audit.last().map(|e| &e.action) {
        Some(steadfast::AuditAction::Cancel { was, .. }) => was.to_string(),
        _ => "?".into(),
    };
    output::note(format_args!(
        "cancelled run {id:?} (it was {was}) as {by:?}; a process running it stops at its next step"
    ));
    Ok(exit::OK)
}
