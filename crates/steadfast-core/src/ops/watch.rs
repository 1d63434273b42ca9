//! Watching a run as it works: the events its steps emit, and the steps it
//! completes, fails and stops at, from any process, until it ends, stops or
//! is deleted.
//!
//! A [`Watch`] polls the store: the run's record, then its event log after
//! the last event it reported. Emitted events come from the log, in order,
//! each once; what the steps do (done, failed, the run waiting, completed)
//! comes from the record, as it is seen at each poll. Two watchers of one run
//! see the same events in the same order whenever they attach; where the
//! record's news fall between them depends on when each looked.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::watch::{Watch, WatchItem};
//! use steadfast_core::{durable, MemoryStore, StepCtx, StepError};
//!
//! let store = MemoryStore::new();
//! durable("r", &store, "agent", |ctx| async move {
//!     ctx.step("answer", || async {
//!         StepCtx::current().unwrap().emit(json!("thinking")).unwrap();
//!         Ok::<_, StepError>(42)
//!     })
//!     .await
//! })
//! .await?;
//! let mut watch = Watch::new(&store, "r");
//! let mut seen = Vec::new();
//! while let Some(item) = watch.next().await? {
//!     seen.push(item.kind());
//! }
//! assert_eq!(seen, ["started", "event", "done", "completed"]);
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use crate::engine::emit::{FLUSH_AT, FLUSH_EVERY};
use crate::record::checkpoint::{Checkpoint, RunStatus, Wait};
use crate::record::clock::Timestamp;
use crate::record::error::{Error, StoreError};
use crate::record::events::RunEvent;
use crate::record::signal::Signal;
use crate::store::Store;

/// How often a watcher looks at the store by default: 50 ms.
pub const DEFAULT_POLL: Duration = Duration::from_millis(50);

/// The range of a watcher's poll interval: 1 ms to 1 minute.
pub const POLL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(60);

/// How many events a watcher reads from the log at a time.
const PAGE: usize = 500;

/// What a [`Watch`] reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WatchItem {
    /// A step's execution began emitting (its first event follows). A step
    /// that emits nothing is seen when it is done.
    Started {
        /// The step.
        step: String,
        /// Its attempt.
        attempt: u32,
    },
    /// The events reported for `step` so far, up to `through` (the last
    /// one's number), belong to an execution that did not finish: a retry,
    /// or a run again after a crash, began. They stay in the log.
    Superseded {
        /// The step.
        step: String,
        /// The number of the last superseded event.
        through: u64,
    },
    /// A value a step emitted.
    Event {
        /// The event as the log holds it.
        #[serde(flatten)]
        event: RunEvent,
    },
    /// A step completed and its checkpoint was saved.
    Done {
        /// Its index.
        index: usize,
        /// Its name.
        step: String,
    },
    /// An attempt of a step failed.
    Failed {
        /// The step's index.
        index: usize,
        /// Its name.
        step: String,
        /// The attempt that failed.
        attempt: u32,
        /// Why.
        error: String,
        /// Whether the run will try it again (else the run has failed).
        retrying: bool,
    },
    /// The run stopped at a gate: it goes on after a decision.
    Waiting {
        /// The gate.
        gate: String,
    },
    /// A signal was sent to the run (it is kept until a wait takes it).
    Signal {
        /// The signal as the log holds it.
        #[serde(flatten)]
        signal: Signal,
    },
    /// The run stopped at a wait for a signal: it goes on after one is sent.
    WaitingForSignal {
        /// The wait's step.
        step: String,
        /// The signal's name.
        signal: String,
    },
    /// The run stopped waiting for child runs: it goes on as they end.
    WaitingForChildren {
        /// The first child step whose result is not recorded.
        step: String,
        /// The child runs under way.
        runs: Vec<String>,
    },
    /// The run stopped at a durable timer.
    Sleeping {
        /// The timer's step.
        step: String,
        /// When it fires.
        until: Timestamp,
    },
    /// The run completed.
    Completed,
    /// The run ended failed, rejected or cancelled.
    Ended {
        /// Its status.
        status: RunStatus,
    },
    /// The run was deleted (or deleted and started again under its id)
    /// while it was watched.
    Gone,
}

