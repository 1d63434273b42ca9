//! Child runs: a parent starts children, waits without a process, and gets
//! their results; workers run them; a child's failure fails the parent's
//! step (retried as the parent's options say); cancelling a parent cancels
//! its children; a parent killed while its children run resumes waiting
//! and gets their results, none run again.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use steadfast::ops::cancel;
use steadfast::StoreExt as _;
use steadfast::{
    child_id, durable, start, update, ChildOptions, ChildSpec, DurableCtx, Error, ListFilter,
    Outcome, Registry, RetryPolicy, RunStatus, Step, StepError, Store, SystemClock, Wait, Worker,
    Workflow,
};
use steadfast_conformance::runtime as rt;
use support::PgSchema;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Counts = Arc<Mutex<BTreeMap<String, u32>>>;
type Kind = (&'static str, Arc<dyn Store>, Box<dyn std::any::Any>);
type Ctx = DurableCtx<'static, Arc<dyn Store>>;
type Boxed<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Error>> + Send>>;

fn stores() -> Vec<Kind> {
    let mut out: Vec<Kind> = Vec::new();
    out.push(("memory", support::open("memory:"), Box::new(())));
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite = support::open(&support::store_url("sqlite", dir.path()));
    out.push(("sqlite", sqlite, Box::new(dir)));
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = support::open(&support::store_url("file", dir.path()));
    out.push(("file", file, Box::new(dir)));
    let pg = PgSchema::new();
    out.push(("postgres", support::open(&pg.url), Box::new(pg)));
    out
}

fn background(
    worker: Worker,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<steadfast::WorkerReport, steadfast::Error>>,
) {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }));
    (tx, handle)
}

async fn wait_for_status(
    store: &dyn Store,
    run_id: &str,
    want: RunStatus,
) -> steadfast::Checkpoint {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(cp) = store.load(run_id).await.expect("load") {
            if cp.status == want {
                return cp;
            }
            assert!(
                Instant::now() < deadline,
                "{run_id} is {} (wait {:?}, error {:?}), not {want}",
                cp.status,
                cp.wait,
                cp.error
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A durable child that counts its step's executions and fails while its
/// input says to (`fail_times` executions).
fn counting_child(counts: &Counts) -> impl Fn(Ctx) -> Boxed<Value> + Send + Sync + 'static {
    let counts = Arc::clone(counts);
    move |ctx| {
        let counts = Arc::clone(&counts);
        Box::pin(async move {
            let input = ctx.input().await.unwrap_or(Value::Null);
            let fail_times = input["fail"].as_u64().unwrap_or(0) as u32;
            let word = input["word"].as_str().unwrap_or("").to_string();
            let terminal = input["terminal"].as_bool().unwrap_or(false);
            let key = word.clone();
            ctx.step_with(
                "work",
                steadfast::StepOptions::new().retry(RetryPolicy::none()),
                move || {
                    let counts = Arc::clone(&counts);
                    let (key, word) = (key.clone(), word.clone());
                    async move {
                        let n = {
                            let mut c = counts.lock().unwrap();
                            let n = c.entry(key).or_default();
                            *n += 1;
                            *n
                        };
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        if n <= fail_times {
                            let text = format!("{word} failed on try {n}");
                            return Err(if terminal {
                                StepError::terminal(text)
                            } else {
                                StepError::retryable(text)
                            });
                        }
                        Ok(word.to_uppercase())
                    }
                },
            )
            .await
            .map(Value::from)
        })
    }
}

fn parent_of(
    words: &'static [&'static str],
    options: ChildOptions,
    fail: u32,
) -> impl Fn(Ctx) -> Boxed<Vec<String>> + Send + Sync + 'static {
    move |ctx| {
        Box::pin(async move {
            let specs = words.iter().map(|w| {
                ChildSpec::new(format!("do-{w}"), "child", json!({"word": w, "fail": fail}))
            });
            let out: Vec<String> = ctx.children(specs, options).await?;
            Ok(out)
        })
    }
}

