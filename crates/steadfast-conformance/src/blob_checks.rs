//! Large values in trouble: a save cut off part way (a caller that dies or
//! gives up at any point where a save waits) must leave the run as it was or
//! as the save made it, never a record that refers to a blob that is not
//! there; and a blob lost behind the store's back is damage, reported as
//! such, never read as some other value.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_core::store::SaveRequest;
use steadfast_core::StoreExt as _;
use steadfast_core::{Checkpoint, ListFilter, StepRecord, StoreErrorKind, Timestamp};

use crate::{CheckResult, TestStore};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

/// Polls a future at most `polls` times, then drops it: `None` when it had
/// not finished by then. A save dropped after its `k`th poll stops at the
/// `k`th point where it waited (for a server's answer, a thread, a lock),
/// as a process that dies there does; whatever it had handed on (a request
/// already sent, a job on a writer thread) may still land.
struct Cut<F: Future> {
    fut: Pin<Box<F>>,
    polls: usize,
}

impl<F: Future> Future for Cut<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls == 0 {
            return Poll::Ready(None);
        }
        self.polls -= 1;
        match self.fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if self.polls == 0 => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The most points at which one save is cut before the check gives up on it
/// finishing.
const MOST_CUTS: usize = 400;

/// What a run holds after `steps` steps of the check's flow: each step
/// brings a large value of its own and keeps the one the first step brought
/// (a document read again).
fn after(run_id: &str, steps: usize) -> (Checkpoint, Vec<StepRecord>) {
    let t = |ms: u64| Timestamp::from_unix_millis(1_700_000_000_000 + ms);
    let mut cp = Checkpoint::new(run_id, "cut", t(0));
    let mut rows = Vec::new();
    for i in 0..steps {
        let name = format!("s{i}");
        let update = json!({
            format!("doc{i}"): doc(i),
            "first": doc(0),
            "n": i,
        });
        let Value::Object(update) = update else {
            unreachable!("an object")
        };
        cp.state.extend(update.clone());
        cp.completed.push(name.clone());
        rows.push(StepRecord::new(
            i,
            &name,
            update,
            1,
            t(i as u64 * 10),
            t(i as u64 * 10 + 5),
        ));
    }
    cp.next = steps;
    (cp, rows)
}

/// Step `i`'s large value: 8 KiB of text of its own.
fn doc(i: usize) -> String {
    format!("{i:>4}").repeat(2 * 1024)
}

/// Whether `loaded` is the record of `expected` (all but its version).
fn same_record(loaded: &Checkpoint, expected: &Checkpoint) -> bool {
    loaded.state == expected.state
        && loaded.completed == expected.completed
        && loaded.next == expected.next
}

/// Each save of a run whose steps bring large values (stored as blobs where
/// the store has them) is cut off at its first point of waiting, then its
/// second, and so on until one finishes. After every cut the run loads
/// whole: as it was before the save or as the save made it, every large
/// value equal, never an error. A cut save that lands later is seen as the
/// conflict it causes, never as a lost or doubled step. The history ends as
/// the steps were saved, and once the run is deleted no blob is left (a
/// store that sweeps may need a few more writes to find a blob a cut save
/// left behind; the check makes them).
pub async fn saves_cut_off_anywhere_leave_whole_runs(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let run_id = "cut-1";
    let (first, rows) = after(run_id, 1);
    let mut version = store
        .save(SaveRequest::new(&first, None).with_step(&rows[0]))
        .await?;
    let mut before = first;
    let mut cuts = 0usize;
    for step in 1..4 {
        let (next, rows) = after(run_id, step + 1);
        let row = &rows[step];
        let mut polls = 1;
        loop {
            ensure!(
                polls <= MOST_CUTS,
                "step {step}'s save did not finish within {MOST_CUTS} polls"
            );
            let save = store.save(SaveRequest::new(&next, Some(version)).with_step(row));
            let out = Cut {
                fut: Box::pin(save),
                polls,
            }
            .await;
            polls += 1;
            match out {
                Some(Ok(v)) => {
                    version = v;
                    break;
                }
                Some(Err(e)) if e.kind() == StoreErrorKind::Conflict => {
                    // A save cut off before this one landed after all.
                    let loaded = store
                        .load(run_id)
                        .await?
                        .ok_or("the run vanished after a conflict")?;
                    ensure!(
                        same_record(&loaded, &next) && loaded.version > version,
                        "step {step}: a save conflicted, but the run holds neither this step's \
                         record nor a newer version (version {} after {version}, next {})",
                        loaded.version,
                        loaded.next
                    );
                    version = loaded.version;
                    break;
                }
                Some(Err(e)) => {
                    return Err(format!("step {step}: a save after {cuts} cuts failed: {e}").into())
                }
                None => {
                    cuts += 1;
                    let loaded = match store.load(run_id).await {
                        Ok(Some(cp)) => cp,
                        Ok(None) => {
                            return Err(format!("step {step}: a cut save lost the run").into())
                        }
                        Err(e) => return Err(format!(
                            "step {step}: the run does not load after a save cut at poll {}: {e}",
                            polls - 1
                        )
                        .into()),
                    };
                    if same_record(&loaded, &next) {
                        // It had landed before the cut came.
                        version = loaded.version;
                        break;
                    }
                    ensure!(
                        same_record(&loaded, &before) && loaded.version == version,
                        "step {step}: after a save cut at poll {}, the run is neither as it was \
                         nor as the save made it (version {}, next {})",
                        polls - 1,
                        loaded.version,
                        loaded.next
                    );
                }
            }
        }
        before = next;
    }
    let loaded = store.load(run_id).await?.ok_or("the run vanished")?;
    ensure!(
        same_record(&loaded, &before),
        "the run does not hold its four steps after {cuts} cut saves"
    );
    if store.capabilities().history.is_some() {
        let (_, rows) = after(run_id, 4);
        let h = store.history(run_id).await?.ok_or("no history")?;
        ensure!(
            h == rows,
            "the history after {cuts} cut saves differs: {} rows",
            h.len()
        );
    }
    ensure!(
        store.delete(run_id).await?,
        "the run was not there to delete"
    );
    if let Some(blobs) = store.capabilities().blobs {
        let mut left = blobs.blob_totals().await?;
        for round in 0..60 {
            if left.blobs == 0 {
                break;
            }
            // A write that refers to a large value and one that drops it:
            // a store that sweeps unreferenced blobs gets its chance.
            let id = format!("cut-sweep-{round}");
            let (cp, rows) = after(&id, 1);
            let v = store
                .save(SaveRequest::new(&cp, None).with_step(&rows[0]))
                .await?;
            ensure!(store.delete_if(&id, v).await?, "{id} was not there");
            tokio::time::sleep(Duration::from_millis(50)).await;
            left = blobs.blob_totals().await?;
        }
        ensure!(
            left.blobs == 0 && left.bytes == 0,
            "blobs left after {cuts} cut saves and the run's delete: {left:?}"
        );
    }
    Ok(())
}

