//! The Cosmos store beyond the conformance suite, against the local
//! protocol server: a state that grows to 10 MB and resumes, faults (429 and
//! 503, before and after the write), two processes racing on one run, and
//! processes killed at random moments.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use steadfast_conformance::runtime as rt;

use serde_json::json;
use steadfast_core::store::SaveRequest;
use steadfast_core::StoreExt as _;
use steadfast_core::{
    run, update, Checkpoint, RetryPolicy, RunStatus, Runner, Step, StepError, StepRecord, Store,
    StoreErrorKind, Timestamp, Workflow,
};
use steadfast_cosmos::{CosmosOptions, CosmosStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A client of the test server's own endpoints (it checks no signature),
/// trusting its certificate.
fn test_client(server: &(String, String)) -> Result<reqwest::Client, Box<dyn std::error::Error>> {
    let tls = steadfast_core::store::tls::verified(Some(&server.1), "cafile")?;
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()?)
}

/// Sets the test server's faults: the next `count` writes answer `status`,
/// before they are applied or after.
async fn inject(
    server: &(String, String),
    db: &support::TestDb,
    status: u16,
    count: u32,
    applied: bool,
) -> TestResult {
    let client = test_client(server)?;
    let base = server.0.replace("cosmos://", "https://");
    let r = client
        .post(format!("{base}/__steadfast/faults"))
        .body(
            json!({"db": db.name(), "status": status, "count": count, "applied": applied})
                .to_string(),
        )
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 204, "the test server took the faults");
    Ok(())
}

/// How many injected faults the test server has not used yet.
async fn faults_left(server: &(String, String)) -> Result<u64, Box<dyn std::error::Error>> {
    let client = test_client(server)?;
    let base = server.0.replace("cosmos://", "https://");
    let v: serde_json::Value = serde_json::from_slice(
        &client
            .get(format!("{base}/__steadfast/faults"))
            .send()
            .await?
            .bytes()
            .await?,
    )?;
    Ok(v["count"].as_u64().unwrap_or(u64::MAX))
}

/// A workflow of `n` steps that counts its executions per step.
fn counted(n: usize, counts: &Arc<Mutex<Vec<u32>>>) -> Workflow {
    let mut b = Workflow::builder("counted");
    for i in 0..n {
        let counts = Arc::clone(counts);
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| {
                counts.lock().unwrap()[i] += 1;
                async move { update(json!({ format!("s{i}"): i })) }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

/// A state that grows past 10 MB in 1 MB steps (each update and the
/// snapshot too large for one item) is saved in chunks, survives a failed
/// call in the middle, and resumes to the end with every value intact.
#[test]
fn a_state_of_ten_megabytes_is_saved_in_chunks_and_resumes() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&server);
        let store = db.store(CosmosOptions::default()).await;
        let fail_once = Arc::new(Mutex::new(true));
        let mut b = Workflow::builder("big");
        for i in 0..11 {
            let fail_once = Arc::clone(&fail_once);
            b = b.push(
                Step::new(format!("s{i}"), move |_, _| {
                    let fail = i == 6 && std::mem::replace(&mut *fail_once.lock().unwrap(), false);
                    async move {
                        if fail {
                            return Err(StepError::terminal("the process went away"));
                        }
                        update(json!({ format!("k{i}"): format!("{i}").repeat(1_000_000) }))
                    }
                })
                .retry(RetryPolicy::none()),
            );
        }
        let wf = b.build()?;
        let first = run("big-1", &wf, &store).await;
        assert!(first.is_err(), "step 6 fails the first call");
        let cp = store.load("big-1").await?.expect("saved");
        assert_eq!((cp.next, cp.status), (6, RunStatus::Failed));
        // A fresh handle (no cache) resumes it.
        let again = db.store(CosmosOptions::default()).await;
        let state = run("big-1", &wf, &again)
            .await?
            .completed()
            .expect("completed");
        assert_eq!(state.len(), 11);
        for i in 0..11 {
            assert_eq!(
                state[&format!("k{i}")],
                json!(format!("{i}").repeat(1_000_000)),
                "k{i}"
            );
        }
        let history = again.history("big-1").await?.expect("history");
        assert_eq!(history.len(), 11);
        Ok(())
    })
}

/// Throttling (429) is waited out; a 503 after the write was applied is an
/// unknown outcome that the run loop resolves by loading; a 503 before it
/// fails the call without recording anything, and the next call resumes.
/// No step is lost, none is recorded twice.
#[test]
fn throttling_and_unavailability_lose_and_double_no_step() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&server);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Arc::new(Mutex::new(vec![0u32; 4]));
        let wf = counted(4, &counts);

        inject(&server, &db, 429, 3, false).await?;
        run("throttled", &wf, &store).await?;
        assert_eq!(faults_left(&server).await?, 0, "the 429s were met");
        assert_eq!(*counts.lock().unwrap(), [1, 1, 1, 1], "429s waited out");

        *counts.lock().unwrap() = vec![0; 4];
        inject(&server, &db, 503, 1, true).await?;
        run("ambiguous", &wf, &store).await?;
        assert_eq!(faults_left(&server).await?, 0, "the 503 was met");
        assert_eq!(
            *counts.lock().unwrap(),
            [1, 1, 1, 1],
            "a landed save recognised"
        );

        *counts.lock().unwrap() = vec![0; 4];
        inject(&server, &db, 503, 1, false).await?;
        let err = run("refused", &wf, &store)
            .await
            .expect_err("an unavailable store fails the call");
        // A 503 of a write is an unknown outcome; the reload finds that the
        // save did not land, and the call fails with it.
        let kind = err.store_error().map(|e| e.kind());
        assert_eq!(kind, Some(StoreErrorKind::OutcomeUnknown), "{err}");
        assert!(
            steadfast_core::error_chain(&err).contains("503"),
            "the injected 503: {err}"
        );
        assert_eq!(faults_left(&server).await?, 0, "the 503 was met");
        let stored = store.load("refused").await?.map(|c| c.next);
        assert!(
            stored.is_none_or(|n| n == 0),
            "nothing of the refused step was recorded: {stored:?}"
        );
        inject(&server, &db, 0, 0, false).await?;
        run("refused", &wf, &store).await?;
        let c = counts.lock().unwrap().clone();
        assert_eq!(c[1..], [1, 1, 1], "{c:?}");
        assert!(
            c[0] <= 2,
            "only the step whose save was refused ran again: {c:?}"
        );
        for id in ["throttled", "ambiguous", "refused"] {
            let cp = store.load(id).await?.expect("saved");
            assert_eq!((cp.status, cp.next), (RunStatus::Completed, 4), "{id}");
            let history = store.history(id).await?.expect("history");
            let names: Vec<&str> = history.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, ["s0", "s1", "s2", "s3"], "{id}");
        }
        Ok(())
    })
}

