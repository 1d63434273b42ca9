//! Sending a signal to a run, and finding the signal a wait takes.
//!
//! A signal is appended to its run's event log (see
//! [`record::signal`](crate::record::signal)); the run's record is written
//! only when the run already waits for that name, to mark it due. A wait
//! that finds no signal saves its wait and then looks again, so a signal
//! sent while it looked is never missed: either the sender sees the wait and
//! marks it, or the wait sees the signal.

use serde_json::Value;

use crate::record::checkpoint::{Checkpoint, RunStatus, Wait};
use crate::record::clock::Clock;
use crate::record::error::{Error, StoreError, StoreErrorKind};
use crate::record::events::MAX_EVENT_BYTES;
use crate::record::signal::{last_taken, Signal};
use crate::store::{Events, SaveRequest, Store};

/// How many events a wait reads from the log at a time, looking for its
/// signal.
const PAGE: usize = 1000;

/// Sends signal `name` carrying `data` to run `run_id`, as `by`: it is kept
/// in the run's event log until a wait for `name` takes it (at once when the
/// run waits for it now, else when the run comes to such a wait). Each
/// signal is taken by one wait; two sent before a wait are taken by it and
/// the next. Returns the signal's number in the log.
///
/// A signal is recorded before the run is marked due: a sender that dies
/// between the two leaves the run to find it at its next look (a waiting
/// run looks again every [`SIGNAL_RECHECK`]). A failure to mark it is only
/// logged, and the call returns the signal's number: sending again would
/// send a second signal.
///
/// Errors: a run that does not exist ([`Error::NoSuchRun`]), is completed,
/// rejected or cancelled (a failed run may be retried, and takes signals),
/// a name or sender that is not a name (1 to 200 bytes, no control
/// characters), data deeper than [`MAX_VALUE_DEPTH`](crate::MAX_VALUE_DEPTH),
/// with a number that is not finite or over 64 KiB as JSON (all
/// [`Error::InvalidInput`], before anything is written), a store without an
/// event log.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use serde_json::json;
/// use steadfast_core::{durable, signal, MemoryStore, Outcome, SystemClock};
///
/// let store = MemoryStore::new();
/// let agent = |ctx: steadfast_core::DurableCtx<'static, MemoryStore>| async move {
///     let answer = ctx.wait_for("answer", None).await?.expect("no timeout");
///     Ok::<_, steadfast_core::Error>(answer.data)
/// };
/// // Nothing sent yet: the run stops at the wait, holding no process.
/// assert!(matches!(durable("r", &store, "agent", agent).await?, Outcome::Waiting { .. }));
/// signal(&store, "r", "answer", Some(json!(42)), "ada", &SystemClock).await?;
/// assert_eq!(durable("r", &store, "agent", agent).await?.completed(), Some(json!(42)));
/// # Ok::<(), steadfast_core::Error>(())
/// # }).unwrap();
/// ```
pub async fn signal<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    name: &str,
    data: Option<Value>,
    by: &str,
    clock: &dyn Clock,
) -> Result<u64, Error> {
    crate::validate_run_id(run_id)?;
    let what = || {
        format!(
            "signal {:?} to run {run_id:?}",
            crate::record::ids::preview(name)
        )
    };
    let refuse = |reason: String| Error::InvalidInput {
        what: what(),
        reason: format!("{reason}; nothing was sent"),
    };
    crate::record::ids::check_step_name(name).map_err(|r| refuse(format!("its name: {r}")))?;
    crate::record::ids::check_step_name(by)
        .map_err(|r| refuse(format!("the name of who sends it: {r}")))?;
    let data = data.unwrap_or(Value::Null);
    // Checked at the depth it is stored at, inside the event's value.
    let nested = serde_json::json!({ "data": data });
    crate::record::state::check_entries(std::iter::once(("signal", &nested)))
        .map_err(|p| refuse(format!("the data at `{}`: {}", p.path, p.reason)))?;
    let data = match nested {
        Value::Object(mut m) => m.remove("data").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let size = serde_json::to_string(&data).map_or(0, |t| t.len() as u64);
    if size > MAX_EVENT_BYTES {
        return Err(refuse(format!(
            "its data is {size} bytes as JSON, over the limit of {MAX_EVENT_BYTES}"
        )));
    }
    let store_err = |op: &str, source| Error::Store {
        run_id: run_id.to_string(),
        op: format!("{op} of {}", what()),
        source,
    };
    let log = store.capabilities().events.ok_or_else(|| {
        store_err(
            "sending",
            StoreError::Unsupported("the store keeps no event log, where signals are kept".into()),
        )
    })?;
    let cp = store
        .load(run_id)
        .await
        .map_err(|e| store_err("sending", e))?
        .ok_or_else(|| Error::NoSuchRun {
            run_id: run_id.to_string(),
        })?;
    if ended(&cp) {
        return Err(refuse(format!("the run has ended (it is {})", cp.status)));
    }
    let seq = log
        .append_events(run_id, &[Signal::event(name, data, by, clock.now())])
        .await
        .map_err(|e| store_err("recording", e))?;
    if let Err(e) = wake(store, run_id, name, clock).await {
        tracing::warn!(
            run_id,
            signal = name,
            seq,
            error = %e,
            "the signal is recorded, but the run waiting for it was not marked due; it takes it at its next look"
        );
    }
    Ok(seq)
}

/// How long a run waiting for a signal stands before a worker looks again
/// for one (in case a sender died between recording a signal and marking
/// the run due): 10 minutes.
pub const SIGNAL_RECHECK: std::time::Duration = std::time::Duration::from_secs(600);

fn ended(cp: &Checkpoint) -> bool {
    matches!(
        cp.status,
        RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
    )
}

/// Marks run `run_id` due when it waits for signal `name` and no process
/// holds it (compare-and-swap; a run that moved on needs nothing, and a
/// holder looks at the log itself: writing its record would fence it out).
pub(crate) async fn wake<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
    name: &str,
    clock: &dyn Clock,
) -> Result<(), StoreError> {
    for _ in 0..10 {
        let Some(mut cp) = store.load(run_id).await? else {
            return Ok(());
        };
        match (&mut cp.status, &mut cp.wait, &cp.lease) {
            (
                RunStatus::Waiting,
                Some(Wait::Signal {
                    signal, arrived, ..
                }),
                None,
            ) if signal == name && !*arrived => *arrived = true,
            _ => return Ok(()),
        }
        cp.updated_at = clock.now();
        cp.writer = fastrand::u64(1..);
        match store.save(SaveRequest::new(&cp, Some(cp.version))).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "run {run_id:?} kept changing while it was marked due for signal {name:?}"
    )))
}

