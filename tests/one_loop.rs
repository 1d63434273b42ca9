//! Listed steps, durable steps and parallel branches go through one attempt
//! loop: attempts persist alike, and a branch reports the index it records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use steadfast::{MemoryStore, RetryPolicy, Runner, StepCtx, StepError, StepOptions, Store};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A durable step's failed attempts are saved like a listed step's, so a
/// crash during its backoff does not give it a fresh retry budget.
#[tokio::test]
async fn a_durable_steps_attempts_survive_a_crash() -> TestResult {
    let store = MemoryStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let call = |seen: Arc<Mutex<Vec<u32>>>| {
        let store = store.clone();
        async move {
            Runner::new(&store)
                .durable("r", "flaky", move |ctx| async move {
                    let options = StepOptions::new().retry(
                        RetryPolicy::new(3)
                            .backoff(Duration::from_secs(5), Duration::from_secs(5))
                            .jitter(false),
                    );
                    ctx.step_with("call", options, move || {
                        let seen = Arc::clone(&seen);
                        async move {
                            let attempt = StepCtx::current().map_or(0, |c| c.attempt());
                            seen.lock().unwrap().push(attempt);
                            Err::<u32, _>(StepError::retryable("down"))
                        }
                    })
                    .await
                })
                .await
        }
    };
    // The first call fails once, then "crashes" during the 5 s backoff.
    let first = tokio::time::timeout(Duration::from_millis(300), call(Arc::clone(&seen))).await;
    assert!(first.is_err(), "the call was cut during its backoff");
    assert_eq!(store.load("r").await?.expect("saved").attempts, 1);
    // The next call goes on with attempt 2, not 1.
    let second = tokio::time::timeout(Duration::from_millis(300), call(Arc::clone(&seen))).await;
    assert!(second.is_err());
    assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    Ok(())
}

/// A parallel branch's context reports the index its record has when the
/// branches finish in the order given.
#[tokio::test]
async fn parallel_branches_report_their_own_indexes() -> TestResult {
    let store = MemoryStore::new();
    let out = Runner::new(&store)
        .durable("r", "fan-out", |ctx| async move {
            ctx.step("first", || async { Ok::<_, StepError>(0usize) })
                .await?;
            let index = || async {
                Ok::<_, StepError>(StepCtx::current().map_or(usize::MAX, |c| c.index()))
            };
            ctx.parallel(vec![
                (
                    "x".to_string(),
                    Box::pin(index())
                        as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
                ),
                ("y".to_string(), Box::pin(index())),
            ])
            .await
        })
        .await?;
    assert_eq!(out.completed(), Some(vec![1, 2]));
    let cp = store.load("r").await?.expect("saved");
    assert_eq!(cp.completed, vec!["first", "x", "y"]);
    Ok(())
}

/// A durable function that goes on after a step ran out of attempts gives
/// the next step a budget of its own (and numbers its attempts from 1).
#[tokio::test]
async fn the_step_after_an_exhausted_one_has_its_own_budget() -> TestResult {
    let store = MemoryStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    let out = Runner::new(&store)
        .durable("r", "fallback", move |ctx| async move {
            let quick = || {
                StepOptions::new()
                    .retry(RetryPolicy::new(3).backoff(Duration::ZERO, Duration::ZERO))
            };
            let first = ctx
                .step_with("first", quick(), || async {
                    Err::<u32, _>(StepError::retryable("down"))
                })
                .await;
            assert!(first.is_err(), "the first step ran out of attempts");
            ctx.step_with("fallback", quick(), move || {
                let seen = Arc::clone(&s2);
                async move {
                    let attempt = StepCtx::current().map_or(0, |c| c.attempt());
                    seen.lock().unwrap().push(attempt);
                    if attempt < 2 {
                        Err(StepError::retryable("not yet"))
                    } else {
                        Ok(7u32)
                    }
                }
            })
            .await
        })
        .await?;
    assert_eq!(out.completed(), Some(7));
    assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    Ok(())
}
