//! `steadfast schedule add NAME FLOW --cron EXPR [--tz ZONE] [--input JSON]
//! [--catch-up N]`, `schedule list` and `schedule remove NAME`: runs of a
//! flow started by workers at every slot of a cron expression.

use std::path::PathBuf;

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output::{self, out};
use crate::{command, flow};
use steadfast::StoreExt as _;

/// Arguments of `schedule`.
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// `add`, `list` or `remove`.
    #[command(subcommand)]
    pub what: ScheduleCommand,
}

/// What `schedule` does.
#[derive(clap::Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add a schedule: a `steadfast worker` for the flow starts one run per
    /// slot, with the id `NAME@SLOT` (the slot in UTC).
    Add(AddArgs),
    /// List the schedules and their next slots.
    List(ListArgs),
    /// Remove a schedule (the runs it started stay).
    Remove(RemoveArgs),
}

/// Arguments of `schedule add`.
#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The schedule's name (letters, digits, `_`, `-`, `.`; at most 100 bytes).
    pub name: String,
    /// The flow file (TOML) each slot runs; workers are started with it.
    pub flow: PathBuf,
    /// The slots: five cron fields (minute hour day-of-month month
    /// day-of-week), or six with seconds first.
    #[arg(long)]
    pub cron: String,
    /// The IANA time zone the cron fields are read in.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Each run's first state: a JSON object.
    #[arg(long)]
    pub input: Option<String>,
    /// How many missed slots a worker starts besides the latest, after no
    /// worker looked for a while (0 to 1000); older ones are skipped.
    #[arg(long, default_value_t = steadfast::DEFAULT_CATCH_UP)]
    pub catch_up: u32,
    /// Print the schedule as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `schedule list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `schedule remove`.
#[derive(clap::Args, Debug)]
pub struct RemoveArgs {
    /// The schedule's name.
    pub name: String,
}

/// Runs `schedule add`, `list` or `remove`.
pub async fn run(args: ScheduleArgs, ctx: &Ctx) -> Result<i32, Failure> {
    match args.what {
        ScheduleCommand::Add(a) => {
            // The flow (and the flows its child steps run) must load, as a
            // worker will load them.
            let workflow = flow::load_family(&a.flow)?
                .into_iter()
                .next()
                .map(|(_, wf)| wf)
                .ok_or_else(|| flow::FlowError(format!("{}: no flow", a.flow.display())))?;
            let input = match &a.input {
                Some(text) => {
                    command::parse_json_exact(text).map_err(|e| usage(format!("--input: {e}")))?
                }
                None => serde_json::Value::Null,
            };
            let schedule = steadfast::CronSchedule::new(&a.name, workflow.name(), &a.cron, &a.tz)
                .map_err(|r| usage(format!("schedule {:?}: {r}", a.name)))?
                .input(input)
                .catch_up(a.catch_up);
            let entry = steadfast::schedule_ops::add_schedule(
                &*ctx.store,
                schedule,
                &*ctx
                    .store
                    .clock()
                    .unwrap_or_else(|| std::sync::Arc::new(steadfast::SystemClock)),
            )
            .await?;
            if a.json {
                out!("{}", serde_json::to_value(&entry).unwrap_or_default());
            } else {
                output::note(format_args!(
                    "schedule {:?} starts {:?} at {:?} ({}); next slot {}; a `steadfast worker` for its flow starts the runs",
                    entry.schedule.name,
                    entry.schedule.workflow,
                    entry.schedule.cron,
                    entry.schedule.zone,
                    entry.next.map_or("none".into(), |t| t.to_string()),
                ));
            }
            Ok(exit::OK)
        }
        ScheduleCommand::List(a) => {
            let all = steadfast::schedule_ops::list_schedules(&*ctx.store).await?;
            if a.json {
                out!("{}", serde_json::to_value(&all).unwrap_or_default());
                return Ok(exit::OK);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|e| {
                    vec![
                        e.schedule.name.clone(),
                        e.schedule.workflow.clone(),
                        e.schedule.cron.clone(),
                        e.schedule.zone.clone(),
                        e.schedule.catch_up.to_string(),
                        e.schedule.since.to_string(),
                        e.next.map_or(String::new(), |t| t.to_string()),
                    ]
                })
                .collect();
            output::table(
                &[
                    "NAME",
                    "WORKFLOW",
                    "CRON",
                    "ZONE",
                    "CATCH-UP",
                    "DONE UP TO",
                    "NEXT",
                ],
                &rows,
            );
            Ok(exit::OK)
        }
        ScheduleCommand::Remove(a) => {
            if steadfast::schedule_ops::remove_schedule(&*ctx.store, &a.name).await? {
                output::note(format_args!(
                    "schedule {:?} removed; the runs it started stay",
                    a.name
                ));
                Ok(exit::OK)
            } else {
                Err(usage(format!("no schedule {:?} on this store", a.name)))
            }
        }
    }
}
