//! The `steadfast` binary, end to end: every command, exit code and error path.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const TWO_STEPS: &str = r#"
name = "two"
[[step]]
name = "a"
run = "echo a >> log; echo '{\"a\": 1}'"
[[step]]
name = "b"
run = "echo b >> log; cat > seen.json; echo '{\"b\": 2}'"
"#;

#[test]
fn run_show_runs_history_and_delete_work_together() -> TestResult {
    let env = Env::new();
    let flow = env.flow("two.toml", TWO_STEPS);
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r1", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let state: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(state, serde_json::json!({"a": 1, "b": 2}));
    assert!(
        stderr(&out).contains("done"),
        "progress lines on stderr: {}",
        stderr(&out)
    );
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path().join("seen.json"))?)?;
    assert_eq!(
        seen,
        serde_json::json!({"a": 1}),
        "step b got the state on stdin"
    );

    let show = env.show("r1");
    for key in [
        "run_id",
        "workflow",
        "status",
        "next",
        "steps_done",
        "state",
    ] {
        assert!(show.get(key).is_some(), "show --json lacks {key}: {show}");
    }
    assert_eq!(
        (show["status"].as_str(), show["next"].as_u64()),
        (Some("completed"), Some(2))
    );
    assert_eq!(show["steps_done"][1]["name"], "b");

    let again = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r1"]);
    assert_eq!(code(&again), 0);
    assert_eq!(env.log(), ["a", "b"], "a completed run runs nothing");

    let runs = env.run(&["runs", "--json"]);
    let list: Value = serde_json::from_slice(&runs.stdout)?;
    assert_eq!(list[0]["run_id"], "r1");
    let table = String::from_utf8(env.run(&["runs"]).stdout)?;
    assert!(
        table.starts_with("RUN") && table.contains("completed"),
        "{table}"
    );
    let filtered: Value =
        serde_json::from_slice(&env.run(&["runs", "--status", "failed", "--json"]).stdout)?;
    assert_eq!(filtered, serde_json::json!([]));
    assert_eq!(code(&env.run(&["runs", "--status", "bogus"])), 2);

    let mut history: Value = serde_json::from_slice(&env.run(&["history", "r1", "--json"]).stdout)?;
    // What the step ran as is its record's own key, beside its update.
    let update = history[1]["update"].as_object_mut().ok_or("update")?;
    assert!(update.remove("__step").is_some(), "{update:?}");
    assert_eq!(Value::Object(update.clone()), serde_json::json!({"b": 2}));

    assert_eq!(code(&env.run(&["delete", "r1"])), 0);
    assert_eq!(code(&env.run(&["show", "r1"])), 2, "a deleted run is gone");
    assert_eq!(code(&env.run(&["delete", "r1"])), 2);
    Ok(())
}

#[test]
fn steps_get_their_environment() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "env.toml",
        r#"
name = "env"
[[step]]
name = "show/env"
env = { EXTRA = "yes" }
run = '''printf '{"id":"%s","step":"%s","index":"%s","attempt":"%s","key":"%s","extra":"%s"}' "$STEADFAST_RUN_ID" "$STEADFAST_STEP" "$STEADFAST_STEP_INDEX" "$STEADFAST_ATTEMPT" "$STEADFAST_IDEMPOTENCY_KEY" "$EXTRA"'''
"#,
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r/1", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let state: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        state,
        serde_json::json!({"id": "r/1", "step": "show/env", "index": "0", "attempt": "1",
                           "key": "r%2F1/show%2Fenv", "extra": "yes"})
    );
    Ok(())
}

#[test]
fn malformed_and_invalid_flow_files_exit_2_naming_file_and_line() -> TestResult {
    let env = Env::new();
    let cases: &[(&str, &str, &str)] = &[
        ("syntax", "name = \"x\"\n[[step]\nname = \"a\"\n", ":2:"),
        ("unknown key", "name = \"x\"\n[[step]]\nname = \"a\"\nrun = \"true\"\nretry = 3\n", "retry"),
        ("duplicate", "name = \"x\"\n[[step]]\nname = \"a\"\nrun = \"true\"\n[[step]]\nname = \"a\"\nrun = \"true\"\n", "used twice"),
        ("empty name", "name = \"x\"\n[[step]]\nname = \"\"\nrun = \"true\"\n", "empty name"),
        ("no kind", "name = \"x\"\n[[step]]\nname = \"a\"\n", "needs one of run, gate, sleep, wait or child"),
        ("two kinds", "name = \"x\"\n[[step]]\nname = \"a\"\nrun = \"true\"\ngate = true\n", "more than one"),
        ("bad duration", "name = \"x\"\n[[step]]\nname = \"a\"\nrun = \"true\"\ntimeout = \"soon\"\n", ":5:"),
        ("on_timeout alone", "name = \"x\"\n[[step]]\nname = \"g\"\ngate = true\non_timeout = \"approve\"\n", "needs a timeout"),
        ("no steps", "name = \"x\"\n", "no [[step]]"),
    ];
    for (what, text, expect) in cases {
        let flow = env.flow("bad.toml", text);
        let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{what}: {err}");
        assert!(
            err.contains("bad.toml"),
            "{what}: the error names the file: {err}"
        );
        assert!(
            err.contains(expect),
            "{what}: expected {expect:?} in: {err}"
        );
    }
    let missing = env.run(&["run", "nope.toml", "--run-id", "r"]);
    assert_eq!(code(&missing), 2, "{}", stderr(&missing));
    assert_eq!(env.run(&["runs", "--json"]).stdout, b"[]\n", "nothing ran");
    Ok(())
}

