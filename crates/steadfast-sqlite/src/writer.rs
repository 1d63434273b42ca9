//! The single writer: whoever holds the write connection commits every queued
//! save in one transaction (group commit). A save is acknowledged only after the
//! COMMIT of its batch returned, so every acknowledged save is durable; one
//! member's conflict rolls back to its own savepoint and fails that member only.

use std::sync::{Mutex, MutexGuard, TryLockError};

use rusqlite::{params, Connection, OptionalExtension};
use steadfast_core::store::blob::Blob;
use steadfast_core::store::group::{Queue, MAX_BATCH};
use steadfast_core::store::plan::{expect_version, Known, StepRow};
use steadfast_core::store::rows::{no_row_to_fold, still_merged};
use steadfast_core::{NewEvent, StoreError};
use tokio::sync::oneshot;

use crate::error::{commit_outcome_unknown, map_err};
use crate::timings::{Clock, Phase};

/// What is known of a run's record after a save or load, as of its
/// version: the toolkit's sizes, and the stored status, workflow name and
/// head document (a save that keeps the labels need not touch them or the
/// indexes over them; one that keeps the document too need not write the
/// head at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Acct {
    pub known: Known,
    pub status: &'static str,
    pub workflow: std::sync::Arc<str>,
    pub doc: std::sync::Arc<str>,
}

/// The head of a run: the columns that `list` filters and sorts on, and one
/// JSON document with the rest (so a new checkpoint field needs no migration).
pub(crate) struct Head {
    pub workflow: String,
    pub status: &'static str,
    pub next: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub doc: String,
}

pub(crate) enum Body {
    /// Only the head changed (a lease renewal): the snapshot, the deltas and
    /// the history stay as they are.
    Head,
    /// Append one step's update to the deltas since the snapshot; `same_labels`
    /// says the status and workflow name are unchanged.
    Delta { step: StepRow, same_labels: bool },
    /// Record one step by its history row alone: the head (status, workflow
    /// name and document) is as stored at the expected version, whose sizes
    /// are given. The row carries the new version and the save's time.
    Step {
        step: StepRow,
        snapshot_bytes: u64,
        delta_bytes: u64,
        /// The save's writer number, as the head document writes it.
        writer: String,
    },
    /// Rewrite the snapshot with the full state (and record a step, if any).
    Snapshot {
        state: String,
        completed: String,
        step: Option<StepRow>,
    },
}

pub(crate) struct SaveJob {
    pub run_id: String,
    pub expected: Option<u64>,
    /// The version to write (`expected + 1`, unless imported).
    pub version: u64,
    pub head: Head,
    pub body: Body,
    /// The blobs the record refers to (written with it, each once).
    pub blobs: Vec<Blob>,
    pub reply: oneshot::Sender<Result<Acct, StoreError>>,
}

