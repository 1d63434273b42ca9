//! Large values by reference on the file store (format 3): one file per
//! content in `PATH.blobs`, removed when no run refers to it, damage
//! reported with its place, files written before blobs read back as
//! written.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use steadfast_conformance::fixtures::{doc, rereading_agent as agent};
use steadfast_core::{
    ops, run, update, Checkpoint, Store, StoreErrorKind, StoreExt as _, SystemClock, Workflow,
};
use steadfast_file::{FileStore, FileStoreOptions, OsFs};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A store (threshold 16 KiB) in a fresh directory, kept while it lives.
fn fresh() -> Result<(tempfile::TempDir, PathBuf, FileStore), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let store = open(&path)?;
    Ok((dir, path, store))
}

fn open(path: &Path) -> Result<FileStore, steadfast_core::StoreError> {
    FileStore::open_with(
        OsFs,
        path,
        FileStoreOptions::default().blob_threshold(16 << 10),
    )
}

/// The blob files beside the store file: (how many, their bytes).
/// The store's own blob totals: (blobs, bytes).
async fn totals(store: &FileStore) -> Result<(usize, u64), steadfast_core::StoreError> {
    let t = store.blob_totals().await?.expect("a store with blobs");
    Ok((t.blobs as usize, t.bytes))
}

fn blob_files(path: &Path) -> (usize, u64) {
    let dir = PathBuf::from(format!("{}.blobs", path.display()));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

#[tokio::test]
async fn a_value_is_stored_once_across_steps_and_runs_and_freed_with_its_last_run() -> TestResult {
    let (_dir, path, store) = fresh()?;
    for r in 0..3 {
        run(&format!("r{r}"), &agent(4, r), &store).await?;
    }
    let unique = 2 * (doc(0, 100).len() + 2) + 12 * (doc(1000, 20).len() + 2);
    assert_eq!(
        blob_files(&path),
        (2 + 3 * 4, unique as u64),
        "every content once"
    );
    let totals = store.blob_totals().await?.expect("a store with blobs");
    assert_eq!((totals.blobs, totals.bytes), (14, unique as u64));
    // The store file holds references, not the values.
    let file = std::fs::metadata(&path)?.len();
    assert!(file < 64 << 10, "the store file holds {file} bytes");
    let usage = store.usage("r1").await?.expect("stored");
    assert_eq!(usage.blobs, 6);
    assert_eq!(usage.shared_bytes, 2 * (doc(0, 100).len() as u64 + 2));

    let cp = store.load("r1").await?.expect("stored");
    assert_eq!(cp.state["shared0"], json!(doc(0, 100)));
    assert_eq!(cp.state["own3"], json!(doc(1000 + 100 + 3, 20)));
    let history = store.history("r1").await?.expect("stored");
    assert_eq!(history[2].update["shared0"], json!(doc(0, 100)));
    assert_eq!(history[2].update["own2"], json!(doc(1000 + 100 + 2, 20)));

    assert!(store.delete("r0").await?);
    assert_eq!(blob_files(&path).0, 2 + 2 * 4);
    assert!(store.delete("r1").await?);
    assert_eq!(blob_files(&path).0, 2 + 4);
    assert_eq!(
        store.load("r2").await?.expect("stored").state["shared1"],
        json!(doc(1, 100))
    );
    assert!(store.delete("r2").await?);
    assert_eq!(blob_files(&path), (0, 0), "nothing left behind");
    Ok(())
}

#[tokio::test]
async fn prune_and_rewind_free_the_values_only_dropped_rows_held() -> TestResult {
    let (_dir, path, store) = fresh()?;
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(blob_files(&path).0, 2 + 6);
    ops::rewind(&store, "r", "s4", "test", &SystemClock).await?;
    assert_eq!(blob_files(&path).0, 2 + 4);
    ops::prune(&store, "r", 1, "test", &SystemClock).await?;
    let cp = store.load("r").await?.expect("stored");
    for i in 0..4 {
        assert_eq!(cp.state[&format!("own{i}")], json!(doc(1000 + i, 20)));
    }
    assert_eq!(blob_files(&path).0, 2 + 4);
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(blob_files(&path).0, 2 + 6);
    Ok(())
}

#[tokio::test]
async fn a_damaged_or_missing_blob_is_corrupt_with_its_place() -> TestResult {
    let (_dir, path, store) = fresh()?;
    run("r", &agent(2, 0), &store).await?;
    let blobs = PathBuf::from(format!("{}.blobs", path.display()));
    let first = std::fs::read_dir(&blobs)?
        .next()
        .ok_or("no blob file")??
        .path();
    let mut bytes = std::fs::read(&first)?;
    bytes[3] ^= 1;
    std::fs::write(&first, &bytes)?;
    let err = store.load("r").await.expect_err("a damaged blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("run \"r\""), "{err}");
    // A blob file longer than its reference says is refused without being
    // read whole.
    bytes.extend_from_slice(&[b' '; 4096]);
    std::fs::write(&first, &bytes)?;
    let err = store.load("r").await.expect_err("a longer blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    std::fs::remove_dir_all(&blobs)?;
    let err = store.load("r").await.expect_err("a missing blob loaded");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("not in the store"), "{err}");
    let err = store
        .history("r")
        .await
        .expect_err("history of a missing blob");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    Ok(())
}

