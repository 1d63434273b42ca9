//! File-store specifics beyond the conformance suite: modes, locks, leftovers, limits.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_core::store::SaveRequest;
use steadfast_core::{Checkpoint, Store, StoreError, StoreErrorKind, Timestamp};
use steadfast_file::{FileStore, FileStoreOptions, OsFs};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn cp(run_id: &str) -> Checkpoint {
    let mut cp = Checkpoint::new(run_id, "w", Timestamp::from_unix_millis(0));
    cp.state.insert("x".into(), json!(1));
    cp
}

fn mode(path: &std::path::Path) -> std::io::Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

#[tokio::test]
async fn files_are_private_and_a_missing_directory_is_created() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state/runs.json");
    let store = FileStore::open(&path)?;
    store.save(SaveRequest::new(&cp("r"), None)).await?;
    assert_eq!(mode(&path)?, 0o600, "store file");
    assert_eq!(
        mode(&dir.path().join("state/runs.json.lock"))?,
        0o600,
        "lock file"
    );
    assert_eq!(mode(&dir.path().join("state"))?, 0o700, "created directory");
    Ok(())
}

#[tokio::test]
async fn a_held_lock_times_out_with_an_error_naming_the_lock() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let opts = FileStoreOptions::default().lock_timeout(Duration::from_millis(200));
    let store = FileStore::open_with(OsFs, &path, opts)?;
    // Another open file description: its flock excludes ours as another
    // process's would.
    let holder = std::fs::File::create(dir.path().join("runs.json.lock"))?;
    holder.lock()?;
    let start = Instant::now();
    let err = store
        .save(SaveRequest::new(&cp("r"), None))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LockTimeout { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("runs.json.lock"), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(
        !path.exists(),
        "nothing was written while the lock was held"
    );
    holder.unlock()?;
    store.save(SaveRequest::new(&cp("r"), None)).await?;
    Ok(())
}

#[tokio::test]
async fn leftover_temp_files_are_removed_on_open_and_never_read() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    FileStore::open(&path)?
        .save(SaveRequest::new(&cp("r"), None))
        .await?;
    let leftover = dir.path().join(".runs.json.tmp-999-0000000000000001");
    std::fs::write(&leftover, b"{\"format\":1,\"runs\":{}}")?;
    let unrelated = dir.path().join("notes.txt");
    std::fs::write(&unrelated, b"keep me")?;
    let store = FileStore::open(&path)?;
    assert!(!leftover.exists(), "the leftover temp was swept");
    assert!(unrelated.exists(), "other files are left alone");
    assert!(store.load("r").await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_file_over_its_limit_is_refused_before_writing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let store = FileStore::open_with(
        OsFs,
        &path,
        FileStoreOptions::default().max_file_bytes(2_000),
    )?;
    store.save(SaveRequest::new(&cp("a"), None)).await?;
    let before = std::fs::read(&path)?;
    let mut n = 0;
    let err = loop {
        n += 1;
        match store
            .save(SaveRequest::new(&cp(&format!("run-{n}")), None))
            .await
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), StoreErrorKind::TooLarge, "{err}");
    assert!(err.to_string().contains("store file"), "{err}");
    assert!(std::fs::read(&path)?.len() <= 2_000);
    assert!(std::fs::read(&path)?.len() >= before.len());
    Ok(())
}

#[test]
fn a_path_without_a_file_name_is_refused() {
    let err = FileStore::open("/").unwrap_err();
    assert!(err.to_string().contains("no file name"), "{err}");
}

/// Finding 6: a store file is never read past its size limit; the error says
/// so and nothing is treated as empty.
#[tokio::test]
async fn a_file_past_its_limit_is_not_read() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    std::fs::write(&path, vec![b' '; 4096])?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let opts = FileStoreOptions::default().max_file_bytes(1024);
    let store = FileStore::open_with(OsFs, &path, opts)?;
    let err = store.load("r").await.unwrap_err();
    assert_eq!(
        err.kind(),
        steadfast_core::StoreErrorKind::TooLarge,
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("larger than the store's file limit"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&path)?.len(), 4096, "left alone");
    Ok(())
}