pub(crate) enum Job {
    Save(Box<SaveJob>),
    Delete {
        run_id: String,
        /// Delete only at this version (a conflict otherwise).
        expected: Option<u64>,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Replaces step records' updates, guarded by the run's version.
    Rewrite {
        run_id: String,
        expected: u64,
        /// `(idx, update_json)`.
        rows: Vec<(i64, String)>,
        /// Also delete the rows below this index (a fold).
        delete_below: Option<i64>,
        /// The blobs the new rows refer to.
        blobs: Vec<Blob>,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Appends events (checked, with their values' JSON text) to a run's
    /// log.
    Events {
        run_id: String,
        events: Vec<(NewEvent, String)>,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Writes a shared document (`value` JSON text) at `expected`, or
    /// deletes it at that version (`value` none).
    Document {
        key: String,
        value: Option<String>,
        expected: Option<u64>,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Reads durability settings back from the live write connection.
    Settings {
        reply: oneshot::Sender<Result<crate::Settings, StoreError>>,
    },
}

/// What answers a member of a batch once the batch's fate is known: its
/// own result, unless the batch failed (given as the error it fails with).
type Answer = Box<dyn FnOnce(Option<StoreError>) + Send>;

fn answer<T: Send + 'static>(
    tx: oneshot::Sender<Result<T, StoreError>>,
    result: Result<T, StoreError>,
) -> Answer {
    Box::new(move |batch: Option<StoreError>| {
        let _ = tx.send(match (result, batch) {
            (Ok(_), Some(e)) => Err(e),
            (result, _) => result,
        });
    })
}

/// The message of an error that breaks a batch: any but a conflict, which
/// a member's version check leaves without a trace.
fn breaks<T>(result: &Result<T, StoreError>) -> Option<String> {
    match result {
        Err(e) if e.kind() != steadfast_core::StoreErrorKind::Conflict => Some(e.to_string()),
        _ => None,
    }
}

/// How long a leader waits, after a shared commit, for the callers it
/// acknowledged to queue again. Long enough for all of them to run their
/// next step and come back on two busy cores: with 100 or 200 µs a commit
/// often went out before the last callers were back, and the next carried
/// only them (W2, 16 runs at a time: 35-38 µs a step); with 300 or 500 µs,
/// 28-33; with 1 ms a little slower again, as the disk idles whenever a
/// caller does not come back (its run ended) (`steadfast-bench --workloads
/// W2 --stores sqlite --reps 5`, three runs of each, interleaved). The wait
/// ends as soon as as many jobs are in as the commit carried, whoever
/// queued them, and lasts the whole window when fewer come; after a commit
/// of one job there is none.
///
/// The first job back begins the next transaction, and each later one is
/// applied as it comes (see `commit_batch`), so the statements run on one
/// core while the other callers still run their steps on the other: W2
/// 21.5 µs a step against 23.5 when all were applied after the wait
/// (medians of 12 interleaved runs of `--workloads W2 --stores sqlite
/// --reps 5` each). The write lock is held meanwhile, so the wait is made
/// only when the turn came at once, no other process holding the lock;
/// otherwise the transaction takes those back by then and commits.
const GATHER: std::time::Duration = std::time::Duration::from_micros(500);

/// How many runs [`Positions`] remembers before it starts over.
const MAX_POSITIONS: usize = 4096;

/// Where runs are (the index of their next step, their version) as this
/// write connection left them, so that recording a step need not read it
/// back. Valid only while no other connection has committed to the
/// database: `PRAGMA data_version`, read in each write transaction, tells,
/// and any change empties it. A batch that fails empties it too (what its
/// members set was rolled back). Without an entry, a save reads the run's
/// position from the database.
#[derive(Default)]
pub(crate) struct Positions {
    /// The connection's `data_version` when the entries were set; `None`:
    /// not known, so no entry is used.
    data_version: Option<i64>,
    runs: std::collections::HashMap<String, (i64, i64)>,
}

impl Positions {
    /// Inside a write transaction: keeps the entries only if no other
    /// connection has committed since they were set.
    fn check(&mut self, conn: &Connection) {
        let now = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)));
        match now {
            Ok(v) if self.data_version == Some(v) => {}
            Ok(v) => {
                self.runs.clear();
                self.data_version = Some(v);
            }
            Err(_) => self.forget_all(),
        }
    }

    pub(crate) fn forget_all(&mut self) {
        self.runs.clear();
        self.data_version = None;
    }

    fn get(&self, run_id: &str) -> Option<(i64, Option<i64>)> {
        self.data_version?;
        self.runs.get(run_id).map(|&(next, v)| (next, Some(v)))
    }

    fn set(&mut self, run_id: &str, next: i64, version: i64) {
        if self.data_version.is_none() {
            return;
        }
        if let Some(entry) = self.runs.get_mut(run_id) {
            *entry = (next, version);
            return;
        }
        if self.runs.len() >= MAX_POSITIONS {
            self.runs.clear();
        }
        self.runs.insert(run_id.to_string(), (next, version));
    }

    fn forget(&mut self, run_id: &str) {
        self.runs.remove(run_id);
    }
}

/// Saves waiting for a commit, and the connection that commits them.
pub(crate) struct Writer {
    pub queue: Queue<Job>,
    /// When the log is copied back into the database (see `checkpoint`).
    /// Declared before `conn`, so that its thread has stopped when the
    /// write connection closes.
    pub checkpointer: crate::checkpoint::Checkpointer,
    pub conn: Mutex<Connection>,
    /// Where the runs this connection recorded last are; used only under
    /// `conn`'s lock.
    pub positions: Mutex<Positions>,
    pub path: String,
    /// The longest wait for the write lock, in microseconds.
    pub longest_wait_us: std::sync::atomic::AtomicU64,
    /// Jobs that joined a transaction already begun (see `commit_batch`).
    pub joined: std::sync::atomic::AtomicU64,
    /// How long no commit by anyone may be seen before a wait gives up.
    pub stall: std::time::Duration,
    /// The sidecar file writers queue on (see `wait`).
    pub queue_file: crate::wait::WriteQueue,
    /// A deliberate defect for the tests: no queue, SQLite's busy handler only.
    pub native_busy_wait: bool,
}

impl Writer {
    /// The write connection, if no one else is committing.
    pub(crate) fn try_lead(&self) -> Option<MutexGuard<'_, Connection>> {
        match self.conn.try_lock() {
            Ok(c) => Some(c),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(p)) => {
                // A panic mid-batch: its transaction never committed and its
                // callers saw their replies dropped. Start clean.
                let c = p.into_inner();
                let _ = c.execute_batch("ROLLBACK");
                self.positions_now().forget_all();
                self.positions.clear_poison();
                self.conn.clear_poison();
                Some(c)
            }
        }
    }

    /// The positions cache (taken only under the connection's lock).
    fn positions_now(&self) -> MutexGuard<'_, Positions> {
        self.positions.lock().unwrap_or_else(|p| {
            let mut g = p.into_inner();
            g.forget_all();
            g
        })
    }

    /// Commits queued jobs until none is left. Blocking.
    pub(crate) fn lead<'a>(&'a self, mut conn: MutexGuard<'a, Connection>) {
        loop {
            // The size of the last commit, and when it ended: its callers
            // are given until then + GATHER to come back, and each is
            // applied as it comes (see `commit_batch`).
            let mut last: Option<(usize, std::time::Instant)> = None;
            loop {
                let gather = last
                    .filter(|&(n, _)| n > 1)
                    .map(|(n, ended)| (n, ended + GATHER));
                if let Some((_, until)) = gather {
                    // The first of them opens the next transaction.
                    while self.queue.is_empty() && std::time::Instant::now() < until {
                        std::thread::yield_now();
                    }
                }
                let batch = self.queue.take();
                if batch.is_empty() {
                    break;
                }
                let clock = Clock::start();
                let (committed, n) = commit_batch(&mut conn, batch, self, None, gather, clock);
                if committed {
                    self.queue.committed(n);
                }
                last = Some((n, std::time::Instant::now()));
            }
            drop(conn);
            // A job queued after the last drain by a caller that found the
            // connection taken would wait for nobody: look once more.
            if self.queue.is_empty() {
                return;
            }
            match self.try_lead() {
                Some(c) => conn = c,
                None => return,
            }
        }
    }

    /// Commits a lone job on the calling thread, without leaving the async
    /// executor: when the queue holds only that job and the write queue's
    /// lock is free at once. Gives the connection back when there is more to
    /// do (a batch, a wait for the lock, jobs queued meanwhile), for
    /// [`lead`](Self::lead) on blocking terms; `None` when all is done.
    ///
    /// The commit (its sync included) blocks this thread as a blocking call
    /// would; a runtime's other workers take the tasks queued behind it.
    pub(crate) fn commit_lone<'a>(
        &'a self,
        mut conn: MutexGuard<'a, Connection>,
    ) -> Option<MutexGuard<'a, Connection>> {
        if self.native_busy_wait || self.queue.len() != 1 {
            return Some(conn);
        }
        let clock = Clock::start();
        let turn = match self.queue_file.try_turn() {
            Ok(Some(turn)) => turn,
            // Busy, or the file cannot be had: the blocking path waits or
            // reports it.
            Ok(None) | Err(_) => return Some(conn),
        };
        // A writer that does not queue (another program on the file, a
        // connection checkpointing as it closes) may hold SQLite's own lock:
        // then too the blocking path waits, not this thread.
        if !begin_at_once(&conn, self.stall) {
            return Some(conn);
        }
        let batch = self.queue.take();
        if let (true, n) = commit_batch(&mut conn, batch, self, Some(Begun(turn)), None, clock) {
            self.queue.committed(n);
        }
        if self.queue.is_empty() {
            drop(conn);
            // As in `lead`: a job queued after the last look would wait for
            // nobody.
            if self.queue.is_empty() {
                return None;
            }
            return self.try_lead();
        }
        Some(conn)
    }

    /// Leads if no one else is. Blocking.
    pub(crate) fn drive(&self) {
        if let Some(conn) = self.try_lead() {
            self.lead(conn);
        }
    }
}