impl WatchItem {
    /// The item's kind as the JSON output names it (`"event"`, `"done"`…).
    pub fn kind(&self) -> &'static str {
        match self {
            WatchItem::Started { .. } => "started",
            WatchItem::Superseded { .. } => "superseded",
            WatchItem::Event { .. } => "event",
            WatchItem::Done { .. } => "done",
            WatchItem::Failed { .. } => "failed",
            WatchItem::Waiting { .. } => "waiting",
            WatchItem::Signal { .. } => "signal",
            WatchItem::WaitingForSignal { .. } => "waiting_for_signal",
            WatchItem::WaitingForChildren { .. } => "waiting_for_children",
            WatchItem::Sleeping { .. } => "sleeping",
            WatchItem::Completed => "completed",
            WatchItem::Ended { .. } => "ended",
            WatchItem::Gone => "gone",
        }
    }

    /// Whether the watch ends with this item.
    pub fn is_last(&self) -> bool {
        matches!(
            self,
            WatchItem::Waiting { .. }
                | WatchItem::WaitingForSignal { .. }
                | WatchItem::WaitingForChildren { .. }
                | WatchItem::Sleeping { .. }
                | WatchItem::Completed
                | WatchItem::Ended { .. }
                | WatchItem::Gone
        )
    }
}

/// What the watcher knew of the record at its last look.
#[derive(Default)]
struct Seen {
    /// Steps reported done.
    done: usize,
    /// The failure last reported: (index, attempt).
    failure: Option<(usize, u32)>,
}

/// A run watched from its record and its event log (see the
/// [module](self)).
pub struct Watch<'s> {
    store: Source<'s>,
    run_id: String,
    after: u64,
    poll: Duration,
    queue: VecDeque<WatchItem>,
    seen: Seen,
    /// Per step: the attempt of its last execution seen, and the number
    /// and time of its last event.
    steps: HashMap<String, (u32, u64, Timestamp)>,
    /// When the run watched was created (it is another run if this
    /// changes).
    created: Option<Timestamp>,
    /// The attempt and start of the steps whose records were read (to tell
    /// whether the events seen of a step are of the execution that
    /// completed it).
    records: HashMap<usize, (u32, Timestamp)>,
    ended: bool,
    looked: bool,
    /// The events up to `after` given at the start were read (to know each
    /// step's execution as a watcher that saw them did).
    primed: bool,
    /// The last look read a full page of events: look again at once.
    more: bool,
}

/// The store a watch reads: borrowed, or shared with it.
enum Source<'s> {
    Borrowed(&'s dyn Store),
    Shared(Arc<dyn Store>),
}

impl Source<'_> {
    fn get(&self) -> &dyn Store {
        match self {
            Source::Borrowed(s) => *s,
            Source::Shared(s) => &**s,
        }
    }
}

impl Watch<'static> {
    /// [`Watch::new`] on a store it shares (for a watch that outlives the
    /// caller's borrow: kept in a task, or in another language's object).
    pub fn shared(store: Arc<dyn Store>, run_id: &str) -> Self {
        Self::with_source(Source::Shared(store), run_id)
    }
}

impl<'s> Watch<'s> {
    /// A watch of run `run_id` from its first event. A run that does not
    /// exist yet is waited for.
    pub fn new(store: &'s dyn Store, run_id: &str) -> Self {
        Self::with_source(Source::Borrowed(store), run_id)
    }

    fn with_source(store: Source<'s>, run_id: &str) -> Self {
        Watch {
            store,
            run_id: run_id.to_string(),
            after: 0,
            poll: DEFAULT_POLL,
            queue: VecDeque::new(),
            seen: Seen::default(),
            steps: HashMap::new(),
            created: None,
            records: HashMap::new(),
            ended: false,
            looked: false,
            primed: false,
            more: false,
        }
    }

    /// Reports only the events numbered above `seq` (what a watcher that
    /// saw up to `seq` missed).
    pub fn after(mut self, seq: u64) -> Self {
        self.after = seq;
        self
    }

    /// Looks at the store every `every` ([`DEFAULT_POLL`] unless set).
    ///
    /// Errors: a duration outside [`POLL_RANGE`].
    pub fn poll_every(mut self, every: Duration) -> Result<Self, Error> {
        if !POLL_RANGE.contains(&every) {
            return Err(Error::InvalidInput {
                what: "the poll interval of a watch".into(),
                reason: format!(
                    "{every:?} is outside {:?} to {:?}",
                    POLL_RANGE.start(),
                    POLL_RANGE.end()
                ),
            });
        }
        self.poll = every;
        Ok(self)
    }

