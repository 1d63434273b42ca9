//! Stores written by an earlier release (or an earlier format of this one)
//! open and resume with today's code.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use support::*;

/// Each directory holds one format's stores, written by the build named.
const FIXTURES: [&str; 2] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/release-0.1"),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/release-0.2-schema-3"
    ),
];

fn steadfast(dir: &Path, store: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .current_dir(dir)
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("run steadfast")
}

fn show(dir: &Path, store: &str, id: &str) -> Value {
    let out = steadfast(dir, store, &["show", id, "--json"]);
    assert_eq!(code(&out), 0, "{store} {id}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn stores_from_earlier_formats_open_and_resume_every_run() -> TestResult {
    for (fixtures, store) in FIXTURES
        .iter()
        .flat_map(|f| [(f, "sqlite:runs.db"), (f, "file:runs.json")])
    {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        for name in ["flow.toml", "slow.toml", "runs.db", "runs.json"] {
            std::fs::copy(Path::new(fixtures).join(name), dir.join(name))?;
            std::fs::set_permissions(
                dir.join(name),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )?;
        }
        let listed = steadfast(dir, store, &["runs", "--json"]);
        assert_eq!(code(&listed), 0, "{fixtures} {store}: {}", stderr(&listed));
        let runs: Value = serde_json::from_slice(&listed.stdout)?;
        assert_eq!(
            runs.as_array().map(Vec::len),
            Some(5),
            "{fixtures} {store}: {runs}"
        );

        let done = show(dir, store, "done");
        assert_eq!(done["status"], "completed");
        assert_eq!(done["state"]["big"], json!(18446744073709551615u64));
        assert_eq!(done["state"]["review"], json!({"note": "ok"}));
        assert_eq!(done["decisions"][0]["by"], "ada");

        let out = steadfast(dir, store, &["approve", "waiting", "review", "--by", "cy"]);
        assert_eq!(code(&out), 0, "{fixtures} {store}: {}", stderr(&out));
        let out = steadfast(dir, store, &["run", "flow.toml", "--run-id", "waiting"]);
        assert_eq!(code(&out), 0, "{fixtures} {store}: {}", stderr(&out));
        assert_eq!(show(dir, store, "waiting")["state"]["written"], true);

        let out = steadfast(dir, store, &["run", "flow.toml", "--run-id", "rejected"]);
        assert_eq!(code(&out), 5, "{fixtures} {store}: {}", stderr(&out));
        assert_eq!(
            show(dir, store, "rejected")["decisions"][0]["reason"],
            "not now"
        );

        std::fs::write(dir.join("ok.marker"), b"")?;
        let failed = show(dir, store, "failed");
        assert_eq!(failed["status"], "failed");
        let out = steadfast(dir, store, &["run", "flow.toml", "--run-id", "failed"]);
        assert_eq!(code(&out), 0, "{fixtures} {store}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("run     0"),
            "done steps are skipped"
        );

        // The lease of a process long dead (or of another host, long expired)
        // is taken over; only the unfinished step runs.
        let out = steadfast(dir, store, &["run", "slow.toml", "--run-id", "leased"]);
        assert_eq!(code(&out), 0, "{fixtures} {store}: {}", stderr(&out));
        let leased = show(dir, store, "leased");
        assert_eq!(leased["state"], json!({"first": 1, "second": 2}));
        assert!(leased["lease"].is_null());
    }
    Ok(())
}
