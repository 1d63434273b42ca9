//! The Cosmos store through a fault-injecting proxy (`ci/cosmos/faultproxy.js`)
//! in front of the local protocol server: throttling with an advertised
//! delay, a retry budget that runs out, writes whose answer is lost or
//! replaced after the server applied them (ambiguous), writes refused or
//! dropped before they reach the server, reads that time out or lose their
//! answer, delays, lost session tokens, and all of them at random. No step
//! is lost and none is recorded twice; a step runs again only when a call
//! failed.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use steadfast_conformance::runtime as rt;
use steadfast_core::{
    run, update, RetryPolicy, RunStatus, Step, Store, StoreErrorKind, StoreExt as _, Workflow,
};
use steadfast_cosmos::{CosmosOptions, CosmosStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The proxy's control endpoints.
struct Proxy {
    base: String,
    http: reqwest::Client,
}

impl Proxy {
    fn new(proxy: &(String, String)) -> Result<Self, Box<dyn std::error::Error>> {
        let tls = steadfast_core::store::tls::verified(Some(&proxy.1), "cafile")?;
        Ok(Proxy {
            base: proxy.0.replace("cosmos://", "https://"),
            http: reqwest::Client::builder()
                .use_preconfigured_tls(tls)
                .build()?,
        })
    }

    async fn post(&self, path: &str, body: Value) -> TestResult {
        let r = self
            .http
            .post(format!("{}/__proxy/{path}", self.base))
            .body(body.to_string())
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200, "the proxy took {body}");
        Ok(())
    }

    /// Adds a rule for database `db` (see faultproxy.js).
    async fn rule(&self, db: &support::TestDb, mut rule: Value) -> TestResult {
        rule["db"] = json!(db.name());
        self.post("rules", rule).await
    }

    async fn clear(&self, db: &support::TestDb) -> TestResult {
        self.post("rules", json!({"db": db.name(), "clear": true}))
            .await
    }

    /// How many writes to `db` the proxy saw.
    async fn writes(&self, db: &support::TestDb) -> Result<usize, Box<dyn std::error::Error>> {
        Ok(self.log(db).await?.iter().filter(|e| e.4).count())
    }

    /// The requests to `db` the proxy saw: (ms, method, path, fault, write).
    async fn log(&self, db: &support::TestDb) -> Result<Vec<Seen>, Box<dyn std::error::Error>> {
        let v: Value = serde_json::from_slice(
            &self
                .http
                .get(format!("{}/__proxy/log?db={}", self.base, db.name()))
                .send()
                .await?
                .bytes()
                .await?,
        )?;
        Ok(v.as_array()
            .ok_or("the log is a list")?
            .iter()
            .map(|e| {
                (
                    e["t"].as_u64().unwrap_or(0),
                    e["method"].as_str().unwrap_or("").to_string(),
                    e["path"].as_str().unwrap_or("").to_string(),
                    e["fault"].as_str().map(str::to_string),
                    e["write"].as_bool().unwrap_or(false),
                )
            })
            .collect())
    }
}