#[tokio::test]
async fn a_file_written_before_blobs_reads_back_and_older_builds_refuse_the_new_one() -> TestResult
{
    let (_dir, path, store) = fresh()?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"plain": 1})) })
        .build()?;
    run("r", &wf, &store).await?;
    // As a build before blobs wrote it: format 2, a value that looks like
    // a reference, not escaped.
    let mut file: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(
        file["format"],
        json!(2),
        "no blobs: still readable by older builds"
    );
    let fake = json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
    file["runs"]["r"]["state"]["fake"] = fake.clone();
    file["history"]["r"][0]["update"]["fake"] = fake.clone();
    std::fs::write(&path, serde_json::to_vec_pretty(&file)?)?;
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["fake"], fake);
    assert_eq!(
        store.history("r").await?.expect("stored")[0].update["fake"],
        fake
    );
    // Written again, with the value escaped: format 3, which older builds
    // refuse rather than take an escape or a reference for a value.
    run("r2", &wf, &store).await?;
    let file: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(file["format"], json!(3));
    assert_eq!(store.load("r").await?.expect("stored").state["fake"], fake);
    Ok(())
}

#[tokio::test]
async fn a_value_over_the_record_limits_round_trips_as_a_blob() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    // Defaults: 16 MiB for a state, 64 MiB for the file.
    let store = FileStore::open(&path)?;
    let big = "z".repeat(17 << 20);
    let value = big.clone();
    let wf = Workflow::builder("w")
        .step("a", move |_, _| {
            let value = value.clone();
            async move { update(json!({ "big": value })) }
        })
        .step("b", |_, _| async { update(json!({"after": 1})) })
        .build()?;
    run("r", &wf, &store).await?;
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.state["big"], Value::String(big));
    assert_eq!(
        blob_files(&path).0,
        1,
        "stored once, for the state and the step"
    );
    Ok(())
}

#[tokio::test]
async fn the_threshold_is_set_in_the_url_and_checked() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let url = format!("{}?blob_threshold=1KiB", path.display());
    let store = steadfast_file::open_url(&url, true)?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"v": "x".repeat(2000)})) })
        .build()?;
    run("r", &wf, &*store).await?;
    assert_eq!(blob_files(&path).0, 1, "a 2 KB value is a blob at 1 KiB");
    for bad in ["?blob_threshold=1", "?blob_threshold=2GiB", "?blobs=1", "?"] {
        let Err(err) = steadfast_file::open_url(&format!("{}{bad}", path.display()), true) else {
            panic!("{bad} was taken");
        };
        assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{bad}: {err}");
    }
    Ok(())
}

/// A reader in another handle (another process, as far as the file is
/// concerned) meets a run being rewritten and deleted: it sees the run
/// whole or not at all, never a blob missing under a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_racing_a_writer_never_sees_a_missing_blob() -> TestResult {
    let (_dir, path, writer) = fresh()?;
    let reader = open(&path)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let reads = tokio::spawn(async move {
        let mut seen = 0;
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(cp) = reader.load("r").await? {
                assert_eq!(cp.state["shared0"], json!(doc(0, 100)));
                seen += 1;
            }
        }
        Ok::<_, steadfast_core::StoreError>(seen)
    });
    for round in 0..20 {
        run("r", &agent(2, round), &writer).await?;
        assert!(writer.delete("r").await?);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reads.await??;
    eprintln!("the reader saw the run {seen} times");
    assert!(seen > 0, "the reader never met the run");
    Ok(())
}

