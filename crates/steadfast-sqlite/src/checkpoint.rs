//! When the log is copied back into the database, and by which connection.
//!
//! In WAL mode a commit appends its pages to the log, and SQLite copies them
//! back into the database file (a checkpoint, which writes them again and
//! syncs the database) once the log holds 1,000 pages: by default inside the
//! COMMIT that crossed the mark, so the callers of that commit wait for it.
//! A commit of a new large value crosses it every few megabytes, and then
//! waits for several times its own write.
//!
//! The store's write connection instead notes the log's length after each
//! commit (SQLite's WAL hook, which replaces its automatic checkpoint on
//! that connection), and applies its own rule (`Rule`) once the commit's
//! callers have their answers. Past the same mark, when its commits since
//! it last decided were small (a step's row, a few pages each), it
//! checkpoints itself, as SQLite would: the checkpoint is short, and one
//! running beside the commits would slow their syncs (the leader of a
//! commit, whose own save waits until it is done committing, still waits
//! for it, as before). When they were large (new large values), it asks a
//! thread of the store's own, started the first time, to checkpoint on a
//! connection of its own. That checkpoint is PASSIVE: it never waits for a
//! writer or a reader and never blocks one, so the callers go on to their
//! next steps while it copies, and their commits append to the log
//! meanwhile. The log starts over from its beginning only when a write
//! transaction begins with every page of it copied (and no reader still
//! reads it); when the thread's pass left pages behind, the write
//! connection copies them itself after its next commit. At four times the
//! mark the write connection checkpoints itself, after every commit until
//! one runs (while the thread's pass runs, SQLite lets only one through).
//! So the log stays near 4,000 pages, plus what is committed until a pass
//! of the thread ends, unless a reader keeps it (as with SQLite's own
//! checkpoint). Another process's commits count in the log's length this
//! rule sees: they can tip a choice between the two ways, never stop both.
//!
//! Nothing here changes what a commit promises: a commit is durable once its
//! log pages are synced (`synchronous=FULL`), and a checkpoint interrupted
//! by a crash is finished by the next connection to open the file.

use std::cell::Cell;
use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use steadfast_core::StoreError;

/// Pages in the log at which the thread is asked to checkpoint: SQLite's
/// own mark for its automatic checkpoint.
pub(crate) const ASK_AT: i32 = 1000;

/// Pages in the log at which the write connection checkpoints itself.
pub(crate) const SELF_AT: i32 = 4 * ASK_AT;

/// Pages a commit appended to the log on average, since the write
/// connection last decided, from which the next checkpoint goes to the
/// thread (a new value of 64 KiB or more in most commits); below it, the
/// write connection checkpoints itself, as SQLite would, but after
/// answering its callers.
pub(crate) const HEAVY: i64 = 16;

/// How long after a failed start of the thread the write connection
/// checkpoints itself before it tries to start one again.
const RETRY_THREAD: Duration = Duration::from_secs(60);

thread_local! {
    /// The log's length in pages after the last commit this thread made
    /// on a write connection (set by [`note_pages`] during the commit).
    static LOG_PAGES: Cell<i32> = const { Cell::new(0) };
}

/// The WAL hook of a write connection: runs on the committing thread,
/// inside its COMMIT, after the commit took place.
fn note_pages(_wal: &rusqlite::hooks::Wal, pages: c_int) -> rusqlite::Result<()> {
    LOG_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// Clears what the last commit on this thread noted; called before a COMMIT.
pub(crate) fn forget_pages() {
    LOG_PAGES.with(|p| p.set(0));
}

/// The log's length after this thread's last commit since
/// [`forget_pages`] (0 when none was noted).
pub(crate) fn noted_pages() -> i32 {
    LOG_PAGES.with(|p| p.replace(0))
}

/// What a PASSIVE checkpoint did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Another connection was checkpointing: nothing was copied (SQLite
    /// says so in its row, not as an error).
    Busy,
    /// Some pages are left in the log (appended meanwhile, or kept by a
    /// reader).
    Partial,
    /// Every page of the log was copied: the next write transaction
    /// starts it over.
    Whole,
}

/// A checkpoint of the log on `conn`, never waiting for a writer or reader.
fn checkpoint(conn: &Connection) -> rusqlite::Result<Outcome> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        let (busy, log, copied): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        Ok(if busy != 0 {
            Outcome::Busy
        } else if copied >= log {
            Outcome::Whole
        } else {
            Outcome::Partial
        })
    })
}

