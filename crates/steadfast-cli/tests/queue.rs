//! `steadfast start --priority N --partition KEY`: recorded with the run,
//! shown by `runs --json`, refused when out of range, and obeyed by a worker.

mod support;

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

#[test]
fn a_worker_takes_the_higher_priority_first_and_bad_places_are_refused() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "q.toml",
        "name = \"q\"\n[[step]]\nname = \"log\"\nrun = \"echo $STEADFAST_RUN_ID >> log\"\n",
    );
    let f = flow.to_str().unwrap();
    for i in 0..5 {
        let id = format!("low-{i}");
        let out = env.run(&["start", f, "--run-id", &id, "--partition", "acme"]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let out = env.run(&["start", f, "--run-id", "high", "--priority", "9"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["start", f, "--run-id", "sunk", "--priority", "-3"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Started again in another place: refused, left as it was.
    let out = env.run(&["start", f, "--run-id", "high", "--priority", "1"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("priority 9"), "{}", stderr(&out));
    for (args, says) in [
        (vec!["--priority", "1001"], "-1000 to 1000"),
        (vec!["--partition", "a b"], "use letters"),
        (vec!["--partition", ""], "1 to 64 bytes"),
    ] {
        let mut all = vec!["start", f, "--run-id", "bad"];
        all.extend(args);
        let out = env.run(&all);
        assert_eq!(code(&out), 2, "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{all:?}: {}", stderr(&out));
    }
    let out = env.run(&["runs", "--json"]);
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    assert_eq!(runs.len(), 7, "{runs:?}");
    let high = runs.iter().find(|r| r["run_id"] == "high").unwrap();
    assert_eq!(high["queue"]["priority"], 9);
    let low = runs.iter().find(|r| r["run_id"] == "low-0").unwrap();
    assert_eq!(low["queue"]["partition"], "acme");

    let mut worker = env
        .cmd(&["worker", f, "--concurrency", "1", "--poll", "50ms"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while env.log().len() < 7 {
        assert!(std::time::Instant::now() < deadline, "{:?}", env.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    worker.kill()?;
    worker.wait()?;
    let log = env.log();
    assert_eq!(log.first().map(String::as_str), Some("high"), "{log:?}");
    assert_eq!(log.last().map(String::as_str), Some("sunk"), "{log:?}");
    Ok(())
}