/// A workflow of `n` steps that counts its executions per run and step.
fn counted(n: usize, counts: &Arc<Mutex<std::collections::HashMap<String, Vec<u32>>>>) -> Workflow {
    let mut b = Workflow::builder("counted");
    for i in 0..n {
        let counts = Arc::clone(counts);
        b = b.push(
            Step::new(format!("s{i}"), move |ctx, _| {
                counts
                    .lock()
                    .unwrap()
                    .entry(ctx.run_id().to_string())
                    .or_insert_with(|| vec![0; n])[i] += 1;
                async move { update(json!({ format!("s{i}"): i })) }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

type Counts = Arc<Mutex<std::collections::HashMap<String, Vec<u32>>>>;

/// A request the proxy saw: ms, method, path, fault, whether a write.
type Seen = (u64, String, String, Option<String>, bool);

/// Calls `run` until the run completes (at most `calls` calls); returns how
/// many calls failed.
async fn run_to_the_end(
    id: &str,
    wf: &Workflow,
    store: &CosmosStore,
    calls: u32,
) -> Result<u32, Box<dyn std::error::Error>> {
    let mut failed = 0;
    loop {
        match run(id, wf, store).await {
            Ok(_) => return Ok(failed),
            Err(e) if failed + 1 < calls => {
                failed += 1;
                eprintln!("run {id}: call {failed} failed: {e}");
                // A save whose outcome was unknown may have left this
                // call's lease on the run: wait until it can be taken.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("run {id} did not complete in {calls} calls: {e}").into()),
        }
    }
}

/// The judge of these tests: the run completed with every step recorded
/// once, in order, and the full state; each step ran at least once, and
/// the executions beyond one per step are at most the calls that failed
/// (a step whose save was refused runs again; one whose save was
/// acknowledged never does).
async fn check_run(
    store: &CosmosStore,
    id: &str,
    n: usize,
    counts: &Counts,
    failed: u32,
) -> TestResult {
    let cp = store.load(id).await?.ok_or("saved")?;
    if (cp.status, cp.next) != (RunStatus::Completed, n) {
        return Err(format!("{id}: {:?} at step {}", cp.status, cp.next).into());
    }
    for i in 0..n {
        if cp.state.get(&format!("s{i}")) != Some(&json!(i)) {
            return Err(format!("{id}: the state lacks s{i}: {:?}", cp.state).into());
        }
    }
    let history = store.history(id).await?.ok_or("history")?;
    let names: Vec<&str> = history.iter().map(|s| s.name.as_str()).collect();
    let want: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    if names != want {
        return Err(format!("{id}: history {names:?}, not every step once in order").into());
    }
    let c = counts.lock().unwrap()[id].clone();
    let extra: u32 = c.iter().map(|n| n.saturating_sub(1)).sum();
    if !c.iter().all(|n| *n >= 1) || extra > failed {
        return Err(format!("{id}: executions {c:?} with {failed} failed call(s)").into());
    }
    Ok(())
}

/// A 429 is waited out for the delay its `x-ms-retry-after-ms` asks, and
/// the call goes on as if nothing happened.
#[test]
fn a_429_is_sent_again_after_the_delay_it_advertises() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(2, &counts);
        p.rule(
            &db,
            json!({"kind": "status", "status": 429, "retry_after_ms": 400, "count": 2, "skip": 1}),
        )
        .await?;
        run("throttled", &wf, &store).await?;
        check_run(&store, "throttled", 2, &counts, 0).await?;
        assert_eq!(counts.lock().unwrap()["throttled"], [1, 1]);
        let log = p.log(&db).await?;
        let throttled: Vec<usize> = (0..log.len()).filter(|i| log[*i].3.is_some()).collect();
        assert_eq!(throttled.len(), 2, "{log:?}");
        for i in throttled {
            let (t, method, path, _, _) = &log[i];
            let next = log[i + 1..]
                .iter()
                .find(|e| &e.1 == method && &e.2 == path)
                .ok_or("the throttled request was sent again")?;
            assert!(
                next.0 >= t + 395,
                "sent again {} ms after a 429 that asked for 400",
                next.0 - t
            );
        }
        Ok(())
    })
}

/// A service that keeps throttling spends the retry budget, and the call
/// fails with an error that says so; nothing is lost, and the run resumes
/// once the throttling stops.
#[test]
fn a_spent_retry_budget_is_an_error_that_says_so() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let budget = Duration::from_millis(600);
        let store = db
            .store(CosmosOptions::default().retry_budget(budget))
            .await;
        let counts = Counts::default();
        let wf = counted(3, &counts);
        run("r", &wf, &store).await?;
        p.rule(
            &db,
            json!({"kind": "status", "status": 429, "retry_after_ms": 100, "count": 1000}),
        )
        .await?;
        let began = Instant::now();
        let err = run("r2", &wf, &store)
            .await
            .expect_err("throttled for ever");
        let took = began.elapsed();
        let text = steadfast_core::error_chain(&err);
        assert_eq!(
            err.store_error().map(|e| e.kind()),
            Some(StoreErrorKind::Unavailable),
            "{text}"
        );
        assert!(
            text.contains("HTTP 429") && text.contains("retry budget of 600ms"),
            "{text}"
        );
        assert!(
            took >= budget - Duration::from_millis(150),
            "gave up after {took:?}"
        );
        assert!(
            took < Duration::from_secs(10),
            "the budget bounds the wait: {took:?}"
        );
        p.clear(&db).await?;
        let failed = run_to_the_end("r2", &wf, &store, 3).await?;
        check_run(&store, "r2", 3, &counts, failed + 1).await?;
        check_run(&store, "r", 3, &counts, 0).await?;
        // The URL takes a budget too, and refuses one too long.
        let long = CosmosStore::open_with(
            &format!("{}&retry_budget=11m", db.url),
            CosmosOptions::default(),
        )
        .await
        .err()
        .ok_or("an 11-minute budget is refused")?;
        assert!(long.to_string().contains("retry budget"), "{long}");
        Ok(())
    })
}