/// A wrong key is an error that says so, never an absent run. (The test
/// server checks no signature, so this checks the mapping of its answer.)
#[test]
fn a_missing_key_is_refused_before_anything_is_sent() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let url = format!("{}/tkeyless/runs?cafile={}", server.0, server.1);
        // No keyfile, and the variable unset in this process.
        let err = CosmosStore::open(&url).await.expect_err("no key");
        assert!(err.to_string().contains("STEADFAST_COSMOS_KEY"), "{err}");
        Ok(())
    })
}

const RACE: &str = "two_processes_racing_on_one_run_lose_no_update";

/// Two processes increment one run's counter by compare-and-swap, 100 times
/// each: exactly one wins each version, and no update is lost.
#[test]
fn two_processes_racing_on_one_run_lose_no_update() -> TestResult {
    if let Ok(url) = std::env::var("STEADFAST_TEST_COSMOS_CHILD") {
        return rt().block_on(async move {
            let store = CosmosStore::open(&url).await?;
            for _ in 0..100 {
                loop {
                    let cp = store.load("counter").await?.ok_or("no counter")?;
                    let mut next = cp.clone();
                    let n = cp.state["n"].as_u64().ok_or("n")?;
                    next.state.insert("n".into(), json!(n + 1));
                    match store.save(SaveRequest::new(&next, Some(cp.version))).await {
                        Ok(_) => break,
                        Err(e) if e.kind() == StoreErrorKind::Conflict => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Ok(())
        });
    }
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    let store = rt().block_on(db.store(CosmosOptions::default()));
    let mut cp = Checkpoint::new("counter", "count", Timestamp::from_unix_millis(0));
    cp.state.insert("n".into(), json!(0));
    rt().block_on(store.save(SaveRequest::new(&cp, None)))?;
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().expect("the test binary"))
                .args(["--exact", RACE, "--test-threads=1"])
                .env("STEADFAST_TEST_COSMOS_CHILD", &db.url)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn a child")
        })
        .collect();
    for mut c in children {
        assert!(c.wait()?.success(), "a racing child failed");
    }
    let cp = rt().block_on(store.load("counter"))?.expect("the counter");
    assert_eq!((cp.state["n"].clone(), cp.version), (json!(200), 201));
    Ok(())
}

const KILL: &str = "sigkill_at_random_moments_never_reruns_or_skips_a_saved_step";

/// Runs killed with SIGKILL at random moments and started again until they
/// finish: every step runs in order, a step runs again at most once per
/// kill, and no step sees a state without its predecessor's update.
#[test]
fn sigkill_at_random_moments_never_reruns_or_skips_a_saved_step() -> TestResult {
    const STEPS: usize = 8;
    let workflow = |log: String| {
        let mut b = Workflow::builder("torture");
        for i in 0..STEPS {
            let log = log.clone();
            b = b.push(
                Step::new(format!("s{i}"), move |ctx, state| {
                    let ok = i == 0 || state.contains_key(&format!("s{}", i - 1));
                    let line = format!("{} {i} {}\n", ctx.run_id(), if ok { "ok" } else { "bad" });
                    let log = log.clone();
                    async move {
                        use std::io::Write;
                        let mut f = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&log)?;
                        f.write_all(line.as_bytes())?;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        update(json!({ format!("s{i}"): i }))
                    }
                })
                .retry(RetryPolicy::none()),
            );
        }
        b.build().expect("a valid workflow")
    };
    if let Ok(url) = std::env::var("STEADFAST_TEST_COSMOS_CHILD") {
        let run_id = std::env::var("STEADFAST_TEST_RUN")?;
        let log = std::env::var("STEADFAST_TEST_LOG")?;
        rt().block_on(async move {
            let store = CosmosStore::open(&url).await?;
            Runner::new(&store).run(&run_id, &workflow(log)).await?;
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        std::process::exit(0);
    }
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    drop(rt().block_on(db.store(CosmosOptions::default())));
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("steps.log");
    let mut kills_per_run = Vec::new();
    let mut total = 0;
    for r in 0.. {
        if total >= 20 {
            break;
        }
        let run_id = format!("run-{r}");
        let mut kills = 0;
        loop {
            let mut child = std::process::Command::new(std::env::current_exe()?)
                .args(["--exact", KILL, "--test-threads=1"])
                .env("STEADFAST_TEST_COSMOS_CHILD", &db.url)
                .env("STEADFAST_TEST_RUN", &run_id)
                .env("STEADFAST_TEST_LOG", &log)
                .stdout(std::process::Stdio::null())
                .spawn()?;
            if kills < 10 {
                std::thread::sleep(Duration::from_millis(fastrand::u64(20..200)));
                if child.try_wait()?.is_none() {
                    child.kill()?;
                    child.wait()?;
                    kills += 1;
                    continue;
                }
            }
            assert!(
                child.wait()?.success(),
                "{run_id}: the child failed on its own"
            );
            break;
        }
        total += kills;
        kills_per_run.push((run_id, kills));
    }
    let text = std::fs::read_to_string(&log)?;
    for (run_id, kills) in &kills_per_run {
        let steps: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{run_id} ")))
            .map(|rest| {
                assert!(
                    rest.ends_with(" ok"),
                    "{run_id}: a step ran without its predecessor's update"
                );
                rest.split(' ')
                    .next()
                    .unwrap_or("")
                    .parse()
                    .unwrap_or(usize::MAX)
            })
            .collect();
        assert_eq!(steps.last(), Some(&(STEPS - 1)), "{run_id}: {steps:?}");
        let mut reruns = 0;
        for pair in steps.windows(2) {
            match pair[1] as isize - pair[0] as isize {
                0 => reruns += 1,
                1 => {}
                _ => panic!("{run_id}: skipped or went back: {steps:?}"),
            }
        }
        assert!(
            reruns <= *kills,
            "{run_id}: {reruns} reruns with {kills} kills: {steps:?}"
        );
    }
    eprintln!("{total} kills over {} runs", kills_per_run.len());
    Ok(())
}

/// Workers run unchanged on the Cosmos store: started runs are found by
/// their heads' wake time, and each step runs once.
#[test]
fn a_worker_runs_started_runs() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&server);
        let store: Arc<dyn Store> = Arc::new(db.store(CosmosOptions::default()).await);
        let counts = Arc::new(Mutex::new(vec![0u32; 3]));
        for i in 0..5 {
            steadfast_core::start(&*store, "counted", &format!("w{i}"), json!({}), false).await?;
        }
        // A run of a workflow this worker does not have stays pending.
        steadfast_core::start(&*store, "other", "o1", json!({}), false).await?;
        let registry = steadfast_core::Registry::new().workflow(counted(3, &counts));
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let worker = tokio::spawn(
            steadfast_core::Worker::new(Arc::clone(&store), registry)
                .concurrency(2)
                .poll(Duration::from_millis(50))
                .run(async move {
                    let _ = rx.wait_for(|s| *s).await;
                }),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let done = store
                .list(&steadfast_core::ListFilter::new().status(RunStatus::Completed))
                .await?;
            if done.len() == 5 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the worker did not finish: {done:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tx.send(true)?;
        let report = worker.await??;
        assert_eq!(report.completed, 5, "{report:?}");
        let other = store.load("o1").await?.expect("o1");
        assert_eq!(
            other.status,
            RunStatus::Pending,
            "another workflow's run was left alone"
        );
        assert_eq!(*counts.lock().unwrap(), [5, 5, 5], "each step once per run");
        Ok(())
    })
}

