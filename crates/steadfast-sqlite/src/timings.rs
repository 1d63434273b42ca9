//! Where a commit's time goes, for the benchmark harness's breakdown
//! (`steadfast-bench --workloads breakdown`). Off unless [`start`] turned it
//! on: then every commit of this process's SQLite stores adds the time of
//! each of its phases here, until [`stop`] takes the sums; a commit that
//! failed counts nowhere. Off, a commit pays one relaxed atomic load.
//!
//! The sums are the process's: time commits made one after another (as
//! the harness does). A commit whose clock started before [`stop`] (or a
//! new [`start`]) may still add to them after it.
//!
//! ```
//! use steadfast_sqlite::timings;
//! timings::start();
//! // ... saves on a SqliteStore ...
//! let phases = timings::stop();
//! assert_eq!(phases.batches, 0); // nothing was committed here
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static BATCHES: AtomicU64 = AtomicU64::new(0);
static BEGIN_NS: AtomicU64 = AtomicU64::new(0);
static STATEMENTS_NS: AtomicU64 = AtomicU64::new(0);
static COMMIT_NS: AtomicU64 = AtomicU64::new(0);
static ANSWER_NS: AtomicU64 = AtomicU64::new(0);
static LOG_NS: AtomicU64 = AtomicU64::new(0);

/// The sums of the phases of the commits made between [`start`] and
/// [`stop`], in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Transactions committed (a lone save is one; a batch of saves, one).
    pub batches: u64,
    /// Taking the write turn (the queue file's lock, SQLite's write lock)
    /// and `BEGIN IMMEDIATE`.
    pub begin_ns: u64,
    /// The members' statements, from the check of where the runs are to the
    /// last write (a leader's wait for more members included).
    pub statements_ns: u64,
    /// `COMMIT`: the WAL's frames written and synced.
    pub commit_ns: u64,
    /// Answering the members (their replies sent).
    pub answer_ns: u64,
    /// The look at the WAL's length after the commit, and the copy of the
    /// log back into the database when it is due (see the store's docs).
    pub log_ns: u64,
}

/// Zeroes the sums and turns the timings on.
pub fn start() {
    for sum in [
        &BATCHES,
        &BEGIN_NS,
        &STATEMENTS_NS,
        &COMMIT_NS,
        &ANSWER_NS,
        &LOG_NS,
    ] {
        sum.store(0, Ordering::Relaxed);
    }
    ON.store(true, Ordering::SeqCst);
}

/// Turns the timings off and returns the sums since [`start`].
pub fn stop() -> Phases {
    ON.store(false, Ordering::SeqCst);
    Phases {
        batches: BATCHES.load(Ordering::Relaxed),
        begin_ns: BEGIN_NS.load(Ordering::Relaxed),
        statements_ns: STATEMENTS_NS.load(Ordering::Relaxed),
        commit_ns: COMMIT_NS.load(Ordering::Relaxed),
        answer_ns: ANSWER_NS.load(Ordering::Relaxed),
        log_ns: LOG_NS.load(Ordering::Relaxed),
    }
}

/// The clock of one commit: `None` while the timings are off. Its laps add
/// up here and reach the sums only with the last ([`Phase::Log`]), so a
/// commit that failed counts nowhere.
pub(crate) struct Clock(Option<(Instant, [u64; 4])>);

/// The phase a [`Clock::lap`] ends.
#[derive(Clone, Copy)]
pub(crate) enum Phase {
    Begin,
    Statements,
    Commit,
    Answer,
    /// The last: the commit took place, and its laps are added.
    Log,
}

impl Clock {
    /// A clock started now, if the timings are on.
    pub(crate) fn start() -> Clock {
        Clock(ON.load(Ordering::Relaxed).then(|| (Instant::now(), [0; 4])))
    }

    /// Adds the time since the last lap to `phase`, and starts the next.
    pub(crate) fn lap(&mut self, phase: Phase) {
        let Some((since, laps)) = &mut self.0 else {
            return;
        };
        let now = Instant::now();
        let ns = u64::try_from((now - *since).as_nanos()).unwrap_or(u64::MAX);
        *since = now;
        let slot = match phase {
            Phase::Begin => 0,
            Phase::Statements => 1,
            Phase::Commit => 2,
            Phase::Answer => 3,
            Phase::Log => {
                for (sum, ns) in [&BEGIN_NS, &STATEMENTS_NS, &COMMIT_NS, &ANSWER_NS]
                    .into_iter()
                    .zip(*laps)
                {
                    sum.fetch_add(ns, Ordering::Relaxed);
                }
                LOG_NS.fetch_add(ns, Ordering::Relaxed);
                BATCHES.fetch_add(1, Ordering::Relaxed);
                self.0 = None;
                return;
            }
        };
        laps[slot] = laps[slot].saturating_add(ns);
    }
}