/// What the write connection does after a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Nothing,
    /// Ask the thread for a pass.
    Ask,
    /// Checkpoint on the write connection.
    Checkpoint,
}

/// The rule, apart from any I/O (so that its sequences can be tested): the
/// write connection's view of the log and of the thread's pass.
#[derive(Debug, Default)]
pub(crate) struct Rule {
    /// The log's length after the last commit that wrote to it.
    pages: i32,
    /// Pages appended, and commits, since the last decision (an ask or a
    /// checkpoint), to tell large commits from small ones.
    appended: i64,
    commits: i64,
    /// A pass of the thread is asked for and not over.
    running: bool,
    /// Pages may be left in the log after the last pass or checkpoint,
    /// which no pass will copy: the write connection copies them after its
    /// next commit past the mark, unless the log started over.
    behind: bool,
}

impl Rule {
    /// After a commit that left the log at `pages` pages (more than 0).
    pub(crate) fn after_commit(&mut self, pages: i32) -> Action {
        // A shorter log started over at this commit, which wrote all of it;
        // a longer one may have too (a commit larger than the log was): then
        // this counts less than was written, and a copy of a log already
        // copied may follow, which finds nothing to do.
        let appended = if pages < self.pages {
            // Every page of the log had been copied: nothing is behind.
            self.behind = false;
            pages
        } else {
            pages - self.pages
        };
        self.pages = pages;
        self.appended += i64::from(appended);
        self.commits += 1;
        if pages < ASK_AT || (self.running && pages < SELF_AT) {
            return Action::Nothing;
        }
        let heavy = self.appended / self.commits.max(1) >= HEAVY;
        self.appended = 0;
        self.commits = 0;
        if pages >= SELF_AT || self.behind || !heavy {
            return Action::Checkpoint;
        }
        self.running = true;
        Action::Ask
    }

    /// The thread could not be started: the asked-for pass is not coming.
    pub(crate) fn not_asked(&mut self) {
        self.running = false;
    }

    /// The thread's pass is over, with `outcome`. Whatever it copied,
    /// commits may have appended pages meanwhile (a pass counts only the
    /// log as it found it), and the log starts over only when a write
    /// transaction begins with all of it copied: the write connection
    /// copies the rest after its next commit, unless that commit finds the
    /// log started over.
    pub(crate) fn pass_over(&mut self, _outcome: Outcome) {
        self.running = false;
        self.behind = true;
    }

    /// A checkpoint on the write connection ended with `outcome`.
    pub(crate) fn checkpointed(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Whole => self.behind = false,
            // Tried again after the next commit.
            Outcome::Busy | Outcome::Partial => self.behind = true,
        }
    }
}

/// What checkpoints for a store's write connection: the rule applied after
/// each of its commits, and the thread (started the first time a pass is
/// asked for, so that a handle that writes no large value has none).
pub(crate) struct Checkpointer {
    path: PathBuf,
    busy_timeout: Duration,
    shared: Arc<Shared>,
    thread: Mutex<Thread>,
    /// A deliberate defect for the tests: the thread never runs a pass.
    stalled: bool,
}

#[derive(Default)]
struct Thread {
    handle: Option<JoinHandle<()>>,
    /// When a start last failed.
    failed_at: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Checkpoints the thread ran.
    ran: AtomicU64,
    /// Checkpoints the write connection ran itself.
    by_writer: AtomicU64,
}

#[derive(Default)]
struct State {
    rule: Rule,
    /// A pass waits for the thread.
    asked: bool,
    stop: bool,
}