/// The write queue's turn, with the transaction begun under it.
pub(crate) struct Begun(crate::wait::Turn);

/// Begins the write transaction if SQLite's lock is free now, without its
/// busy handler's wait; the connection keeps its busy timeout `busy`.
fn begin_at_once(conn: &Connection, busy: std::time::Duration) -> bool {
    if conn.busy_timeout(std::time::Duration::ZERO).is_err() {
        return false;
    }
    let began = run_cached(conn, "BEGIN IMMEDIATE").is_ok();
    if conn.busy_timeout(busy).is_err() {
        if began {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return false;
    }
    began
}

/// Commits `batch` in one transaction and answers its members; returns
/// whether it committed, and how many jobs it took. `begun`: the caller
/// took the turn and began the transaction already.
///
/// `gather`: the size of the last commit and the end of the window its
/// callers have to come back in. Until that many jobs are in or the window
/// ends, jobs queued meanwhile join this transaction, each applied as it
/// comes: the statements run while the other callers are still on their
/// steps, not after them all. Those queued by the time the transaction
/// began join even after the window; the wait for the others (which holds
/// the write lock) is made only if the turn came at once, no other process
/// holding the lock. Nothing is answered before COMMIT returned.
///
/// `clock` times the phases for the benchmark's breakdown (see
/// [`crate::timings`]); it started before the turn was taken.
fn commit_batch(
    conn: &mut Connection,
    batch: Vec<Job>,
    writer: &Writer,
    begun: Option<Begun>,
    gather: Option<(usize, std::time::Instant)>,
    mut clock: Clock,
) -> (bool, usize) {
    let path = writer.path.as_str();
    let mut taken = batch.len();
    let mut writes = Vec::with_capacity(batch.len());
    for job in batch {
        match job {
            Job::Settings { reply } => {
                let _ = reply.send(crate::read_settings(conn, path));
            }
            other => writes.push(other),
        }
    }
    if writes.is_empty() {
        if begun.is_some() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return (false, taken);
    }
    // The turn (the queue's lock) is held until this function returns, after
    // COMMIT or ROLLBACK.
    let began = begun.is_some();
    let turn = if let Some(Begun(turn)) = begun {
        Ok(turn)
    } else if writer.native_busy_wait {
        Ok(crate::wait::Turn::none())
    } else {
        writer.queue_file.take_turn(conn, writer.stall)
    };
    let turn = match turn {
        Ok(turn) => turn,
        Err(refused) => {
            let err = crate::wait::refused_error(refused, path, writer.stall);
            for job in writes {
                fail(job, &err);
            }
            return (false, taken);
        }
    };
    if !turn.waited.is_zero() {
        let waited_us = turn.waited.as_micros() as u64;
        writer
            .longest_wait_us
            .fetch_max(waited_us, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(store = path, waited_us, "waited for the write lock");
    }
    let begin = if began {
        Ok(())
    } else {
        run_cached(conn, "BEGIN IMMEDIATE")
    };
    if let Err(e) = begin {
        let err = map_err(e, &format!("starting a write transaction on {path}"));
        for job in writes {
            fail(job, &err);
        }
        return (false, taken);
    }
    clock.lap(Phase::Begin);
    let mut positions = writer.positions_now();
    positions.check(conn);
    let mut members = Members::default();
    members.apply(conn, writes, path, &mut positions);
    if let Some((until, window)) = gather {
        let until = until.min(MAX_BATCH);
        // Those back by now join even when the window has passed (the turn
        // may have been waited for); the wait for the others holds the
        // write lock, so it is made only when the turn came at once: no
        // other process was holding the lock.
        let wait = turn.waited.is_zero();
        loop {
            if members.broken.is_some() || taken >= until {
                break;
            }
            let more = writer.queue.take_up_to(until - taken);
            if more.is_empty() {
                if !wait || std::time::Instant::now() >= window {
                    break;
                }
                std::thread::yield_now();
                continue;
            }
            taken += more.len();
            members.join(conn, more, path, &mut positions);
        }
    }
    let Members {
        replies,
        skipped,
        broken,
        joined,
    } = members;
    if broken.is_some() {
        // Rolled back below: what this batch set is not so.
        positions.forget_all();
    }
    let failure = match broken {
        Some(first) => {
            let _ = conn.execute_batch("ROLLBACK");
            Some((
                false,
                format!("a write to {path} failed, so its batch was rolled back: {first}"),
            ))
        }
        None => {
            crate::checkpoint::forget_pages();
            clock.lap(Phase::Statements);
            let committed = run_cached(conn, "COMMIT");
            clock.lap(Phase::Commit);
            committed.err().map(|e| {
                positions.forget_all();
                let unknown = commit_outcome_unknown(&e);
                let message = format!("committing to {path}: {e}");
                let _ = conn.execute_batch("ROLLBACK");
                (unknown, message)
            })
        }
    };
    drop(positions);
    if let Some((_, message)) = &failure {
        let err = StoreError::unavailable(message.clone());
        for job in skipped {
            fail(job, &err);
        }
    }
    // Members that failed on their own keep their own error; the others share
    // the batch's fate.
    for (run_id, reply) in replies {
        reply(failure.as_ref().map(|(unknown, message)| match unknown {
            true => StoreError::OutcomeUnknown {
                run_id,
                source: message.clone().into(),
            },
            false => StoreError::unavailable(message.clone()),
        }));
    }
    if failure.is_none() {
        clock.lap(Phase::Answer);
        writer
            .joined
            .fetch_add(joined as u64, std::sync::atomic::Ordering::Relaxed);
        // Every caller answered (the leader's own goes on once this
        // returns), the log's length decides whether to copy it back.
        writer.checkpointer.after_commit(conn, path);
        clock.lap(Phase::Log);
    }
    (failure.is_none(), taken)
}

/// The members of a batch applied so far: their answers for after COMMIT,
/// those not applied, and the first error that broke the batch.
#[derive(Default)]
struct Members {
    replies: Vec<(String, Answer)>,
    /// Members after one that broke the batch are not applied: it is
    /// rolled back (SQLite may have rolled it back already, on a full disk
    /// or an I/O error, and would commit each later statement on its own).
    skipped: Vec<Job>,
    broken: Option<String>,
    /// Members applied after the transaction began (see `commit_batch`).
    joined: usize,
}

impl Members {
    /// Applies `jobs` in order, each checking its version before it writes
    /// anything, so that a conflict leaves no trace and fails that member
    /// only; a write that fails after that would leave a member half
    /// applied, so it breaks the batch, which is rolled back whole. A
    /// settings job is answered as it comes, whatever the batch's fate.
    fn apply(&mut self, conn: &Connection, jobs: Vec<Job>, path: &str, positions: &mut Positions) {
        for job in jobs {
            if self.broken.is_some() && !matches!(job, Job::Settings { .. }) {
                self.skipped.push(job);
                continue;
            }
            if let Some((run_id, reply, broke)) = apply_job(conn, job, path, positions) {
                self.broken = broke;
                self.replies.push((run_id, reply));
            }
        }
    }

    /// [`apply`](Self::apply) for jobs that join the transaction begun,
    /// counting those applied.
    fn join(&mut self, conn: &Connection, jobs: Vec<Job>, path: &str, positions: &mut Positions) {
        let before = self.replies.len();
        self.apply(conn, jobs, path, positions);
        self.joined += self.replies.len() - before;
    }
}

/// Applies one member of a batch inside its transaction: its key (a run
/// id or a document's), its answer for after COMMIT, and the message of an
/// error that breaks the batch, if it broke it (see [`breaks`]). A
/// settings job is answered at once: `None`.
fn apply_job(
    conn: &Connection,
    job: Job,
    path: &str,
    positions: &mut Positions,
) -> Option<(String, Answer, Option<String>)> {
    Some(match job {
        Job::Save(save) => {
            let result = apply_save(conn, &save, path, positions);
            member(save.run_id, save.reply, result)
        }
        Job::Delete {
            run_id,
            expected,
            reply,
        } => {
            positions.forget(&run_id);
            let result = apply_delete(conn, &run_id, expected, path);
            member(run_id, reply, result)
        }
        Job::Rewrite {
            run_id,
            expected,
            rows,
            delete_below,
            blobs,
            reply,
        } => {
            positions.forget(&run_id);
            // In a savepoint: whatever goes wrong fails this member
            // alone and leaves nothing of it, not the batch.
            let result = conn
                .execute_batch("SAVEPOINT rewrite")
                .map_err(|e| map_err(e, &format!("rewriting the history of run {run_id:?}")))
                .and_then(|()| {
                    apply_rewrite(conn, &run_id, expected, &rows, delete_below, &blobs, path)
                });
            let closed = match &result {
                Ok(_) => conn.execute_batch("RELEASE rewrite"),
                Err(_) => conn.execute_batch("ROLLBACK TO rewrite; RELEASE rewrite"),
            };
            let broke = closed.err().map(|e| e.to_string());
            (run_id, answer(reply, result), broke)
        }
        Job::Events {
            run_id,
            events,
            reply,
        } => {
            let result = apply_events(conn, &run_id, &events, path);
            member(run_id, reply, result)
        }
        Job::Document {
            key,
            value,
            expected,
            reply,
        } => {
            let result = apply_document(conn, &key, value.as_deref(), expected, path);
            member(key, reply, result)
        }
        Job::Settings { reply } => {
            let _ = reply.send(crate::read_settings(conn, path));
            return None;
        }
    })
}

/// A member applied: its key, its answer for after COMMIT, and the message
/// of its error if that breaks the batch (see [`breaks`]).
fn member<T: Send + 'static>(
    key: String,
    reply: oneshot::Sender<Result<T, StoreError>>,
    result: Result<T, StoreError>,
) -> (String, Answer, Option<String>) {
    let broke = breaks(&result);
    (key, answer(reply, result), broke)
}

/// Runs a statement without parameters or rows, prepared once per
/// connection (the transaction's BEGIN and COMMIT, on every commit).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn fail(job: Job, err: &StoreError) {
    let copy = || StoreError::backend(err.kind(), err.to_string());
    match job {
        Job::Save(s) => drop(s.reply.send(Err(copy()))),
        Job::Delete { reply, .. } | Job::Rewrite { reply, .. } => drop(reply.send(Err(copy()))),
        Job::Events { reply, .. } => drop(reply.send(Err(copy()))),
        Job::Document { reply, .. } => drop(reply.send(Err(copy()))),
        Job::Settings { reply } => drop(reply.send(Err(copy()))),
    }
}

