//! `steadfast start FLOW --run-id ID [--input JSON] [--priority N]
//! [--partition KEY]`: record a run for workers to pick up.

use std::path::PathBuf;

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::{command, flow, output};

/// Arguments of `start`.
#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// The flow file (TOML); the run is recorded under its name.
    pub flow: PathBuf,
    /// The run's id. Starting an id that exists with the same flow and
    /// input changes nothing (exit 0); with another flow (name or steps)
    /// or input it is refused with exit 2, and the run is left as it is.
    #[arg(long)]
    pub run_id: String,
    /// The run's first state: a JSON object.
    #[arg(long)]
    pub input: Option<String>,
    /// Workers claim runs of higher priority first (-1000 to 1000).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// A partition key (a tenant, say): within a priority, workers share
    /// their claims between partitions, so one partition's backlog does not
    /// hold back another's runs.
    #[arg(long)]
    pub partition: Option<String>,
}

/// Records the run as pending; exit 0 whether it is new or already there
/// as started the same way, 2 when it is there started otherwise.
pub async fn run(args: StartArgs, ctx: &Ctx) -> Result<i32, Failure> {
    // The flows its child steps run are checked too (a worker loads them).
    let workflow = flow::load_family(&args.flow)?
        .into_iter()
        .next()
        .map(|(_, wf)| wf)
        .ok_or_else(|| flow::FlowError(format!("{}: no flow", args.flow.display())))?;
    let input = match &args.input {
        Some(text) => {
            command::parse_json_exact(text).map_err(|e| usage(format!("--input: {e}")))?
        }
        None => serde_json::Value::Null,
    };
    let mut options = steadfast::StartOptions::new()
        .listed(&workflow)
        .priority(args.priority);
    if let Some(p) = &args.partition {
        options = options.partition(p.clone());
    }
    options
        .queue
        .check()
        .map_err(|r| usage(format!("--priority/--partition: {r}")))?;
    let created =
        steadfast::start_with(&*ctx.store, workflow.name(), &args.run_id, input, &options).await?;
    let id = output::shell_quote(&args.run_id);
    if created {
        output::note(format_args!(
            "run {id} of {:?} is pending; a `steadfast worker` for its flow will run it",
            workflow.name()
        ));
    } else {
        output::note(format_args!("run {id} already exists; left as it is"));
    }
    Ok(exit::OK)
}
