//! Versions side by side, with real processes: two `steadfast worker`
//! processes, one given version 1 of a flow and one version 2, run every
//! run under the version it was started with; a run whose version no
//! worker has waits with a stuck label until one has it; a flow without a
//! declared version is versioned by its text, so an edited file resumes
//! nothing until the run is migrated or the old file is given too.

mod support;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

/// Version `v` of flow "agent": two steps, named alike in every version,
/// each logging the run, the version and the step.
fn agent(v: &str) -> String {
    format!(
        r#"name = "agent"
version = "{v}"
[[step]]
name = "s0"
run = "echo \"$STEADFAST_RUN_ID v{v} s0\" >> log"
[[step]]
name = "s1"
run = "echo \"$STEADFAST_RUN_ID v{v} s1\" >> log"
"#
    )
}

/// A child process killed when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(env: &Env, flows: &[&str]) -> Reaped {
    let mut args = vec!["worker"];
    args.extend_from_slice(flows);
    args.extend_from_slice(&["--poll", "50ms", "--grace", "1s"]);
    Reaped(
        env.cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("a worker"),
    )
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn runs(env: &Env, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["runs", "--json"];
    all.extend_from_slice(args);
    let out = env.run(&all);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("JSON")
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn completed(env: &Env) -> usize {
    runs(env, &["--status", "completed"]).len()
}

#[test]
fn two_worker_processes_with_v1_and_v2_route_every_run_to_its_version() -> TestResult {
    let env = Env::new();
    let v1 = env.flow("v1.toml", &agent("1"));
    let v2 = env.flow("v2.toml", &agent("2"));
    let (v1, v2) = (v1.to_str().unwrap(), v2.to_str().unwrap());
    for i in 0..4 {
        for (prefix, flow) in [("a", v1), ("b", v2)] {
            let out = env.run(&["start", flow, "--run-id", &format!("{prefix}{i}")]);
            assert_eq!(code(&out), 0, "{}", stderr(&out));
        }
    }
    let old = worker(&env, &[v1]);
    let new = worker(&env, &[v2]);
    wait_for("eight runs to complete", || completed(&env) == 8);
    drop((old, new));
    let mut log = env.log();
    log.sort();
    let mut want = Vec::new();
    for i in 0..4 {
        for (prefix, v) in [("a", 1), ("b", 2)] {
            for s in 0..2 {
                want.push(format!("{prefix}{i} v{v} s{s}"));
            }
        }
    }
    want.sort();
    assert_eq!(log, want, "each step ran once, under its run's version");

    // `runs --version` lists the runs of a version, and only those.
    let ones: Vec<String> = runs(&env, &["--version", "1"])
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ones, ["a0", "a1", "a2", "a3"]);
    assert_eq!(runs(&env, &["--version", "2"]).len(), 4);
    assert!(runs(&env, &["--version", "3"]).is_empty());
    let out = env.run(&["runs", "--version", ""]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(runs(&env, &["--version", "1", "--limit", "2"]).len(), 2);
    let table = String::from_utf8(env.run(&["runs"]).stdout)?;
    assert!(table.contains("VERSION"), "{table}");

    // Version 1 retired with a run of it pending: the worker with version
    // 2 passes it over, runs nothing, and the run is labelled.
    let out = env.run(&["start", v1, "--run-id", "late"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let new = worker(&env, &[v2]);
    wait_for("the late run to be passed over", || {
        !env.show("late")["passed_over"].is_null()
    });
    let show = env.show("late");
    assert_eq!(show["status"], "pending", "{show}");
    assert_eq!(show["workflow_version"], "1", "{show}");
    assert_eq!(show["passed_over"]["available"], serde_json::json!(["2"]));
    let stuck = runs(&env, &["--stuck"]);
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["stuck"]["label"], "version-missing", "{stuck:?}");
    assert!(
        stuck[0]["stuck"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("version \"1\"")),
        "{stuck:?}"
    );
    drop(new);
    assert!(!env.log().iter().any(|l| l.starts_with("late")));

    // A worker given both versions takes it, under version 1.
    let both = worker(&env, &[v1, v2]);
    wait_for("the late run to complete", || completed(&env) == 9);
    drop(both);
    let late: Vec<String> = env
        .log()
        .into_iter()
        .filter(|l| l.starts_with("late"))
        .collect();
    assert_eq!(late, ["late v1 s0", "late v1 s1"]);
    assert!(env.show("late")["passed_over"].is_null());

    // Two files of one flow at one version are refused.
    let twin = env.flow("twin.toml", &agent("1").replace("s1\"", "s1 \""));
    let out = env.run(&["worker", v1, twin.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("need versions of their own"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

const UNDECLARED: &str = r#"name = "review"
[[step]]
name = "draft"
run = "echo draft >> log"
[[step]]
name = "approve"
gate = true
[[step]]
name = "publish"
run = "echo publish-1 >> log"
"#;

#[test]
fn an_edited_flow_without_a_version_resumes_nothing_until_migrated() -> TestResult {
    let env = Env::new();
    let old = env.flow("old.toml", UNDECLARED);
    let new = env.flow("new.toml", &UNDECLARED.replace("publish-1", "publish-2"));
    let (old, new) = (old.to_str().unwrap(), new.to_str().unwrap());
    let out = env.run(&["run", old, "--run-id", "r"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let recorded = env.show("r")["workflow_version"].clone();
    assert!(
        recorded.as_str().is_some_and(|v| v.starts_with("sha256:")),
        "{recorded}"
    );
    // The same file with \r\n line endings is the same version.
    let crlf = env.flow("crlf.toml", &UNDECLARED.replace('\n', "\r\n"));
    let out = env.run(&["plan", "r", "--flow", crlf.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["approve", "r", "approve"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // The edited file alone: the plan says the version differs (exit 7),
    // and a run refuses it, running nothing.
    let out = env.run(&["plan", "r", "--flow", new]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("version: started under"), "{text}");
    assert!(text.contains("migrate"), "{text}");
    let out = env.run(&["run", new, "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("version"), "{}", stderr(&out));
    assert_eq!(env.log(), ["draft"]);

    // Given both files, the run resumes under the one it started with.
    let out = env.run(&["run", old, new, "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.log(), ["draft", "publish-1"]);

    // A new run takes the last file given.
    let out = env.run(&["run", old, new, "--run-id", "s"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let newer = env.show("s")["workflow_version"].clone();
    assert_ne!(newer, recorded);
    let out = env.run(&["run", old, "--run-id", "s"]);
    assert_eq!(
        code(&out),
        2,
        "the old file alone is refused: {}",
        stderr(&out)
    );

    // A run of the old file, migrated on purpose, runs the new one.
    let out = env.run(&["run", old, "--run-id", "m"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let out = env.run(&["migrate", "m", "--flow", new]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("m")["workflow_version"], newer);
    let audit = env.show("m")["audit"].to_string();
    assert!(audit.contains("migrated to version"), "{audit}");
    let out = env.run(&["approve", "m", "approve"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["run", new, "--run-id", "m"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        env.log(),
        ["draft", "publish-1", "draft", "draft", "publish-2"]
    );

    // A declared version that is not one is refused where it is written.
    let bad = env.flow("bad.toml", &format!("version = \"\"\n{UNDECLARED}"));
    let out = env.run(&["run", bad.to_str().unwrap(), "--run-id", "t"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("bad.toml:1: version"),
        "{}",
        stderr(&out)
    );
    // Two flows of different names are not versions of one.
    let other = env.flow("other.toml", &UNDECLARED.replace("\"review\"", "\"other\""));
    let out = env.run(&["run", old, other.to_str().unwrap(), "--run-id", "t"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("give one flow"), "{}", stderr(&out));
    Ok(())
}
