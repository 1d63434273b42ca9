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

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;

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

/// An acknowledgement: step `index` of `run` was saved, seen at `at`.
#[derive(Clone, Debug)]
struct Ack {
    run: String,
    index: usize,
    at: u128,
}

/// One line of the steps' log.
#[derive(Clone, Debug)]
struct Exec {
    run: String,
    index: usize,
    start: bool,
    pid: u32,
    at: u128,
}

fn nanos_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
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
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let mut clients: Vec<Child> = Vec::new();
    for _ in 0..args.workers {
        let child = spawn_reading(
            steadfast(&bin, dir.path(), &args.url).args([
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
            steadfast(&bin, dir.path(), &args.url).args([
                "run",
                "flow.toml",
                "--run-id",
                id,
                "--lease",
                LEASE,
            ]),
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
                    steadfast(&bin, dir.path(), &args.url).args([
                        "run",
                        "flow.toml",
                        "--run-id",
                        id,
                        "--lease",
                        LEASE,
                    ]),
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

/// A flow of `steps` steps that log their start and end.
fn flow(steps: usize, step_ms: u64, log: &Path) -> String {
    let mut flow = String::from("name = \"failover\"\nversion = \"1\"\n");
    let stamp = |what: &str| {
        format!(
            "echo \\\"$STEADFAST_RUN_ID $STEADFAST_STEP_INDEX {what} $STEADFAST_ATTEMPT $$ $PPID $(date +%s%N)\\\" >> {}",
            log.display()
        )
    };
    for i in 0..steps {
        flow.push_str(&format!(
            "[[step]]\nname = \"s{i}\"\nrun = \"{}; sleep {}; {}; echo '{{\\\"s{i}\\\": {i}}}'\"\n",
            stamp("start"),
            step_ms as f64 / 1000.0,
            stamp("end"),
        ));
    }
    flow
}

fn steadfast(bin: &Path, dir: &Path, url: &str) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(dir).arg("--store").arg(url);
    c
}

fn fail(why: &str) -> ! {
    eprintln!("failover: {why}");
    std::process::exit(2);
}

fn shell(cmd: &str, what: &str) {
    let ok = Command::new("sh").args(["-c", cmd]).status();
    if !ok.is_ok_and(|s| s.success()) {
        fail(&format!("{what} command failed: {cmd}"));
    }
}

/// Starts `cmd` in a process group of its own and reads its standard
/// error on a thread: each `done` line is an acknowledgement (of `run`, or
/// of the run the line names, for a worker).
fn spawn_reading(cmd: &mut Command, run: Option<String>, acks: &Arc<Mutex<Vec<Ack>>>) -> Child {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn steadfast");
    let err = child.stderr.take().expect("piped");
    let acks = Arc::clone(acks);
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(ack) = ack_of(&line, run.as_deref()) {
                acks.lock().unwrap().push(ack);
            }
        }
    });
    child
}

/// `RUN  done  INDEX NAME  TOOK` (a worker) or `  done  INDEX NAME  TOOK`
/// (a `run` process, whose run is `run`).
fn ack_of(line: &str, run: Option<&str>) -> Option<Ack> {
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let (run, index) = match run {
        Some(r) if first == "done" => (r.to_string(), words.next()?),
        None if words.next()? == "done" => (first.to_string(), words.next()?),
        _ => return None,
    };
    Some(Ack {
        run,
        index: index.parse().ok()?,
        at: nanos_now(),
    })
}

/// Sends SIGSTOP, SIGCONT or SIGTERM to every client process (through
/// kill(1): this crate forbids `unsafe`). Not to their groups: a step that
/// runs while its client stands still goes on and ends, as it would while
/// its client waited for the database, so that the harness itself makes no
/// overlap.
fn signal_all(clients: &[Child], signal: &str) {
    let groups: Vec<String> = clients.iter().map(|c| c.id().to_string()).collect();
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .args(&groups)
        .stderr(Stdio::null())
        .status();
}

