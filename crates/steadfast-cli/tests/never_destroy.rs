//! Operations that replace or remove a run never destroy one by accident:
//! a copy that cannot be written leaves the run there as it was; delete,
//! import and copy refuse a run a live process holds unless forced, and the
//! holder says what happened to it; a run is bound to the flow and input it
//! was started with; workers that merely lose the race to claim a run say
//! nothing about it.

mod support;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{code, stderr, Env, TestResult, BIN};

/// A flow with a gate, named `agent`.
const GATED: &str = r#"name = "agent"
[[step]]
name = "a"
run = "echo '{\"a\": 1}'"
[[step]]
name = "review"
gate = true
[[step]]
name = "b"
run = "echo '{\"b\": 2}'"
"#;

fn steadfast(store: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("run steadfast")
}

fn export_of(store: &str, id: &str) -> String {
    let out = steadfast(store, &["export", "--run", id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The issue's own case: a run waiting at a gate in a file store, and a
/// copy from SQLite of a run with the same id whose 18 MB state is over the
/// file store's 16 MiB limit (its values kept inline there: a threshold of
/// 1 GiB). The copy fails, says nothing was written, and the waiting run is
/// there as it was, and still completes.
#[test]
fn a_copy_that_cannot_be_written_leaves_the_waiting_run_as_it_was() -> TestResult {
    let env = Env::new();
    let file = format!(
        "file:{}?blob_threshold=1GiB",
        env.path().join("runs.json").display()
    );
    let sqlite = format!("sqlite:{}", env.path().join("big.db").display());
    let gated = env.flow("gated.toml", GATED);
    let gated = gated.to_str().ok_or("path")?;
    let out = steadfast(&file, &["run", gated, "--run-id", "dup"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    // Two steps of 9 MB each (a step prints at most 16 MiB).
    let big = env.flow(
        "big.toml",
        &["a", "b"].iter().fold(String::from("name = \"agent\"\n"), |mut f, k| {
            f.push_str(&format!(
                "[[step]]\nname = \"{k}\"\nrun = \"python3 -c 'import json; print(json.dumps({{\\\"{k}\\\": \\\"x\\\" * 9000000}}))'\"\n"
            ));
            f
        }),
    );
    let out = steadfast(
        &sqlite,
        &["run", big.to_str().ok_or("path")?, "--run-id", "dup"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let before = export_of(&file, "dup");

    let out = steadfast("memory:", &["copy", "--from", &sqlite, "--to", &file]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("over the store's limit") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(export_of(&file, "dup"), before, "the waiting run changed");
    let out = steadfast(&file, &["approve", "dup", "review"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = steadfast(&file, &["run", gated, "--run-id", "dup"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    Ok(())
}

/// A store path that goes into a missing directory and back out makes no
/// directory.
#[test]
fn a_copy_into_a_path_through_a_missing_directory_creates_none() -> TestResult {
    let env = Env::new();
    let gated = env.flow("gated.toml", GATED);
    let from = env.store();
    let out = steadfast(
        &from,
        &["run", gated.to_str().ok_or("path")?, "--run-id", "r"],
    );
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let to = format!("sqlite:{}/./sub/../runs2.db", env.path().display());
    let out = steadfast("memory:", &["copy", "--from", &from, "--to", &to]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("back out with `..`"),
        "{}",
        stderr(&out)
    );
    assert!(
        !env.path().join("sub").exists(),
        "the directory sub was made"
    );
    Ok(())
}

/// `steadfast run` of a flow whose one step takes a while, in the
/// background: it holds the run under its lease meanwhile.
fn holder(env: &Env, flow: &str, id: &str) -> Child {
    let child = env
        .cmd(&["run", flow, "--run-id", id])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn steadfast run");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = env.run(&["show", id, "--json"]);
        if code(&out) == 0 {
            let shown: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("show --json prints JSON");
            if !shown["lease"].is_null() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the holder never took the run");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().expect("wait for the holder");
    (code(&out), stderr(&out))
}

/// `delete`, `import` and `copy` refuse a run that a live process holds
/// (exit 3) and leave it as it was; with `--force` they go ahead, and the
/// holder stops at its next save saying exactly what happened to its run,
/// not a version conflict.
#[test]
fn a_held_run_is_refused_unless_forced_and_the_holder_says_what_happened() -> TestResult {
    let env = Env::new();
    let slow = env.flow(
        "slow.toml",
        "name = \"agent\"\n[[step]]\nname = \"a\"\nrun = \"sleep 5; echo '{\\\"a\\\": 1}'\"\n[[step]]\nname = \"b\"\nrun = \"echo '{\\\"b\\\": 2}'\"\n",
    );
    let slow = slow.to_str().ok_or("path")?;
    let store = env.store();

    // delete
    let child = holder(&env, slow, "d");
    let before = export_of(&store, "d");
    let out = env.run(&["delete", "d"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("is held by"), "{}", stderr(&out));
    assert_eq!(
        export_of(&store, "d"),
        before,
        "a refused delete changed it"
    );
    // Ids no run can have are refused, forced or not, before anything.
    let long = "x".repeat(300);
    for bad in ["", long.as_str(), "bad\nid"] {
        for args in [vec!["delete", bad], vec!["delete", bad, "--force"]] {
            let out = env.run(&args);
            assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains("invalid run id"), "{}", stderr(&out));
        }
    }
    let out = env.run(&["delete", "d", "--force"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (status, err) = finish(child);
    assert_eq!(status, 3, "{err}");
    assert!(
        err.contains("was deleted while this call held it") && !err.contains("conflict on run"),
        "{err}"
    );
    let out = env.run(&["show", "d"]);
    assert_eq!(
        code(&out),
        2,
        "the holder wrote the run back: {}",
        stderr(&out)
    );

    // import and copy: a newer record of the same run from another store.
    let other = Env::new();
    let quick = other.flow(
        "quick.toml",
        "name = \"agent\"\n[[step]]\nname = \"a\"\nrun = \"echo '{\\\"a\\\": 0}'\"\n[[step]]\nname = \"b\"\nrun = \"echo '{\\\"b\\\": 0}'\"\n",
    );
    let out = other.run(&["run", quick.to_str().ok_or("path")?, "--run-id", "i"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let line = export_of(&other.store(), "i");
    let file = env.path().join("newer.jsonl");
    std::fs::write(&file, &line)?;
    let file = file.to_str().ok_or("path")?;

    let child = holder(&env, slow, "i");
    let before = export_of(&store, "i");
    let out = env.run(&["import", file]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let out = steadfast(
        "memory:",
        &["copy", "--from", &other.store(), "--to", &store],
    );
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(
        export_of(&store, "i"),
        before,
        "a refused import changed it"
    );
    let out = env.run(&["import", file, "--force"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("1 replaced"), "{}", stderr(&out));
    let (status, err) = finish(child);
    assert_eq!(status, 3, "{err}");
    assert!(
        err.contains("was replaced") && err.contains("while this call held it"),
        "{err}"
    );
    assert_eq!(
        export_of(&store, "i"),
        line,
        "the holder wrote over the imported run"
    );
    Ok(())
}

/// A run records the flow and input it was started with: `start` again
/// with the same ones is a no-op (exit 0), with another flow (name or
/// steps) or input it is refused (exit 2), and `run` or a worker given a
/// flow of the same name with other steps refuses the run as changed code
/// instead of running its own steps.
#[test]
fn a_run_is_bound_to_the_flow_and_input_it_was_started_with() -> TestResult {
    let env = Env::new();
    let five = env.flow(
        "five.toml",
        &(0..5).fold(String::from("name = \"agent\"\n"), |mut s, i| {
            s.push_str(&format!(
                "[[step]]\nname = \"s{i}\"\nrun = \"echo '{{\\\"s{i}\\\": {i}}}'\"\n"
            ));
            s
        }),
    );
    let five = five.to_str().ok_or("path")?;
    let other = env.flow(
        "other.toml",
        "name = \"agent\"\n[[step]]\nname = \"drop\"\nrun = \"touch dropped; echo '{}'\"\n",
    );
    let other = other.to_str().ok_or("path")?;
    let renamed = env.flow(
        "renamed.toml",
        &GATED.replace("\"agent\"", "\"other-agent\""),
    );
    let renamed = renamed.to_str().ok_or("path")?;

    let out = env.run(&["start", five, "--run-id", "dup", "--input", "{\"q\": 1}"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["start", five, "--run-id", "dup", "--input", "{\"q\": 1}"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    for (flow, input, says) in [
        (other, "{\"q\": 1}", "other steps"),
        (renamed, "{\"q\": 1}", "workflow \"agent\""),
        (five, "{\"q\": 2}", "another input"),
        (five, "{}", "another input"),
    ] {
        let out = env.run(&["start", flow, "--run-id", "dup", "--input", input]);
        assert_eq!(code(&out), 2, "{flow} {input}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{says}: {}", stderr(&out));
    }
    assert_eq!(env.show("dup")["status"], "pending");

    let out = env.run(&["run", other, "--run-id", "dup"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recorded by a different workflow"),
        "{}",
        stderr(&out)
    );
    // A worker with the other flow (another version of "agent") runs
    // nothing of it: it passes the run over.
    let worker = env
        .cmd(&["worker", other, "--poll", "20ms", "--grace", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let (_, err) = finish(worker);
    assert!(err.contains("dup  passed over"), "{err}");
    assert!(
        !env.path().join("dropped").exists(),
        "the other flow's step ran"
    );
    assert_eq!(env.show("dup")["status"], "pending");
    // The override takes the other steps on purpose, and the run then
    // belongs to them: starting it again with them is the same start.
    let out = env.run(&["start", other, "--run-id", "over", "--input", "{\"q\": 1}"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["run", five, "--run-id", "over", "--accept-changed-workflow"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("over")["state"]["s4"], 4);
    let out = env.run(&["start", five, "--run-id", "over", "--input", "{\"q\": 1}"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        !env.path().join("dropped").exists(),
        "the other flow's step ran"
    );
    // Its own flow runs it.
    let out = env.run(&["run", five, "--run-id", "dup"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("dup")["state"]["q"], 1);
    Ok(())
}

/// Three workers on one SQLite store race to claim the same runs: the
/// losers of a race say nothing (it is counted in their summary), and no
/// worker says "lost", which is kept for a run a worker held and was taken.
#[test]
fn workers_that_lose_a_claim_race_say_nothing_about_it() -> TestResult {
    const RUNS: usize = 90;
    let env = Env::new();
    let flow = env.flow(
        "quick.toml",
        "name = \"quick\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n[[step]]\nname = \"b\"\nrun = \"echo '{}'\"\n",
    );
    let flow = flow.to_str().ok_or("path")?;
    for i in 0..RUNS {
        let out = env.run(&["start", flow, "--run-id", &format!("r{i:03}")]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let workers: Vec<Child> = (0..3)
        .map(|_| {
            env.cmd(&["worker", flow, "--poll", "10ms", "--concurrency", "4"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = env.run(&["runs", "--status", "completed", "--json"]);
        let done = String::from_utf8_lossy(&out.stdout)
            .matches("\"run_id\"")
            .count();
        if done == RUNS {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of {RUNS} completed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut missed = 0u64;
    let mut completed = 0u64;
    for w in workers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let (status, err) = finish(w);
        assert_eq!(status, 0, "{err}");
        assert!(!err.contains("lost:"), "a worker said lost: {err}");
        let summary = err
            .lines()
            .find(|l| l.contains("steadfast worker: stopped"))
            .ok_or("no summary")?;
        let count = |what: &str| -> u64 {
            summary
                .split(", ")
                .find(|p| p.ends_with(what))
                .and_then(|p| p.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        completed += count("completed");
        missed += count("claimed by others first");
    }
    // A run completed by one worker may be taken by another that saw it
    // due a moment before: that call finds it completed and counts too.
    assert!(completed >= RUNS as u64, "{completed} completed");
    eprintln!("{RUNS} runs, 3 workers: {missed} claim races lost (counted, not printed)");
    Ok(())
}
