//! The `steadfast` command: runs flow files (steps that are shell commands,
//! gates and durable timers) with durable checkpoints, and inspects any store.
//! `main.rs` only calls [`main`].

pub mod args;
pub mod command;
pub mod flow;
pub mod output;

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};
use steadfast::{
    current_owner, Clock, Error, ListFilter, Outcome, RunStatus, Runner, Store, SystemClock,
};

use crate::args::{exit, Cli, Command};

/// Parses the command line, runs the command and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return code;
        }
    };
    if let Command::Supervise { command } = &cli.command {
        return command::supervise(command);
    }
    // One thread: step processes are spawned from it, and their supervisors
    // follow the life of this process through it.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            output::note(format_args!("steadfast: cannot start: {e}"));
            return exit::FAILED;
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(failure) => {
            // One line, whatever a step printed into its error.
            output::note(format_args!(
                "steadfast: {}",
                output::clean(&format!("{:#}", failure.error))
            ));
            failure.code
        }
    }
}

/// An error with the exit code it maps to.
struct Failure {
    code: i32,
    error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error = e.into();
        let code = classify(&error);
        Failure { code, error }
    }
}

fn usage(msg: String) -> Failure {
    Failure {
        code: exit::USAGE,
        error: anyhow::anyhow!(msg),
    }
}

/// The exit code for an error: usage for bad input, held for another owner,
/// failed for the rest.
fn classify(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<flow::FlowError>().is_some() {
        return exit::USAGE;
    }
    if let Some(err) = e.downcast_ref::<Error>() {
        return match err {
            e if e.is_held_elsewhere() => exit::HELD,
            Error::InvalidRunId { .. }
            | Error::InvalidInput { .. }
            | Error::InvalidWorkflow { .. }
            | Error::NotWaiting { .. }
            | Error::NoSuchRun { .. }
            | Error::WorkflowChanged { .. } => exit::USAGE,
            _ => exit::FAILED,
        };
    }
    if let Some(err) = e.downcast_ref::<steadfast::StoreError>() {
        return match err.kind() {
            steadfast::StoreErrorKind::InvalidInput
            | steadfast::StoreErrorKind::Unsupported
            | steadfast::StoreErrorKind::NotFound => exit::USAGE,
            _ => exit::FAILED,
        };
    }
    exit::FAILED
}

async fn dispatch(cli: Cli) -> Result<i32, Failure> {
    // Only `run` may create a store; the other commands work on runs that
    // exist, and say so when the store itself does not.
    let opened = match cli.command {
        Command::Run { .. } => steadfast::open_store(&cli.store),
        _ => steadfast::open_existing_store(&cli.store),
    };
    let store = opened.with_context(|| format!("cannot open the store {}", cli.store))?;
    match cli.command {
        Command::Run {
            flow,
            run_id,
            json,
            wait,
            lease,
            accept_changed_workflow,
        } => {
            run(
                &*store,
                &flow,
                &run_id,
                json,
                wait,
                lease,
                accept_changed_workflow,
            )
            .await
        }
        Command::Runs {
            status,
            workflow,
            limit,
            json,
        } => {
            let mut filter = ListFilter::new();
            if let Some(s) = status {
                filter = filter.status(
                    s.parse::<RunStatus>()
                        .map_err(|e| usage(format!("--status: {e}")))?,
                );
            }
            if let Some(w) = workflow {
                filter = filter.workflow(w);
            }
            if let Some(n) = limit {
                filter = filter.limit(n);
            }
            let runs = store.list(&filter).await.context("listing runs")?;
            output::runs(&runs, json);
            Ok(exit::OK)
        }
        Command::Show { id, json } => {
            steadfast::validate_run_id(&id)?;
            let cp = store
                .load(&id)
                .await
                .with_context(|| format!("loading run {id:?}"))?
                .ok_or_else(|| usage(format!("no run {id:?} in {}", cli.store)))?;
            let history = match store.history(&id).await {
                Ok(h) => h,
                Err(e) if e.kind() == steadfast::StoreErrorKind::Unsupported => None,
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("reading the history of {id:?}"))
                        .into())
                }
            };
            output::show(&cp, history.as_deref(), json);
            Ok(exit::OK)
        }
        Command::History { id, json } => {
            steadfast::validate_run_id(&id)?;
            let history = match store.history(&id).await {
                Ok(Some(h)) => h,
                Ok(None) => return Err(usage(format!("no run {id:?} in {}", cli.store))),
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("reading the history of {id:?}"))
                        .into())
                }
            };
            output::history(&history, json);
            Ok(exit::OK)
        }
        Command::Approve { id, gate, data, by } => {
            let data =
                match data {
                    None => None,
                    Some(text) => Some(command::parse_json_exact(&text).map_err(|e| {
                        usage(format!("--data is not JSON that can be stored: {e}"))
                    })?),
                };
            let by = by.unwrap_or_else(who);
            steadfast::approve(&*store, &id, &gate, data, &by, &SystemClock).await?;
            output::note(format_args!(
                "approved gate {gate:?} of run {id:?} as {by:?}; run it again to continue"
            ));
            Ok(exit::OK)
        }
        Command::Reject {
            id,
            gate,
            reason,
            by,
        } => {
            let by = by.unwrap_or_else(who);
            steadfast::reject(&*store, &id, &gate, reason, &by, &SystemClock).await?;
            output::note(format_args!(
                "rejected gate {gate:?} of run {id:?} as {by:?}; the run is over"
            ));
            Ok(exit::OK)
        }
        Command::Delete { id } => {
            steadfast::validate_run_id(&id)?;
            if store
                .delete(&id)
                .await
                .with_context(|| format!("deleting run {id:?}"))?
            {
                output::note(format_args!("deleted run {id:?}"));
                Ok(exit::OK)
            } else {
                Err(usage(format!("no run {id:?} in {}", cli.store)))
            }
        }
        Command::Supervise { .. } => Ok(exit::USAGE),
    }
}

