//! `steadfast watch ID`: a run's events and steps as they happen, until it
//! ends or stops.

use std::time::Duration;

use steadfast::watch::{Watch, WatchItem, DEFAULT_POLL, POLL_RANGE};
use steadfast::RunStatus;

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output::{clean, out};

/// Arguments of `watch`.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The run's id (a run that does not exist yet in the store is waited
    /// for).
    pub id: String,
    /// Print only the events numbered above SEQ (the last one seen before).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub from: u64,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// How often to look at the store (1ms to 1m).
    #[arg(long, value_parser = parse_poll, default_value = "50ms")]
    pub poll: Duration,
}

fn parse_poll(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !POLL_RANGE.contains(&d) {
        return Err(format!(
            "{text} is outside {} to {}",
            humantime::format_duration(*POLL_RANGE.start()),
            humantime::format_duration(*POLL_RANGE.end())
        ));
    }
    Ok(d)
}

/// Prints each item as it comes; exits as `run` does for the way the run
/// ended or stopped (0 completed, 1 failed, 4 waiting or sleeping, 5
/// rejected, 6 cancelled).
pub async fn run(args: WatchArgs, ctx: &Ctx) -> Result<i32, Failure> {
    steadfast::validate_run_id(&args.id)?;
    debug_assert!(POLL_RANGE.contains(&DEFAULT_POLL));
    let mut watch = Watch::new(&*ctx.store, &args.id)
        .after(args.from)
        .poll_every(args.poll)?;
    let mut code = exit::OK;
    while let Some(item) = watch.next().await.map_err(anyhow::Error::new)? {
        code = match &item {
            WatchItem::Waiting { .. }
            | WatchItem::WaitingForSignal { .. }
            | WatchItem::WaitingForChildren { .. }
            | WatchItem::Sleeping { .. } => exit::WAITING,
            WatchItem::Ended {
                status: RunStatus::Rejected,
            } => exit::REJECTED,
            WatchItem::Ended {
                status: RunStatus::Cancelled,
            } => exit::CANCELLED,
            WatchItem::Ended { .. } | WatchItem::Gone => exit::FAILED,
            _ => code,
        };
        if args.json {
            match serde_json::to_string(&item) {
                Ok(line) => out!("{line}"),
                Err(e) => return Err(anyhow::anyhow!("printing an item of the watch: {e}").into()),
            }
        } else {
            out!("{}", clean(&line(&item)));
        }
    }
    Ok(code)
}

/// One item as a line of text.
fn line(item: &WatchItem) -> String {
    match item {
        WatchItem::Started { step, attempt } => {
            format!("started     {step} (attempt {attempt})")
        }
        WatchItem::Superseded { step, through } => format!(
            "superseded  {step}: its events through #{through} are of an execution that did not finish"
        ),
        WatchItem::Event { event } => format!(
            "#{:<10} {} (attempt {}) {}",
            event.seq, event.step, event.attempt, event.value
        ),
        WatchItem::Done { index, step } => format!("done        {step} (step {index})"),
        WatchItem::Failed {
            step,
            attempt,
            error,
            retrying,
            ..
        } => format!(
            "failed      {step} (attempt {attempt}): {error}{}",
            if *retrying { "; it will be tried again" } else { "" }
        ),
        WatchItem::Waiting { gate } => format!("waiting     at gate {gate}"),
        WatchItem::Signal { signal } => format!(
            "#{:<10} signal {} from {} {}",
            signal.seq, signal.name, signal.by, signal.data
        ),
        WatchItem::WaitingForSignal { step, signal } => {
            format!("waiting     at {step} for signal {signal}")
        }
        WatchItem::WaitingForChildren { step, runs } => {
            format!("waiting     at {step} for {} child run(s)", runs.len())
        }
        WatchItem::Sleeping { step, until } => format!("sleeping    at {step} until {until}"),
        WatchItem::Completed => "completed".into(),
        WatchItem::Ended { status } => format!("ended       {status}"),
        WatchItem::Gone => "gone        the run was deleted while it was watched".into(),
        other => format!("{other:?}"),
    }
}