/// Planted things where blobs belong: a symbolic link in place of the blob
/// directory is refused when the store opens (nothing is written through
/// it); a directory in place of a blob file makes the load an error that
/// names it, never a hang or a panic, and the record stays readable once
/// the blob is back.
#[tokio::test]
async fn planted_links_and_directories_where_blobs_belong_are_refused() -> TestResult {
    let (dir, path, store) = fresh()?;
    run("r", &agent(1, 0), &store).await?;
    let blobs = PathBuf::from(format!("{}.blobs", path.display()));
    // A directory under a blob's name.
    let victim = std::fs::read_dir(&blobs)?
        .next()
        .ok_or("no blob file")??
        .path();
    let saved = std::fs::read(&victim)?;
    std::fs::remove_file(&victim)?;
    std::fs::create_dir(&victim)?;
    let err = store
        .load("r")
        .await
        .expect_err("a directory read as a blob");
    assert!(
        err.to_string().contains(&victim.display().to_string()),
        "{err}"
    );
    // Nor does a link under a blob's name count as one: the totals hold
    // the regular files only, and say so without an error.
    let (before, _) = totals(&store).await?;
    let link = blobs.join("ab".repeat(32));
    std::os::unix::fs::symlink(&path, &link)?;
    assert_eq!(
        totals(&store).await?.0,
        before,
        "a link or directory counted"
    );
    std::fs::remove_file(&link)?;
    std::fs::remove_dir(&victim)?;
    std::fs::write(&victim, &saved)?;
    assert!(store.load("r").await?.is_some());
    drop(store);
    // The blob directory replaced by a link to another directory.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(&blobs, &elsewhere)?;
    std::os::unix::fs::symlink(&elsewhere, &blobs)?;
    let err = open(&path).expect_err("a linked blob directory was taken");
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    Ok(())
}

#[tokio::test]
async fn files_in_the_blob_directory_that_are_not_blobs_survive_the_sweep() -> TestResult {
    let (_dir, path, store) = fresh()?;
    run("r0", &agent(2, 0), &store).await?;
    let blobs = PathBuf::from(format!("{}.blobs", path.display()));
    let stored = blob_files(&path).0;
    // Names a blob could never have: upper case, a digit short, 64 bytes
    // that are not hex digits (two-byte characters), a prefix, and a file
    // of someone else's. A blob's own name no run refers to goes.
    let hex = "ab".repeat(32);
    let planted = [
        hex.to_uppercase(),
        hex[1..].to_string(),
        "é".repeat(32),
        format!("sha256:{hex}"),
        "notes.txt".to_string(),
    ];
    for name in &planted {
        std::fs::write(blobs.join(name), b"not a blob")?;
    }
    std::fs::write(blobs.join(&hex), b"\"orphan\"")?;
    assert!(store.delete("r0").await?);
    for name in &planted {
        assert!(blobs.join(name).exists(), "{name} was removed");
    }
    assert!(!blobs.join(&hex).exists(), "an unreferenced blob stayed");
    assert!(stored > 0);
    Ok(())
}