/// A head write that takes a run's progress rows in (see `apply_save`).
struct Fold {
    /// The head's own `next` and version, as its row stores them.
    head_next: i64,
    head_version: i64,
    /// Where the rows leave the run, and their updates' size.
    next: i64,
    bytes: i64,
}

/// Applies one save. Its version is checked before anything is written
/// (by the write statement's own condition, or, for a step recorded by its
/// history row alone, against where the run is), so a conflict writes
/// nothing.
fn apply_save(
    conn: &Connection,
    job: &SaveJob,
    path: &str,
    positions: &mut Positions,
) -> Result<Acct, StoreError> {
    let ctx = |what: &str| format!("{what} run {:?} in {path}", job.run_id);
    let version = job.version;
    let expected = job.expected;
    let h = &job.head;
    let acct = |next: usize, snapshot_bytes: u64, delta_bytes: u64| Acct {
        known: Known::new(version, next, snapshot_bytes, delta_bytes),
        status: h.status,
        workflow: std::sync::Arc::<str>::from(h.workflow.as_str()),
        doc: std::sync::Arc::<str>::from(h.doc.as_str()),
    };
    // Sizes the statement returns are only the delta budget's bookkeeping:
    // one that does not read back (a damaged row) counts as none, so that
    // the next save writes a snapshot, and never fails this batch.
    let size = |v: i64| u64::try_from(v).unwrap_or(0);
    let own_next = usize::try_from(h.next).unwrap_or(usize::MAX);
    // A save that writes the head takes the run's progress rows into it, in
    // its own statement: the save's expectation is checked against where
    // the rows leave the run, the statement's version check against the
    // head's own columns (which no one can change in between: this
    // transaction holds the write lock), and the rows' `next` and sizes go
    // into the head it writes.
    let mut fold: Option<Fold> = None;
    if !matches!(job.body, Body::Step { .. }) {
        // Set again below once written.
        positions.forget(&job.run_id);
        if let Some(expected) = expected {
            if let Some(a) = crate::progress::ahead(conn, &job.run_id, path)? {
                let p = &a.progress;
                if u64::try_from(p.version).ok() != Some(expected) {
                    return Err(conflict(conn, job, path));
                }
                if i64::try_from(version).is_ok_and(|v| v > p.version) {
                    fold = Some(Fold {
                        head_next: a.head_next,
                        head_version: a.head_version,
                        next: p.next,
                        bytes: p.bytes,
                    });
                } else {
                    // A version that does not rise above the rows' (an
                    // import's) would trip the trigger that keeps older
                    // builds off them: take them in first.
                    crate::progress::absorb(conn, &job.run_id, path)?;
                }
            }
        }
    }
    // What the statement's version check compares with.
    let cas: Option<i64> = match (&fold, expected) {
        (Some(f), _) => Some(f.head_version),
        (None, Some(e)) => Some(i64::try_from(e).map_err(|_| conflict(conn, job, path))?),
        (None, None) => None,
    };
    let saved = match &job.body {
        Body::Step {
            step,
            snapshot_bytes,
            delta_bytes,
            writer,
        } => {
            let added = match expected {
                Some(expected) => insert_progress(
                    conn,
                    positions,
                    &job.run_id,
                    step,
                    version,
                    h.updated_at,
                    writer,
                    expected,
                )
                .map_err(|e| map_err(e, &ctx("recording a step of")))?,
                None => 0,
            };
            if added == 0 {
                return Err(conflict(conn, job, path));
            }
            acct(
                own_next,
                *snapshot_bytes,
                delta_bytes + step.update.len() as u64,
            )
        }
        Body::Head => {
            // The stored steps (and so `next`) stay; everything else of the
            // head, the workflow's name included, is written.
            let row: Option<(i64, i64, i64)> = conn
                .prepare_cached(
                    "UPDATE runs SET workflow = ?2, status = ?3, version = ?4, created_at = ?5,
                        updated_at = ?6, head = ?7, next = coalesce(?9, next),
                        delta_bytes = delta_bytes + ?10
                     WHERE run_id = ?1 AND version = ?8
                     RETURNING snapshot_bytes, delta_bytes, next",
                )
                .and_then(|mut st| {
                    st.query_row(
                        params![
                            job.run_id,
                            h.workflow,
                            h.status,
                            version,
                            h.created_at,
                            h.updated_at,
                            h.doc,
                            cas,
                            fold.as_ref().map(|f| f.next),
                            fold.as_ref().map_or(0, |f| f.bytes),
                        ],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()
                })
                .map_err(|e| map_err(e, &ctx("updating the head of")))?;
            let Some((snapshot_bytes, delta_bytes, next)) = row else {
                return Err(conflict(conn, job, path));
            };
            acct(
                usize::try_from(size(next)).unwrap_or(usize::MAX),
                size(snapshot_bytes),
                size(delta_bytes),
            )
        }
        Body::Delta { step, same_labels } => {
            // The head's stored `next` is checked; with rows ahead of it,
            // where they leave the run must be this step.
            let step_at = i64::try_from(step.index).unwrap_or(i64::MAX);
            let head_next = match &fold {
                Some(f) if f.next != step_at => return Err(conflict(conn, job, path)),
                Some(f) => f.head_next,
                None => step_at,
            };
            let sql = if *same_labels {
                "UPDATE runs SET next = ?4, version = ?5, updated_at = ?6, head = ?7,
                    delta_bytes = delta_bytes + ?8
                 WHERE run_id = ?1 AND version = ?9 AND next = ?10 AND ?2 IS NOT NULL AND ?3 IS NOT NULL
                 RETURNING snapshot_bytes, delta_bytes"
            } else {
                "UPDATE runs SET workflow = ?2, status = ?3, next = ?4, version = ?5, updated_at = ?6,
                    head = ?7, delta_bytes = delta_bytes + ?8
                 WHERE run_id = ?1 AND version = ?9 AND next = ?10
                 RETURNING snapshot_bytes, delta_bytes"
            };
            let sizes: Option<(i64, i64)> = conn
                .prepare_cached(sql)
                .and_then(|mut st| {
                    sizes_of(
                        &mut st,
                        params![
                            job.run_id,
                            h.workflow,
                            h.status,
                            h.next,
                            version,
                            h.updated_at,
                            h.doc,
                            (step.update.len() as i64)
                                .saturating_add(fold.as_ref().map_or(0, |f| f.bytes)),
                            cas,
                            head_next,
                        ],
                    )
                })
                .map_err(|e| map_err(e, &ctx("updating")))?;
            let Some((snapshot_bytes, delta_bytes)) = sizes else {
                return Err(conflict(conn, job, path));
            };
            insert_step(conn, &job.run_id, step)
                .map_err(|e| map_err(e, &ctx("recording a step of")))?;
            acct(own_next, size(snapshot_bytes), size(delta_bytes))
        }
        Body::Snapshot {
            state,
            completed,
            step,
        } => {
            let sql = if expected.is_none() {
                "INSERT INTO runs (run_id, workflow, status, next, version, created_at, updated_at,
                    head, snapshot, snapshot_steps, snapshot_next, snapshot_bytes, delta_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?4, ?11, 0)
                 ON CONFLICT (run_id) DO NOTHING"
            } else {
                "UPDATE runs SET workflow = ?2, status = ?3, next = ?4, version = ?5,
                    created_at = ?6, updated_at = ?7, head = ?8, snapshot = ?9,
                    snapshot_steps = ?10, snapshot_next = ?4, snapshot_bytes = ?11, delta_bytes = 0
                 WHERE run_id = ?1 AND version = ?12"
            };
            let changed = conn
                .prepare_cached(sql)
                .and_then(|mut st| {
                    let values = params![
                        job.run_id,
                        h.workflow,
                        h.status,
                        h.next,
                        version,
                        h.created_at,
                        h.updated_at,
                        h.doc,
                        state,
                        completed,
                        state.len() as i64,
                        cas,
                    ];
                    // The INSERT has no ?12; SQLite refuses unused parameters.
                    let n = if expected.is_none() { 11 } else { 12 };
                    st.execute(&values[..n])
                })
                .map_err(|e| map_err(e, &ctx("writing")))?;
            if changed == 0 {
                return Err(conflict(conn, job, path));
            }
            if expected.is_some() {
                // A fresh run has no history; a rewritten one keeps only the
                // steps below its `next`.
                conn.prepare_cached("DELETE FROM steps WHERE run_id = ?1 AND idx >= ?2")
                    .and_then(|mut st| st.execute(params![job.run_id, h.next]))
                    .map_err(|e| map_err(e, &ctx("trimming the history of")))?;
            }
            if let Some(step) = step.as_ref().filter(|s| s.index < own_next) {
                insert_step(conn, &job.run_id, step)
                    .map_err(|e| map_err(e, &ctx("recording a step of")))?;
            }
            acct(own_next, state.len() as u64, 0)
        }
    };
    // After the record's own write, which checked its version: a conflict
    // has written nothing.
    crate::blobs::write(conn, &job.run_id, &job.blobs)
        .map_err(|e| map_err(e, &ctx("storing the large values of")))?;
    // Where the run now is: after a history row (set by `insert_progress`),
    // or at the head's `next`, which a delta or snapshot save wrote with no
    // history row at or after it (a lone head write keeps the stored
    // `next`: it is read again when needed).
    // A new run's snapshot is not remembered: a save of a run that is not
    // there does not look for history rows left under its id (damage from
    // outside), which the next step's look then finds.
    if matches!(job.body, Body::Delta { .. })
        || matches!(job.body, Body::Snapshot { .. }) && expected.is_some()
    {
        if let Ok(v) = i64::try_from(version) {
            positions.set(&job.run_id, h.next, v);
        }
    }
    // A new snapshot of a stored run (a rewind's included, which drops
    // history rows) may have replaced the last reference to some blobs:
    // count again, if the run refers to any.
    let replaced = matches!(job.body, Body::Snapshot { .. })
        && expected.is_some()
        && crate::blobs::holds_any(conn, &job.run_id)
            .map_err(|e| map_err(e, &ctx("counting the blobs of")))?;
    if replaced {
        crate::blobs::recount(conn, &job.run_id, path)?;
    }
    Ok(saved)
}

