//! The graph store on SQLite, memory and PostgreSQL: checkpoints and writes
//! round-trip, a second saver is refused while the first holds a thread and
//! takes it once released, copies and prunes keep what they promise.
//!
//! PostgreSQL at `$STEADFAST_TEST_PG` (a schema of its own per test, dropped
//! afterwards); without it the PostgreSQL cases are skipped with a message,
//! except under CI (`$CI` set), where they fail.

use std::time::Duration;

use steadfast_graph::{GraphError, GraphStore};

mod support;
use support::drop_schema;

const LEASE: Duration = Duration::from_secs(60);

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Every kind of store the graph store opens: its URL, and what to drop.
fn urls(dir: &std::path::Path) -> Vec<(String, Option<String>)> {
    let mut out = vec![
        (format!("sqlite:{}", dir.join("graph.db").display()), None),
        ("memory:".to_string(), None),
    ];
    match std::env::var("STEADFAST_TEST_PG") {
        Ok(base) => {
            let schema = format!("graph_{:016x}", fastrand_u64());
            let sep = if base.contains('?') { '&' } else { '?' };
            out.push((format!("{base}{sep}schema={schema}"), Some(schema)));
        }
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("STEADFAST_TEST_PG must name a PostgreSQL server under CI")
        }
        Err(_) => eprintln!("skipped: PostgreSQL (set STEADFAST_TEST_PG)"),
    }
    out
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Runs `check` on every kind of store (its URL, and its test schema on
/// PostgreSQL), dropping each test schema afterwards, pass or fail.
fn on_every_store(check: impl Fn(&str, Option<&str>) -> TestResult) -> TestResult {
    let dir = tempfile::tempdir()?;
    for (url, schema) in urls(dir.path()) {
        let result = check(&url, schema.as_deref());
        if let Some(schema) = &schema {
            drop_schema(&url, schema);
        }
        result?;
    }
    Ok(())
}

/// Saves checkpoint `id` of thread `t` (namespace ""), a child of `parent`,
/// for run `run`.
fn put(
    s: &GraphStore,
    id: &str,
    parent: Option<&str>,
    blob: &[u8],
    run: &str,
) -> Result<(), GraphError> {
    s.put(
        "t".into(),
        "".into(),
        id.into(),
        parent.map(String::from),
        "json".into(),
        blob.to_vec(),
        meta(run),
        Some(run.into()),
        Vec::new(),
    )
}

fn meta(run: &str) -> String {
    format!("{{\"source\": \"loop\", \"step\": 1, \"run_id\": \"{run}\"}}")
}

#[test]
fn checkpoints_and_writes_round_trip_and_one_saver_writes_a_thread() -> TestResult {
    on_every_store(|url, _| {
        {
            let a = GraphStore::open(url, LEASE, false)?;
            put(&a, "c1", None, b"one", "r1")?;
            a.put_writes(
                "t".into(),
                "".into(),
                "c1".into(),
                "task".into(),
                "path".into(),
                vec![(0, "ch".into(), "json".into(), b"w0".to_vec())],
            )?;
            put(&a, "c2", Some("c1"), b"two", "r1")?;
            let latest = a.get("t".into(), "".into(), None)?.ok_or("no latest")?;
            assert_eq!(
                (latest.2.as_str(), latest.5.as_slice()),
                ("c2", &b"two"[..]),
                "{url}"
            );
            let first = a
                .get("t".into(), "".into(), Some("c1".into()))?
                .ok_or("no c1")?;
            assert_eq!(first.7.len(), 1, "{url}: c1's write");
            assert_eq!(first.7[0].3, b"w0", "{url}");
            let listed = a.list(Some("t".into()), None, None, None, None, None)?;
            let ids: Vec<&str> = listed.iter().map(|r| r.2.as_str()).collect();
            assert_eq!(ids, ["c2", "c1"], "{url}: newest first");
            let filtered = a.list(None, None, None, None, None, Some("{\"step\": 1}".into()))?;
            assert_eq!(filtered.len(), 2, "{url}");
            assert!(matches!(
                a.list(None, None, None, None, Some(-1), None),
                Err(GraphError::InvalidInput(_))
            ));

            if url != "memory:" {
                // A second saver of the same thread is refused while the
                // first holds it, and takes it once it is released.
                let b = GraphStore::open(url, LEASE, false)?;
                let refused = put(&b, "c3", Some("c2"), b"three", "r2");
                assert!(
                    matches!(refused, Err(GraphError::Held(_))),
                    "{url}: {refused:?}"
                );
                a.release("t".into())?;
                put(&b, "c3", Some("c2"), b"three", "r2")?;
                // The first saver, whose lease another took since, may not
                // fork the chain from an older checkpoint.
                let stale = put(&a, "c4", Some("c1"), b"fork", "r1");
                assert!(
                    matches!(stale, Err(GraphError::Held(_))),
                    "{url}: {stale:?}"
                );
                b.close()?;
            }

            // Copy and prune.
            a.copy_thread("t".into(), "u".into())?;
            let copied = a.list(Some("u".into()), None, None, None, None, None)?;
            assert_eq!(
                copied.len(),
                listed.len() + usize::from(url != "memory:"),
                "{url}"
            );
            assert!(matches!(
                a.copy_thread("t".into(), "u".into()),
                Err(GraphError::InvalidInput(_))
            ));
            a.prune(vec!["u".into()], true)?;
            assert_eq!(
                a.list(Some("u".into()), None, None, None, None, None)?
                    .len(),
                1
            );
            a.delete_for_runs(vec!["r1".into()])?;
            assert!(a
                .list(None, None, None, None, None, None)?
                .iter()
                .all(|r| !r.6.contains("\"r1\"")));
            a.delete_thread("t".into())?;
            assert!(a.get("t".into(), "".into(), None)?.is_none());
            a.close()?;
            Ok(())
        }
    })
}

/// Metadata whose first key is serde_json's marker name is read as the
/// object it is: a filter matches it, and a thread with delta channels is
/// still not thinned by a prune.
#[test]
fn metadata_starting_with_the_serde_marker_name_is_read_as_written() -> TestResult {
    on_every_store(|url, _| {
        let a = GraphStore::open(url, LEASE, false)?;
        let meta = r#"{"$serde_json::private::RawValue": "x", "counters_since_delta_snapshot": {}, "run_id": "rm", "source": "loop"}"#;
        for (id, parent) in [("m1", None), ("m2", Some("m1"))] {
            a.put(
                "m".into(),
                "".into(),
                id.into(),
                parent.map(String::from),
                "json".into(),
                b"v".to_vec(),
                meta.into(),
                Some("rm".into()),
                Vec::new(),
            )?;
        }
        let found = a.list(
            Some("m".into()),
            None,
            None,
            None,
            None,
            Some(r#"{"source": "loop"}"#.into()),
        )?;
        assert_eq!(found.len(), 2, "{url}: the filter matches");
        let pruned = a.prune(vec!["m".into()], true);
        assert!(
            matches!(pruned, Err(GraphError::Unsupported(_))),
            "{url}: {pruned:?}"
        );
        let left = a.list(Some("m".into()), None, None, None, None, None)?;
        assert_eq!(left.len(), 2, "{url}: nothing pruned");
        a.delete_thread("m".into())?;
        a.close()?;
        Ok(())
    })
}

#[test]
fn bad_urls_and_leases_are_refused_with_what_is_wrong() {
    for (url, says) in [
        ("ftp://x", "expected sqlite:PATH"),
        ("sqlite:", "expected sqlite:PATH"),
        ("sqlite:?blob_threshold=1KiB", "expected sqlite:PATH"),
        // Blob thresholds: empty, below 256 bytes, negative, past 1 GiB,
        // overflowing, of an unknown unit; options that are not known.
        ("memory:?blob_threshold=", "blob_threshold"),
        ("memory:?blob_threshold=12", "blob_threshold"),
        ("memory:?blob_threshold=-1", "blob_threshold"),
        ("memory:?blob_threshold=2GiB", "blob_threshold"),
        (
            "memory:?blob_threshold=99999999999999999999GiB",
            "blob_threshold",
        ),
        ("memory:?blob_threshold=1TB", "blob_threshold"),
        ("memory:?schema=x", "not known"),
        ("memory:?", "not known"),
    ] {
        let err = GraphStore::open(url, LEASE, false).err().expect("refused");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let big = GraphStore::open("memory:?blob_threshold=1GiB", LEASE, false).expect("1 GiB");
    assert_eq!(big.blob_threshold(), 1 << 30);
    let err = GraphStore::open("memory:", Duration::from_millis(1), false)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("lease_seconds"), "{err}");
}

/// Runs `sql` (with `{t}` for the thread table) on the store at `url`.
fn exec(url: &str, schema: Option<&str>, sql: &str) -> TestResult {
    match schema {
        None => {
            let path = url.trim_start_matches("sqlite:");
            let conn = rusqlite::Connection::open(path)?;
            conn.execute_batch(&sql.replace("{t}", "graph_threads"))?;
        }
        Some(schema) => {
            let base = url.split("schema=").next().unwrap_or(url);
            let base = base.trim_end_matches(['?', '&']).to_string();
            let sql = sql.replace("{t}", &format!("\"{schema}\".graph_threads"));
            tokio::runtime::Runtime::new()?.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await
            })?;
        }
    }
    Ok(())
}