/// A worker runs a parent and its five children, at most two at once: the
/// parent completes with every result in the order asked, each child's step
/// ran once, the parent's record names its children, and each child names
/// its parent.
#[test]
fn a_worker_runs_a_parent_and_its_children_to_the_end() -> TestResult {
    for (kind, store, _guard) in stores() {
        let counts: Counts = Arc::default();
        rt().block_on(async {
            const WORDS: &[&str] = &["a", "b", "c", "d", "e"];
            let registry = Registry::new()
                .durable(
                    "parent",
                    parent_of(WORDS, ChildOptions::new().at_once(2), 0),
                )
                .durable("child", counting_child(&counts));
            assert!(start(&*store, "parent", "p", Value::Null, true).await?);
            let (stop, worker) = background(
                Worker::new(Arc::clone(&store), registry)
                    .concurrency(4)
                    .poll(Duration::from_millis(20)),
            );
            let cp = wait_for_status(&*store, "p", RunStatus::Completed).await;
            stop.send(true)?;
            worker.await??;
            assert_eq!(
                cp.state["__result"],
                json!(["A", "B", "C", "D", "E"]),
                "{kind}"
            );
            let history = store.history("p").await?;
            let listed = steadfast::children_of(&cp, history.as_deref());
            assert_eq!(listed.len(), WORDS.len(), "{kind}: {listed:?}");
            for w in WORDS {
                let id = child_id("p", &format!("do-{w}"));
                assert!(
                    listed
                        .iter()
                        .any(|c| c.run == id && c.step == format!("do-{w}") && c.recorded),
                    "{kind}: {listed:?}"
                );
                let child = store.load(&id).await?.expect("the child is stored");
                assert_eq!(child.status, RunStatus::Completed, "{kind}");
                let link = steadfast::ParentLink::of(&child.state).expect("a parent");
                assert_eq!((link.run.as_str(), link.step), ("p", format!("do-{w}")));
                assert_eq!(link.created, cp.created_at);
                assert_eq!(
                    counts.lock().unwrap()[*w],
                    1,
                    "{kind}: child {w} ran more than once"
                );
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// Without a worker for the children, the parent stops waiting for them,
/// holding no lease; the wait lists at most `at_once` children under way,
/// and the rest are not started yet.
#[test]
fn a_waiting_parent_holds_nothing_and_starts_at_most_at_once() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let counts: Counts = Arc::default();
        const WORDS: &[&str] = &["a", "b", "c"];
        let parent = parent_of(WORDS, ChildOptions::new().at_once(2), 0);
        let out = durable("p", &store, "parent", &parent).await?;
        assert!(
            matches!(out, Outcome::Waiting { ref gate } if gate == "do-a"),
            "{out:?}"
        );
        let cp = store.load("p").await?.unwrap();
        assert_eq!(cp.status, RunStatus::Waiting);
        assert!(cp.lease.is_none());
        match &cp.wait {
            Some(Wait::Children { runs, arrived, .. }) => {
                assert_eq!(runs, &[child_id("p", "do-a"), child_id("p", "do-b")]);
                assert!(!arrived);
            }
            other => panic!("{other:?}"),
        }
        assert!(store.load(&child_id("p", "do-c")).await?.is_none());
        // The second child ends first: the parent is marked due, records
        // it, starts the third, and waits for the first and third.
        let child = counting_child(&counts);
        durable(&child_id("p", "do-b"), &store, "child", &child).await?;
        let cp = store.load("p").await?.unwrap();
        assert!(
            matches!(cp.wait, Some(Wait::Children { arrived: true, .. })),
            "{:?}",
            cp.wait
        );
        assert!(matches!(
            durable("p", &store, "parent", &parent).await?,
            Outcome::Waiting { .. }
        ));
        let cp = store.load("p").await?.unwrap();
        assert_eq!(cp.completed, ["do-b"]);
        match &cp.wait {
            Some(Wait::Children { runs, step, .. }) => {
                assert_eq!(step, "do-a");
                assert_eq!(runs, &[child_id("p", "do-a"), child_id("p", "do-c")]);
            }
            other => panic!("{other:?}"),
        }
        for w in ["a", "c"] {
            durable(&child_id("p", &format!("do-{w}")), &store, "child", &child).await?;
        }
        let out = durable("p", &store, "parent", &parent).await?;
        assert_eq!(
            out.completed(),
            Some(vec!["A".to_string(), "B".into(), "C".into()])
        );
        // Called again, the parent returns its result; no child runs again.
        durable("p", &store, "parent", &parent).await?;
        assert!(
            counts.lock().unwrap().values().all(|n| *n == 1),
            "{counts:?}"
        );
        Ok(())
    })
}

/// A listed workflow's child step gives its state to a listed child and
/// gets the child's final state under the step's name; a durable parent
/// can start the same listed workflow with an object input.
#[test]
fn listed_parents_and_listed_children() -> TestResult {
    for (kind, store, _guard) in stores() {
        rt().block_on(async {
            let parent = Workflow::new(
                "outer",
                vec![
                    Step::new("plan", |_, _| async { update(json!({"topic": "tides"})) }),
                    Step::child("research", "inner"),
                    Step::new("write", |_, state| async move {
                        let notes = state["research"]["notes"].clone();
                        update(json!({"article": notes}))
                    }),
                ],
            )?;
            let inner = Workflow::new(
                "inner",
                vec![Step::new("read", |_, state| async move {
                    let topic = state["topic"].as_str().unwrap_or("?").to_string();
                    update(json!({"notes": format!("notes on {topic}")}))
                })],
            )?;
            // Run by hand, without leases: the child's input, made its
            // first state, is saved whole on every store.
            assert!(matches!(
                steadfast::run("h", &parent, &*store).await?,
                Outcome::Waiting { .. }
            ));
            let child = steadfast::run(&child_id("h", "research"), &inner, &*store).await?;
            assert!(child.completed().is_some(), "{kind}");
            let done = steadfast::run("h", &parent, &*store).await?;
            assert_eq!(
                done.completed().expect("completed")["research"],
                json!({"topic": "tides", "notes": "notes on tides"}),
                "{kind}"
            );
            let registry = Registry::new().workflow(parent).workflow(inner);
            assert!(start(&*store, "outer", "o", json!({}), false).await?);
            let (stop, worker) = background(
                Worker::new(Arc::clone(&store), registry).poll(Duration::from_millis(20)),
            );
            let cp = wait_for_status(&*store, "o", RunStatus::Completed).await;
            stop.send(true)?;
            worker.await??;
            assert_eq!(cp.state["article"], json!("notes on tides"), "{kind}");
            assert_eq!(
                cp.state["research"],
                json!({"topic": "tides", "notes": "notes on tides"}),
                "{kind}: the child's final state, without the engine's keys"
            );
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// A child that fails fails the parent's step, naming the child and its
/// error; with a retry policy the child is resumed and retried; a parent
/// retried by hand retries its failed child with a fresh budget.
#[test]
fn a_failed_child_fails_the_parents_step_and_retries_by_its_policy() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let counts: Counts = Arc::default();
        let child = counting_child(&counts);
        const ONE: &[&str] = &["x"];
        let once = parent_of(ONE, ChildOptions::new(), 1);
        let id = child_id("p1", "do-x");
        assert!(matches!(
            durable("p1", &store, "parent", &once).await?,
            Outcome::Waiting { .. }
        ));
        assert!(durable(&id, &store, "child", &child).await.is_err());
        let err = durable("p1", &store, "parent", &once).await.unwrap_err();
        let text = format!("{err}: {}", steadfast::error_chain(&err));
        assert!(
            matches!(err, Error::StepFailed { ref step, .. } if step == "do-x"),
            "{text}"
        );
        assert!(
            text.contains(&id) && text.contains("x failed on try 1"),
            "{text}"
        );
        let cp = store.load("p1").await?.unwrap();
        assert_eq!(cp.status, RunStatus::Failed);
        // Retried by hand, the parent retries its child, which now works.
        steadfast::ops::retry(&*store, "p1", "ada", &SystemClock).await?;
        assert!(matches!(
            durable("p1", &store, "parent", &once).await?,
            Outcome::Waiting { .. }
        ));
        assert_eq!(store.load(&id).await?.unwrap().status, RunStatus::Running);
        durable(&id, &store, "child", &child).await?;
        let out = durable("p1", &store, "parent", &once).await?;
        assert_eq!(out.completed(), Some(vec!["X".to_string()]));

        // With three attempts, a child failing twice is retried twice.
        counts.lock().unwrap().clear();
        let thrice = parent_of(ONE, ChildOptions::new().retry(RetryPolicy::new(3)), 2);
        let id = child_id("p2", "do-x");
        for _ in 0..2 {
            assert!(matches!(
                durable("p2", &store, "parent", &thrice).await?,
                Outcome::Waiting { .. }
            ));
            assert!(durable(&id, &store, "child", &child).await.is_err());
        }
        assert!(matches!(
            durable("p2", &store, "parent", &thrice).await?,
            Outcome::Waiting { .. }
        ));
        durable(&id, &store, "child", &child).await?;
        let out = durable("p2", &store, "parent", &thrice).await?;
        assert_eq!(out.completed(), Some(vec!["X".to_string()]));
        assert_eq!(counts.lock().unwrap()["x"], 3);

        // A child whose step failed for good (a terminal error) is not
        // retried, whatever the policy.
        counts.lock().unwrap().clear();
        let id = child_id("p3", "x");
        let terminal = |ctx: DurableCtx<'static, Arc<dyn Store>>| async move {
            let opts = ChildOptions::new().retry(RetryPolicy::new(3));
            ctx.child_with::<Value>(
                "x",
                "child",
                json!({"word": "t", "fail": 1, "terminal": true}),
                opts,
            )
            .await
        };
        assert!(matches!(
            durable("p3", &store, "parent", terminal).await?,
            Outcome::Waiting { .. }
        ));
        assert!(durable(&id, &store, "child", &child).await.is_err());
        let err = durable("p3", &store, "parent", terminal).await.unwrap_err();
        assert!(
            matches!(err, Error::StepFailed { attempts: 1, .. }),
            "{err:?}"
        );
        assert_eq!(store.load(&id).await?.unwrap().status, RunStatus::Failed);
        Ok(())
    })
}

/// Cancelling a parent cancels its children under way (and theirs); a
/// child started but not yet listed in its parent's wait cancels itself
/// when it runs and finds its parent cancelled; a cancelled child fails
/// its parent's step.
#[test]
fn cancel_propagates_to_children() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let counts: Counts = Arc::default();
        const TWO: &[&str] = &["a", "b"];
        let parent = parent_of(TWO, ChildOptions::new(), 0);
        assert!(matches!(
            durable("p", &store, "parent", &parent).await?,
            Outcome::Waiting { .. }
        ));
        cancel(&*store, "p", Some("enough".into()), "ada", &SystemClock).await?;
        for w in TWO {
            let c = store
                .load(&child_id("p", &format!("do-{w}")))
                .await?
                .unwrap();
            assert_eq!(c.status, RunStatus::Cancelled, "child {w}");
        }
        let child = counting_child(&counts);
        assert!(matches!(
            durable(&child_id("p", "do-a"), &store, "child", &child).await,
            Err(Error::Cancelled { .. })
        ));
        assert!(counts.lock().unwrap().is_empty(), "a cancelled child ran");

        // Grandchildren: a middle run waits for its own child.
        let middle = |ctx: DurableCtx<'static, Arc<dyn Store>>| async move {
            let v: Value = ctx.child("leaf", "leaf", json!(null)).await?;
            Ok::<_, Error>(v)
        };
        let top = |ctx: DurableCtx<'static, Arc<dyn Store>>| async move {
            let v: Value = ctx.child("mid", "middle", json!(null)).await?;
            Ok::<_, Error>(v)
        };
        durable("t", &store, "top", top).await?;
        let mid = child_id("t", "mid");
        durable(&mid, &store, "middle", middle).await?;
        let leaf = child_id(&mid, "leaf");
        assert_eq!(store.load(&leaf).await?.unwrap().status, RunStatus::Pending);
        cancel(&*store, "t", None, "ada", &SystemClock).await?;
        assert_eq!(
            store.load(&mid).await?.unwrap().status,
            RunStatus::Cancelled
        );
        assert_eq!(
            store.load(&leaf).await?.unwrap().status,
            RunStatus::Cancelled
        );

        // A child cancelled by itself fails its parent's step, for good.
        let parent = parent_of(&["z"], ChildOptions::new().retry(RetryPolicy::new(5)), 0);
        durable("q", &store, "parent", &parent).await?;
        cancel(&*store, &child_id("q", "do-z"), None, "ada", &SystemClock).await?;
        let cp = store.load("q").await?.unwrap();
        assert!(
            matches!(cp.wait, Some(Wait::Children { arrived: true, .. })),
            "the cancel marked the parent due: {:?}",
            cp.wait
        );
        let err = durable("q", &store, "parent", &parent).await.unwrap_err();
        assert!(
            format!("{err}: {}", steadfast::error_chain(&err)).contains("cancelled"),
            "{err}"
        );
        Ok(())
    })
}