/// Child runs on Cosmos DB: a worker runs a parent and its three children
/// (at most two at once) to the end, each child once; cancelling a parent
/// that waits for its children cancels them.
#[test]
fn a_worker_runs_a_parent_and_its_children() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&server);
        let store: Arc<dyn Store> = Arc::new(db.store(CosmosOptions::default()).await);
        let ran = Arc::new(Mutex::new(Vec::<String>::new()));
        let ran2 = Arc::clone(&ran);
        let registry = steadfast_core::Registry::new()
            .durable("parent", |ctx| async move {
                let specs =
                    ["a", "b", "c"].map(|w| steadfast_core::ChildSpec::new(w, "child", json!(w)));
                let opts = steadfast_core::ChildOptions::new().at_once(2);
                ctx.children::<String>(specs, opts).await
            })
            .durable("child", move |ctx| {
                let ran = Arc::clone(&ran2);
                async move {
                    let word = ctx.input().await.unwrap_or_default();
                    let word = word.as_str().unwrap_or("").to_string();
                    ctx.step("up", move || {
                        let (ran, word) = (Arc::clone(&ran), word.clone());
                        async move {
                            ran.lock().unwrap().push(word.clone());
                            Ok::<_, steadfast_core::StepError>(word.to_uppercase())
                        }
                    })
                    .await
                }
            });
        steadfast_core::start(&*store, "parent", "p", json!(null), true).await?;
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let worker = tokio::spawn(
            steadfast_core::Worker::new(Arc::clone(&store), registry)
                .concurrency(3)
                .poll(Duration::from_millis(50))
                .run(async move {
                    let _ = rx.wait_for(|s| *s).await;
                }),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let cp = loop {
            let cp = store.load("p").await?.expect("the parent");
            if cp.status == RunStatus::Completed {
                break cp;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the parent did not finish: {cp:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tx.send(true)?;
        worker.await??;
        assert_eq!(cp.state["__result"], json!(["A", "B", "C"]));
        let mut ran = ran.lock().unwrap().clone();
        ran.sort();
        assert_eq!(ran, ["a", "b", "c"], "each child once");

        // Without a worker: the parent waits, and a cancel reaches its children.
        let parent = |ctx: steadfast_core::DurableCtx<'static, Arc<dyn Store>>| async move {
            ctx.child::<serde_json::Value>("only", "child", json!("x"))
                .await
        };
        steadfast_core::durable("q", &store, "parent", parent).await?;
        steadfast_core::ops::cancel(&*store, "q", None, "ada", &steadfast_core::SystemClock)
            .await?;
        let child = store
            .load(&steadfast_core::child_id("q", "only"))
            .await?
            .expect("the child");
        assert_eq!(child.status, RunStatus::Cancelled);
        Ok(())
    })
}

/// Every item of the database, as `(id, etag)`, sorted: the partition's
/// exact contents. (The test server checks no signature.)
async fn all_items(
    server: &(String, String),
    db: &support::TestDb,
) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let client = test_client(server)?;
    let base = server.0.replace("cosmos://", "https://");
    let answer = client
        .post(format!("{base}/dbs/{}/colls/runs/docs", db.name()))
        .header("content-type", "application/query+json")
        .header("x-ms-documentdb-isquery", "True")
        .header("x-ms-documentdb-query-enablecrosspartition", "True")
        .body(json!({"query": "SELECT c.id, c._etag FROM c", "parameters": []}).to_string())
        .send()
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&answer.bytes().await?)?;
    let mut items: Vec<(String, String)> = v["Documents"]
        .as_array()
        .ok_or("no documents")?
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap_or("").to_string(),
                d["_etag"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    items.sort();
    Ok(items)
}

