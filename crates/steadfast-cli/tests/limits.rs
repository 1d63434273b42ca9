//! Shared limits across processes: workers and `steadfast run`s on one
//! store never run more steps of a key at once than its size, also while
//! workers are SIGKILLed; a rate set on the store paces starts across
//! processes; `limits set` and `list`; a step's "retry after" holds the key.

mod support;

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn spawn(env: &Env, args: &[&str]) -> std::io::Result<Child> {
    env.cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Waits until every run in `ids` has completed (or panics after `within`).
fn wait_completed(env: &Env, ids: &[String], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let out = env.run(&["runs", "--json", "--status", "completed"]);
        let done: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if done.len() >= ids.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} runs completed in {within:?}: {}",
            done.len(),
            ids.len(),
            String::from_utf8_lossy(&env.run(&["runs"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn workers_and_runs_never_hold_more_slots_than_the_size_even_when_killed() -> TestResult {
    let env = Env::new();
    // Each attempt logs its start and end with the pids of the shell's
    // parent and grandparent (the process that runs it is one of them).
    let flow = env.flow(
        "lim.toml",
        "name = \"lim\"\n[[step]]\nname = \"work\"\nlimit = \"tool:2\"\nretries = 3\nrun = \"p=$PPID,$(awk '{print $4}' /proc/$PPID/stat); echo start $(date +%s%N) $p $STEADFAST_RUN_ID >> log; sleep 0.25; echo end $(date +%s%N) $p $STEADFAST_RUN_ID >> log\"\n",
    );
    let f = flow.to_str().unwrap();
    let mut ids = Vec::new();
    for i in 0..16 {
        let id = format!("w{i}");
        let out = env.run(&["start", f, "--run-id", &id]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        ids.push(id);
    }
    let worker = |env: &Env| {
        spawn(
            env,
            &[
                "worker",
                f,
                "--concurrency",
                "3",
                "--poll",
                "100ms",
                "--lease",
                "2s",
            ],
        )
    };
    let mut workers = vec![worker(&env)?, worker(&env)?, worker(&env)?];
    let mut runs = Vec::new();
    for id in ["rA", "rB"] {
        runs.push(spawn(&env, &["run", f, "--run-id", id, "--wait"])?);
        ids.push(id.to_string());
    }
    // Kill two workers mid-flight, each replaced by a new one.
    let mut killed: HashMap<u32, u128> = HashMap::new();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(700));
        let mut w = workers.remove(0);
        // Its steps get SIGTERM as it dies (their parent-death signal); one
        // starting then may log its start after this instant.
        killed.insert(w.id(), now_ns());
        let killed_ok = w.kill();
        w.wait()?;
        killed_ok?;
        workers.push(worker(&env)?);
    }
    wait_completed(&env, &ids, Duration::from_secs(90));
    for mut r in runs {
        let status = r.wait()?;
        assert!(status.success(), "a run process failed: {status}");
    }
    for mut w in workers {
        w.kill()?;
        w.wait()?;
    }

    // Intervals: an attempt without an end died with its process.
    let mut open: HashMap<(String, String), u128> = HashMap::new();
    let mut intervals: Vec<(u128, u128)> = Vec::new();
    for line in env.log() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [what, t, pid, run] = parts[..] else {
            panic!("a bad log line: {line:?}")
        };
        let t: u128 = t.parse()?;
        let key = (pid.to_string(), run.to_string());
        match what {
            "start" => {
                open.insert(key, t);
            }
            "end" => {
                let start = open.remove(&key).expect("an end after its start");
                intervals.push((start, t));
            }
            _ => panic!("a bad log line: {line:?}"),
        }
    }
    for ((pids, run), start) in open {
        // The step's parent and grandparent: whichever ran it.
        let killed_at = pids
            .split(',')
            .filter_map(|p| p.parse::<u32>().ok())
            .find_map(|p| killed.get(&p).copied())
            .unwrap_or_else(|| {
                panic!("run {run}'s attempt in {pids} never ended, yet its process was not killed")
            });
        // An attempt that logged its start as its worker died lasted no
        // longer than that (an end before the start would count it as
        // holding a slot for ever after).
        intervals.push((start, killed_at.max(start)));
    }
    let mut edges: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    // An end at the same instant as a start is counted first.
    edges.sort();
    let (mut at_once, mut most) = (0, 0);
    for (_, d) in edges {
        at_once += d;
        most = most.max(at_once);
    }
    intervals.sort();
    assert_eq!(
        most, 2,
        "at most 2 at once, and the limit was reached; attempts (start, end in ns): {intervals:?}"
    );
    assert!(intervals.len() >= ids.len(), "{} attempts", intervals.len());
    // Every slot was given back (or freed with its dead holder).
    let out = env.run(&["limits", "list", "--json"]);
    let limits: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(limits[0]["key"], "tool");
    Ok(())
}

#[test]
fn a_rate_set_on_the_store_paces_starts_across_processes() -> TestResult {
    let env = Env::new();
    // The bucket holds a second's starts (the default burst): a starter
    // that comes late does not lose its start.
    let out = env.run(&["limits", "set", "paced", "--rate", "10/s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Runs of many steps, each step one start of the key: two worker
    // processes take four runs, two `run --wait` processes one each.
    let mut text = String::from("name = \"paced\"\n");
    for i in 0..120 {
        text.push_str(&format!(
            "[[step]]\nname = \"call{i}\"\nlimit = \"paced\"\nrun = \"echo $(date +%s%N) >> log\"\n"
        ));
    }
    let flow = env.flow("paced.toml", &text);
    let f = flow.to_str().unwrap();
    for i in 0..4 {
        let out = env.run(&["start", f, "--run-id", &format!("w{i}")]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let mut procs = Vec::new();
    for _ in 0..2 {
        procs.push(spawn(
            &env,
            &["worker", f, "--concurrency", "4", "--poll", "100ms"],
        )?);
    }
    for id in ["rA", "rB"] {
        procs.push(spawn(&env, &["run", f, "--run-id", id, "--wait"])?);
    }
    let deadline = Instant::now() + Duration::from_secs(70);
    let starts = loop {
        let mut starts: Vec<u128> = env.log().iter().filter_map(|l| l.parse().ok()).collect();
        starts.sort();
        if starts.len() > 2 && starts[starts.len() - 1] > starts[0] + 31_000_000_000 {
            break starts;
        }
        assert!(
            Instant::now() < deadline,
            "the runs stalled: {} starts",
            starts.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for mut p in procs {
        p.kill()?;
        p.wait()?;
    }
    let first = starts[0];
    let in_window = starts
        .iter()
        .filter(|t| **t < first + 30_000_000_000)
        .count();
    // 10 a second for 30 s, within 10% (the burst's 10 at the start
    // included).
    assert!(
        (270..=330).contains(&in_window),
        "{in_window} starts in 30 s at 10/s"
    );
    // And no second much over the rate after the first.
    for s in 1..30u128 {
        let n = starts
            .iter()
            .filter(|t| (first + s * 1_000_000_000..first + (s + 1) * 1_000_000_000).contains(*t))
            .count();
        assert!(n <= 20, "{n} starts in second {s}");
    }
    Ok(())
}

#[test]
fn limits_are_set_listed_and_checked_and_a_retry_after_holds_the_key() -> TestResult {
    let env = Env::new();
    for bad in [
        &["limits", "set", "a b", "2"][..],
        &["limits", "set", "k", "0"],
        &["limits", "set", "k", "--rate", "fast"],
        &["limits", "set", "k", "--rate", "0/s"],
        &["limits", "set", "k", "--burst", "3"],
        &["limits", "set", "", "2"],
        &["limits", "set", &"k".repeat(65), "2"],
        &["limits", "set", "k", "99999999999"],
        &["limits", "set", "k", "--rate", "1e10/s"],
        &["limits", "set", "k", "--rate", "5/0s"],
        &["limits", "set", "k", "--rate", "5/s", "--burst", "-1"],
    ] {
        let out = env.run(bad);
        assert_eq!(code(&out), 2, "{bad:?}: {}", stderr(&out));
    }
    let out = env.run(&[
        "limits", "set", "openai", "8", "--rate", "500/min", "--burst", "50",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["limits", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("openai") && text.contains("500/1m"), "{text}");

    // A limit on a gate, and a limit that does not parse: the line is named.
    let gate = env.flow(
        "gate.toml",
        "name = \"g\"\n[[step]]\nname = \"ok\"\ngate = true\nlimit = \"x:1\"\n",
    );
    let out = env.run(&["run", gate.to_str().unwrap(), "--run-id", "g"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("limit"), "{}", stderr(&out));
    let bad = env.flow(
        "bad.toml",
        "name = \"b\"\n[[step]]\nname = \"s\"\nrun = \"true\"\nlimit = \"x:lots\"\n",
    );
    let out = env.run(&["run", bad.to_str().unwrap(), "--run-id", "b"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.toml:5"), "{}", stderr(&out));

    // The first attempt is turned away with a "retry after" of 1 s: every
    // step of the key waits, the retry too.
    let flow = env.flow(
        "provider.toml",
        "name = \"provider\"\n[[step]]\nname = \"call\"\nlimit = \"api:4\"\nretries = 2\nrun = \"if [ ! -e once ]; then touch once; echo '{\\\"retry_after\\\": \\\"1s\\\"}'; exit 1; fi; echo done >> log\"\n",
    );
    let started = Instant::now();
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "p", "--wait"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(env.log(), ["done"]);
    let out = env.run(&["limits", "list", "--json"]);
    let limits: Value = serde_json::from_slice(&out.stdout)?;
    let api = limits
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["key"] == "api")
        .expect("the api limit");
    assert!(api["paused_until"].is_string(), "{api}");
    assert_eq!(api["held"], Value::Null, "its slot was given back: {api}");
    Ok(())
}