impl Checkpointer {
    /// Sets the WAL hook on the write connection `writer` of the database at
    /// `path`, which turns off SQLite's automatic checkpoint there: from
    /// now on [`after_commit`](Self::after_commit) decides. (A later
    /// `PRAGMA wal_autocheckpoint` on that connection would replace the
    /// hook and bring SQLite's rule back: nothing sets it.)
    pub(crate) fn new(
        path: &Path,
        busy_timeout: Duration,
        writer: &Connection,
        stalled: bool,
    ) -> Checkpointer {
        writer.wal_hook(Some(note_pages));
        Checkpointer {
            path: path.to_path_buf(),
            busy_timeout,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                ran: AtomicU64::new(0),
                by_writer: AtomicU64::new(0),
            }),
            thread: Mutex::new(Thread::default()),
            stalled,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the thread runs, starting it (on a connection of its own)
    /// if it does not yet, unless a start failed within [`RETRY_THREAD`].
    fn thread_runs(&self) -> bool {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.handle.is_some() {
            return true;
        }
        if thread.failed_at.is_some_and(|t| t.elapsed() < RETRY_THREAD) {
            return false;
        }
        let started = crate::connect(&self.path, self.busy_timeout).and_then(|conn| {
            let shared = Arc::clone(&self.shared);
            let (path, stalled) = (self.path.display().to_string(), self.stalled);
            std::thread::Builder::new()
                .name("steadfast-sqlite-checkpoint".into())
                .spawn(move || run(&conn, &shared, &path, stalled))
                .map_err(|e| StoreError::unavailable(format!("starting a thread: {e}")))
        });
        match started {
            Ok(t) => {
                thread.handle = Some(t);
                true
            }
            Err(e) => {
                tracing::warn!(store = %self.path.display(), error = %e, "no checkpoint thread for now: the write connection checkpoints");
                thread.failed_at = Some(Instant::now());
                false
            }
        }
    }

    /// After a commit on the write connection `conn` whose callers have been
    /// answered (but for the leader's own, which goes on once this
    /// returns): does what `Rule::after_commit` says.
    pub(crate) fn after_commit(&self, conn: &Connection, path: &str) {
        let pages = noted_pages();
        if pages == 0 {
            // Nothing written to the log (or nothing noted): no news.
            return;
        }
        let action = self.state().rule.after_commit(pages);
        match action {
            Action::Nothing => return,
            Action::Ask => {
                if self.thread_runs() {
                    self.state().asked = true;
                    self.shared.wake.notify_one();
                    return;
                }
                self.state().rule.not_asked();
            }
            Action::Checkpoint => {}
        }
        match checkpoint(conn) {
            Ok(outcome) => {
                self.state().rule.checkpointed(outcome);
                if outcome != Outcome::Busy {
                    self.shared.by_writer.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                self.state().rule.checkpointed(Outcome::Busy);
                tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
            }
        }
    }

    /// Checkpoints the thread ran, and checkpoints the write connection ran.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.shared.ran.load(Ordering::Relaxed),
            self.shared.by_writer.load(Ordering::Relaxed),
        )
    }
}

