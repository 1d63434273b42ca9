//! `steadfast worker FLOW… [--concurrency N]`: run the due runs of these
//! flows until SIGTERM or SIGINT; given several versions of a flow, each
//! run under the version it was started with.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steadfast::{Registry, RunEnd, Worker};
use tokio::signal::unix::{signal, SignalKind};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::{command, output};

/// Arguments of `worker`.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The flow files (TOML) whose runs this worker takes; several versions
    /// of a flow may be given, oldest first (new runs take the last).
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
    /// Serve the counters (steps executed, re-executions, conflicts, save
    /// latency) in the Prometheus text format at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Delete finished runs last saved longer ago than this, every
    /// --gc-every, as `steadfast gc --older-than` does.
    #[arg(long, value_name = "DURATION", value_parser = super::gc::parse_age)]
    pub gc_older_than: Option<Duration>,
    /// How often the worker applies --gc-older-than.
    #[arg(long, default_value = "10m", value_parser = parse_poll)]
    pub gc_every: Duration,
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
    // Each flow with the flows its child steps run: a worker runs a
    // flow's children too. Several versions of one flow may be given,
    // oldest first: each run goes to the version it was started with.
    let (_, family) = super::run::load_versions(&args.flows)?;
    let mut registry = Registry::new();
    for wf in family {
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
    let names: Vec<String> = registry
        .names()
        .into_iter()
        .map(|name| {
            let versions: Vec<String> = registry
                .versions(name)
                .into_iter()
                .flatten()
                .map(|v| format!("{v:?}"))
                .collect();
            match versions.len() {
                0 | 1 => name.to_string(),
                _ => format!("{name} (versions {})", versions.join(", ")),
            }
        })
        .collect();
    output::note(format_args!(
        "steadfast worker: taking runs of {} from {} ({} at a time)",
        names.join(", "),
        ctx.url,
        args.concurrency
    ));
    if let Some(addr) = args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| usage(format!("--metrics-addr {addr}: {e}")))?;
        output::note(format_args!(
            "steadfast worker: counters at http://{}/metrics",
            listener.local_addr().map_or(addr, |a| a)
        ));
        tokio::spawn(serve_metrics(listener));
    }
    let grace = args.grace;
    let mut worker = Worker::new(Arc::clone(&ctx.store), registry);
    if let Some(age) = args.gc_older_than {
        worker = worker.retention(steadfast::retention::Retention::new(age), args.gc_every);
    }
    let report = worker
        .concurrency(args.concurrency as usize)
        .lease(args.lease)
        .poll(args.poll)
        .grace(args.grace)
        .configure(move |run_id, r| {
            let id = run_id.to_string();
            r.on_takeover(move |old| command::stop_steps_of(&old.owner, &id))
                .on_slot_reclaimed(command::stop_steps_of)
                .observer(output::progress_of(run_id))
                .cancel_grace(grace)
        })
        .on_run_end(|run_id, end| match end {
            // Deleted or replaced underneath: the error says which.
            RunEnd::Lost(e @ steadfast::Error::Removed { .. }) => output::note(format_args!(
                "{}  lost: {}",
                output::clean(run_id),
                output::clean(&steadfast::error_chain(e))
            )),
            RunEnd::Lost(e) => output::note(format_args!(
                "{}  lost: another worker has the run ({})",
                output::clean(run_id),
                output::clean(&steadfast::error_chain(e))
            )),
            // Another worker claimed it first: a normal race, counted, not
            // printed (a debug line says it).
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
            RunEnd::PassedOver { version, .. } => output::note(format_args!(
                "{}  passed over: it was started under version {:?} of its flow, which this worker was not given; left for a worker that has it",
                output::clean(run_id),
                output::clean(version)
            )),
            _ => {}
        })
        .run(shutdown)
        .await?;
    output::note(format_args!(
        "steadfast worker: stopped; {} taken, {} completed, {} waiting or sleeping, {} failed, {} held by others, {} claimed by others first, {} cancelled, {} stopped mid-run, {} started by schedules, {} passed over (version not given)",
        report.taken, report.completed, report.suspended, report.failed, report.lost, report.missed, report.cancelled, report.abandoned, report.scheduled, report.passed_over
    ));
    Ok(exit::OK)
}

/// Answers `GET /metrics` with the counters, anything else with 404. Each
/// connection gets a few seconds and 8 KiB of request.
async fn serve_metrics(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A few connections at a time: a client cannot take the descriptors the
    // steps and the store need.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    loop {
        let Ok(permit) = std::sync::Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((mut conn, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            let read = async {
                while len < buf.len() {
                    match conn.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), read)
                .await
                .is_err()
            {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if head.starts_with("GET ") && path == "/metrics" {
                ("200 OK", steadfast::metrics::snapshot().prometheus())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.write_all(reply.as_bytes()))
                .await;
        });
    }
}