/// A thread's lease is judged as a run's is: on this host by the holder's
/// process and the boot clock, so a wall clock moved forward does not end a
/// live saver's lease, and one moved back does not extend a lapsed one.
#[test]
fn leases_are_judged_by_the_boot_clock_on_this_host() -> TestResult {
    on_every_store(|url, schema| {
        if url == "memory:" {
            return Ok(());
        }
        {
            let a = GraphStore::open(url, LEASE, false)?;
            let b = GraphStore::open(url, LEASE, false)?;
            put(&a, "c1", None, b"one", "r1")?;
            // The wall-clock deadline long past, the boot-clock one not: a
            // holds the thread still.
            exec(url, schema, "UPDATE {t} SET until_ms = 1")?;
            let refused = put(&b, "c2", Some("c1"), b"two", "r2");
            assert!(
                matches!(refused, Err(GraphError::Held(_))),
                "{url}: {refused:?}"
            );
            // The wall-clock deadline far ahead, the boot-clock one past: the
            // lease lapsed, and b takes the thread.
            exec(
                url,
                schema,
                "UPDATE {t} SET until_ms = 9000000000000, local_until_ms = 0",
            )?;
            put(&b, "c2", Some("c1"), b"two", "r2")?;
            // A boot-clock deadline written with another generation (as a
            // saver of the old format leaves one when it takes a lease) is
            // not trusted: the wall clock says b holds the thread.
            exec(
                url,
                schema,
                "UPDATE {t} SET local_until_ms = 0, local_generation = -1",
            )?;
            let c = GraphStore::open(url, LEASE, false)?;
            let refused = put(&c, "c3", Some("c2"), b"three", "r3");
            assert!(
                matches!(refused, Err(GraphError::Held(_))),
                "{url}: {refused:?}"
            );
            // A negative deadline (planted or damaged) reads as none: the
            // wall clock still says b holds the thread.
            exec(
                url,
                schema,
                "UPDATE {t} SET local_until_ms = -5, local_generation = generation",
            )?;
            let refused = put(&c, "c3", Some("c2"), b"three", "r3");
            assert!(
                matches!(refused, Err(GraphError::Held(_))),
                "{url}: {refused:?}"
            );
            c.close()?;
            a.close()?;
            b.close()?;
            Ok(())
        }
    })
}