/// Event logs fill at most a quarter of the file's limit: appends beyond it
/// are refused, and checkpoints still have room.
#[tokio::test]
async fn events_never_crowd_checkpoints_out_of_the_file() -> TestResult {
    use steadfast_core::{Events, NewEvent};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let limit = 20_000;
    let store = FileStore::open_with(
        OsFs,
        &path,
        FileStoreOptions::default().max_file_bytes(limit),
    )?;
    store.save(SaveRequest::new(&cp("a"), None)).await?;
    let event = || {
        NewEvent::new(
            "s",
            1,
            Timestamp::from_unix_millis(1),
            json!("x".repeat(200)),
        )
    };
    let mut appended = 0;
    let err = loop {
        match store.append_events("a", &[event()]).await {
            Ok(_) => appended += 1,
            Err(e) => break e,
        }
        assert!(appended < 1_000, "appends were never refused");
    };
    assert_eq!(err.kind(), StoreErrorKind::TooLarge, "{err}");
    assert!(err.to_string().contains("event logs"), "{err}");
    assert!(appended > 0, "not one event fitted");
    // The events kept are all readable, and the refused one was not kept.
    assert_eq!(store.read_events("a", 0, 10_000).await?.len(), appended);
    // A quarter at most is events: runs still fit in the rest.
    assert!(std::fs::read(&path)?.len() as u64 <= limit / 2);
    for n in 0..10 {
        store
            .save(SaveRequest::new(&cp(&format!("run-{n}")), None))
            .await?;
    }
    Ok(())
}

/// A file holding a step's definition (`__step` in a history row) is
/// written as format 6, which builds before it refuse; one without (and
/// without a decision's data as a blob, format 7) stays at the older
/// format they read.
#[tokio::test]
async fn step_definitions_raise_the_file_format_to_6() -> TestResult {
    use steadfast_core::{run, update, Step, Workflow};
    let dir = tempfile::tempdir()?;
    let format_of = |path: &std::path::Path| -> Result<u64, Box<dyn std::error::Error>> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
        Ok(v["format"].as_u64().ok_or("no format")?)
    };
    let step = |version: Option<&str>| {
        let s = Step::new("a", |_, _| async { update(json!({"a": 1})) });
        match version {
            Some(v) => s.version(v),
            None => s,
        }
    };
    let plain = dir.path().join("plain.json");
    let store = FileStore::open(&plain)?;
    run("r", &Workflow::new("w", vec![step(None)])?, &store).await?;
    assert!(format_of(&plain)? < 6, "{}", format_of(&plain)?);
    let defined = dir.path().join("defined.json");
    let store = FileStore::open(&defined)?;
    run("r", &Workflow::new("w", vec![step(Some("2"))])?, &store).await?;
    assert_eq!(format_of(&defined)?, 6);
    Ok(())
}

/// A handle keeps the image of the file it wrote last and takes it when the
/// file holds those very bytes. Two handles on one file (as two processes)
/// writing in turn each see the other's writes: no run is lost, and a save
/// expecting a version the other handle replaced conflicts.
#[tokio::test]
async fn two_handles_writing_in_turn_each_see_the_others_writes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let a = FileStore::open(&path)?;
    let b = FileStore::open(&path)?;
    let v1 = a.save(SaveRequest::new(&cp("r"), None)).await?;
    a.save(SaveRequest::new(&cp("a1"), None)).await?;
    b.save(SaveRequest::new(&cp("b1"), None)).await?;
    a.save(SaveRequest::new(&cp("a2"), None)).await?;
    let mut changed = cp("r");
    changed.state.insert("x".into(), json!(2));
    let v2 = b.save(SaveRequest::new(&changed, Some(v1))).await?;
    a.save(SaveRequest::new(&cp("a3"), None)).await?;
    let err = a
        .save(SaveRequest::new(&cp("r"), Some(v1)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { found: Some(v), .. } if v == v2),
        "{err}"
    );
    for store in [&a, &b] {
        let ids: Vec<_> = store
            .list(&Default::default())
            .await?
            .into_iter()
            .map(|s| s.run_id)
            .collect();
        assert_eq!(ids, ["a1", "a2", "a3", "b1", "r"]);
        let r = store.load("r").await?.expect("stored");
        assert_eq!((r.version, &r.state["x"]), (v2, &json!(2)));
    }
    Ok(())
}

