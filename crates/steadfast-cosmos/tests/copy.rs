//! Copying runs into the Cosmos store and back (`transfer::copy`): every
//! record and history row arrives equal, a second copy keeps everything, a
//! large state (over one item) moves whole, and the copies run on.

mod support;

use std::sync::Arc;

use serde_json::json;
use steadfast_conformance::runtime as rt;
use steadfast_core::transfer::copy;
use steadfast_core::StoreExt as _;
use steadfast_core::{
    approve, ops, update, ListFilter, MemoryStore, Outcome, Runner, Step, Store, SystemClock,
    Workflow,
};
use steadfast_cosmos::CosmosOptions;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn workflow() -> Workflow {
    Workflow::builder("w")
        .step("s0", |ctx, _| async move {
            // Every tenth run carries a state of 3 MB: chunk items.
            let big = if ctx.run_id().ends_with('0') {
                3 << 20
            } else {
                10
            };
            update(json!({"s0": "x".repeat(big)}))
        })
        .push(Step::gate("review"))
        .step("s1", |_, s| async move {
            update(json!({"s1": s["review"].clone()}))
        })
        .build()
        .expect("a valid workflow")
}

async fn ids(store: &dyn Store) -> Vec<String> {
    let page = store.list(&ListFilter::new()).await.expect("list");
    page.into_iter().map(|r| r.run_id).collect()
}

#[test]
fn runs_copy_into_cosmos_and_back_equal() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    rt().block_on(async {
        let wf = workflow();
        let source: Arc<dyn Store> = Arc::new(MemoryStore::with_state_limit(16 << 20));
        for i in 0..60 {
            let id = format!("run{i:03}");
            Runner::new(&*source).run(&id, &wf).await?;
            if i % 3 != 0 {
                approve(
                    &*source,
                    &id,
                    "review",
                    Some(json!({"i": i})),
                    "ada",
                    &SystemClock,
                )
                .await?;
                Runner::new(&*source).run(&id, &wf).await?;
            }
            if i % 3 != 0 && i % 5 == 1 {
                ops::rewind(&*source, &id, "review", "ada", &SystemClock).await?;
            }
        }
        let cosmos: Arc<dyn Store> = Arc::new(db.store(CosmosOptions::default()).await);
        let there = copy(&*source, &*cosmos, |_| {}).await?;
        assert_eq!(there.written, 60, "{there:?}");
        let again = copy(&*source, &*cosmos, |_| {}).await?;
        assert_eq!(again.kept, 60, "{again:?}");
        let back: Arc<dyn Store> = Arc::new(MemoryStore::with_state_limit(16 << 20));
        copy(&*cosmos, &*back, |_| {}).await?;
        let all = ids(&*source).await;
        assert_eq!(all, ids(&*cosmos).await);
        assert_eq!(all, ids(&*back).await);
        for id in &all {
            let want = source.load(id).await?;
            assert_eq!(want, cosmos.load(id).await?, "run {id} in Cosmos");
            assert_eq!(want, back.load(id).await?, "run {id} back");
            let h = source.history(id).await?;
            assert_eq!(h, cosmos.history(id).await?, "history of {id} in Cosmos");
            assert_eq!(h, back.history(id).await?, "history of {id} back");
        }
        // A rewound copy resumes in Cosmos and waits at its gate again.
        let out = Runner::new(&*cosmos).run("run001", &wf).await?;
        assert_eq!(
            out,
            Outcome::Waiting {
                gate: "review".into()
            }
        );
        Ok(())
    })
}

#[test]
fn a_long_history_is_pruned_across_several_batches() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    rt().block_on(async {
        let mut b = Workflow::builder("long");
        for i in 0..250usize {
            b = b.step(format!("s{i:03}"), move |_, _| async move {
                update(json!({"last": i, format!("k{}", i % 7): i}))
            });
        }
        let wf = b.build()?;
        let store: Arc<dyn Store> = Arc::new(db.store(CosmosOptions::default()).await);
        Runner::new(&*store).run("long", &wf).await?;
        let before = store.load("long").await?.ok_or("the run vanished")?;
        let pruned = ops::prune(&*store, "long", 5, "ada", &SystemClock)
            .await?
            .ok_or("nothing pruned")?;
        assert_eq!((pruned.folded_into, pruned.rows_deleted), (244, 244));
        let rows = store.history("long").await?.ok_or("no history")?;
        let idx: Vec<usize> = rows.iter().map(|r| r.index).collect();
        assert_eq!(idx, (244..250).collect::<Vec<_>>());
        let after = store.load("long").await?.ok_or("the run vanished")?;
        assert_eq!(after.state, before.state);
        // The fold row holds the last value of every key up to step 244.
        let fold = &rows[0].update;
        assert_eq!(fold.get("last"), Some(&json!(244)));
        for k in 0..7 {
            let want = (0..=244).rev().find(|i| i % 7 == k).unwrap_or(0);
            assert_eq!(fold.get(&format!("k{k}")), Some(&json!(want)), "k{k}");
        }
        let cp = ops::rewind(&*store, "long", "s246", "ada", &SystemClock).await?;
        assert_eq!(cp.state.get("last"), Some(&json!(245)));
        Ok(())
    })
}

