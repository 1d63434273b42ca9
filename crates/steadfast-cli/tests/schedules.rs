//! Schedules across processes: slots missed while no worker ran start once
//! each (at most the catch-up of them besides the latest), two workers
//! never start a slot twice, and `schedule add`, `list` and `remove` say
//! what they did and refuse what is wrong.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

fn spawn(env: &Env, args: &[&str]) -> std::io::Result<Child> {
    env.cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

fn millis(text: &str) -> u64 {
    humantime::parse_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn runs(env: &Env) -> Vec<Value> {
    let out = env.run(&["runs", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("runs --json prints JSON")
}

#[test]
fn a_schedule_due_while_all_workers_were_down_starts_its_missed_runs_once_each() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "tick.toml",
        "name = \"tick\"\n[[step]]\nname = \"log\"\nrun = \"echo $STEADFAST_RUN_ID >> log\"\n",
    );
    let f = flow.to_str().unwrap();
    let out = env.run(&[
        "schedule",
        "add",
        "every",
        f,
        "--cron",
        "* * * * * *",
        "--catch-up",
        "3",
        "--input",
        "{\"k\": 1}",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let added: Value = serde_json::from_slice(&out.stdout)?;
    let since = millis(added["since"].as_str().unwrap());
    // No worker for five and a half seconds: five or six slots are missed.
    std::thread::sleep(Duration::from_millis(5_500));
    let up = now_ms();
    let worker = |env: &Env| spawn(env, &["worker", f, "--poll", "100ms", "--lease", "5s"]);
    let mut workers = vec![worker(&env)?, worker(&env)?];
    std::thread::sleep(Duration::from_millis(3_000));
    let out = env.run(&["schedule", "remove", "every"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Every run started reaches its end.
    let deadline = Instant::now() + Duration::from_secs(60);
    let all = loop {
        let all = runs(&env);
        if all.iter().all(|r| r["status"] == "completed") {
            break all;
        }
        assert!(Instant::now() < deadline, "runs did not complete: {all:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for mut w in workers.drain(..) {
        w.kill()?;
        w.wait()?;
    }

    let mut slots: Vec<u64> = all
        .iter()
        .map(|r| {
            let id = r["run_id"].as_str().unwrap();
            let slot = id.strip_prefix("every@").unwrap_or_else(|| panic!("{id}"));
            millis(slot)
        })
        .collect();
    slots.sort_unstable();
    assert!(!slots.is_empty(), "the schedule started nothing");
    // One run per second from the first on: none left out once workers ran.
    for pair in slots.windows(2) {
        assert_eq!(pair[1] - pair[0], 1_000, "slots not one apart: {slots:?}");
    }
    // Of the slots missed while no worker ran, the latest and at most three
    // more started; older ones were skipped.
    let missed: Vec<u64> = slots.iter().copied().filter(|s| *s <= up).collect();
    assert!(
        (1..=4).contains(&missed.len()),
        "missed slots started: {missed:?} (workers up at {up}, added at {since})"
    );
    assert!(
        slots[0] > since + 1_000,
        "the oldest missed slot was not skipped: {slots:?}, added at {since}"
    );
    assert!(slots.len() >= 4, "too few runs: {slots:?}");
    // Each run's step ran once, with the schedule's input.
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for line in env.log() {
        *seen.entry(line).or_default() += 1;
    }
    assert_eq!(seen.len(), slots.len(), "{seen:?}");
    assert!(seen.values().all(|n| *n == 1), "a slot ran twice: {seen:?}");
    let one = &all[0];
    let shown = env.show(one["run_id"].as_str().unwrap());
    assert_eq!(shown["state"]["k"], 1, "{shown}");
    Ok(())
}

#[test]
fn schedule_add_list_and_remove_say_what_they_did_and_refuse_what_is_wrong() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "tick.toml",
        "name = \"tick\"\n[[step]]\nname = \"log\"\nrun = \"true\"\n",
    );
    let f = flow.to_str().unwrap();
    let out = env.run(&[
        "schedule",
        "add",
        "nightly",
        f,
        "--cron",
        "0 2 * * *",
        "--tz",
        "Europe/Berlin",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("Europe/Berlin"), "{}", stderr(&out));
    let out = env.run(&["schedule", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(listed[0]["name"], "nightly");
    assert_eq!(listed[0]["workflow"], "tick");
    assert_eq!(listed[0]["zone"], "Europe/Berlin");
    assert_eq!(listed[0]["catch_up"], 1);
    // 02:00 in Berlin is 01:00 UTC in winter and 00:00 UTC in summer.
    let next = listed[0]["next"].as_str().unwrap();
    assert!(
        next.ends_with("T01:00:00.000Z") || next.ends_with("T00:00:00.000Z"),
        "{next}"
    );
    let out = env.run(&["schedule", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nightly"));

    let refused = |args: &[&str], says: &str| {
        let out = env.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    };
    let add =
        |name: &str, cron: &str| ["schedule", "add", name, f, "--cron", cron].map(String::from);
    let args = add("nightly", "* * * * *");
    refused(
        &args.each_ref().map(String::as_str),
        "exists; remove it first",
    );
    let args = add("x y", "* * * * *");
    refused(&args.each_ref().map(String::as_str), "use letters");
    let args = add("x", "* * *");
    refused(&args.each_ref().map(String::as_str), "does not parse");
    let args = add("x", "0 0 31 2 *");
    refused(&args.each_ref().map(String::as_str), "never matches");
    refused(
        &[
            "schedule",
            "add",
            "x",
            f,
            "--cron",
            "* * * * *",
            "--tz",
            "Local",
        ],
        "IANA",
    );
    refused(
        &[
            "schedule",
            "add",
            "x",
            f,
            "--cron",
            "* * * * *",
            "--catch-up",
            "1001",
        ],
        "at most 1000",
    );
    refused(
        &[
            "schedule",
            "add",
            "x",
            f,
            "--cron",
            "* * * * *",
            "--input",
            "[1]",
        ],
        "JSON object",
    );
    let out = env.run(&[
        "schedule",
        "add",
        "x",
        "missing.toml",
        "--cron",
        "* * * * *",
    ]);
    assert_ne!(code(&out), 0);
    // Nothing refused was kept, and the first schedule is as it was.
    let out = env.run(&["schedule", "list", "--json"]);
    let after: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(after, listed);

    let out = env.run(&["schedule", "remove", "nightly"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    refused(&["schedule", "remove", "nightly"], "no schedule");
    let out = env.run(&["schedule", "list", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout)?,
        serde_json::json!([])
    );
    Ok(())
}