/// A store of the first table format (leases without a boot-clock
/// deadline) opens and gains the column; one of a newer format is refused
/// and left as it was.
#[test]
fn older_table_formats_are_upgraded_and_newer_ones_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("old.db");
    let url = format!("sqlite:{}", path.display());
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.execute_batch(
            "CREATE TABLE graph_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT INTO graph_meta VALUES ('format', 1);
             CREATE TABLE graph_threads (thread_id TEXT PRIMARY KEY, holder TEXT NOT NULL,
               until_ms INTEGER NOT NULL, generation INTEGER NOT NULL) WITHOUT ROWID;",
        )?;
    }
    let a = GraphStore::open(&url, LEASE, false)?;
    put(&a, "c1", None, b"one", "r1")?;
    a.close()?;
    let conn = rusqlite::Connection::open(&path)?;
    let (format, local): (i64, Option<i64>) = conn.query_row(
        "SELECT (SELECT value FROM graph_meta), local_until_ms FROM graph_threads",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    assert_eq!(format, 3);
    assert!(local.is_some_and(|l| l > 0), "{local:?}");
    conn.execute_batch("UPDATE graph_meta SET value = 4")?;
    let err = GraphStore::open(&url, LEASE, false).err().ok_or("opened")?;
    assert!(
        err.to_string().contains("(table format) has version 4"),
        "{err}"
    );
    let format: i64 = conn.query_row("SELECT value FROM graph_meta", [], |r| r.get(0))?;
    assert_eq!(format, 4);
    Ok(())
}