/// A write refused after its change was made (here the file would pass its
/// limit) leaves nothing of that change for the handle's next write: the
/// image it kept went with the refused write.
#[tokio::test]
async fn a_refused_write_leaves_nothing_for_the_next_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let store = FileStore::open_with(
        OsFs,
        &path,
        FileStoreOptions::default().max_file_bytes(4096),
    )?;
    store.save(SaveRequest::new(&cp("r"), None)).await?;
    let mut big = cp("big");
    big.state.insert("text".into(), json!("t".repeat(5_000)));
    let err = store.save(SaveRequest::new(&big, None)).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                what: "store file",
                ..
            }
        ),
        "{err}"
    );
    store.save(SaveRequest::new(&cp("s"), None)).await?;
    assert_eq!(store.load("big").await?, None);
    let file = std::fs::read_to_string(&path)?;
    assert!(
        !file.contains("big"),
        "the refused run was not written later"
    );
    assert!(file.contains("\"s\""));
    Ok(())
}

/// `OsFs::holds` says whether a file holds exactly some bytes, comparing a
/// piece at a time: the same bytes, a byte changed deep inside a file of
/// many pieces, a file longer or shorter, a missing file, a link and a
/// directory (refused, as a read refuses them).
#[test]
fn os_fs_holds_exactly_the_bytes_or_says_why_not() -> TestResult {
    use steadfast_file::Fs as _;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("f");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &bytes)?;
    assert!(OsFs.holds(&path, &bytes)?);
    let mut other = bytes.clone();
    other[200_001] ^= 1;
    assert!(!OsFs.holds(&path, &other)?);
    assert!(!OsFs.holds(&path, &bytes[..bytes.len() - 1])?);
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(!OsFs.holds(&path, &longer)?);
    assert_eq!(
        OsFs.holds(&dir.path().join("missing"), &bytes)
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link)?;
    assert!(OsFs.holds(&link, &bytes).is_err(), "a link is not followed");
    assert_eq!(
        OsFs.holds(dir.path(), b"").unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    Ok(())
}

/// A file that grows past the 8 MiB whose image a handle keeps, and shrinks
/// back under it, is written whole while it is large and kept again once it
/// is small; every write before, across and after reads back through a
/// fresh handle.
#[tokio::test]
async fn a_file_growing_past_the_kept_size_and_back_reads_back_whole() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let store = FileStore::open(&path)?;
    let v1 = store.save(SaveRequest::new(&cp("r1"), None)).await?;
    let mut big = cp("big");
    for i in 0..300 {
        big.state
            .insert(format!("k{i}"), json!("b".repeat(30 << 10)));
    }
    store.save(SaveRequest::new(&big, None)).await?;
    assert!(std::fs::metadata(&path)?.len() > 8 << 20);
    store.save(SaveRequest::new(&cp("r2"), None)).await?;
    assert!(store.delete("big").await?);
    assert!(std::fs::metadata(&path)?.len() < 8 << 20);
    store.save(SaveRequest::new(&cp("r3"), None)).await?;
    let mut changed = cp("r1");
    changed.state.insert("x".into(), json!(2));
    store.save(SaveRequest::new(&changed, Some(v1))).await?;
    let fresh = FileStore::open(&path)?;
    let ids: Vec<_> = fresh
        .list(&Default::default())
        .await?
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    assert_eq!(ids, ["r1", "r2", "r3"]);
    let r1 = fresh.load("r1").await?.expect("stored");
    assert_eq!(r1.state["x"], json!(2));
    Ok(())
}
