//! The watch of a run: what it reports about events of executions that did
//! not finish, runs deleted under it, and emits after a step returned.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use steadfast_core::watch::{Watch, WatchItem};
use steadfast_core::{
    durable, Events, MemoryStore, NewEvent, StepCtx, StepError, Store, Timestamp,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn kinds(store: &dyn Store, run_id: &str) -> Result<Vec<String>, steadfast_core::Error> {
    kinds_after(store, run_id, 0).await
}

async fn kinds_after(
    store: &dyn Store,
    run_id: &str,
    after: u64,
) -> Result<Vec<String>, steadfast_core::Error> {
    let mut w = Watch::new(store, run_id).after(after);
    let mut out = Vec::new();
    while let Some(item) = w.next().await? {
        out.push(match &item {
            WatchItem::Superseded { through, .. } => format!("superseded#{through}"),
            other => other.kind().to_string(),
        });
    }
    Ok(out)
}

/// A step whose first execution emitted and crashed, and whose second
/// execution emitted nothing: the first one's events are superseded.
#[tokio::test]
async fn events_of_an_execution_that_did_not_finish_are_superseded() -> TestResult {
    let store = MemoryStore::new();
    let mut crashed = NewEvent::new("s", 1, Timestamp::from_unix_millis(1_000), json!("half"));
    crashed.first = true;
    store.append_events("r", &[crashed]).await?;
    durable("r", &store, "w", |ctx| async move {
        ctx.step("s", || async { Ok::<_, StepError>(1) }).await
    })
    .await?;
    assert_eq!(
        kinds(&store, "r").await?,
        ["started", "event", "superseded#1", "done", "completed"]
    );
    // The same step emitting in the execution that completes it: nothing
    // superseded.
    let store = MemoryStore::new();
    durable("r", &store, "w", |ctx| async move {
        ctx.step("s", || async {
            StepCtx::current().unwrap().emit(json!("whole"))?;
            Ok::<_, StepError>(1)
        })
        .await
    })
    .await?;
    assert_eq!(
        kinds(&store, "r").await?,
        ["started", "event", "done", "completed"]
    );
    Ok(())
}

/// A watch that goes on after an event number (a reconnect) knows the
/// executions of the events before it: it neither reports a running one as
/// started again nor misses that a later one superseded it.
#[tokio::test]
async fn a_watch_resumed_after_a_number_knows_what_came_before() -> TestResult {
    let crashed = || {
        (1..=3)
            .map(|i| {
                let mut e = NewEvent::new("s", 1, Timestamp::from_unix_millis(1_000 + i), json!(i));
                e.first = i == 1;
                e
            })
            .collect::<Vec<_>>()
    };
    // The execution that completes the step emits nothing: the crashed
    // one's events, all seen before the reconnect, are superseded.
    let store = MemoryStore::new();
    store.append_events("r", &crashed()).await?;
    durable("r", &store, "w", |ctx| async move {
        ctx.step("s", || async { Ok::<_, StepError>(1) }).await
    })
    .await?;
    assert_eq!(
        kinds_after(&store, "r", 3).await?,
        ["superseded#3", "done", "completed"]
    );
    // Reconnected in the middle of the crashed execution, which the
    // completing one then supersedes: no second `started` for the first.
    let store = MemoryStore::new();
    store.append_events("r", &crashed()).await?;
    durable("r", &store, "w", |ctx| async move {
        ctx.step("s", || async {
            StepCtx::current().unwrap().emit(json!("again"))?;
            Ok::<_, StepError>(1)
        })
        .await
    })
    .await?;
    assert_eq!(
        kinds_after(&store, "r", 2).await?,
        [
            "event",
            "superseded#3",
            "started",
            "event",
            "done",
            "completed"
        ]
    );
    Ok(())
}

/// A run deleted while it is watched ends the watch.
#[tokio::test]
async fn a_run_deleted_under_a_watch_ends_it() -> TestResult {
    let store = Arc::new(MemoryStore::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let (s2, g2) = (Arc::clone(&store), Arc::clone(&gate));
    let running = tokio::spawn(async move {
        durable("r", &*s2, "w", |ctx| async move {
            ctx.step("a", || async { Ok::<_, StepError>(0) }).await?;
            ctx.step("s", move || {
                let g = Arc::clone(&g2);
                async move {
                    g.notified().await;
                    Ok::<_, StepError>(1)
                }
            })
            .await
        })
        .await
    });
    // The run exists once its first save landed; the step waits meanwhile.
    while store.load("r").await?.is_none() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let watched = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            let mut w = Watch::new(&*store, "r")
                .poll_every(Duration::from_millis(1))
                .unwrap();
            let mut items = Vec::new();
            while let Some(item) = w.next().await.unwrap() {
                items.push(item);
            }
            items
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.delete("r").await?;
    let items = tokio::time::timeout(Duration::from_secs(10), watched).await??;
    assert_eq!(items.last(), Some(&WatchItem::Gone), "{items:?}");
    gate.notify_one();
    let _ = running.await?;
    Ok(())
}

/// An emit after the step returned (from a clone kept by a task) is
/// refused, not lost unseen.
#[tokio::test]
async fn an_emit_after_the_step_returned_is_refused() -> TestResult {
    let store = MemoryStore::new();
    let kept: Arc<Mutex<Option<StepCtx>>> = Arc::default();
    let k = Arc::clone(&kept);
    durable("r", &store, "w", |ctx| async move {
        ctx.step("s", move || {
            let k = Arc::clone(&k);
            async move {
                *k.lock().unwrap() = StepCtx::current();
                Ok::<_, StepError>(1)
            }
        })
        .await
    })
    .await?;
    let late = kept.lock().unwrap().take().expect("kept");
    let err = late.emit(json!("late")).unwrap_err();
    assert!(err.to_string().contains("recording events"), "{err}");
    assert!(store.read_events("r", 0, 10).await?.is_empty());
    Ok(())
}