/// The thread: a pass each time one is asked for, until the store closes.
fn run(conn: &Connection, shared: &Shared, path: &str, stalled: bool) {
    loop {
        {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while (stalled || !state.asked) && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
            state.asked = false;
        }
        // A pass that could not run (another connection checkpointing) or
        // failed (a full disk) leaves the pages in the log, where they are
        // safe; the write connection copies them after the pass.
        let outcome = match checkpoint(conn) {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
                Outcome::Busy
            }
        };
        if outcome != Outcome::Busy {
            shared.ran.fetch_add(1, Ordering::Relaxed);
        }
        shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rule
            .pass_over(outcome);
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.state().stop = true;
        self.shared.wake.notify_one();
        let handle = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .handle
            .take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits of `each` pages from a log of `rule.pages`, until the log
    /// reaches `until` pages or an action other than nothing comes.
    fn commit_until(rule: &mut Rule, each: i32, until: i32) -> Action {
        loop {
            let action = rule.after_commit(rule.pages + each);
            if action != Action::Nothing || rule.pages >= until {
                return action;
            }
        }
    }

    #[test]
    fn small_commits_are_checkpointed_by_the_write_connection_past_the_mark() {
        let mut rule = Rule::default();
        assert_eq!(commit_until(&mut rule, 2, 10_000), Action::Checkpoint);
        assert!(rule.pages >= ASK_AT && rule.pages < ASK_AT + 2);
        rule.checkpointed(Outcome::Whole);
        // The log starts over: nothing until the mark again, then the same.
        assert_eq!(rule.after_commit(2), Action::Nothing);
        assert_eq!(commit_until(&mut rule, 2, 10_000), Action::Checkpoint);
    }

    #[test]
    fn large_commits_ask_the_thread_and_wait_for_its_pass() {
        let mut rule = Rule::default();
        assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Ask);
        // While the pass runs, nothing, short of the bound.
        assert_eq!(commit_until(&mut rule, 257, SELF_AT - 257), Action::Nothing);
        // A pass, then the log started over at the next commit: the next
        // cycle asks again, however many cycles came before.
        rule.pass_over(Outcome::Whole);
        for _ in 0..50 {
            assert_eq!(rule.after_commit(257), Action::Nothing);
            assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Ask);
            rule.pass_over(Outcome::Whole);
        }
    }

    #[test]
    fn what_a_pass_left_is_copied_by_the_write_connection_after_the_next_commit() {
        for outcome in [Outcome::Whole, Outcome::Partial, Outcome::Busy] {
            let mut rule = Rule::default();
            assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Ask);
            rule.after_commit(rule.pages + 257);
            rule.pass_over(outcome);
            // The log did not start over: commits came during the pass.
            assert_eq!(
                rule.after_commit(rule.pages + 257),
                Action::Checkpoint,
                "{outcome:?}"
            );
            // Another connection was checkpointing: tried again.
            rule.checkpointed(Outcome::Busy);
            assert_eq!(rule.after_commit(rule.pages + 2), Action::Checkpoint);
            rule.checkpointed(Outcome::Whole);
            assert_eq!(rule.after_commit(257), Action::Nothing);
            assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Ask);
        }
    }

    #[test]
    fn the_write_connection_checkpoints_at_the_bound_even_while_a_pass_runs() {
        let mut rule = Rule::default();
        assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Ask);
        assert_eq!(commit_until(&mut rule, 257, 10_000), Action::Checkpoint);
        assert!(rule.pages >= SELF_AT && rule.pages < SELF_AT + 257);
    }

    #[test]
    fn a_commit_larger_than_the_log_it_follows_still_counts_as_large() {
        let mut rule = Rule::default();
        assert_eq!(rule.after_commit(900), Action::Nothing);
        rule.checkpointed(Outcome::Whole);
        // The log started over at a commit of 1,100 pages, counted as 200.
        assert_eq!(rule.after_commit(1_100), Action::Ask);
    }

    #[test]
    fn steps_that_reread_a_value_between_new_ones_are_large_on_average() {
        // W7: five new 1 MiB values and five rereads of a few pages a run;
        // each pass is over before the next commit, which starts the log
        // over.
        let mut rule = Rule::default();
        let (mut asked, mut over) = (0, false);
        for i in 0..200 {
            let each = if i % 10 < 5 { 257 } else { 2 };
            let pages = if over { each } else { rule.pages + each };
            over = false;
            match rule.after_commit(pages) {
                Action::Ask => {
                    asked += 1;
                    rule.pass_over(Outcome::Whole);
                    over = true;
                }
                Action::Checkpoint => {
                    panic!("a checkpoint fell to the write connection at commit {i}")
                }
                Action::Nothing => {}
            }
        }
        assert!(asked >= 10, "{asked} passes");
    }

    #[test]
    fn without_a_thread_the_write_connection_copies_large_commits_itself() {
        // The thread's connection cannot be opened (its path names a
        // directory that does not exist), so the thread never starts.
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("runs.db");
        drop(Connection::open(&db).unwrap());
        let writer = crate::connect(&db, Duration::from_secs(5)).unwrap();
        writer.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let cp = Checkpointer::new(
            &dir.path().join("missing").join("runs.db"),
            Duration::from_secs(5),
            &writer,
            false,
        );
        let mut largest = 0;
        let mut first_failure = None;
        for _ in 0..40 {
            writer
                .execute("INSERT INTO t VALUES (randomblob(600 * 1024))", [])
                .unwrap();
            largest = largest.max(LOG_PAGES.with(|p| p.get()));
            cp.after_commit(&writer, "runs.db");
            first_failure = first_failure.or(cp.thread.lock().unwrap().failed_at);
        }
        let thread = cp.thread.lock().unwrap();
        assert!(thread.handle.is_none() && first_failure.is_some());
        let last_failure = thread.failed_at;
        drop(thread);
        // Each large cycle past 1,000 pages asked, found no thread, and
        // the write connection copied the log: 40 commits of some 150
        // pages started it over several times, never past the mark by
        // more than a commit.
        let (ran, by_writer) = cp.counts();
        assert_eq!(ran, 0);
        assert!(by_writer >= 4, "{by_writer} checkpoints");
        assert!(largest < ASK_AT + 200, "the log reached {largest} pages");
        assert!(!cp.state().rule.running, "no pass is awaited");
        // Later asks within the minute did not try to start it again (on a
        // machine so slow that the minute passed, they may have).
        if first_failure.is_some_and(|t| t.elapsed() < RETRY_THREAD) {
            assert_eq!(last_failure, first_failure, "a start was tried again");
        }
    }
}
