//! Spend and budgets: what a step reports is saved in the run's record at
//! once and with its checkpoint, charged once per attempt that reported it;
//! a run past a budget stops at its `budget` gate before its next step.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use steadfast_core::{
    approve, durable, reject, update, Error, History, MemoryStore, Outcome, RetryPolicy, RunStatus,
    Runner, Step, StepCtx, StepError, StepOptions, Store, SystemClock, Wait, Workflow, BUDGET_GATE,
    SPEND_KEY,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn spent(store: &MemoryStore, run: &str, what: &str) -> f64 {
    let cp = store.load(run).await.unwrap().unwrap();
    cp.spend
        .and_then(|s| s.spent.get(what).copied())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_report_is_saved_before_the_step_ends_and_a_replay_is_not_charged() -> TestResult {
    let store = MemoryStore::new();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (seen_tx, go_rx) = (
        Arc::new(std::sync::Mutex::new(Some(seen_tx))),
        Arc::new(tokio::sync::Mutex::new(Some(go_rx))),
    );
    let watcher = {
        let store = store.clone();
        tokio::spawn(async move {
            seen_rx.await.unwrap();
            let during = spent(&store, "r", "tokens").await;
            go_tx.send(()).unwrap();
            during
        })
    };
    let calls = Arc::new(AtomicU32::new(0));
    let body = |calls: Arc<AtomicU32>| {
        let (seen_tx, go_rx) = (Arc::clone(&seen_tx), Arc::clone(&go_rx));
        move |ctx: steadfast_core::DurableCtx<'static, MemoryStore>| async move {
            // A run's first step, without a lease, runs before the run has a
            // record: its spend is charged with its checkpoint. From then on
            // a report is saved at once.
            ctx.step("setup", || async { Ok::<_, Error>(()) }).await?;
            ctx.step("ask", move || {
                let (seen_tx, go_rx, calls) =
                    (Arc::clone(&seen_tx), Arc::clone(&go_rx), Arc::clone(&calls));
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let step = StepCtx::current().expect("in a step");
                    step.spend("tokens", 1234.0)?.saved().await?;
                    step.spend("usd", 0.25)?.saved().await?;
                    if let Some(tx) = seen_tx.lock().unwrap().take() {
                        tx.send(()).unwrap();
                    }
                    if let Some(rx) = go_rx.lock().await.take() {
                        rx.await.unwrap();
                    }
                    Ok::<_, Error>(7)
                }
            })
            .await
        }
    };
    let out = durable("r", &store, "agent", body(Arc::clone(&calls))).await?;
    assert_eq!(out, Outcome::Completed(7));
    assert_eq!(watcher.await?, 1234.0, "saved while the step still ran");
    assert_eq!(spent(&store, "r", "tokens").await, 1234.0);
    assert_eq!(spent(&store, "r", "usd").await, 0.25);
    // The step's record keeps what it spent.
    let history = store.history("r").await?.unwrap();
    assert_eq!(
        history[1].update[SPEND_KEY],
        json!({"index": 1, "step": "ask", "spent": {"tokens": 1234.0, "usd": 0.25}})
    );
    // Called again: replayed, never charged again.
    durable("r", &store, "agent", body(Arc::clone(&calls))).await?;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(spent(&store, "r", "tokens").await, 1234.0);
    Ok(())
}

#[tokio::test]
async fn every_attempt_that_reported_is_charged() -> TestResult {
    let store = MemoryStore::new();
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let out = durable("r", &store, "agent", move |ctx| async move {
        let opts = StepOptions::new().retry(RetryPolicy::new(3).backoff(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        ));
        ctx.step_with("ask", opts, move || {
            let c = Arc::clone(&c);
            async move {
                let n = c.fetch_add(1, Ordering::SeqCst);
                // Not awaited: charged all the same.
                let _ = StepCtx::current().unwrap().spend("usd", 1.0)?;
                if n < 2 {
                    return Err(StepError::retryable("rate limited"));
                }
                Ok::<_, StepError>(n)
            }
        })
        .await
    })
    .await?;
    assert_eq!(out, Outcome::Completed(2));
    assert_eq!(spent(&store, "r", "usd").await, 3.0, "three attempts");
    let history = store.history("r").await?.unwrap();
    assert_eq!(history[0].update[SPEND_KEY]["spent"], json!({"usd": 1.0}));
    Ok(())
}

#[tokio::test]
async fn bad_reports_are_refused_and_charge_nothing() -> TestResult {
    let store = MemoryStore::new();
    durable("r", &store, "agent", |ctx| async move {
        ctx.step("ask", || async {
            let step = StepCtx::current().unwrap();
            for (what, amount) in [
                ("usd", -1.0),
                ("usd", f64::NAN),
                ("usd", f64::INFINITY),
                ("usd", 2e15),
                ("", 1.0),
                ("us d", 1.0),
            ] {
                let e = step.spend(what, amount).unwrap_err();
                assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
            }
            Ok::<_, StepError>(())
        })
        .await
    })
    .await?;
    let cp = store.load("r").await?.unwrap();
    assert_eq!(cp.spend, None);
    let outside = StepCtx::new("r", "s", 0, 1).spend("usd", 1.0).unwrap_err();
    assert!(outside.to_string().contains("outside a run"), "{outside}");
    Ok(())
}