/// Every blob of a store is lost behind its back (its `lose_blobs` hook: rows
/// deleted, files removed, items deleted). A run that refers to one then
/// fails to load, and its history to read, as [`Corrupt`](StoreErrorKind::Corrupt)
/// naming the run: never `None`, never a value in its place. A run with no
/// large value still loads, the list still shows both, and the damaged run
/// can be deleted.
pub async fn a_missing_blob_is_damage_and_never_a_value(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let Some(blobs) = store.capabilities().blobs else {
        return Ok(());
    };
    let lose = ts.lose_blobs.clone().ok_or(
        "the store keeps blobs, but its TestStore gives no way to lose them (TestStore::with_blob_loss)",
    )?;
    // Over the threshold; a store that seals values first counts them in
    // full (no threshold of its own), and its store underneath takes them
    // as blobs at its threshold, set low in the suite.
    let size = usize::try_from(blobs.threshold().min(32 << 10)).unwrap_or(32 << 10) + 4096;
    let big = "b".repeat(size);
    let t = Timestamp::from_unix_millis(1_700_000_000_000);
    let mut lost = Checkpoint::new("lost-1", "flow", t);
    let Value::Object(update) = json!({"doc": big, "n": 1}) else {
        unreachable!("an object")
    };
    lost.state = update.clone();
    lost.completed = vec!["read".into()];
    lost.next = 1;
    let row = StepRecord::new(0, "read", update, 1, t, t);
    let v = store
        .save(SaveRequest::new(&lost, None).with_step(&row))
        .await?;
    let mut kept = Checkpoint::new("kept-1", "flow", t);
    kept.state.insert("n".into(), json!(2));
    kept.version = store.save(SaveRequest::new(&kept, None)).await?;
    let held = blobs.blob_totals().await?;
    ensure!(
        held.blobs >= 1,
        "a value of {size} bytes made no blob: {held:?}"
    );
    let removed = lose().await?;
    ensure!(removed >= 1, "the hook lost no blob of {}", held.blobs);
    match store.load("lost-1").await {
        Err(e) if e.kind() == StoreErrorKind::Corrupt && e.to_string().contains("lost-1") => {}
        Err(e) => {
            return Err(format!("a run whose blob is gone failed as {:?}: {e}", e.kind()).into())
        }
        Ok(cp) => {
            return Err(format!(
                "a run whose blob is gone loaded as {}",
                match cp {
                    None => "absent".to_string(),
                    Some(cp) => format!("a record with `doc` = {:.40}", cp.state["doc"]),
                }
            )
            .into())
        }
    }
    if store.capabilities().history.is_some() {
        match store.history("lost-1").await {
            Err(e) if e.kind() == StoreErrorKind::Corrupt && e.to_string().contains("lost-1") => {}
            Err(e) => {
                return Err(format!(
                    "the history of a run whose blob is gone failed as {:?}: {e}",
                    e.kind()
                )
                .into())
            }
            Ok(h) => {
                return Err(format!(
                    "the history of a run whose blob is gone read as {:?} rows",
                    h.map(|h| h.len())
                )
                .into())
            }
        }
    }
    ensure!(
        store.load("kept-1").await?.as_ref() == Some(&kept),
        "a run with no large value did not load back after another's blob was lost"
    );
    let listed: Vec<String> = store
        .list(&ListFilter::default())
        .await?
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    ensure!(
        listed.iter().any(|r| r == "lost-1") && listed.iter().any(|r| r == "kept-1"),
        "the list after a blob was lost: {listed:?}"
    );
    ensure!(
        store.delete_if("lost-1", v).await?,
        "the damaged run could not be deleted"
    );
    ensure!(
        store.load("lost-1").await?.is_none(),
        "the damaged run is still there after its delete"
    );
    Ok(())
}