/// Every write of a run in turn is applied by the server and then its
/// answer is lost (the connection dropped) or replaced by a 503 or a 408:
/// the run loop reads the head back, finds its own save, and goes on in the
/// same call, with no step run twice and no write sent twice.
#[test]
fn ambiguous_writes_are_resolved_by_reading_the_head() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(3, &counts);
        // How many writes a run makes when nothing goes wrong.
        run("clean", &wf, &store).await?;
        let writes = p.writes(&db).await?;
        assert!(writes >= 3, "three saves at least: {writes}");
        let faults = [
            json!({"kind": "drop-after"}),
            json!({"kind": "status-after", "status": 503}),
            json!({"kind": "status-after", "status": 408}),
        ];
        for (k, fault) in faults.iter().enumerate() {
            for skip in 0..writes {
                let id = format!("amb-{k}-{skip}");
                let mut rule = fault.clone();
                rule["skip"] = json!(skip);
                let before = p.writes(&db).await?;
                p.rule(&db, rule).await?;
                let failed = run_to_the_end(&id, &wf, &store, 3).await?;
                p.clear(&db).await?;
                let sent = p.writes(&db).await? - before;
                assert_eq!(failed, 0, "{id}: the call went on ({fault}, write {skip})");
                assert_eq!(
                    sent, writes,
                    "{id}: no write sent again ({fault}, write {skip})"
                );
                check_run(&store, &id, 3, &counts, failed).await?;
                assert_eq!(
                    counts.lock().unwrap()[&id],
                    [1, 1, 1],
                    "{id}: a save that landed is recognised ({fault}, write {skip})"
                );
            }
        }
        let log = p.log(&db).await?;
        let hit = log.iter().filter(|e| e.3.is_some()).count();
        assert_eq!(hit, 3 * writes, "every fault met a write");
        Ok(())
    })
}

/// Every write of a run in turn is refused (503, 408) or dropped before it
/// reaches the server: nothing was applied, the call fails or goes on, and
/// the next call resumes; the step whose save was refused is the only one
/// that may run again.
#[test]
fn writes_that_never_landed_are_not_taken_for_saved() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(3, &counts);
        run("clean", &wf, &store).await?;
        let writes = p.writes(&db).await?;
        let faults = [
            json!({"kind": "drop-before"}),
            json!({"kind": "status", "status": 503}),
            json!({"kind": "status", "status": 408}),
        ];
        for (k, fault) in faults.iter().enumerate() {
            for skip in 0..writes {
                let id = format!("lost-{k}-{skip}");
                let mut rule = fault.clone();
                rule["skip"] = json!(skip);
                p.rule(&db, rule).await?;
                let failed = run_to_the_end(&id, &wf, &store, 4).await?;
                p.clear(&db).await?;
                check_run(&store, &id, 3, &counts, failed).await?;
            }
        }
        let log = p.log(&db).await?;
        let hit = log.iter().filter(|e| e.3.is_some()).count();
        assert_eq!(hit, 3 * writes, "every fault met a write");
        Ok(())
    })
}