/// A save that completes the step after the stored one is written as the
/// stored state with the step's update over it; one whose step the stored
/// record does not lead to (here the record skips a step) writes the
/// state it carries, whole. Both read back as saved, large values
/// included, and the blobs left are those the file refers to.
#[tokio::test]
async fn a_save_after_the_stored_step_and_one_that_skips_a_step_both_read_back() -> TestResult {
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, StepRecord, Timestamp};
    let (_dir, path, store) = fresh()?;
    let t = Timestamp::from_unix_millis(1_000);
    let obj = |v: Value| v.as_object().cloned().unwrap_or_default();
    let big = |c: &str| c.repeat(20 << 10);

    let mut cp = Checkpoint::new("r", "w", t);
    cp.state = obj(json!({"a": big("a"), "n": 0}));
    let v1 = store.save(SaveRequest::new(&cp, None)).await?;

    // Step 0, after the stored record's none: the update over the state.
    let s0 = StepRecord::new(0, "s0", obj(json!({"b": big("b"), "n": 1})), 1, t, t);
    cp.next = 1;
    cp.completed = vec!["s0".into()];
    steadfast_core::merge(&mut cp.state, s0.update.clone());
    let v2 = store
        .save(SaveRequest::new(&cp, Some(v1)).with_step(&s0))
        .await?;
    let got = store.load("r").await?.expect("stored");
    assert_eq!((got.version, got.next, &got.state), (v2, 1, &cp.state));

    // Step 2, though the stored record has one step: not the stored state
    // with the update over it ("a" gone, "c" given), but the state given.
    let s2 = StepRecord::new(2, "s2", obj(json!({"d": big("d")})), 1, t, t);
    cp.next = 3;
    cp.completed = vec!["s0".into(), "s1".into(), "s2".into()];
    cp.state = obj(json!({"b": big("b"), "c": big("c"), "d": big("d"), "n": 3}));
    let v3 = store
        .save(SaveRequest::new(&cp, Some(v2)).with_step(&s2))
        .await?;
    let got = store.load("r").await?.expect("stored");
    assert_eq!((got.version, got.next, &got.state), (v3, 3, &cp.state));
    let history = store.history("r").await?.expect("a store with history");
    let indices: Vec<_> = history.iter().map(|s| s.index).collect();
    assert_eq!(indices, [0, 2]);
    // "a" is no longer referred to; b, c and d are.
    assert_eq!(blob_files(&path).0, 3);

    // A stale save conflicts and writes nothing.
    let err = store
        .save(SaveRequest::new(&cp, Some(v2)).with_step(&s2))
        .await
        .unwrap_err();
    assert!(
        matches!(err, steadfast_core::StoreError::Conflict { .. }),
        "{err}"
    );
    assert_eq!(store.load("r").await?.map(|c| c.version), Some(v3));
    Ok(())
}

/// Values a handle with a higher threshold stored in full are written as
/// blobs at the next step's save by a handle with a lower one (that save
/// writes the whole state, as every save did before), and the run reads
/// back the same through either.
#[tokio::test]
async fn values_stored_in_full_under_a_higher_threshold_become_blobs_at_the_next_step() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let with = |threshold: u64| {
        FileStore::open_with(
            OsFs,
            &path,
            FileStoreOptions::default().blob_threshold(threshold),
        )
    };
    let wf = Workflow::builder("w")
        .step("a", |_, _| async {
            update(json!({"a": "a".repeat(20 << 10)}))
        })
        .step("b", |_, _| async {
            update(json!({"b": "b".repeat(20 << 10)}))
        })
        .step("c", |_, _| async {
            update(json!({"c": "c".repeat(20 << 10)}))
        })
        .build()?;
    let high = with(1 << 20)?;
    let mut cp = Checkpoint::new("r", "w", steadfast_core::Timestamp::from_unix_millis(0));
    cp.state = json!({"big": "z".repeat(20 << 10)})
        .as_object()
        .cloned()
        .unwrap_or_default();
    high.save(steadfast_core::store::SaveRequest::new(&cp, None))
        .await?;
    assert_eq!(blob_files(&path).0, 0, "everything in full at 1 MiB");

    let low = with(16 << 10)?;
    run("r", &wf, &low).await?;
    let got = low.load("r").await?.expect("stored");
    assert_eq!(got.state["big"], json!("z".repeat(20 << 10)));
    assert_eq!(got.state["c"], json!("c".repeat(20 << 10)));
    assert_eq!(high.load("r").await?, Some(got));
    // big, a, b and c, each once.
    assert_eq!(blob_files(&path).0, 4);
    let file = std::fs::read_to_string(&path)?;
    assert!(!file.contains(&"z".repeat(100)), "big is a blob now");
    Ok(())
}

