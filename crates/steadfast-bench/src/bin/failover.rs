//! PostgreSQL failover under load, outside CI: workers and `steadfast run`
//! processes save checkpoints through a multi-host URL while the primary is
//! killed and its standby promoted; then every acknowledged checkpoint is
//! looked for on the new primary, and the steps' own log is checked.
//!
//! `scripts/faults/pg-failover.sh` makes the two clusters and gives this
//! binary the commands that hurt them:
//!
//! ```text
//! target/release/failover --url 'postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/postgres?target_session_attrs=read-write' \
//!     --standby-url postgres://postgres@127.0.0.1:5442/postgres \
//!     --stall 'CMD' --kill-primary 'CMD' --promote 'CMD' [--expect-loss]
//! ```
//!
//! The steps: every step appends `RUN INDEX start ATTEMPT PID WORKER NANOS`
//! to a log when it starts and `RUN INDEX end ATTEMPT PID WORKER NANOS` when
//! it ends. A checkpoint is acknowledged when a process prints its `done`
//! line, which it does only after the save returned; the harness reads
//! those lines as they come, with the time it read them.
//!
//! The fault, in this order: the load runs a while; `--stall` (say, stop
//! the primary's WAL sender) and a second more of load; `--kill-primary`;
//! every client process is stopped (SIGSTOP), so that nothing writes
//! to the new primary before it is read; `--promote`; each run is read from
//! the standby now promoted and compared with the acknowledgements; the
//! clients go on (SIGCONT) and must reconnect by themselves and finish every
//! run.
//!
//! Checked: every acknowledged checkpoint is on the new primary; no step was
//! started again after its checkpoint was acknowledged; no two executions of
//! a run's steps overlap in time; every run completes with its full state.
//! With `--expect-loss` (an asynchronous standby: the negative control that
//! proves the checker can fail) the exit is 0 only when lost acknowledged
//! checkpoints were found; otherwise 0 only when there were no violations.

use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

#[path = "faults/history.rs"]
mod history;
use history::*;

#[derive(Parser, Debug)]
struct Args {
    /// The store URL the clients use: both servers, the writable one
    /// chosen (`host1:port1,host2:port2` and `target_session_attrs=read-write`).
    #[arg(long)]
    url: String,
    /// The standby's own URL, read after its promotion.
    #[arg(long)]
    standby_url: String,
    /// A shell command run before the primary is killed (after which the
    /// load goes on for `--stall-ms`); for example one that stops the WAL
    /// sender, so that the standby falls behind.
    #[arg(long)]
    stall: Option<String>,
    /// How long the load goes on after `--stall`, in milliseconds.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    stall_ms: u64,
    /// A shell command that kills the primary (every process of it).
    #[arg(long)]
    kill_primary: String,
    /// A shell command that promotes the standby and returns once it takes
    /// writes.
    #[arg(long)]
    promote: String,
    /// Runs started for the workers.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u16).range(1..=5000))]
    runs: u16,
    /// Runs that `steadfast run` processes run, one process each.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=64))]
    cli_runs: u16,
    /// Steps per run.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
    steps: u16,
    /// How long each step sleeps, in milliseconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    step_ms: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// How long the load runs before the fault, in milliseconds.
    #[arg(long, default_value_t = 1_500, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    load_ms: u64,
    /// How long the runs may take to finish after the promotion, in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    finish_secs: u64,
    /// The fault may lose acknowledged checkpoints (an asynchronous
    /// standby): succeed only if the checker finds such a loss.
    #[arg(long)]
    expect_loss: bool,
    /// The `steadfast` binary (default: beside this one).
    #[arg(long)]
    bin: Option<PathBuf>,
}

/// The lease of every client: short, so that a run whose holder lost its
/// connection is taken over soon after the promotion.
const LEASE: &str = "2s";