/// Each run's status and completed steps, as `runs --json` gives them
/// (none when the store does not answer within 20 s: a server that takes
/// no writes can hold even a read's connection set-up).
fn read_runs(bin: &Path, dir: &Path, url: &str) -> HashMap<String, (String, usize)> {
    let Some(stdout) = output_within(
        steadfast(bin, dir, url).args(["runs", "--json", "--limit", "100000"]),
        Duration::from_secs(20),
    ) else {
        return HashMap::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&stdout).unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some((
                        r["run_id"].as_str()?.to_string(),
                        (
                            r["status"].as_str().unwrap_or("").to_string(),
                            r["next"].as_u64()? as usize,
                        ),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The standard output of `cmd`, or `None` when it fails or does not end
/// within `limit` (it is killed then).
fn output_within(cmd: &mut Command, limit: Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut out = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let buf = reader.join().ok()?;
                return status.success().then_some(buf);
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The acknowledged steps of each run, in order, each once.
fn acked_steps(acks: &[Ack]) -> BTreeMap<String, Vec<usize>> {
    let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for a in acks {
        out.entry(a.run.clone()).or_default().push(a.index);
    }
    for steps in out.values_mut() {
        steps.sort_unstable();
        steps.dedup();
    }
    out
}

fn read_log(log: &Path) -> Vec<Exec> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.len() != 7 {
                return None;
            }
            Some(Exec {
                run: w[0].to_string(),
                index: w[1].parse().ok()?,
                start: w[2] == "start",
                pid: w[4].parse().ok()?,
                at: w[6].parse().ok()?,
            })
        })
        .collect()
}

/// Steps whose execution started after their checkpoint was acknowledged:
/// an acknowledged checkpoint the store forgot.
fn started_after_ack(acks: &[Ack], execs: &[Exec]) -> Vec<(String, usize)> {
    let mut first_ack: HashMap<(&str, usize), u128> = HashMap::new();
    for a in acks {
        let e = first_ack.entry((a.run.as_str(), a.index)).or_insert(a.at);
        *e = (*e).min(a.at);
    }
    let mut out: Vec<(String, usize)> = execs
        .iter()
        .filter(|e| e.start)
        .filter(|e| {
            first_ack
                .get(&(e.run.as_str(), e.index))
                .is_some_and(|acked| e.at > *acked)
        })
        .map(|e| (e.run.clone(), e.index))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every run completed with its full state, and no two executions of a
/// run's steps overlapped in time.
fn check_final(
    bin: &Path,
    dir: &Path,
    url: &str,
    ids: &[String],
    steps: usize,
    execs: &[Exec],
) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        let shown = output_within(
            steadfast(bin, dir, url).args(["show", id, "--json"]),
            Duration::from_secs(20),
        )
        .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&shown).unwrap_or_default();
        if v["status"] != "completed" {
            out.push(format!("run {id} is {}", v["status"]));
        }
        for i in 0..steps {
            if v["state"][format!("s{i}")] != i {
                out.push(format!("run {id}: state lacks s{i}"));
            }
        }
    }
    // Per run, the executions as intervals: a start and the end of the same
    // process; an execution cut off (its process stopped for good) lasts
    // until the next line of that run.
    let mut by_run: HashMap<&str, Vec<&Exec>> = HashMap::new();
    for e in execs {
        by_run.entry(e.run.as_str()).or_default().push(e);
    }
    for (run, mut lines) in by_run {
        lines.sort_by_key(|e| e.at);
        let mut open: Option<&Exec> = None;
        for e in lines {
            match (open, e.start) {
                (Some(o), true) if o.pid != e.pid => {
                    // A start while another execution is open: overlapping
                    // unless that one was cut off (never ended).
                    let ended_later = execs
                        .iter()
                        .any(|x| !x.start && x.pid == o.pid && x.run == run && x.at > e.at);
                    if ended_later {
                        out.push(format!(
                            "run {run}: step {} started in process {} while step {} ran in process {}",
                            e.index, e.pid, o.index, o.pid
                        ));
                    }
                    open = Some(e);
                }
                (_, true) => open = Some(e),
                (Some(o), false) if o.pid == e.pid => open = None,
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(run: &str, index: usize, start: bool, pid: u32, at: u128) -> Exec {
        Exec {
            run: run.into(),
            index,
            start,
            pid,
            at,
        }
    }

    #[test]
    fn done_lines_of_workers_and_runs_are_acknowledgements() {
        let a = ack_of("w3  done    5 s5  21ms", None).expect("a worker's line");
        assert_eq!((a.run.as_str(), a.index), ("w3", 5));
        let a = ack_of("  done   12 s12  3ms", Some("c1")).expect("a run's line");
        assert_eq!((a.run.as_str(), a.index), ("c1", 12));
        assert!(ack_of("w3  run     5 s5", None).is_none());
        assert!(ack_of("  run     5 s5", Some("c1")).is_none());
        assert!(ack_of("w3  done  x s5", None).is_none());
    }

    #[test]
    fn a_step_started_after_its_acknowledgement_is_found() {
        let acks = [Ack {
            run: "r".into(),
            index: 2,
            at: 100,
        }];
        let before = [exec("r", 2, true, 1, 90), exec("r", 2, false, 1, 95)];
        assert!(started_after_ack(&acks, &before).is_empty());
        let again = [exec("r", 2, true, 1, 90), exec("r", 2, true, 2, 150)];
        assert_eq!(started_after_ack(&acks, &again), [("r".to_string(), 2)]);
    }

    #[test]
    fn overlapping_executions_are_found_and_a_cut_off_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("no-such-binary");
        // Process 2 starts while process 1's step still runs (it ends later).
        let overlap = [
            exec("r", 3, true, 1, 10),
            exec("r", 3, true, 2, 20),
            exec("r", 3, false, 1, 30),
            exec("r", 3, false, 2, 40),
        ];
        let found = check_final(&bin, dir.path(), "memory:", &[], 4, &overlap);
        assert_eq!(found.len(), 1, "{found:?}");
        // Process 1 never ended its step (cut off): no overlap.
        let cut = [
            exec("r", 3, true, 1, 10),
            exec("r", 3, true, 2, 20),
            exec("r", 3, false, 2, 40),
        ];
        assert!(check_final(&bin, dir.path(), "memory:", &[], 4, &cut).is_empty());
        // One after the other: no overlap.
        let serial = [
            exec("r", 3, true, 1, 10),
            exec("r", 3, false, 1, 15),
            exec("r", 3, true, 2, 20),
            exec("r", 3, false, 2, 40),
        ];
        assert!(check_final(&bin, dir.path(), "memory:", &[], 4, &serial).is_empty());
    }
}
