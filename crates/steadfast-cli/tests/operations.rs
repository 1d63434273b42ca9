//! The run operations from the command line: cancel (exit 6, the running
//! step's process group killed after the grace period), retry, rewind,
//! fork, gc and `runs --stuck`, on the default SQLite store; and what the
//! file store, which keeps no history, says to rewind and fork.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{code, pid_alive, stderr, Env, TestResult};

const LOGGED: &str = r#"name = "logged"

[[step]]
name = "a"
run = "echo a >> log; echo '{\"a\": 1}'"

[[step]]
name = "b"
run = "echo b >> log; echo '{\"b\": 2}'"

[[step]]
name = "c"
run = "echo c >> log; echo '{\"c\": 3}'"
"#;

fn wait_for(path: &std::path::Path) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", path.display()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn cancel_kills_a_hanging_step_after_the_grace_and_exits_6() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"hang\"\n[[step]]\nname = \"wait\"\nrun = \"sleep 60 & echo $! > bg.pid; sleep 60\"\n[[step]]\nname = \"after\"\nrun = \"touch after\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    let mut child = env
        .cmd(&[
            "run",
            f,
            "--run-id",
            "r",
            "--lease",
            "600ms",
            "--cancel-grace",
            "300ms",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    wait_for(&env.path().join("bg.pid"))?;
    let out = env.run(&["cancel", "r", "--reason", "enough", "--by", "ops"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let began = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if began.elapsed() > Duration::from_secs(30) {
            child.kill()?;
            return Err("the run did not stop after its cancel".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().ok_or("stderr")?, &mut err)?;
    assert_eq!(status.code(), Some(6), "{err}");
    assert!(err.contains("cancelled by ops: enough"), "{err}");
    let bg = std::fs::read_to_string(env.path().join("bg.pid"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(&bg) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pid_alive(&bg), "the step's process outlived the cancel");
    assert!(
        !env.path().join("after").exists(),
        "a step after the cancel ran"
    );
    let shown = env.show("r");
    assert_eq!(shown["status"], "cancelled");
    assert_eq!(shown["audit"][0]["action"]["kind"], "cancel");
    assert_eq!(shown["audit"][0]["by"], "ops");
    // Running it again: exit 6 at once, nothing runs.
    let again = env.run(&["run", f, "--run-id", "r"]);
    assert_eq!(code(&again), 6, "{}", stderr(&again));
    // Cancelling it again, or a run that does not exist: usage errors.
    assert_eq!(code(&env.run(&["cancel", "r"])), 2);
    assert_eq!(code(&env.run(&["cancel", "nope"])), 2);
    Ok(())
}

#[test]
fn cancel_between_steps_stops_at_the_boundary() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"two\"\n[[step]]\nname = \"one\"\nrun = \"touch started; while [ ! -e go ]; do sleep 0.05; done; echo one >> log\"\n[[step]]\nname = \"two\"\nrun = \"echo two >> log\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    // A long lease: no renewal comes before the step ends, so the cancel is
    // found at the step's save.
    let child = env.cmd(&["run", f, "--run-id", "r"]).spawn()?;
    wait_for(&env.path().join("started"))?;
    let out = env.run(&["cancel", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    std::fs::write(env.path().join("go"), "")?;
    let status = child.wait_with_output()?;
    assert_eq!(status.status.code(), Some(6));
    assert_eq!(env.log(), ["one"], "the step after the cancel ran");
    let shown = env.show("r");
    assert_eq!(shown["status"], "cancelled");
    assert_eq!(shown["next"], 0, "the cancelled step's result was saved");
    Ok(())
}

#[test]
fn retry_rewind_and_fork_from_the_command_line() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    assert_eq!(code(&env.run(&["run", f, "--run-id", "r"])), 0);

    let out = env.run(&["rewind", "r", "--to", "b", "--by", "ada"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = env.show("r");
    assert_eq!(shown["next"], 1);
    assert_eq!(shown["state"], json!({"a": 1}));
    assert_eq!(shown["audit"][0]["action"]["kind"], "rewind");
    assert_eq!(shown["audit"][0]["by"], "ada");
    let text = env.run(&["show", "r"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("rewound to step 1 (b)"),
        "show does not print the audit entry"
    );
    assert_eq!(code(&env.run(&["run", f, "--run-id", "r"])), 0);
    assert_eq!(env.log(), ["a", "b", "c", "b", "c"]);
    let history = env.run(&["history", "r", "--json"]);
    let history = json_of(&history);
    let audit: Vec<&Value> = history
        .as_array()
        .ok_or("history --json is not a list")?
        .iter()
        .filter_map(|e| e.get("audit"))
        .collect();
    assert_eq!(audit.len(), 1, "{history}");
    assert_eq!(audit[0]["action"]["from"], 3);

    let before = env.run(&["show", "r", "--json"]).stdout;
    let out = env.run(&["fork", "r", "--at", "c", "--as", "copy"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        env.run(&["show", "r", "--json"]).stdout,
        before,
        "the original changed"
    );
    let copy = env.show("copy");
    assert_eq!(copy["next"], 2);
    assert_eq!(copy["state"], json!({"a": 1, "b": 2}));
    assert_eq!(code(&env.run(&["run", f, "--run-id", "copy"])), 0);
    assert_eq!(env.log(), ["a", "b", "c", "b", "c", "c"]);

    // Refusals: exit 2, nothing written.
    for args in [
        vec!["rewind", "r", "--to", "zzz"],
        vec!["fork", "r", "--at", "b", "--as", "copy"],
        vec!["fork", "r", "--at", "b", "--as", "bad\nid"],
        vec!["retry", "r"],
        vec!["rewind", "nope", "--to", "a"],
    ] {
        let out = env.run(&args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }

    // A failed step, retried.
    let g = env.flow(
        "g.toml",
        "name = \"flaky\"\n[[step]]\nname = \"once\"\nrun = \"test -e ok || { echo nope >&2; exit 1; }\"\n",
    );
    let g = g.to_str().ok_or("path")?;
    assert_eq!(code(&env.run(&["run", g, "--run-id", "fl"])), 1);
    assert_eq!(env.show("fl")["status"], "failed");
    std::fs::write(env.path().join("ok"), "")?;
    let out = env.run(&["retry", "fl"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.show("fl")["error"], Value::Null);
    assert_eq!(code(&env.run(&["run", g, "--run-id", "fl"])), 0);
    Ok(())
}

#[test]
fn gc_deletes_finished_runs_only_and_reports_progress() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    for i in 0..5 {
        assert_eq!(
            code(&env.run(&["run", f, "--run-id", &format!("done{i}")])),
            0
        );
    }
    assert_eq!(code(&env.run(&["start", f, "--run-id", "waiting"])), 0);
    let dry = env.run(&[
        "gc",
        "--older-than",
        "0s",
        "--dry-run",
        "--json",
        "--batch",
        "2",
    ]);
    assert_eq!(code(&dry), 0, "{}", stderr(&dry));
    assert_eq!(json_of(&dry)["matched"], 5);
    assert_eq!(json_of(&dry)["deleted"], 0);
    assert!(stderr(&dry).contains("batch 3"), "{}", stderr(&dry));
    // Nothing is old enough.
    let none = env.run(&["gc", "--older-than", "1h", "--json"]);
    assert_eq!(json_of(&none)["deleted"], 0);
    let out = env.run(&["gc", "--older-than", "0s", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json_of(&out)["deleted"], 5);
    let left = json_of(&env.run(&["runs", "--json"]));
    let ids: Vec<&str> = left
        .as_array()
        .ok_or("runs --json")?
        .iter()
        .filter_map(|r| r["run_id"].as_str())
        .collect();
    assert_eq!(ids, ["waiting"]);
    for bad in [
        vec!["gc", "--older-than", "0s", "--status", "pending"],
        vec!["gc", "--older-than", "0s", "--status", "bogus"],
        vec!["gc", "--older-than", "1000y"],
        vec!["gc", "--older-than", "0s", "--batch", "0"],
        vec!["gc"],
    ] {
        assert_eq!(code(&env.run(&bad)), 2, "{bad:?}");
    }
    Ok(())
}

#[test]
fn show_says_what_a_run_stores_and_gc_what_it_freed_of_large_values() -> TestResult {
    let env = Env::new();
    // A step that prints a 100 KB document: over the 64 KiB threshold.
    let f = env.flow(
        "f.toml",
        "name = \"w\"\n[[step]]\nname = \"read\"\n\
         run = \"printf '{\\\"doc\\\":\\\"'; head -c 100000 /dev/zero | tr '\\\\000' x; printf '\\\"}'\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    for id in ["r1", "r2"] {
        let out = env.run(&["run", f, "--run-id", id]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let shown = env.show("r1");
    assert_eq!(shown["state"]["doc"].as_str().map(str::len), Some(100_000));
    let stored = &shown["stored"];
    let doc_bytes = 100_002;
    assert_eq!(stored["blobs"], 1, "{shown}");
    assert_eq!(stored["blob_bytes"], doc_bytes, "{shown}");
    assert_eq!(
        stored["shared_bytes"], doc_bytes,
        "r2 holds the same document"
    );
    assert!(stored["record_bytes"].as_u64().ok_or("record_bytes")? < 10_000);
    let text = env.run(&["show", "r1"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("shared with other runs"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    // Deleting one run frees nothing: the other still refers to it.
    assert_eq!(code(&env.run(&["delete", "r2"])), 0);
    assert_eq!(env.show("r1")["stored"]["shared_bytes"], 0);
    let out = env.run(&["gc", "--older-than", "0s", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json_of(&out)["blob_bytes_freed"], doc_bytes);
    // SQLite frees blobs in the transaction that drops them: nothing left.
    assert_eq!(
        json_of(&out)["leftovers"],
        serde_json::json!({"remnants": 0, "items": 0, "failed": 0})
    );
    assert!(stderr(&out).contains("freed 97.7 KiB"), "{}", stderr(&out));
    // Skipped, the look reports nothing rather than a clean result.
    let skipped = env.run(&[
        "gc",
        "--older-than",
        "0s",
        "--no-leftovers",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code(&skipped), 0, "{}", stderr(&skipped));
    assert_eq!(json_of(&skipped)["leftovers"], serde_json::Value::Null);
    Ok(())
}

/// A step may print more than the old limit of 16 MiB: a 20 MB document is
/// taken and stored once as a blob; 2 MB that are not JSON fail the step
/// with the start of what it printed.
#[test]
fn a_step_prints_a_value_larger_than_16_mib_and_it_is_stored_as_a_blob() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "big.toml",
        "name = \"big\"\n[[step]]\nname = \"read\"\n\
         run = \"printf '{\\\"doc\\\":\\\"'; head -c 20000000 /dev/zero | tr '\\\\000' x; printf '\\\", \\\"n\\\": 1.5}'\"\n\
         [[step]]\nname = \"bad\"\nrun = \"head -c 2000000 /dev/zero | tr '\\\\000' x\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    let out = env.run(&["run", f, "--run-id", "big"]);
    assert_eq!(code(&out), 1, "the second step fails: {}", stderr(&out));
    let shown = env.show("big");
    assert_eq!(shown["next"], 1, "{}", shown["error"]);
    assert_eq!(
        shown["state"]["doc"].as_str().map(str::len),
        Some(20_000_000)
    );
    assert_eq!(shown["state"]["n"], 1.5);
    assert_eq!(shown["stored"]["blobs"], 1, "{}", shown["stored"]);
    let why = shown["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("stdout is not JSON that can be stored")
            && why.contains("it starts with \"xxxx"),
        "{why}"
    );
    Ok(())
}

#[test]
fn runs_stuck_labels_each_cause() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"w\"\n[[step]]\nname = \"a\"\nrun = \"exit 1\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    let ok = env.flow(
        "ok.toml",
        "name = \"other\"\n[[step]]\nname = \"x\"\nrun = \"true\"\n[[step]]\nname = \"y\"\nrun = \"true\"\n",
    );
    let ok = ok.to_str().ok_or("path")?;
    assert_eq!(code(&env.run(&["run", f, "--run-id", "failed"])), 1);
    assert_eq!(code(&env.run(&["start", f, "--run-id", "pending"])), 0);
    assert_eq!(code(&env.run(&["run", ok, "--run-id", "fine"])), 0);
    // A record the changed flow no longer matches.
    let changed = env.flow(
        "changed.toml",
        "name = \"other\"\n[[step]]\nname = \"x2\"\nrun = \"true\"\n",
    );
    let mut prior = env.flow(
        "prior.toml",
        "name = \"other\"\n[[step]]\nname = \"x\"\nrun = \"true\"\n[[step]]\nname = \"gate\"\ngate = true\n",
    );
    assert_eq!(
        code(&env.run(&["run", prior.to_str().ok_or("path")?, "--run-id", "gated"])),
        4
    );
    prior = changed;
    let stuck = env.run(&[
        "runs",
        "--stuck",
        "--stuck-after",
        "0s",
        "--json",
        "--flow",
        prior.to_str().ok_or("path")?,
    ]);
    assert_eq!(code(&stuck), 0, "{}", stderr(&stuck));
    let list = json_of(&stuck);
    let labels: Vec<(String, String)> = list
        .as_array()
        .ok_or("runs --json")?
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap_or_default().to_string(),
                r["stuck"]["label"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [
            ("failed".to_string(), "retries-exhausted".to_string()),
            ("gated".to_string(), "workflow-changed".to_string()),
            ("pending".to_string(), "pending-no-worker".to_string()),
        ],
        "{list}"
    );
    // Without --stuck every run is listed, the stuck ones labelled; a fresh
    // pending run is not stuck within the default minute.
    let all = json_of(&env.run(&["runs", "--json"]));
    let all = all.as_array().ok_or("runs --json")?;
    assert_eq!(all.len(), 4);
    assert!(all
        .iter()
        .any(|r| r["run_id"] == "fine" && r["stuck"].is_null()));
    assert!(all
        .iter()
        .any(|r| r["run_id"] == "pending" && r["stuck"].is_null()));
    let shown = env.run(&["show", "failed"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("stuck     retries-exhausted"),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );
    Ok(())
}

#[test]
fn rewind_fork_and_prune_work_on_the_file_store() -> TestResult {
    let env = Env::new();
    let store = format!("file:{}", env.path().join("runs.json").display());
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    let run = |args: &[&str]| {
        std::process::Command::new(support::BIN)
            .current_dir(env.path())
            .arg("--store")
            .arg(&store)
            .args(args)
            .output()
    };
    assert_eq!(code(&run(&["run", f, "--run-id", "r"])?), 0);
    assert_eq!(code(&run(&["rewind", "r", "--to", "b"])?), 0);
    assert_eq!(code(&run(&["run", f, "--run-id", "r"])?), 0);
    assert_eq!(env.log(), ["a", "b", "c", "b", "c"]);
    assert_eq!(code(&run(&["fork", "r", "--at", "c", "--as", "x"])?), 0);
    assert_eq!(code(&run(&["run", f, "--run-id", "x"])?), 0);
    assert_eq!(env.log(), ["a", "b", "c", "b", "c", "c"]);
    let out = run(&["prune", "--all", "--keep-history", "1"])?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let history: Value = serde_json::from_slice(&run(&["history", "r", "--json"])?.stdout)?;
    assert_eq!(
        without_definition(&history[0]["update"]),
        json!({"a": 1, "b": 2}),
        "{history}"
    );
    assert_eq!(code(&run(&["gc", "--older-than", "0s"])?), 0);
    assert_eq!(code(&run(&["show", "r"])?), 2, "gc left the run");
    Ok(())
}

/// Two runs whose steps read the same 200 KB document: the export carries
/// it once, the import puts it back into both, and an export whose blob
/// line is gone is refused at the run that refers to it.
#[test]
fn export_carries_a_large_value_once_and_import_refuses_a_dangling_one() -> TestResult {
    const READER: &str = r#"name = "reader"

[[step]]
name = "read"
run = "printf '{\"doc\": \"'; head -c 200000 /dev/zero | tr '\\0' d; printf '\"}'"
"#;
    let env = Env::new();
    let f = env.flow("f.toml", READER);
    let f = f.to_str().ok_or("path")?;
    for id in ["r1", "r2"] {
        let out = env.run(&["run", f, "--run-id", id]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let export = env.run(&["export"]);
    assert_eq!(code(&export), 0, "{}", stderr(&export));
    let text = String::from_utf8(export.stdout)?;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "one blob line and two runs");
    assert!(
        text.len() < 260_000,
        "the document went out more than once: {}",
        text.len()
    );
    let other = Env::new();
    let file = other.path().join("runs.jsonl");
    std::fs::write(&file, &text)?;
    let out = other.run(&["import", file.to_str().ok_or("path")?]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let doc = "d".repeat(200_000);
    for id in ["r1", "r2"] {
        assert_eq!(other.show(id)["state"]["doc"], json!(doc), "run {id}");
    }
    assert_eq!(String::from_utf8(other.run(&["export"]).stdout)?, text);
    // The blob line left out: refused at the first run, nothing written.
    let fresh = Env::new();
    let file = fresh.path().join("dangling.jsonl");
    std::fs::write(&file, format!("{}\n{}\n", lines[1], lines[2]))?;
    let out = fresh.run(&["import", file.to_str().ok_or("path")?]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("line 1"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not carry it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        code(&fresh.run(&["show", "r1"])),
        2,
        "a dangling run was written"
    );
    // Nowhere to keep the blobs (TMPDIR names no directory): a failure,
    // exit 1, that says why, not a usage error; nothing of the run written.
    let nowhere = Env::new();
    let out = nowhere
        .cmd(&["import", file_of(&other)?.as_str()])
        .env("TMPDIR", nowhere.path().join("no-such-dir"))
        .output()?;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let says = stderr(&out);
    assert!(
        says.contains("could not be kept in a temporary file") && says.contains("run \"r1\""),
        "{says}"
    );
    assert_eq!(code(&nowhere.run(&["show", "r1"])), 2, "a run was written");
    Ok(())
}

/// The export file an earlier part of a test wrote into `env`.
fn file_of(env: &Env) -> Result<String, Box<dyn std::error::Error>> {
    Ok(env
        .path()
        .join("runs.jsonl")
        .to_str()
        .ok_or("path")?
        .to_string())
}

#[test]
fn export_import_and_copy_round_trip_and_refuse_damaged_lines() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    for id in ["r1", "r2", "r3"] {
        assert_eq!(code(&env.run(&["run", f, "--run-id", id])), 0);
    }
    assert_eq!(code(&env.run(&["rewind", "r2", "--to", "c"])), 0);
    let export = env.run(&["export"]);
    assert_eq!(code(&export), 0, "{}", stderr(&export));
    let text = String::from_utf8(export.stdout.clone())?;
    assert_eq!(text.lines().count(), 3);
    let one = env.run(&["export", "--run", "r2"]);
    assert_eq!(
        String::from_utf8(one.stdout)?,
        format!("{}\n", text.lines().nth(1).ok_or("line")?)
    );
    assert_eq!(code(&env.run(&["export", "--run", "nope"])), 2);

    // Into another store, twice: the second import keeps everything.
    let other = Env::new();
    let file = other.path().join("runs.jsonl");
    std::fs::write(&file, &text)?;
    let file_arg = file.to_str().ok_or("path")?;
    let out = other.run(&["import", file_arg]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("3 written"), "{}", stderr(&out));
    let out = other.run(&["import", file_arg]);
    assert!(stderr(&out).contains("3 already there"), "{}", stderr(&out));
    // The same run, whatever the layout of its rows ("stored" tells that).
    let shown = |e: &Env, id: &str| {
        let mut v = e.show(id);
        v.as_object_mut().map(|o| o.remove("stored"));
        v
    };
    for id in ["r1", "r2", "r3"] {
        assert_eq!(shown(&other, id), shown(&env, id), "run {id} differs");
    }
    let again = other.run(&["export"]);
    assert_eq!(
        String::from_utf8(again.stdout)?,
        text,
        "export → import → export changed"
    );

    // Damaged lines: exit 2 naming the line; the lines before it stay.
    let lines: Vec<&str> = text.lines().collect();
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{}\n{}\n", lines[0], lines[1].replace("\"a\":1", "\"a\":7")),
            "line 2",
        ),
        (
            format!("{}\n{}\n", lines[0], &lines[1][..lines[1].len() / 2]),
            "line 2",
        ),
        (
            format!("{}\n", lines[0].replace("\"format\":1", "\"format\":9")),
            "format 9",
        ),
        ("not json\n".to_string(), "line 1"),
    ];
    for (body, says) in cases {
        let fresh = Env::new();
        let p = fresh.path().join("bad.jsonl");
        std::fs::write(&p, body)?;
        let out = fresh.run(&["import", p.to_str().ok_or("path")?]);
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
        if says == "line 2" {
            // The good line before the bad one was imported.
            assert_eq!(fresh.show("r1")["status"], "completed");
        }
    }
    let fresh = Env::new();
    let p = fresh.path().join("bin.jsonl");
    std::fs::write(&p, [b'{', 0xff, b'}', b'\n'])?;
    let out = fresh.run(&["import", p.to_str().ok_or("path")?]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("not UTF-8"), "{}", stderr(&out));

    // copy: SQLite → file → SQLite, then again: everything kept.
    let to = format!("file:{}", env.path().join("copy.json").display());
    let back = format!("sqlite:{}", env.path().join("back.db").display());
    let store = env.store();
    for (from, into) in [(&store, &to), (&to, &back)] {
        let out = std::process::Command::new(support::BIN)
            .args(["copy", "--from", from, "--to", into])
            .output()?;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stderr(&out).contains("3 written"), "{}", stderr(&out));
    }
    let out = std::process::Command::new(support::BIN)
        .args(["copy", "--from", &store, "--to", &back])
        .output()?;
    assert!(stderr(&out).contains("3 already there"), "{}", stderr(&out));
    let missing = format!("sqlite:{}", env.path().join("none.db").display());
    let out = std::process::Command::new(support::BIN)
        .args(["copy", "--from", &missing, "--to", &back])
        .output()?;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    Ok(())
}

#[test]
fn prune_folds_history_and_keeps_show_resume_and_rewind() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    for id in ["r1", "r2"] {
        assert_eq!(code(&env.run(&["run", f, "--run-id", id])), 0);
    }
    let before = env.show("r1");
    let out = env.run(&["prune", "r1", "--keep-history", "1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 history row(s) deleted"),
        "{}",
        stderr(&out)
    );
    let after = env.show("r1");
    assert_eq!(after["state"], before["state"]);
    assert_eq!(after["status"], "completed");
    let steps: Vec<&Value> = after["steps_done"]
        .as_array()
        .ok_or("steps")?
        .iter()
        .collect();
    assert_eq!(steps.len(), 2, "{after}");
    let history = json_of(&env.run(&["history", "r1", "--json"]));
    // The folded row keeps the definition of the last folded step.
    assert_eq!(
        without_definition(&history[0]["update"]),
        json!({"a": 1, "b": 2}),
        "{history}"
    );
    // The kept step can be rewound to; a folded one cannot.
    let refused = env.run(&["rewind", "r1", "--to", "b"]);
    assert_eq!(code(&refused), 2);
    assert!(stderr(&refused).contains("pruned"), "{}", stderr(&refused));
    assert_eq!(code(&env.run(&["rewind", "r1", "--to", "c"])), 0);
    assert_eq!(code(&env.run(&["run", f, "--run-id", "r1"])), 0);
    assert_eq!(env.show("r1")["state"], before["state"]);
    let all = env.run(&["prune", "--all"]);
    assert_eq!(code(&all), 0, "{}", stderr(&all));
    assert!(stderr(&all).contains("2 run(s) pruned"), "{}", stderr(&all));
    assert_eq!(code(&env.run(&["prune"])), 2, "neither a run nor --all");
    Ok(())
}

#[test]
fn a_worker_stops_a_cancelled_run_and_takes_it_no_more() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"w\"\n[[step]]\nname = \"hang\"\nrun = \"sleep 60 & echo $! > bg.pid; sleep 60\"\n[[step]]\nname = \"after\"\nrun = \"touch after\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    assert_eq!(code(&env.run(&["start", f, "--run-id", "r"])), 0);
    let worker = env
        .cmd(&[
            "worker", f, "--poll", "50ms", "--lease", "600ms", "--grace", "300ms",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    wait_for(&env.path().join("bg.pid"))?;
    let out = env.run(&["cancel", "r", "--by", "ops"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let bg = std::fs::read_to_string(env.path().join("bg.pid"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_alive(&bg) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone = !pid_alive(&bg);
    // Time for the worker to look again: it must not take the run back.
    std::thread::sleep(Duration::from_millis(500));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status();
    let done = worker.wait_with_output()?;
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(
        gone,
        "the cancelled step's process outlived the grace: {err}"
    );
    assert_eq!(done.status.code(), Some(0), "{err}");
    assert!(err.contains("r  cancelled"), "{err}");
    assert!(
        err.contains("1 taken") && err.contains("1 cancelled"),
        "{err}"
    );
    assert!(
        !env.path().join("after").exists(),
        "a step after the cancel ran"
    );
    assert_eq!(env.show("r")["status"], "cancelled");
    Ok(())
}

/// Every input the operations take, at its extremes: each is a clear error
/// (exit 2, nothing written) or a correct result, never a panic or a hang.
#[test]
fn hostile_operation_inputs_are_clear_errors() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    assert_eq!(code(&env.run(&["run", f, "--run-id", "r"])), 0);
    assert_eq!(code(&env.run(&["start", f, "--run-id", "p"])), 0);
    let before = env.run(&["export"]).stdout;
    let huge = "x".repeat(70_000);
    let long_id = "i".repeat(300);
    for args in [
        vec!["cancel", "p", "--reason", huge.as_str()],
        vec!["cancel", "p", "--by", "a\nb"],
        vec!["cancel", "p", "--by", ""],
        vec!["rewind", "r", "--to", ""],
        vec!["rewind", "r", "--to", huge.as_str()],
        vec!["rewind", "r", "--to", "-1"],
        vec!["rewind", "r", "--to", "99999999999999999999999"],
        vec!["fork", "r", "--at", "b", "--as", long_id.as_str()],
        vec!["fork", "r", "--at", "b", "--as", "r"],
        vec!["gc", "--older-than", "-5s"],
        vec!["gc", "--older-than", "1s", "--batch", "99999999999"],
        vec!["gc", "--older-than", "1s", "--status", ""],
        vec!["prune", "r", "--keep-history", "-1"],
        vec!["runs", "--stuck-after", "1000y"],
        vec!["retry", long_id.as_str()],
    ] {
        let out = env.run(&args);
        assert_eq!(code(&out), 2, "{:?}: {}", &args[..2], stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    assert_eq!(
        env.run(&["export"]).stdout,
        before,
        "a refused operation wrote something"
    );
    // The largest keep is nothing to prune.
    let out = env.run(&["prune", "r", "--keep-history", "18446744073709551615"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // Import: damaged and extreme lines, a directory, an empty file.
    let good: Value = serde_json::from_slice(&env.run(&["export", "--run", "r"]).stdout)?;
    let record = good["record"].clone();
    let line = |r: Value| steadfast::transfer::line_for_fuzzing(r);
    let mut far_version = record.clone();
    far_version["run"]["version"] = json!(1u64 << 60);
    let mut far_time = record.clone();
    far_time["run"]["updated_at"] = json!("99999-01-01T00:00:00Z");
    let mut negative = record.clone();
    negative["run"]["next"] = json!(-1);
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let mut nested = record.clone();
    nested["run"]["state"]["a"] = deep;
    let other = Env::new();
    for (body, says) in [
        (line(far_version), "version"),
        (line(far_time), "line 1"),
        (line(negative), "line 1"),
        (line(nested), "line 1"),
        (format!("{}\n", "{".repeat(100_000)), "line 1"),
    ] {
        let p = other.path().join("bad.jsonl");
        std::fs::write(&p, body)?;
        let out = other.run(&["import", p.to_str().ok_or("path")?]);
        assert_eq!(code(&out), 2, "{says}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
    }
    let p = other.path().join("huge.jsonl");
    let mut file = std::fs::File::create(&p)?;
    std::io::Write::write_all(&mut file, &vec![b' '; 65 << 20])?;
    drop(file);
    let out = other.run(&["import", p.to_str().ok_or("path")?]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("over"), "{}", stderr(&out));
    std::fs::remove_file(&p)?;
    let out = other.run(&["import", other.path().to_str().ok_or("path")?]);
    assert_ne!(code(&out), 0, "a directory was imported");
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    let empty = other.path().join("empty.jsonl");
    std::fs::write(&empty, "")?;
    let out = other.run(&["import", empty.to_str().ok_or("path")?]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("0 written"), "{}", stderr(&out));

    // A copy of a store onto itself keeps everything.
    let store = env.store();
    let out = std::process::Command::new(support::BIN)
        .args(["copy", "--from", &store, "--to", &store])
        .output()?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("2 already there"), "{}", stderr(&out));
    assert_eq!(env.run(&["export"]).stdout, before);
    Ok(())
}

/// A collector that cannot be reached, or an endpoint that is no URL, costs
/// the run nothing: it completes, and says why no spans went out.
#[test]
fn a_bad_or_unreachable_collector_never_stops_a_run() -> TestResult {
    let env = Env::new();
    let f = env.flow("f.toml", LOGGED);
    let f = f.to_str().ok_or("path")?;
    for (i, endpoint) in ["http://127.0.0.1:1", "not a url at all", "http://[::1"]
        .iter()
        .enumerate()
    {
        let began = Instant::now();
        let out = env
            .cmd(&["run", f, "--run-id", &format!("o{i}")])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .output()?;
        assert_eq!(code(&out), 0, "{endpoint}: {}", stderr(&out));
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{endpoint}: the run hung"
        );
    }
    // A metrics address already taken is a usage error.
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let out = env.run(&["worker", f, "--metrics-addr", &addr]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--metrics-addr"), "{}", stderr(&out));
    Ok(())
}

/// A history row's update without the step's definition (`__step`), which
/// must be there.
fn without_definition(update: &Value) -> Value {
    let mut u = update.clone();
    let map = u.as_object_mut().expect("an update is an object");
    assert!(map.remove("__step").is_some(), "no __step in {update}");
    u
}