/// A stale checkpoint (its head's ETag moved on) changes nothing in the
/// run's partition: not the head, and no history item of the step it
/// carried.
#[test]
fn a_stale_batch_leaves_the_partition_exactly_as_it_was() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&server);
        let store = db.store(CosmosOptions::default()).await;
        let mut cp = Checkpoint::new("stale", "wf", Timestamp::from_unix_millis(1));
        let mut expected = None;
        // A second handle that reads the run at version 2 (and so holds its
        // ETag), then saves after the first handle moved it on.
        let stale_store = db.store(CosmosOptions::default()).await;
        for i in 0..3usize {
            if i == 2 {
                assert_eq!(stale_store.load("stale").await?.map(|c| c.version), Some(2));
            }
            let update: steadfast_core::Update =
                [(format!("s{i}"), json!(i))].into_iter().collect();
            steadfast_core::merge(&mut cp.state, update.clone());
            cp.completed.push(format!("s{i}"));
            cp.next = i + 1;
            let step = StepRecord::new(
                i,
                &format!("s{i}"),
                update,
                1,
                Timestamp::from_unix_millis(1),
                Timestamp::from_unix_millis(2),
            );
            expected = Some(
                store
                    .save(SaveRequest::new(&cp, expected).with_step(&step))
                    .await?,
            );
        }
        let before = all_items(&server, &db).await?;
        assert!(
            before.len() >= 4,
            "a head and three history items: {before:?}"
        );
        let old = {
            let mut c = cp.clone();
            c.completed.truncate(2);
            c.next = 2;
            c.state.remove("s2");
            c
        };
        let mut next = old.clone();
        let update: steadfast_core::Update = [("x".to_string(), json!(1))].into_iter().collect();
        steadfast_core::merge(&mut next.state, update.clone());
        next.completed.push("x".into());
        next.next = 3;
        let step = StepRecord::new(
            2,
            "x",
            update,
            1,
            Timestamp::from_unix_millis(1),
            Timestamp::from_unix_millis(2),
        );
        let err = stale_store
            .save(SaveRequest::new(&next, Some(2)).with_step(&step))
            .await
            .expect_err("stale");
        assert_eq!(err.kind(), StoreErrorKind::Conflict, "{err}");
        assert_eq!(
            all_items(&server, &db).await?,
            before,
            "the partition changed"
        );
        Ok(())
    })
}

/// A run whose steps all return one 300 KB document writes it once: the
/// steps after the first write only a reference (one read to see that the
/// blob is there, where a new document writes its parts). Loads, history
/// and a rewind give the values back.
#[tokio::test]
async fn a_value_a_run_returns_again_is_written_once() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    let store = db
        .store(CosmosOptions::default().blob_threshold(64 << 10))
        .await;
    let doc = |k: usize| format!("{k:04}").repeat(75_000);
    let flow = |same: bool| {
        let mut b = Workflow::builder("reader");
        for i in 0..6usize {
            b = b.push(Step::new(format!("s{i}"), move |_, _| async move {
                let k = if same { 0 } else { i };
                update(json!({ format!("d{i}"): doc(k) }))
            }));
        }
        b.build().expect("a valid workflow")
    };
    let requests = |s: &CosmosStore| s.request_charge().1;
    let before = requests(&store);
    run("same", &flow(true), &store).await?;
    let same = requests(&store) - before;
    let before = requests(&store);
    run("distinct", &flow(false), &store).await?;
    let distinct = requests(&store) - before;
    assert!(
        same + 10 <= distinct,
        "one document six times took {same} requests, six documents {distinct}"
    );
    let cp = store.load("same").await?.ok_or("stored")?;
    for i in 0..6 {
        assert_eq!(cp.state[&format!("d{i}")], json!(doc(0)));
    }
    let h = store.history("distinct").await?.ok_or("stored")?;
    assert_eq!(h[4].update["d4"], json!(doc(4)));
    steadfast_core::ops::rewind(
        &store,
        "distinct",
        "s3",
        "test",
        &steadfast_core::SystemClock,
    )
    .await?;
    let cp = store.load("distinct").await?.ok_or("stored")?;
    assert_eq!(cp.state["d2"], json!(doc(2)));
    assert!(cp.state.get("d3").is_none());
    assert!(store.delete("same").await?);
    let err = CosmosStore::open_with(
        &format!("{}&blob_threshold=10", db.url),
        CosmosOptions::default(),
    )
    .await
    .expect_err("a threshold of 10 bytes");
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{err}");
    Ok(())
}

/// A fresh database's store that keeps values over `threshold` bytes as
/// blobs, with the database (dropped with it); `None` without a server.
async fn with_blobs_over(threshold: u64) -> Option<(support::TestDb, CosmosStore)> {
    let server = support::server()?;
    let db = support::TestDb::new(&server);
    let store = db
        .store(CosmosOptions::default().blob_threshold(threshold))
        .await;
    Some((db, store))
}