/// Runs an UPDATE ... RETURNING snapshot_bytes, delta_bytes: `None` when no
/// row matched (a conflict).
fn sizes_of(
    st: &mut rusqlite::CachedStatement<'_>,
    params: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<Option<(i64, i64)>> {
    st.query_row(params, |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

/// The version of run `run_id` as stored (`None`: absent): its last
/// progress row's, if it has any, or its head's.
fn stored_version(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT coalesce((SELECT s.version FROM steps s WHERE s.run_id = r.run_id AND s.idx >= r.next
                          ORDER BY s.idx DESC LIMIT 1), r.version)
         FROM runs r WHERE r.run_id = ?1",
    )
    .and_then(|mut st| st.query_row([run_id], |r| r.get(0)).optional())
}

/// Records step `s` of run `run_id` by its row alone, at version `version`
/// with the save's time and writer number (as the head document writes it),
/// if the run is at version `expected` and the step is its next: the head's
/// own `next` and version when the run has no progress rows, else the last
/// progress row's. Returns 0 on a conflict, writing nothing.
///
/// Where the run is comes from `positions` when this connection wrote it
/// last and no other has committed since, else from two point reads; then a
/// plain insert. All inside the write transaction that holds SQLite's write
/// lock, so no one writes between the look and the insert. (One
/// `INSERT … SELECT` that read the history it inserted into made SQLite copy
/// the selected row to a scratch table first: it cost more than both reads
/// and the insert.)
#[allow(clippy::too_many_arguments)]
fn insert_progress(
    conn: &Connection,
    positions: &mut Positions,
    run_id: &str,
    s: &StepRow,
    version: u64,
    saved_at: i64,
    writer: &str,
    expected: u64,
) -> rusqlite::Result<usize> {
    let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let idx = to_i64(s.index as u64);
    let at = match positions.get(run_id) {
        Some(at) => Some(at),
        None => position(conn, run_id)?,
    };
    if at != Some((idx, Some(to_i64(expected)))) {
        positions.forget(run_id);
        return Ok(0);
    }
    let added = conn
        .prepare_cached(
            "INSERT INTO steps (run_id, idx, name, update_json, attempt, started_at, finished_at,
            duration_ms, version, saved_at, writer)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?
        .execute(params![
            run_id,
            idx,
            s.name,
            s.update,
            s.attempt,
            to_i64(s.started_at),
            to_i64(s.finished_at),
            to_i64(s.finished_at.saturating_sub(s.started_at)),
            to_i64(version),
            saved_at,
            writer,
        ])?;
    positions.set(run_id, idx.saturating_add(1), to_i64(version));
    Ok(added)
}

/// Where run `run_id` is as stored (`None`: absent): the index of its next
/// step and its version; after its last progress row if it has any (a
/// history row at or after the head's `next`), else the head's own. A
/// progress row without a version (damaged) gives `None` as the version,
/// which no save expects.
fn position(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<(i64, Option<i64>)>> {
    let Some((next, head_version)) = crate::progress::head_at(conn, run_id)? else {
        return Ok(None);
    };
    let last: Option<(i64, Option<i64>)> = conn
        .prepare_cached(
            "SELECT idx, version FROM steps WHERE run_id = ?1 ORDER BY idx DESC LIMIT 1",
        )?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(Some(match last {
        Some((idx, version)) if idx >= next => (idx.saturating_add(1), version),
        _ => (next, Some(head_version)),
    }))
}

/// The conflict error for a save that matched no row, with the version found.
fn conflict(conn: &Connection, job: &SaveJob, path: &str) -> StoreError {
    match stored_version(conn, &job.run_id) {
        Ok(found) => {
            let found = found.and_then(|v| u64::try_from(v).ok());
            steadfast_core::store::plan::conflict(&job.run_id, job.expected, found)
        }
        Err(e) => map_err(e, &format!("reading run {:?} in {path}", job.run_id)),
    }
}

fn insert_step(conn: &Connection, run_id: &str, s: &StepRow) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO steps (run_id, idx, name, update_json, attempt, started_at, finished_at, duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        run_id,
        s.index as i64,
        s.name,
        s.update,
        s.attempt,
        s.started_at as i64,
        s.finished_at as i64,
        s.finished_at.saturating_sub(s.started_at) as i64,
    ])
}

/// Replaces the updates of history rows below `next`, if the run is still at
/// `expected`; a conflict writes nothing.
fn apply_rewrite(
    conn: &Connection,
    run_id: &str,
    expected: u64,
    rows: &[(i64, String)],
    delete_below: Option<i64>,
    blobs: &[Blob],
    path: &str,
) -> Result<bool, StoreError> {
    let ctx = format!("rewriting the history of run {run_id:?} in {path}");
    crate::progress::absorb(conn, run_id, path)?;
    // Rows from `snapshot_next` on are merged into the state by a load: they
    // are not history yet (the next save without a step snapshots them).
    let found: Option<(i64, i64)> = conn
        .prepare_cached("SELECT version, snapshot_next FROM runs WHERE run_id = ?1")
        .and_then(|mut st| {
            st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(|e| map_err(e, &ctx))?;
    let found_version = found.and_then(|(v, _)| u64::try_from(v).ok());
    expect_version(run_id, expected, found_version)?;
    let next = found.map_or(0, |(_, next)| next);
    if let Some((idx, _)) = rows.iter().find(|(idx, _)| *idx >= next) {
        return Err(still_merged(run_id, *idx as u64, next.max(0) as u64));
    }
    let mut st = conn
        .prepare_cached("UPDATE steps SET update_json = ?3 WHERE run_id = ?1 AND idx = ?2")
        .map_err(|e| map_err(e, &ctx))?;
    for (idx, text) in rows {
        let n = st
            .execute(params![run_id, idx, text])
            .map_err(|e| map_err(e, &ctx))?;
        if n == 0 && delete_below.is_some() {
            return Err(no_row_to_fold(run_id, *idx as u64));
        }
    }
    if let Some(below) = delete_below {
        conn.prepare_cached("DELETE FROM steps WHERE run_id = ?1 AND idx < ?2")
            .and_then(|mut st| st.execute(params![run_id, below]))
            .map_err(|e| map_err(e, &ctx))?;
    }
    crate::blobs::write(conn, run_id, blobs).map_err(|e| map_err(e, &ctx))?;
    // The rows replaced may have been the last to refer to some blobs.
    crate::blobs::recount(conn, run_id, path)?;
    Ok(true)
}

/// Appends checked events after the run's last; returns the last number.
fn apply_events(
    conn: &Connection,
    run_id: &str,
    events: &[(NewEvent, String)],
    path: &str,
) -> Result<u64, StoreError> {
    let ctx = || format!("appending events to run {run_id:?} in {path}");
    let last: i64 = conn
        .prepare_cached("SELECT coalesce(max(seq), 0) FROM events WHERE run_id = ?1")
        .and_then(|mut st| st.query_row([run_id], |r| r.get(0)))
        .map_err(|e| map_err(e, &ctx()))?;
    let mut seq = last;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO events (run_id, seq, step, attempt, at, first, value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(|e| map_err(e, &ctx()))?;
    for (e, text) in events {
        seq += 1;
        insert
            .execute(params![
                run_id,
                seq,
                e.step,
                e.attempt,
                steadfast_core::store::to_i64(run_id, "an event's time", e.at.unix_millis())?,
                e.first,
                text
            ])
            .map_err(|err| map_err(err, &ctx()))?;
    }
    Ok(seq as u64)
}

/// Writes document `key` as `value` (deletes it when `None`) if its version
/// is `expected`; returns the new version (a delete: 1 when it deleted, 0
/// when nothing was at that version). A write at another version is a
/// conflict and writes nothing.
fn apply_document(
    conn: &Connection,
    key: &str,
    value: Option<&str>,
    expected: Option<u64>,
    path: &str,
) -> Result<u64, StoreError> {
    let ctx = || format!("writing document {key:?} in {path}");
    // (A version past i64's range is never stored: it conflicts.)
    let expected_i = expected.map(|v| i64::try_from(v).unwrap_or(i64::MAX).min(i64::MAX - 1));
    let Some(value) = value else {
        let n = conn
            .prepare_cached("DELETE FROM documents WHERE key = ?1 AND version = ?2")
            .and_then(|mut st| st.execute(params![key, expected_i]))
            .map_err(|e| map_err(e, &ctx()))?;
        return Ok(n as u64);
    };
    let n = match expected_i {
        None => conn
            .prepare_cached(
                "INSERT INTO documents (key, value, version) VALUES (?1, ?2, 1)                  ON CONFLICT (key) DO NOTHING",
            )
            .and_then(|mut st| st.execute(params![key, value])),
        Some(v) => conn
            .prepare_cached(
                "UPDATE documents SET value = ?2, version = ?3 WHERE key = ?1 AND version = ?3 - 1",
            )
            .and_then(|mut st| st.execute(params![key, value, v + 1])),
    }
    .map_err(|e| map_err(e, &ctx()))?;
    if n == 0 {
        let found: Option<i64> = conn
            .prepare_cached("SELECT version FROM documents WHERE key = ?1")
            .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
            .map_err(|e| map_err(e, &ctx()))?;
        return Err(StoreError::Conflict {
            run_id: key.to_string(),
            expected,
            found: found.and_then(|v| u64::try_from(v).ok()),
        });
    }
    Ok(expected.map_or(1, |v| v + 1))
}

fn apply_delete(
    conn: &Connection,
    run_id: &str,
    expected: Option<u64>,
    path: &str,
) -> Result<bool, StoreError> {
    let ctx = format!("deleting run {run_id:?} in {path}");
    if let Some(expected) = expected {
        // Checked before anything is deleted: a conflict leaves no trace
        // (and damaged progress rows are reported, not deleted unseen).
        crate::progress::absorb(conn, run_id, path)?;
        let found = stored_version(conn, run_id).map_err(|e| map_err(e, &ctx))?;
        let Some(found) = found else { return Ok(false) };
        expect_version(run_id, expected, u64::try_from(found).ok())?;
    }
    crate::blobs::release(conn, run_id).map_err(|e| map_err(e, &ctx))?;
    // Events may be there without the run (emitted before its first save).
    conn.prepare_cached("DELETE FROM events WHERE run_id = ?1")
        .and_then(|mut st| st.execute([run_id]))
        .map_err(|e| map_err(e, &ctx))?;
    conn.prepare_cached("DELETE FROM steps WHERE run_id = ?1")
        .and_then(|mut st| st.execute([run_id]))
        .map_err(|e| map_err(e, &ctx))?;
    let n = conn
        .prepare_cached("DELETE FROM runs WHERE run_id = ?1")
        .and_then(|mut st| st.execute([run_id]))
        .map_err(|e| map_err(e, &ctx))?;
    Ok(n > 0)
}