fn main() {
    let args = Args::parse();
    let bin = args.bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("this binary's path")
            .with_file_name("steadfast")
    });
    let dir = tempfile::tempdir().expect("a temp dir");
    let log = dir.path().join("log");
    let steps = usize::from(args.steps);
    std::fs::write(
        dir.path().join("flow.toml"),
        flow(steps, args.step_ms, &log),
    )
    .expect("the flow file");
    let worker_ids: Vec<String> = (0..args.runs).map(|i| format!("w{i}")).collect();
    let cli_ids: Vec<String> = (0..args.cli_runs).map(|i| format!("c{i}")).collect();
    for id in &worker_ids {
        let ok = steadfast(&bin, dir.path(), &args.url)
            .args(["start", "flow.toml", "--run-id", id])
            .status();
        if !ok.is_ok_and(|s| s.success()) {
            fail(&format!("could not start run {id}"));
        }
    }
    let acks: Acks = Arc::default();
    let mut clients: Vec<Child> = Vec::new();
    for w in 0..args.workers {
        let child = spawn_reading(
            steadfast(&bin, dir.path(), &args.url)
                .env(CLIENT_ENV, format!("worker-{w}"))
                .args([
                    "worker",
                    "flow.toml",
                    "--concurrency",
                    "4",
                    "--poll",
                    "50ms",
                    "--lease",
                    LEASE,
                ]),
            None,
            &acks,
        );
        clients.push(child);
    }
    for id in &cli_ids {
        let child = spawn_reading(
            steadfast(&bin, dir.path(), &args.url)
                .env(CLIENT_ENV, format!("run-{id}"))
                .args(["run", "flow.toml", "--run-id", id, "--lease", LEASE]),
            Some(id.clone()),
            &acks,
        );
        clients.push(child);
    }
    std::thread::sleep(Duration::from_millis(args.load_ms));
    eprintln!(
        "failover: {} checkpoints acknowledged under load; the fault begins",
        acks.lock().unwrap().len()
    );
    let mut stalled_at = u128::MAX;
    if let Some(cmd) = &args.stall {
        shell(cmd, "--stall");
        stalled_at = nanos_now();
        std::thread::sleep(Duration::from_millis(args.stall_ms));
    }
    shell(&args.kill_primary, "--kill-primary");
    signal_all(&clients, "STOP");
    // Lines already written are read while the clients stand still.
    std::thread::sleep(Duration::from_millis(300));
    let acked_before: Vec<Ack> = acks.lock().unwrap().clone();
    // Saves acknowledged while the standby was cut off (read 50 ms or more
    // after the stall began, so that lines already on their way are not
    // counted): none may be with a synchronous standby.
    let during_stall = acked_before
        .iter()
        .filter(|a| a.at > stalled_at.saturating_add(50_000_000))
        .count();
    let promote_began = Instant::now();
    shell(&args.promote, "--promote");
    let promoted = promote_began.elapsed();
    eprintln!("failover: promoted in {promoted:.1?}");
    let on_new = read_runs(&bin, dir.path(), &args.standby_url);
    if on_new.is_empty() {
        fail("could not read the runs from the promoted standby");
    }
    let mut violations = Vec::new();
    if acked_before.is_empty() {
        fail("no checkpoint was acknowledged before the kill: no `done` line was read (has its form changed?)");
    }
    if during_stall > 0 && !args.expect_loss {
        violations.push(format!(
            "{during_stall} checkpoints were acknowledged while the standby was cut off: it is not synchronous"
        ));
    }
    let mut lost = 0usize;
    // Each run's acknowledged steps that the new primary does not have.
    let mut lost_runs = 0usize;
    for (run, acked) in acked_steps(&acked_before) {
        let next = on_new.get(&run).map_or(0, |(_, next)| *next);
        let missing = acked.iter().filter(|i| **i >= next).count();
        if missing > 0 {
            lost += missing;
            lost_runs += 1;
            violations.push(format!(
                "run {run}: {missing} acknowledged checkpoints missing (up to step {}); the new primary has {next} steps",
                acked.last().copied().unwrap_or_default()
            ));
        }
    }
    let resumed_at = Instant::now();
    signal_all(&clients, "CONT");
    let all_ids: Vec<String> = worker_ids.iter().chain(&cli_ids).cloned().collect();
    let deadline = resumed_at + Duration::from_secs(args.finish_secs);
    let mut first_ack_after: Option<Duration> = None;
    let acks_at_fault = acks.lock().unwrap().len();
    loop {
        if first_ack_after.is_none() && acks.lock().unwrap().len() > acks_at_fault {
            first_ack_after = Some(resumed_at.elapsed());
        }
        // `steadfast run` processes that gave up (their store went away)
        // are started again, as a supervisor would.
        for (i, id) in cli_ids.iter().enumerate() {
            let slot = args.workers as usize + i;
            if clients[slot].try_wait().ok().flatten().is_some() {
                clients[slot] = spawn_reading(
                    steadfast(&bin, dir.path(), &args.url)
                        .env(CLIENT_ENV, format!("run-{id}"))
                        .args(["run", "flow.toml", "--run-id", id, "--lease", LEASE]),
                    Some(id.clone()),
                    &acks,
                );
            }
        }
        let now = read_runs(&bin, dir.path(), &args.url);
        let done = all_ids
            .iter()
            .filter(|id| now.get(*id).is_some_and(|(s, _)| s == "completed"))
            .count();
        if done == all_ids.len() {
            break;
        }
        if Instant::now() > deadline {
            violations.push(format!(
                "{} of {} runs completed within {} s of the promotion",
                done,
                all_ids.len(),
                args.finish_secs
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let finished = resumed_at.elapsed();
    signal_all(&clients, "TERM");
    for c in &mut clients {
        let _ = c.wait();
    }
    let execs = read_log(&log);
    violations.extend(check_final(
        &bin,
        dir.path(),
        &args.url,
        &all_ids,
        steps,
        &execs,
    ));
    violations.extend(check_order(&execs));
    let all_acks = acks.lock().unwrap().clone();
    let restarted = started_after_ack(&all_acks, &execs);
    for (run, index) in &restarted {
        violations.push(format!(
            "run {run}: step {index} started again after its checkpoint was acknowledged"
        ));
    }
    let re_executions =
        execs.iter().filter(|e| e.start).count() as i64 - (all_ids.len() * steps) as i64;
    println!(
        "failover: {} runs of {} steps; {} checkpoints acknowledged before the kill ({} while the standby was cut off; {} in all); \
         promotion {:.1?}; first checkpoint {:.1?} after the clients went on; all runs done {:.1?} after; \
         {} re-executions; {} acknowledged checkpoints lost (of {} runs); {} steps run again after their acknowledgement; {} violations",
        all_ids.len(),
        steps,
        acked_before.len(),
        during_stall,
        all_acks.len(),
        promoted,
        first_ack_after.unwrap_or_default(),
        finished,
        re_executions,
        lost,
        lost_runs,
        restarted.len(),
        violations.len()
    );
    for v in violations.iter().take(20) {
        println!("failover: VIOLATION {v}");
    }
    if violations.len() > 20 {
        println!("failover: … and {} more", violations.len() - 20);
    }
    let ok = if args.expect_loss {
        let found = lost > 0 || !restarted.is_empty();
        println!(
            "failover: negative control: the checker {} the loss",
            if found { "found" } else { "did NOT find" }
        );
        found
    } else {
        violations.is_empty()
    };
    std::process::exit(i32::from(!ok));
}