/// Reads and queries that time out, meet an unavailable service or lose
/// their answer are sent again within the budget: the caller sees none of it.
#[test]
fn reads_are_sent_again_after_timeouts_and_lost_answers() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(2, &counts);
        run("read", &wf, &store).await?;
        for fault in [
            json!({"kind": "status", "status": 503}),
            json!({"kind": "status", "status": 408}),
            json!({"kind": "drop-before"}),
            json!({"kind": "drop-after"}),
        ] {
            let mut rule = fault.clone();
            rule["on"] = json!("reads");
            rule["count"] = json!(2);
            p.rule(&db, rule).await?;
            let fresh = db.store(CosmosOptions::default()).await;
            let cp = fresh.load("read").await?.ok_or("the run")?;
            assert_eq!(cp.status, RunStatus::Completed, "{fault}");
            let history = fresh.history("read").await?.ok_or("history")?;
            assert_eq!(history.len(), 2, "{fault}");
            p.clear(&db).await?;
            // The same for queries (the list of runs is one).
            let mut rule = fault.clone();
            rule["on"] = json!("queries");
            rule["count"] = json!(2);
            p.rule(&db, rule).await?;
            let listed = fresh.list(&Default::default()).await?;
            assert!(listed.iter().any(|r| r.run_id == "read"), "{fault}");
            p.clear(&db).await?;
        }
        let log = p.log(&db).await?;
        let faulted: Vec<&Seen> = log.iter().filter(|e| e.3.is_some()).collect();
        assert_eq!(
            faulted.len(),
            16,
            "two faults of each kind on reads, two on queries"
        );
        assert!(faulted.iter().all(|e| !e.4), "no write was faulted");
        let queries = faulted.iter().filter(|e| e.1 == "POST").count();
        assert!(queries >= 8, "queries were faulted: {queries}");
        Ok(())
    })
}

/// A connection that cannot be made (nothing listens) is tried again
/// within the budget, then fails with the tries it made.
#[test]
fn a_connection_refused_is_tried_again_within_the_budget() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let db = support::TestDb::new(&proxy);
        // A port nothing listens on: one taken and let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let host = proxy.0.trim_start_matches("cosmos://");
        let url = db.url.replace(host, &format!("127.0.0.1:{port}"));
        let began = Instant::now();
        let err = CosmosStore::open_with(
            &url,
            CosmosOptions::default().retry_budget(Duration::from_millis(400)),
        )
        .await
        .err()
        .ok_or("nothing listens there")?;
        let took = began.elapsed();
        let text = err.to_string();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{text}");
        assert!(text.contains("tries in"), "the tries are told: {text}");
        assert!(
            !text.contains("after 1 tries"),
            "tried more than once: {text}"
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        Ok(())
    })
}

/// Faults of every kind at random (a third of all requests to items, a
/// fixed seed): eight runs complete, every step recorded once, and a step
/// runs again only for a call that failed.
#[test]
fn random_faults_lose_and_double_no_step() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(5, &counts);
        p.post(
            "random",
            json!({"db": db.name(), "rate": 0.33, "seed": "7919"}),
        )
        .await?;
        let mut failed = Vec::new();
        for r in 0..8 {
            let id = format!("rand-{r}");
            failed.push(run_to_the_end(&id, &wf, &store, 40).await?);
        }
        p.post("random", json!({"db": db.name(), "rate": 0}))
            .await?;
        for (r, f) in failed.iter().enumerate() {
            check_run(&store, &format!("rand-{r}"), 5, &counts, *f).await?;
        }
        let log = p.log(&db).await?;
        let kinds: std::collections::BTreeSet<&str> =
            log.iter().filter_map(|e| e.3.as_deref()).collect();
        assert_eq!(kinds.len(), 6, "every kind of fault was met: {kinds:?}");
        Ok(())
    })
}

/// The negative control of the judge above: the proxy acknowledges the save
/// of the second step without making it (a lie no honest fault tells), so
/// an acknowledged step is lost; the check must say so.
#[test]
fn a_save_acknowledged_but_not_made_is_caught() -> TestResult {
    let Some(proxy) = support::proxy() else {
        return Ok(());
    };
    rt().block_on(async {
        let p = Proxy::new(&proxy)?;
        let db = support::TestDb::new(&proxy);
        let store = db.store(CosmosOptions::default()).await;
        let counts = Counts::default();
        let wf = counted(3, &counts);
        p.rule(&db, json!({"kind": "fake-ack", "skip": 1})).await?;
        let failed = run_to_the_end("lied-to", &wf, &store, 4).await?;
        let log = p.log(&db).await?;
        assert_eq!(
            log.iter()
                .filter(|e| e.3.as_deref() == Some("fake-ack"))
                .count(),
            1,
            "the lie was told"
        );
        let verdict = check_run(&store, "lied-to", 3, &counts, failed).await;
        let why = verdict
            .err()
            .ok_or("the check missed an acknowledged step that was lost")?;
        assert!(why.to_string().contains("executions"), "{why}");
        Ok(())
    })
}
