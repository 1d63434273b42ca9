//! Checks of the [`Events`](steadfast_core::Events) capability: each run's
//! event log, numbered without gaps, written whole or not at all, gone with
//! its run, and fed by steps that emit.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_core::store::{
    SaveRequest, MAX_EVENTS_PER_APPEND, MAX_EVENT_BYTES, MAX_STORED_EVENT_BYTES,
};
use steadfast_core::{durable, Checkpoint, Events, NewEvent, StepCtx, StepError, Store, Timestamp};

use crate::{CheckResult, TestStore};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

fn at(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_700_000_000_000 + ms)
}

fn ev(step: &str, attempt: u32, value: Value) -> NewEvent {
    NewEvent::new(step, attempt, at(attempt as u64), value)
}

fn log(ts: &TestStore) -> Result<&dyn Events, Box<dyn std::error::Error + Send + Sync>> {
    ts.store
        .capabilities()
        .events
        .ok_or_else(|| "the store declares no event log".into())
}

/// Appends are numbered 1, 2, 3… per run, read back in order and equal, from
/// any point, in pages; runs are kept apart.
pub async fn events_are_numbered_per_run_and_read_back_equal(ts: TestStore) -> CheckResult {
    let log = log(&ts)?;
    let mut first = ev(
        "plan",
        1,
        // Numbers as they went in: a 64-bit integer no double holds, and a
        // float that equals an integer.
        json!({"token": "Hel", "n": 1.5, "big": u64::MAX, "neg": i64::MIN, "one": 1.0, "deep": [[{"ok": null}]]}),
    );
    first.first = true;
    let batch = vec![
        first,
        ev("plan", 1, json!("lo")),
        ev("tool/é", 2, json!([1, 2])),
    ];
    ensure!(
        log.append_events("r", &batch).await? == 3,
        "the first append's last number is not 3"
    );
    ensure!(
        log.append_events("r", &batch[1..]).await? == 5,
        "the second append's last number is not 5"
    );
    ensure!(
        log.append_events("r 2/other", &batch[..1]).await? == 1,
        "another run's log does not start at 1"
    );
    let all = log.read_events("r", 0, 100).await?;
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    ensure!(seqs == [1, 2, 3, 4, 5], "numbers read back: {seqs:?}");
    for (got, want) in all.iter().zip(batch.iter().chain(&batch[1..])) {
        ensure!(
            got.step == want.step
                && got.attempt == want.attempt
                && got.at == want.at
                && got.value == want.value
                && got.first == want.first,
            "event {} read back as {got:?}, appended as {want:?}",
            got.seq
        );
    }
    let tail: Vec<u64> = log
        .read_events("r", 3, 100)
        .await?
        .iter()
        .map(|e| e.seq)
        .collect();
    ensure!(tail == [4, 5], "read after 3: {tail:?}");
    let page: Vec<u64> = log
        .read_events("r", 1, 2)
        .await?
        .iter()
        .map(|e| e.seq)
        .collect();
    ensure!(page == [2, 3], "read after 1, two at most: {page:?}");
    ensure!(
        log.read_events("r", 5, 100).await?.is_empty(),
        "events after the last"
    );
    ensure!(
        log.read_events("absent", 0, 100).await?.is_empty(),
        "events of an absent run"
    );
    let other = log.read_events("r 2/other", 0, 100).await?;
    ensure!(
        other.len() == 1 && other[0].value == batch[0].value,
        "the other run's log: {other:?}"
    );
    Ok(())
}

/// Appends that race on one run get disjoint runs of numbers, with no gap
/// and no number twice.
pub async fn concurrent_appends_get_gap_free_numbers(ts: TestStore) -> CheckResult {
    let store = Arc::clone(&ts.store);
    log(&ts)?;
    let mut tasks = Vec::new();
    for writer in 0..6u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let log = store.capabilities().events.expect("checked above");
            let mut lasts = Vec::new();
            for batch in 0..8u64 {
                let events: Vec<NewEvent> = (0..3u64)
                    .map(|i| ev("s", 1, json!([writer, batch, i])))
                    .collect();
                lasts.push((writer, batch, log.append_events("race", &events).await?));
            }
            Ok::<_, steadfast_core::StoreError>(lasts)
        }));
    }
    let mut lasts = Vec::new();
    for t in tasks {
        lasts.extend(t.await??);
    }
    let all = store
        .capabilities()
        .events
        .expect("checked above")
        .read_events("race", 0, 1000)
        .await?;
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    ensure!(
        seqs == (1..=144).collect::<Vec<u64>>(),
        "numbers after 48 racing appends of 3: {seqs:?}"
    );
    for (writer, batch, last) in lasts {
        for i in 0..3u64 {
            let e = &all[(last - 3 + i) as usize];
            ensure!(
                e.value == json!([writer, batch, i]),
                "append {batch} of writer {writer} returned {last}, but event {} is {}",
                e.seq,
                e.value
            );
        }
    }
    Ok(())
}