/// A step that overwrites a large value with a small one leaves the blob
/// its history row still refers to; a rewind that drops that row frees it
/// at once, through the handle that keeps its image of the file.
#[tokio::test]
async fn a_value_overwritten_stays_while_a_row_holds_it_and_goes_with_the_row() -> TestResult {
    let (_dir, path, store) = fresh()?;
    let big = doc(7, 40);
    let wf = {
        let big = big.clone();
        Workflow::builder("overwrite")
            .push(steadfast_core::Step::new("a", move |_, _| {
                let big = big.clone();
                async move { update(json!({ "doc": big })) }
            }))
            .push(steadfast_core::Step::new("b", |_, _| async {
                update(json!({ "doc": "small" }))
            }))
            .build()?
    };
    run("r", &wf, &store).await?;
    assert_eq!(blob_files(&path).0, 1, "the row of step a holds the value");
    let history = store.history("r").await?.expect("stored");
    assert_eq!(history[0].update["doc"], json!(big));
    assert_eq!(
        store.load("r").await?.expect("stored").state["doc"],
        json!("small")
    );
    ops::rewind(&store, "r", "a", "test", &SystemClock).await?;
    assert_eq!(blob_files(&path), (0, 0), "no row refers to it any more");
    Ok(())
}

/// A blob file no run refers to, left in the directory while a handle
/// keeps its image of the file (as a writer that died between a blob and
/// its record leaves one), is gone within 32 writes of that handle,
/// though none of them drops a reference.
#[tokio::test]
async fn a_leftover_blob_goes_within_32_writes_that_drop_nothing() -> TestResult {
    use steadfast_core::store::SaveRequest;
    let (_dir, path, store) = fresh()?;
    run("r0", &agent(2, 0), &store).await?;
    let stored = blob_files(&path).0;
    let orphan = PathBuf::from(format!("{}.blobs", path.display())).join("cd".repeat(32));
    std::fs::write(&orphan, b"\"orphan\"")?;
    // The store's totals count it while it is there (files on disk).
    let (blobs, bytes) = totals(&store).await?;
    assert_eq!(blobs, stored + 1, "the leftover counts while it is there");
    assert_eq!(bytes, blob_files(&path).1);
    // Each save below is one write, of a run with no large value.
    let mut cp = Checkpoint::new("w", "one", steadfast_core::Timestamp::from_unix_millis(0));
    let (mut version, mut writes) = (None, 0);
    while orphan.exists() {
        assert!(writes < 32, "the leftover outlived {writes} writes");
        cp.state.insert("n".into(), json!(writes));
        version = Some(store.save(SaveRequest::new(&cp, version)).await?);
        writes += 1;
    }
    assert_eq!(blob_files(&path).0, stored, "the runs' own blobs stay");
    assert_eq!(totals(&store).await?, blob_files(&path));
    let cp = store.load("r0").await?.expect("stored");
    assert_eq!(cp.state["shared1"], json!(doc(1, 100)));
    Ok(())
}

/// A save whose step the record's rows do not take (its index is not
/// below the record's `next`) writes the step's large value, which the
/// file then does not refer to: it is removed at once.
#[tokio::test]
async fn a_blob_written_for_a_step_the_rows_do_not_take_is_removed_at_once() -> TestResult {
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{StepRecord, Timestamp};
    let (_dir, path, store) = fresh()?;
    run("r0", &agent(2, 0), &store).await?;
    let stored = blob_files(&path).0;
    let t = Timestamp::from_unix_millis(1_000);
    let cp = Checkpoint::new("x", "w", t);
    let update = json!({"big": doc(9, 40)})
        .as_object()
        .cloned()
        .unwrap_or_default();
    let step = StepRecord::new(0, "a", update, 1, t, t);
    store
        .save(SaveRequest::new(&cp, None).with_step(&step))
        .await?;
    assert_eq!(store.history("x").await?.unwrap_or_default().len(), 0);
    assert_eq!(
        blob_files(&path).0,
        stored,
        "the step's value was left behind"
    );
    Ok(())
}