fn listed(outputs: Vec<Value>) -> Workflow {
    let mut b = Workflow::builder("flow");
    for (i, out) in outputs.into_iter().enumerate() {
        b = b.step(format!("s{i}"), move |_, _| {
            let out = out.clone();
            async move { update(out) }
        });
    }
    b.build().unwrap()
}

#[tokio::test]
async fn a_listed_step_reports_in_its_update_and_an_echo_is_not_a_report() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("flow")
        .step("a", |_, _| async {
            update(json!({"a": 1, "__spend": {"tokens": 10}}))
        })
        // Gives back the state it was given (a `jq .` step): the record of
        // step a's spend is not a report of its own.
        .step("b", |_, state| async move {
            let mut out = (*state).clone();
            out.insert("b".into(), json!(2));
            Ok(out)
        })
        .step("c", |_, _| async {
            update(json!({"__spend": {"tokens": 5, "usd": 0.5}}))
        })
        .build()?;
    let state = Runner::new(&store)
        .run("r", &wf)
        .await?
        .completed()
        .unwrap();
    assert_eq!(spent(&store, "r", "tokens").await, 15.0);
    assert_eq!(spent(&store, "r", "usd").await, 0.5);
    assert_eq!(state["a"], json!(1));
    let history = store.history("r").await?.unwrap();
    assert_eq!(
        history[0].update[SPEND_KEY]["spent"],
        json!({"tokens": 10.0})
    );
    assert!(
        !history[1].update.contains_key(SPEND_KEY),
        "{:?}",
        history[1].update
    );

    for bad in [
        json!({"usd": -1}),
        json!({"usd": "1"}),
        json!([1]),
        json!({"a b": 1}),
    ] {
        let store = MemoryStore::new();
        let wf = listed(vec![json!({"__spend": bad.clone()})]);
        let e = Runner::new(&store).run("r", &wf).await.unwrap_err();
        assert!(e.to_string().contains("__spend"), "{bad}: {e}");
        let cp = store.load("r").await?.unwrap();
        assert_eq!((cp.status, cp.spend), (RunStatus::Failed, None), "{bad}");
    }
    Ok(())
}

fn spender(costs: Vec<f64>) -> Workflow {
    let mut b = Workflow::builder("spender");
    for (i, cost) in costs.into_iter().enumerate() {
        b = b.step(format!("s{i}"), move |ctx: StepCtx, _| async move {
            ctx.spend("usd", cost)
                .map_err(StepError::terminal)?
                .saved()
                .await
                .map_err(StepError::terminal)?;
            update(json!({ format!("s{i}"): true }))
        });
    }
    b.build().unwrap()
}