/// A rewind frees the blobs that only the rows it left above the run's
/// `next` held, and a prune those the rows it folded away referred to;
/// what the run still refers to stays, and running on writes the rest
/// again.
#[tokio::test]
async fn rewinds_and_prunes_free_the_blobs_only_dropped_rows_held() -> TestResult {
    let Some((_db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let agent = steadfast_conformance::fixtures::rereading_agent;
    let blobs = |s: &CosmosStore| {
        let s = s.clone();
        async move {
            let b = s.capabilities().blobs.ok_or("no blobs")?;
            let u = b.usage("r").await?.ok_or("no run")?;
            Ok::<u64, Box<dyn std::error::Error>>(u.blobs)
        }
    };
    run("r", &agent(6, 0), &store).await?;
    // Two shared documents and one of each step's own.
    assert_eq!(blobs(&store).await?, 2 + 6);
    steadfast_core::ops::rewind(&store, "r", "s4", "test", &steadfast_core::SystemClock).await?;
    assert_eq!(
        blobs(&store).await?,
        2 + 4,
        "the rewind freed s4's and s5's own documents"
    );
    // The rewind's sweep wrote the head: the store saves on all the same.
    steadfast_core::ops::prune(&store, "r", 1, "test", &steadfast_core::SystemClock).await?;
    assert_eq!(blobs(&store).await?, 2 + 4, "the prune kept what is held");
    let cp = store.load("r").await?.ok_or("stored")?;
    for i in 0..4 {
        assert_eq!(
            cp.state[&format!("own{i}")],
            json!(steadfast_conformance::fixtures::doc(1000 + i, 20))
        );
    }
    run("r", &agent(6, 0), &store).await?;
    assert_eq!(blobs(&store).await?, 2 + 6);
    let history = store.history("r").await?.ok_or("stored")?;
    assert_eq!(
        history.last().map(|r| &r.update["own5"]),
        Some(&json!(steadfast_conformance::fixtures::doc(1005, 20)))
    );
    Ok(())
}

/// A create that loses to another create of the same run (a handle with no
/// account of it saves it as new) fails as a conflict and leaves nothing of
/// its own behind: the blobs and the chunk items it wrote before its batch,
/// under a generation no head names, are deleted again. Before, they stayed
/// for good (nothing reads them, nothing removed them).
#[tokio::test]
async fn a_create_that_loses_the_race_for_a_run_leaves_no_items() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    // Blobs: values over 16 KiB.
    let first = db
        .store(CosmosOptions::default().blob_threshold(16 << 10))
        .await;
    run(
        "r",
        &steadfast_conformance::fixtures::rereading_agent(4, 0),
        &first,
    )
    .await?;
    let before = support::count_kinds(&server, db.name()).await?;
    assert_eq!(before.get("blob_manifest"), Some(&6), "{before:?}");
    let other = db
        .store(CosmosOptions::default().blob_threshold(16 << 10))
        .await;
    let mut cp = Checkpoint::new("r", "agent", Timestamp::from_unix_millis(1));
    let update: steadfast_core::Update = [
        ("mine".to_string(), json!("m".repeat(40 << 10))),
        ("also".to_string(), json!("a".repeat(30 << 10))),
    ]
    .into_iter()
    .collect();
    steadfast_core::merge(&mut cp.state, update.clone());
    cp.next = 1;
    cp.completed = vec!["s0".into()];
    let t = Timestamp::from_unix_millis(1);
    let step = StepRecord::new(0, "s0", update, 1, t, t);
    let lost = other
        .save(SaveRequest::new(&cp, None).with_step(&step))
        .await
        .expect_err("the run is there");
    assert_eq!(lost.kind(), StoreErrorKind::Conflict, "{lost}");
    let after = support::count_kinds(&server, db.name()).await?;
    assert_eq!(after, before, "items the lost create wrote");

    // Chunks: a state of 3 MB kept inline (no blobs) is written in chunks.
    let inline = db
        .store(CosmosOptions::default().blob_threshold(1 << 30))
        .await;
    let mut big = Checkpoint::new("big", "w", Timestamp::from_unix_millis(1));
    big.state.insert("doc".into(), json!("d".repeat(3 << 20)));
    inline.save(SaveRequest::new(&big, None)).await?;
    let before = support::count_kinds(&server, db.name()).await?;
    let again = db
        .store(CosmosOptions::default().blob_threshold(1 << 30))
        .await;
    // Its step's update is chunked too.
    let update: steadfast_core::Update = [("doc".to_string(), json!("e".repeat(3 << 20)))]
        .into_iter()
        .collect();
    let mut rival = big.clone();
    steadfast_core::merge(&mut rival.state, update.clone());
    rival.next = 1;
    rival.completed = vec!["s0".into()];
    let t = Timestamp::from_unix_millis(1);
    let step = StepRecord::new(0, "s0", update, 1, t, t);
    let lost = again
        .save(SaveRequest::new(&rival, None).with_step(&step))
        .await
        .expect_err("the run is there");
    assert_eq!(lost.kind(), StoreErrorKind::Conflict, "{lost}");
    let after = support::count_kinds(&server, db.name()).await?;
    assert!(before.get("chunk").is_some_and(|n| *n > 0), "{before:?}");
    assert_eq!(after, before, "chunks the lost create wrote");
    // The runs that won are whole.
    let r = first.load("r").await?.ok_or("r vanished")?;
    assert_eq!(r.next, 4);
    let kept = inline.load("big").await?.ok_or("big vanished")?;
    assert_eq!(kept.state["doc"], json!("d".repeat(3 << 20)));
    Ok(())
}

/// A prune that frees more blobs than one batch holds frees them all: each
/// batch's deletes (answered 204) count as applied, and the next batch
/// goes on.
#[tokio::test]
async fn a_prune_frees_blobs_across_several_batches() -> TestResult {
    let Some((_db, store)) = with_blobs_over(1024).await else {
        return Ok(());
    };
    let mut wf = Workflow::builder("w");
    for i in 0..60 {
        wf = wf.step(format!("s{i}"), move |_, _| async move {
            update(json!({ "doc": format!("{i:04}{}", "x".repeat(2000)) }))
        });
    }
    let wf = wf.build()?;
    run("r", &wf, &store).await?;
    let blobs = || async {
        let b = store.capabilities().blobs.ok_or("no blobs")?;
        let u = b.usage("r").await?.ok_or("no run")?;
        Ok::<u64, Box<dyn std::error::Error>>(u.blobs)
    };
    assert_eq!(blobs().await?, 60, "each step's own document");
    steadfast_core::ops::prune(&store, "r", 1, "test", &steadfast_core::SystemClock)
        .await?
        .ok_or("nothing pruned")?;
    // 58 blobs of two items each: more than one batch of 99 deletes.
    assert_eq!(
        blobs().await?,
        2,
        "the fold row's and the last row's documents stay, the rest go"
    );
    Ok(())
}

/// Loads and history reads running (on another thread) while prunes free
/// blobs never report a run as damaged nor miss a value: a read that finds
/// a freed blob reads the run again from the head the prune wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_prunes_that_free_blobs_see_whole_runs() -> TestResult {
    let Some((_db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let agent = steadfast_conformance::fixtures::rereading_agent;
    run("r", &agent(6, 0), &store).await?;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                let cp = store.load("r").await?.expect("stored");
                assert!(cp.state.contains_key("shared0"), "{:?}", cp.state.keys());
                store.history("r").await?.expect("stored");
                reads += 1;
            }
            Ok::<u32, steadfast_core::StoreError>(reads)
        })
    };
    for _ in 0..8 {
        steadfast_core::ops::rewind(&store, "r", "s3", "test", &steadfast_core::SystemClock)
            .await?;
        steadfast_core::ops::prune(&store, "r", 1, "test", &steadfast_core::SystemClock).await?;
        run("r", &agent(6, 0), &store).await?;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await??;
    assert!(reads > 0);
    let cp = store.load("r").await?.ok_or("stored")?;
    assert_eq!(
        cp.state["own5"],
        json!(steadfast_conformance::fixtures::doc(1005, 20))
    );
    Ok(())
}

