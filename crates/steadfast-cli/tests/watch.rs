//! Events written by flow steps on file descriptor 3, and `steadfast watch`:
//! watchers attached before, during and after a run see the same events; a
//! run killed while it emits keeps a log without gaps or repeats, the
//! crashed executions' events marked as superseded.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{code, stderr, Env, TestResult, BIN};

/// A step that emits `n` events `{"i": 0}`… on fd 3, pausing `pause`
/// seconds every `every` events, then prints its update.
fn emitter(n: u32, every: u32, pause: f64) -> String {
    format!(
        r#"python3 -c 'import os, time
for i in range({n}):
    os.write(3, (chr(123) + "\"i\": %d" % i + chr(125) + "\n").encode())
    if i % {every} == {every} - 1:
        time.sleep({pause})
print("{{\"emitted\": {n}}}")'"#
    )
}

fn spawn_watch(env: &Env, id: &str) -> Child {
    env.cmd(&["watch", id, "--json", "--poll", "5ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start watch")
}

/// The JSON items a finished watch printed, and its exit code.
fn items_of(child: Child) -> (Vec<Value>, i32) {
    let out = child.wait_with_output().expect("watch ends");
    let items = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    (items, code(&out))
}

fn events(items: &[Value]) -> Vec<(u64, Value)> {
    items
        .iter()
        .filter(|i| i["kind"] == "event")
        .map(|i| (i["seq"].as_u64().expect("a number"), i["value"].clone()))
        .collect()
}

#[test]
fn watchers_before_during_and_after_a_run_see_the_same_events() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        &format!(
            "name = \"talker\"\n\n[[step]]\nname = \"talk\"\nrun = '''{}'''\n\n[[step]]\nname = \"check\"\ngate = true\n",
            emitter(300, 20, 0.02)
        ),
    );
    // Before: the store exists (another run made it), the run does not.
    let other = env.flow(
        "other.toml",
        "name = \"other\"\n\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    assert_eq!(
        code(&env.run(&["run", other.to_str().unwrap(), "--run-id", "other"])),
        0
    );
    let before = spawn_watch(&env, "r");
    std::thread::sleep(Duration::from_millis(300));
    let run = env
        .cmd(&["run", flow.to_str().unwrap(), "--run-id", "r"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the run");
    // During: while the step emits (it takes about 0.3 s after it starts).
    std::thread::sleep(Duration::from_millis(200));
    let during = spawn_watch(&env, "r");
    let ran = run.wait_with_output().expect("the run ends");
    assert_eq!(code(&ran), 4, "the run stops at the gate: {}", stderr(&ran));
    let after = spawn_watch(&env, "r");
    let expected: Vec<(u64, Value)> = (0..300).map(|i| (i as u64 + 1, json!({"i": i}))).collect();
    for (name, watcher) in [("before", before), ("during", during), ("after", after)] {
        let (items, exit) = items_of(watcher);
        assert_eq!(exit, 4, "{name}: a watch of a run at a gate exits 4");
        assert_eq!(events(&items), expected, "{name}: the events");
        let kinds: Vec<&str> = items
            .iter()
            .map(|i| i["kind"].as_str().unwrap())
            .filter(|k| *k != "event")
            .collect();
        assert_eq!(
            kinds,
            ["started", "done", "waiting"],
            "{name}: what the watch said besides the events"
        );
    }
    // From a number on: only what follows it.
    let out = env.run(&["watch", "r", "--json", "--from", "295"]);
    let items: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events(&items), expected[295..].to_vec());
    Ok(())
}

#[test]
fn a_run_killed_while_it_emits_keeps_a_log_without_gaps_or_repeats() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        &format!(
            "name = \"stream\"\n\n[[step]]\nname = \"emit\"\nrun = '''{}'''\n",
            emitter(10_000, 250, 0.03)
        ),
    );
    let flow = flow.to_str().unwrap().to_string();
    let mut kills = 0;
    for _ in 0..3 {
        let mut run = env
            .cmd(&["run", &flow, "--run-id", "r"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Killed mid-stream: after a few batches have landed.
        std::thread::sleep(Duration::from_millis(450));
        if run.try_wait()?.is_none() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(run.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            )?;
            kills += 1;
        }
        run.wait()?;
    }
    assert_eq!(kills, 3, "every run was killed while it emitted");
    let done = env.run(&["run", &flow, "--run-id", "r"]);
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    let out = Command::new(BIN)
        .current_dir(env.path())
        .args(["--store", &env.store(), "watch", "r", "--json"])
        .output()?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let items: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let all = events(&items);
    // Numbered 1, 2, 3… with no gap and none twice.
    let seqs: Vec<u64> = all.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=all.len() as u64).collect::<Vec<_>>());
    // Each execution emitted 0, 1, 2… in order; the last one all 10,000.
    let mut executions: Vec<Vec<u64>> = Vec::new();
    for item in &items {
        match item["kind"].as_str() {
            Some("started") => executions.push(Vec::new()),
            Some("event") => executions
                .last_mut()
                .expect("an execution began")
                .push(item["value"]["i"].as_u64().unwrap()),
            _ => {}
        }
    }
    for (n, e) in executions.iter().enumerate() {
        assert_eq!(
            *e,
            (0..e.len() as u64).collect::<Vec<_>>(),
            "execution {n} emitted out of order"
        );
    }
    let last = executions.last().expect("executions");
    assert_eq!(
        last.len(),
        10_000,
        "the execution that finished emitted everything"
    );
    // Every execution before the last is marked superseded, and the crashed
    // ones left some events (a batch lands every 100 ms).
    let superseded = items.iter().filter(|i| i["kind"] == "superseded").count();
    assert_eq!(superseded, executions.len() - 1);
    assert!(
        executions.len() >= 2,
        "no crashed execution left events: {executions:?}"
    );
    assert_eq!(
        items.last().map(|i| i["kind"].clone()),
        Some(json!("completed"))
    );
    Ok(())
}
