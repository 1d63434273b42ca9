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
use steadfast_core::{
    Checkpoint, ListFilter, StepRecord, Store, StoreError, StoreErrorKind, Timestamp,
};

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
/// as a caller that gives up there does (a timeout, an aborted task);
/// whatever it had handed on (a request already sent, a job on a writer
/// thread) may still land.
///
/// ```
/// # steadfast_conformance::runtime().block_on(async {
/// use steadfast_conformance::Cut;
///
/// assert_eq!(Cut::new(async { 7 }, 1).await, Some(7));
/// assert_eq!(Cut::new(tokio::task::yield_now(), 1).await, None);
/// # });
/// ```
pub struct Cut<F: Future> {
    fut: Pin<Box<F>>,
    polls: usize,
}

impl<F: Future> Cut<F> {
    /// `fut`, polled at most `polls` times.
    pub fn new(fut: F, polls: usize) -> Self {
        Cut {
            fut: Box::pin(fut),
            polls,
        }
    }
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

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_700_000_000_000 + ms)
}

/// The size of the check's large values for a store whose threshold is
/// `threshold`: just over it, so that they are blobs (8 KiB under a
/// sealing store, which counts values in full and leaves the threshold to
/// the store underneath). `None` for a threshold over 1 MiB, too large for
/// the checks to fill.
fn large_size(threshold: u64) -> Option<usize> {
    match threshold {
        u64::MAX => Some(8 << 10),
        t if t <= 1 << 20 => Some(t as usize + 1024),
        _ => None,
    }
}

/// The run after `before` and one more step, `step`, brought by attempt
/// `attempt` (from 1) of its save. The step's large value is new at every
/// odd attempt, so that it writes a blob anew and a cut can land anywhere
/// in the save; an even attempt saves its predecessor's value again, as a
/// step run again after a crash may, over whatever that one's cut left
/// half-written. The first step's value is kept (a document read again).
fn with_step(
    before: &Checkpoint,
    step: usize,
    attempt: usize,
    size: usize,
) -> (Checkpoint, StepRecord) {
    let name = format!("s{step}");
    let Value::Object(update) = json!({
        format!("doc{step}"): doc(step, attempt.div_ceil(2), size),
        "first": doc(0, 0, size),
        "n": step,
    }) else {
        unreachable!("an object")
    };
    let mut cp = before.clone();
    cp.state.extend(update.clone());
    cp.completed.push(name.clone());
    cp.next = step + 1;
    let row = StepRecord::new(
        step,
        &name,
        update,
        1,
        t(step as u64 * 10),
        t(step as u64 * 10 + 5),
    );
    (cp, row)
}

/// A large value of `size` bytes, its own for each step and attempt.
fn doc(step: usize, attempt: usize, size: usize) -> String {
    let mut out = format!("step {step} attempt {attempt} ");
    let fill = size.saturating_sub(out.len());
    out.extend(std::iter::repeat_n('x', fill));
    out
}

/// Whether `loaded` is the record of `expected` (all but its version).
fn same_record(loaded: &Checkpoint, expected: &Checkpoint) -> bool {
    loaded.state == expected.state
        && loaded.completed == expected.completed
        && loaded.next == expected.next
}

/// The run and its history as of one version: read again while a save
/// cut before lands between the two reads. `None` for an absent run.
async fn observe(
    store: &dyn Store,
    run_id: &str,
    history: bool,
) -> Result<Option<(Checkpoint, Option<Vec<StepRecord>>)>, StoreError> {
    loop {
        let Some(first) = store.load(run_id).await? else {
            return Ok(None);
        };
        if !history {
            return Ok(Some((first, None)));
        }
        let h = store.history(run_id).await?;
        let again = store.load(run_id).await?;
        if again.as_ref().map(|c| c.version) == Some(first.version) {
            // No history for a run that loads compares as none at all.
            return Ok(Some((first, Some(h.unwrap_or_default()))));
        }
    }
}