/// What a delete cut short after the head (and its log item) left, and a
/// create that died after writing its large values, are removed by
/// `collect_leftovers` once old enough, item by item, and nothing of a
/// live run is touched: not its blobs, its history nor its events. Items
/// younger than the age are left, and a dry run only counts.
#[tokio::test]
async fn leftovers_of_cut_short_deletes_and_dead_creates_are_collected() -> TestResult {
    let Some((db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let server = support::server().ok_or("the server")?;
    let events = |run_id: &'static str| {
        let store = store.clone();
        async move {
            let ev = store.capabilities().events.ok_or("no events")?;
            let t = Timestamp::from_unix_millis(1);
            let batch: Vec<_> = (0..3)
                .map(|i| steadfast_core::NewEvent::new("s0", 1, t, json!({ "i": i })))
                .collect();
            ev.append_events(run_id, &batch).await?;
            Ok::<(), Box<dyn std::error::Error>>(())
        }
    };
    let agent = steadfast_conformance::fixtures::rereading_agent;
    run("live", &agent(4, 0), &store).await?;
    events("live").await?;
    let live = support::count_kinds(&server, db.name()).await?;
    run("gone", &agent(4, 1), &store).await?;
    events("gone").await?;
    // A delete cut short: the head and the log item went, nothing else.
    assert!(support::delete_raw(&server, db.name(), "gone", "h~gone").await?);
    assert!(support::delete_raw(&server, db.name(), "gone", "l~gone").await?);
    assert!(store.load("gone").await?.is_none());
    // Items of a generation no head names, as a create that died after
    // writing its blobs leaves them: here its head is taken away.
    run("died", &agent(2, 2), &store).await?;
    assert!(support::delete_raw(&server, db.name(), "died", "h~died").await?);
    let before = support::count_kinds(&server, db.name()).await?;
    let left = |k: &str| before.get(k).copied().unwrap_or(0) - live.get(k).copied().unwrap_or(0);
    // gone: 4 steps, 2 shared + 4 own blobs (one part each), 3 events;
    // died: 2 steps, 2 shared + 2 own blobs.
    assert_eq!(
        (left("step"), left("blob_manifest"), left("event")),
        (6, 10, 3),
        "{before:?}"
    );
    let expected_items =
        left("step") + left("chunk") + left("blob") + left("blob_manifest") + left("event");

    // Too young for the store's own age: nothing found.
    let none = steadfast_core::Blobs::collect_leftovers(&store, false).await?;
    assert_eq!(none, steadfast_core::Leftovers::default());
    let dry = store
        .collect_leftovers_older_than(Duration::ZERO, true)
        .await?;
    assert_eq!(dry, steadfast_core::Leftovers::new(3, expected_items));
    assert_eq!(
        support::count_kinds(&server, db.name()).await?,
        before,
        "a dry run removes nothing"
    );
    // Two writes refused (503): the first remnant's batch of deletes and
    // then its first delete alone. It is counted as failed; the others go.
    inject(&server, &db, 503, 2, false).await?;
    let first = store
        .collect_leftovers_older_than(Duration::ZERO, false)
        .await?;
    assert_eq!(faults_left(&server).await?, 0);
    assert_eq!((first.remnants, first.failed), (3, 1), "{first:?}");
    assert!(first.items < expected_items, "{first:?}");
    // The next call takes what is left of it.
    let second = store
        .collect_leftovers_older_than(Duration::ZERO, false)
        .await?;
    assert_eq!((second.remnants, second.failed), (1, 0), "{second:?}");
    assert_eq!(first.items + second.items, expected_items);
    assert_eq!(
        support::count_kinds(&server, db.name()).await?,
        live,
        "only the live run's items are left"
    );
    let cp = store.load("live").await?.ok_or("the live run")?;
    assert_eq!(cp.next, 4);
    assert_eq!(
        cp.state["own3"],
        json!(steadfast_conformance::fixtures::doc(1003, 20))
    );
    let ev = store.capabilities().events.ok_or("no events")?;
    assert_eq!(ev.read_events("live", 0, 10).await?.len(), 3);
    assert_eq!(store.history("live").await?.ok_or("history")?.len(), 4);
    // Nothing more to find; and a run created again under a collected id
    // starts clean.
    assert_eq!(
        store
            .collect_leftovers_older_than(Duration::ZERO, false)
            .await?,
        steadfast_core::Leftovers::default()
    );
    run("gone", &agent(4, 1), &store).await?;
    assert_eq!(store.load("gone").await?.ok_or("gone again")?.next, 4);
    assert!(ev.read_events("gone", 0, 10).await?.is_empty());
    Ok(())
}

/// A create whose large values took longer than its window sends no
/// batch: it fails as unavailable, saying why, and deletes what it wrote;
/// a create with no large value has nothing to wait for and lands.
#[tokio::test]
async fn a_create_past_its_window_saves_nothing_and_leaves_nothing() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    // A blob (40 KiB over a threshold of 16), and chunks alone (no blobs: a
    // 3 MB state kept inline) wait the same way.
    for (threshold, id, size) in [(16 << 10, "late", 40 << 10), (1 << 30, "chunked", 3 << 20)] {
        let store = db
            .store(
                CosmosOptions::default()
                    .blob_threshold(threshold)
                    .create_window(Duration::ZERO),
            )
            .await;
        let mut cp = Checkpoint::new(id, "w", Timestamp::from_unix_millis(1));
        cp.state.insert("doc".into(), json!("d".repeat(size)));
        let e = store
            .save(SaveRequest::new(&cp, None))
            .await
            .expect_err("past its window");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{id}: {e}");
        assert!(e.to_string().contains("a create may wait"), "{id}: {e}");
        assert!(store.load(id).await?.is_none());
        let kinds = support::count_kinds(&server, db.name()).await?;
        assert!(kinds.is_empty(), "{id}: {kinds:?}");
    }
    // A window longer than the store's own is refused.
    let long = CosmosOptions::default()
        .create_window(steadfast_cosmos::CREATE_WINDOW + Duration::from_secs(1));
    let refused = CosmosStore::open_with(&db.url, long)
        .await
        .expect_err("a window past the store's");
    assert_eq!(refused.kind(), StoreErrorKind::InvalidInput, "{refused}");
    // A create with no large value writes nothing before its batch.
    let store = db
        .store(
            CosmosOptions::default()
                .blob_threshold(16 << 10)
                .create_window(Duration::ZERO),
        )
        .await;
    let mut small = Checkpoint::new("small", "w", Timestamp::from_unix_millis(1));
    small.state.insert("doc".into(), json!("small"));
    store.save(SaveRequest::new(&small, None)).await?;
    assert!(store.load("small").await?.is_some());
    Ok(())
}

