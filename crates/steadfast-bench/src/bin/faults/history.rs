//! What the fault harnesses share: the flow whose steps log their start
//! and end, the clients whose `done` lines are acknowledgements, and the
//! checks over both: the one judge of `failover`, `partition` and
//! `torture`, which include this file.
// Each harness uses part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An acknowledgement: step `index` of `run` was saved, seen at `at`.
#[derive(Clone, Debug)]
pub(crate) struct Ack {
    pub(crate) run: String,
    pub(crate) index: usize,
    pub(crate) at: u128,
}

/// The acknowledgements a client's reader thread collects.
pub(crate) type Acks = Arc<Mutex<Vec<Ack>>>;

/// One line of the steps' log.
#[derive(Clone, Debug)]
pub(crate) struct Exec {
    pub(crate) run: String,
    pub(crate) index: usize,
    pub(crate) start: bool,
    /// A beat of a step under way (neither its start nor its end).
    pub(crate) beat: bool,
    pub(crate) pid: u32,
    /// The client that ran the step: its `CLIENT_ENV` (`-` without one).
    pub(crate) worker: String,
    pub(crate) at: u128,
}

pub(crate) fn nanos_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The environment variable that names a client to the steps it runs
/// (they inherit it), for the log.
pub(crate) const CLIENT_ENV: &str = "FAULTS_CLIENT";

/// A flow of `steps` steps that log their start and end.
pub(crate) fn flow(steps: usize, step_ms: u64, log: &Path) -> String {
    flow_named("failover", steps, step_ms, log, &|i| {
        format!("echo '{{\\\"s{i}\\\": {i}}}'")
    })
}

/// [`flow`], named `name`, step `i` printing its update with the shell
/// command `output(i)` (written as it goes in a TOML basic string); the
/// update must hold `"sI": I`.
pub(crate) fn flow_named(
    name: &str,
    steps: usize,
    step_ms: u64,
    log: &Path,
    output: &dyn Fn(usize) -> String,
) -> String {
    let mut flow = format!("name = \"{name}\"\nversion = \"1\"\n");
    let stamp = |what: &str| {
        format!(
            "echo \\\"$STEADFAST_RUN_ID $STEADFAST_STEP_INDEX {what} $STEADFAST_ATTEMPT $$ ${{FAULTS_CLIENT:--}} $(date +%s%N)\\\" >> {}",
            log.display()
        )
    };
    // A step that runs 200 ms or longer also logs a beat every 100 ms, so
    // that one stopped from outside (no end line) shows until when it ran.
    let (beats, rest) = if step_ms >= 200 {
        (step_ms / 100, step_ms % 100)
    } else {
        (0, step_ms)
    };
    let beating = if beats > 0 {
        format!(
            "n=0; while [ $n -lt {beats} ]; do sleep 0.1; {}; n=$((n+1)); done; ",
            stamp("beat")
        )
    } else {
        String::new()
    };
    for i in 0..steps {
        flow.push_str(&format!(
            "[[step]]\nname = \"s{i}\"\nrun = \"{}; {beating}sleep {}; {}; {}\"\n",
            stamp("start"),
            rest as f64 / 1000.0,
            stamp("end"),
            output(i),
        ));
    }
    flow
}

pub(crate) fn steadfast(bin: &Path, dir: &Path, url: &str) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(dir).arg("--store").arg(url);
    c
}

pub(crate) fn fail(why: &str) -> ! {
    eprintln!("faults: {why}");
    std::process::exit(2);
}

pub(crate) fn shell(cmd: &str, what: &str) {
    let ok = Command::new("sh").args(["-c", cmd]).status();
    if !ok.is_ok_and(|s| s.success()) {
        fail(&format!("{what} command failed: {cmd}"));
    }
}

/// Starts `cmd` in a process group of its own and reads its standard
/// error on a thread: each `done` line is an acknowledgement (of `run`, or
/// of the run the line names, for a worker).
pub(crate) fn spawn_reading(cmd: &mut Command, run: Option<String>, acks: &Acks) -> Child {
    spawn_keeping(cmd, run, acks, None)
}

/// [`spawn_reading`], also keeping every line of standard error in `lines`.
pub(crate) fn spawn_keeping(
    cmd: &mut Command,
    run: Option<String>,
    acks: &Acks,
    lines: Option<&Arc<Mutex<Vec<String>>>>,
) -> Child {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn steadfast");
    let err = child.stderr.take().expect("piped");
    let acks = Arc::clone(acks);
    let lines = lines.map(Arc::clone);
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(ack) = ack_of(&line, run.as_deref()) {
                acks.lock().unwrap().push(ack);
            }
            if let Some(all) = &lines {
                all.lock().unwrap().push(line);
            }
        }
    });
    child
}