/// Bad children are refused before anything is written; a run that holds
/// a child's id and is not that child fails the step with what to do.
#[test]
fn bad_children_are_refused_with_a_clear_error() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let try_specs = |specs: Vec<ChildSpec>, options: ChildOptions| {
            let store = Arc::clone(&store);
            async move {
                let out = durable("bad", &store, "bad", move |ctx| {
                    let specs = specs.clone();
                    async move { ctx.children::<Value>(specs, options).await }
                })
                .await;
                let _ = store.delete("bad").await;
                out
            }
        };
        let one = |name: &str, wf: &str, input: Value| vec![ChildSpec::new(name, wf, input)];
        let cases: Vec<(Vec<ChildSpec>, ChildOptions, &str)> = vec![
            (one("__x", "w", json!(1)), ChildOptions::new(), "reserved"),
            (one("", "w", json!(1)), ChildOptions::new(), "empty"),
            (one("x", "", json!(1)), ChildOptions::new(), "workflow"),
            (one("x", "w\u{7}", json!(1)), ChildOptions::new(), "control"),
            (
                one("x", "w", json!(1)),
                ChildOptions::new().at_once(0),
                "at_once",
            ),
            (
                one("x", "w", json!(1)),
                ChildOptions::new().at_once(1001),
                "at_once",
            ),
            (
                one("x", "w", json!(1)),
                ChildOptions::new().retry(RetryPolicy::new(33)),
                "at most 32 times",
            ),
            (
                (0..1001)
                    .map(|i| ChildSpec::new(format!("c{i}"), "w", json!(i)))
                    .collect(),
                ChildOptions::new(),
                "at most 1000",
            ),
            (
                vec![
                    ChildSpec::new("x", "w", json!(1)),
                    ChildSpec::new("x", "w", json!(2)),
                ],
                ChildOptions::new(),
                "used twice",
            ),
        ];
        for (specs, options, says) in cases {
            let err = try_specs(specs, options).await.unwrap_err();
            assert!(err.to_string().contains(says), "{says}: {err}");
            assert!(
                store.list(&ListFilter::new()).await?.is_empty(),
                "{says}: something was written"
            );
        }
        let deep = (0..200).fold(json!(1), |v, _| json!([v]));
        let err = try_specs(one("x", "w", deep), ChildOptions::new())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
        assert!(err.to_string().contains("input of child step"), "{err}");
        assert!(store.list(&ListFilter::new()).await?.is_empty());

        // Someone else's run under the child's id.
        start(&*store, "other", &child_id("p", "x"), json!(null), true).await?;
        let err = durable("p", &store, "parent", |ctx| async move {
            ctx.child::<Value>("x", "w", json!(1)).await
        })
        .await
        .unwrap_err();
        let text = format!("{err}: {}", steadfast::error_chain(&err));
        assert!(text.contains("is not this step's child run"), "{text}");
        assert_eq!(store.load("p").await?.unwrap().status, RunStatus::Failed);
        // A listed child given an input that is not an object fails, and
        // says why.
        let listed = Workflow::new(
            "listed",
            vec![Step::new("s", |_, _| async { update(json!({})) })],
        )?;
        durable("q", &store, "parent", |ctx| async move {
            ctx.child::<Value>("x", "listed", json!([1, 2])).await
        })
        .await?;
        let err = steadfast::run(&child_id("q", "x"), &listed, &*store)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("must be a JSON object"), "{err}");
        let child = store.load(&child_id("q", "x")).await?.unwrap();
        assert_eq!(
            child.status,
            RunStatus::Failed,
            "the child says why it cannot start"
        );
        let err = durable("q", &store, "parent", |ctx| async move {
            ctx.child::<Value>("x", "listed", json!([1, 2])).await
        })
        .await
        .unwrap_err();
        assert!(
            steadfast::error_chain(&err)
                .to_string()
                .contains("must be a JSON object"),
            "{err}"
        );
        Ok(())
    })
}