/// A decision whose data is over the threshold is a blob, and its run a
/// record of checkpoint format 2 in a file of format 7, which builds before
/// it (format 6) refuse rather than show the reference as the data; small
/// data leaves the file at the format it had. A damaged reference in a
/// decision is reported at the decision.
#[tokio::test]
async fn large_decision_data_is_a_blob_in_a_file_of_format_7() -> TestResult {
    use steadfast_core::{approve, Outcome, Step};
    assert_eq!(steadfast_file::FILE_FORMAT, 7);
    let (_dir, path, store) = fresh()?;
    let format_of = |path: &Path| -> Result<Value, Box<dyn std::error::Error>> {
        let v: Value = serde_json::from_slice(&std::fs::read(path)?)?;
        Ok(v["format"].clone())
    };
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .push(Step::gate("g"))
        .build()?;
    assert_eq!(
        run("small", &wf, &store).await?,
        Outcome::Waiting { gate: "g".into() }
    );
    approve(
        &store,
        "small",
        "g",
        Some(json!({"ok": 1})),
        "ada",
        &SystemClock,
    )
    .await?;
    assert!(
        format_of(&path)?.as_u64() < Some(7),
        "{}",
        format_of(&path)?
    );
    run("big", &wf, &store).await?;
    let data = json!({"draft": "d".repeat(40 << 10)});
    approve(&store, "big", "g", Some(data.clone()), "ada", &SystemClock).await?;
    assert_eq!(format_of(&path)?, json!(7));
    assert_eq!(blob_files(&path).0, 1);
    let file: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(file["runs"]["big"]["format"], json!(2));
    let stored = &file["runs"]["big"]["decisions"][0]["data"];
    assert!(
        stored["$blob"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{stored}"
    );
    let cp = store.load("big").await?.expect("stored");
    assert_eq!((cp.format, cp.decisions[0].data.as_ref()), (1, Some(&data)));
    run("big", &wf, &store).await?;
    assert_eq!(
        blob_files(&path).0,
        1,
        "the state's copy is the same content"
    );
    // A reference damaged by hand is reported where it is.
    let mut file: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    file["runs"]["big"]["decisions"][0]["data"]["$blob"] = json!(42);
    std::fs::write(&path, serde_json::to_vec(&file)?)?;
    let err = open(&path)?.load("big").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("decisions"), "{err}");
    Ok(())
}

/// The operating system's file system, counting the syncs of the blob
/// directory.
#[derive(Clone, Default)]
struct CountingFs {
    blob_dir_syncs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl steadfast_file::Fs for CountingFs {
    fn resolve(&self, path: &Path, create: bool) -> Result<PathBuf, steadfast_core::StoreError> {
        OsFs.resolve(path, create)
    }
    fn read(&self, path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
        OsFs.read(path, limit)
    }
    fn write_new(
        &self,
        path: &Path,
        data: &[u8],
        sync: bool,
    ) -> Result<(), steadfast_file::WriteError> {
        OsFs.write_new(path, data, sync)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        OsFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        if dir.extension().is_some_and(|e| e == "blobs") {
            self.blob_dir_syncs
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        OsFs.sync_dir(dir)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        OsFs.remove_file(path)
    }
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        OsFs.list_dir(dir)
    }
    fn lock(
        &self,
        path: &Path,
        timeout: std::time::Duration,
    ) -> std::io::Result<steadfast_file::LockGuard> {
        OsFs.lock(path, timeout)
    }
}

/// A run whose decision carries a large value writes its blob once: the
/// saves after it (the gate's, the steps after it) neither write it again
/// nor sync the blob directory for it.
#[tokio::test]
async fn a_decisions_blob_is_written_once_not_with_every_save() -> TestResult {
    use std::sync::atomic::Ordering;
    use steadfast_core::{approve, Step};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.json");
    let fs = CountingFs::default();
    let store = FileStore::open_with(
        fs.clone(),
        &path,
        FileStoreOptions::default().blob_threshold(16 << 10),
    )?;
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .push(Step::gate("g"))
        .step("c", |_, _| async { update(json!({"c": 1})) })
        .step("d", |_, _| async { update(json!({"d": 1})) })
        .step("e", |_, _| async { update(json!({"e": 1})) })
        .build()?;
    run("r", &wf, &store).await?;
    let data = json!({"draft": "d".repeat(40 << 10)});
    approve(&store, "r", "g", Some(data.clone()), "ada", &SystemClock).await?;
    let after_approval = fs.blob_dir_syncs.load(Ordering::SeqCst);
    assert!(after_approval >= 1, "the approval synced no blob directory");
    run("r", &wf, &store).await?;
    assert_eq!(
        fs.blob_dir_syncs.load(Ordering::SeqCst),
        after_approval,
        "the saves after the approval synced the blob directory again"
    );
    let cp = store.load("r").await?.expect("stored");
    assert_eq!(cp.decisions[0].data.as_ref(), Some(&data));
    assert_eq!(cp.state["g"], data);
    assert_eq!(blob_files(&path).0, 1);
    Ok(())
}
