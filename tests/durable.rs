//! Durable functions: replay from the record, crashes in loops and fan-outs
//! (real processes), divergence, recorded time and randomness, gates and timers.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use steadfast::StoreExt as _;
use steadfast::{
    approve, durable, Error, ManualClock, Outcome, RetryPolicy, Runner, StepError, StepOptions,
    Store, SystemClock, Timestamp,
};
use support::{child_store_url, open, role, runtime, spawn_child, store_url, Reaped};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Counts = Arc<Mutex<BTreeMap<String, u32>>>;

fn bump(counts: &Counts, name: &str) {
    *counts.lock().unwrap().entry(name.to_string()).or_default() += 1;
}

fn append(log: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    f.write_all(format!("{line}\n").as_bytes())
        .expect("log write");
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn recorded_steps_return_their_outputs_without_running() -> TestResult {
    for scheme in ["memory", "file", "sqlite"] {
        let dir = tempfile::tempdir()?;
        let store = open(&store_url_or_memory(scheme, dir.path()));
        let counts = Counts::default();
        let fail_at = Arc::new(Mutex::new(Some(3u32)));
        let body = |counts: Counts, fail_at: Arc<Mutex<Option<u32>>>| {
            move |ctx: steadfast::DurableCtx<'static, Arc<dyn Store>>| async move {
                let docs: Vec<String> = ctx
                    .step("retrieve", || {
                        bump(&counts, "retrieve");
                        async { Ok::<_, StepError>(vec!["a".to_string(), "b".to_string()]) }
                    })
                    .await?;
                let mut turn = 0u32;
                loop {
                    let name = ctx.numbered("think");
                    let (c, f) = (counts.clone(), fail_at.clone());
                    let done: bool = ctx
                        .step_with(
                            name.clone(),
                            StepOptions::new().retry(RetryPolicy::none()),
                            move || {
                                bump(&c, &name);
                                let fail = *f.lock().unwrap() == Some(turn);
                                async move {
                                    if fail {
                                        return Err(StepError::terminal("the model is down"));
                                    }
                                    Ok(turn >= 5)
                                }
                            },
                        )
                        .await?;
                    if done {
                        break Ok(format!("{} docs, {turn} turns", docs.len()));
                    }
                    turn += 1;
                }
            }
        };
        let first = durable("r", &store, "agent", body(counts.clone(), fail_at.clone())).await;
        assert!(
            matches!(first, Err(Error::StepFailed { .. })),
            "{scheme}: {first:?}"
        );
        *fail_at.lock().unwrap() = None;
        let out = durable("r", &store, "agent", body(counts.clone(), fail_at.clone())).await?;
        assert_eq!(
            out,
            Outcome::Completed("2 docs, 5 turns".to_string()),
            "{scheme}"
        );
        let c = counts.lock().unwrap().clone();
        assert_eq!(c["retrieve"], 1, "{scheme}: retrieve replayed, not re-run");
        assert_eq!(
            (c["think"], c["think#2"], c["think#3"]),
            (1, 1, 1),
            "{scheme}: {c:?}"
        );
        assert_eq!(c["think#4"], 2, "{scheme}: the failed step ran again");
        // A completed run returns its saved result without running anything.
        let again = durable("r", &store, "agent", body(counts.clone(), fail_at.clone())).await?;
        assert_eq!(again, Outcome::Completed("2 docs, 5 turns".to_string()));
        assert_eq!(
            *counts.lock().unwrap(),
            c,
            "{scheme}: nothing ran for a completed run"
        );
        let history = store.history("r").await;
        if let Ok(Some(h)) = history {
            assert_eq!(h[0].name, "retrieve");
            assert_eq!(h[0].update["retrieve"], json!(["a", "b"]));
        }
    }
    Ok(())
}

fn store_url_or_memory(scheme: &str, dir: &Path) -> String {
    if scheme == "memory" {
        "memory:".into()
    } else {
        store_url(scheme, dir)
    }
}

/// The loop of the kill tests: iteration i is step `think-i`, which logs itself;
/// in the child, iteration `stall` waits to be killed.
async fn looping(
    store: Arc<dyn Store>,
    log: &Path,
    stall: Option<u32>,
) -> Result<Outcome<u32>, Error> {
    let log = log.to_path_buf();
    durable("loop", &store, "looping", move |ctx| async move {
        let mut sum = 0;
        for i in 0..10u32 {
            let log = log.clone();
            sum += ctx
                .step(format!("think-{i}"), move || {
                    append(&log, &format!("think {i}"));
                    let stall = stall == Some(i);
                    async move {
                        if stall {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                        }
                        Ok::<_, StepError>(i)
                    }
                })
                .await?;
        }
        Ok(sum)
    })
    .await
}

#[test]
fn sigkill_in_iteration_7_resumes_at_iteration_7() -> TestResult {
    for scheme in ["file", "sqlite"] {
        kill_in_loop(scheme, "sigkill_in_iteration_7_resumes_at_iteration_7")?;
    }
    Ok(())
}