/// The oldest signal named `name` in the log of `cp`'s run after the last
/// one of that name its waits took (found by its id: where it was, or
/// anywhere in the log). A log that no longer holds it (a copied or forked
/// run's new one) is searched from its start for signals sent no earlier
/// than the last one taken.
pub(crate) async fn next_signal(
    log: &dyn Events,
    cp: &Checkpoint,
    name: &str,
) -> Result<Option<Signal>, StoreError> {
    let run_id = &cp.run_id;
    let last = last_taken(&cp.state, name);
    let mut since = None;
    let start = match &last {
        None => 0,
        Some((id, seq, at)) => {
            let there = log
                .read_events(run_id, seq.saturating_sub(1), 1)
                .await?
                .first()
                .and_then(Signal::from_event)
                .is_some_and(|s| s.id == *id);
            if there {
                *seq
            } else {
                match find(log, run_id, 0, |s| s.id == *id).await? {
                    Some(s) => s.seq,
                    None => {
                        since = Some(*at);
                        0
                    }
                }
            }
        }
    };
    let last_id = last.map(|(id, _, _)| id);
    find(log, run_id, start, |s| {
        s.name == name && Some(&s.id) != last_id.as_ref() && since.is_none_or(|at| s.at >= at)
    })
    .await
}

/// The first signal after event `after` of run `run_id`'s log that `wanted`
/// picks.
async fn find(
    log: &dyn Events,
    run_id: &str,
    mut after: u64,
    wanted: impl Fn(&Signal) -> bool,
) -> Result<Option<Signal>, StoreError> {
    loop {
        let page = log.read_events(run_id, after, PAGE).await?;
        let full = page.len() == PAGE;
        for e in &page {
            after = e.seq;
            if let Some(s) = Signal::from_event(e).filter(|s| wanted(s)) {
                return Ok(Some(s));
            }
        }
        if !full {
            return Ok(None);
        }
    }
}