/// Two child calls awaited together are refused (the first wait stopped
/// the run; waits run one at a time): `children` starts several.
#[test]
fn two_child_calls_at_once_are_refused() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let err = durable("j", &store, "joined", |ctx| async move {
            let (a, b) = tokio::join!(
                ctx.child::<Value>("a", "w", json!(1)),
                ctx.child::<Value>("b", "w", json!(2))
            );
            // The second wait is refused; the first stopped the run.
            if let Err(e @ Error::InvalidWorkflow { .. }) = b {
                return Err(e);
            }
            Ok::<_, Error>((a?, b?))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidWorkflow { .. }), "{err:?}");
        assert!(err.to_string().contains("DurableCtx::children"), "{err}");
        // A timer awaited beside a child is refused the same way.
        let err = durable("k", &store, "joined", |ctx| async move {
            let (a, b) = tokio::join!(
                ctx.child::<Value>("a", "w", json!(1)),
                ctx.sleep("nap", Duration::from_secs(3600))
            );
            if let Err(e @ Error::InvalidWorkflow { .. }) = b {
                return Err(e);
            }
            Ok::<_, Error>((a?, b?))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidWorkflow { .. }), "{err:?}");
        assert!(matches!(
            store.load("k").await?.unwrap().wait,
            Some(Wait::Children { .. })
        ));
        // Only the first child was started; the run waits for it alone.
        let cp = store.load("j").await?.unwrap();
        match &cp.wait {
            Some(Wait::Children { runs, .. }) => assert_eq!(runs.len(), 1, "{runs:?}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    })
}

/// A rejected child marks its parent due and fails the parent's step; a
/// parent deleted and made again under the same id does not take the old
/// one's child; a child result too deep to keep fails the step for good.
#[test]
fn rejected_stale_and_oversized_children() -> TestResult {
    rt().block_on(async {
        let store: Arc<dyn Store> = support::open("memory:");
        let gated = |ctx: Ctx| async move {
            ctx.gate("check").await?;
            Ok::<_, Error>(json!("ok"))
        };
        let parent = |ctx: Ctx| async move { ctx.child::<Value>("g", "gated", json!(null)).await };
        durable("p", &store, "parent", parent).await?;
        let id = child_id("p", "g");
        assert!(matches!(
            durable(&id, &store, "gated", gated).await?,
            Outcome::Waiting { .. }
        ));
        steadfast::reject(
            &*store,
            &id,
            "check",
            Some("no".into()),
            "ada",
            &SystemClock,
        )
        .await?;
        let cp = store.load("p").await?.unwrap();
        assert!(
            matches!(cp.wait, Some(Wait::Children { arrived: true, .. })),
            "{:?}",
            cp.wait
        );
        let err = durable("p", &store, "parent", parent).await.unwrap_err();
        assert!(
            steadfast::error_chain(&err)
                .to_string()
                .contains("rejected at gate \"check\": no"),
            "{err}"
        );

        // Made again under the same id (in a later millisecond: a parent is
        // told apart by when it was created): the old child is not this
        // run's.
        store.delete("p").await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let err = durable("p", &store, "parent", parent).await.unwrap_err();
        let text = steadfast::error_chain(&err).to_string();
        assert!(text.contains("child of an earlier run"), "{text}");

        // A listed child's state, as deep as a state may be, is one level
        // too deep once it sits under the parent's step name.
        let deep = (0..steadfast::MAX_VALUE_DEPTH - 1).fold(json!(1), |v, _| json!([v]));
        let listed = Workflow::new(
            "deep",
            vec![Step::new("s", move |_, _| {
                let deep = deep.clone();
                async move { update(json!({ "k": deep })) }
            })],
        )?;
        let parent = |ctx: Ctx| async move { ctx.child::<Value>("g", "deep", json!({})).await };
        durable("d", &store, "parent", parent).await?;
        let done = steadfast::run(&child_id("d", "g"), &listed, &*store).await?;
        assert!(done.completed().is_some(), "the child keeps its own state");
        let err = durable("d", &store, "parent", parent).await.unwrap_err();
        assert!(matches!(err, Error::InvalidValue { .. }), "{err:?}");
        assert_eq!(store.load("d").await?.unwrap().status, RunStatus::Failed);
        Ok(())
    })
}

// ---- A parent killed while its children run ------------------------------

const KILL_WORDS: [&str; 3] = ["one", "two", "three"];

fn append(log: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the log");
    writeln!(f, "{line}").expect("write the log");
    f.sync_data().expect("sync the log");
}

fn kill_registry(role: &str, log: &Path) -> Registry {
    let log = log.to_path_buf();
    match role {
        "parent" => Registry::new().durable("kill-parent", move |ctx| {
            let log = log.clone();
            async move {
                let specs = KILL_WORDS
                    .iter()
                    .map(|w| ChildSpec::new(*w, "kill-child", json!(w)));
                let got: Vec<String> = ctx.children(specs, ChildOptions::new()).await?;
                let joined = got.join(",");
                ctx.step("after", move || {
                    let (log, joined) = (log.clone(), joined.clone());
                    async move {
                        append(&log, &format!("after {joined}"));
                        Ok::<_, StepError>(joined)
                    }
                })
                .await
            }
        }),
        _ => Registry::new().durable("kill-child", move |ctx| {
            let log = log.clone();
            async move {
                let word = ctx
                    .input()
                    .await
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default();
                ctx.step("work", move || {
                    let (log, word) = (log.clone(), word.clone());
                    async move {
                        append(&log, &format!("start {word}"));
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        append(&log, &format!("end {word}"));
                        Ok::<_, StepError>(format!("<{word}>"))
                    }
                })
                .await
            }
        }),
    }
}

fn worker_role(test: &str) -> bool {
    let Some(role) = support::role() else {
        return false;
    };
    let store = support::open(&support::child_store_url());
    let log = std::env::var("STEADFAST_TEST_LOG").expect("a log");
    let registry = kill_registry(&role, Path::new(&log));
    let _ = test;
    support::runtime()
        .block_on(
            Worker::new(store, registry)
                .concurrency(4)
                .poll(Duration::from_millis(50))
                .run(std::future::pending::<()>()),
        )
        .expect("the worker runs");
    true
}

fn count(log: &Path, prefix: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

fn wait_log(log: &Path, prefix: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(log, prefix) < n {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} {prefix:?} in the log"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn parent_killed_while_children_run(scheme: &str, test: &str) -> TestResult {
    if worker_role(test) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let (url, _schema) = support::fresh_store_url(scheme, dir.path());
    let log = dir.path().join("steps.log");
    let env = [("STEADFAST_TEST_LOG", log.display().to_string())];
    let store = support::open(&url);
    let rt = support::runtime();
    rt.block_on(start(&*store, "kill-parent", "p", Value::Null, true))?;
    // The parent's worker is killed at random moments while it starts the
    // children: each is started once, whatever the moment.
    for _ in 0..3 {
        let parent = support::Reaped(support::spawn_child(test, "parent", &url, &env));
        std::thread::sleep(Duration::from_millis(fastrand::u64(20..400)));
        parent.kill()?;
    }
    let parent = support::Reaped(support::spawn_child(test, "parent", &url, &env));
    let children = support::Reaped(support::spawn_child(test, "child", &url, &env));
    // All three children run; the parent's process is killed meanwhile.
    wait_log(&log, "start ", 3);
    parent.kill()?;
    let cp = rt.block_on(store.load("p"))?.expect("the parent is stored");
    // Waiting for them, or (killed before it saved its wait) still as it
    // was when claimed: pending or running under a dead process's lease.
    assert!(
        matches!(
            cp.status,
            RunStatus::Waiting | RunStatus::Running | RunStatus::Pending
        ),
        "{}",
        cp.status
    );
    // A new process for the parent: it waits, and takes the results when
    // the children end.
    let parent = support::Reaped(support::spawn_child(test, "parent", &url, &env));
    wait_log(&log, "after ", 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let cp = loop {
        let cp = rt.block_on(store.load("p"))?.expect("the parent is stored");
        if cp.status == RunStatus::Completed || Instant::now() > deadline {
            break cp;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    parent.kill()?;
    children.kill()?;
    assert_eq!(cp.status, RunStatus::Completed, "{cp:?}");
    assert_eq!(cp.state["__result"], json!("<one>,<two>,<three>"));
    for w in KILL_WORDS {
        assert_eq!(count(&log, &format!("start {w}")), 1, "child {w} ran again");
        assert_eq!(count(&log, &format!("end {w}")), 1, "child {w}");
        let child = rt.block_on(store.load(&child_id("p", w)))?.expect("stored");
        assert_eq!(child.status, RunStatus::Completed);
        assert!(
            child.audit.is_empty(),
            "child {w} was retried: {:?}",
            child.audit
        );
    }
    assert_eq!(count(&log, "after "), 1);
    Ok(())
}

#[test]
fn a_parent_killed_while_three_children_run_gets_their_results_on_sqlite() -> TestResult {
    parent_killed_while_children_run(
        "sqlite",
        "a_parent_killed_while_three_children_run_gets_their_results_on_sqlite",
    )
}

#[test]
fn a_parent_killed_while_three_children_run_gets_their_results_on_postgres() -> TestResult {
    parent_killed_while_children_run(
        "postgres",
        "a_parent_killed_while_three_children_run_gets_their_results_on_postgres",
    )
}
