//! `steadfast run FLOW --run-id ID`: start or resume a run of a flow file.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast::{current_owner, Clock, Outcome, Runner, SystemClock};

use super::{Ctx, Failure};
use crate::args::exit;
use crate::{command, flow, output};

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The flow file (TOML).
    pub flow: PathBuf,
    /// The run's id: the same id resumes the same run.
    #[arg(long)]
    pub run_id: String,
    /// Print the final state as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Sleep through timers instead of stopping at them.
    #[arg(long)]
    pub wait: bool,
    /// How long a claim on the run lasts without renewal (100ms to 1day).
    #[arg(long, default_value = "30s", value_parser = parse_lease)]
    pub lease: Duration,
    /// Resume even though the flow's steps differ from the recorded ones.
    #[arg(long)]
    pub accept_changed_workflow: bool,
    /// When the run is cancelled while a step runs, how long the step may
    /// go on before its process group is killed (0 to 1h).
    #[arg(long, default_value = "10s", value_parser = super::worker::parse_grace)]
    pub cancel_grace: Duration,
}

/// Parses `--lease`: a duration within [`steadfast::limits::LEASE`].
pub(crate) fn parse_lease(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    steadfast::limits::LEASE.check("the lease", d)
}

/// Runs the flow; the exit code says how the run stopped.
pub async fn run(args: RunArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let workflow = flow::load(&args.flow)?;
    let run_id = args.run_id.as_str();
    steadfast::validate_run_id(run_id)?;
    let runner = Runner::new(&*ctx.store)
        .lease(current_owner(), args.lease)
        .wait_for_timers(args.wait)
        .accept_changed_workflow(args.accept_changed_workflow)
        .cancel_grace(args.cancel_grace)
        .on_takeover({
            let run_id = run_id.to_string();
            move |old| command::stop_steps_of(&old.owner, &run_id)
        })
        .observer(output::progress);
    let json = args.json;
    match runner.run(run_id, &workflow).await? {
        Outcome::Completed(state) => {
            if json {
                output::out!("{}", Value::Object(state));
            }
            output::note(format_args!("run {run_id:?} completed"));
            Ok(exit::OK)
        }
        Outcome::Waiting { gate } => {
            // A wait for a signal stops the run as a gate does; say which.
            let signal = match ctx.store.load(run_id).await {
                Ok(Some(cp)) => match cp.wait {
                    Some(steadfast::Wait::Signal { signal, .. }) => Some(signal),
                    _ => None,
                },
                _ => None,
            };
            match &signal {
                Some(signal) => output::note(format_args!(
                    "run {run_id:?} waits at {gate:?} for signal {signal:?}: steadfast signal {} {} --data JSON",
                    output::shell_quote(run_id),
                    output::shell_quote(signal)
                )),
                None => output::note(format_args!(
                    "run {run_id:?} waits at gate {gate:?}: steadfast approve {} {}  (or reject)",
                    output::shell_quote(run_id),
                    output::shell_quote(&gate)
                )),
            }
            if json {
                let mut out = json!({"status": "waiting", "gate": gate});
                if let Some(signal) = signal {
                    out["signal"] = json!(signal);
                }
                output::out!("{}", out);
            }
            Ok(exit::WAITING)
        }
        Outcome::Sleeping { until } => {
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
        Outcome::Rejected { gate, reason } => {
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
        _ => Ok(exit::FAILED),
    }
}