    /// The number of the last event reported (or the one given to
    /// [`after`](Self::after)): where a new watch would go on from.
    pub fn last_seq(&self) -> u64 {
        self.after
    }

    /// The next item, waiting for it as long as the run goes on; `None`
    /// once the run has ended, stopped or been deleted (after its last item:
    /// `completed`, `ended`, `waiting`, `sleeping` or `gone`).
    ///
    /// Errors: a run id that is not one, a store without an event log
    /// ([`StoreError::Unsupported`]), a store that fails.
    pub async fn next(&mut self) -> Result<Option<WatchItem>, Error> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Ok(Some(item));
            }
            if self.ended {
                return Ok(None);
            }
            if self.looked && !self.more {
                match self.store.get().capabilities().events {
                    Some(log) => log.wait_for_events(&self.run_id, self.poll).await,
                    None => tokio::time::sleep(self.poll).await,
                }
            }
            self.look().await?;
            self.looked = true;
        }
    }

    fn store_err(&self, op: &str, source: StoreError) -> Error {
        Error::Store {
            run_id: self.run_id.clone(),
            op: op.into(),
            source,
        }
    }

    /// One look: the record, then the events after the last reported (those
    /// of every step the record shows done are in the log by then), then
    /// what the record says.
    async fn look(&mut self) -> Result<(), Error> {
        crate::record::ids::validate_run_id(&self.run_id)?;
        if !self.primed {
            self.prime().await?;
            self.primed = true;
        }
        let (cp, page) = {
            let store = self.store.get();
            let log = store.capabilities().events.ok_or_else(|| {
                self.store_err(
                    "watching",
                    StoreError::Unsupported("the store keeps no event log".into()),
                )
            })?;
            let cp = store
                .load(&self.run_id)
                .await
                .map_err(|e| self.store_err("watching (its record)", e))?;
            let page = log
                .read_events(&self.run_id, self.after, PAGE)
                .await
                .map_err(|e| self.store_err("watching (its events)", e))?;
            // Steps done since the last look whose events were seen (or are
            // in this page): their records tell whether those events are of
            // the execution that completed them.
            let needed = cp.as_ref().is_some_and(|cp| {
                (self.seen.done..cp.next.min(cp.completed.len())).any(|i| {
                    let name = &cp.completed[i];
                    !self.records.contains_key(&i)
                        && (self.steps.contains_key(name) || page.iter().any(|e| e.step == *name))
                })
            });
            let history = match (needed, store.capabilities().history) {
                (true, Some(h)) => h
                    .history(&self.run_id)
                    .await
                    .map_err(|e| self.store_err("watching (its history)", e))?,
                _ => None,
            };
            for r in history.into_iter().flatten() {
                self.records.insert(r.index, (r.attempt, r.started_at));
            }
            (cp, page)
        };
        match (&cp, self.created) {
            (None, Some(_)) => {
                self.gone();
                return Ok(());
            }
            (Some(cp), Some(created)) if cp.created_at != created => {
                self.gone();
                return Ok(());
            }
            (Some(cp), None) => self.created = Some(cp.created_at),
            _ => {}
        }
        // A full page: more events wait, read at once; what the record says
        // comes after the last of them.
        self.more = page.len() == PAGE;
        for event in page {
            self.event(cp.as_ref(), event);
        }
        if let (Some(cp), false) = (&cp, self.more) {
            self.record(cp);
        }
        Ok(())
    }

    /// A watch that goes on after event `after` learns, from the events up
    /// to it, which execution of each step emitted last: so that it neither
    /// reports a running execution as started again nor misses that a later
    /// one superseded it.
    async fn prime(&mut self) -> Result<(), Error> {
        let mut steps = HashMap::new();
        let mut from = 0;
        while from < self.after {
            let page = {
                let store = self.store.get();
                let Some(log) = store.capabilities().events else {
                    return Ok(());
                };
                log.read_events(&self.run_id, from, PAGE)
                    .await
                    .map_err(|e| self.store_err("watching (its earlier events)", e))?
            };
            let full = page.len() == PAGE;
            let mut past = false;
            for e in page {
                if e.seq > self.after {
                    past = true;
                    break;
                }
                from = e.seq;
                steps.insert(e.step, (e.attempt, e.seq, e.at));
            }
            if !full || past {
                break;
            }
        }
        self.steps = steps;
        Ok(())
    }

    /// The run watched is no more.
    fn gone(&mut self) {
        self.queue.push_back(WatchItem::Gone);
        self.ended = true;
    }

    fn event(&mut self, cp: Option<&Checkpoint>, event: RunEvent) {
        if event.seq <= self.after {
            return;
        }
        if let Some(signal) = Signal::from_event(&event) {
            self.after = event.seq;
            self.queue.push_back(WatchItem::Signal { signal });
            return;
        }
        // A step done before this event's step began is reported first.
        if let Some(cp) = cp {
            if let Some(at) = cp.completed.iter().position(|s| *s == event.step) {
                self.done_through(cp, at);
            }
        }
        let last = self.steps.get(&event.step).copied();
        let new_execution = match last {
            None => true,
            Some((attempt, _, _)) => event.first || event.attempt != attempt,
        };
        if let (true, Some((_, through, _))) = (new_execution, last) {
            self.queue.push_back(WatchItem::Superseded {
                step: event.step.clone(),
                through,
            });
        }
        if new_execution {
            self.queue.push_back(WatchItem::Started {
                step: event.step.clone(),
                attempt: event.attempt,
            });
        }
        self.steps
            .insert(event.step.clone(), (event.attempt, event.seq, event.at));
        self.after = event.seq;
        self.queue.push_back(WatchItem::Event { event });
    }

    /// Reports the steps done before index `at` not reported yet.
    fn done_through(&mut self, cp: &Checkpoint, at: usize) {
        while self.seen.done < at.min(cp.completed.len()) {
            let index = self.seen.done;
            let name = &cp.completed[index];
            // Events of the step from before the execution that completed
            // it (a run again after a crash that emitted nothing, or a retry
            // that did not): superseded.
            if let (Some(&(attempt, through, last_at)), Some(&(done_attempt, started))) =
                (self.steps.get(name), self.records.get(&index))
            {
                if done_attempt > attempt || last_at < started {
                    self.queue.push_back(WatchItem::Superseded {
                        step: name.clone(),
                        through,
                    });
                    self.steps.remove(name);
                }
            }
            self.queue.push_back(WatchItem::Done {
                index,
                step: cp.completed[index].clone(),
            });
            self.seen.done += 1;
        }
    }

    fn record(&mut self, cp: &Checkpoint) {
        if cp.next < self.seen.done {
            // Rewound: report from where it now stands.
            self.seen.done = cp.next;
            self.records.retain(|i, _| *i < cp.next);
        }
        self.done_through(cp, cp.next);
        if let Some(f) = &cp.error {
            let key = (f.index, f.attempt);
            if self.seen.failure != Some(key) && f.index >= cp.next {
                self.seen.failure = Some(key);
                self.queue.push_back(WatchItem::Failed {
                    index: f.index,
                    step: f.step.clone(),
                    attempt: f.attempt,
                    error: f.message.clone(),
                    retrying: cp.status != RunStatus::Failed,
                });
            }
        }
        let last = match (cp.status, &cp.wait) {
            (RunStatus::Completed, _) => Some(WatchItem::Completed),
            (RunStatus::Waiting, Some(Wait::Gate { step, .. })) => {
                Some(WatchItem::Waiting { gate: step.clone() })
            }
            (RunStatus::Waiting, Some(Wait::Signal { step, signal, .. })) => {
                Some(WatchItem::WaitingForSignal {
                    step: step.clone(),
                    signal: signal.clone(),
                })
            }
            (RunStatus::Waiting, Some(Wait::Children { step, runs, .. })) => {
                Some(WatchItem::WaitingForChildren {
                    step: step.clone(),
                    runs: runs.clone(),
                })
            }
            (
                RunStatus::Sleeping,
                Some(Wait::Timer { step, until }) | Some(Wait::Limit { step, until, .. }),
            ) => Some(WatchItem::Sleeping {
                step: step.clone(),
                until: *until,
            }),
            (status @ (RunStatus::Failed | RunStatus::Rejected | RunStatus::Cancelled), _) => {
                Some(WatchItem::Ended { status })
            }
            _ => None,
        };
        if let Some(item) = last {
            self.queue.push_back(item);
            self.ended = true;
        }
    }
}
