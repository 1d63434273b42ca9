//! Signals: a named message sent to a run is kept until a wait for its name
//! takes it; each wait takes one, once, whenever it was sent.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_core::{
    durable, signal, DurableCtx, Error, History, ManualClock, MemoryStore, Outcome, Runner, Step,
    Store, SystemClock, Timestamp, Wait, Workflow, SIGNALS_KEY,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Four waits for `go`; the first signal is sent while a step runs (before
/// the first wait), two while the run waits, one after a run that found
/// nothing.
async fn four_waits(
    ctx: DurableCtx<'static, MemoryStore>,
    store: MemoryStore,
) -> Result<Vec<Value>, Error> {
    ctx.step("a", move || {
        let store = store.clone();
        async move {
            // Boxed: kept off the step's frame, which a debug build makes
            // large.
            Box::pin(signal(
                &store,
                "r",
                "go",
                Some(json!(1)),
                "during",
                &SystemClock,
            ))
            .await?;
            Ok::<_, Error>(0)
        }
    })
    .await?;
    let mut got = Vec::new();
    for _ in 0..4 {
        let s = ctx.wait_for("go", None).await?.expect("no timeout was set");
        got.push(json!({"data": s.data, "by": s.by}));
    }
    Ok(got)
}

#[tokio::test]
async fn each_wait_takes_one_signal_once_whenever_it_was_sent() -> TestResult {
    let store = MemoryStore::new();
    let call = || {
        let s = store.clone();
        durable("r", &store, "w", move |ctx| four_waits(ctx, s))
    };
    // The signal sent during step a is taken by the first wait; the second
    // finds none and the run stops there.
    let out = call().await?;
    assert_eq!(
        out,
        Outcome::Waiting {
            gate: "go#2".into()
        }
    );
    let cp = store.load("r").await?.expect("the run");
    assert!(
        matches!(&cp.wait, Some(Wait::Signal { step, arrived: false, .. }) if step == "go#2"),
        "{:?}",
        cp.wait
    );
    // Nothing was sent for this wait: a worker only looks again at its
    // recheck time.
    let recheck = cp.runnable_at().expect("a recheck time");
    assert!(
        recheck > Timestamp::EPOCH && recheck > cp.updated_at,
        "{recheck}"
    );
    // Twice while it waits: the run is due at once.
    signal(&store, "r", "go", Some(json!(2)), "ada", &SystemClock).await?;
    signal(&store, "r", "go", Some(json!(3)), "bob", &SystemClock).await?;
    let cp = store.load("r").await?.expect("the run");
    assert!(
        matches!(&cp.wait, Some(Wait::Signal { arrived: true, .. })),
        "{:?}",
        cp.wait
    );
    assert_eq!(cp.runnable_at(), Some(Timestamp::EPOCH));
    // A signal of another name wakes nothing and is taken by nothing here.
    signal(&store, "r", "other", None, "eve", &SystemClock).await?;
    // The next call takes 2 and 3 with the second and third waits, and
    // stops at the fourth; a call with nothing new stops there again.
    assert_eq!(
        call().await?,
        Outcome::Waiting {
            gate: "go#4".into()
        }
    );
    assert_eq!(
        call().await?,
        Outcome::Waiting {
            gate: "go#4".into()
        }
    );
    // After: the fourth wait takes it.
    signal(&store, "r", "go", Some(json!(4)), "cy", &SystemClock).await?;
    let got = call().await?.completed().expect("completed");
    assert_eq!(
        got,
        [
            json!({"data": 1, "by": "during"}),
            json!({"data": 2, "by": "ada"}),
            json!({"data": 3, "by": "bob"}),
            json!({"data": 4, "by": "cy"}),
        ]
    );
    // Each delivery is in the history with its sender, and each signal's
    // number is taken once.
    let hist = store.history("r").await?.expect("history");
    let senders: Vec<&str> = hist
        .iter()
        .filter(|r| r.name.starts_with("go"))
        .map(|r| r.update[&r.name]["by"].as_str().unwrap())
        .collect();
    assert_eq!(senders, ["during", "ada", "bob", "cy"]);
    let ids: std::collections::HashSet<&str> = hist
        .iter()
        .filter(|r| r.name.starts_with("go"))
        .map(|r| r.update[&r.name]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4, "a signal was taken twice: {ids:?}");
    let cp = store.load("r").await?.expect("the run");
    assert_eq!(
        cp.state[SIGNALS_KEY]["go"]["seq"],
        hist.iter()
            .rfind(|r| r.name.starts_with("go"))
            .unwrap()
            .update["go#4"]["seq"]
    );
    // A completed run takes no more signals.
    let err = signal(&store, "r", "go", None, "late", &SystemClock)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("has ended"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_signal_needs_a_run_a_name_and_data_within_bounds() -> TestResult {
    let store = MemoryStore::new();
    let err = signal(&store, "nope", "go", None, "ada", &SystemClock)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoSuchRun { .. }), "{err}");
    let wf = Workflow::builder("w")
        .push(Step::wait_for("answer", "reply"))
        .build()?;
    assert!(matches!(
        steadfast_core::run("r", &wf, &store).await?,
        Outcome::Waiting { .. }
    ));
    for (name, by, data) in [
        ("", "ada", None),
        ("go", "", None),
        ("go", "ada", Some(json!("x".repeat(70_000)))),
    ] {
        let err = signal(&store, "r", name, data, by, &SystemClock)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
        assert!(err.to_string().contains("nothing was sent"), "{err}");
    }
    assert!(
        steadfast_core::Events::read_events(&store, "r", 0, 10)
            .await?
            .is_empty(),
        "a refused signal was kept"
    );
    // A listed wait takes it; the delivery is in the state under the step.
    signal(
        &store,
        "r",
        "reply",
        Some(json!({"ok": true})),
        "ada",
        &SystemClock,
    )
    .await?;
    let state = steadfast_core::run("r", &wf, &store)
        .await?
        .completed()
        .expect("completed");
    assert_eq!(state["answer"]["data"], json!({"ok": true}));
    assert_eq!(state["answer"]["signal"], json!("reply"));
    Ok(())
}

#[tokio::test]
async fn a_wait_gives_up_after_its_timeout() -> TestResult {
    let store = MemoryStore::new();
    let clock = Arc::new(ManualClock::new(Timestamp::from_unix_millis(1_000_000)));
    let call = || async {
        Runner::new(&store)
            .clock(clock.clone())
            .durable("r", "w", |ctx| async move {
                let s = ctx.wait_for("go", Some(Duration::from_secs(3600))).await?;
                Ok::<_, Error>(s.map(|s| s.data))
            })
            .await
    };
    assert!(matches!(call().await?, Outcome::Waiting { .. }));
    let cp = store.load("r").await?.expect("the run");
    assert_eq!(
        cp.runnable_at(),
        Some(Timestamp::from_unix_millis(1_000_000).saturating_add(steadfast_core::SIGNAL_RECHECK)),
        "a worker looks again at the recheck time, before it gives up"
    );
    clock.advance(Duration::from_secs(1800));
    assert!(matches!(call().await?, Outcome::Waiting { .. }));
    clock.advance(Duration::from_secs(1801));
    assert_eq!(call().await?, Outcome::Completed(None));
    Ok(())
}

/// A signal sent at the moment the run begins to wait is never lost: the
/// run takes it, or it stands at its wait marked due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_racing_with_the_wait_is_never_lost() -> TestResult {
    for round in 0..100 {
        let store = MemoryStore::new();
        let id = format!("r{round}");
        let wf = Workflow::builder("w")
            .step("a", |_, _| async { steadfast_core::update(json!({})) })
            .push(Step::wait_for("answer", "go"))
            .build()?;
        let run = {
            let (store, wf, id) = (store.clone(), wf.clone(), id.clone());
            tokio::spawn(async move { steadfast_core::run(&id, &wf, &store).await })
        };
        // Send as soon as the run is there.
        while store.load(&id).await?.is_none() {
            tokio::task::yield_now().await;
        }
        signal(&store, &id, "go", Some(json!(round)), "racer", &SystemClock).await?;
        match run.await?? {
            Outcome::Completed(state) => assert_eq!(state["answer"]["data"], json!(round)),
            Outcome::Waiting { .. } => {
                let cp = store.load(&id).await?.expect("the run");
                assert_eq!(
                    cp.runnable_at(),
                    Some(Timestamp::EPOCH),
                    "round {round}: the run waits with its signal sent but is not due"
                );
                let state = steadfast_core::run(&id, &wf, &store)
                    .await?
                    .completed()
                    .expect("completed");
                assert_eq!(state["answer"]["data"], json!(round));
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    Ok(())
}

/// A forked run's log starts empty: signals sent to the fork are taken by
/// its waits, although the state it was forked with names signals of the
/// original's log.
#[tokio::test]
async fn a_forked_run_takes_the_signals_sent_to_it() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("w")
        .push(Step::wait_for("first", "go"))
        .step("mid", |_, _| async {
            steadfast_core::update(json!({"mid": 1}))
        })
        .push(Step::wait_for("second", "go"))
        .build()?;
    signal_after_start(&store, &wf, "orig").await?;
    signal(&store, "orig", "go", Some(json!("a")), "ada", &SystemClock).await?;
    assert!(matches!(
        steadfast_core::run("orig", &wf, &store).await?,
        Outcome::Waiting { .. }
    ));
    steadfast_core::ops::fork(&store, "orig", "mid", "copy", "ops", &SystemClock).await?;
    assert!(matches!(
        steadfast_core::run("copy", &wf, &store).await?,
        Outcome::Waiting { .. }
    ));
    signal(&store, "copy", "go", Some(json!("b")), "bob", &SystemClock).await?;
    let state = steadfast_core::run("copy", &wf, &store)
        .await?
        .completed()
        .expect("completed");
    assert_eq!(state["first"]["data"], json!("a"));
    assert_eq!(state["second"]["data"], json!("b"));
    Ok(())
}

async fn signal_after_start(store: &MemoryStore, wf: &Workflow, id: &str) -> TestResult {
    assert!(matches!(
        steadfast_core::run(id, wf, store).await?,
        Outcome::Waiting { .. }
    ));
    Ok(())
}

/// The engine's keys are its own: what a listed step returns under them is
/// dropped, and a gate or wait cannot be named after them.
#[tokio::test]
async fn a_listed_step_cannot_write_the_signal_record() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("w")
        .push(Step::wait_for("answer", "go"))
        .step("forger", |_, _| async {
            steadfast_core::update(json!({ SIGNALS_KEY: {}, "forged": true }))
        })
        .push(Step::wait_for("again", "go"))
        .build()?;
    signal_after_start(&store, &wf, "r").await?;
    signal(&store, "r", "go", Some(json!(1)), "ada", &SystemClock).await?;
    // The forger's reset of the record is dropped: signal 1 is not taken a
    // second time by the next wait.
    assert!(matches!(
        steadfast_core::run("r", &wf, &store).await?,
        Outcome::Waiting { .. }
    ));
    let cp = store.load("r").await?.expect("the run");
    assert_eq!(cp.state["forged"], json!(true));
    assert!(cp.state[SIGNALS_KEY]["go"].is_object(), "{:?}", cp.state);
    for name in [SIGNALS_KEY, "__signal", "__start"] {
        let err = Workflow::builder("w")
            .push(Step::wait_for(name, "go"))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("keeps for itself"), "{err}");
    }
    Ok(())
}