/// A bad append (none, too many, a bad step name, attempt 0, a value too
/// large or too deep, one bad event among good ones) is refused and writes
/// nothing.
pub async fn bad_appends_are_refused_and_write_nothing(ts: TestStore) -> CheckResult {
    let log = log(&ts)?;
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let many: Vec<NewEvent> = (0..=MAX_EVENTS_PER_APPEND)
        .map(|_| ev("s", 1, json!(1)))
        .collect();
    let bad: Vec<(&str, Vec<NewEvent>)> = vec![
        ("no events", vec![]),
        ("too many events", many),
        ("an empty step name", vec![ev("", 1, json!(1))]),
        (
            "a step name with a control character",
            vec![ev("a\u{1}", 1, json!(1))],
        ),
        ("attempt 0", vec![ev("s", 0, json!(1))]),
        (
            "a value over the limit",
            vec![ev(
                "s",
                1,
                json!("x".repeat(MAX_STORED_EVENT_BYTES as usize)),
            )],
        ),
        ("a value nested too deep", vec![ev("s", 1, deep)]),
        (
            "a bad event after a good one",
            vec![ev("s", 1, json!("good")), ev("", 1, json!("bad"))],
        ),
    ];
    for (what, events) in bad {
        ensure!(
            log.append_events("r", &events).await.is_err(),
            "an append with {what} was accepted"
        );
    }
    ensure!(
        log.read_events("r", 0, 10).await?.is_empty(),
        "a refused append left events behind"
    );
    // The largest value a step may emit is taken (by an encrypting wrapper
    // too, whose envelope is larger).
    let edge = json!("x".repeat(MAX_EVENT_BYTES as usize - 2));
    ensure!(
        log.append_events("r", &[ev("s", 1, edge.clone())]).await? == 1,
        "a value of the largest size a step may emit was not numbered 1"
    );
    ensure!(
        log.read_events("r", 0, 10).await?[0].value == edge,
        "the largest value read back changed"
    );
    Ok(())
}

/// Deleting a run (plainly or at its version) deletes its events; a run
/// started again under the id starts its log at 1.
pub async fn events_are_deleted_with_their_run(ts: TestStore) -> CheckResult {
    let log = log(&ts)?;
    let store: &dyn Store = &*ts.store;
    for guarded in [false, true] {
        let cp = Checkpoint::new("gone", "wf", at(0));
        let v = store.save(SaveRequest::new(&cp, None)).await?;
        log.append_events("gone", &[ev("s", 1, json!(1)), ev("s", 1, json!(2))])
            .await?;
        let deleted = if guarded {
            store.delete_if("gone", v).await?
        } else {
            store.delete("gone").await?
        };
        ensure!(deleted, "the run was not deleted");
        ensure!(
            log.read_events("gone", 0, 10).await?.is_empty(),
            "events outlived their deleted run (delete_if: {guarded})"
        );
        ensure!(
            log.append_events("gone", &[ev("s", 1, json!(3))]).await? == 1,
            "the log of a run started again does not start at 1"
        );
        store.delete("gone").await?;
    }
    Ok(())
}

/// A step's emitted events are all in the log when its checkpoint is (more
/// than one batch of them), with their step and attempt; a failed attempt's
/// events stay, under its attempt.
pub async fn emitted_events_land_with_their_step(ts: TestStore) -> CheckResult {
    let store = Arc::clone(&ts.store);
    let tries = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let out = durable("emitter", &store, "agent", |ctx| {
        let tries = Arc::clone(&tries);
        async move {
            ctx.step("burst", || async {
                let step = StepCtx::current().expect("inside a step");
                for i in 0..600 {
                    step.emit(json!({"i": i})).expect("emitted");
                }
                Ok::<_, StepError>(600)
            })
            .await?;
            ctx.step_with(
                "flaky",
                steadfast_core::StepOptions::new().retry(
                    steadfast_core::RetryPolicy::new(2)
                        .backoff(Duration::from_millis(1), Duration::from_millis(1))
                        .jitter(false),
                ),
                move || {
                    let tries = Arc::clone(&tries);
                    async move {
                        let step = StepCtx::current().expect("inside a step");
                        step.emit(json!("trying")).expect("emitted");
                        if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                            return Err(StepError::retryable("first try fails"));
                        }
                        Ok(1)
                    }
                },
            )
            .await
        }
    })
    .await?;
    let shown = format!("{out:?}");
    ensure!(
        out.completed() == Some(1),
        "the run did not complete: {shown}"
    );
    let all = log(&ts)?.read_events("emitter", 0, 1000).await?;
    ensure!(all.len() == 602, "{} events in the log, not 602", all.len());
    let seqs: BTreeSet<u64> = all.iter().map(|e| e.seq).collect();
    ensure!(seqs == (1..=602).collect(), "the numbers have a gap");
    for (i, e) in all[..600].iter().enumerate() {
        ensure!(
            e.step == "burst"
                && e.attempt == 1
                && e.value == json!({"i": i})
                && e.first == (i == 0),
            "event {} is {e:?}",
            e.seq
        );
    }
    let tries: Vec<(u32, bool)> = all[600..].iter().map(|e| (e.attempt, e.first)).collect();
    ensure!(
        all[600..].iter().all(|e| e.step == "flaky") && tries == [(1, true), (2, true)],
        "the flaky step's events: {:?}",
        &all[600..]
    );
    Ok(())
}

