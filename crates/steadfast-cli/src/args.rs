//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Durable flows of shell-command steps, and a look into any Steadfast store.
#[derive(Parser, Debug)]
#[command(name = "steadfast", version, about)]
pub struct Cli {
    /// The store: sqlite:PATH, file:PATH or memory:.
    #[arg(long, global = true, env = "STEADFAST_STORE", default_value = steadfast::DEFAULT_STORE_URL)]
    pub store: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start or resume a run of a flow file.
    Run {
        /// The flow file (TOML).
        flow: PathBuf,
        /// The run's id: the same id resumes the same run.
        #[arg(long)]
        run_id: String,
        /// Print the final state as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Sleep through timers instead of stopping at them.
        #[arg(long)]
        wait: bool,
        /// How long a claim on the run lasts without renewal (100ms to 1day).
        #[arg(long, default_value = "30s", value_parser = parse_lease)]
        lease: std::time::Duration,
        /// Resume even though the flow's steps differ from the recorded ones.
        #[arg(long)]
        accept_changed_workflow: bool,
    },
    /// List runs.
    Runs {
        /// Only runs with this status.
        #[arg(long)]
        status: Option<String>,
        /// Only runs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one run: status, steps, state, error, gate or timer, lease.
    Show {
        /// The run's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The per-step records of a run, updates included.
    History {
        /// The run's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve the gate a run waits at.
    Approve {
        /// The run's id.
        id: String,
        /// The gate step's name.
        gate: String,
        /// JSON merged into the state under the gate's name.
        #[arg(long)]
        data: Option<String>,
        /// Who approves (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Reject the gate a run waits at, ending the run.
    Reject {
        /// The run's id.
        id: String,
        /// The gate step's name.
        gate: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
        /// Who rejects (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Delete a run.
    Delete {
        /// The run's id.
        id: String,
    },
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
}

/// Where a flow file's relative paths point: its directory.
pub fn flow_dir(flow: &std::path::Path) -> PathBuf {
    match flow.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Parses `--lease`: a duration within [`steadfast::limits::LEASE`].
fn parse_lease(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    steadfast::limits::LEASE.check("the lease", d)
}