/// On every store, graph tables of a newer format are refused with what
/// is wrong.
#[test]
fn a_newer_table_format_is_refused_on_every_store() -> TestResult {
    on_every_store(|url, schema| {
        if url == "memory:" {
            return Ok(());
        }
        GraphStore::open(url, LEASE, false)?.close()?;
        let meta = match schema {
            Some(schema) => format!("\"{schema}\".graph_meta"),
            None => "graph_meta".to_string(),
        };
        // exec() names the thread table `{t}`; the meta table is named here.
        exec(url, schema, &format!("UPDATE {meta} SET value = 4"))?;
        let err = GraphStore::open(url, LEASE, false).err().ok_or("opened")?;
        assert!(err.to_string().contains("has version 4"), "{url}: {err}");
        Ok(())
    })
}

/// `url` with a blob threshold of 1 KiB, whatever its kind.
fn small_blobs(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}blob_threshold=1KiB")
}

/// The single number `sql` returns on the store at `url`; `{s}.` before a
/// table name becomes the test schema on PostgreSQL.
fn count(url: &str, schema: Option<&str>, sql: &str) -> Result<i64, Box<dyn std::error::Error>> {
    match schema {
        None => {
            let path = url.trim_start_matches("sqlite:");
            let path = path.split('?').next().unwrap_or(path);
            let conn = rusqlite::Connection::open(path)?;
            Ok(conn.query_row(&sql.replace("{s}.", ""), [], |r| r.get(0))?)
        }
        Some(schema) => {
            let base = url.split("schema=").next().unwrap_or(url);
            let base = base.trim_end_matches(['?', '&']).to_string();
            let sql = sql.replace("{s}.", &format!("\"{schema}\"."));
            let n = tokio::runtime::Runtime::new()?.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                client
                    .query_one(&sql, &[])
                    .await
                    .map(|r| r.get::<_, i64>(0))
            })?;
            Ok(n)
        }
    }
}

/// Saves the pending writes `(index, channel, type, bytes)` of task "task"
/// to checkpoint `id` of thread `thread` (namespace "").
fn put_task_writes(
    s: &GraphStore,
    thread: &str,
    id: &str,
    writes: &[(i64, &str, &str, &[u8])],
) -> Result<(), GraphError> {
    s.put_writes(
        thread.into(),
        "".into(),
        id.into(),
        "task".into(),
        "".into(),
        writes
            .iter()
            .map(|(i, c, t, d)| (*i, c.to_string(), t.to_string(), d.to_vec()))
            .collect(),
    )
}

