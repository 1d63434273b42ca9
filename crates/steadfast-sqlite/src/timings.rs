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
/// The sums, one a [`Phase`] (in its order), then the commits counted.
static SUMS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// Where the count of commits is in [`SUMS`].
const BATCHES: usize = 5;

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
    for sum in &SUMS {
        sum.store(0, Ordering::Relaxed);
    }
    ON.store(true, Ordering::SeqCst);
}

/// Turns the timings off and returns the sums since [`start`].
pub fn stop() -> Phases {
    ON.store(false, Ordering::SeqCst);
    let sum = |i: usize| SUMS[i].load(Ordering::Relaxed);
    Phases {
        batches: sum(BATCHES),
        begin_ns: sum(Phase::Begin as usize),
        statements_ns: sum(Phase::Statements as usize),
        commit_ns: sum(Phase::Commit as usize),
        answer_ns: sum(Phase::Answer as usize),
        log_ns: sum(Phase::Log as usize),
    }
}

/// The clock of one commit: `None` while the timings are off. Its laps add
/// up here and reach the sums only with the last ([`Phase::Log`]), so a
/// commit that failed counts nowhere.
pub(crate) struct Clock(Option<(Instant, [u64; 5])>);

/// The phase a [`Clock::lap`] ends (its number: its place in [`SUMS`]).
#[derive(Clone, Copy)]
pub(crate) enum Phase {
    Begin = 0,
    Statements = 1,
    Commit = 2,
    Answer = 3,
    /// The last: the commit took place, and its laps are added.
    Log = 4,
}

impl Clock {
    /// A clock started now, if the timings are on.
    pub(crate) fn start() -> Clock {
        Clock(ON.load(Ordering::Relaxed).then(|| (Instant::now(), [0; 5])))
    }

    /// Adds the time since the last lap to `phase`, and starts the next.
    pub(crate) fn lap(&mut self, phase: Phase) {
        let Some((since, laps)) = &mut self.0 else {
            return;
        };
        let now = Instant::now();
        let ns = u64::try_from((now - *since).as_nanos()).unwrap_or(u64::MAX);
        *since = now;
        let slot = phase as usize;
        laps[slot] = laps[slot].saturating_add(ns);
        if let Phase::Log = phase {
            for (sum, ns) in SUMS.iter().zip(*laps) {
                sum.fetch_add(ns, Ordering::Relaxed);
            }
            SUMS[BATCHES].fetch_add(1, Ordering::Relaxed);
            self.0 = None;
        }
    }
}
