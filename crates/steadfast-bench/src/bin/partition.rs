//! A worker cut off from PostgreSQL mid-step, outside CI: two workers, each
//! in a network namespace of its own, share a store; worker A's link is cut
//! (every packet dropped, no connection closed) for longer than its lease,
//! worker B takes its runs over, and the link is healed.
//!
//! `scripts/faults/partition.sh` makes the namespaces and the server and
//! gives this binary the commands that cut and heal the link:
//!
//! ```text
//! target/release/partition --url postgres://postgres@127.0.0.1:5443/postgres \
//!     --url-a postgres://postgres@10.77.1.1:5443/postgres --netns-a sfp-a \
//!     --url-b postgres://postgres@10.77.2.1:5443/postgres --netns-b sfp-b \
//!     --cut 'CMD' --heal 'CMD'
//! ```
//!
//! Each worker also has a host name of its own (a UTS namespace), so that
//! the two are as two machines: neither can see the other's processes.
//! Steps last longer than the lease, so that the cut lands inside steps
//! that must be renewed. Checked, from the steps' own log (start and end of
//! each execution, with its process and worker) and the workers' `done`
//! lines: worker A acknowledged nothing while cut off; no two executions of
//! a run's steps overlapped in time (A stopped its steps before B took
//! them); no step started again after its checkpoint was acknowledged;
//! re-executions are at most the runs taken over; every run completes with
//! its full state; worker A is still running after the heal, having
//! reconnected by itself.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

#[path = "faults/history.rs"]
mod history;
use history::*;