/// `RUN  done  INDEX NAME  TOOK` (a worker) or `  done  INDEX NAME  TOOK`
/// (a `run` process, whose run is `run`).
pub(crate) fn ack_of(line: &str, run: Option<&str>) -> Option<Ack> {
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
pub(crate) fn signal_all(clients: &[Child], signal: &str) {
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
pub(crate) fn read_runs(bin: &Path, dir: &Path, url: &str) -> HashMap<String, (String, usize)> {
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
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> Option<Vec<u8>> {
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
pub(crate) fn acked_steps(acks: &[Ack]) -> BTreeMap<String, Vec<usize>> {
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

pub(crate) fn read_log(log: &Path) -> Vec<Exec> {
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
                beat: w[2] == "beat",
                pid: w[4].parse().ok()?,
                worker: w[5].to_string(),
                at: w[6].parse().ok()?,
            })
        })
        .collect()
}

/// The last line (end or beat) of execution `pid` of `run`, if any.
pub(crate) fn last_sign(execs: &[Exec], run: &str, pid: u32) -> Option<u128> {
    execs
        .iter()
        .filter(|x| !x.start && x.pid == pid && x.run == run)
        .map(|x| x.at)
        .max()
}

/// Steps whose execution started after their checkpoint was acknowledged:
/// an acknowledged checkpoint the store forgot.
pub(crate) fn started_after_ack(acks: &[Ack], execs: &[Exec]) -> Vec<(String, usize)> {
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

/// Per run, in the order they started: its steps first ran in order (step
/// 0 first, none before the one after the highest so far), and no step
/// started again once a later one had started (a checkpointed step ran
/// again: an acknowledged checkpoint was lost).
pub(crate) fn check_order(execs: &[Exec]) -> Vec<String> {
    let mut by_run: BTreeMap<&str, Vec<&Exec>> = BTreeMap::new();
    for e in execs.iter().filter(|e| e.start) {
        by_run.entry(e.run.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (run, mut starts) in by_run {
        starts.sort_by_key(|e| e.at);
        let mut highest: Option<usize> = None;
        for e in starts {
            let i = e.index;
            match highest {
                None if i != 0 => out.push(format!("run {run}: step {i} ran first")),
                Some(h) if i > h + 1 => {
                    out.push(format!("run {run}: step {i} ran before step {}", h + 1))
                }
                Some(h) if i < h => {
                    out.push(format!("run {run}: step {i} ran again after step {h}"))
                }
                _ => {}
            }
            highest = Some(highest.map_or(i, |h| h.max(i)));
        }
    }
    out
}

/// Each run's re-executions: the starts of its steps beyond one per step
/// that started.
pub(crate) fn reexecutions(execs: &[Exec]) -> BTreeMap<String, usize> {
    let mut starts: BTreeMap<String, (usize, std::collections::BTreeSet<usize>)> = BTreeMap::new();
    for e in execs.iter().filter(|e| e.start) {
        let entry = starts.entry(e.run.clone()).or_default();
        entry.0 += 1;
        entry.1.insert(e.index);
    }
    starts
        .into_iter()
        .map(|(run, (n, distinct))| (run, n - distinct.len()))
        .collect()
}

/// Every run completed with its full state, and no two executions of a
/// run's steps overlapped in time.
pub(crate) fn check_final(
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
                    // unless that one had been cut off (no end or beat of
                    // it comes later).
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
                (Some(o), false) if o.pid == e.pid && !e.beat => open = None,
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
            beat: false,
            pid,
            worker: pid.to_string(),
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
    fn steps_out_of_order_or_run_again_after_a_later_one_are_found() {
        let starts = |run: &str, order: &[usize]| -> Vec<Exec> {
            order
                .iter()
                .enumerate()
                .map(|(t, i)| exec(run, *i, true, t as u32, t as u128))
                .collect()
        };
        // A step run again before the next one started is a re-execution,
        // not a violation.
        let fine = starts("a", &[0, 1, 1, 2, 3, 3]);
        assert!(check_order(&fine).is_empty(), "{:?}", check_order(&fine));
        assert_eq!(reexecutions(&fine)["a"], 2);
        let again = starts("b", &[0, 1, 2, 1, 2]);
        let found = check_order(&again);
        assert_eq!(found, ["run b: step 1 ran again after step 2"], "{found:?}");
        assert_eq!(check_order(&starts("c", &[1])), ["run c: step 1 ran first"]);
        assert_eq!(
            check_order(&starts("d", &[0, 2])),
            ["run d: step 2 ran before step 1"]
        );
        // End lines do not count.
        let mut ends = starts("e", &[0, 1]);
        ends.push(exec("e", 0, false, 9, 9));
        assert!(check_order(&ends).is_empty());
        assert_eq!(reexecutions(&ends)["e"], 0);
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
        // Process 1 never ended its step but beat after process 2 began:
        // it ran on, stopped late.
        let mut beat = exec("r", 3, false, 1, 30);
        beat.beat = true;
        let late = [
            exec("r", 3, true, 1, 10),
            exec("r", 3, true, 2, 20),
            beat,
            exec("r", 3, false, 2, 40),
        ];
        assert_eq!(
            check_final(&bin, dir.path(), "memory:", &[], 4, &late).len(),
            1
        );
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
