//! Torn and corrupt store files: every one is reported as `Corrupt` with its
//! location, later saves are refused, and the file's bytes stay as they were.

use std::path::Path;

use serde_json::json;
use steadfast::file::{FileStore, FileStoreOptions, OsFs};
use steadfast::store::SaveRequest;
use steadfast::{run, update, Checkpoint, Store, StoreErrorKind, Timestamp, Workflow};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A valid store file holding three runs, as the file store writes it.
fn valid_file(dir: &Path) -> Vec<u8> {
    let path = dir.join("valid.json");
    let store = FileStore::open(&path).unwrap();
    let wf = Workflow::builder("three")
        .step("a", |_, _| async {
            update(json!({"a": "x\"y\\z\n", "n": [1, 2.5, null]}))
        })
        .step("b", |_, _| async {
            update(json!({"b": {"deep": {"er": true}}}))
        })
        .build()
        .unwrap();
    let rt = rt();
    for id in ["r1", "r2", "r3"] {
        rt.block_on(run(id, &wf, &store)).unwrap();
    }
    std::fs::read(&path).unwrap()
}

/// Writes `bytes` as a store file and checks everything a corrupt file must do.
/// Returns a description of the first violation.
fn check_reported_as_corrupt(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    opts: FileStoreOptions,
) -> Result<(), String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    let rt = rt();
    let store = FileStore::open_with(OsFs, &path, opts).map_err(|e| format!("open failed: {e}"))?;
    let expect_corrupt = |what: &str, r: Result<(), steadfast::StoreError>| -> Result<(), String> {
        match r {
            Err(e) if e.kind() == StoreErrorKind::Corrupt => {
                let text = e.to_string();
                if !text.contains(&path.display().to_string()) {
                    return Err(format!("{what}: the error does not name the file: {text}"));
                }
                Ok(())
            }
            other => Err(format!("{what} on {name}: expected Corrupt, got {other:?}")),
        }
    };
    expect_corrupt("load", rt.block_on(store.load("r1")).map(drop))?;
    expect_corrupt(
        "list",
        rt.block_on(store.list(&Default::default())).map(drop),
    )?;
    let cp = Checkpoint::new("new-run", "w", Timestamp::from_unix_millis(0));
    expect_corrupt(
        "save",
        rt.block_on(store.save(SaveRequest::new(&cp, None)))
            .map(drop),
    )?;
    expect_corrupt("delete", rt.block_on(store.delete("r1")).map(drop))?;
    let after = std::fs::read(&path).map_err(|e| e.to_string())?;
    if after != bytes {
        return Err(format!("{name}: the corrupt file was changed"));
    }
    let temps = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .count();
    if temps > 0 {
        return Err(format!("{name}: {temps} temp files left behind"));
    }
    Ok(())
}

#[test]
fn every_truncation_of_a_valid_file_is_corrupt_and_left_untouched() -> TestResult {
    let dir = tempfile::tempdir()?;
    let valid = valid_file(dir.path());
    assert!(
        valid.len() > 500,
        "the sample file is big enough to be interesting"
    );
    for cut in 0..valid.len() {
        check_reported_as_corrupt(
            dir.path(),
            "torn.json",
            &valid[..cut],
            FileStoreOptions::default(),
        )
        .map_err(|e| format!("truncated at byte {cut}: {e}"))?;
    }
    Ok(())
}