/// The lines of an export of `ids` from `store`, written as the CLI does.
async fn export_lines(
    store: &dyn Store,
    ids: &[&str],
) -> Result<Vec<String>, steadfast_core::Error> {
    let mut writer = steadfast_core::transfer::ExportWriter::new();
    let mut lines = Vec::new();
    for id in ids {
        let record = steadfast_core::transfer::export_run(store, id)
            .await?
            .expect("the run to export is there");
        writer.write(&record, &mut |line| {
            lines.push(line.to_string());
            Ok(())
        })?;
    }
    Ok(lines)
}

/// Imports `lines` into `store`, as the CLI does.
async fn import_lines(
    store: &dyn Store,
    lines: &[String],
) -> Result<Vec<steadfast_core::transfer::Put>, steadfast_core::Error> {
    let mut reader = steadfast_core::transfer::ImportReader::new();
    let mut puts = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(record) = reader.line(line, i + 1)? {
            puts.push(steadfast_core::transfer::put_run(store, &record).await?);
        }
    }
    reader.finish()?;
    Ok(puts)
}

/// A run's event log travels with it through export and import: every
/// event back under its own number, step, attempt, time and mark (more
/// than one event line of them), a signal sent before the export taken
/// once after the import, an import again changing nothing, and a newer
/// version replacing the log whole.
pub async fn a_run_travels_with_its_events(ts: TestStore) -> CheckResult {
    use steadfast_core::transfer::Put;
    let store = Arc::clone(&ts.store);
    let body = |ctx: steadfast_core::DurableCtx<'static, Arc<dyn Store>>| async move {
        ctx.step("burst", || async {
            let step = StepCtx::current().expect("inside a step");
            for i in 0..1500 {
                step.emit(json!({"i": i})).expect("emitted");
            }
            Ok::<_, StepError>(1500)
        })
        .await?;
        let got = ctx.wait_for("go", None).await?;
        Ok::<_, steadfast_core::Error>(got.map(|s| s.data))
    };
    let out = durable("travel", &store, "agent", body).await?;
    ensure!(
        out.completed().is_none(),
        "the run did not stop at its wait"
    );
    let clock = steadfast_core::SystemClock;
    steadfast_core::signal(&*store, "travel", "go", Some(json!(1)), "tester", &clock).await?;
    steadfast_core::signal(&*store, "travel", "go", Some(json!(2)), "tester", &clock).await?;
    let before = log(&ts)?.read_events("travel", 0, 5000).await?;
    ensure!(
        before.len() == 1502,
        "{} events before the export",
        before.len()
    );
    let waiting = export_lines(&*store, &["travel"]).await?;
    ensure!(
        waiting.len() >= 3,
        "1,500 events and a run in {} lines",
        waiting.len()
    );
    ensure!(store.delete("travel").await?, "the run was not deleted");
    ensure!(
        import_lines(&*store, &waiting).await? == [Put::Written],
        "the import did not write the run"
    );
    let after = log(&ts)?.read_events("travel", 0, 5000).await?;
    ensure!(after == before, "the log came back different");
    // The signal sent before the export is taken once, after the import.
    let out = durable("travel", &store, "agent", body).await?;
    ensure!(
        out.completed() == Some(Some(json!(1))),
        "the resumed run did not take the first signal"
    );
    ensure!(
        import_lines(&*store, &waiting).await?
            == [Put::Kept {
                version: store.load("travel").await?.map_or(0, |c| c.version)
            }],
        "an import of an older version did not keep the newer run"
    );
    ensure!(
        log(&ts)?.read_events("travel", 0, 5000).await?.len() == 1502,
        "an import that kept the run changed its log"
    );
    // A newer version replaces an older one, log and all.
    let done = export_lines(&*store, &["travel"]).await?;
    store.delete("travel").await?;
    import_lines(&*store, &waiting).await?;
    log(&ts)?
        .append_events("travel", &[ev("stray", 1, json!("only in the older copy"))])
        .await?;
    ensure!(
        matches!(
            import_lines(&*store, &done).await?[..],
            [Put::Replaced { .. }]
        ),
        "the newer export did not replace the older run"
    );
    ensure!(
        log(&ts)?.read_events("travel", 0, 5000).await? == before,
        "the replaced run's log is not the newer export's"
    );
    store.delete("travel").await?;
    Ok(())
}