#[test]
fn rekey_rewrites_a_long_history_in_several_batches() -> TestResult {
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    rt().block_on(async {
        let k1 = "k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
        let k2 = "k2:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let raw: Arc<dyn Store> = Arc::new(db.store(CosmosOptions::default()).await);
        let old =
            steadfast_seal::SealedStore::new(Arc::clone(&raw), steadfast_seal::Keyring::parse(k1)?);
        let mut b = Workflow::builder("long");
        for i in 0..150usize {
            b = b.step(format!("s{i:03}"), move |_, _| async move {
                // Some updates over one item: chunks, replaced by the rekey.
                let size = if i % 50 == 0 { 300_000 } else { 8 };
                update(json!({ format!("k{i}"): format!("secret {i} {}", "z".repeat(size)) }))
            });
        }
        let wf = b.build()?;
        Runner::new(&old).run("long", &wf).await?;
        let both = steadfast_seal::SealedStore::new(
            Arc::clone(&raw),
            steadfast_seal::Keyring::parse(&format!("{k2}\n{k1}"))?,
        );
        let done = both.rekey("long").await?;
        assert!(
            matches!(done, steadfast_seal::Rekeyed::Rewritten),
            "{done:?}"
        );
        let new_only =
            steadfast_seal::SealedStore::new(Arc::clone(&raw), steadfast_seal::Keyring::parse(k2)?);
        let rows = new_only.history("long").await?.ok_or("no history")?;
        assert_eq!(rows.len(), 150);
        assert_eq!(
            rows[149].update.get("k149"),
            Some(&json!(format!("secret 149 {}", "z".repeat(8))))
        );
        assert_eq!(
            rows[100].update.get("k100"),
            Some(&json!(format!("secret 100 {}", "z".repeat(300_000))))
        );
        assert!(new_only.load("long").await?.is_some());
        Ok(())
    })
}

/// Runs whose steps return large values (each a blob over the threshold),
/// copied into Cosmos DB, again, and back: every run and history arrives
/// equal; in Cosmos DB each run holds each of its contents once (the two
/// shared documents, which every step rereads, once per run, as blobs live
/// in their run's partition), and a second copy writes nothing. With the
/// blobs gone behind the store's back, a copy out of it fails as `Corrupt`
/// naming a run and writes nothing of that run into the target.
#[test]
fn large_values_copy_into_cosmos_once_each_and_a_missing_blob_is_refused() -> TestResult {
    use steadfast_conformance::fixtures::{doc, rereading_agent};
    let Some(server) = support::server() else {
        return Ok(());
    };
    let db = support::TestDb::new(&server);
    rt().block_on(async {
        const STEPS: usize = 4;
        let source: Arc<dyn Store> = Arc::new(MemoryStore::with_state_limit(16 << 20));
        for r in 0..3 {
            Runner::new(&*source)
                .run(&format!("r{r}"), &rereading_agent(STEPS, r))
                .await?;
        }
        let opts = CosmosOptions::default().blob_threshold(16 << 10);
        let cosmos: Arc<dyn Store> = Arc::new(db.store(opts).await);
        let there = copy(&*source, &*cosmos, |_| {}).await?;
        assert_eq!(there.written, 3, "{there:?}");
        let again = copy(&*source, &*cosmos, |_| {}).await?;
        assert_eq!(again.kept, 3, "{again:?}");
        let back: Arc<dyn Store> = Arc::new(MemoryStore::with_state_limit(16 << 20));
        copy(&*cosmos, &*back, |_| {}).await?;
        let text = |s: String| (s.len() + 2) as u64;
        let blobs = cosmos.capabilities().blobs.ok_or("no blobs on Cosmos DB")?;
        for r in 0..3 {
            let id = format!("r{r}");
            let want = source.load(&id).await?;
            assert_eq!(want, cosmos.load(&id).await?, "run {id} in Cosmos DB");
            assert_eq!(want, back.load(&id).await?, "run {id} back");
            let h = source.history(&id).await?;
            assert_eq!(
                h,
                cosmos.history(&id).await?,
                "history of {id} in Cosmos DB"
            );
            assert_eq!(h, back.history(&id).await?, "history of {id} back");
            let usage = blobs.usage(&id).await?.ok_or("no usage")?;
            let own: u64 = (0..STEPS).map(|i| text(doc(1000 + r * 100 + i, 20))).sum();
            let shared = text(doc(0, 100)) + text(doc(1, 100));
            assert_eq!(
                (usage.blobs, usage.blob_bytes),
                (2 + STEPS as u64, shared + own),
                "run {id}: each content once"
            );
        }

        let lost = support::lose_blobs(server.clone(), db.name().to_string()).await?;
        assert_eq!(lost, 3 * (2 + STEPS as u64), "blobs on the server");
        let target: Arc<dyn Store> = Arc::new(MemoryStore::with_state_limit(16 << 20));
        let err = copy(&*cosmos, &*target, |_| {})
            .await
            .expect_err("a dangling reference");
        assert!(
            matches!(
                err.store_error(),
                Some(steadfast_core::StoreError::Corrupt { .. })
            ),
            "{err:?}"
        );
        let named = (0..3)
            .map(|r| format!("r{r}"))
            .find(|id| err.to_string().contains(id.as_str()))
            .ok_or_else(|| format!("the error names no run: {err}"))?;
        assert_eq!(target.load(&named).await?, None, "{named} was written");
        // Every run lost its blobs: none of them may have arrived.
        assert_eq!(
            ids(&*target).await,
            Vec::<String>::new(),
            "runs were written"
        );
        Ok(())
    })
}
