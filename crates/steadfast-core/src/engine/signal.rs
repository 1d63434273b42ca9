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
use crate::record::signal::{taken, Signal};
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
/// Errors: a run that does not exist ([`Error::NoSuchRun`]) or has ended,
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
    crate::record::state::check_entries(std::iter::once(("data", &data)))
        .map_err(|p| refuse(format!("the data at `{}`: {}", p.path, p.reason)))?;
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
    wake(store, run_id, name, clock)
        .await
        .map_err(|e| store_err("marking the waiting run due after sending", e))?;
    Ok(seq)
}

fn ended(cp: &Checkpoint) -> bool {
    matches!(
        cp.status,
        RunStatus::Completed | RunStatus::Failed | RunStatus::Rejected | RunStatus::Cancelled
    )
}

/// Marks run `run_id` due when it waits for signal `name` (compare-and-swap;
/// a run that moved on needs nothing).
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
        match (&mut cp.status, &mut cp.wait) {
            (
                RunStatus::Waiting,
                Some(Wait::Signal {
                    signal, arrived, ..
                }),
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
    // Others kept writing the run: it is not standing at its wait, or
    // someone else marked it.
    Ok(())
}

/// The oldest signal named `name` in the log of `cp`'s run that no wait of
/// the run took.
pub(crate) async fn next_signal(
    log: &dyn Events,
    cp: &Checkpoint,
    name: &str,
) -> Result<Option<Signal>, StoreError> {
    let taken = taken(&cp.state);
    let mut after = 0;
    loop {
        let page = log.read_events(&cp.run_id, after, PAGE).await?;
        let full = page.len() == PAGE;
        for e in &page {
            after = e.seq;
            if let Some(s) = Signal::from_event(e) {
                if s.name == name && !taken.contains(&s.seq) {
                    return Ok(Some(s));
                }
            }
        }
        if !full {
            return Ok(None);
        }
    }
}