#[test]
fn bad_step_output_fails_the_step_with_a_quote() -> TestResult {
    let env = Env::new();
    let cases = [
        ("garbage", "echo 'hello world'", "not JSON"),
        ("array", "echo '[1, 2]'", "an array"),
        // One byte past the limit (1 GiB and a MiB): read and dropped as
        // it comes, never kept.
        (
            "huge",
            "head -c 1074790401 /dev/zero",
            "more than 1074790400 bytes",
        ),
        ("exit code", "echo oops >&2; exit 7", "code 7"),
    ];
    for (what, run, expect) in cases {
        let flow = env.flow(
            "out.toml",
            &format!("name = \"out\"\n[[step]]\nname = \"ok\"\nrun = \"echo '{{\\\"ok\\\": 1}}'\"\n[[step]]\nname = \"bad\"\nrun = '''{run}'''\n"),
        );
        let id = format!("r-{what}");
        let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", &id]);
        let err = stderr(&out);
        assert_eq!(code(&out), 1, "{what}: {err}");
        assert!(err.contains(expect), "{what}: expected {expect:?} in {err}");
        let show = env.show(&id);
        assert_eq!(show["status"], "failed", "{what}");
        assert_eq!(
            show["state"],
            serde_json::json!({"ok": 1}),
            "{what}: state kept"
        );
        assert!(
            show["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(expect),
            "{what}: {show}"
        );
    }
    let exit_err = env.show("r-exit code");
    assert!(
        exit_err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("oops"),
        "stderr tail recorded"
    );
    Ok(())
}

#[test]
fn bad_run_ids_stores_and_corrupt_files_are_reported() -> TestResult {
    let env = Env::new();
    let flow = env.flow("two.toml", TWO_STEPS);
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "bad\nid"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("control character"),
        "{}",
        stderr(&out)
    );

    let out = Command::new(BIN)
        .args(["--store", "ftp://x", "runs"])
        .output()?;
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("unknown scheme"), "{}", stderr(&out));

    let corrupt = env.path().join("corrupt.json");
    std::fs::write(&corrupt, b"{\"format\": 1, \"runs\": {")?;
    let url = format!("file:{}", corrupt.display());
    let out = Command::new(BIN)
        .current_dir(env.path())
        .args([
            "--store",
            &url,
            "run",
            flow.to_str().unwrap(),
            "--run-id",
            "r",
        ])
        .output()?;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&corrupt.display().to_string()),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(&corrupt)?,
        b"{\"format\": 1, \"runs\": {",
        "the file is unchanged"
    );
    assert!(env.log().is_empty(), "no step ran");
    Ok(())
}

