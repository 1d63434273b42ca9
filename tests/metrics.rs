//! The counters of `steadfast::metrics`: steps executed and completed, a
//! re-execution counted when a call resumes a run that a cut-off call left
//! running, a conflict when another writer saved first, and every save in
//! the latency histogram. One test, so that no other test of this binary
//! moves the process-wide counters meanwhile.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use steadfast::store::SaveRequest;
use steadfast::{metrics, update, MemoryStore, Runner, Store, Workflow};
use tokio::sync::{Notify, Semaphore};

const HANG: u8 = 0;
const PASS: u8 = 1;
const WAIT: u8 = 2;

#[test]
fn counters_count_steps_reexecutions_conflicts_and_saves() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mode = Arc::new(AtomicU8::new(HANG));
        let started = Arc::new(Notify::new());
        let go = Arc::new(Semaphore::new(0));
        let (m, s, g) = (Arc::clone(&mode), Arc::clone(&started), Arc::clone(&go));
        let wf = Workflow::builder("w")
            .step("a", |_, _| async { update(json!({"a": 1})) })
            .step("b", move |_, _| {
                let mode = m.load(Ordering::SeqCst);
                let (s, g) = (Arc::clone(&s), Arc::clone(&g));
                async move {
                    match mode {
                        HANG => std::future::pending::<()>().await,
                        WAIT => {
                            s.notify_one();
                            if let Ok(p) = g.acquire().await {
                                p.forget();
                            }
                        }
                        _ => {}
                    }
                    update(json!({"b": 2}))
                }
            })
            .build()
            .expect("workflow");
        let store = MemoryStore::new();
        let before = metrics::snapshot();
        // A call cut off in step b (its future dropped, as by a kill).
        let cut = tokio::time::timeout(
            Duration::from_millis(100),
            Runner::new(&store).run("r", &wf),
        )
        .await;
        assert!(cut.is_err(), "the call was not cut off");
        let mid = metrics::snapshot();
        assert_eq!(mid.steps_executed - before.steps_executed, 2);
        assert_eq!(mid.steps_completed - before.steps_completed, 1);
        assert_eq!(mid.reexecutions, before.reexecutions);
        mode.store(PASS, Ordering::SeqCst);
        Runner::new(&store)
            .run("r", &wf)
            .await
            .expect("the resumed call");
        let after = metrics::snapshot();
        assert_eq!(
            after.reexecutions - mid.reexecutions,
            1,
            "the resume was not counted"
        );
        assert_eq!(after.steps_completed - mid.steps_completed, 1);
        // Calling a finished run again re-executes nothing.
        Runner::new(&store).run("r", &wf).await.expect("again");
        assert_eq!(metrics::snapshot().reexecutions, after.reexecutions);

        // A conflict: another writer saves while step b runs; the call's
        // save after b is refused.
        mode.store(WAIT, Ordering::SeqCst);
        let wf = Arc::new(wf);
        let (s2, w2) = (store.clone(), Arc::clone(&wf));
        let call = tokio::spawn(async move { Runner::new(&s2).run("c", &w2).await });
        started.notified().await;
        let conflicts = metrics::snapshot().conflicts;
        let cp = store.load("c").await.expect("load").expect("saved");
        store
            .save(SaveRequest::new(&cp, Some(cp.version)))
            .await
            .expect("the other writer");
        go.add_permits(1);
        let out = call.await.expect("join");
        assert!(out.as_ref().is_err_and(|e| e.is_conflict()), "{out:?}");
        assert_eq!(metrics::snapshot().conflicts - conflicts, 1);

        let end = metrics::snapshot();
        assert_eq!(
            end.saves - before.saves,
            4,
            "saves after a and b of r, after a and b (refused) of c"
        );
        assert!(
            end.save_errors > before.save_errors,
            "the refused save was not counted"
        );
        let in_buckets: u64 = end.save_buckets.iter().sum();
        assert_eq!(in_buckets, end.saves, "every save is in one bucket");
        let text = end.prometheus();
        assert!(
            text.contains(&format!("steadfast_save_seconds_count {}", end.saves)),
            "{text}"
        );
        assert!(
            text.contains("steadfast_save_seconds_bucket{le=\"+Inf\"}"),
            "{text}"
        );
        assert!(text.contains(&format!(
            "steadfast_reexecutions_total {}",
            end.reexecutions
        )));
    });
}
