//! `steadfast signal ID NAME`: send a named message to a run.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;
use crate::output::out;

/// Arguments of `signal`.
#[derive(clap::Args, Debug)]
pub struct SignalArgs {
    /// The run's id.
    pub id: String,
    /// The signal's name, which a wait names.
    pub name: String,
    /// JSON the signal carries.
    #[arg(long)]
    pub data: Option<String>,
    /// Who sends it (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
    /// Print the signal's number in the run's event log as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Records the signal; a run waiting for it is marked due (the next `run`,
/// or a worker at once, goes on), and a run not yet waiting keeps it for its
/// next wait of that name.
pub async fn run(args: SignalArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let data = super::data_arg(args.data.as_deref())?;
    let (id, name) = (args.id, args.name);
    let by = args.by.unwrap_or_else(steadfast::default_decider);
    let seq = steadfast::signal(&*ctx.store, &id, &name, data, &by, &*ctx.clock()).await?;
    if args.json {
        out!(
            "{}",
            serde_json::json!({ "run_id": id, "signal": name, "seq": seq, "by": by })
        );
    } else {
        output::note(format_args!(
            "sent signal {name:?} to run {id:?} as {by:?} (event #{seq}); a wait for it takes it the next time the run runs"
        ));
    }
    Ok(exit::OK)
}
