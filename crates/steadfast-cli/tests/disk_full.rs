//! Disks that fill, for real: a small tmpfs mounted in a private mount
//! namespace (`unshare --mount`, which needs root: CI runs as root; elsewhere
//! each test prints why it did not run, and under CI that is a failure).
//!
//! While a run's state grows, the disk fills: the failing save is an error
//! (exit 1, naming the store), every acknowledged step is still there, and
//! after space is freed the same run resumes and completes. With a worker
//! running eight runs at once on SQLite, the saves that fail with
//! `SQLITE_FULL` inside a shared group commit are never acknowledged: what
//! each run printed as done is exactly what the store holds.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::BIN;

const STEPS: usize = 16;
const CHUNK: usize = 30_000;

fn can_mount() -> bool {
    let ok = nix::unistd::geteuid().is_root()
        && Command::new("unshare")
            .args(["--mount", "--propagation", "private", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the disk-full tests as root, with unshare"
        );
        eprintln!("skipped: mounting a tmpfs in a private namespace needs root and unshare");
    }
    ok
}

/// A flow of `STEPS` steps, each adding `CHUNK` bytes to the state.
fn growing_flow(dir: &Path) {
    std::fs::write(
        dir.join("chunk.sh"),
        format!(
            "printf '{{\"%s\": \"%s\"}}' \"$1\" \"$(head -c {CHUNK} /dev/zero | tr '\\0' x)\"\n"
        ),
    )
    .unwrap();
    let mut text = String::from("name = \"grow\"\n");
    for i in 0..STEPS {
        text.push_str(&format!(
            "[[step]]\nname = \"s{i}\"\nrun = \"sh chunk.sh s{i}\"\n"
        ));
    }
    std::fs::write(dir.join("grow.toml"), text).unwrap();
}

/// Runs `script` in a private mount namespace with a `size` tmpfs on
/// `DIR/disk`; the script sees `$S` (the binary) and `$D` (the mount).
fn in_namespace(dir: &Path, size: &str, script: &str) -> std::process::Output {
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let full = format!(
        "set -u\nmount -t tmpfs -o size={size},mode=0700 steadfast-test \"$D\" || exit 99\n{script}"
    );
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &full])
        .current_dir(dir)
        .env("S", BIN)
        .env("D", &disk)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `show --json` outputs the script wrote to `name`.
fn shown(dir: &Path, name: &str) -> Value {
    let t = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{name}: {e}: {t}"))
}

fn check_prefix(state: &Value, next: usize) {
    for i in 0..STEPS {
        let v = &state[format!("s{i}")];
        if i < next {
            assert_eq!(
                v.as_str().map(str::len),
                Some(CHUNK),
                "step {i} of {next} is intact"
            );
        } else {
            assert!(v.is_null(), "step {i} was never acknowledged but is stored");
        }
    }
}

#[test]
fn a_full_disk_fails_the_save_keeps_every_acknowledged_step_and_the_run_resumes() {
    if !can_mount() {
        return;
    }
    for (url, file) in [
        ("sqlite:$D/runs.db", "runs.db"),
        ("file:$D/runs.json", "runs.json"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        growing_flow(dir.path());
        let script = format!(
            "\"$S\" --store {url} run grow.toml --run-id r > run1.out 2> run1.err; echo $? > run1.code\n\
             \"$S\" --store {url} show r --json > show1.json 2> show1.err\n\
             mount -o remount,size=16m \"$D\" || exit 98\n\
             \"$S\" --store {url} run grow.toml --run-id r > run2.out 2> run2.err; echo $? > run2.code\n\
             \"$S\" --store {url} show r --json > show2.json 2> show2.err\n"
        );
        let out = in_namespace(dir.path(), "320k", &script);
        assert!(
            out.status.success(),
            "{url}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(
            read("run1.code").trim(),
            "1",
            "{url}: the first run must fail: {}",
            read("run1.err")
        );
        let err = read("run1.err");
        assert!(
            err.contains(file),
            "{url}: the error names the store: {err}"
        );
        assert!(
            err.contains("full") || err.contains("No space"),
            "{url}: the error says the disk is full: {err}"
        );
        let first = shown(dir.path(), "show1.json");
        let next = first["next"].as_u64().unwrap() as usize;
        assert!(
            (1..STEPS).contains(&next),
            "{url}: {next} steps before the disk filled"
        );
        // What the run printed as done is what the store holds.
        let done = read("run1.err")
            .lines()
            .filter(|l| l.trim_start().starts_with("done"))
            .count();
        assert_eq!(
            done, next,
            "{url}: acknowledged steps {done}, stored {next}"
        );
        check_prefix(&first["state"], next);

        assert_eq!(
            read("run2.code").trim(),
            "0",
            "{url}: resumed: {}",
            read("run2.err")
        );
        let second = shown(dir.path(), "show2.json");
        assert_eq!(second["status"], "completed", "{url}");
        check_prefix(&second["state"], STEPS);
        let skipped = read("run2.err")
            .lines()
            .filter(|l| l.trim_start().starts_with("skip"))
            .count();
        assert_eq!(
            skipped, next,
            "{url}: the resumed run skipped what was done"
        );
    }
}

#[test]
fn a_full_disk_in_a_shared_group_commit_acknowledges_no_member() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    growing_flow(dir.path());
    let mut script = String::new();
    for i in 0..8 {
        script.push_str(&format!(
            "\"$S\" --store sqlite:$D/runs.db start grow.toml --run-id r{i} >/dev/null 2>&1 || exit 97\n"
        ));
    }
    script.push_str(
        "timeout -s TERM 8 \"$S\" --store sqlite:$D/runs.db worker grow.toml --concurrency 8 --poll 50ms > worker.out 2> worker.err\n\
         for i in 0 1 2 3 4 5 6 7; do \"$S\" --store sqlite:$D/runs.db show r$i --json > show$i.json 2>> show.err; done\n",
    );
    let out = in_namespace(dir.path(), "640k", &script);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.path().join("worker.err")).unwrap()
        + &std::fs::read_to_string(dir.path().join("worker.out")).unwrap();
    assert!(
        log.contains("full"),
        "the disk must have filled during the test: {log}"
    );
    let mut stored_total = 0;
    for i in 0..8 {
        let shown = shown(dir.path(), &format!("show{i}.json"));
        let next = shown["next"].as_u64().unwrap() as usize;
        // Steps this run printed as done (acknowledged), counted once each.
        let prefix = format!("r{i} ");
        let mut done: Vec<usize> = log
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter(|l| l.trim_start().starts_with("done"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        done.sort_unstable();
        done.dedup();
        assert_eq!(
            done.len(),
            next,
            "run r{i}: acknowledged {done:?}, stored next {next}"
        );
        check_prefix(&shown["state"], next);
        stored_total += next;
    }
    assert!(stored_total > 0, "no step was stored at all");
}