/// Saves checkpoint `id` of thread `thread`, a child of `parent`, for run
/// `run`, with large channel values `channels` (channel, bytes).
fn put_large(
    s: &GraphStore,
    thread: &str,
    id: &str,
    parent: Option<&str>,
    run: &str,
    channels: &[(&str, &[u8])],
) -> Result<(), GraphError> {
    s.put(
        thread.into(),
        "".into(),
        id.into(),
        parent.map(String::from),
        "json".into(),
        b"{}".to_vec(),
        meta(run),
        Some(run.into()),
        channels
            .iter()
            .map(|(c, d)| (c.to_string(), "bytes".to_string(), d.to_vec()))
            .collect(),
    )
}

/// A checkpoint's large channel values and a pending write's large value
/// are stored once per thread however many checkpoints carry them, read
/// back as they were, copied with their thread, and freed when the last
/// checkpoint or write that refers to them goes (a replaced checkpoint, a
/// replaced special write, prune, delete_for_runs, delete_thread).
#[test]
fn large_values_are_stored_once_per_thread_and_freed_with_their_last_reference() -> TestResult {
    on_every_store(|url, schema| {
        let url = small_blobs(url);
        let a = GraphStore::open(&url, LEASE, false)?;
        assert_eq!(a.blob_threshold(), 1024, "{url}");
        let doc = vec![b'd'; 4096];
        let other = vec![b'o'; 3000];
        let out = vec![b'w'; 2048];
        let blobs = |thread: &str| -> Result<i64, Box<dyn std::error::Error>> {
            count(
                &url,
                schema,
                &format!("SELECT count(*) FROM {{s}}.graph_blobs WHERE thread_id = '{thread}'"),
            )
        };
        let memory = url.starts_with("memory:");
        let expect = |thread: &str, n: i64| -> TestResult {
            if !memory {
                assert_eq!(blobs(thread)?, n, "{url}: blobs of thread {thread}");
            }
            Ok(())
        };
        put_large(&a, "t", "c1", None, "r1", &[("doc", &doc)])?;
        put_large(
            &a,
            "t",
            "c2",
            Some("c1"),
            "r2",
            &[("doc", &doc), ("more", &other)],
        )?;
        put_task_writes(
            &a,
            "t",
            "c2",
            &[
                (0, "out", "bytes", &out),
                (1, "small", "json", b"1"),
                (2, "again", "bytes", &doc),
            ],
        )?;
        // doc (twice in checkpoints, once in a write), other, out.
        expect("t", 3)?;
        let c2 = a.get("t".into(), "".into(), None)?.ok_or("no c2")?;
        assert_eq!(c2.2, "c2");
        let channels: Vec<(&str, &[u8])> =
            c2.8.iter()
                .map(|c| (c.0.as_str(), c.2.as_slice()))
                .collect();
        assert_eq!(channels, [("doc", &doc[..]), ("more", &other[..])], "{url}");
        let writes: Vec<(&str, &[u8])> =
            c2.7.iter()
                .map(|w| (w.1.as_str(), w.3.as_slice()))
                .collect();
        assert_eq!(
            writes,
            [("out", &out[..]), ("small", &b"1"[..]), ("again", &doc[..])],
            "{url}"
        );
        let listed = a.list(Some("t".into()), None, None, None, None, None)?;
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[1].8,
            vec![("doc".to_string(), "bytes".to_string(), doc.clone())]
        );

        // A write kept once keeps its first value: the second's blob is
        // not left behind.
        put_task_writes(&a, "t", "c2", &[(0, "out", "bytes", &[b'z'; 5000])])?;
        expect("t", 3)?;
        let again = a.get("t".into(), "".into(), None)?.ok_or("no c2")?;
        assert_eq!(again.7[0].3, out, "{url}: the first value stays");

        // A copy reads the same and holds blobs of its own.
        a.copy_thread("t".into(), "t2".into())?;
        let copied = a.get("t2".into(), "".into(), None)?.ok_or("no copy")?;
        assert_eq!(
            (copied.7.clone(), copied.8.clone()),
            (c2.7.clone(), c2.8.clone())
        );
        expect("t2", 3)?;

        // Saving c2 again without `more` frees it; a special write replaced
        // by a small one frees its blob.
        put_large(&a, "t", "c2", Some("c1"), "r2", &[("doc", &doc)])?;
        expect("t", 2)?;
        let resaved = a.get("t".into(), "".into(), None)?.ok_or("no c2")?;
        assert_eq!((resaved.4.as_str(), resaved.8.len()), ("json", 1), "{url}");
        let special = vec![b's'; 5000];
        for value in [special.clone(), b"0".to_vec()] {
            put_task_writes(&a, "t", "c2", &[(-1, "__error__", "bytes", &value)])?;
        }
        expect("t", 2)?;

        // Prune keeps c2, which still refers to doc; deleting r2's
        // checkpoints leaves the thread without blobs.
        a.prune(vec!["t".into()], true)?;
        expect("t", 2)?;
        // The copy's c2 is r2's too: its c1 keeps doc.
        a.delete_for_runs(vec!["r2".into()])?;
        expect("t", 0)?;
        expect("t2", 1)?;
        let left = a
            .get("t2".into(), "".into(), None)?
            .ok_or("no c1 in the copy")?;
        assert_eq!((left.2.as_str(), left.8[0].2.len()), ("c1", doc.len()));
        a.delete_thread("t2".into())?;
        expect("t2", 0)?;
        Ok(())
    })
}