#[tokio::test]
async fn a_run_over_budget_stops_at_the_gate_before_its_next_step() -> TestResult {
    let store = MemoryStore::new();
    let wf = spender(vec![0.6, 0.6, 0.6, 5.0]);
    let runner = Runner::new(&store).budget([("usd".to_string(), 1.0)].into());
    let out = runner.run("r", &wf).await?;
    assert_eq!(
        out,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    let cp = store.load("r").await?.unwrap();
    assert_eq!(
        cp.next, 2,
        "the step that went over finished; the next did not start"
    );
    assert_eq!(cp.status, RunStatus::Waiting);
    assert!(matches!(&cp.wait, Some(Wait::Gate { step, .. }) if step == BUDGET_GATE));
    assert_eq!(cp.lease, None);
    // Called again without a decision: still waiting, nothing runs.
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    assert_eq!(store.load("r").await?.unwrap().next, 2);

    // Data that is not amounts is refused, and nothing is written.
    let before = store.load("r").await?.unwrap().version;
    for bad in [json!({"usd": -5}), json!("more"), json!({"usd": "5"})] {
        let e = approve(
            &store,
            "r",
            BUDGET_GATE,
            Some(bad.clone()),
            "ada",
            &SystemClock,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{bad}: {e}");
    }
    assert_eq!(store.load("r").await?.unwrap().version, before);

    // One more dollar (a budget of 2): the third step runs (1.8 spent), the
    // fourth takes it to 6.8 and the run completes, since no step comes
    // after it.
    approve(
        &store,
        "r",
        BUDGET_GATE,
        Some(json!({"usd": 1})),
        "ada",
        &SystemClock,
    )
    .await?;
    let cp = store.load("r").await?.unwrap();
    assert_eq!(cp.status, RunStatus::Waiting, "approved, not yet taken");
    let out = runner.run("r", &wf).await?;
    assert!(out.completed().is_some());
    let cp = store.load("r").await?.unwrap();
    let spend = cp.spend.unwrap();
    assert!((spend.spent["usd"] - 6.8).abs() < 1e-9, "{spend:?}");
    assert_eq!(spend.budget["usd"], 2.0, "granted on top of the budget");
    Ok(())
}

#[tokio::test]
async fn a_rejected_budget_ends_the_run_and_a_bare_approval_goes_one_step() -> TestResult {
    let store = MemoryStore::new();
    let wf = spender(vec![2.0, 1.0, 1.0]);
    let runner = Runner::new(&store).budget([("usd".to_string(), 1.0)].into());
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    // Approved with no data: the budget rises to what was spent, so the run
    // goes on until it spends more.
    approve(&store, "r", BUDGET_GATE, None, "ada", &SystemClock).await?;
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    assert_eq!(store.load("r").await?.unwrap().next, 2);
    reject(
        &store,
        "r",
        BUDGET_GATE,
        Some("too dear".into()),
        "ada",
        &SystemClock,
    )
    .await?;
    let out = runner.run("r", &wf).await?;
    assert!(
        matches!(out, Outcome::Rejected { ref gate, .. } if gate == BUDGET_GATE),
        "{out:?}"
    );
    assert_eq!(store.load("r").await?.unwrap().next, 2);
    Ok(())
}

#[tokio::test]
async fn a_workflow_budget_applies_and_a_run_keeps_the_one_it_started_with() -> TestResult {
    let store = MemoryStore::new();
    let mut b = Workflow::builder("spender").budget("usd", 1.5);
    for i in 0..3 {
        b = b.step(format!("s{i}"), |ctx: StepCtx, _| async move {
            let _ = ctx.spend("usd", 1.0).map_err(StepError::terminal)?;
            update(json!({}))
        });
    }
    let wf = b.build()?;
    assert_eq!(
        Runner::new(&store).run("r", &wf).await?,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    // A larger budget given later does not replace the one recorded.
    let runner = Runner::new(&store).budget([("usd".to_string(), 100.0)].into());
    assert_eq!(
        runner.run("r", &wf).await?,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    assert_eq!(
        store.load("r").await?.unwrap().spend.unwrap().budget["usd"],
        1.5
    );

    // A step named like the gate cannot go with a budget.
    let named = Workflow::builder("w")
        .budget("usd", 1.0)
        .push(Step::gate(BUDGET_GATE))
        .build();
    assert!(matches!(named, Err(Error::InvalidWorkflow { .. })));
    let bad = Workflow::builder("w")
        .budget("usd", -1.0)
        .step("a", |_, _| async { update(json!({})) })
        .build();
    assert!(matches!(bad, Err(Error::InvalidWorkflow { .. })));
    let runner = Runner::new(&store).budget([("usd".to_string(), f64::NAN)].into());
    assert!(matches!(
        runner.run("other", &wf).await,
        Err(Error::InvalidInput { .. })
    ));
    Ok(())
}

#[tokio::test]
async fn a_durable_function_stops_at_the_budget_before_its_next_step() -> TestResult {
    let store = MemoryStore::new();
    let ran = Arc::new(AtomicU32::new(0));
    let body = |ran: Arc<AtomicU32>| {
        move |ctx: steadfast_core::DurableCtx<'static, MemoryStore>| async move {
            for i in 0..3 {
                let ran = Arc::clone(&ran);
                ctx.step(format!("call-{i}"), move || {
                    let ran = Arc::clone(&ran);
                    async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        StepCtx::current()
                            .unwrap()
                            .spend("tokens", 600.0)?
                            .saved()
                            .await?;
                        Ok::<_, Error>(i)
                    }
                })
                .await?;
            }
            Ok(())
        }
    };
    let runner = Runner::new(&store).budget([("tokens".to_string(), 1000.0)].into());
    let out = runner.durable("r", "agent", body(Arc::clone(&ran))).await?;
    assert_eq!(
        out,
        Outcome::Waiting {
            gate: BUDGET_GATE.into()
        }
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    approve(
        &store,
        "r",
        BUDGET_GATE,
        Some(json!({"tokens": 1000})),
        "ada",
        &SystemClock,
    )
    .await?;
    let out = runner.durable("r", "agent", body(Arc::clone(&ran))).await?;
    assert_eq!(out, Outcome::Completed(()));
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert_eq!(spent(&store, "r", "tokens").await, 1800.0);
    Ok(())
}

#[tokio::test]
async fn metrics_count_spend_per_workflow() -> TestResult {
    let store = MemoryStore::new();
    let wf = Workflow::builder("metrics-spender \"quoted\"")
        .step("a", |_, _| async {
            update(json!({"__spend": {"usd": 0.5}}))
        })
        .step("b", |ctx: StepCtx, _| async move {
            ctx.spend("usd", 0.25)
                .map_err(StepError::terminal)?
                .saved()
                .await
                .map_err(StepError::terminal)?;
            update(json!({}))
        })
        .build()?;
    Runner::new(&store).run("r", &wf).await?;
    let m = steadfast_core::metrics::snapshot();
    let key = ("metrics-spender \"quoted\"".to_string(), "usd".to_string());
    assert_eq!(m.spend.get(&key), Some(&0.75));
    let text = m.prometheus();
    assert!(
        text.contains(
            "steadfast_spend_total{workflow=\"metrics-spender \\\"quoted\\\"\",name=\"usd\"} 0.75"
        ),
        "{text}"
    );
    Ok(())
}
