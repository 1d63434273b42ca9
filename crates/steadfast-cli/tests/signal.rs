//! `steadfast signal` and flow files' `wait` steps: a signal sent before,
//! during and after a wait, and twice, is taken once per wait; a worker
//! takes a run up again as soon as what it waits for is sent.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

const FLOW: &str = r#"name = "asker"

[[step]]
name = "work"
run = "sleep 1; echo '{}'"

[[step]]
name = "first"
wait = "go"

[[step]]
name = "second"
wait = "go"
timeout = "1h"

[[step]]
name = "use"
run = "echo '{\"used\": true}'"
"#;

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
fn each_wait_takes_one_signal_sent_before_during_or_after_it() -> TestResult {
    let env = Env::new();
    let flow = env.flow("flow.toml", FLOW);
    let flow = flow.to_str().unwrap();
    let run = env
        .cmd(&["run", flow, "--run-id", "r"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // Before the first wait, while `work` runs.
    wait_for("the run", || code(&env.run(&["show", "r"])) == 0);
    let sent = env.run(&["signal", "r", "go", "--data", "1", "--by", "ada", "--json"]);
    assert_eq!(code(&sent), 0, "{}", stderr(&sent));
    let sent: Value = serde_json::from_slice(&sent.stdout)?;
    assert_eq!(sent["signal"], "go");
    // The first wait took it; the second found none and the run stopped.
    let out = run.wait_with_output()?;
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = env.run(&["show", "r"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("waiting   at second for signal \"go\"")
            || text.contains("at second for signal go"),
        "{text}"
    );
    // Twice while it waits, then the run goes on: the second wait takes the
    // older, the newer stays unread.
    for (data, by) in [("2", "bob"), ("3", "cy")] {
        let sent = env.run(&["signal", "r", "go", "--data", data, "--by", by]);
        assert_eq!(code(&sent), 0, "{}", stderr(&sent));
    }
    let again = env.run(&["run", flow, "--run-id", "r"]);
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    let state = &env.show("r")["state"];
    assert_eq!(
        (&state["first"]["data"], &state["first"]["by"]),
        (&Value::from(1), &Value::from("ada"))
    );
    assert_eq!(
        (&state["second"]["data"], &state["second"]["by"]),
        (&Value::from(2), &Value::from("bob"))
    );
    assert_eq!(state["used"], true);
    // The deliveries are in the history, with their senders.
    let hist = env.run(&["history", "r", "--json"]);
    assert_eq!(code(&hist), 0, "{}", stderr(&hist));
    let hist = String::from_utf8_lossy(&hist.stdout).to_string();
    assert!(
        hist.contains("\"ada\"") && hist.contains("\"bob\""),
        "{hist}"
    );
    assert!(
        !hist.contains("\"cy\""),
        "the third signal was taken: {hist}"
    );
    // A watch shows the three signals.
    let watch = env.run(&["watch", "r", "--json"]);
    let signals = String::from_utf8_lossy(&watch.stdout)
        .lines()
        .filter(|l| l.contains("\"kind\":\"signal\""))
        .count();
    assert_eq!(signals, 3);
    // An ended run, a run there is not, bad data: refused, nothing sent.
    for (args, says) in [
        (vec!["signal", "r", "go"], "has ended"),
        (vec!["signal", "nope", "go"], "no run"),
        (vec!["signal", "r", "go", "--data", "{bad"], "--data"),
        (vec!["signal", "r", "", "--data", "1"], "name"),
    ] {
        let out = env.run(&args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    Ok(())
}

#[test]
fn a_flow_wait_is_checked_when_the_file_is_read() {
    let env = Env::new();
    for (text, says) in [
        ("[[step]]\nname = \"w\"\nwait = \"\"\n", "signal's name"),
        (
            "[[step]]\nname = \"w\"\nwait = \"go\"\ngate = true\n",
            "more than one",
        ),
        (
            "[[step]]\nname = \"w\"\nwait = \"go\"\non_timeout = \"approve\"\n",
            "on_timeout",
        ),
        (
            "[[step]]\nname = \"w\"\nwait = \"go\"\ntimeout = \"forever\"\n",
            "not a duration",
        ),
    ] {
        let flow = env.flow("bad.toml", &format!("name = \"bad\"\n\n{text}"));
        let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "b"]);
        assert_eq!(code(&out), 2, "{text}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{text}: {}", stderr(&out));
    }
}

/// A worker takes a run that waits for a signal up again as soon as it is
/// sent; the wait holds no process meanwhile.
#[test]
fn a_worker_goes_on_when_the_signal_comes() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        "name = \"asker\"\n\n[[step]]\nname = \"answer\"\nwait = \"reply\"\n\n[[step]]\nname = \"after\"\nrun = \"echo '{\\\"after\\\": 1}'\"\n",
    );
    let flow = flow.to_str().unwrap();
    let started = env.run(&["start", flow, "--run-id", "w1"]);
    assert_eq!(code(&started), 0, "{}", stderr(&started));
    let mut worker = env
        .cmd(&["worker", flow, "--poll", "50ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_for("the wait", || env.show("w1")["status"] == "waiting");
    let sent = env.run(&["signal", "w1", "reply", "--data", "{\"ok\": true}"]);
    assert_eq!(code(&sent), 0, "{}", stderr(&sent));
    wait_for("the worker's run", || {
        env.show("w1")["status"] == "completed"
    });
    let _ = worker.kill();
    let _ = worker.wait();
    let state = &env.show("w1")["state"];
    assert_eq!(state["answer"]["data"]["ok"], true);
    assert_eq!(state["after"], 1);
    Ok(())
}

/// Hostile values for every input `signal` and `wait` take: each is a clear
/// usage error, and nothing is sent.
#[test]
fn hostile_signals_are_refused_and_send_nothing() -> TestResult {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        "name = \"asker\"\n\n[[step]]\nname = \"answer\"\nwait = \"go\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let long = "n".repeat(201);
    let mut deep = String::new();
    for _ in 0..300 {
        deep.push('[');
    }
    for _ in 0..300 {
        deep.push(']');
    }
    let huge = format!("\"{}\"", "x".repeat(70_000));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["signal", "r", &long], "name"),
        (vec!["signal", "r", "a\u{7}b"], "name"),
        (vec!["signal", "r", "go", "--by", ""], "sends"),
        (vec!["signal", "r", "go", "--by", &long], "sends"),
        (vec!["signal", "r", "go", "--data", ""], "--data"),
        (vec!["signal", "r", "go", "--data", "1e999"], "--data"),
        (vec!["signal", "r", "go", "--data", &deep], "data"),
        (vec!["signal", "r", "go", "--data", &huge], "bytes"),
        (vec!["signal", "a\nb", "go"], "run id"),
        (vec!["signal", "", "go"], "run id"),
        (vec!["watch", "r", "--from", "18446744073709551616"], "from"),
        (vec!["watch", "r", "--from", "-1"], ""),
    ];
    for (args, says) in cases {
        let out = env.run(&args);
        let shown: Vec<String> = args.iter().map(|a| a.chars().take(40).collect()).collect();
        assert_eq!(code(&out), 2, "{shown:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{shown:?}: {}", stderr(&out));
    }
    // A name that is not UTF-8.
    let out = env
        .cmd(&["signal", "r"])
        .arg(std::ffi::OsStr::from_bytes(b"g\xffo"))
        .output()?;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    // Nothing was sent: the run still waits, and a watch shows no signal.
    let watch = env.run(&["watch", "r", "--json"]);
    assert_eq!(code(&watch), 4, "{}", stderr(&watch));
    assert!(
        !String::from_utf8_lossy(&watch.stdout).contains("\"kind\":\"signal\""),
        "a refused signal was kept"
    );
    // Flow files: a timeout that is negative, or beyond a year.
    for (timeout, says) in [("-1s", "not a duration"), ("1000y", "timeout")] {
        let bad = env.flow(
            "bad.toml",
            &format!("name = \"bad\"\n\n[[step]]\nname = \"w\"\nwait = \"go\"\ntimeout = \"{timeout}\"\n"),
        );
        let out = env.run(&["run", bad.to_str().unwrap(), "--run-id", "b"]);
        assert_eq!(code(&out), 2, "{timeout}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{timeout}: {}", stderr(&out));
    }
    Ok(())
}

/// Signals sent by several processes at the same moment each get a number
/// of their own, and the waits take them in that order, each once.
#[test]
fn signals_sent_at_the_same_moment_are_each_taken_once() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        "name = \"asker\"\n\n[[step]]\nname = \"w1\"\nwait = \"go\"\n\n[[step]]\nname = \"w2\"\nwait = \"go\"\n\n[[step]]\nname = \"w3\"\nwait = \"go\"\n",
    );
    let flow = flow.to_str().unwrap();
    assert_eq!(code(&env.run(&["run", flow, "--run-id", "r"])), 4);
    let senders: Vec<_> = (1..=6)
        .map(|i| {
            env.cmd(&["signal", "r", "go", "--data", &i.to_string(), "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a sender")
        })
        .collect();
    let mut sent: Vec<(u64, u64)> = Vec::new();
    for (i, s) in senders.into_iter().enumerate() {
        let out = s.wait_with_output()?;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout)?;
        sent.push((v["seq"].as_u64().expect("seq"), i as u64 + 1));
    }
    sent.sort();
    let seqs: Vec<u64> = sent.iter().map(|s| s.0).collect();
    assert_eq!(
        seqs,
        (1..=6).collect::<Vec<u64>>(),
        "numbers of the racing sends"
    );
    let out = env.run(&["run", flow, "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let state = &env.show("r")["state"];
    let taken: Vec<u64> = ["w1", "w2", "w3"]
        .iter()
        .map(|w| state[*w]["data"].as_u64().expect("data"))
        .collect();
    let first_three: Vec<u64> = sent.iter().take(3).map(|s| s.1).collect();
    assert_eq!(
        taken, first_three,
        "the waits took the oldest three, in order"
    );
    Ok(())
}

/// A run waiting for a signal, its events and the signal sent to it move to
/// another store with `export` and `import`: the same events there, and the
/// wait takes the signal once when the run is resumed there.
#[test]
fn a_waiting_runs_events_and_signal_move_with_export_and_import() -> TestResult {
    const EMITS: &str = r#"name = "mover"

[[step]]
name = "talk"
run = "for i in 1 2 3; do echo \"{\\\"i\\\": $i}\" >&3; done; echo '{}'"

[[step]]
name = "ask"
wait = "go"

[[step]]
name = "use"
run = "echo '{\"used\": true}'"
"#;
    let env = Env::new();
    let flow = env.flow("flow.toml", EMITS);
    let flow = flow.to_str().unwrap();
    let out = env.run(&["run", flow, "--run-id", "m"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let sent = env.run(&["signal", "m", "go", "--data", "{\"ok\": 1}", "--by", "ada"]);
    assert_eq!(code(&sent), 0, "{}", stderr(&sent));
    let events = |e: &Env| -> Vec<Value> {
        let out = e.run(&["watch", "m", "--json"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["kind"] == "event" || v["kind"] == "signal")
            .collect()
    };
    let before = events(&env);
    assert_eq!(before.len(), 4, "{before:?}");
    let export = env.run(&["export"]);
    assert_eq!(code(&export), 0, "{}", stderr(&export));
    let text = String::from_utf8(export.stdout)?;
    assert!(text.contains("\"format\":3"), "{text}");

    let other = Env::new();
    let file = other.path().join("runs.jsonl");
    std::fs::write(&file, &text)?;
    let out = other.run(&["import", file.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(events(&other), before);
    // Resumed there, the wait takes the signal sent before the export.
    let out = other.run(&["run", flow, "--run-id", "m"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let show: Value = serde_json::from_slice(&other.run(&["show", "m", "--json"]).stdout)?;
    assert_eq!(show["status"], "completed", "{show}");
    assert_eq!(show["state"]["used"], true, "{show}");
    let history = other.run(&["history", "m"]);
    let text = String::from_utf8_lossy(&history.stdout);
    assert!(
        text.contains("ada"),
        "the delivery names its sender: {text}"
    );
    Ok(())
}