/// A blob changed or missing under a checkpoint is an error naming the
/// channel or write, never a wrong value.
#[test]
fn a_changed_or_missing_blob_is_corrupt() -> TestResult {
    on_every_store(|url, schema| {
        if url.starts_with("memory:") {
            return Ok(());
        }
        let url = small_blobs(url);
        let a = GraphStore::open(&url, LEASE, false)?;
        put_large(&a, "t", "c1", None, "r1", &[("doc", &[b'x'; 2000])])?;
        let table = match schema {
            Some(schema) => format!("\"{schema}\".graph_blobs"),
            None => "graph_blobs".to_string(),
        };
        let exec_url = url.split('?').next().map(String::from).unwrap_or_default();
        let exec_url = if schema.is_some() {
            url.clone()
        } else {
            exec_url
        };
        let changed = match schema {
            Some(_) => format!("UPDATE {table} SET data = decode('79', 'hex') || data"),
            None => format!("UPDATE {table} SET data = CAST(x'79' || data AS BLOB)"),
        };
        exec(&exec_url, schema, &changed)?;
        let err = a.get("t".into(), "".into(), None).err().ok_or("read")?;
        let text = err.to_string();
        assert!(
            text.contains("channel \"doc\"") && text.contains("does not hash to its name"),
            "{url}: {text}"
        );
        exec(&exec_url, schema, &format!("DELETE FROM {table}"))?;
        let err = a.get("t".into(), "".into(), None).err().ok_or("read")?;
        assert!(err.to_string().contains("not in the store"), "{url}: {err}");

        // A reference gone: the checkpoint's type still counts it.
        let channels = table.replace("graph_blobs", "graph_channels");
        exec(&exec_url, schema, &format!("DELETE FROM {channels}"))?;
        let err = a.get("t".into(), "".into(), None).err().ok_or("read")?;
        assert!(
            err.to_string()
                .contains("refers to 1 large channel value(s), but 0 are stored"),
            "{url}: {err}"
        );

        // A large write's blob changed, in a copy only: found when every
        // thread is listed, though the source's same blob is sound.
        a.delete_thread("t".into())?;
        put_task_writes(&a, "w", "c1", &[(0, "out", "bytes", &[b'o'; 3000])])?;
        put_large(&a, "w", "c1", None, "r1", &[])?;
        a.copy_thread("w".into(), "w2".into())?;
        let only_copy = match schema {
            Some(_) => format!(
                "UPDATE {table} SET data = decode('79', 'hex') || data WHERE thread_id = 'w2'"
            ),
            None => format!(
                "UPDATE {table} SET data = CAST(x'79' || data AS BLOB) WHERE thread_id = 'w2'"
            ),
        };
        exec(&exec_url, schema, &only_copy)?;
        assert_eq!(
            a.get("w".into(), "".into(), None)?.ok_or("w")?.7[0].3.len(),
            3000
        );
        let err = a
            .list(None, None, None, None, None, None)
            .err()
            .ok_or("listed")?;
        let text = err.to_string();
        assert!(
            text.contains("write 0 of task \"task\"")
                && text.contains("thread \"w2\"")
                && text.contains("does not hash to its name"),
            "{url}: {text}"
        );

        // Types the stored marks would be confused with are refused.
        for ty in ["blob/x", "blobs/1/x"] {
            let err = put_task_writes(&a, "w", "c1", &[(1, "c", ty, b"1")])
                .err()
                .ok_or("taken")?;
            assert!(err.to_string().contains("may not begin with"), "{err}");
        }
        Ok(())
    })
}

