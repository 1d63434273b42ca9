//! Patches in durable functions: a run that passed the patch point under
//! older code keeps the old branch, a run that reaches it under the patched
//! code takes the new one, both on every replay; `deprecate_patch` steps
//! over the record once the old branch is gone.

use std::sync::{Arc, Mutex};

use steadfast_core::{
    approve, durable, DurableCtx, Error, MemoryStore, Outcome, StepError, SystemClock,
};

type Log = Arc<Mutex<Vec<String>>>;

fn ran(log: &Log, what: &str) {
    log.lock().unwrap().push(what.to_string());
}

/// The code before the patch: step "a", gate "g", step "c".
async fn v1(ctx: DurableCtx<'static, MemoryStore>, log: Log) -> Result<String, Error> {
    let l = log.clone();
    let a: String = ctx
        .step("a", move || {
            ran(&l, "a");
            async { Ok::<_, StepError>("old".to_string()) }
        })
        .await?;
    ctx.gate("g").await?;
    Ok(a)
}

/// The patched code: step "a2" instead of "a" for runs that reach it.
async fn v2(ctx: DurableCtx<'static, MemoryStore>, log: Log) -> Result<String, Error> {
    let patched = ctx.patched("fix-1").await?;
    // Asked again in the same call: the same answer.
    assert_eq!(ctx.patched("fix-1").await?, patched);
    let (name, value) = if patched { ("a2", "new") } else { ("a", "old") };
    let l = log.clone();
    let a: String = ctx
        .step(name, move || {
            ran(&l, name);
            async move { Ok::<_, StepError>(value.to_string()) }
        })
        .await?;
    ctx.gate("g").await?;
    Ok(a)
}

/// After the old branch is gone: the patch deprecated.
async fn v3(ctx: DurableCtx<'static, MemoryStore>, log: Log) -> Result<String, Error> {
    ctx.deprecate_patch("fix-1").await?;
    let l = log.clone();
    let a: String = ctx
        .step("a2", move || {
            ran(&l, "a2");
            async { Ok::<_, StepError>("new".to_string()) }
        })
        .await?;
    ctx.gate("g").await?;
    Ok(a)
}

#[tokio::test]
async fn old_runs_keep_the_old_branch_and_new_runs_take_the_new() {
    let store = MemoryStore::new();
    let log: Log = Log::default();
    // Run "old" starts before the patch and waits at its gate.
    let l = log.clone();
    let out = durable("old", &store, "agent", |ctx| v1(ctx, l))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Waiting { gate: "g".into() });
    // The code is patched; run "new" starts under it.
    let l = log.clone();
    let out = durable("new", &store, "agent", |ctx| v2(ctx, l))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Waiting { gate: "g".into() });
    assert_eq!(*log.lock().unwrap(), ["a", "a2"]);
    // Both resume under the patched code: neither step runs again, each
    // keeps its branch.
    for id in ["old", "new"] {
        approve(&store, id, "g", None, "ada", &SystemClock)
            .await
            .unwrap();
    }
    let l = log.clone();
    let old = durable("old", &store, "agent", |ctx| v2(ctx, l))
        .await
        .unwrap();
    let l = log.clone();
    let new = durable("new", &store, "agent", |ctx| v2(ctx, l))
        .await
        .unwrap();
    assert_eq!(old, Outcome::Completed("old".to_string()));
    assert_eq!(new, Outcome::Completed("new".to_string()));
    assert_eq!(*log.lock().unwrap(), ["a", "a2"]);
}

#[tokio::test]
async fn a_deprecated_patch_steps_over_its_record() {
    let store = MemoryStore::new();
    let log: Log = Log::default();
    let l = log.clone();
    durable("new", &store, "agent", |ctx| v2(ctx, l))
        .await
        .unwrap();
    approve(&store, "new", "g", None, "ada", &SystemClock)
        .await
        .unwrap();
    let l = log.clone();
    let out = durable("new", &store, "agent", |ctx| v3(ctx, l))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Completed("new".to_string()));
    // A run started after the deprecation records nothing for the patch.
    let l = log.clone();
    durable("later", &store, "agent", |ctx| v3(ctx, l))
        .await
        .unwrap();
    let history = steadfast_core::StoreExt::history(&store, "later")
        .await
        .unwrap()
        .unwrap();
    assert!(
        history.iter().all(|r| !r.name.starts_with("__patch")),
        "{history:?}"
    );
    assert_eq!(*log.lock().unwrap(), ["a2", "a2"]);
}

#[tokio::test]
async fn bad_patch_ids_are_refused() {
    let store = MemoryStore::new();
    for (i, id) in ["", "a b", "é", &"p".repeat(101)].into_iter().enumerate() {
        let id = id.to_string();
        let r = durable(&format!("r{i}"), &store, "agent", |ctx| async move {
            ctx.patched(&id).await
        })
        .await;
        assert!(matches!(r, Err(Error::InvalidWorkflow { .. })), "{r:?}");
    }
}
