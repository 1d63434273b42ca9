//! What a running step emits: a buffer per step execution, written to the
//! run's event log in batches while the step runs and once more before its
//! checkpoint is saved.
//!
//! A batch is written [`FLUSH_EVERY`] after the first event waiting in the
//! buffer, or at once when [`FLUSH_AT`] events are waiting, and the rest when
//! the step returns (before its checkpoint, so that a completed step's
//! events are all in the log). A crash loses at most the events of a step
//! that had not finished, emitted since its last batch.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::record::clock::Clock;
use crate::record::error::{Error, StoreError};
use crate::record::events::{check_events, NewEvent, MAX_EVENTS_PER_APPEND, MAX_EVENT_BYTES};
use crate::store::Events;

/// How long an emitted event waits in its step's buffer at most while the
/// step runs: 100 ms.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// How many waiting events make a batch be written at once.
pub const FLUSH_AT: usize = 256;

/// One execution of one step's buffer of emitted events.
pub(crate) struct Sink {
    run_id: Arc<str>,
    step: Arc<str>,
    attempt: u32,
    clock: Arc<dyn Clock>,
    inner: Mutex<Buffer>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Buffer {
    /// The events waiting, each with the size of its value's JSON.
    events: Vec<(NewEvent, u64)>,
    /// The sum of those sizes.
    bytes: u64,
    /// Whether this execution has emitted before (its first event is
    /// marked as the first).
    emitted: bool,
    /// Why the log refused a batch: later emits report it.
    failed: Option<String>,
    /// The step has returned and its events were written: later emits
    /// (from a thread or task that outlived it) are refused, not lost
    /// unseen.
    closed: bool,
}

/// The most a step's buffer holds while its events wait to be written, in
/// bytes of their values' JSON: 32 MiB (a step that emits in a loop without
/// awaiting, or faster than the store writes, is refused beyond it).
pub const MAX_BUFFERED_BYTES: u64 = 32 << 20;

impl Sink {
    /// The buffer of attempt `attempt` of step `step` of run `run_id`.
    pub(crate) fn new(
        (run_id, step): (Arc<str>, Arc<str>),
        attempt: u32,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Sink {
            run_id,
            step,
            attempt,
            clock,
            inner: Mutex::new(Buffer::default()),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn buffer(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `value` and puts it in the buffer.
    pub(crate) fn emit(&self, value: serde_json::Value) -> Result<(), Error> {
        if &*self.step == crate::record::signal::SIGNAL_STEP {
            // Its events would be read as signals sent to the run.
            return Err(Error::InvalidInput {
                what: format!("an event emitted by step {:?} of run {:?}", self.step, self.run_id),
                reason: "that step name is where the run's signals are recorded; rename the step to emit".into(),
            });
        }
        let mut event = NewEvent::new(&*self.step, self.attempt, self.clock.now(), value);
        let texts = check_events(&self.run_id, std::slice::from_ref(&event)).map_err(|e| {
            Error::InvalidInput {
                what: format!(
                    "an event emitted by step {:?} of run {:?}",
                    self.step, self.run_id
                ),
                reason: match e {
                    StoreError::InvalidInput(r) => r,
                    other => other.to_string(),
                },
            }
        })?;
        let size = texts.first().map_or(0, |t| t.len() as u64);
        if size > MAX_EVENT_BYTES {
            return Err(Error::InvalidInput {
                what: format!(
                    "an event emitted by step {:?} of run {:?}",
                    self.step, self.run_id
                ),
                reason: format!(
                    "it is {size} bytes as JSON, over the limit of {MAX_EVENT_BYTES}; return large values in the step's update instead"
                ),
            });
        }
        let mut b = self.buffer();
        let refused = |why: String| Error::Store {
            run_id: self.run_id.to_string(),
            op: format!("recording events of step {:?}", self.step),
            source: StoreError::unavailable(why),
        };
        if let Some(why) = &b.failed {
            return Err(refused(why.clone()));
        }
        if b.closed {
            return Err(refused(
                "the step has returned (its events were written with its checkpoint)".into(),
            ));
        }
        if b.bytes + size > MAX_BUFFERED_BYTES {
            return Err(refused(format!(
                "{} bytes of events wait to be written already (the limit is {MAX_BUFFERED_BYTES}): the step emits faster than the store writes, or without awaiting",
                b.bytes
            )));
        }
        b.bytes += size;
        event.first = !b.emitted;
        b.emitted = true;
        b.events.push((event, size));
        let n = b.events.len();
        drop(b);
        if n == 1 || n >= FLUSH_AT {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Writes what waits in the buffer, in batches; the first refusal is
    /// kept (later emits report it) and returned. With `close`, the buffer
    /// is closed when it is found empty, under the same lock, so that an
    /// emit racing with the step's end is either written or refused, never
    /// accepted and dropped.
    async fn flush(&self, log: &dyn Events, close: bool) -> Result<(), Error> {
        loop {
            let batch: Vec<NewEvent> = {
                let mut b = self.buffer();
                if b.failed.is_some() || b.events.is_empty() {
                    b.closed |= close;
                    return Ok(());
                }
                // As many as the log takes in one append (one at least).
                let (most, budget) = log.append_bounds();
                let mut n = 0;
                let mut bytes = 0u64;
                for (_, size) in b.events.iter().take(most.clamp(1, MAX_EVENTS_PER_APPEND)) {
                    if n > 0 && bytes.saturating_add(*size) > budget {
                        break;
                    }
                    bytes = bytes.saturating_add(*size);
                    n += 1;
                }
                let mut freed = 0;
                let batch: Vec<NewEvent> = b
                    .events
                    .drain(..n)
                    .map(|(event, size)| {
                        freed += size;
                        event
                    })
                    .collect();
                b.bytes -= freed;
                batch
            };
            if let Err(e) = log.append_events(&self.run_id, &batch).await {
                let mut b = self.buffer();
                b.failed = Some(e.to_string());
                b.closed |= close;
                return Err(Error::Store {
                    run_id: self.run_id.to_string(),
                    op: format!("recording events of step {:?}", self.step),
                    source: e,
                });
            }
        }
    }
}

/// Runs `fut`, the step, while writing what it emits into `sink` to `log`
/// in batches; then writes the rest and closes the sink. A batch the log
/// refused is reported on the log of traces (`tracing`), and the step's
/// later emits get the error: events are the step's running commentary, so
/// a step that succeeded is recorded even when its events were not (running
/// it again would repeat its side effects).
pub(crate) async fn pump<R>(log: &dyn Events, sink: &Sink, fut: impl Future<Output = R>) -> R {
    tokio::pin!(fut);
    let out = loop {
        tokio::select! {
            biased;
            r = &mut fut => break r,
            _ = sink.wake.notified() => {}
        }
        // Events wait: a batch after FLUSH_EVERY, or sooner when many.
        let due = tokio::time::sleep(FLUSH_EVERY);
        tokio::pin!(due);
        let finished = loop {
            if sink.buffer().events.len() >= FLUSH_AT {
                break None;
            }
            tokio::select! {
                biased;
                r = &mut fut => break Some(r),
                _ = &mut due => break None,
                _ = sink.wake.notified() => {}
            }
        };
        if let Some(r) = finished {
            break r;
        }
        sink.flush_or_note(log, false).await;
    };
    sink.flush_or_note(log, true).await;
    out
}

impl Sink {
    async fn flush_or_note(&self, log: &dyn Events, close: bool) {
        if let Err(e) = self.flush(log, close).await {
            tracing::warn!(
                run_id = %self.run_id,
                step = %self.step,
                error = %crate::record::error::error_chain(&e),
                "events emitted by a step were not recorded"
            );
        }
    }
}