#[derive(Parser, Debug)]
struct Args {
    /// The store URL as this process (outside the namespaces) reaches it.
    #[arg(long)]
    url: String,
    /// The store URL as seen from worker A's namespace.
    #[arg(long)]
    url_a: String,
    /// Worker A's network namespace.
    #[arg(long)]
    netns_a: String,
    /// The store URL as seen from worker B's namespace.
    #[arg(long)]
    url_b: String,
    /// Worker B's network namespace.
    #[arg(long)]
    netns_b: String,
    /// A shell command that cuts worker A off (drops its packets).
    #[arg(long)]
    cut: String,
    /// A shell command that heals the cut.
    #[arg(long)]
    heal: String,
    /// How long A stays cut off, in milliseconds (longer than the lease).
    #[arg(long, default_value_t = 7_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    cut_ms: u64,
    /// How long the load runs before the cut, in milliseconds.
    #[arg(long, default_value_t = 2_500, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    load_ms: u64,
    /// Runs in the store.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1000))]
    runs: u16,
    /// Steps per run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000))]
    steps: u16,
    /// Runs each worker takes at a time (worker A, started first, takes
    /// them all; B must have room for them).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1000))]
    concurrency: u16,
    /// How long each step runs, in milliseconds (longer than the lease).
    #[arg(long, default_value_t = 6_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    step_ms: u64,
    /// The workers' lease, in milliseconds.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    lease_ms: u64,
    /// How long the runs may take to finish after the heal, in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    finish_secs: u64,
    /// The `steadfast` binary (default: beside this one).
    #[arg(long)]
    bin: Option<PathBuf>,
}

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
    // The log is a file on this machine's disk: a namespace of its own
    // changes a step's network, not its files.
    let ids: Vec<String> = (0..args.runs).map(|i| format!("p{i}")).collect();
    for id in &ids {
        let ok = steadfast(&bin, dir.path(), &args.url)
            .args(["start", "flow.toml", "--run-id", id])
            .status();
        if !ok.is_ok_and(|s| s.success()) {
            fail(&format!("could not start run {id}"));
        }
    }
    let lease = format!("{}ms", args.lease_ms);
    let (acks_a, acks_b): (Acks, Acks) = Default::default();
    let lines_a: Arc<Mutex<Vec<String>>> = Arc::default();
    let worker = |name: &str, netns: &str, url: &str, acks: &Acks, lines| {
        // A host of its own, too (a UTS namespace with its own host name):
        // a lease holder on the same host would be judged by its process,
        // and its steps stopped by the worker that takes its runs over,
        // which no worker can do across machines.
        spawn_keeping(
            Command::new("unshare")
                .env(CLIENT_ENV, name)
                .args(["--uts", "--", "sh", "-c"])
                .arg(r#"h=$1; n=$2; shift 2; hostname "$h" && exec ip netns exec "$n" "$@""#)
                .args(["sh", &format!("steadfast-{netns}"), netns])
                .arg(&bin)
                .current_dir(dir.path())
                .args(["--store", url, "worker", "flow.toml"])
                .args(["--concurrency", &args.concurrency.to_string()])
                .args(["--poll", "50ms", "--lease", &lease]),
            None,
            acks,
            lines,
        )
    };
    let mut a = worker("A", &args.netns_a, &args.url_a, &acks_a, Some(&lines_a));
    // B starts a moment later, so that A has claimed runs when it is cut.
    std::thread::sleep(Duration::from_millis(300));
    let mut b = worker("B", &args.netns_b, &args.url_b, &acks_b, None);
    let (pid_a, pid_b) = ("A", "B");
    std::thread::sleep(Duration::from_millis(args.load_ms));
    let cut_at = nanos_now();
    shell(&args.cut, "--cut");
    eprintln!(
        "partition: worker A cut off after {} acknowledged checkpoints (B {})",
        acks_a.lock().unwrap().len(),
        acks_b.lock().unwrap().len()
    );
    std::thread::sleep(Duration::from_millis(args.cut_ms));
    let heal_at = nanos_now();
    shell(&args.heal, "--heal");
    let healed = Instant::now();
    let mut violations = Vec::new();
    let deadline = healed + Duration::from_secs(args.finish_secs);
    loop {
        let now = read_runs(&bin, dir.path(), &args.url);
        let done = ids
            .iter()
            .filter(|id| now.get(*id).is_some_and(|(s, _)| s == "completed"))
            .count();
        if done == ids.len() {
            break;
        }
        if Instant::now() > deadline {
            violations.push(format!(
                "{done} of {} runs completed within {} s of the heal",
                ids.len(),
                args.finish_secs
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let finished = healed.elapsed();
    // A reconnected by itself: with B stopped, a new run is A's to finish.
    stop(&mut b);
    let after = "after-heal";
    let started = steadfast(&bin, dir.path(), &args.url)
        .args(["start", "flow.toml", "--run-id", after])
        .status();
    if !started.is_ok_and(|s| s.success()) {
        fail("could not start the run after the heal");
    }
    let by = Instant::now() + Duration::from_secs(args.finish_secs);
    let reconnected = loop {
        let now = read_runs(&bin, dir.path(), &args.url);
        if now.get(after).is_some_and(|(s, _)| s == "completed") {
            break true;
        }
        if Instant::now() > by || a.try_wait().ok().flatten().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !reconnected {
        violations
            .push("worker A did not run a new run after the heal (it did not reconnect)".into());
    }
    stop(&mut a);
    let execs = read_log(&log);
    let mut seen: Vec<&str> = execs.iter().map(|e| e.worker.as_str()).collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.iter().any(|w| *w != pid_a && *w != pid_b) || seen.is_empty() {
        fail(&format!(
            "the steps' log names processes {seen:?}, not only workers {pid_a} and {pid_b}"
        ));
    }
    violations.extend(check_final(
        &bin,
        dir.path(),
        &args.url,
        &ids,
        steps,
        &execs,
    ));
    violations.extend(check_order(&execs));
    let all_acks: Vec<Ack> = acks_a
        .lock()
        .unwrap()
        .iter()
        .chain(acks_b.lock().unwrap().iter())
        .cloned()
        .collect();
    for (run, index) in started_after_ack(&all_acks, &execs) {
        violations.push(format!(
            "run {run}: step {index} started again after its checkpoint was acknowledged"
        ));
    }
    // Nothing A printed while cut off may be an acknowledgement (lines
    // already on their way at the cut are given 100 ms).
    let while_cut: Vec<Ack> = acks_a
        .lock()
        .unwrap()
        .iter()
        .filter(|x| x.at > cut_at + 100_000_000 && x.at < heal_at)
        .cloned()
        .collect();
    for x in &while_cut {
        violations.push(format!(
            "worker A acknowledged step {} of run {} while cut off",
            x.index, x.run
        ));
    }
    // A's executions under way at the cut: each must have been stopped
    // (no end line) or ended, and in both cases shown no sign of life (an
    // end or a beat) after its lease could have run out.
    let lease_ns = u128::from(args.lease_ms) * 1_000_000;
    let in_flight = in_flight_at(&execs, pid_a, cut_at);
    let mut stopped = 0;
    let mut last_sign_ms: u128 = 0;
    // How long before B started a step of the run A's execution last showed
    // a sign of life (negative: they overlapped): the slack the lease's
    // margin left on this machine.
    let mut least_clear_ms: Option<i128> = None;
    for (run, index, pid) in &in_flight {
        let b_start = execs
            .iter()
            .filter(|e| {
                e.start && e.run == *run && e.index == *index && e.worker == pid_b && e.at > cut_at
            })
            .map(|e| e.at)
            .min();
        if let (Some(b), Some(last)) = (b_start, last_sign(&execs, run, *pid)) {
            // Rounded down: an overlap of under a millisecond shows as -1.
            let clear = (b as i128 - last as i128).div_euclid(1_000_000);
            least_clear_ms = Some(least_clear_ms.map_or(clear, |l| l.min(clear)));
        }
        let ended = execs
            .iter()
            .any(|e| !e.start && !e.beat && e.pid == *pid && e.run == *run);
        if !ended {
            stopped += 1;
        }
        if let Some(last) = last_sign(&execs, run, *pid) {
            last_sign_ms = last_sign_ms.max(last.saturating_sub(cut_at) / 1_000_000);
            if last > cut_at + lease_ns {
                violations.push(format!(
                    "run {run}: step {index} ran on in cut-off worker A {} ms after the cut, past its lease",
                    (last - cut_at) / 1_000_000
                ));
            }
        }
    }
    let takeovers = taken_over(&execs, pid_a, pid_b, cut_at);
    // The run started after the heal is not one of the runs checked here.
    let re_executions = execs.iter().filter(|e| e.start && e.run != after).count() as i64
        - (ids.len() * steps) as i64;
    if re_executions > takeovers as i64 {
        violations.push(format!(
            "{re_executions} re-executions for {takeovers} runs taken over"
        ));
        for id in &ids {
            let runs: Vec<String> = execs
                .iter()
                .filter(|e| e.start && e.run == *id)
                .map(|e| {
                    format!(
                        "s{}@{}:{}",
                        e.index,
                        e.worker,
                        (e.at.saturating_sub(cut_at)) / 1_000_000
                    )
                })
                .collect();
            if runs.len() > steps + 1 {
                violations.push(format!("run {id} started {runs:?} (ms after the cut)"));
            }
        }
    }
    let a_failed = lines_a
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("failed:") && l.contains("did not answer"))
        .count();
    println!(
        "partition: {} runs of {} steps of {} ms, lease {} ms, A cut off for {} ms; \
         {} steps of A under way at the cut ({} stopped by A, the rest ended first; the last sign of any {} ms after the cut, {} ms at least before B started the step); {} runs taken over by B; \
         {} re-executions; A said {} times that the store did not answer a renewal; \
         all runs done {:.1?} after the heal; {} violations",
        ids.len(),
        steps,
        args.step_ms,
        args.lease_ms,
        args.cut_ms,
        in_flight.len(),
        stopped,
        last_sign_ms,
        least_clear_ms.map_or_else(|| "-".to_string(), |c| c.to_string()),
        takeovers,
        re_executions,
        a_failed,
        finished,
        violations.len()
    );
    for v in violations.iter().take(20) {
        println!("partition: VIOLATION {v}");
    }
    std::process::exit(i32::from(!violations.is_empty()));
}

/// Stops a worker (SIGTERM, as an operator would) and waits for it.
fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// The executions worker `worker` had started before `at` and not ended by
/// then: (run, step, process).
fn in_flight_at(execs: &[Exec], worker: &str, at: u128) -> Vec<(String, usize, u32)> {
    execs
        .iter()
        .filter(|e| e.start && e.worker == worker && e.at < at)
        .filter(|e| {
            !execs
                .iter()
                .any(|x| !x.start && !x.beat && x.pid == e.pid && x.run == e.run && x.at <= at)
        })
        .map(|e| (e.run.clone(), e.index, e.pid))
        .collect()
}

/// Runs whose last execution before `at` was worker `a`'s and that worker
/// `b` ran a step of after `at`.
fn taken_over(execs: &[Exec], a: &str, b: &str, at: u128) -> usize {
    let mut runs: Vec<&str> = execs.iter().map(|e| e.run.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    runs.into_iter()
        .filter(|run| {
            let last_before = execs
                .iter()
                .filter(|e| e.start && e.run == *run && e.at < at)
                .max_by_key(|e| e.at);
            last_before.is_some_and(|e| e.worker == a)
                && execs
                    .iter()
                    .any(|e| e.start && e.run == *run && e.worker == b && e.at > at)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(run: &str, start: bool, pid: u32, worker: &str, at: u128) -> Exec {
        Exec {
            run: run.into(),
            index: 0,
            start,
            beat: false,
            pid,
            worker: worker.into(),
            at,
        }
    }

    #[test]
    fn steps_under_way_at_the_cut_and_runs_taken_over_are_counted() {
        let execs = [
            // r1: A's step ended before the cut; A goes on after the heal.
            exec("r1", true, 1, "A", 10),
            exec("r1", false, 1, "A", 20),
            exec("r1", true, 2, "A", 200),
            // r2: A's step under way at the cut (never ended), B takes it.
            exec("r2", true, 3, "A", 30),
            exec("r2", true, 4, "B", 150),
            exec("r2", false, 4, "B", 160),
            // r3: B's all along.
            exec("r3", true, 5, "B", 40),
            exec("r3", true, 6, "B", 120),
        ];
        let cut = 100;
        assert_eq!(in_flight_at(&execs, "A", cut), [("r2".to_string(), 0, 3)]);
        assert_eq!(taken_over(&execs, "A", "B", cut), 1);
    }
}