/// A blob too large for one batch (30 MiB and its quotes: 121 parts) is freed by a prune
/// all the same, its manifest with the first batch and its other parts
/// after; the same content written again afterwards (a rewind, then the
/// step again) is whole, under parts of its own.
#[tokio::test]
async fn a_prune_frees_a_blob_larger_than_a_batch() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    let store = db.store(CosmosOptions::default()).await;
    let big = || json!("b".repeat(30 << 20));
    let wf = Workflow::builder("w")
        .step(
            "s0",
            move |_, _| async move { update(json!({ "doc": big() })) },
        )
        .step("s1", |_, _| async { update(json!({ "doc": "small" })) })
        .step("s2", |_, _| async { update(json!({ "x": 1 })) })
        .build()?;
    run("r", &wf, &store).await?;
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert_eq!(kinds.get("blob_manifest"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("blob"), Some(&121), "{kinds:?}");
    steadfast_core::ops::prune(&store, "r", 1, "test", &steadfast_core::SystemClock)
        .await?
        .ok_or("nothing pruned")?;
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert_eq!(
        (kinds.get("blob_manifest"), kinds.get("blob")),
        (None, None),
        "the folded row's document is freed whole: {kinds:?}"
    );
    assert_eq!(
        store.load("r").await?.ok_or("r")?.state["doc"],
        json!("small")
    );
    // Written again after it was freed: whole.
    steadfast_core::ops::rewind(&store, "r", "s2", "test", &steadfast_core::SystemClock).await?;
    let wf_again = Workflow::builder("w")
        .step("s0", |_, _| async { update(json!({})) })
        .step("s1", |_, _| async { update(json!({})) })
        .step(
            "s2",
            move |_, _| async move { update(json!({ "doc": big() })) },
        )
        .build()?;
    run("r", &wf_again, &store).await?;
    // (Compared whole, not printed: 30 MiB.)
    let cp = store.load("r").await?.ok_or("r")?;
    assert!(
        cp.state["doc"] == big(),
        "the state's document read back whole"
    );
    let history = store.history("r").await?.ok_or("history")?;
    let last = history.last().ok_or("no history")?;
    assert_eq!(last.index, 2);
    assert!(
        last.update["doc"] == big(),
        "step 2's update read back whole"
    );
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert_eq!(
        (kinds.get("blob_manifest"), kinds.get("blob")),
        (Some(&1), Some(&121)),
        "{kinds:?}"
    );
    Ok(())
}

