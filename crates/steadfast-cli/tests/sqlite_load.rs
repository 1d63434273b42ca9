//! Many agents started at once on one SQLite store: 200 concurrent
//! `steadfast run` processes of a 10-step flow. A busy store must be a wait,
//! not a failure: every run completes, none fails with a busy or locked
//! error, and the longest wait for the write lock is reported.

mod support;

use std::process::{Command, Stdio};
use std::time::Instant;

use support::{Env, BIN};

const RUNS: usize = 200;
const STEPS: usize = 10;

#[test]
fn two_hundred_concurrent_runs_on_one_sqlite_store_all_complete() {
    let env = Env::new();
    let mut flow = String::from("name = \"load\"\n");
    for i in 0..STEPS {
        flow.push_str(&format!(
            "[[step]]\nname = \"s{i}\"\nrun = \"echo '{{\\\"s{i}\\\": {i}}}'\"\n"
        ));
    }
    let flow = env.flow("load.toml", &flow);
    // No database yet: the processes race to create it, too.

    let started = Instant::now();
    let children: Vec<_> = (0..RUNS)
        .map(|i| {
            Command::new(BIN)
                .current_dir(env.path())
                .env("STEADFAST_LOG", "debug")
                .args(["--store", &env.store(), "run"])
                .arg(&flow)
                .args(["--run-id", &format!("r{i}")])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn steadfast")
        })
        .collect();
    let mut longest_us = 0u64;
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait for steadfast");
        let err = String::from_utf8_lossy(&out.stderr);
        for line in err
            .lines()
            .filter(|l| l.contains("waited for the write lock"))
        {
            if let Some(us) = line
                .split("waited_us=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                longest_us = longest_us.max(us);
            }
        }
        if out.status.code() != Some(0) || err.contains("locked") || err.contains("busy") {
            failures.push(format!("r{i}: {:?}: {}", out.status.code(), err.trim()));
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{RUNS} runs of {STEPS} steps on one SQLite store: {:.1} s in all, longest wait for the write lock {:.1} ms",
        elapsed.as_secs_f64(),
        longest_us as f64 / 1000.0
    );
    assert!(
        failures.is_empty(),
        "{} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let out = env.run(&["runs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = runs.as_array().expect("runs --json prints a list");
    assert_eq!(runs.len(), RUNS);
    for r in runs {
        assert_eq!(r["status"], "completed", "{r}");
    }
    let state = env.show("r199");
    assert_eq!(state["state"]["s9"], 9, "{state}");
}
