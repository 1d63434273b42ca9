//! Tampering, wrong keys, rotation and plaintext records: each is detected and
//! named, never loaded as a fresh or half-opened state.

use std::sync::Arc;

use serde_json::{json, Value};
use steadfast_core::store::SaveRequest;
use steadfast_core::StoreExt as _;
use steadfast_core::{
    approve, error_chain, run, update, Checkpoint, MemoryStore, Step, Store, StoreError,
    StoreErrorKind, SystemClock, Workflow,
};
use steadfast_seal::{is_sealed, Keyring, Rekeyed, SealedStore, SEAL_KEY};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";

fn keys(text: &str) -> Keyring {
    Keyring::parse(text).unwrap()
}

fn three_steps() -> Workflow {
    Workflow::builder("w")
        .step("a", |_, _| async {
            update(json!({"secret": "s-1", "n": 1}))
        })
        .step("b", |_, _| async { update(json!({"secret": "s-2"})) })
        .step("c", |_, _| async { update(json!({"n": 3})) })
        .build()
        .unwrap()
}

/// Writes `cp` into `raw` as it is, over the stored version.
async fn put_raw(raw: &MemoryStore, cp: &Checkpoint) {
    raw.save(SaveRequest::new(cp, Some(cp.version)))
        .await
        .unwrap();
}

fn corrupt_about(e: StoreError, run_id: &str) -> String {
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("{run_id:?}")),
        "the error names the run: {text}"
    );
    assert!(
        !text.contains(K1) && !text.contains(K2),
        "a key leaked: {text}"
    );
    text
}

#[tokio::test]
async fn stored_values_are_sealed_and_open_again() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let state = run("r", &three_steps(), &store).await?.completed().unwrap();
    assert_eq!(Value::Object(state), json!({"secret": "s-2", "n": 3}));
    let stored = raw.load("r").await?.unwrap();
    let text = serde_json::to_string(&stored)?;
    assert!(!text.contains("s-2") && !text.contains("s-1"), "{text}");
    assert!(stored.state.values().all(is_sealed));
    assert!(stored.state.contains_key(SEAL_KEY));
    // Run ids, workflow names and statuses stay in clear text.
    assert_eq!(stored.workflow, "w");
    assert_eq!(stored.status.as_str(), "completed");
    Ok(())
}

#[tokio::test]
async fn a_value_copied_from_another_run_is_detected() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    run("a", &three_steps(), &store).await?;
    run("b", &three_steps(), &store).await?;
    let a = raw.load("a").await?.unwrap();
    let mut b = raw.load("b").await?.unwrap();
    b.state.insert("secret".into(), a.state["secret"].clone());
    put_raw(&raw, &b).await;
    let text = corrupt_about(store.load("b").await.unwrap_err(), "b");
    assert!(text.contains("secret"), "{text}");
    // The whole state (with its seal) copied over is detected too.
    let mut b = raw.load("b").await?.unwrap();
    b.state = a.state.clone();
    put_raw(&raw, &b).await;
    corrupt_about(store.load("b").await.unwrap_err(), "b");
    Ok(())
}

#[tokio::test]
async fn a_value_rolled_back_to_an_older_ciphertext_is_detected() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let two = Workflow::builder("w")
        .step("a", |_, _| async {
            update(json!({"secret": "s-1", "n": 1}))
        })
        .push(Step::gate("g"))
        .step("b", |_, _| async { update(json!({"secret": "s-2"})) })
        .build()?;
    run("r", &two, &store).await?;
    let old = raw.load("r").await?.unwrap();
    approve(&store, "r", "g", None, "ada", &SystemClock).await?;
    run("r", &two, &store).await?;
    // One value rolled back.
    let mut now = raw.load("r").await?.unwrap();
    now.state
        .insert("secret".into(), old.state["secret"].clone());
    put_raw(&raw, &now).await;
    let text = corrupt_about(store.load("r").await.unwrap_err(), "r");
    assert!(text.contains("does not match its seal"), "{text}");
    // The whole older state, seal and all, under the newer head.
    let mut now = raw.load("r").await?.unwrap();
    now.state = old.state.clone();
    put_raw(&raw, &now).await;
    let text = corrupt_about(store.load("r").await.unwrap_err(), "r");
    assert!(text.contains("rolled back"), "{text}");
    Ok(())
}