/// A store of format 2 that has checkpoints and writes is brought to 3 in
/// place: its rows read as before, and large values can be added.
#[test]
fn format_2_tables_with_rows_are_upgraded_to_blobs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("v2.db");
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.execute_batch(
            "CREATE TABLE graph_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT INTO graph_meta VALUES ('format', 2);
             CREATE TABLE graph_checkpoints (
               thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
               parent_id TEXT, type TEXT NOT NULL, blob BLOB NOT NULL, metadata TEXT NOT NULL, run_id TEXT,
               PRIMARY KEY (thread_id, ns, checkpoint_id));
             CREATE TABLE graph_writes (
               thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL,
               idx INTEGER NOT NULL, channel TEXT NOT NULL, type TEXT NOT NULL, blob BLOB NOT NULL,
               task_path TEXT NOT NULL, PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx));
             CREATE TABLE graph_threads (thread_id TEXT PRIMARY KEY, holder TEXT NOT NULL,
               until_ms INTEGER NOT NULL, generation INTEGER NOT NULL, local_until_ms INTEGER,
               local_generation INTEGER) WITHOUT ROWID;
             INSERT INTO graph_checkpoints VALUES ('t', '', 'c1', NULL, 'json', x'7b7d', '{}', 'r1');
             INSERT INTO graph_writes VALUES ('t', '', 'c1', 'task', 0, 'ch', 'json', x'31', '');",
        )?;
    }
    let url = format!("sqlite:{}?blob_threshold=1KiB", path.display());
    let a = GraphStore::open(&url, LEASE, false)?;
    let old = a
        .get("t".into(), "".into(), None)?
        .ok_or("the old checkpoint")?;
    assert_eq!((old.4.as_str(), old.5.as_slice()), ("json", &b"{}"[..]));
    assert_eq!(
        (old.7[0].2.as_str(), old.7[0].3.as_slice()),
        ("json", &b"1"[..])
    );
    put_large(&a, "t", "c2", Some("c1"), "r1", &[("doc", &[b'd'; 2000])])?;
    assert_eq!(
        a.get("t".into(), "".into(), None)?.ok_or("c2")?.8[0]
            .2
            .len(),
        2000
    );
    let conn = rusqlite::Connection::open(&path)?;
    let format: i64 = conn.query_row("SELECT value FROM graph_meta", [], |r| r.get(0))?;
    assert_eq!(format, 3);
    let stored_type: String = conn.query_row(
        "SELECT type FROM graph_checkpoints WHERE checkpoint_id = 'c2'",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(
        stored_type, "blobs/1/json",
        "a build without blobs cannot load it"
    );
    Ok(())
}