fn kill_in_loop(scheme: &str, test: &str) -> TestResult {
    if role().as_deref() == Some("loop") {
        let store = open(&child_store_url());
        let log = std::env::var("STEADFAST_TEST_LOG")?;
        let _ = runtime().block_on(looping(store, Path::new(&log), Some(7)));
        std::process::exit(1);
    }
    let dir = tempfile::tempdir()?;
    let url = store_url(scheme, dir.path());
    let log = dir.path().join("log");
    let child = Reaped(spawn_child(
        test,
        "loop",
        &url,
        &[("STEADFAST_TEST_LOG", log.display().to_string())],
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !lines(&log).contains(&"think 7".to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{scheme}: the child never reached iteration 7"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill()?; // SIGKILL in the middle of iteration 7
    let out = runtime().block_on(looping(open(&url), &log, None))?;
    assert_eq!(out, Outcome::Completed(45), "{scheme}");
    let expected: Vec<String> = (0..=7)
        .map(|i| format!("think {i}"))
        .chain((7..10).map(|i| format!("think {i}")))
        .collect();
    assert_eq!(
        lines(&log),
        expected,
        "{scheme}: iterations 0-6 replayed, 7 re-run, then live"
    );
    Ok(())
}

async fn fan_out(
    store: Arc<dyn Store>,
    log: &Path,
    slow: bool,
) -> Result<Outcome<Vec<u32>>, Error> {
    let log = log.to_path_buf();
    durable("fan", &store, "fan-out", move |ctx| async move {
        let branches = (0..8u32).map(|i| {
            let log = log.clone();
            let fut = async move {
                append(&log, &format!("start {i}"));
                if slow && i >= 4 {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok::<_, StepError>(i * 10)
            };
            (format!("tool-{i}"), fut)
        });
        ctx.parallel(branches).await
    })
    .await
}

#[test]
fn a_crash_during_an_8_way_fan_out_reruns_only_the_unfinished_branches() -> TestResult {
    if role().as_deref() == Some("fan") {
        let store = open(&child_store_url());
        let log = std::env::var("STEADFAST_TEST_LOG")?;
        let _ = runtime().block_on(fan_out(store, Path::new(&log), true));
        std::process::exit(1);
    }
    for scheme in ["file", "sqlite"] {
        let dir = tempfile::tempdir()?;
        let url = store_url(scheme, dir.path());
        let log = dir.path().join("log");
        let test = "a_crash_during_an_8_way_fan_out_reruns_only_the_unfinished_branches";
        let child = Reaped(spawn_child(
            test,
            "fan",
            &url,
            &[("STEADFAST_TEST_LOG", log.display().to_string())],
        ));
        let store = open(&url);
        let rt = runtime();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let recorded = rt.block_on(store.load("fan"))?.map_or(0, |c| c.next);
            if recorded == 4 && lines(&log).len() == 8 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{scheme}: the fast branches were never recorded"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill()?;
        let out = rt.block_on(fan_out(open(&url), &log, false))?;
        assert_eq!(
            out,
            Outcome::Completed((0..8).map(|i| i * 10).collect()),
            "{scheme}: input order"
        );
        let restarted: Vec<String> = lines(&log)[8..].to_vec();
        let mut sorted = restarted.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            ["start 4", "start 5", "start 6", "start 7"],
            "{scheme}: only unfinished branches re-ran"
        );
    }
    Ok(())
}

async fn abc(
    store: &Arc<dyn Store>,
    names: &'static [&'static str],
    counts: &Counts,
) -> Result<Outcome<()>, Error> {
    let counts = counts.clone();
    durable("d", store, "abc", move |ctx| async move {
        for name in names {
            let c = counts.clone();
            ctx.step(*name, move || {
                bump(&c, name);
                async { Ok::<_, StepError>(()) }
            })
            .await?;
        }
        ctx.gate("stop").await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn renamed_removed_and_reordered_steps_are_refused_before_anything_runs() -> TestResult {
    let store: Arc<dyn Store> = open("memory:");
    let counts = Counts::default();
    assert!(matches!(
        abc(&store, &["a", "b", "c"], &counts).await?,
        Outcome::Waiting { .. }
    ));
    let before = counts.lock().unwrap().clone();
    for (names, at, stored, given) in [
        (&["a", "x", "c"][..], 1, "b", Some("x")),
        (&["a", "c"][..], 1, "b", Some("c")),
        (&["a", "c", "b"][..], 1, "b", Some("c")),
        (&["b", "a", "c"][..], 0, "a", Some("b")),
    ] {
        match abc(&store, names, &counts).await {
            Err(Error::WorkflowChanged {
                at: a,
                stored: s,
                given: g,
                ..
            }) => {
                assert_eq!(
                    (a, s.as_deref(), g.as_deref()),
                    (at, Some(stored), given),
                    "{names:?}"
                );
            }
            other => panic!("{names:?}: expected WorkflowChanged, got {other:?}"),
        }
        assert_eq!(
            *counts.lock().unwrap(),
            before,
            "{names:?}: nothing new ran"
        );
    }
    // Removed at the end: the code returns while the record has more.
    let done: Result<Outcome<()>, Error> = durable("d", &store, "abc", |ctx| async move {
        ctx.step("a", || async { Ok::<_, StepError>(()) }).await?;
        Ok(())
    })
    .await;
    assert!(
        matches!(
            done,
            Err(Error::WorkflowChanged {
                at: 1,
                given: None,
                ..
            })
        ),
        "{done:?}"
    );
    // With the override, the record is cut where the code diverged.
    let out = Runner::new(&store)
        .accept_changed_workflow(true)
        .durable("d", "abc", |ctx| async move {
            ctx.step("a", || async { Ok::<_, StepError>(()) }).await?;
            ctx.step("z", || async { Ok::<_, StepError>(2) }).await
        })
        .await?;
    assert_eq!(out, Outcome::Completed(2));
    Ok(())
}

#[tokio::test]
async fn recorded_time_and_randomness_are_the_same_on_every_call() -> TestResult {
    let store: Arc<dyn Store> = open("memory:");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let clock = Arc::new(ManualClock::new(Timestamp::from_unix_millis(
        1_800_000_000_000,
    )));
    for round in 0..3 {
        let s = seen.clone();
        let out = Runner::new(&store)
            .clock(clock.clone())
            .durable("t", "timing", move |ctx| async move {
                let now = ctx.now().await?;
                let r = ctx.random().await?;
                let id = ctx.uuid().await?;
                s.lock().unwrap().push((now, r, id.clone()));
                ctx.gate("go").await?;
                Ok((now, r, id))
            })
            .await?;
        if round == 0 {
            assert!(matches!(out, Outcome::Waiting { .. }));
        }
        clock.advance(Duration::from_secs(3600));
        if round == 0 {
            approve(&store, "t", "go", None, "ada", &SystemClock).await?;
        }
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.len(),
        2,
        "the third call returned the saved result without running"
    );
    assert_eq!(seen[0], seen[1], "recorded values are stable across calls");
    let id = &seen[0].2;
    assert_eq!((id.len(), &id[14..15]), (36, "4"), "a version 4 UUID: {id}");
    Ok(())
}

#[tokio::test]
async fn gates_and_timers_suspend_a_durable_function() -> TestResult {
    let store: Arc<dyn Store> = open("memory:");
    let clock = Arc::new(ManualClock::new(Timestamp::from_unix_millis(
        1_800_000_000_000,
    )));
    let body = |ctx: steadfast::DurableCtx<'static, Arc<dyn Store>>| async move {
        let data = ctx.gate("review").await?;
        ctx.sleep("cooldown", Duration::from_secs(60)).await?;
        Ok(data)
    };
    let runner = Runner::new(&store).clock(clock.clone());
    assert_eq!(
        runner.durable("g", "gated", body).await?,
        Outcome::Waiting {
            gate: "review".into()
        }
    );
    approve(
        &store,
        "g",
        "review",
        Some(json!({"ok": true})),
        "ada",
        &*clock,
    )
    .await?;
    let Outcome::Sleeping { until } = runner.durable("g", "gated", body).await? else {
        panic!("expected Sleeping")
    };
    clock.advance(Duration::from_secs(61));
    assert!(clock.now_ms() > until.unix_millis());
    assert_eq!(
        runner.durable("g", "gated", body).await?,
        Outcome::Completed(Some(json!({"ok": true})))
    );
    Ok(())
}

trait NowMs {
    fn now_ms(&self) -> u64;
}

impl NowMs for ManualClock {
    fn now_ms(&self) -> u64 {
        steadfast::Clock::now(self).unix_millis()
    }
}

/// A call made wrongly names the durable function and quotes an unchecked
/// name only as far as an error may show it (a 100 KB name is not echoed).
#[tokio::test]
async fn a_bad_call_names_the_function_and_quotes_a_huge_name_short() -> TestResult {
    let store = steadfast::MemoryStore::new();
    let huge = "n".repeat(100_000);
    for (i, name) in [huge.as_str(), "", "a\u{7}b", "__x"]
        .into_iter()
        .enumerate()
    {
        let name = name.to_string();
        let err = durable(&format!("r{i}"), &store, "agent", move |ctx| async move {
            ctx.step(name, || async { Ok::<_, StepError>(1) }).await
        })
        .await
        .unwrap_err();
        let shown = err.to_string();
        assert!(matches!(err, Error::InvalidWorkflow { .. }), "{shown}");
        assert!(
            shown.starts_with("invalid workflow \"agent\": step name"),
            "{shown}"
        );
        assert!(
            shown.len() < 400,
            "the error echoes the whole name: {} bytes",
            shown.len()
        );
    }
    let err = durable("r9", &store, "agent", |ctx| async move {
        ctx.patched("no way!").await
    })
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid workflow \"agent\": patch id"),
        "{err}"
    );
    Ok(())
}
