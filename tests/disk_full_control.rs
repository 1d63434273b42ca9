//! A full disk under the library, with its negative control: on a small
//! tmpfs in a private mount namespace (a child test process under
//! `unshare --mount`; root only, like CI), a file-store run grows until a save
//! fails for want of space. Every step the run loop reported done must still
//! load afterwards. With the `ignore_write_errors` mutant (the store renames
//! a torn temp file over the good one instead of failing), acknowledged steps
//! are lost, and the check must say so.

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use steadfast::file::{FileStore, FileStoreOptions, OsFs};
use steadfast::{update, Event, Runner, Store, Workflow};
use support::{role, runtime};

const STEPS: usize = 40;

/// In the child: grow a run until the disk is full, then reopen the store
/// and print how many steps were acknowledged and how many load back.
fn child(mutant: bool) {
    let path = std::path::Path::new(&std::env::var("D").expect("D")).join("runs.json");
    let mut opts = FileStoreOptions::default();
    opts.mutants.ignore_write_errors = mutant;
    let store = FileStore::open_with(OsFs, &path, opts).expect("open");
    let mut builder = Workflow::builder("grow");
    for i in 0..STEPS {
        builder = builder.step(format!("s{i}"), move |_, _| async move {
            update(json!({ format!("s{i}"): "x".repeat(20_000) }))
        });
    }
    let wf = builder.build().unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let a = Arc::clone(&acked);
    let result = runtime().block_on(
        Runner::new(&store)
            .observer(move |e| {
                if matches!(e, Event::Completed { .. }) {
                    a.fetch_add(1, Ordering::SeqCst);
                }
            })
            .run("r", &wf),
    );
    let failed = result.is_err();
    let reopened = FileStore::open_with(OsFs, &path, FileStoreOptions::default())
        .map_err(|e| e.to_string())
        .and_then(|s| runtime().block_on(s.load("r")).map_err(|e| e.to_string()));
    let stored = match reopened {
        Ok(Some(cp)) => cp.next.to_string(),
        Ok(None) => "0".into(),
        Err(e) => format!("unreadable ({e})"),
    };
    println!(
        "RESULT failed={failed} acked={} stored={stored}",
        acked.load(Ordering::SeqCst)
    );
}

/// Runs the child in a namespace with a 160 KiB tmpfs; returns (whether the
/// run failed, steps acknowledged, what loads back).
fn in_namespace(test: &str, mutant: bool) -> Option<(bool, usize, String)> {
    if !nix_is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this test as root"
        );
        eprintln!("skipped: mounting a tmpfs in a private namespace needs root");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=160k,mode=0700 steadfast-test \"$D\" && exec \"$0\" --exact \"$1\" --nocapture --test-threads=1")
        .arg(std::env::current_exe().unwrap())
        .arg(test)
        .env("STEADFAST_TEST_ROLE", "disk-full-child")
        .env("MUTANT", if mutant { "1" } else { "0" })
        .env("D", dir.path())
        .output()
        .expect("unshare");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no result: {text}{}", String::from_utf8_lossy(&out.stderr)))
        .to_string();
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    let stored = line
        .split_once("stored=")
        .map(|(_, s)| s.to_string())
        .unwrap_or_default();
    Some((
        field("failed") == "true",
        field("acked").parse().unwrap(),
        stored,
    ))
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

#[test]
fn a_full_disk_under_the_file_store_loses_no_acknowledged_step() {
    if role().as_deref() == Some("disk-full-child") {
        return child(std::env::var("MUTANT").as_deref() == Ok("1"));
    }
    let Some((failed, acked, stored)) = in_namespace(
        "a_full_disk_under_the_file_store_loses_no_acknowledged_step",
        false,
    ) else {
        return;
    };
    assert!(failed, "the disk never filled ({acked} steps acknowledged)");
    assert!(acked >= 1, "nothing was saved before the disk filled");
    assert_eq!(
        stored,
        acked.to_string(),
        "acknowledged {acked}, loads back {stored}"
    );
}

/// Negative control: ignoring the failed write loses acknowledged steps.
#[test]
fn control_ignoring_write_errors_loses_acknowledged_steps() {
    if role().as_deref() == Some("disk-full-child") {
        return child(std::env::var("MUTANT").as_deref() == Ok("1"));
    }
    let Some((_, acked, stored)) = in_namespace(
        "control_ignoring_write_errors_loses_acknowledged_steps",
        true,
    ) else {
        return;
    };
    assert_ne!(
        stored,
        acked.to_string(),
        "the mutant kept every acknowledged step ({acked})"
    );
}
