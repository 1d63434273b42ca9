//! Checkpoint chains on every store's shared documents: checkpoints
//! round-trip (large ones in several parts), a chain has one writer at a
//! time, a writer whose lease lapsed cannot fork the chain, and a
//! checkpoint exists only once its chain lists it.
//!
//! SQLite, the file store and memory always; PostgreSQL at
//! `$STEADFAST_TEST_PG` (a schema of its own per test) and the Cosmos
//! protocol server at `$STEADFAST_TEST_COSMOS` (a database of its own per
//! test); without them those cases are skipped with a message, except under
//! CI (`$CI` set), where they fail.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use serde_json::json;
use steadfast_graph::chains::ChainStore;
use steadfast_graph::GraphError;

mod support;
use support::drop_schema;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const NS: &str = "test-chains";
const LEASE: Duration = Duration::from_secs(60);

/// The URL of an SQLite store in `dir`.
fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("c.db").display())
}
const COSMOS_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty())
}

/// Every kind of store: its URL, and the PostgreSQL schema to drop.
fn urls(dir: &std::path::Path) -> Vec<(String, Option<String>)> {
    let mut out = vec![
        (format!("sqlite:{}", dir.join("chains.db").display()), None),
        (format!("file:{}", dir.join("chains.json").display()), None),
        ("memory:".to_string(), None),
    ];
    match std::env::var("STEADFAST_TEST_PG") {
        Ok(base) => {
            let schema = format!("chains_{:016x}", fastrand::u64(..));
            let sep = if base.contains('?') { '&' } else { '?' };
            out.push((format!("{base}{sep}schema={schema}"), Some(schema)));
        }
        Err(_) if under_ci() => panic!("STEADFAST_TEST_PG must name a PostgreSQL server under CI"),
        Err(_) => eprintln!("skipped: PostgreSQL (set STEADFAST_TEST_PG)"),
    }
    match (
        std::env::var("STEADFAST_TEST_COSMOS"),
        std::env::var("STEADFAST_TEST_COSMOS_CA"),
    ) {
        (Ok(server), Ok(ca)) => {
            let keyfile = dir.join("cosmos-key");
            if !keyfile.exists() {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&keyfile)
                    .expect("the key file");
                f.write_all(COSMOS_KEY.as_bytes()).expect("write the key");
            }
            out.push((
                format!(
                    "{server}/c{:016x}/runs?keyfile={}&cafile={ca}",
                    fastrand::u64(..),
                    keyfile.display()
                ),
                None,
            ));
        }
        _ if under_ci() => panic!("STEADFAST_TEST_COSMOS and STEADFAST_TEST_COSMOS_CA must be set under CI (ci/cosmos/start.sh)"),
        _ => eprintln!("skipped: Cosmos (run ci/cosmos/start.sh DIR and export what it prints)"),
    }
    out
}

/// Runs `check` on every kind of store. A `memory:` store is one per
/// opening, so `check` gets an opener that shares one store between the
/// storages it opens.
fn on_every_store(
    check: impl Fn(&dyn Fn(Duration) -> ChainStore, &str) -> TestResult,
) -> TestResult {
    let dir = tempfile::tempdir()?;
    for (url, schema) in urls(dir.path()) {
        // One memory store shared by every storage of the test; the others
        // opened anew each time, as another process would.
        let memory = steadfast::MemoryStore::new();
        let open = |lease: Duration| {
            if url == "memory:" {
                let store: std::sync::Arc<dyn steadfast::Store> =
                    std::sync::Arc::new(memory.clone());
                ChainStore::with_store(store, NS, lease, false).expect("opens")
            } else {
                ChainStore::open(&url, NS, lease, false).expect("opens")
            }
        };
        let result = check(&open, &url).map_err(|e| format!("on {url}: {e}"));
        if let Some(schema) = &schema {
            drop_schema(&url, schema);
        }
        result?;
    }
    Ok(())
}

fn ids(found: &[steadfast_graph::Result<steadfast_graph::chains::Stored>]) -> Vec<String> {
    found
        .iter()
        .map(|r| {
            r.as_ref()
                .map(|s| s.id.clone())
                .unwrap_or_else(|e| format!("error: {e}"))
        })
        .collect()
}

