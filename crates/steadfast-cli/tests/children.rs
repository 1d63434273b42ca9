//! Flow files' `child` steps: `run` runs a flow's children and then the
//! flow on; `show` and `show --json` link parent and children; a worker
//! runs a flow's children; cancelling a parent cancels its children; bad
//! child steps are refused with the file, the line and what is wrong.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{code, stderr, Env, TestResult};

const PARENT: &str = r#"name = "writer"

[[step]]
name = "plan"
run = "echo '{\"topic\": \"tides\"}'"

[[step]]
name = "research"
child = "researcher.toml"

[[step]]
name = "write"
run = "echo '{\"written\": true}'"
"#;

const CHILD: &str = r#"name = "researcher"

[[step]]
name = "read"
run = "echo '{\"notes\": \"tides follow the moon\"}'"
"#;

const GATED_CHILD: &str = r#"name = "researcher"

[[step]]
name = "read"
run = "echo '{\"notes\": \"tides follow the moon\"}'"

[[step]]
name = "check"
gate = true
"#;

/// A child process killed and reaped when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn run_runs_a_flows_child_and_show_links_them() -> TestResult {
    let env = Env::new();
    let flow = env.flow("writer.toml", PARENT);
    env.flow("researcher.toml", CHILD);
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "w", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let state: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        state["research"],
        json!({"topic": "tides", "notes": "tides follow the moon"}),
        "the child got the parent's state and gave back its own"
    );
    assert_eq!(state["written"], json!(true));
    let shown = env.run(&["show", "w"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("child     research: w~research (done)"),
        "{text}"
    );
    let shown = env.run(&["show", "w~research"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("parent    w (step research)"), "{text}");
    assert!(text.contains("status    completed"), "{text}");
    let v = env.show("w");
    assert_eq!(
        v["children"],
        json!([{"step": "research", "run": "w~research", "recorded": true}])
    );
    let parent = env.show("w~research")["parent"].clone();
    assert_eq!(
        (&parent["run"], &parent["step"]),
        (&json!("w"), &json!("research"))
    );
    assert_eq!(parent["created"], env.show("w")["created_at"]);
    // Run again: nothing runs again.
    let again = env.run(&["run", flow.to_str().unwrap(), "--run-id", "w"]);
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    Ok(())
}

#[test]
fn a_parent_waits_for_a_child_at_a_gate_and_cancel_reaches_the_child() -> TestResult {
    let env = Env::new();
    let flow = env.flow("writer.toml", PARENT);
    env.flow("researcher.toml", GATED_CHILD);
    let flow = flow.to_str().unwrap();
    let out = env.run(&["run", flow, "--run-id", "w", "--json"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let said: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(said["status"], "waiting");
    assert_eq!(said["children"], json!(["w~research"]));
    assert!(stderr(&out).contains("child run(s)"), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&env.run(&["show", "w"]).stdout).to_string();
    assert!(
        text.contains("waiting   at research for 1 child run(s)"),
        "{text}"
    );
    assert!(
        text.contains("child     research: w~research (under way)"),
        "{text}"
    );
    let watched = env.run(&["watch", "w"]);
    assert_eq!(code(&watched), 4, "{}", stderr(&watched));
    let text = String::from_utf8_lossy(&watched.stdout).to_string();
    assert!(
        text.contains("waiting     at research for 1 child run(s)"),
        "{text}"
    );
    // Approve the child's gate, and `run` finishes both.
    let ok = env.run(&["approve", "w~research", "check", "--by", "ada"]);
    assert_eq!(code(&ok), 0, "{}", stderr(&ok));
    let out = env.run(&["run", flow, "--run-id", "w"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("w")["status"], "completed");

    // Another run, cancelled while its child waits: the child is cancelled.
    let out = env.run(&["run", flow, "--run-id", "v"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let cancelled = env.run(&["cancel", "v", "--by", "ada"]);
    assert_eq!(code(&cancelled), 0, "{}", stderr(&cancelled));
    assert_eq!(env.show("v~research")["status"], "cancelled");
    let audit = &env.show("v~research")["audit"][0];
    assert!(audit.to_string().contains("its parent run"), "{audit}");
    Ok(())
}

#[test]
fn a_worker_runs_a_flows_children() -> TestResult {
    let env = Env::new();
    let flow = env.flow("writer.toml", PARENT);
    env.flow("researcher.toml", CHILD);
    let flow = flow.to_str().unwrap();
    let started = env.run(&["start", flow, "--run-id", "s"]);
    assert_eq!(code(&started), 0, "{}", stderr(&started));
    let mut worker = Reaped(
        env.cmd(&["worker", flow, "--poll", "50ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    wait_for("the parent to complete", || {
        env.show("s")["status"] == "completed"
    });
    assert_eq!(env.show("s~research")["status"], "completed");
    worker.0.kill()?;
    Ok(())
}

#[test]
fn bad_child_steps_are_refused_with_where_and_what() -> TestResult {
    let env = Env::new();
    env.flow("researcher.toml", CHILD);
    let cases = [
        ("child = \"missing.toml\"", "child = \"missing.toml\": "),
        ("child = \"researcher.toml\"\ntimeout = \"1m\"", "timeout"),
        (
            "child = \"researcher.toml\"\nbackoff = \"1s\"",
            "backoff applies only to run steps",
        ),
        (
            "child = \"researcher.toml\"\nrun = \"true\"",
            "more than one of run, gate, sleep, wait and child",
        ),
        (
            "child = \"researcher.toml\"\nenv = { A = \"1\" }",
            "workdir and env apply only to run steps",
        ),
    ];
    for (step, says) in cases {
        let text = format!("name = \"bad\"\n\n[[step]]\nname = \"x\"\n{step}\n");
        let flow = env.flow("bad.toml", &text);
        let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "b"]);
        assert_eq!(code(&out), 2, "{step}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{step}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("bad.toml:"),
            "{step}: {}",
            stderr(&out)
        );
    }
    // A flow whose child has the parent's name.
    let same = env.flow(
        "same.toml",
        "name = \"researcher\"\n\n[[step]]\nname = \"x\"\nchild = \"researcher.toml\"\n",
    );
    let out = env.run(&["run", same.to_str().unwrap(), "--run-id", "b"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("names of their own"),
        "{}",
        stderr(&out)
    );
    // Flows that start each other are refused by run, start and worker,
    // naming the step that closes the cycle.
    let own = env.flow(
        "own.toml",
        "name = \"own\"\n\n[[step]]\nname = \"x\"\nchild = \"own.toml\"\n",
    );
    env.flow(
        "ping.toml",
        "name = \"ping\"\n\n[[step]]\nname = \"x\"\nchild = \"pong.toml\"\n",
    );
    env.flow(
        "pong.toml",
        "name = \"pong\"\n\n[[step]]\nname = \"y\"\nrun = \"echo {}\"\n\n[[step]]\nname = \"x\"\nchild = \"ping.toml\"\n",
    );
    let ping = env.path().join("ping.toml");
    for (cmd, flow) in [
        ("run", &own),
        ("start", &own),
        ("run", &ping),
        ("start", &ping),
    ] {
        let out = env.run(&[cmd, flow.to_str().unwrap(), "--run-id", "o"]);
        assert_eq!(code(&out), 2, "{cmd} {flow:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("leads back to this flow"),
            "{}",
            stderr(&out)
        );
    }
    let out = env.run(&["run", ping.to_str().unwrap(), "--run-id", "o"]);
    assert!(
        stderr(&out).contains("pong.toml:9:"),
        "the closing step's line: {}",
        stderr(&out)
    );
    let out = env.run(&["worker", own.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    // A child file that is not TOML is named with its line.
    env.flow("broken.toml", "name = \"broken\"\n[[step]\n");
    let bad = env.flow(
        "bad.toml",
        "name = \"bad\"\n\n[[step]]\nname = \"x\"\nchild = \"broken.toml\"\n",
    );
    let out = env.run(&["run", bad.to_str().unwrap(), "--run-id", "o"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("broken.toml:2:"), "{}", stderr(&out));
    // Retries beyond what a child may have are refused at their line.
    let many = env.flow(
        "many.toml",
        "name = \"many\"\n\n[[step]]\nname = \"x\"\nchild = \"researcher.toml\"\nretries = 40\n",
    );
    let out = env.run(&["run", many.to_str().unwrap(), "--run-id", "o"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("many.toml:6: retries = 40"),
        "{}",
        stderr(&out)
    );
    assert_ne!(
        code(&env.run(&["show", "b"])),
        0,
        "a refused flow stored a run"
    );
    Ok(())
}