#[test]
fn a_changed_flow_is_refused_unless_accepted() -> TestResult {
    let env = Env::new();
    let gate = "name = \"w\"\n[[step]]\nname = \"a\"\nrun = \"echo a >> log\"\n[[step]]\nname = \"g\"\ngate = true\n[[step]]\nname = \"c\"\nrun = \"echo c >> log\"\n";
    let flow = env.flow("w.toml", gate);
    assert_eq!(
        code(&env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"])),
        4
    );
    let changed = env.flow("w.toml", &gate.replace("name = \"a\"", "name = \"a2\""));
    let out = env.run(&["run", changed.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("different workflow"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&[
        "run",
        changed.to_str().unwrap(),
        "--run-id",
        "r",
        "--accept-changed-workflow",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(env.log(), ["a"], "no step ran again");
    Ok(())
}

#[test]
fn a_timed_out_step_has_its_process_group_killed() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "slow.toml",
        "name = \"slow\"\n[[step]]\nname = \"hang\"\ntimeout = \"1s\"\nrun = \"sleep 30 & echo $! > bg.pid; sleep 30\"\n",
    );
    let start = Instant::now();
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("timed out after 1s"),
        "{}",
        stderr(&out)
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    let bg = std::fs::read_to_string(env.path().join("bg.pid"))?;
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !pid_alive(&bg),
        "the step's background process survived the timeout"
    );
    Ok(())
}

#[test]
fn retries_succeed_on_the_third_attempt() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "retry.toml",
        "name = \"retry\"\n[[step]]\nname = \"flaky\"\nretries = 2\nbackoff = \"10ms\"\nrun = \"echo $STEADFAST_ATTEMPT >> log; test $STEADFAST_ATTEMPT -ge 3 && echo '{\\\"ok\\\": true}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.log(), ["1", "2", "3"]);
    let history: Value = serde_json::from_slice(&env.run(&["history", "r", "--json"]).stdout)?;
    assert_eq!(history[0]["attempt"], 3);
    Ok(())
}

const GATED: &str = "name = \"gated\"\n[[step]]\nname = \"draft\"\nrun = \"echo '{\\\"draft\\\": 1}'\"\n[[step]]\nname = \"review\"\ngate = true\nTIMEOUT\n[[step]]\nname = \"publish\"\nrun = \"cat > seen.json; echo publish >> log\"\n";

#[test]
fn gates_are_approved_rejected_or_time_out() -> TestResult {
    let env = Env::new();
    let flow = env.flow("gated.toml", &GATED.replace("TIMEOUT", ""));
    let f = flow.to_str().unwrap();
    let out = env.run(&["run", f, "--run-id", "yes"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("steadfast approve yes review"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.show("yes")["wait"]["step"], "review");
    assert_eq!(
        code(&env.run(&["approve", "yes", "review", "--data", "not json"])),
        2
    );
    assert_eq!(
        code(&env.run(&["approve", "yes", "draft"])),
        2,
        "not waiting there"
    );
    assert_eq!(
        code(&env.run(&[
            "approve",
            "yes",
            "review",
            "--data",
            "{\"ok\": true}",
            "--by",
            "ada"
        ])),
        0
    );
    assert_eq!(code(&env.run(&["run", f, "--run-id", "yes"])), 0);
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path().join("seen.json"))?)?;
    assert_eq!(seen["review"], serde_json::json!({"ok": true}));
    let show = env.show("yes");
    assert_eq!(
        (
            show["decisions"][0]["by"].as_str(),
            show["decisions"][0]["approved"].as_bool()
        ),
        (Some("ada"), Some(true))
    );

    assert_eq!(code(&env.run(&["run", f, "--run-id", "no"])), 4);
    assert_eq!(
        code(&env.run(&["reject", "no", "review", "--reason", "too long", "--by", "bo"])),
        0
    );
    let out = env.run(&["run", f, "--run-id", "no"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("too long"));
    assert_eq!(env.show("no")["status"], "rejected");

    let timed = env.flow(
        "timed.toml",
        &GATED.replace("TIMEOUT", "timeout = \"1s\"\non_timeout = \"approve\""),
    );
    let t = timed.to_str().unwrap();
    assert_eq!(code(&env.run(&["run", t, "--run-id", "late"])), 4);
    std::thread::sleep(Duration::from_millis(1200));
    let out = env.run(&["run", t, "--run-id", "late"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("late")["decisions"][0]["by"], "timeout");
    assert_eq!(
        env.log(),
        ["publish", "publish"],
        "publish ran once per approved run"
    );
    Ok(())
}

#[test]
fn a_timer_survives_a_kill_and_wait_sleeps_only_what_remains() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "nap.toml",
        "name = \"nap\"\n[[step]]\nname = \"nap\"\nsleep = \"3s\"\n[[step]]\nname = \"after\"\nrun = \"echo after >> log\"\n",
    );
    let f = flow.to_str().unwrap();
    let start = Instant::now();
    let out = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("sleeps until"), "{}", stderr(&out));
    assert_eq!(env.show("r")["status"], "sleeping");

    std::thread::sleep(Duration::from_millis(1000));
    let mut waiting = env
        .cmd(&["run", f, "--run-id", "r", "--wait"])
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(700));
    waiting.kill()?;
    waiting.wait()?;
    assert!(env.log().is_empty(), "the timer fired early");
    let out = env.run(&["run", f, "--run-id", "r", "--wait"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let total = start.elapsed();
    // A timer restarted by either later call would end after at least 4.7 s.
    assert!(
        total >= Duration::from_millis(2900),
        "the timer fired early: {total:?}"
    );
    assert!(
        total < Duration::from_millis(4200),
        "the timer restarted after the kill: {total:?}"
    );
    assert_eq!(env.log(), ["after"]);
    Ok(())
}

#[test]
fn two_concurrent_runs_of_one_id_one_proceeds_and_the_other_exits_3() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "one.toml",
        "name = \"one\"\n[[step]]\nname = \"work\"\nrun = \"echo work >> log; sleep 2\"\n",
    );
    let f = flow.to_str().unwrap();
    let first = env
        .cmd(&["run", f, "--run-id", "r"])
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(300));
    let second = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&second), 3, "{}", stderr(&second));
    assert!(
        stderr(&second).contains("held by pid"),
        "{}",
        stderr(&second)
    );
    let first = first.wait_with_output()?;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert_eq!(env.log(), ["work"], "the step ran once");
    Ok(())
}

