//! Regression tests for what hostile testing found: each names its finding
//! (the numbers of the issue "Nothing a user types, a step prints or a
//! neighbour plants may destroy a store, hang the runner or panic it").

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::*;

const GATED: &str = "name = \"gated\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n[[step]]\nname = \"review\"\ngate = true\n[[step]]\nname = \"b\"\nrun = \"echo '{\\\"b\\\": 1}'\"\n";

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Waits for `child` at most `limit`; kills it and fails if it takes longer.
fn finish_within(mut child: Child, limit: Duration) -> Result<Output, String> {
    let start = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

fn kill_pid_in(env: &Env, file: &str) {
    if let Ok(pid) = std::fs::read_to_string(env.path().join(file)) {
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    }
}

fn with_store(env: &Env, store: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(env.path())
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("run steadfast")
}

/// Finding 1: decision data that would not load back is refused before it is
/// written, on both stores; the other runs and the victim stay usable.
#[test]
fn finding_1_deep_decision_data_is_refused_and_every_run_still_loads() -> TestResult {
    for store in ["file:f.json", "sqlite:s.db"] {
        let env = Env::new();
        let flow = env.flow("gated.toml", GATED);
        let f = flow.to_str().unwrap();
        for id in ["victim", "bystander"] {
            let out = with_store(&env, store, &["run", f, "--run-id", id]);
            assert_eq!(code(&out), 4, "{store}: {}", stderr(&out));
        }
        for depth in [100, 126] {
            let data = nested(depth);
            let out = with_store(
                &env,
                store,
                &["approve", "victim", "review", "--data", &data],
            );
            assert_eq!(code(&out), 2, "{store} depth {depth}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("cannot be stored"),
                "{}",
                stderr(&out)
            );
        }
        for id in ["victim", "bystander"] {
            let out = with_store(&env, store, &["show", id, "--json"]);
            assert_eq!(code(&out), 0, "{store}: {id}: {}", stderr(&out));
        }
        // The victim was never stuck: a good decision still goes through.
        let out = with_store(
            &env,
            store,
            &["approve", "victim", "review", "--data", &nested(90)],
        );
        assert_eq!(code(&out), 0, "{store}: {}", stderr(&out));
        let out = with_store(&env, store, &["run", f, "--run-id", "victim"]);
        assert_eq!(code(&out), 0, "{store}: {}", stderr(&out));
    }
    Ok(())
}

/// Finding 2: a step timeout covers the step's pipes, and a step that exited
/// is not waited on past a short drain, even when a process it started left
/// its group and holds stdout open.
#[test]
fn finding_2_an_escaped_child_holding_the_pipes_hangs_nothing() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "escape.toml",
        "name = \"escape\"\n[[step]]\nname = \"a\"\ntimeout = \"3s\"\nrun = \"setsid sh -c 'echo $$ > esc1.pid; exec sleep 600' & echo '{\\\"a\\\": 1}'\"\n[[step]]\nname = \"b\"\ntimeout = \"1s\"\nrun = \"setsid sh -c 'echo $$ > esc2.pid; exec sleep 600' & sleep 30\"\nretries = 0\n",
    );
    let child = env
        .cmd(&["run", flow.to_str().unwrap(), "--run-id", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = finish_within(child, Duration::from_secs(20));
    kill_pid_in(&env, "esc1.pid");
    kill_pid_in(&env, "esc2.pid");
    let out = out?;
    assert_eq!(code(&out), 1, "step b timed out: {}", stderr(&out));
    assert!(stderr(&out).contains("timed out"), "{}", stderr(&out));
    let shown = env.show("r");
    assert_eq!(
        shown["next"], 1,
        "step a completed despite its escaped child"
    );
    assert_eq!(shown["state"]["a"], 1);
    Ok(())
}

/// Finding 3: durations out of range are refused where they enter, naming the
/// field and the range, without a panic.
#[test]
fn finding_3_durations_out_of_range_are_refused_with_the_field() -> TestResult {
    let env = Env::new();
    let cases = [
        ("sleep", "[[step]]\nname = \"s\"\nsleep = \"10000y\"\n"),
        (
            "timeout",
            "[[step]]\nname = \"g\"\ngate = true\ntimeout = \"10000y\"\n",
        ),
        (
            "timeout",
            "[[step]]\nname = \"t\"\nrun = \"true\"\ntimeout = \"0s\"\n",
        ),
        (
            "backoff",
            "[[step]]\nname = \"b\"\nrun = \"true\"\nbackoff = \"10000y\"\n",
        ),
    ];
    for (field, step) in cases {
        let flow = env.flow("d.toml", &format!("name = \"d\"\n{step}"));
        let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{field}: {err}");
        assert!(err.contains(field) && err.contains("out of range"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let flow = env.flow(
        "ok.toml",
        "name = \"ok\"\n[[step]]\nname = \"a\"\nrun = \"true\"\n",
    );
    for lease in ["10000y", "0s"] {
        let out = env.run(&[
            "run",
            flow.to_str().unwrap(),
            "--run-id",
            "r",
            "--lease",
            lease,
        ]);
        assert_eq!(code(&out), 2, "--lease {lease}: {}", stderr(&out));
        assert!(stderr(&out).contains("out of range"), "{}", stderr(&out));
    }
    Ok(())
}

/// Finding 4: a store directory or file planted by someone else (writable by
/// others, or not ours) is refused with what to fix, and left alone.
#[test]
fn finding_4_a_planted_store_is_refused() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "ok.toml",
        "name = \"ok\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    let shared = env.path().join("shared");
    std::fs::create_dir_all(shared.join(".steadfast"))?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777))?;
    std::fs::set_permissions(
        shared.join(".steadfast"),
        std::fs::Permissions::from_mode(0o777),
    )?;
    std::fs::write(shared.join(".steadfast/runs.db"), b"")?;
    std::fs::set_permissions(
        shared.join(".steadfast/runs.db"),
        std::fs::Permissions::from_mode(0o666),
    )?;
    let out = Command::new(BIN)
        .current_dir(&shared)
        .env_remove("STEADFAST_STORE")
        .args(["run", flow.to_str().unwrap(), "--run-id", "r"])
        .output()?;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("0777"), "{}", stderr(&out));
    assert_eq!(
        std::fs::metadata(shared.join(".steadfast/runs.db"))?.len(),
        0,
        "left alone"
    );
    // A private directory with a file that lets others write it.
    std::fs::set_permissions(
        shared.join(".steadfast"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    let out = with_store(
        &env,
        "sqlite:shared/.steadfast/runs.db",
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("chmod go-w"), "{}", stderr(&out));
    // A lock file planted as a symbolic link is never followed.
    std::fs::create_dir(env.path().join("mine"))?;
    std::fs::set_permissions(
        env.path().join("mine"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    std::os::unix::fs::symlink(
        env.path().join("elsewhere"),
        env.path().join("mine/runs.json.lock"),
    )?;
    let out = with_store(
        &env,
        "file:mine/runs.json",
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert!(
        !env.path().join("elsewhere").exists(),
        "the link was followed"
    );
    // As root, a directory owned by another user.
    if nix::unistd::geteuid().is_root() {
        let theirs = env.path().join("theirs");
        std::fs::create_dir(&theirs)?;
        Command::new("chown")
            .args(["65534", theirs.to_str().unwrap()])
            .status()?;
        let out = with_store(
            &env,
            "file:theirs/runs.json",
            &["run", flow.to_str().unwrap(), "--run-id", "r"],
        );
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("belongs to user id 65534"),
            "{}",
            stderr(&out)
        );
    }
    Ok(())
}

/// Finding 5: `file:` through a symbolic link writes the real file under one
/// lock; the link stays a link.
#[test]
fn finding_5_a_linked_file_store_is_one_store() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "ok.toml",
        "name = \"ok\"\n[[step]]\nname = \"a\"\nrun = \"echo '{\\\"a\\\": 1}'\"\n",
    );
    std::fs::create_dir(env.path().join("real"))?;
    std::fs::set_permissions(
        env.path().join("real"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    std::os::unix::fs::symlink("real/runs.json", env.path().join("link.json"))?;
    // The target must exist for the link to be followed.
    let out = with_store(
        &env,
        "file:real/runs.json",
        &["run", flow.to_str().unwrap(), "--run-id", "one"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = with_store(
        &env,
        "file:link.json",
        &["run", flow.to_str().unwrap(), "--run-id", "two"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(env.path().join("link.json"))?
        .file_type()
        .is_symlink());
    let real = std::fs::read_to_string(env.path().join("real/runs.json"))?;
    assert!(
        real.contains("\"one\"") && real.contains("\"two\""),
        "{real}"
    );
    assert!(
        !env.path().join("link.json.lock").exists(),
        "one lock, beside the real file"
    );
    Ok(())
}

/// Finding 6: a device or other non-regular file is refused at once, and a
/// store file is never read past its limit.
#[test]
fn finding_6_devices_are_refused_without_reading_them() -> TestResult {
    let env = Env::new();
    for dev in ["/dev/zero", "/dev/full"] {
        let child = Command::new(BIN)
            .args(["--store", &format!("file:{dev}"), "runs"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = finish_within(child, Duration::from_secs(20))?;
        assert_ne!(code(&out), 0, "{dev}");
        assert!(!stderr(&out).is_empty(), "{dev}: an error is printed");
    }
    let _ = env;
    Ok(())
}

/// Finding 7: a checkpoint that cannot be saved (the state outgrew the store)
/// leaves the run `failed` with the cause and no lease, not `running`. The
/// values stay inline (a threshold of 1 GiB), so that the record itself
/// outgrows the file store's 16 MiB.
#[test]
fn finding_7_a_failed_save_is_recorded_as_a_failure() -> TestResult {
    let env = Env::new();
    let big = "python3 -c 'import json; print(json.dumps({\\\"KEY\\\": \\\"x\\\" * 9000000}))'";
    let flow = env.flow(
        "big.toml",
        &format!(
            "name = \"big\"\n[[step]]\nname = \"a\"\nrun = \"{}\"\n[[step]]\nname = \"b\"\nrun = \"{}\"\n",
            big.replace("KEY", "a"),
            big.replace("KEY", "b")
        ),
    );
    let out = with_store(
        &env,
        "file:f.json?blob_threshold=1GiB",
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let out = with_store(&env, "file:f.json", &["show", "r", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(shown["status"], "failed", "{shown:#}");
    assert_eq!(shown["next"], 1);
    assert!(shown["lease"].is_null(), "lease released");
    let msg = shown["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("could not be saved") && msg.contains("over the limit"),
        "{msg}"
    );
    let out = with_store(
        &env,
        "file:f.json",
        &["runs", "--status", "failed", "--json"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"r\""));
    Ok(())
}

/// Finding 8: a write error on stdout (other than a closed pipe) is exit 1.
#[test]
fn finding_8_output_errors_are_errors() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "ok.toml",
        "name = \"ok\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    for args in [
        vec!["run", flow.to_str().unwrap(), "--run-id", "r", "--json"],
        vec!["show", "r", "--json"],
    ] {
        let out = env
            .cmd(&args)
            .stdout(std::fs::File::create("/dev/full")?)
            .output()?;
        assert_eq!(code(&out), 1, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("cannot write"), "{}", stderr(&out));
    }
    Ok(())
}

/// Finding 10: one line per error, causes once, untrusted text escaped,
/// hints quoted for the shell.
#[test]
fn finding_10_errors_say_it_once_and_untrusted_text_is_escaped() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "noisy.toml",
        "name = \"noisy\"\n[[step]]\nname = \"a\"\nretries = 0\nrun = \"printf 'line one\\\\nFAKE audit\\\\033[2J' >&2; exit 3\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 1);
    let last = stderr(&out).lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("steadfast: "), "{last}");
    assert_eq!(last.matches("exited with code 3").count(), 1, "{last}");
    assert!(
        !stderr(&out).contains('\u{1b}'),
        "no escape sequence reaches the terminal"
    );
    let shown = env.run(&["show", "r"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(!text.lines().any(|l| l.starts_with("FAKE")), "{text}");
    assert!(!text.contains('\u{1b}'), "{text}");
    // A decider with a newline is refused; a run id with a space is quoted.
    let gated = env.flow("gated.toml", GATED);
    let out = env.run(&["run", gated.to_str().unwrap(), "--run-id", "a b"]);
    assert_eq!(code(&out), 4);
    assert!(
        stderr(&out).contains("steadfast approve 'a b' review"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["approve", "a b", "review", "--by", "ada\ndecision  forged"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    // sqlite: on a directory says so, once.
    std::fs::create_dir(env.path().join("adir"))?;
    let out = with_store(&env, "sqlite:adir", &["runs"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("is a directory"), "{}", stderr(&out));
    assert!(
        stderr(&out).matches("unable to open").count() <= 1,
        "{}",
        stderr(&out)
    );
    Ok(())
}

/// Also found: big integers and invalid UTF-8 are refused, not rounded or
/// replaced; a read-only command on a missing store says so and creates
/// nothing.
#[test]
fn numbers_are_kept_exactly_or_refused_and_missing_stores_are_not_created() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "nums.toml",
        "name = \"nums\"\n[[step]]\nname = \"ok\"\nrun = \"echo '{\\\"a\\\": 1.5, \\\"b\\\": 18446744073709551615, \\\"c\\\": -9223372036854775808, \\\"d\\\": 1e300}'\"\n[[step]]\nname = \"big\"\nretries = 0\nrun = \"echo '{\\\"n\\\": 123456789012345678901234567890}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not fit in 64 bits"),
        "{}",
        stderr(&out)
    );
    let shown = env.show("r");
    assert_eq!(
        shown["state"]["b"],
        serde_json::json!(18446744073709551615u64)
    );
    let flow = env.flow(
        "utf8.toml",
        "name = \"utf8\"\n[[step]]\nname = \"bad\"\nretries = 0\nrun = \"printf '{\\\"s\\\": \\\"\\\\377\\\"}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "u"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("not UTF-8"), "{}", stderr(&out));
    // serde_json's marker name would come back as another value, or not at
    // all: the step fails and says where.
    let flow = env.flow(
        "marker.toml",
        "name = \"marker\"\n[[step]]\nname = \"bad\"\nretries = 0\nrun = \"printf '{\\\"x\\\": {\\\"$serde_json::private::RawValue\\\": \\\"1\\\"}}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "m"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("x.$serde_json::private::RawValue")
            && stderr(&out).contains("would not load back"),
        "{}",
        stderr(&out)
    );
    // A state's own first key, likewise.
    let flow = env.flow(
        "top.toml",
        "name = \"top\"\n[[step]]\nname = \"bad\"\nretries = 0\nrun = \"printf '{\\\"$serde_json::private::RawValue\\\": \\\"1\\\"}'\"\n",
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "t"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("would not load back"),
        "{}",
        stderr(&out)
    );
    // Where the name loads back as printed (a member that is not first), it
    // is an ordinary name, on SQLite and on the file store.
    let flow = env.flow(
        "named.toml",
        "name = \"named\"\n[[step]]\nname = \"ok\"\nrun = \"printf '{\\\"!\\\": 0, \\\"$serde_json::private::RawValue\\\": \\\"1\\\", \\\"z\\\": {\\\"!\\\": 1, \\\"$serde_json::private::RawValue\\\": 2}}'\"\n",
    );
    let printed = serde_json::json!({
        "!": 0,
        "$serde_json::private::RawValue": "1",
        "z": {"!": 1, "$serde_json::private::RawValue": 2}
    });
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "n"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("n")["state"], printed);
    let file = format!("file:{}", env.path().join("f.json").display());
    let flow = flow.to_str().unwrap();
    let out = with_store(&env, &file, &["run", flow, "--run-id", "n"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = with_store(&env, &file, &["show", "n", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(shown["state"], printed);
    let out = with_store(&env, "sqlite:nonexistent/deep/x.db", &["runs"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(!env.path().join("nonexistent").exists());
    Ok(())
}

/// Finding 12: a runner stopped past its lease is taken over, and its step's
/// process group is killed before the step runs again, so the two never run
/// at once; the stopped runner is fenced out when it resumes.
#[test]
fn finding_12_a_stopped_holders_step_is_killed_before_the_takeover_reruns_it() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "stop.toml",
        "name = \"stop\"\n[[step]]\nname = \"work\"\nrun = \"if [ -e first.pid ]; then echo '{\\\"by\\\": \\\"second\\\"}'; else echo $$ > first.pid; sleep 30; fi\"\n",
    );
    let f = flow.to_str().unwrap();
    let a = env
        .cmd(&["run", f, "--run-id", "r", "--lease", "1s"])
        .stderr(Stdio::piped())
        .spawn()?;
    let a_pid = a.id().to_string();
    // A stopped process left behind would hold the test's output open.
    let _a_guard = KillOnDrop(a_pid.clone());
    let step_pid = first_step_pid(&env);
    Command::new("kill").args(["-STOP", &a_pid]).status()?;
    std::thread::sleep(Duration::from_millis(1300));
    let b = env.run(&["run", f, "--run-id", "r", "--lease", "1s"]);
    assert_eq!(code(&b), 0, "B takes over: {}", stderr(&b));
    let dead_by = Instant::now() + Duration::from_secs(5);
    while pid_alive(&step_pid) {
        assert!(Instant::now() < dead_by, "A's step still runs beside B's");
        std::thread::sleep(Duration::from_millis(20));
    }
    Command::new("kill").args(["-CONT", &a_pid]).status()?;
    let a = finish_within(a, Duration::from_secs(20))?;
    assert_eq!(code(&a), 3, "A is fenced out: {}", stderr(&a));
    assert_eq!(env.show("r")["state"]["by"], "second");
    Ok(())
}

/// A holder SIGKILLed mid-step leaves its step to a supervisor that kills
/// the step's group when it hears of the death, but not at once, and not
/// at all if it dies first: here it is stopped, so that the kernel hangs up
/// its group (orphaned with a stopped member) and the supervisor dies
/// without a word while the step, which ignores hang-ups, runs on. The
/// process that takes the run over kills the step's group before it runs
/// the step again, so the two never run at once. (The crash torture found
/// them overlapping.) A daemon an earlier step started out of its group is
/// left alone.
#[test]
fn a_dead_holders_step_is_killed_before_the_takeover_reruns_it() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "dead.toml",
        "name = \"dead\"\n[[step]]\nname = \"daemon\"\nrun = \"setsid sh -c 'echo $$ > daemon.pid; exec sleep 30' > /dev/null 2>&1 < /dev/null 3>&- & while [ ! -s daemon.pid ]; do sleep 0.01; done\"\n[[step]]\nname = \"work\"\nrun = \"if [ -e first.pid ]; then if [ -d /proc/$(cat first.pid) ] && ! grep -q ') Z' /proc/$(cat first.pid)/stat; then echo '{\\\"by\\\": \\\"second, beside the first\\\"}'; else echo '{\\\"by\\\": \\\"second\\\"}'; fi; else trap '' HUP; echo $$ > first.pid; sleep 30; fi\"\n",
    );
    let f = flow.to_str().unwrap();
    let mut a = with_default_hangup(env.cmd(&["run", f, "--run-id", "r", "--lease", "30s"]))
        .stderr(Stdio::null())
        .spawn()?;
    let step_pid = first_step_pid(&env);
    // The step's parent is its supervisor.
    let stat = std::fs::read_to_string(format!("/proc/{step_pid}/stat"))
        .map_err(|e| format!("the step {step_pid:?}: {e}"))?;
    let supervisor = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .ok_or("the step's parent")?
        .to_string();
    let _guard = KillOnDrop(supervisor.clone());
    Command::new("kill").args(["-STOP", &supervisor]).status()?;
    let stopped_by = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{supervisor}/stat"))?.contains(") T ") {
        assert!(Instant::now() < stopped_by, "the supervisor did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.kill()?;
    a.wait()?;
    let b = env.run(&["run", f, "--run-id", "r", "--lease", "30s"]);
    assert_eq!(code(&b), 0, "B takes over: {}", stderr(&b));
    assert!(
        stderr(&b).contains("left behind when it died"),
        "{}",
        stderr(&b)
    );
    // Killed before B's step ran; a moment for the kernel to finish it.
    let dead_by = Instant::now() + Duration::from_secs(2);
    while pid_alive(&step_pid) {
        assert!(
            Instant::now() < dead_by,
            "A's step still runs after B ran the step again: {}",
            stderr(&b)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(env.show("r")["state"]["by"], "second");
    let daemon = std::fs::read_to_string(env.path().join("daemon.pid"))
        .map_err(|e| format!("daemon.pid: {e}"))?
        .trim()
        .to_string();
    let _daemon_guard = KillOnDrop(daemon.clone());
    assert!(
        pid_alive(&daemon),
        "the daemon an earlier step started lives on"
    );
    Ok(())
}

/// The pid the first execution of the step wrote to `first.pid`, once it
/// has (at most 10 s).
/// `cmd` started with SIGHUP's default action, whatever this test
/// inherited. Under `nohup` the hang-up would be ignored down to the step's
/// supervisor, which would then live on to kill its group itself (as it
/// should: the step still dies) and leave the takeover nothing to kill.
fn with_default_hangup(cmd: Command) -> Command {
    let mut c = Command::new("env");
    c.arg("--default-signal=HUP")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        c.current_dir(dir);
    }
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => c.env(key, v),
            None => c.env_remove(key),
        };
    }
    c
}

fn first_step_pid(env: &Env) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid = std::fs::read_to_string(env.path().join("first.pid")).unwrap_or_default();
        if !pid.trim().is_empty() {
            return pid.trim().to_string();
        }
        assert!(Instant::now() < deadline, "A never started its step");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills a process (and lets it run on to die) when the test ends, however
/// it ends.
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if pid_alive(&self.0) {
            let _ = Command::new("kill").args(["-9", &self.0]).status();
            let _ = Command::new("kill").args(["-CONT", &self.0]).status();
        }
    }
}

/// Flow files are bounded too: a device or an oversized file is refused at
/// once, and so is a retry count past the limit.
#[test]
fn flow_files_that_never_end_or_retry_for_ever_are_refused() -> TestResult {
    let env = Env::new();
    let child = env
        .cmd(&["run", "/dev/zero", "--run-id", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = finish_within(child, Duration::from_secs(20))?;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    let big = env.flow(
        "big.toml",
        &format!("name = \"big\"\n#{}\n", "x".repeat(2 << 20)),
    );
    let out = env.run(&["run", big.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("larger than"), "{}", stderr(&out));
    let forever = env.flow(
        "forever.toml",
        "name = \"f\"\n[[step]]\nname = \"a\"\nrun = \"exit 1\"\nretries = 4294967295\n",
    );
    let out = env.run(&["run", forever.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("forever.toml:5: retries = 4294967295 is out of range"),
        "{}",
        stderr(&out)
    );
    let env_nul = env.flow(
        "env.toml",
        "name = \"e\"\n[[step]]\nname = \"a\"\nrun = \"true\"\nenv = { \"A\\u0000B\" = \"x\" }\n",
    );
    let out = env.run(&["run", env_nul.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("env.toml:2"), "{}", stderr(&out));
    Ok(())
}

/// Step output nested deeper than a store keeps fails the step with where it
/// is, and every run still loads.
#[test]
fn deeply_nested_step_output_fails_the_step_not_the_store() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "deep.toml",
        &format!(
            "name = \"deep\"\n[[step]]\nname = \"a\"\nretries = 0\nrun = \"echo '{{\\\"d\\\": {}}}'\"\n",
            nested(120)
        ),
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be stored at `d[0]"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.show("r")["status"], "failed");
    Ok(())
}

/// A planted write-ahead log (a symbolic link beside the database) is
/// refused, and the link's target is never written.
#[test]
fn a_planted_log_link_beside_the_database_is_refused() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "ok.toml",
        "name = \"ok\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    std::fs::create_dir(env.path().join("db"))?;
    std::fs::set_permissions(
        env.path().join("db"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    std::os::unix::fs::symlink(
        env.path().join("elsewhere"),
        env.path().join("db/runs.db-wal"),
    )?;
    let out = with_store(
        &env,
        "sqlite:db/runs.db",
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert!(!env.path().join("elsewhere").exists());
    Ok(())
}

/// Store URLs that name nothing, from the flag or the environment, are usage
/// errors.
#[test]
fn empty_store_urls_are_usage_errors() -> TestResult {
    let env = Env::new();
    for (flag, var) in [(Some(""), None), (None, Some("")), (Some("sqlite:"), None)] {
        let mut c = Command::new(BIN);
        c.current_dir(env.path());
        if let Some(f) = flag {
            c.args(["--store", f]);
        }
        match var {
            Some(v) => c.env("STEADFAST_STORE", v),
            None => c.env_remove("STEADFAST_STORE"),
        };
        let out = c.arg("runs").output()?;
        assert_eq!(code(&out), 2, "{flag:?} {var:?}: {}", stderr(&out));
    }
    Ok(())
}

/// `show` reports a history it cannot read instead of leaving it out.
#[test]
fn show_reports_an_unreadable_history() -> TestResult {
    let env = Env::new();
    let flow = env.flow("gated.toml", GATED);
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    // The wait at the gate snapshotted the state, so the first step's row lies
    // below the snapshot: loading the run does not read it, the history does.
    let db = env.store().trim_start_matches("sqlite:").to_string();
    let status = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE steps SET update_json='{'\"); c.commit()",
            &db,
        ])
        .status()?;
    assert!(status.success());
    let out = env.run(&["show", "r"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("history"), "{}", stderr(&out));
    Ok(())
}

/// Who decides and why are bounded: a long name or reason is refused and
/// the run still waits at its gate.
#[test]
fn decision_names_and_reasons_past_their_limits_are_refused() -> TestResult {
    let env = Env::new();
    let flow = env.flow("gated.toml", GATED);
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let long_name = "x".repeat(300);
    let out = env.run(&["approve", "r", "review", "--by", &long_name]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let long_reason = "x".repeat(70_000);
    let out = env.run(&["reject", "r", "review", "--reason", &long_reason]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("over the limit"), "{}", stderr(&out));
    assert_eq!(env.show("r")["status"], "waiting");
    Ok(())
}

/// `start` and `worker` refuse bad input with exit 2 and a message that
/// names it, and record nothing: an empty or control-character run id, an
/// input that is not an object, too deep, out of range, empty or not
/// UTF-8; worker options out of range; two flows of one name; a missing
/// flow file.
#[test]
fn start_and_worker_refuse_bad_input_and_record_nothing() -> TestResult {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let flow = env.flow(
        "w.toml",
        "name = \"w\"\nversion = \"1\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    let twin = env.flow(
        "twin.toml",
        "name = \"w\"\nversion = \"1\"\n[[step]]\nname = \"b\"\nrun = \"echo '{}'\"\n",
    );
    let f = flow.to_str().unwrap();
    let deep = format!("{}1{}", "{\"a\":".repeat(200), "}".repeat(200));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["start", f, "--run-id", ""], "empty"),
        (vec!["start", f, "--run-id", "a\nb"], "run id"),
        (
            vec!["start", f, "--run-id", "r", "--input", "[1]"],
            "JSON object",
        ),
        (
            vec!["start", f, "--run-id", "r", "--input", &deep],
            "recursion limit",
        ),
        (
            vec!["start", f, "--run-id", "r", "--input", "{\"n\": 1e999}"],
            "out of range",
        ),
        (vec!["start", f, "--run-id", "r", "--input", ""], "--input"),
        (
            vec!["start", "missing.toml", "--run-id", "r"],
            "missing.toml",
        ),
        (vec!["worker", f, "--concurrency", "0"], "--concurrency"),
        (
            vec!["worker", f, "--concurrency", "99999999999"],
            "--concurrency",
        ),
        (vec!["worker", f, "--poll", "0s"], "poll interval"),
        (vec!["worker", f, "--grace", "10000y"], "grace period"),
        (vec!["worker", f, "--lease", "1ms"], "lease"),
        (
            vec!["worker", f, twin.to_str().unwrap()],
            "need versions of their own",
        ),
        (vec!["worker"], "FLOWS"),
    ];
    for (args, says) in cases {
        let out = env.run(&args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(says),
            "{args:?} should say {says:?}: {}",
            stderr(&out)
        );
    }
    // Not UTF-8, straight from the command line.
    let out = env
        .cmd(&["start", f, "--run-id", "r", "--input"])
        .arg(std::ffi::OsStr::from_bytes(b"{\"a\":\"\xff\"}"))
        .output()?;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let runs = env.run(&["runs", "--json"]);
    let listed: serde_json::Value =
        serde_json::from_slice(&runs.stdout).unwrap_or(serde_json::Value::Null);
    assert!(
        listed.as_array().is_none_or(|a| a.is_empty()),
        "nothing was recorded: {listed}"
    );
    Ok(())
}

/// Starting a run id that exists leaves it as it was: started the same way
/// again it says so (exit 0), with another workflow or input it is refused
/// (exit 2).
#[test]
fn starting_an_existing_run_changes_nothing() -> TestResult {
    let env = Env::new();
    let one = env.flow(
        "one.toml",
        "name = \"one\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    let two = env.flow(
        "two.toml",
        "name = \"two\"\n[[step]]\nname = \"a\"\nrun = \"echo '{}'\"\n",
    );
    let out = env.run(&[
        "start",
        one.to_str().unwrap(),
        "--run-id",
        "r",
        "--input",
        "{\"x\": 1}",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let before = env.show("r");
    let out = env.run(&[
        "start",
        two.to_str().unwrap(),
        "--run-id",
        "r",
        "--input",
        "{\"x\": 2}",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("exists already"), "{}", stderr(&out));
    assert_eq!(env.show("r"), before);
    let out = env.run(&[
        "start",
        one.to_str().unwrap(),
        "--run-id",
        "r",
        "--input",
        "{\"x\": 1}",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert_eq!(env.show("r"), before);
    assert_eq!(before["status"], "pending");
    Ok(())
}