#[tokio::test]
async fn a_flipped_bit_a_removed_value_and_an_added_one_are_detected() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    run("r", &three_steps(), &store).await?;
    let good = raw.load("r").await?.unwrap();

    let mut cp = good.clone();
    let mut text = cp.state["n"].as_str().unwrap().to_string();
    let last = text.pop().unwrap();
    text.push(if last == 'A' { 'B' } else { 'A' });
    cp.state.insert("n".into(), Value::String(text));
    put_raw(&raw, &cp).await;
    corrupt_about(store.load("r").await.unwrap_err(), "r");

    let mut cp = raw.load("r").await?.unwrap();
    cp.state = good.state.clone();
    cp.state.remove("n");
    put_raw(&raw, &cp).await;
    corrupt_about(store.load("r").await.unwrap_err(), "r");

    let mut cp = raw.load("r").await?.unwrap();
    cp.state = good.state.clone();
    cp.state.insert("extra".into(), good.state["n"].clone());
    put_raw(&raw, &cp).await;
    corrupt_about(store.load("r").await.unwrap_err(), "r");

    // A refused record is left as it was, by loads and by the run loop.
    let before = raw.load("r").await?.unwrap();
    assert!(store.load("r").await.is_err());
    assert!(run("r", &three_steps(), &store).await.is_err());
    assert_eq!(raw.load("r").await?.unwrap(), before);
    Ok(())
}

#[tokio::test]
async fn gate_data_is_sealed_and_bound_to_its_decision() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let wf = Workflow::builder("w")
        .push(Step::gate("g1"))
        .push(Step::gate("g2"))
        .build()?;
    run("r", &wf, &store).await?;
    approve(
        &store,
        "r",
        "g1",
        Some(json!({"pin": "1234"})),
        "ada",
        &SystemClock,
    )
    .await?;
    run("r", &wf, &store).await?;
    approve(
        &store,
        "r",
        "g2",
        Some(json!({"pin": "9999"})),
        "bob",
        &SystemClock,
    )
    .await?;
    let loaded = store.load("r").await?.unwrap();
    assert_eq!(loaded.decisions[0].data, Some(json!({"pin": "1234"})));
    let mut cp = raw.load("r").await?.unwrap();
    assert!(!serde_json::to_string(&cp)?.contains("1234"));
    // Swap the two decisions' data.
    let first = cp.decisions[0].data.clone();
    cp.decisions[0].data = cp.decisions[1].data.clone();
    cp.decisions[1].data = first;
    put_raw(&raw, &cp).await;
    let text = corrupt_about(store.load("r").await.unwrap_err(), "r");
    assert!(text.contains("gate"), "{text}");
    Ok(())
}

#[tokio::test]
async fn wrong_or_missing_keys_are_errors_that_never_show_a_key() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    run("r", &three_steps(), &store).await?;
    // Another key under the same id.
    let wrong = SealedStore::new(raw.clone(), keys(&format!("k1:{K2}")));
    let text = corrupt_about(wrong.load("r").await.unwrap_err(), "r");
    assert!(text.contains("does not open with key \"k1\""), "{text}");
    // No key of that id.
    let other = SealedStore::new(raw.clone(), keys(&format!("k2:{K2}")));
    let text = corrupt_about(other.load("r").await.unwrap_err(), "r");
    assert!(text.contains("not among the keys given (k2)"), "{text}");
    // A run loop on a wrongly keyed store stops with the error; the record stays.
    let before = raw.load("r").await?.unwrap();
    let err = run("r", &three_steps(), &wrong).await.unwrap_err();
    assert!(
        error_chain(&err).contains("does not open"),
        "{}",
        error_chain(&err)
    );
    assert_eq!(raw.load("r").await?.unwrap(), before);
    assert!(!format!("{wrong:?}").contains(K2));
    Ok(())
}

