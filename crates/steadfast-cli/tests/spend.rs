//! Spend and budgets from the command line: flow steps report spend in
//! their output, a run killed mid-step is charged once per completed step,
//! and a run over its budget stops at the `budget` gate until approved.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{code, stderr, Env, TestResult};

/// A step that reports `usd` spend of 1 and records that it ran.
fn spender(name: &str) -> String {
    format!(
        "[[step]]\nname = \"{name}\"\nrun = \"echo {name} >> log; echo '{{\\\"{name}\\\": true, \\\"__spend\\\": {{\\\"usd\\\": 1, \\\"tokens\\\": 100}}}}'\"\n"
    )
}

#[test]
fn a_run_killed_mid_step_is_charged_once_per_completed_step() -> TestResult {
    let env = Env::new();
    // The third step hangs the first time (after saying it started), and
    // reports its spend only when it ends.
    let text = format!(
        "name = \"spender\"\n{}{}[[step]]\nname = \"slow\"\nrun = \"echo slow >> log; if [ ! -e started ]; then touch started; sleep 60; fi; echo '{{\\\"__spend\\\": {{\\\"usd\\\": 1}}}}'\"\n{}",
        spender("one"),
        spender("two"),
        spender("four")
    );
    let flow = env.flow("spender.toml", &text);
    let f = flow.to_str().unwrap();
    let mut child = env
        .cmd(&["run", f, "--run-id", "r"])
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env.path().join("started").exists() {
        assert!(Instant::now() < deadline, "the slow step never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    child.kill()?; // SIGKILL, mid-step
    child.wait()?;
    let shown = env.show("r");
    assert_eq!(shown["next"], 2);
    assert_eq!(
        shown["spend"]["spent"],
        json!({"usd": 2.0, "tokens": 200.0})
    );

    let out = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.log(), ["one", "two", "slow", "slow", "four"]);
    let shown = env.show("r");
    assert_eq!(
        shown["spend"]["spent"],
        json!({"usd": 4.0, "tokens": 300.0}),
        "once per completed step"
    );
    // Run again: completed, nothing runs and nothing is charged.
    let out = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("r")["spend"], shown["spend"]);
    // Each step's record keeps its own spend.
    let history = env.run(&["history", "r", "--json"]);
    let history: Value = serde_json::from_slice(&history.stdout)?;
    assert_eq!(
        history[2]["update"]["__spend"]["spent"],
        json!({"usd": 1.0})
    );
    // `runs --json` and `show` report it.
    let runs = env.run(&["runs", "--json"]);
    let runs: Value = serde_json::from_slice(&runs.stdout)?;
    assert_eq!(runs[0]["spend"]["spent"]["usd"], 4.0);
    let text = env.run(&["show", "r"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("spent     tokens 300, usd 4"), "{text}");
    Ok(())
}

#[test]
fn a_run_over_its_budget_waits_at_the_budget_gate_until_approved() -> TestResult {
    let env = Env::new();
    let text = format!(
        "name = \"spender\"\n{}{}{}{}",
        spender("one"),
        spender("two"),
        spender("three"),
        spender("four")
    );
    let flow = env.flow("spender.toml", &text);
    let f = flow.to_str().unwrap();
    let out = env.run(&["run", f, "--run-id", "r", "--budget", "usd=1.5"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("budget"), "{}", stderr(&out));
    assert_eq!(env.log(), ["one", "two"], "stopped before the third step");
    let shown = env.show("r");
    assert_eq!(shown["status"], "waiting");
    assert_eq!(shown["wait"]["step"], "budget");
    let text = env.run(&["show", "r"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("usd 2 of 1.5 OVER"), "{text}");

    // Data that is not amounts: refused, nothing written.
    let bad = env.run(&["approve", "r", "budget", "--data", "{\"usd\": \"lots\"}"]);
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("usd"), "{}", stderr(&bad));
    assert_eq!(env.show("r")["version"], shown["version"]);

    let ok = env.run(&["approve", "r", "budget", "--data", "{\"usd\": 10}"]);
    assert_eq!(code(&ok), 0, "{}", stderr(&ok));
    let out = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.log(), ["one", "two", "three", "four"]);
    let shown = env.show("r");
    assert_eq!(shown["spend"]["spent"]["usd"], 4.0);
    assert_eq!(shown["spend"]["budget"]["usd"], 11.5);

    // A flow's own budget, and a rejection.
    let text = format!(
        "name = \"capped\"\n[budget]\nusd = 0.5\n{}{}",
        spender("a"),
        spender("b")
    );
    let capped = env.flow("capped.toml", &text);
    let c = capped.to_str().unwrap();
    let out = env.run(&["run", c, "--run-id", "c"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let out = env.run(&["reject", "c", "budget", "--reason", "too dear"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["run", c, "--run-id", "c"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert_eq!(env.show("c")["next"], 1);
    Ok(())
}

#[test]
fn bad_budgets_and_bad_spend_are_clear_errors() -> TestResult {
    let env = Env::new();
    let flow = env.flow("one.toml", &format!("name = \"one\"\n{}", spender("one")));
    let f = flow.to_str().unwrap();
    let long_name = format!("{}=1", "n".repeat(65));
    for bad in [
        "usd",
        "usd=-1",
        "usd=NaN",
        "usd=1e309",
        "usd=1,usd=2",
        "a b=1",
        "",
        "=",
        ",",
        &long_name,
    ] {
        let out = env.run(&["run", f, "--run-id", "r", "--budget", bad]);
        assert_eq!(code(&out), 2, "{bad:?}: {}", stderr(&out));
    }
    let flow = env.flow(
        "bad.toml",
        &format!("name = \"bad\"\n\n[budget]\nusd = -1\n{}", spender("one")),
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.toml:3"), "{}", stderr(&out));
    // A step whose `__spend` is not amounts fails, naming it.
    let flow = env.flow(
        "garbage.toml",
        "name = \"garbage\"\n[[step]]\nname = \"g\"\nrun = \"echo '{\\\"__spend\\\": {\\\"usd\\\": \\\"x\\\"}}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "g"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("__spend"), "{}", stderr(&out));
    assert_eq!(env.show("g")["spend"], Value::Null);
    Ok(())
}
