//! `transfer::copy` between stores: a store of 10,000 runs of every kind
//! (completed, waiting at a gate, failed, rewound, cancelled, pending with
//! an input, forked) copied SQLite → PostgreSQL → SQLite, every record and
//! history compared; copying again keeps everything; a copy cut short is
//! resumed; the file store keeps every record and history row too.

mod support;

use std::sync::Arc;

use serde_json::json;
use steadfast::transfer::{copy, export_run, put_run};
use steadfast::StoreExt as _;
use steadfast::{
    approve, ops, start, update, ListFilter, Runner, Step, StepError, Store, SystemClock, Workflow,
};

fn workflow() -> Workflow {
    Workflow::builder("w")
        .step("s0", |ctx, _| async move {
            update(json!({"s0": ctx.run_id(), "x": 1.5}))
        })
        .step("s1", |ctx, s| async move {
            if ctx.run_id().ends_with("-fail") {
                return Err(StepError::terminal("no"));
            }
            update(json!({"s1": [s["s0"].clone(), "two"]}))
        })
        .push(Step::gate("review"))
        .step("s2", |_, s| async move {
            update(json!({"s2": {"seen": s["review"].clone()}}))
        })
        .build()
        .expect("a valid workflow")
}

/// Makes run `i` of the mix on `store`; returns its id.
async fn make(store: &Arc<dyn Store>, wf: &Workflow, i: usize) -> Result<String, steadfast::Error> {
    let kind = i % 10;
    let id = match kind {
        1 => format!("run{i:05}-fail"),
        _ => format!("run{i:05}"),
    };
    let r = Runner::new(&**store);
    match kind {
        4 => {
            start(&**store, "w", &id, json!({"input": i, "x": "given"}), false).await?;
            return Ok(id);
        }
        1 => {
            let _ = r.run(&id, wf).await;
            return Ok(id);
        }
        _ => {}
    }
    r.run(&id, wf).await?;
    if kind == 0 {
        return Ok(id); // waiting at the gate
    }
    approve(
        &**store,
        &id,
        "review",
        Some(json!({"n": i})),
        "ada",
        &SystemClock,
    )
    .await?;
    if kind == 3 {
        ops::cancel(&**store, &id, Some(format!("run {i}")), "bob", &SystemClock).await?;
        return Ok(id);
    }
    r.run(&id, wf).await?;
    if kind == 2 {
        ops::rewind(&**store, &id, "s1", "ada", &SystemClock).await?;
    }
    if kind == 5 {
        ops::fork(
            &**store,
            &id,
            "s2",
            &format!("{id}-fork"),
            "ada",
            &SystemClock,
        )
        .await?;
    }
    Ok(id)
}

async fn populate(store: &Arc<dyn Store>, n: usize) -> Result<(), steadfast::Error> {
    let wf = Arc::new(workflow());
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut tasks = tokio::task::JoinSet::new();
        for &i in chunk {
            let (s, w) = (Arc::clone(store), Arc::clone(&wf));
            tasks.spawn(async move { make(&s, &w, i).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a task")?;
        }
    }
    Ok(())
}

async fn ids(store: &Arc<dyn Store>) -> Vec<String> {
    let mut out = Vec::new();
    let mut filter = ListFilter::new().limit(1000);
    loop {
        let page = store.list(&filter).await.expect("list");
        let Some(last) = page.last() else { break };
        filter.after = Some(last.run_id.clone());
        out.extend(page.into_iter().map(|r| r.run_id));
    }
    out
}

/// Every run of `a` is in `b`, equal record and (if `history`) history,
/// and `b` has no other.
async fn same(a: &Arc<dyn Store>, b: &Arc<dyn Store>, history: bool) {
    let (ia, ib) = (ids(a).await, ids(b).await);
    assert_eq!(ia.len(), ib.len(), "run counts differ");
    assert_eq!(ia, ib, "run ids differ");
    for id in &ia {
        let (ra, rb) = (
            a.load(id).await.expect("load"),
            b.load(id).await.expect("load"),
        );
        assert_eq!(ra, rb, "run {id} differs");
        if history {
            let (ha, hb) = (
                a.history(id).await.expect("history"),
                b.history(id).await.expect("history"),
            );
            assert_eq!(ha, hb, "history of run {id} differs");
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn sqlite(dir: &tempfile::TempDir, name: &str) -> Arc<dyn Store> {
    Arc::new(steadfast::sqlite::SqliteStore::open(dir.path().join(name)).expect("open SQLite"))
}

#[test]
fn ten_thousand_runs_copy_both_ways_and_compare_equal() {
    let schema = support::PgSchema::new();
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("a temp dir");
        let a = sqlite(&dir, "a.db");
        populate(&a, 10_000).await.expect("populate");
        let n = ids(&a).await.len();
        assert_eq!(n, 11_000, "10,000 runs and 1,000 forks");
        let pg: Arc<dyn Store> = steadfast::open_store(&schema.url)
            .await
            .expect("connect to PostgreSQL");

        let there = copy(&*a, &*pg, |_| {}).await.expect("copy to PostgreSQL");
        assert_eq!(there.written as usize, n, "{there:?}");
        let again = copy(&*a, &*pg, |_| {}).await.expect("copy again");
        assert_eq!(
            again.kept as usize, n,
            "a second copy wrote something: {again:?}"
        );

        // Back, into a store that already has a quarter (a copy cut short).
        let b = sqlite(&dir, "b.db");
        for id in ids(&a).await.iter().step_by(4) {
            let rec = export_run(&*pg, id)
                .await
                .expect("export")
                .expect("present");
            put_run(&*b, &rec).await.expect("put");
        }
        let back = copy(&*pg, &*b, |_| {}).await.expect("copy back");
        assert_eq!(back.kept as usize, n.div_ceil(4), "{back:?}");
        assert_eq!(back.written as usize, n - n.div_ceil(4), "{back:?}");
        same(&a, &pg, true).await;
        same(&a, &b, true).await;

        // The copies work on: a run rewound to s1 resumes on the copy, and
        // stops at its gate again.
        let wf = workflow();
        let out = Runner::new(&*b).run("run00002", &wf).await.expect("resume");
        assert_eq!(
            out,
            steadfast::Outcome::Waiting {
                gate: "review".into()
            }
        );
    });
}

#[test]
fn the_file_store_keeps_every_record_and_row_of_a_copy() {
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("a temp dir");
        let a = sqlite(&dir, "a.db");
        populate(&a, 200).await.expect("populate");
        let file: Arc<dyn Store> =
            Arc::new(steadfast::file::FileStore::open(dir.path().join("runs.json")).expect("open"));
        let there = copy(&*a, &*file, |_| {})
            .await
            .expect("copy to the file store");
        assert_eq!(there.written, 220);
        same(&a, &file, true).await;
        let c = sqlite(&dir, "c.db");
        copy(&*file, &*c, |_| {}).await.expect("copy back");
        same(&a, &c, true).await;
    });
}

