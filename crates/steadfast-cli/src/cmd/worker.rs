//! `steadfast worker FLOW… [--concurrency N]`: run the due runs of these
//! flows until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steadfast::{Registry, RunEnd, Worker};
use tokio::signal::unix::{signal, SignalKind};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::{command, flow, output};

/// Arguments of `worker`.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The flow files (TOML) whose runs this worker takes.
    #[arg(required = true)]
    pub flows: Vec<PathBuf>,
    /// How many runs at once (1 to 10000).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// How long a claim on a run lasts without renewal (100ms to 1day).
    #[arg(long, default_value = "30s", value_parser = super::run::parse_lease)]
    pub lease: Duration,
    /// The longest wait between two looks for due runs (10ms to 1h).
    #[arg(long, default_value = "1s", value_parser = parse_poll)]
    pub poll: Duration,
    /// At shutdown, how long running steps get to finish before their
    /// processes are killed (0 to 1h).
    #[arg(long, default_value = "30s", value_parser = parse_grace)]
    pub grace: Duration,
}

fn parse_poll(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&d) {
        return Err("the poll interval must lie between 10ms and 1h".into());
    }
    Ok(d)
}

pub(crate) fn parse_grace(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d > Duration::from_secs(3600) {
        return Err("the grace period must be at most 1h".into());
    }
    Ok(d)
}

/// Runs until a signal asks it to stop; exit 0 after a clean shutdown.
pub async fn run(args: WorkerArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let mut registry = Registry::new();
    for path in &args.flows {
        let wf = flow::load(path)?;
        if registry.contains(wf.name()) {
            return Err(usage(format!(
                "{}: another flow file given is also named {:?}",
                path.display(),
                wf.name()
            )));
        }
        registry = registry.workflow(wf);
    }
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        output::note(format_args!(
            "steadfast worker: stopping; running steps get {} to finish",
            humantime::format_duration(args.grace)
        ));
    };
    output::note(format_args!(
        "steadfast worker: taking runs of {} from {} ({} at a time)",
        registry.names().join(", "),
        ctx.url,
        args.concurrency
    ));
    let grace = args.grace;
    let report = Worker::new(Arc::clone(&ctx.store), registry)
        .concurrency(args.concurrency as usize)
        .lease(args.lease)
        .poll(args.poll)
        .grace(args.grace)
        .configure(move |run_id, r| {
            let id = run_id.to_string();
            r.on_takeover(move |old| command::stop_steps_of(&old.owner, &id))
                .observer(output::progress_of(run_id))
                .cancel_grace(grace)
        })
        .on_run_end(|run_id, end| match end {
            RunEnd::Lost(e) => output::note(format_args!(
                "{}  lost: another worker has the run ({})",
                output::clean(run_id),
                output::clean(&steadfast::error_chain(e))
            )),
            RunEnd::Failed(e) => output::note(format_args!(
                "{}  failed: {}",
                output::clean(run_id),
                output::clean(&steadfast::error_chain(e))
            )),
            RunEnd::Cancelled(e) => output::note(format_args!(
                "{}  cancelled: {}",
                output::clean(run_id),
                output::clean(&steadfast::error_chain(e))
            )),
            _ => {}
        })
        .run(shutdown)
        .await?;
    output::note(format_args!(
        "steadfast worker: stopped; {} taken, {} completed, {} waiting or sleeping, {} failed, {} held by others, {} cancelled, {} stopped mid-run",
        report.taken, report.completed, report.suspended, report.failed, report.lost, report.cancelled, report.abandoned
    ));
    Ok(exit::OK)
}