#[tokio::test]
async fn keys_rotate_and_rekey_rewrites_old_records() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let old = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    run("a", &three_steps(), &old).await?;
    run("b", &three_steps(), &old).await?;
    // k2 becomes current; k1 still opens the old records.
    let both = SealedStore::new(raw.clone(), keys(&format!("k2:{K2}\nk1:{K1}")));
    assert_eq!(both.load("a").await?.unwrap().state["secret"], json!("s-2"));
    let key_of = |cp: &Checkpoint| {
        cp.state["n"]
            .as_str()
            .unwrap()
            .split(':')
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(key_of(&raw.load("a").await?.unwrap()), "k1");
    assert_eq!(both.rekey("a").await?, Rekeyed::Rewritten);
    assert_eq!(key_of(&raw.load("a").await?.unwrap()), "k2");
    // Repeating is harmless, and the other run goes on from where it was.
    assert_eq!(both.rekey("a").await?, Rekeyed::Current);
    assert_eq!(both.rekey("b").await?, Rekeyed::Rewritten);
    assert_eq!(both.rekey("nope").await?, Rekeyed::Absent);
    // k1 retired: everything still opens.
    let new = SealedStore::new(raw.clone(), keys(&format!("k2:{K2}")));
    for id in ["a", "b"] {
        assert_eq!(new.load(id).await?.unwrap().state["n"], json!(3));
        // The step records were rewritten too.
        let history = new.history(id).await?.unwrap();
        assert_eq!(history[1].update["secret"], json!("s-2"));
    }
    Ok(())
}

#[tokio::test]
async fn a_plaintext_record_is_refused_until_migrated() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    run("p", &three_steps(), &*raw).await?;
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let text = corrupt_about(store.load("p").await.unwrap_err(), "p");
    assert!(text.contains("not encrypted"), "{text}");
    // The run loop refuses it too, and changes nothing.
    let before = raw.load("p").await?.unwrap();
    assert!(run("p", &three_steps(), &store).await.is_err());
    assert_eq!(raw.load("p").await?.unwrap(), before);
    // Asked to migrate: rekey seals it.
    let migrate = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}"))).accept_plaintext(true);
    assert_eq!(migrate.rekey("p").await?, Rekeyed::Rewritten);
    let stored = raw.load("p").await?.unwrap();
    assert!(stored.state.values().all(is_sealed));
    assert_eq!(
        store.load("p").await?.unwrap().state["secret"],
        json!("s-2")
    );
    Ok(())
}

#[tokio::test]
async fn history_records_are_bound_to_their_step() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let sqlite = steadfast_sqlite::SqliteStore::open(&path)?;
    let store = SealedStore::new(Arc::new(sqlite), keys(&format!("k1:{K1}")));
    run("r", &three_steps(), &store).await?;
    let history = store.history("r").await?.unwrap();
    assert_eq!(history[1].update["secret"], json!("s-2"));
    // Copy step 0's sealed update over step 1's, in the database itself.
    let conn = rusqlite::Connection::open(&path)?;
    conn.execute(
        "UPDATE steps SET update_json = (SELECT update_json FROM steps WHERE run_id = 'r' AND idx = 0) WHERE run_id = 'r' AND idx = 1",
        [],
    )?;
    drop(conn);
    let sqlite = steadfast_sqlite::SqliteStore::open(&path)?;
    let store = SealedStore::new(Arc::new(sqlite), keys(&format!("k1:{K1}")));
    let text = corrupt_about(store.history("r").await.unwrap_err(), "r");
    assert!(text.contains("step 1"), "{text}");
    Ok(())
}

/// A run whose sealed history row does not open (moved from another step
/// by hand) is Corrupt to `approve` and to `run` too, as it is to
/// `history`: neither decides its gate nor completes it on top of a history
/// that could never be shown or exported again, and nothing is written.
#[tokio::test]
async fn approve_and_run_refuse_a_run_whose_history_row_was_moved() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let open = || -> Result<SealedStore, Box<dyn std::error::Error>> {
        let sqlite = steadfast_sqlite::SqliteStore::open(&path)?;
        Ok(SealedStore::new(
            Arc::new(sqlite),
            keys(&format!("k1:{K1}")),
        ))
    };
    let wf = Workflow::builder("w")
        .step("a", |_, _| async { update(json!({"secret": "s-1"})) })
        .step("b", |_, _| async { update(json!({"secret": "s-2"})) })
        .push(Step::gate("g"))
        .step("c", |_, _| async { update(json!({"n": 3})) })
        .build()?;
    let store = open()?;
    let waiting = run("r", &wf, &store).await?;
    assert!(
        matches!(waiting, steadfast_core::Outcome::Waiting { .. }),
        "{waiting:?}"
    );
    drop(store);
    let conn = rusqlite::Connection::open(&path)?;
    conn.execute(
        "UPDATE steps SET update_json = (SELECT update_json FROM steps WHERE run_id = 'r' AND idx = 0) WHERE run_id = 'r' AND idx = 1",
        [],
    )?;
    let raw_before: String = conn.query_row(
        "SELECT version || head FROM runs WHERE run_id = 'r'",
        [],
        |row| row.get(0),
    )?;
    drop(conn);

    let store = open()?;
    let err = approve(&store, "r", "g", None, "ada", &SystemClock)
        .await
        .unwrap_err();
    let text = error_chain(&err);
    assert!(
        text.contains("corrupt") && text.contains("step 1"),
        "{text}"
    );
    let err = run("r", &wf, &store).await.unwrap_err();
    let text = error_chain(&err);
    assert!(
        text.contains("corrupt") && text.contains("step 1"),
        "{text}"
    );
    let conn = rusqlite::Connection::open(&path)?;
    let raw_after: String = conn.query_row(
        "SELECT version || head FROM runs WHERE run_id = 'r'",
        [],
        |row| row.get(0),
    )?;
    assert_eq!(raw_after, raw_before, "nothing was written");
    Ok(())
}