#[test]
fn killing_steadfast_mid_step_leaves_no_orphan() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "orphan.toml",
        "name = \"orphan\"\nversion = \"1\"\n[[step]]\nname = \"hang\"\nrun = \"sleep 60 & echo $! > bg.pid; echo $$ > sh.pid; sleep 60\"\n",
    );
    let mut child = env
        .cmd(&["run", flow.to_str().unwrap(), "--run-id", "r"])
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(env.path().join("bg.pid").exists() && env.path().join("sh.pid").exists()) {
        assert!(Instant::now() < deadline, "the step never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    child.kill()?; // SIGKILL to steadfast alone
    child.wait()?;
    std::thread::sleep(Duration::from_millis(500));
    for f in ["bg.pid", "sh.pid"] {
        let pid = std::fs::read_to_string(env.path().join(f))?;
        assert!(!pid_alive(&pid), "{f} ({}) outlived steadfast", pid.trim());
    }
    // And the run resumes at once: the dead holder's lease is taken over
    // (the step's command edited under the same declared version).
    let quick = env.flow(
        "orphan.toml",
        "name = \"orphan\"\nversion = \"1\"\n[[step]]\nname = \"hang\"\nrun = \"true\"\n",
    );
    let out = env.run(&["run", quick.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    Ok(())
}

#[test]
fn crash_torture_of_concurrent_runs_loses_and_repeats_nothing_beyond_one_step_per_kill(
) -> TestResult {
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    let steps = 6;
    let mut text = String::from("name = \"torture\"\n");
    for i in 0..steps {
        text.push_str(&format!(
            "[[step]]\nname = \"s{i}\"\nrun = \"echo \\\"$STEADFAST_RUN_ID {i}\\\" >> log; sleep 0.1; echo '{{\\\"s{i}\\\": {i}}}'\"\n"
        ));
    }
    let flow = env.flow("torture.toml", &text);
    let f = flow.to_str().unwrap().to_string();
    let per_generation = 4;
    let kills_wanted: usize = std::env::var("STEADFAST_TEST_CLI_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    // Generations of concurrent runs, each killed and restarted until done,
    // until enough kills have landed.
    let mut kills: Vec<(String, usize)> = Vec::new();
    let mut total = 0;
    let start = Instant::now();
    for generation in 0.. {
        if total >= kills_wanted {
            break;
        }
        let first = kills.len();
        kills.extend((0..per_generation).map(|r| (format!("run-{generation}-{r}"), 0)));
        let mut done = vec![false; per_generation];
        while done.iter().any(|d| !d) {
            assert!(
                start.elapsed() < Duration::from_secs(240),
                "the torture did not finish"
            );
            let mut children = Vec::new();
            for r in (0..per_generation).filter(|&r| !done[r]) {
                let mut c = env.cmd(&["run", &f, "--run-id", &kills[first + r].0]);
                c.stderr(Stdio::null()).process_group(0);
                children.push((r, c.spawn()?));
            }
            std::thread::sleep(Duration::from_millis(fastrand_ms()));
            for (r, child) in &mut children {
                if child.try_wait()?.is_none() {
                    // The whole group: steadfast, supervisor and step.
                    let _ = nix_killpg(child.id());
                    kills[first + *r].1 += 1;
                    total += 1;
                }
            }
            for (r, mut child) in children {
                match child.wait()?.code() {
                    Some(0) => done[r] = true,
                    Some(3) | None => {}
                    other => panic!("{} exited with {other:?}", kills[first + r].0),
                }
            }
        }
    }
    let log = env.log();
    for (run_id, killed) in &kills {
        let seq: Vec<usize> = log
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{run_id} ")))
            .map(|s| s.trim().parse().unwrap())
            .collect();
        assert_eq!(seq.first(), Some(&0), "{run_id}: {seq:?}");
        assert_eq!(seq.last(), Some(&(steps - 1)), "{run_id}: {seq:?}");
        assert!(
            seq.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1),
            "{run_id} out of order: {seq:?}"
        );
        let reruns = seq.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(
            reruns <= *killed,
            "{run_id}: {reruns} re-executions after {killed} kills: {seq:?}"
        );
        assert_eq!(env.show(run_id)["status"], "completed");
    }
    assert!(total >= kills_wanted, "only {total} kills landed");
    Ok(())
}

fn fastrand_ms() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    20 + (t.subsec_nanos() as u64 % 500)
}

fn nix_killpg(pid: u32) -> std::io::Result<()> {
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill failed"))
    }
}

#[test]
fn the_example_agent_stops_at_its_gate_and_finishes_after_approval() -> TestResult {
    let env = Env::new();
    let flow = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent/flow.toml");
    let f = flow.to_str().unwrap();
    let id = format!("example-test-{}", std::process::id());
    let out = env.run(&["run", f, "--run-id", &id]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(env.show(&id)["state"]["fact_count"], 5);
    let approve = env.run(&[
        "approve",
        &id,
        "review",
        "--data",
        "{\"note\": \"ship it\"}",
    ]);
    assert_eq!(code(&approve), 0, "{}", stderr(&approve));
    let out = env.run(&["run", f, "--run-id", &id, "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let state: Value = serde_json::from_slice(&out.stdout)?;
    let report = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(state["report"].as_str().unwrap_or(""));
    let text = std::fs::read_to_string(&report)?;
    std::fs::remove_file(&report)?;
    assert!(
        text.contains("# Findings (5 facts)") && text.contains("ship it"),
        "{text}"
    );
    Ok(())
}

#[test]
fn a_closed_output_pipe_ends_the_command_quietly() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "big.toml",
        "name = \"big\"\n[[step]]\nname = \"big\"\nrun = '''printf '{\"big\":\"'; head -c 300000 /dev/zero | tr '\\0' x; printf '\"}'\n'''\n",
    );
    assert_eq!(
        code(&env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"])),
        0
    );
    let mut child = env
        .cmd(&["show", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let out = child.wait_with_output()?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    Ok(())
}

#[test]
fn a_stopped_holder_is_fenced_out_after_its_lease_expires() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "fence.toml",
        "name = \"fence\"\n[[step]]\nname = \"work\"\nrun = \"echo \\\"$PPID\\\" >> log; sleep 1\"\n[[step]]\nname = \"after\"\nrun = \"echo after >> log\"\n",
    );
    let f = flow.to_str().unwrap();
    let a = env
        .cmd(&["run", f, "--run-id", "r", "--lease", "1s"])
        .stderr(Stdio::piped())
        .spawn()?;
    let a_pid = a.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.log().is_empty() {
        assert!(Instant::now() < deadline, "A never started its step");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A stopped process keeps its lease until the lease runs out.
    Command::new("kill").args(["-STOP", &a_pid]).status()?;
    let early = env.run(&["run", f, "--run-id", "r", "--lease", "1s"]);
    assert_eq!(
        code(&early),
        3,
        "B got in while A's lease was live: {}",
        stderr(&early)
    );
    std::thread::sleep(Duration::from_millis(1300));
    let b = env.run(&["run", f, "--run-id", "r", "--lease", "1s"]);
    assert_eq!(code(&b), 0, "B takes over an expired lease: {}", stderr(&b));
    Command::new("kill").args(["-CONT", &a_pid]).status()?;
    let a = a.wait_with_output()?;
    assert_eq!(
        code(&a),
        3,
        "A must lose at its next save or renewal: {}",
        stderr(&a)
    );
    let after = env.log().iter().filter(|l| l.as_str() == "after").count();
    assert_eq!(
        after,
        1,
        "only B went on past the fenced step: {:?}",
        env.log()
    );
    assert_eq!(env.show("r")["status"], "completed");
    Ok(())
}

#[test]
fn version_and_help_print_and_exit_0() -> TestResult {
    let out = Command::new(BIN).arg("--version").output()?;
    assert_eq!(code(&out), 0);
    let text = String::from_utf8(out.stdout)?;
    assert!(
        text.starts_with("steadfast ") && text.trim().len() > "steadfast ".len(),
        "{text}"
    );
    let out = Command::new(BIN).args(["approve", "--help"]).output()?;
    assert_eq!(code(&out), 0);
    assert!(String::from_utf8(out.stdout)?.contains("--data"));
    Ok(())
}