#[test]
fn checkpoints_round_trip_in_their_chain_on_every_store() -> TestResult {
    on_every_store(|open, _| {
        let s = open(LEASE);
        assert_eq!(s.put("a", "review", None, "t1", r#"{"n":1}"#)?, "a");
        assert_eq!(s.put("b", "review", Some("a"), "t2", r#"{"n":2}"#)?, "a");
        assert_eq!(s.put("c", "review", Some("b"), "t3", r#"{"n":3}"#)?, "a");
        // Another run of the same workflow, and another workflow.
        assert_eq!(s.put("x", "review", None, "t4", "{}")?, "x");
        assert_eq!(s.put("o", "other", None, "t5", "{}")?, "o");
        // A predecessor of another workflow does not join its chain.
        assert_eq!(s.put("p", "third", Some("a"), "t6", "{}")?, "p");
        let b = s.get("b")?.expect("b is stored");
        assert_eq!((b.chain.as_str(), b.previous.as_deref()), ("a", Some("a")));
        assert_eq!(
            (b.timestamp.as_str(), b.body.as_str()),
            ("t2", r#"{"n":2}"#)
        );
        assert!(s.get("nothing")?.is_none());
        let mut listed = ids(&s.list("review")?);
        listed.sort();
        assert_eq!(listed, ["a", "b", "c", "x"]);
        assert_eq!(ids(&s.list("other")?), ["o"]);
        assert!(s.list("none")?.is_empty());
        // A second storage on the same store reads them (it holds nothing).
        let t = open(LEASE);
        assert_eq!(t.get("c")?.expect("c").body, r#"{"n":3}"#);
        // Saving an id again replaces its body.
        s.put("c", "review", Some("b"), "t3", r#"{"n":33}"#)?;
        assert_eq!(t.get("c")?.expect("c").body, r#"{"n":33}"#);
        assert_eq!(t.list("review")?.len(), 4);
        // Deleting.
        assert!(s.delete("b")?);
        assert!(!s.delete("b")?);
        assert!(t.get("b")?.is_none());
        assert_eq!(ids(&t.list("review")?).len(), 3);
        Ok(())
    })
}

#[test]
fn a_body_larger_than_a_document_is_kept_in_parts() -> TestResult {
    on_every_store(|open, url| {
        let s = open(LEASE);
        // Quotes and control characters take more room escaped than raw.
        let unit = "\"\u{1}é😀 plain text ";
        let n = if url.starts_with("cosmos://") {
            40_000
        } else {
            120_000
        };
        let body = unit.repeat(n);
        s.put("big", "review", None, "t", &body)?;
        let back = open(LEASE).get("big")?.expect("stored");
        assert_eq!(back.body.len(), body.len());
        assert!(
            back.body == body,
            "the body changed on its way through the store"
        );
        let listed = s.list("review")?;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].as_ref().map_err(|e| e.to_string())?.body == body);
        Ok(())
    })
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_run() -> TestResult {
    on_every_store(|open, _| {
        let a = open(LEASE);
        let b = open(LEASE);
        a.put("r1", "review", None, "t1", "{}")?;
        let held = b.put("r2", "review", Some("r1"), "t2", "{}");
        assert!(matches!(held, Err(GraphError::Held(_))), "{held:?}");
        assert!(b.get("r2")?.is_none(), "a refused save left a checkpoint");
        assert!(matches!(b.claim("r1"), Err(GraphError::Held(_))));
        assert!(matches!(b.delete("r1"), Err(GraphError::Held(_))));
        // A new run is anyone's.
        b.put("s1", "review", None, "t3", "{}")?;
        // Released: the second takes it, and now the first is refused.
        a.release("r1")?;
        assert!(b.claim("r1")?);
        b.put("r2", "review", Some("r1"), "t2", "{}")?;
        let refused = a.put("r3", "review", Some("r2"), "t4", "{}");
        assert!(matches!(refused, Err(GraphError::Held(_))), "{refused:?}");
        b.close()?;
        a.put("r3", "review", Some("r2"), "t4", "{}")?;
        assert_eq!(a.get("r3")?.expect("r3").chain, "r1");
        assert!(!a.claim("nothing")?);
        Ok(())
    })
}

#[test]
fn a_writer_whose_lease_lapsed_cannot_fork_the_run() -> TestResult {
    on_every_store(|open, _| {
        let a = open(Duration::from_millis(200));
        let b = open(LEASE);
        a.put("k1", "review", None, "t1", "{}")?;
        a.put("k2", "review", Some("k1"), "t2", "{}")?;
        std::thread::sleep(Duration::from_millis(400));
        // The lease ran out: another writer resumes from the latest.
        assert!(b.claim("k2")?);
        b.put("k3", "review", Some("k2"), "t3", "{}")?;
        b.release("k3")?;
        // The first comes back and would add a sibling of k3.
        let fork = a.put("k3b", "review", Some("k2"), "t4", "{}");
        assert!(matches!(fork, Err(GraphError::Held(_))), "{fork:?}");
        assert!(a.get("k3b")?.is_none());
        // Following the latest is allowed, as is a deliberate resume (a
        // load claims the run).
        a.put("k4", "review", Some("k3"), "t5", "{}")?;
        Ok(())
    })
}

#[test]
fn parts_no_chain_lists_are_no_checkpoint() -> TestResult {
    on_every_store(|open, url| {
        let s = open(LEASE);
        s.put("real", "review", None, "t1", "{}")?;
        // What a crash between a save's parts and its chain leaves behind:
        // a part naming a chain that does not list it.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        if url == "memory:" {
            return Ok(()); // one store per opening: nothing to reach
        }
        rt.block_on(async {
            let store = steadfast::open_store(url).await?;
            let docs = store.capabilities().documents.expect("documents");
            let part =
                json!({"id": "ghost", "chain": "real", "save": "00", "index": 0, "text": "{}"});
            let key = format!(
                "{NS}/part/{}/00/0",
                steadfast::store::blob::BlobHash::of(b"ghost").hex()
            );
            docs.put_document(&key, &part, None).await?;
            Ok::<_, steadfast::StoreError>(())
        })?;
        assert!(s.get("ghost")?.is_none());
        assert_eq!(ids(&s.list("review")?), ["real"]);
        // Its id stays free to save.
        s.put("ghost", "review", Some("real"), "t2", "{}")?;
        assert_eq!(s.get("ghost")?.expect("saved").chain, "real");
        Ok(())
    })
}

#[test]
fn bad_arguments_are_refused_and_write_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = sqlite_url(&dir);
    let s = ChainStore::open(&url, NS, LEASE, false)?;
    for (id, wf) in [
        ("", "w"),
        ("a\u{1}", "w"),
        ("a", ""),
        (&"x".repeat(2000)[..], "w"),
    ] {
        let r = s.put(id, wf, None, "t", "{}");
        assert!(
            matches!(r, Err(GraphError::InvalidInput(_))),
            "{id:?}: {r:?}"
        );
    }
    assert!(s.list("w")?.is_empty());
    assert!(matches!(
        ChainStore::open(&url, "", LEASE, false),
        Err(GraphError::InvalidInput(_))
    ));
    assert!(matches!(
        ChainStore::open(&url, NS, Duration::ZERO, false),
        Err(GraphError::InvalidInput(_))
    ));
    assert!(ChainStore::open("ftp://x", NS, LEASE, false).is_err());
    // One workflow's checkpoint id is not reused by another's run.
    s.put("same", "one", None, "t", "{}")?;
    let r = s.put("same", "two", None, "t", "{}");
    assert!(matches!(r, Err(GraphError::InvalidInput(_))), "{r:?}");
    assert_eq!(s.get("same")?.expect("kept").workflow, "one");
    Ok(())
}

#[test]
fn a_chain_document_that_does_not_read_is_reported_in_every_listing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = sqlite_url(&dir);
    let s = ChainStore::open(&url, NS, LEASE, false)?;
    s.put("fine", "review", None, "t", "{}")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = steadfast::open_store(&url).await?;
        let docs = store.capabilities().documents.expect("documents");
        docs.put_document(&format!("{NS}/chain/odd"), &json!({"not": "a chain"}), None)
            .await?;
        Ok::<_, steadfast::StoreError>(())
    })?;
    for workflow in ["review", "other"] {
        let listed = s.list(workflow)?;
        let bad: Vec<String> = listed
            .iter()
            .filter_map(|r| r.as_ref().err().map(ToString::to_string))
            .collect();
        assert_eq!(bad.len(), 1, "{workflow}: {bad:?}");
        assert!(
            bad[0].contains("is not a chain of checkpoints"),
            "{}",
            bad[0]
        );
    }
    assert_eq!(s.get("fine")?.expect("still read").body, "{}");
    Ok(())
}

#[test]
fn a_stale_writer_is_refused_after_close_and_after_its_predecessor_is_deleted() -> TestResult {
    on_every_store(|open, _| {
        let short = Duration::from_millis(200);
        // Closed, then its run taken over: a closed storage is no less
        // fenced than one whose lease lapsed.
        let a = open(short);
        let b = open(LEASE);
        a.put("h1", "review", None, "t1", "{}")?;
        a.close()?;
        assert!(b.claim("h1")?);
        b.put("h2", "review", Some("h1"), "t2", "{}")?;
        b.close()?;
        let fork = a.put("h3", "review", Some("h1"), "t3", "{}");
        assert!(matches!(fork, Err(GraphError::Held(_))), "{fork:?}");

        // Its predecessor deleted by the new holder: no new run beside it.
        let c = open(short);
        let d = open(LEASE);
        c.put("g1", "review", None, "t1", "{}")?;
        c.put("g2", "review", Some("g1"), "t2", "{}")?;
        std::thread::sleep(Duration::from_millis(400));
        assert!(d.claim("g2")?);
        d.put("g3", "review", Some("g2"), "t3", "{}")?;
        assert!(d.delete("g1")? && d.delete("g2")?);
        let fork = c.put("g3b", "review", Some("g2"), "t4", "{}");
        assert!(matches!(fork, Err(GraphError::Held(_))), "{fork:?}");
        assert!(c.get("g3b")?.is_none());
        Ok(())
    })
}

#[test]
fn saving_an_id_again_keeps_it_in_its_run() -> TestResult {
    on_every_store(|open, _| {
        let s = open(LEASE);
        s.put("a1", "review", None, "t", "{}")?;
        s.put("b1", "review", None, "t", "{}")?;
        s.put("x", "review", Some("a1"), "t", r#""one""#)?;
        s.put("x", "review", Some("b1"), "t", r#""two""#)?;
        s.put("x", "review", Some("b1"), "t", r#""three""#)?;
        let listed = s.list("review")?;
        let xs: Vec<&str> = listed
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter(|c| c.id == "x")
            .map(|c| c.body.as_str())
            .collect();
        assert_eq!(xs, [r#""three""#]);
        assert!(s.delete("x")?);
        assert!(open(LEASE).get("x")?.is_none());
        Ok(())
    })
}

#[test]
fn listings_of_few_and_of_many_checkpoints_read_every_one() -> TestResult {
    on_every_store(|open, _| {
        let s = open(LEASE);
        let mut previous: Option<String> = None;
        for i in 0..40 {
            let id = format!("m{i:02}");
            s.put(
                &id,
                "many",
                previous.as_deref(),
                "t",
                &format!("{{\"i\":{i}}}"),
            )?;
            previous = Some(id);
            if i == 2 {
                s.put("f0", "few", None, "t", "{}")?;
            }
        }
        let many = s.list("many")?;
        assert_eq!(many.len(), 40);
        for (i, r) in many.iter().enumerate() {
            let c = r.as_ref().map_err(|e| e.to_string())?;
            assert_eq!(
                (c.id.as_str(), c.body.as_str()),
                (
                    format!("m{i:02}").as_str(),
                    format!("{{\"i\":{i}}}").as_str()
                )
            );
        }
        assert_eq!(ids(&s.list("few")?), ["f0"]);
        // A storage that has seen none of them reads one cold.
        assert_eq!(open(LEASE).get("m17")?.expect("m17").body, r#"{"i":17}"#);
        Ok(())
    })
}

#[test]
fn a_long_run_moves_its_checkpoints_into_segments_and_keeps_every_one() -> TestResult {
    on_every_store(|open, url| {
        let s = open(LEASE).segment_size(4);
        let mut previous: Option<String> = None;
        for i in 0..11 {
            let id = format!("s{i:02}");
            s.put(&id, "long", previous.as_deref(), "t", &format!("{i}"))?;
            previous = Some(id);
        }
        let bodies = |st: &ChainStore| -> Result<Vec<String>, String> {
            st.list("long")
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|r| {
                    r.map(|c| format!("{}={}", c.id, c.body))
                        .map_err(|e| e.to_string())
                })
                .collect()
        };
        let all: Vec<String> = (0..11).map(|i| format!("s{i:02}={i}")).collect();
        assert_eq!(bodies(&s)?, all);
        // Read cold by another storage: one in the first segment.
        let cold = open(LEASE).segment_size(4);
        assert_eq!(cold.get("s01")?.expect("s01").body, "1");
        assert_eq!(bodies(&cold)?, all);
        // Saved again in its segment, then deleted from another one.
        s.put("s01", "long", Some("s00"), "t", "one")?;
        s.put("s01", "long", Some("s00"), "t", "uno")?;
        assert!(s.delete("s05")?);
        let mut expect = all.clone();
        expect[1] = "s01=uno".into();
        expect.remove(5);
        assert_eq!(bodies(&open(LEASE))?, expect);
        // The head is kept: the next checkpoint follows s10.
        s.put("s11", "long", Some("s10"), "t", "11")?;
        // Everything deleted: no segment is left behind.
        for i in (0..12).filter(|i| *i != 5) {
            assert!(s.delete(&format!("s{i:02}"))?, "s{i:02}");
        }
        s.close()?;
        assert!(s.list("long")?.is_empty());
        if url != "memory:" {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let left = rt.block_on(async {
                let store = steadfast::open_store(url).await?;
                let docs = store.capabilities().documents.expect("documents");
                docs.list_documents(&format!("{NS}/")).await
            })?;
            let keys: Vec<&str> = left.iter().map(|d| d.key.as_str()).collect();
            assert!(keys.is_empty(), "left behind: {keys:?}");
        }
        Ok(())
    })
}

#[test]
fn an_id_saved_by_another_storage_stays_in_its_run_and_resaving_keeps_the_head() -> TestResult {
    on_every_store(|open, _| {
        let a = open(Duration::from_millis(200));
        a.put("x1", "review", None, "t", "1")?;
        a.put("x2", "review", Some("x1"), "t", "2")?;
        a.put("x3", "review", Some("x2"), "t", "3")?;
        a.put("y1", "review", None, "t", "y")?;
        // Saved again by a storage that never saw it, after another run's
        // checkpoint: it stays in its own run, listed once.
        a.close()?;
        let b = open(LEASE);
        b.put("x2", "review", Some("y1"), "t", "two")?;
        let listed = b.list("review")?;
        let x2: Vec<String> = listed
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter(|c| c.id == "x2")
            .map(|c| format!("{}:{}", c.chain, c.body))
            .collect();
        assert_eq!(x2, ["x1:two"]);
        b.close()?;
        // Saving an older id again does not move the run's latest: a writer
        // whose lease another took and gave back may still follow x3.
        let c = open(Duration::from_millis(200));
        c.put("x1", "review", None, "t", "one")?;
        std::thread::sleep(Duration::from_millis(400));
        let d = open(LEASE);
        assert!(d.claim("x3")?);
        d.close()?;
        c.put("x4", "review", Some("x3"), "t", "4")?;
        assert_eq!(c.get("x4")?.expect("x4").chain, "x1");
        Ok(())
    })
}

#[test]
fn a_replaced_segment_is_kept_for_readers_who_saw_it_listed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = sqlite_url(&dir);
    let s = ChainStore::open(&url, NS, LEASE, false)?.segment_size(2);
    let mut previous: Option<String> = None;
    for i in 0..7 {
        let id = format!("r{i}");
        s.put(&id, "w", previous.as_deref(), "t", "{}")?;
        previous = Some(id);
    }
    let segments = || -> Result<usize, Box<dyn std::error::Error>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let docs = rt.block_on(async {
            let store = steadfast::open_store(&url).await?;
            let docs = store.capabilities().documents.expect("documents");
            docs.list_documents(&format!("{NS}/segment/")).await
        })?;
        Ok(docs.len())
    };
    assert_eq!(segments()?, 3);
    // Two rewrites of the first segment: both replaced ones are still there.
    assert!(s.delete("r0")?);
    s.put("r1", "w", None, "t", "again")?;
    assert_eq!(segments()?, 5);
    assert_eq!(s.list("w")?.len(), 6);
    Ok(())
}

#[test]
fn hostile_names_are_refused_or_round_trip() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = format!("file:{}", dir.path().join("c.json").display());
    let s = ChainStore::open(&url, NS, LEASE, false)?;
    for ts in ["x".repeat(1025), "a\nb".to_string()] {
        let r = s.put("t1", "w", None, &ts, "{}");
        assert!(matches!(r, Err(GraphError::InvalidInput(_))), "{r:?}");
    }
    // Names as long as allowed, and any Unicode, are keys by their hash.
    let long = "é".repeat(512);
    for id in [long.as_str(), "😀/../chain/x", "a b", "\u{10FFFF}"] {
        s.put(id, &long, None, "", "{\"ok\":1}")?;
        let back = ChainStore::open(&url, NS, LEASE, false)?
            .get(id)?
            .expect("stored");
        assert_eq!(
            (back.id.as_str(), back.workflow.as_str()),
            (id, long.as_str())
        );
    }
    assert_eq!(s.list(&long)?.len(), 4);
    assert!(matches!(
        ChainStore::open(&url, "a/chain", LEASE, false),
        Err(GraphError::InvalidInput(_))
    ));
    Ok(())
}

#[test]
fn a_run_listing_a_missing_segment_is_an_error_not_a_panic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = sqlite_url(&dir);
    let s = ChainStore::open(&url, NS, LEASE, false)?.segment_size(2);
    for (i, prev) in [(0, None), (1, Some("g0")), (2, Some("g1"))] {
        s.put(&format!("g{i}"), "w", prev, "t", "{}")?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = steadfast::open_store(&url).await?;
        let docs = store.capabilities().documents.expect("documents");
        for d in docs.list_documents(&format!("{NS}/segment/")).await? {
            assert!(docs.delete_document(&d.key, d.version).await?);
        }
        Ok::<_, steadfast::StoreError>(())
    })?;
    let fresh = ChainStore::open(&url, NS, LEASE, false)?;
    let listed = fresh.list("w")?;
    assert!(
        listed
            .iter()
            .any(|r| r.as_ref().is_err_and(|e| e.to_string().contains("missing"))),
        "{listed:?}"
    );
    assert!(
        fresh.get("g0").is_err(),
        "a checkpoint in the missing segment is an error"
    );
    // The newest, in the run's own document, still reads.
    assert_eq!(fresh.get("g2")?.expect("g2").id, "g2");
    Ok(())
}

#[test]
fn two_storages_starting_one_run_at_once_leave_one_writer() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = sqlite_url(&dir);
    for round in 0..5 {
        let id = format!("race{round}");
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2)
                .map(|n| {
                    let (url, id, barrier) = (&url, &id, &barrier);
                    sc.spawn(move || {
                        let s = ChainStore::open(url, NS, LEASE, false).expect("opens");
                        barrier.wait();
                        s.put(id, "w", None, "t", &format!("{n}"))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        let held = results
            .iter()
            .filter(|r| matches!(r, Err(GraphError::Held(_))))
            .count();
        assert_eq!((ok, held), (1, 1), "{results:?}");
        let s = ChainStore::open(&url, NS, LEASE, false)?;
        let bodies: Vec<String> = s
            .list("w")?
            .into_iter()
            .filter_map(|r| r.ok())
            .filter(|c| c.id == id)
            .map(|c| c.body)
            .collect();
        assert_eq!(bodies.len(), 1, "{bodies:?}");
    }
    // One storage saving from many threads into one run: every save lands.
    let s = ChainStore::open(&url, NS, LEASE, false)?;
    s.put("root", "many", None, "t", "{}")?;
    std::thread::scope(|sc| {
        for t in 0..4 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..10 {
                    s.put(&format!("t{t}-{i}"), "many", Some("root"), "t", "{}")
                        .expect("saved");
                }
            });
        }
    });
    assert_eq!(s.list("many")?.len(), 41);
    Ok(())
}
