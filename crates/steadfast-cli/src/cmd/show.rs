//! `steadfast show ID`: one run, with its steps, state, error, wait and lease.

use anyhow::Context;

use super::{no_such_run, Ctx, Failure};
use crate::args::exit;
use crate::output;
use steadfast::StoreExt as _;

/// Arguments of `show`.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// The run's id.
    pub id: String,
    /// How long past its time a run may be before it counts as stuck.
    #[arg(long, default_value = "1m", value_parser = super::runs::parse_after)]
    pub stuck_after: std::time::Duration,
    /// Flow files to check the record against (see `runs --flow`).
    #[arg(long = "flow", value_name = "FLOW")]
    pub flows: Vec<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints the run; a store without per-step history shows step names only.
pub async fn run(args: ShowArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let id = args.id.as_str();
    steadfast::validate_run_id(id)?;
    let flows = super::runs::load_flows(&args.flows)?;
    let cp = ctx
        .store
        .load(id)
        .await
        .with_context(|| format!("loading run {id:?}"))?
        .ok_or_else(|| no_such_run(id, ctx))?;
    let history = match ctx.store.history(id).await {
        Ok(h) => h,
        Err(e) if e.kind() == steadfast::StoreErrorKind::Unsupported => None,
        // With encryption on, old step records may be plaintext (written
        // before a migration) or under a retired key: the run itself, which
        // opened, is still shown.
        Err(e) if ctx.sealed.is_some() && e.kind() == steadfast::StoreErrorKind::Corrupt => {
            output::note(format_args!(
                "the step history of run {id:?} cannot be opened: {}",
                output::clean(&steadfast::error_chain(&e))
            ));
            None
        }
        Err(e) => return Err(super::history::read_error(id, e)),
    };
    let wf = super::run::version_for(&flows, &cp);
    let stuck = steadfast::stuck::diagnose(&cp, ctx.clock().now(), args.stuck_after, wf);
    let usage = ctx
        .store
        .usage(id)
        .await
        .with_context(|| format!("measuring what run {id:?} stores"))?;
    output::show(
        &cp,
        history.as_deref(),
        stuck.as_ref(),
        usage.as_ref(),
        args.json,
    );
    Ok(exit::OK)
}