fn corpus(valid: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let text = String::from_utf8(valid.to_vec()).unwrap();
    let mut deep = String::new();
    for _ in 0..200 {
        deep.push('[');
    }
    for _ in 0..200 {
        deep.push(']');
    }
    let cp = |extra: &str| {
        format!(
            r#"{{"format":1,"runs":{{"r1":{{"format":1,"run_id":"r1","workflow":"w","status":"running","next":0,"completed":[],"state":{{}},"version":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"{extra}}}}}}}"#
        )
    };
    vec![
        ("empty", vec![]),
        ("zero-filled", vec![0; 4096]),
        ("whitespace", b"   \n".to_vec()),
        ("array", b"[]".to_vec()),
        ("empty object", b"{}".to_vec()),
        ("no runs", br#"{"format":1}"#.to_vec()),
        (
            "future format",
            format!(
                r#"{{"format":{},"runs":{{}}}}"#,
                steadfast::file::FILE_FORMAT + 1
            )
            .into_bytes(),
        ),
        (
            "history in a format-1 file",
            br#"{"format":1,"runs":{},"history":{"r":[]}}"#.to_vec(),
        ),
        (
            "history of a run named twice",
            br#"{"format":2,"runs":{},"history":{"r":[],"r":[]}}"#.to_vec(),
        ),
        (
            "history of a run that is not there",
            br#"{"format":2,"runs":{},"history":{"r":[]}}"#.to_vec(),
        ),
        (
            "documents in a file of format 4",
            br#"{"format":4,"runs":{},"documents":{"limit:a":{"value":{},"version":1}}}"#.to_vec(),
        ),
        (
            "a document of version 0",
            br#"{"format":5,"runs":{},"documents":{"limit:a":{"value":{},"version":0}}}"#.to_vec(),
        ),
        (
            "future format other shape",
            br#"{"format":9,"items":[1,2]}"#.to_vec(),
        ),
        (
            "unknown top-level key",
            br#"{"format":1,"runs":{},"extra":true}"#.to_vec(),
        ),
        ("runs is a list", br#"{"format":1,"runs":[]}"#.to_vec()),
        (
            "duplicate run",
            text.replacen("\"r2\": {", "\"r1\": {", 1).into_bytes(),
        ),
        (
            "NaN literal",
            cp("")
                .replace("\"state\":{}", "\"state\":{\"x\":NaN}")
                .into_bytes(),
        ),
        (
            "too deep",
            cp("")
                .replace("\"state\":{}", &format!("\"state\":{{\"x\":{deep}}}"))
                .into_bytes(),
        ),
        (
            "key differs from run id",
            cp("").replacen("\"r1\":", "\"r9\":", 1).into_bytes(),
        ),
        (
            "next disagrees",
            cp("").replace("\"next\":0", "\"next\":2").into_bytes(),
        ),
        (
            "version zero",
            cp("")
                .replace("\"version\":1", "\"version\":0")
                .into_bytes(),
        ),
        (
            "unknown status",
            cp("").replace("running", "paused").into_bytes(),
        ),
        (
            "bad timestamp",
            cp("")
                .replace("2026-01-01T00:00:00Z", "yesterday")
                .into_bytes(),
        ),
        (
            "checkpoint format from the future",
            cp("")
                .replacen("\"format\":1,\"run_id\"", "\"format\":2,\"run_id\"", 1)
                .into_bytes(),
        ),
        (
            "unknown checkpoint field",
            cp(",\"surprise\":1").into_bytes(),
        ),
        ("trailing garbage", [valid, b"}"].concat()),
        ("second document", [valid, b"\n{}"].concat()),
        (
            "byte order mark",
            [b"\xEF\xBB\xBF".as_slice(), valid].concat(),
        ),
        (
            "invalid utf-8",
            text.replacen("three", "th\u{FFFD}ee", 1)
                .replace('\u{FFFD}', "\u{1}")
                .into_bytes(),
        ),
        (
            "bit flip in a brace",
            text.replacen('{', "[", 2).into_bytes(),
        ),
    ]
}

#[test]
fn corrupt_corpus_is_reported_with_location_and_never_overwritten() -> TestResult {
    let dir = tempfile::tempdir()?;
    let valid = valid_file(dir.path());
    for (name, bytes) in corpus(&valid) {
        check_reported_as_corrupt(dir.path(), "bad.json", &bytes, FileStoreOptions::default())
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

#[test]
fn syntax_errors_carry_line_and_column() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    std::fs::write(
        &path,
        b"{\n  \"format\": 1,\n  \"runs\": {\n    \"r1\": trux\n  }\n}",
    )?;
    let store = FileStore::open(&path)?;
    let err = rt().block_on(store.load("r1")).unwrap_err().to_string();
    assert!(err.contains(&format!("{}:4:", path.display())), "{err}");
    Ok(())
}

#[test]
fn missing_file_is_an_empty_store_but_an_unreadable_one_is_an_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rt = rt();
    let store = FileStore::open(dir.path().join("absent.json"))?;
    assert!(rt.block_on(store.load("r"))?.is_none());
    // A directory where the file should be: reading fails with an I/O error,
    // which must not be mistaken for an empty store (even as root).
    // Opening refuses it outright ...
    let path = dir.path().join("runs.json");
    std::fs::create_dir(&path)?;
    let err = FileStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
    // ... and a directory that appears after opening is an error to read.
    std::fs::remove_dir(&path)?;
    let store = FileStore::open(&path)?;
    std::fs::create_dir(&path)?;
    let err = rt.block_on(store.load("r")).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    let cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(0));
    assert!(rt
        .block_on(store.save(SaveRequest::new(&cp, None)))
        .is_err());
    assert!(path.is_dir(), "nothing replaced the unreadable path");
    Ok(())
}

/// Negative control: a store that starts fresh on a corrupt file fails the check.
#[test]
fn control_fresh_start_on_corrupt_is_caught() -> TestResult {
    let dir = tempfile::tempdir()?;
    let valid = valid_file(dir.path());
    let mut opts = FileStoreOptions::default();
    opts.mutants.fresh_start_on_corrupt = true;
    let r = check_reported_as_corrupt(dir.path(), "torn.json", &valid[..valid.len() / 2], opts);
    assert!(r.is_err(), "the mutant passed the corruption check");
    Ok(())
}