#[test]
fn key_files_must_be_private_and_errors_never_show_keys() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(
        &path,
        format!("# current first, then the old one\nk2:{K2}\nk1:{K1}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Keyring::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ring = Keyring::from_file(&path).unwrap();
    assert_eq!(ring.ids().collect::<Vec<_>>(), ["k2", "k1"]);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(Keyring::from_file(&link)
        .unwrap_err()
        .to_string()
        .contains("symbolic link"));
    for bad in [
        format!("k1:{}", &K1[..20]),
        format!("k1 {K1}"),
        format!("k1:{K1},k1:{K2}"),
        format!("bad id!:{K1}"),
        String::new(),
    ] {
        let err = Keyring::parse(&bad).unwrap_err().to_string();
        assert!(!err.contains(&K1[..20]) && !err.contains(K2), "{err}");
    }
}

#[tokio::test]
async fn a_gate_decided_or_a_wait_changed_without_the_key_is_detected() -> TestResult {
    use steadfast_core::{Decision, OnTimeout, Wait};
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let wf = Workflow::builder("w")
        .push(
            Step::gate("review")
                .gate_timeout(std::time::Duration::from_secs(3600), OnTimeout::Reject),
        )
        .step("ship", |_, _| async { update(json!({"shipped": true})) })
        .build()?;
    run("r", &wf, &store).await?;
    let waiting = raw.load("r").await?.unwrap();
    let Some(Wait::Gate { since, .. }) = waiting.wait.clone() else {
        panic!("not waiting: {waiting:?}")
    };
    // An approval appended by someone who can write the store.
    let mut cp = waiting.clone();
    cp.decisions
        .push(Decision::approve("review", "mallory", since, None).answering(since));
    put_raw(&raw, &cp).await;
    let text = corrupt_about(store.load("r").await.unwrap_err(), "r");
    assert!(text.contains("head"), "{text}");
    assert!(
        run("r", &wf, &store).await.is_err(),
        "the forged approval passed the gate"
    );
    // A timeout turned from reject into approve, due now.
    let mut cp = raw.load("r").await?.unwrap();
    cp.decisions = waiting.decisions.clone();
    cp.wait = Some(Wait::Gate {
        step: "review".into(),
        since,
        timeout_at: Some(since),
        on_timeout: OnTimeout::Approve,
    });
    put_raw(&raw, &cp).await;
    corrupt_about(store.load("r").await.unwrap_err(), "r");
    // The status changed.
    let mut cp = raw.load("r").await?.unwrap();
    cp.wait = waiting.wait.clone();
    cp.status = steadfast_core::RunStatus::Completed;
    put_raw(&raw, &cp).await;
    corrupt_about(store.load("r").await.unwrap_err(), "r");
    Ok(())
}

#[tokio::test]
async fn a_sqlite_run_set_back_a_step_by_sql_is_detected() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let sqlite = steadfast_sqlite::SqliteStore::open(&path)?;
    let store = SealedStore::new(Arc::new(sqlite), keys(&format!("k1:{K1}")));
    run("r", &three_steps(), &store).await?;
    drop(store);
    // Every step record carries the state's seal for its step: set `next`
    // back and the store rebuilds a state that is consistent with it.
    let conn = rusqlite::Connection::open(&path)?;
    let snap: i64 = conn.query_row(
        "SELECT snapshot_next FROM runs WHERE run_id = 'r'",
        [],
        |r| r.get(0),
    )?;
    conn.execute(
        "UPDATE runs SET next = next - 1, status = 'failed' WHERE run_id = 'r'",
        [],
    )?;
    if snap == 3 {
        conn.execute(
            "UPDATE runs SET snapshot = '{}', snapshot_steps = '[]', snapshot_next = 0 WHERE run_id = 'r'",
            [],
        )?;
    }
    drop(conn);
    let sqlite = steadfast_sqlite::SqliteStore::open(&path)?;
    let store = SealedStore::new(Arc::new(sqlite), keys(&format!("k1:{K1}")));
    let text = corrupt_about(store.load("r").await.unwrap_err(), "r");
    assert!(text.contains("head") || text.contains("state"), "{text}");
    Ok(())
}