fn who() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|name| !name.is_empty() && !name.chars().any(char::is_control))
        .unwrap_or_else(|| "unknown".into())
}

#[allow(clippy::too_many_arguments)]
async fn run(
    store: &dyn Store,
    flow_path: &std::path::Path,
    run_id: &str,
    json: bool,
    wait: bool,
    lease: Duration,
    accept_changed: bool,
) -> Result<i32, Failure> {
    let workflow = flow::load(flow_path)?;
    steadfast::validate_run_id(run_id)?;
    let runner = Runner::new(store)
        .lease(current_owner(), lease)
        .wait_for_timers(wait)
        .accept_changed_workflow(accept_changed)
        .on_takeover(|old| command::stop_steps_of(&old.owner))
        .observer(output::progress);
    match runner.run(run_id, &workflow).await {
        Ok(Outcome::Completed(state)) => {
            if json {
                output::out!("{}", Value::Object(state));
            }
            output::note(format_args!("run {run_id:?} completed"));
            Ok(exit::OK)
        }
        Ok(Outcome::Waiting { gate }) => {
            output::note(format_args!(
                "run {run_id:?} waits at gate {gate:?}: steadfast approve {} {}  (or reject)",
                output::shell_quote(run_id),
                output::shell_quote(&gate)
            ));
            if json {
                output::out!("{}", json!({"status": "waiting", "gate": gate}));
            }
            Ok(exit::WAITING)
        }
        Ok(Outcome::Sleeping { until }) => {
            let left = until.saturating_since(SystemClock.now());
            output::note(format_args!(
                "run {run_id:?} sleeps until {until} ({} from now); run again then, or with --wait",
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            ));
            if json {
                output::out!("{}", json!({"status": "sleeping", "until": until}));
            }
            Ok(exit::WAITING)
        }
        Ok(Outcome::Rejected { gate, reason }) => {
            output::note(format_args!(
                "run {run_id:?} was rejected at gate {gate:?}{}",
                reason
                    .map(|r| format!(": {}", output::clean(&r)))
                    .unwrap_or_default()
            ));
            if json {
                output::out!("{}", json!({"status": "rejected", "gate": gate}));
            }
            Ok(exit::REJECTED)
        }
        Ok(_) => Ok(exit::FAILED),
        Err(e) => Err(e.into()),
    }
}