/// Each save of a run whose steps bring large values (blobs, where the
/// store keeps them) is cut off where its future first returned `Pending`
/// (waiting for a server, a thread, a lock), then where it did so a second
/// time, and so on until one finishes; every other attempt carries a large
/// value of its own (so that cuts reach every point of a save that writes a
/// blob), the others the value of the attempt before (a save again of what
/// a cut save may have left half-written). After every cut the run loads as it was before the save or as
/// one of the cut attempts made it (one that had landed), at the version
/// after, never an error; its history is the rows of the one it loads as.
/// A cut save that lands later shows as the conflict it causes, never as a
/// lost or doubled step. Once the run is deleted the store counts no blob
/// (a store that sweeps may need a few more writes to find a blob a cut
/// save left behind; the check makes them, with no large value of their
/// own). A store whose save finishes in its first poll (SQLite's lone
/// commit on a multi-threaded runtime) is never cut: the check then only
/// saves and deletes (the SQLite store's tests run it again on a
/// current-thread runtime, where its saves go to a blocking thread and are
/// cut).
pub async fn saves_cut_off_anywhere_leave_whole_runs(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let run_id = "cut-1";
    let history = store.capabilities().history.is_some();
    let size = match store.capabilities().blobs {
        Some(b) => large_size(b.threshold()).ok_or(
            "the store's blob threshold is over 1 MiB: give the suite's store a lower one",
        )?,
        None => 8 << 10,
    };
    let (mut before, row) = with_step(&Checkpoint::new(run_id, "cut", t(0)), 0, 0, size);
    let mut version = store
        .save(SaveRequest::new(&before, None).with_step(&row))
        .await?;
    let mut rows = vec![row];
    let mut cuts = 0usize;
    for step in 1..4 {
        // Every attempt so far of this step's save, any of which may land.
        let mut tried: Vec<(Checkpoint, StepRecord)> = Vec::new();
        let landed = loop {
            let polls = tried.len() + 1;
            ensure!(
                polls <= MOST_CUTS,
                "step {step}'s save did not finish within {MOST_CUTS} polls"
            );
            let (next, row) = with_step(&before, step, polls, size);
            let save = store.save(SaveRequest::new(&next, Some(version)).with_step(&row));
            let out = Cut::new(save, polls).await;
            tried.push((next, row));
            match out {
                Some(Ok(v)) => {
                    ensure!(
                        v == version + 1,
                        "step {step}: a save expecting version {version} wrote {v}"
                    );
                    break tried.len() - 1;
                }
                Some(Err(e)) if e.kind() != StoreErrorKind::Conflict => {
                    return Err(format!("step {step}: a save after {cuts} cuts failed: {e}").into())
                }
                // A conflict: an attempt cut before this one landed after all.
                // A cut: this one may have landed, or not yet.
                conflict_or_cut => {
                    if conflict_or_cut.is_none() {
                        cuts += 1;
                    }
                    let (loaded, h) = match observe(store, run_id, history).await {
                        Ok(Some(seen)) => seen,
                        Ok(None) => {
                            return Err(format!("step {step}: a cut save lost the run").into())
                        }
                        Err(e) => {
                            return Err(format!(
                                "step {step}: the run does not read after a save cut at poll \
                                 {polls}: {e}"
                            )
                            .into())
                        }
                    };
                    let which = tried.iter().position(|(cp, _)| same_record(&loaded, cp));
                    let now_rows: Vec<StepRecord> = match which {
                        Some(i) => {
                            ensure!(
                                loaded.version == version + 1,
                                "step {step}: a landed attempt wrote version {} after {version}",
                                loaded.version
                            );
                            rows.iter().cloned().chain([tried[i].1.clone()]).collect()
                        }
                        None => {
                            ensure!(
                                conflict_or_cut.is_none(),
                                "step {step}: a save conflicted, but the run holds none of the \
                                 step's attempts (version {} after {version}, next {})",
                                loaded.version,
                                loaded.next
                            );
                            ensure!(
                                same_record(&loaded, &before) && loaded.version == version,
                                "step {step}: after a save cut at poll {polls}, the run is \
                                 neither as it was nor as an attempt made it (version {}, \
                                 next {})",
                                loaded.version,
                                loaded.next
                            );
                            rows.clone()
                        }
                    };
                    if let Some(h) = h {
                        ensure!(
                            h == now_rows,
                            "step {step}: after a save cut at poll {polls}, the history has \
                             {} rows where the run loads with {}",
                            h.len(),
                            now_rows.len()
                        );
                    }
                    if let Some(i) = which {
                        break i;
                    }
                }
            }
        };
        let (next, row) = tried.swap_remove(landed);
        before = next;
        rows.push(row);
        version += 1;
    }
    let loaded = store.load(run_id).await?.ok_or("the run vanished")?;
    ensure!(
        same_record(&loaded, &before) && loaded.version == version,
        "the run does not hold its four steps after {cuts} cut saves"
    );
    if history {
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
    if store.capabilities().blobs.is_some() {
        let left = blobs_left_after_sweeps(store, "cut").await?;
        ensure!(
            left.blobs == 0 && left.bytes == 0,
            "blobs left after {cuts} cut saves and the run's delete: {left:?}"
        );
    }
    Ok(())
}

/// The store's blob totals once it counts none, or after 60 writes that
/// leave no blob of their own (runs named `{prefix}-sweep-N`, saved and
/// deleted): a store that sweeps unreferenced blobs gets its chances.
async fn blobs_left_after_sweeps(
    store: &dyn Store,
    prefix: &str,
) -> Result<steadfast_core::BlobTotals, Box<dyn std::error::Error + Send + Sync>> {
    let blobs = store
        .capabilities()
        .blobs
        .ok_or("the store keeps no blobs")?;
    let mut left = blobs.blob_totals().await?;
    for round in 0..60 {
        if left.blobs == 0 {
            break;
        }
        let id = format!("{prefix}-sweep-{round}");
        let cp = Checkpoint::new(&id, prefix, t(0));
        let v = store.save(SaveRequest::new(&cp, None)).await?;
        ensure!(store.delete_if(&id, v).await?, "{id} was not there");
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = blobs.blob_totals().await?;
    }
    Ok(left)
}

/// Every blob of a store is lost behind its back (its `lose_blobs` hook: rows
/// deleted, files removed, items deleted). A run that refers to one then
/// fails to load, and its history to read, as [`Corrupt`](StoreErrorKind::Corrupt)
/// naming the run: never `None`, never a value in its place. A run with no
/// large value still loads, the list still shows both, the same content
/// saved again by another run is stored anew and loads back, and the
/// damaged run can be deleted. The store's threshold must be at most 1 MiB
/// (under a sealing store, the threshold underneath under 8 KiB).
pub async fn a_missing_blob_is_damage_and_never_a_value(ts: TestStore) -> CheckResult {
    let store = &*ts.store;
    let Some(blobs) = store.capabilities().blobs else {
        return Ok(());
    };
    let lose = ts.lose_blobs.clone().ok_or(
        "the store keeps blobs, but its TestStore gives no way to lose them (TestStore::with_blob_loss)",
    )?;
    let size = large_size(blobs.threshold())
        .ok_or("the store's blob threshold is over 1 MiB: give the suite's store a lower one")?;
    let big = "b".repeat(size);
    let at = t(0);
    let mut lost = Checkpoint::new("lost-1", "flow", at);
    let Value::Object(update) = json!({"doc": big, "n": 1}) else {
        unreachable!("an object")
    };
    lost.state = update.clone();
    lost.completed = vec!["read".into()];
    lost.next = 1;
    let row = StepRecord::new(0, "read", update, 1, at, at);
    let v = store
        .save(SaveRequest::new(&lost, None).with_step(&row))
        .await?;
    let mut kept = Checkpoint::new("kept-1", "flow", at);
    kept.state.insert("n".into(), json!(2));
    kept.version = store.save(SaveRequest::new(&kept, None)).await?;
    let held = blobs.blob_totals().await?;
    ensure!(
        held.blobs >= 1,
        "a value of {size} bytes made no blob: {held:?} (a store that seals values leaves the \
         threshold to the store underneath: give that one a threshold under {size} bytes)"
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
                    Some(cp) => {
                        let doc = cp
                            .state
                            .get("doc")
                            .map(Value::to_string)
                            .unwrap_or_default();
                        format!("a record with `doc` = {}", doc.get(..40).unwrap_or(&doc))
                    }
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
    // The same content saved again, by another run: stored anew, never
    // taken for the blob that was there.
    let mut again = Checkpoint::new("lost-2", "flow", at);
    again.state = lost.state.clone();
    again.version = store.save(SaveRequest::new(&again, None)).await?;
    ensure!(
        store.load("lost-2").await?.as_ref() == Some(&again),
        "a value saved again after its blob was lost does not load back"
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

/// A decision's data over the store's threshold (an approval that carries a
/// document) is a blob: approving writes one, and the three saves after it
/// (the gate merging the data into the state, the steps after it) write no
/// other (under a sealing store, one more: the state's own sealed copy).
/// It stays while the record refers to it: through a rewind that drops the
/// gate's value from the state, a second decision with other data, and a
/// fold of the history with no save after it (a store that keeps history),
/// the decisions load with their data. Data that looks like a reference
/// loads back as given. Once the runs are deleted the store counts no
/// blob.
pub async fn large_decision_data_is_a_blob_kept_while_its_record_refers_to_it(
    ts: TestStore,
) -> CheckResult {
    use steadfast_core::{approve, ops, start, Outcome, Runner, SystemClock};
    let store = &ts.store;
    let Some(blobs) = store.capabilities().blobs else {
        return Ok(());
    };
    let size = large_size(blobs.threshold())
        .ok_or("the store's blob threshold is over 1 MiB: give the suite's store a lower one")?;
    use steadfast_core::{update, Step, Workflow};
    // Steps after the gate that write small values only.
    let wf = Workflow::builder("gated")
        .step("a", |_, _| async { update(json!({"a": 1})) })
        .push(Step::gate("g"))
        .step("c", |_, _| async { update(json!({"c": 1})) })
        .step("d", |_, _| async { update(json!({"d": 1})) })
        .build()?;
    let run = "big-gate";
    start(&**store, "gated", run, json!({"x": "in"}), false).await?;
    let first = Runner::new(&**store).run(run, &wf).await?;
    ensure!(
        first == Outcome::Waiting { gate: "g".into() },
        "expected to wait at g, got {first:?}"
    );
    let before = blobs.blob_totals().await?;
    let data = json!({"draft": "d".repeat(size), "ok": true});
    approve(&**store, run, "g", Some(data.clone()), "ada", &SystemClock).await?;
    let decided = blobs.blob_totals().await?;
    ensure!(
        decided.blobs == before.blobs + 1,
        "approving with data of {size} bytes left {} blobs where there were {}",
        decided.blobs,
        before.blobs
    );
    let data_of = |cp: &Checkpoint| cp.decisions.first().and_then(|d| d.data.clone());
    let loaded = store.load(run).await?.ok_or("the run vanished")?;
    ensure!(
        data_of(&loaded).as_ref() == Some(&data),
        "the decision's data loaded as {:.60}",
        format!("{:?}", data_of(&loaded))
    );
    let done = Runner::new(&**store).run(run, &wf).await?;
    ensure!(
        matches!(done, Outcome::Completed(_)),
        "expected completion, got {done:?}"
    );
    let after = blobs.blob_totals().await?;
    // A sealing store (which leaves the threshold to the store underneath)
    // seals the state's copy of the data apart from the decision's.
    let copies = u64::from(blobs.threshold() == u64::MAX);
    ensure!(
        after.blobs == decided.blobs + copies,
        "the three saves after the decision left {} blobs where there were {} (a decision's \
         data stored again with every save?)",
        after.blobs,
        decided.blobs
    );
    // The second decision (after the rewind) brings other data, so that
    // after it only the first decision refers to the first data.
    let data2 = json!({"draft": "e".repeat(size), "ok": true});
    let check = |cp: Option<Checkpoint>, when: &str, n: usize| -> CheckResult {
        let cp = cp.ok_or_else(|| format!("the run vanished {when}"))?;
        let datas: Vec<Option<&Value>> = cp.decisions.iter().map(|d| d.data.as_ref()).collect();
        let want = [Some(&data), Some(&data2)];
        ensure!(
            datas[..] == want[..n],
            "{when}, the decisions' data loaded as {:.80}",
            format!("{datas:?}")
        );
        Ok(())
    };
    check(store.load(run).await?, "when the run completed", 1)?;
    if store.capabilities().history.is_some() {
        // The state no longer holds the gate's value; the decision does.
        let cp = ops::rewind(&**store, run, "a", "ada", &SystemClock).await?;
        ensure!(
            !cp.state.contains_key("g"),
            "the rewind kept the gate's value in the state"
        );
        check(
            store.load(run).await?,
            "after a rewind to the first step",
            1,
        )?;
        let again = Runner::new(&**store).run(run, &wf).await?;
        ensure!(
            again == Outcome::Waiting { gate: "g".into() },
            "expected to wait at g again, got {again:?}"
        );
        approve(&**store, run, "g", Some(data2.clone()), "ada", &SystemClock).await?;
        let done = Runner::new(&**store).run(run, &wf).await?;
        ensure!(
            matches!(done, Outcome::Completed(_)),
            "expected completion again, got {done:?}"
        );
        // Every row but the last two folded away, as a prune does but with
        // no save after the fold (a prune's audit entry would write a
        // freed blob of the head's again): the record whole, then the fold.
        let cp = store.load(run).await?.ok_or("the run vanished")?;
        let mut whole = cp.clone();
        whole.writer = whole.writer.wrapping_add(1);
        let v = store
            .save(SaveRequest::new(&whole, Some(cp.version)))
            .await?;
        let rows = store.history(run).await?.ok_or("no history")?;
        let at = cp.next - 2;
        let row = rows
            .iter()
            .find(|r| r.index == at)
            .ok_or_else(|| format!("no history row {at}"))?;
        let mut merged = serde_json::Map::new();
        for r in rows.iter().filter(|r| r.index <= at) {
            merged.extend(r.update.clone());
        }
        let fold = StepRecord::new(
            at,
            &row.name,
            merged,
            row.attempt,
            row.started_at,
            row.finished_at,
        );
        store.fold_history(run, v, &fold).await?;
        check(store.load(run).await?, "after a fold of the history", 2)?;
    }
    // Data that looks like a reference, on another run.
    let fake = json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
    let other = "lookalike-gate";
    start(&**store, "gated", other, json!({"x": "in"}), false).await?;
    Runner::new(&**store).run(other, &wf).await?;
    approve(
        &**store,
        other,
        "g",
        Some(fake.clone()),
        "ada",
        &SystemClock,
    )
    .await?;
    let cp = store.load(other).await?.ok_or("the run vanished")?;
    ensure!(
        data_of(&cp).as_ref() == Some(&fake),
        "data that looks like a reference loaded as {:?}",
        data_of(&cp)
    );
    for id in [run, other] {
        ensure!(store.delete(id).await?, "{id} was not there to delete");
    }
    let left = blobs_left_after_sweeps(&**store, "gate").await?;
    ensure!(
        left.blobs == 0 && left.bytes == 0,
        "blobs left after the runs with decisions were deleted: {left:?}"
    );
    Ok(())
}