#[tokio::test]
async fn unchanged_values_keep_their_ciphertext_and_a_rotated_key_never_is_kept() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    run("r", &three_steps(), &store).await?;
    let mut cp = store.load("r").await?.unwrap();
    let before = raw.load("r").await?.unwrap();
    cp.state.insert("n".into(), json!(4));
    let v = store.save(SaveRequest::new(&cp, Some(cp.version))).await?;
    let after = raw.load("r").await?.unwrap();
    assert_eq!(after.version, v);
    assert_eq!(
        after.state["secret"], before.state["secret"],
        "an unchanged value was sealed again"
    );
    assert_ne!(after.state["n"], before.state["n"]);
    assert_eq!(store.load("r").await?.unwrap().state["n"], json!(4));
    // Under a new current key nothing of the old key is kept.
    let rotated = SealedStore::new(raw.clone(), keys(&format!("k2:{K2}\nk1:{K1}")));
    let mut cp = rotated.load("r").await?.unwrap();
    cp.state.insert("n".into(), json!(5));
    rotated
        .save(SaveRequest::new(&cp, Some(cp.version)))
        .await?;
    let stored = raw.load("r").await?.unwrap();
    for (k, v) in &stored.state {
        assert!(
            v.as_str().unwrap().starts_with("sf1:k2:"),
            "{k} kept the old key"
        );
    }
    Ok(())
}

#[tokio::test]
async fn plain_strings_shaped_like_sealed_ones_are_plain_and_odd_envelopes_are_errors() -> TestResult
{
    use steadfast_seal::RefuseSealed;
    let raw = Arc::new(MemoryStore::new());
    // A run written without encryption whose value only looks sealed.
    let looks = Workflow::builder("w")
        .step("a", |_, _| async {
            update(json!({"v": "sf1:k1:1:not-base64!"}))
        })
        .build()?;
    run("p", &looks, &*raw).await?;
    let no_key = RefuseSealed::new(raw.clone());
    assert_eq!(
        no_key.load("p").await?.unwrap().state["v"],
        json!("sf1:k1:1:not-base64!")
    );
    let migrate = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}"))).accept_plaintext(true);
    assert_eq!(migrate.rekey("p").await?, Rekeyed::Rewritten);
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    assert_eq!(
        store.load("p").await?.unwrap().state["v"],
        json!("sf1:k1:1:not-base64!")
    );

    // Envelopes with an absurd step number, an empty body or a bad key id,
    // in a sealed record: each an error naming the run, never a panic.
    run("r", &three_steps(), &store).await?;
    let good = raw.load("r").await?.unwrap();
    let body = good.state["n"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    for bad in [
        format!("sf1:k1:99999999999999999999999:{body}"),
        format!("sf1:k1:-1:{body}"),
        "sf1:k1:1:".to_string(),
        format!("sf1:k 1:1:{body}"),
        format!("sf1:k1:1:{}", "A".repeat(1 << 20)),
    ] {
        let mut cp = raw.load("r").await?.unwrap();
        cp.state.insert("n".into(), json!(bad));
        put_raw(&raw, &cp).await;
        corrupt_about(store.load("r").await.unwrap_err(), "r");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rekeys_of_one_run_at_once_rewrite_it_once() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let old = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    for i in 0..20 {
        run(&format!("r{i}"), &three_steps(), &old).await?;
    }
    let ring = format!("k2:{K2}\nk1:{K1}");
    let a = Arc::new(SealedStore::new(raw.clone(), keys(&ring)));
    let b = Arc::new(SealedStore::new(raw.clone(), keys(&ring)));
    let mut tasks = Vec::new();
    for store in [a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..20 {
                outcomes.push(store.rekey(&format!("r{i}")).await.unwrap());
            }
            outcomes
        }));
    }
    let mut rewritten = 0;
    for t in tasks {
        rewritten += t
            .await?
            .iter()
            .filter(|o| **o == Rekeyed::Rewritten)
            .count();
    }
    assert!(rewritten >= 20, "only {rewritten} rewrites for 20 runs");
    // Whatever interleaved, every run is now current and opens with k2 alone.
    let new = SealedStore::new(raw.clone(), keys(&format!("k2:{K2}")));
    for i in 0..20 {
        assert_eq!(a.rekey(&format!("r{i}")).await?, Rekeyed::Current);
        assert_eq!(
            new.load(&format!("r{i}")).await?.unwrap().state["n"],
            json!(3)
        );
    }
    Ok(())
}