/// A failed run can be retried, so it takes signals.
#[tokio::test]
async fn a_failed_run_takes_signals() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("w")
        .step("boom", |_, _| async {
            Err(steadfast_core::StepError::terminal("no"))
        })
        .build()?;
    assert!(steadfast_core::run("r", &wf, &store).await.is_err());
    signal(&store, "r", "go", None, "ada", &SystemClock).await?;
    Ok(())
}

mod model {
    //! Any sequence of sends and runs: each wait takes the oldest signal of
    //! its name not taken yet, each signal is taken at most once, and a run
    //! stops exactly when its next wait has none, as a queue per name says.

    use std::collections::{HashMap, VecDeque};

    use proptest::prelude::*;
    use serde_json::json;
    use steadfast_core::{durable, signal, MemoryStore, Outcome, SystemClock};

    /// The names the waits ask for, in order.
    const WAITS: [&str; 6] = ["a", "b", "a", "a", "b", "a"];

    #[derive(Clone, Debug)]
    enum Op {
        Send(usize),
        Run,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![(0..2usize).prop_map(Op::Send), Just(Op::Run)]
    }

    async fn call(store: &MemoryStore) -> Outcome<Vec<u64>> {
        durable("r", store, "w", |ctx| async move {
            let mut got = Vec::new();
            for name in WAITS {
                let s = ctx.wait_for(name, None).await?.expect("no timeout");
                got.push(s.data.as_u64().expect("a number"));
            }
            Ok::<_, steadfast_core::Error>(got)
        })
        .await
        .expect("the run")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn waits_take_signals_as_a_queue_per_name(ops in proptest::collection::vec(op(), 1..24)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = MemoryStore::new();
                // The run exists (stopped at its first wait) before any send.
                let first = call(&store).await;
                let stopped = matches!(first, Outcome::Waiting { .. });
                prop_assert!(stopped, "the first call did not stop at its wait");
                let mut queues: HashMap<&str, VecDeque<u64>> = HashMap::new();
                let (mut next, mut sent, mut taken) = (0usize, 0u64, Vec::new());
                let mut done = false;
                for op in ops {
                    match op {
                        Op::Send(n) => {
                            let name = ["a", "b"][n];
                            let out = signal(&store, "r", name, Some(json!(sent + 1)), "p", &SystemClock).await;
                            if done {
                                // A completed run takes no more.
                                prop_assert!(out.is_err(), "a completed run took a signal");
                                continue;
                            }
                            out.expect("send");
                            sent += 1;
                            queues.entry(name).or_default().push_back(sent);
                        }
                        Op::Run => {
                            // The model: waits go on while their name has one.
                            while next < WAITS.len() {
                                match queues.entry(WAITS[next]).or_default().pop_front() {
                                    Some(v) => {
                                        taken.push(v);
                                        next += 1;
                                    }
                                    None => break,
                                }
                            }
                            match call(&store).await {
                                Outcome::Completed(got) => {
                                    prop_assert_eq!(next, WAITS.len());
                                    prop_assert_eq!(&got, &taken);
                                    done = true;
                                }
                                Outcome::Waiting { gate } => {
                                    prop_assert!(next < WAITS.len());
                                    let want = if next == 0 {
                                        WAITS[0].to_string()
                                    } else {
                                        let n = WAITS[..=next].iter().filter(|w| **w == WAITS[next]).count();
                                        if n == 1 { WAITS[next].to_string() } else { format!("{}#{n}", WAITS[next]) }
                                    };
                                    prop_assert_eq!(gate, want);
                                }
                                other => prop_assert!(false, "{other:?}"),
                            }
                        }
                    }
                }
                Ok(())
            })?;
        }
    }
}

/// A wait begun while another step of the same call runs is refused: the
/// run would stand at the wait, holding no lease, with that step running.
#[tokio::test]
async fn a_wait_beside_a_running_step_is_refused() -> TestResult {
    let store = MemoryStore::new();
    let out = durable("r", &store, "w", |ctx| async move {
        let slow = ctx.step("slow", || async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, Error>(1)
        });
        let wait = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            ctx.wait_for("go", None).await
        };
        let (stepped, waited) = tokio::join!(slow, wait);
        stepped?;
        match waited {
            Err(Error::InvalidWorkflow { reason, .. }) => Ok::<_, Error>(reason),
            other => panic!("the wait beside a step was not refused: {other:?}"),
        }
    })
    .await?;
    let reason = out.completed().expect("completed");
    assert!(reason.contains("still under way"), "{reason}");
    // Once the step is done, a wait is fine.
    let store = MemoryStore::new();
    let out = durable("r", &store, "w", |ctx| async move {
        ctx.step("first", || async { Ok::<_, Error>(1) }).await?;
        ctx.wait_for("go", None).await
    })
    .await?;
    assert!(matches!(out, Outcome::Waiting { .. }));
    Ok(())
}