#[test]
fn two_copies_of_one_store_at_the_same_moment_both_end_well() {
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("a temp dir");
        let a = sqlite(&dir, "a.db");
        populate(&a, 300).await.expect("populate");
        for into in [
            sqlite(&dir, "b.db"),
            Arc::new(steadfast::MemoryStore::new()) as Arc<dyn Store>,
        ] {
            let (x, y) = tokio::join!(copy(&*a, &*into, |_| {}), copy(&*a, &*into, |_| {}));
            let (x, y) = (x.expect("the first copy"), y.expect("the second copy"));
            assert_eq!(
                x.written + x.replaced + x.kept + y.written + y.replaced + y.kept,
                2 * 330,
                "{x:?} {y:?}"
            );
            same(&a, &into, true).await;
        }
        // The same run put by two tasks at once, a hundred times over.
        let into: Arc<dyn Store> = sqlite(&dir, "c.db");
        let ids = ids(&a).await;
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids.iter().take(100) {
            let rec = Arc::new(export_run(&*a, id).await.expect("export").expect("present"));
            for _ in 0..2 {
                let (into, rec) = (Arc::clone(&into), Arc::clone(&rec));
                tasks.spawn(async move { put_run(&*into, &rec).await });
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a task")
                .expect("a put at the same moment as another");
        }
        for id in ids.iter().take(100) {
            assert_eq!(
                a.load(id).await.unwrap(),
                into.load(id).await.unwrap(),
                "run {id}"
            );
            assert_eq!(
                a.history(id).await.unwrap(),
                into.history(id).await.unwrap(),
                "run {id}"
            );
        }
    });
}

/// Large values cross stores once each: runs of an agent that rereads
/// documents, copied SQLite → PostgreSQL → file → SQLite, read back equal
/// (records and history rows) with as many blobs and bytes in each store
/// as in the first; a blob missing from the source fails the copy of the
/// run that refers to it as `Corrupt`, and the target holds none of it.
#[test]
fn large_values_copy_once_each_and_a_missing_blob_is_refused() {
    use steadfast_conformance::fixtures::{doc, rereading_agent};
    let schema = support::PgSchema::new();
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("a temp dir");
        let at = |name: &str| format!("{}?blob_threshold=16KiB", dir.path().join(name).display());
        let open = |url: String| async move { steadfast::open_store(&url).await.expect("open") };
        let a = open(format!("sqlite:{}", at("a.db"))).await;
        for r in 0..3 {
            steadfast::run(&format!("r{r}"), &rereading_agent(4, r), &*a)
                .await
                .expect("a run");
        }
        let totals = a.blob_totals().await.expect("totals").expect("blobs");
        // Two shared documents and one of its own for each step of each run.
        assert_eq!(totals.blobs, 2 + 3 * 4);
        let pg = open(format!("{}&blob_threshold=16KiB", schema.url)).await;
        let file = open(format!("file:{}", at("runs.json"))).await;
        let b = open(format!("sqlite:{}", at("b.db"))).await;
        for (from, to) in [(&a, &pg), (&pg, &file), (&file, &b)] {
            let report = copy(&**from, &**to, |_| {}).await.expect("copy");
            assert_eq!(report.written, 3, "{report:?}");
            same(&a, to, true).await;
            let there = to.blob_totals().await.expect("totals").expect("blobs");
            assert_eq!(there, totals, "each content once");
        }

        // Run r1's own document of step 2 goes missing from the file store.
        let text = format!("\"{}\"", doc(1000 + 100 + 2, 20));
        let hash = steadfast::store::blob::BlobHash::of(text.as_bytes()).hex();
        let blob = dir.path().join("runs.json.blobs").join(hash);
        std::fs::remove_file(&blob).expect("the blob is a file of its own");
        let c = open(format!("sqlite:{}", at("c.db"))).await;
        let err = copy(&*file, &*c, |_| {})
            .await
            .expect_err("a dangling reference");
        assert!(
            matches!(
                err.store_error(),
                Some(steadfast::StoreError::Corrupt { .. })
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("r1"), "{err}");
        assert_eq!(c.load("r1").await.expect("load"), None, "r1 was written");
    });
}