/// A worker whose store refuses sealed records (no key given) still finds
/// and runs the other runs: due runs are looked for on the store
/// underneath, so one record it would refuse never stops the search.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sealed_run_never_stops_a_worker_without_the_key() -> TestResult {
    use steadfast_core::{start, Registry, RunStatus, Worker};
    let dir = tempfile::tempdir()?;
    let raw: Arc<dyn Store> = Arc::new(steadfast_sqlite::SqliteStore::open(
        dir.path().join("runs.db"),
    )?);
    let gated = Workflow::builder("gated")
        .step("a", |_, _| async { update(json!({"secret": "s"})) })
        .push(Step::gate("g"))
        .build()?;
    let sealed = SealedStore::new(Arc::clone(&raw), keys(&format!("k1:{K1}")));
    let waiting = run("locked", &gated, &sealed).await?;
    assert!(matches!(waiting, steadfast_core::Outcome::Waiting { .. }));
    let plain = Workflow::builder("plain")
        .step("b", |_, _| async { update(json!({"b": 1})) })
        .build()?;
    assert!(start(&*raw, "plain", "p1", json!({}), false).await?);

    let refusing: Arc<dyn Store> = Arc::new(steadfast_seal::RefuseSealed::new(Arc::clone(&raw)));
    let registry = Registry::new().workflow(gated).workflow(plain);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(
        Worker::new(Arc::clone(&refusing), registry)
            .poll(std::time::Duration::from_millis(20))
            .run(async {
                let _ = stopped.await;
            }),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while raw.load("p1").await?.map(|c| c.status) != Some(RunStatus::Completed) {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never ran p1 beside a sealed run it cannot read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    let report = worker.await??;
    assert_eq!(report.completed, 1, "{report:?}");
    Ok(())
}

/// Emitted events are sealed at rest, open through the store with the key,
/// are refused without it, and do not open when moved to another step.
#[tokio::test]
async fn events_are_sealed_and_bound_to_their_step() -> TestResult {
    use steadfast_core::{Events, NewEvent, Timestamp};
    let raw = Arc::new(MemoryStore::new());
    let sealed = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let log = sealed.capabilities().events.expect("an event log");
    let at = Timestamp::from_unix_millis(1);
    let events = [
        NewEvent::new("think", 1, at, json!({"token": "the-secret-plan"})),
        NewEvent::new("act", 1, at, json!("call the tool")),
    ];
    assert_eq!(log.append_events("r", &events).await?, 2);
    let stored = raw.read_events("r", 0, 10).await?;
    for e in &stored {
        assert!(is_sealed(&e.value), "stored in clear: {:?}", e.value);
        assert!(!e.value.to_string().contains("secret"), "{:?}", e.value);
    }
    let opened = log.read_events("r", 0, 10).await?;
    assert_eq!(opened[0].value, json!({"token": "the-secret-plan"}));
    assert_eq!(opened[1].value, json!("call the tool"));
    // Without a key: refused, not shown as strings.
    let keyless = steadfast_seal::RefuseSealed::new(raw.clone());
    let err = keyless
        .capabilities()
        .events
        .expect("an event log")
        .read_events("r", 0, 10)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("encrypted"), "{err}");
    // The first event's sealed value moved under the other step's name.
    let mut moved = stored[0].clone();
    moved.step = "act".into();
    let copy = MemoryStore::new();
    let mut forged = NewEvent::new(moved.step, moved.attempt, moved.at, moved.value);
    forged.first = moved.first;
    copy.append_events("r", &[forged]).await?;
    let err = SealedStore::new(Arc::new(copy), keys(&format!("k1:{K1}")))
        .read_events("r", 0, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    Ok(())
}

#[tokio::test]
async fn a_budget_raised_or_a_spend_lowered_without_the_key_is_detected() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let wf = Workflow::builder("w")
        .budget("usd", 1.0)
        .step("ask", |ctx: steadfast_core::StepCtx, _| async move {
            let _ = ctx
                .spend("usd", 2.0)
                .map_err(steadfast_core::StepError::terminal)?;
            update(json!({}))
        })
        .step("ship", |_, _| async { update(json!({"shipped": true})) })
        .build()?;
    for change in 0..3 {
        let id = format!("r{change}");
        let out = run(&id, &wf, &store).await?;
        assert_eq!(
            out,
            steadfast_core::Outcome::Waiting {
                gate: "budget".into()
            }
        );
        assert!(store.load(&id).await.is_ok());
        let mut cp = raw.load(&id).await?.unwrap();
        let spend = cp.spend.as_mut().unwrap();
        match change {
            0 => {
                spend.budget.insert("usd".into(), 100.0);
            }
            1 => {
                spend.spent.insert("usd".into(), 0.5);
            }
            _ => cp.spend = None,
        }
        // Written at the version it had, so that only the spend differs
        // from what was sealed.
        raw.save(SaveRequest::new(&cp, Some(cp.version)).writing_version(cp.version))
            .await?;
        corrupt_about(store.load(&id).await.unwrap_err(), &id);
        assert!(
            run(&id, &wf, &store).await.is_err(),
            "change {change} passed"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_place_in_the_queue_changed_without_the_key_is_detected() -> TestResult {
    let raw = Arc::new(MemoryStore::new());
    let store = SealedStore::new(raw.clone(), keys(&format!("k1:{K1}")));
    let place = steadfast_core::StartOptions::new()
        .priority(-5)
        .partition("acme");
    for change in 0..3 {
        let id = format!("q{change}");
        assert!(steadfast_core::start_with(&store, "w", &id, json!({}), &place).await?);
        assert!(store.load(&id).await.is_ok());
        let mut cp = raw.load(&id).await?.unwrap();
        match change {
            0 => cp.queue.as_mut().unwrap().priority = 1_000,
            1 => cp.queue.as_mut().unwrap().partition = Some("other".into()),
            _ => cp.queue = None,
        }
        // Written at the version it had, so that only the place differs
        // from what was sealed.
        raw.save(SaveRequest::new(&cp, Some(cp.version)).writing_version(cp.version))
            .await?;
        corrupt_about(store.load(&id).await.unwrap_err(), &id);
    }
    Ok(())
}

/// Under a key, one document that two runs store is two blobs: each sealed
/// copy has a nonce of its own, so the store cannot tell that they are
/// equal (docs/security.md, "Large values and encryption"); both read back
/// as the document, and the database holds no stretch of its text.
#[tokio::test]
async fn sealed_large_values_are_not_shared_between_runs_and_hold_no_plaintext() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("runs.db");
    let inner = Arc::new(steadfast_sqlite::SqliteStore::open(&path)?);
    let store = SealedStore::new(inner.clone(), keys(&format!("k1:{K1}")));
    // 100 KiB, over the default blob threshold of 64 KiB.
    let document = Arc::new(steadfast_conformance::fixtures::doc(42, 100));
    let wf = {
        let document = Arc::clone(&document);
        Workflow::builder("w")
            .push(Step::new("read", move |_, _| {
                let document = Arc::clone(&document);
                async move { update(json!({ "doc": *document })) }
            }))
            .build()?
    };
    for r in ["a", "b"] {
        run(r, &wf, &store).await?;
    }
    for r in ["a", "b"] {
        let cp = store.load(r).await?.expect("stored");
        assert_eq!(cp.state["doc"], json!(*document), "run {r}");
    }
    let totals = inner.blob_totals().await?.expect("a store with blobs");
    assert_eq!(totals.blobs, 2, "one sealed copy a run, never shared");
    drop(store);
    drop(inner);
    let needle = &document.as_bytes()[..64];
    for suffix in ["", "-wal"] {
        let file = format!("{}{suffix}", path.display());
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "{file} holds the document's text"
        );
    }
    Ok(())
}