/// A create whose write of a blob's part landed but answered 503 (so the
/// store cannot know it landed) fails, and deletes that part all the same:
/// nothing of it is left for `gc`.
#[tokio::test]
async fn a_create_that_fails_after_a_write_landed_leaves_nothing() -> TestResult {
    let Some((db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let server = support::server().ok_or("the server")?;
    let mut cp = Checkpoint::new("r", "w", Timestamp::from_unix_millis(1));
    cp.state.insert("doc".into(), json!("d".repeat(40 << 10)));
    inject(&server, &db, 503, 1, true).await?;
    let e = store
        .save(SaveRequest::new(&cp, None))
        .await
        .expect_err("its first write answered 503");
    assert_eq!(faults_left(&server).await?, 0);
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert!(kinds.is_empty(), "{kinds:?}");
    // Saved again, it lands whole.
    store.save(SaveRequest::new(&cp, None)).await?;
    let back = store.load("r").await?.ok_or("r")?;
    assert_eq!(back.state["doc"], cp.state["doc"]);
    Ok(())
}

/// A blob manifest damaged or planted behind the store's back (a tag that
/// is not hex, one that would name items elsewhere, a count of parts the
/// blob could not have) makes a load of the run that refers to it fail as
/// corrupt, naming the manifest, without reading any part; a prune's
/// sweep leaves such a manifest alone and ends.
#[tokio::test]
async fn a_damaged_blob_manifest_is_corrupt_and_never_followed() -> TestResult {
    let Some((db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let server = support::server().ok_or("the server")?;
    let doc = |c: &str| json!(c.repeat(40 << 10));
    let wf = Workflow::builder("w")
        .step("s0", move |_, _| async move {
            update(json!({ "doc": doc("a") }))
        })
        .step("s1", move |_, _| async move {
            update(json!({ "doc": doc("b") }))
        })
        .step("s2", |_, _| async { update(json!({ "x": 1 })) })
        .build()?;
    run("r", &wf, &store).await?;
    let manifests = support::items_of_kind(&server, db.name(), "blob_manifest").await?;
    assert_eq!(manifests.len(), 2);
    for (field, bad) in [
        ("tag", json!("../../x")),
        ("tag", json!("not hex at all")),
        ("tag", json!(12)),
        ("parts", json!(u64::MAX)),
        ("parts", json!(0)),
    ] {
        for m in &manifests {
            let mut m = m.clone();
            m[field] = bad.clone();
            support::upsert_raw(&server, db.name(), &m).await?;
        }
        let e = store.load("r").await.expect_err("a damaged manifest");
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{field} {bad}: {e}");
        assert!(e.to_string().contains("~m"), "names the manifest: {e}");
    }
    for m in &manifests {
        support::upsert_raw(&server, db.name(), m).await?;
    }
    assert_eq!(store.load("r").await?.ok_or("r")?.state["doc"], doc("b"));
    // Planted manifests of contents no row refers to, in the run's
    // generation: a prune's sweep (freeing s0's document) passes over them
    // rather than follow a tag elsewhere or list 2^64 parts.
    let mut planted = manifests[0].clone();
    let id = planted["id"].as_str().ok_or("id")?.to_string();
    let hash = planted["hash"].as_str().ok_or("hash")?.to_string();
    for (n, (field, bad)) in [("tag", json!("../../x")), ("parts", json!(u64::MAX))]
        .into_iter()
        .enumerate()
    {
        let other = format!("{:064x}", n + 1);
        planted["id"] = json!(id.replace(&hash, &other));
        planted["hash"] = json!(other);
        planted[field] = bad;
        support::upsert_raw(&server, db.name(), &planted).await?;
    }
    steadfast_core::ops::prune(&store, "r", 1, "test", &steadfast_core::SystemClock)
        .await?
        .ok_or("nothing pruned")?;
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert_eq!(
        kinds.get("blob_manifest"),
        Some(&3),
        "s1's document and the two planted manifests stay, s0's went: {kinds:?}"
    );
    assert_eq!(store.load("r").await?.ok_or("r")?.state["doc"], doc("b"));
    Ok(())
}

/// Two collectors at once (two `gc` processes) both end without error,
/// take every leftover between them, each item once, and leave nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_at_once_take_each_leftover_once() -> TestResult {
    let Some((db, store)) = with_blobs_over(16 << 10).await else {
        return Ok(());
    };
    let server = support::server().ok_or("the server")?;
    let agent = steadfast_conformance::fixtures::rereading_agent;
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        run(id, &agent(6, i), &store).await?;
        assert!(support::delete_raw(&server, db.name(), id, &format!("h~{id}")).await?);
    }
    let kinds = support::count_kinds(&server, db.name()).await?;
    let items: u64 = kinds.values().sum();
    let other = db
        .store(CosmosOptions::default().blob_threshold(16 << 10))
        .await;
    let (one, two) = tokio::join!(
        store.collect_leftovers_older_than(Duration::ZERO, false),
        other.collect_leftovers_older_than(Duration::ZERO, false),
    );
    let (one, two) = (one?, two?);
    assert_eq!((one.failed, two.failed), (0, 0), "{one:?} {two:?}");
    assert_eq!(one.items + two.items, items, "{one:?} {two:?} of {kinds:?}");
    let left = support::count_kinds(&server, db.name()).await?;
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}

/// A run's delete takes its other items in batches: a run of 150 steps and
/// 40 events goes in a few requests, not one an item, and leaves nothing.
#[tokio::test]
async fn a_deleted_runs_items_go_in_batches() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    let store = db.store(CosmosOptions::default()).await;
    let empty = support::count_kinds(&server, db.name()).await?;
    long_run_with_events(&store, "long").await?;
    let kinds = support::count_kinds(&server, db.name()).await?;
    assert_eq!(
        (kinds.get("step"), kinds.get("event")),
        (Some(&150), Some(&40)),
        "{kinds:?}"
    );
    let before = store.request_charge().1;
    assert!(store.delete("long").await?);
    let used = store.request_charge().1 - before;
    assert!(used <= 20, "the delete took {used} requests");
    let left = support::count_kinds(&server, db.name()).await?;
    assert_eq!(left, empty, "left after the delete");
    assert!(store.load("long").await?.is_none());
    Ok(())
}

/// Run `run_id` of 150 steps on `store`, with 40 events in its log.
async fn long_run_with_events(store: &CosmosStore, run_id: &str) -> TestResult {
    let mut flow = Workflow::builder("long");
    for i in 0..150 {
        flow = flow.step(format!("s{i}"), move |_, _| async move {
            update(json!({ "i": i }))
        });
    }
    run(run_id, &flow.build()?, store).await?;
    let events = store.capabilities().events.ok_or("no events")?;
    let t = Timestamp::from_unix_millis(1);
    for round in 0..4 {
        let batch: Vec<_> = (0..10)
            .map(|i| steadfast_core::NewEvent::new("s0", 1, t, json!({ "i": round * 10 + i })))
            .collect();
        events.append_events(run_id, &batch).await?;
    }
    Ok(())
}

/// Two processes deleting one run at the same moment: their batches meet
/// items the other already took (a batch then fails whole and goes one at
/// a time), yet exactly one of them deleted the run, neither fails, and
/// nothing of it is left.
#[tokio::test]
async fn two_deletes_of_one_run_at_once_take_it_once() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    let store = db.store(CosmosOptions::default()).await;
    let other = db.store(CosmosOptions::default()).await;
    let empty = support::count_kinds(&server, db.name()).await?;
    for round in 0..3 {
        long_run_with_events(&store, "long").await?;
        let (a, b) = tokio::join!(store.delete("long"), other.delete("long"));
        let mut deleted = [a?, b?];
        deleted.sort();
        assert_eq!(deleted, [false, true], "round {round}");
        let left = support::count_kinds(&server, db.name()).await?;
        assert_eq!(left, empty, "left after round {round}");
    }
    Ok(())
}
