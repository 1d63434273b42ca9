//! Command-line arguments.

use clap::{Parser, Subcommand};

use crate::cmd;

/// Durable flows of shell-command steps, and a look into any Steadfast store.
#[derive(Parser, Debug)]
#[command(name = "steadfast", version, about)]
pub struct Cli {
    /// The store's URL; the forms this build opens come from the facade's
    /// list of backends.
    #[arg(long, global = true, env = "STEADFAST_STORE", default_value = steadfast::DEFAULT_STORE_URL, help = store_help())]
    pub store: String,
    /// Show the run, step and store spans on stderr as they end (-v runs
    /// and steps, -vv store calls too, -vvv everything).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The help of `--store`: the URL forms of every backend of this build.
fn store_help() -> String {
    format!(
        "The store: {}",
        steadfast::store::backend::Backend::urls_of(steadfast::BACKENDS)
    )
}

/// The commands; each one's arguments and code are in its own file under
/// `cmd/`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start or resume a run of a flow file.
    Run(cmd::run::RunArgs),
    /// Record a run for workers to pick up (exit 0 also when it exists as started the same way).
    Start(cmd::start::StartArgs),
    /// Run the due runs of flow files until SIGTERM or SIGINT.
    Worker(cmd::worker::WorkerArgs),
    /// List runs.
    Runs(cmd::runs::RunsArgs),
    /// Show one run: status, steps, state, error, gate or timer, lease.
    Show(cmd::show::ShowArgs),
    /// What resuming a run with a flow would do: steps skipped, changed, moved, added (exit 7 if anything changed).
    Plan(cmd::plan::PlanArgs),
    /// Move a run to a newer version of its flow (its plan must be clean after the renames).
    Migrate(cmd::plan::MigrateArgs),
    /// The per-step records of a run, updates included.
    History(cmd::history::HistoryArgs),
    /// A run's events and steps as they happen, until it ends or stops.
    Watch(cmd::watch::WatchArgs),
    /// Approve the gate a run waits at.
    Approve(cmd::approve::ApproveArgs),
    /// Send a named message to a run: a wait for it takes it.
    Signal(cmd::signal::SignalArgs),
    /// Set or list shared concurrency and rate limits (`limit = "KEY:N"` in a step).
    Limits(cmd::limits::LimitsArgs),
    /// Add, list or remove schedules: a flow started by workers at every slot of a cron expression.
    Schedule(cmd::schedule::ScheduleArgs),
    /// Reject the gate a run waits at, ending the run.
    Reject(cmd::reject::RejectArgs),
    /// Delete a run.
    Delete(cmd::delete::DeleteArgs),
    /// Cancel a run: a process running it stops at its next step.
    Cancel(cmd::cancel::CancelArgs),
    /// Give a failed run's failed step a fresh attempt budget.
    Retry(cmd::retry::RetryArgs),
    /// Set a run back so that one of its completed steps runs next.
    Rewind(cmd::rewind::RewindArgs),
    /// Copy a run's first steps into a new run that resumes after them.
    Fork(cmd::fork::ForkArgs),
    /// Delete finished runs older than a cutoff, in batches.
    Gc(cmd::gc::GcArgs),
    /// Fold old per-step history into one row, keeping the last N rows.
    Prune(cmd::prune::PruneArgs),
    /// Write runs as JSON Lines (one run per line: record, history, checksum).
    Export(cmd::export::ExportArgs),
    /// Read runs written by export into the store (resumable, idempotent).
    Import(cmd::import::ImportArgs),
    /// Copy every run from one store to another (resumable, idempotent).
    Copy(cmd::copy::CopyArgs),
    /// Rewrite every run under the current encryption key (resumable).
    Rekey(cmd::rekey::RekeyArgs),
    /// Serve a web page over the store: runs, timelines, the inbox of gates.
    Serve(cmd::serve::ServeArgs),
    /// Internal: runs a step command so that it dies with this process's parent.
    #[command(name = "__supervise", hide = true)]
    Supervise {
        /// The shell command.
        command: String,
    },
}

/// The documented exit codes of `steadfast`.
pub mod exit {
    /// The run completed (or the command succeeded).
    pub const OK: i32 = 0;
    /// A step failed, or the store failed.
    pub const FAILED: i32 = 1;
    /// Bad usage or a bad flow file.
    pub const USAGE: i32 = 2;
    /// Another owner holds the run.
    pub const HELD: i32 = 3;
    /// The run waits at a gate or sleeps at a timer.
    pub const WAITING: i32 = 4;
    /// The run was rejected at a gate.
    pub const REJECTED: i32 = 5;
    /// The run was cancelled (before the call, or during it).
    pub const CANCELLED: i32 = 6;
    /// `plan`: the flow differs from what the run recorded.
    pub const CHANGED: i32 = 7;
}
