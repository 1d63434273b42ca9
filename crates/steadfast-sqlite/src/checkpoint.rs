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
//! that connection), and applies its own rule once the commit's callers
//! have their answers. Past the same mark, when its commits are small (a
//! step's row, a few pages each), it checkpoints itself, as SQLite would:
//! the checkpoint is short, and one running beside the commits would slow
//! their syncs (the leader of a commit, whose own save waits until it is
//! done committing, still waits for it, as before). When its commits are
//! large (new large values), it asks a thread of the store's own, started
//! the first time, to checkpoint on a connection of its own. That
//! checkpoint is PASSIVE: it never waits for a writer or a reader and never
//! blocks one, so the callers go on to their next steps while it copies,
//! and their commits append to the log meanwhile. The log starts over from
//! its beginning only when a write transaction begins with every page of it
//! copied (and no reader still reads it), which a thread copying behind a
//! stream of commits seldom leaves it; so once the thread's pass is over,
//! the write connection copies what was appended during it itself, after
//! its next commit, and the transaction after that starts the log over.
//! Should the thread fall far behind (the log at four times the mark), the
//! write connection checkpoints itself at once. So the log stays near
//! 4,000 pages at most, plus what is committed while a pass ends, unless a
//! reader holds it (as with SQLite's own checkpoint). Another process's
//! commits count in the log's length this rule sees, but not in its count
//! of commits: they can tip a choice between the two ways, never stop
//! both.
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
use std::time::Duration;

use rusqlite::Connection;
use steadfast_core::StoreError;

/// Pages in the log at which the thread is asked to checkpoint: SQLite's
/// own mark for its automatic checkpoint.
pub(crate) const ASK_AT: i32 = 1000;

/// Pages in the log at which the write connection checkpoints itself.
pub(crate) const SELF_AT: i32 = 4 * ASK_AT;

/// Pages a commit writes on average, since the log last started over, from
/// which its checkpoints go to the thread (a new value of 64 KiB or more in
/// most commits); below it, the write connection checkpoints itself, as
/// SQLite would, but after answering its callers.
pub(crate) const HEAVY: i32 = 16;

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

/// A checkpoint of the log on `conn`, never waiting for a writer or reader.
/// Returns whether it ran: `false` when another connection was
/// checkpointing (SQLite reports that in the row, not as an error).
fn checkpoint(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(r.get::<_, i64>(0)? == 0)
    })
}

/// What checkpoints for a store's write connection: the rule applied after
/// each of its commits, and the thread (started the first time a pass is
/// asked for, so that a handle that writes no large value has none).
pub(crate) struct Checkpointer {
    path: PathBuf,
    busy_timeout: Duration,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The thread could not be started: the write connection checkpoints.
    no_thread: std::sync::atomic::AtomicBool,
    /// A deliberate defect for the tests: the thread never runs a pass.
    stalled: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Passes the thread ran.
    ran: AtomicU64,
    /// Checkpoints the write connection ran itself.
    by_writer: AtomicU64,
}

/// Passes are numbered: the write connection asks for pass `asked`, the
/// thread has run every pass up to `served`, and the write connection has
/// copied what came after each pass up to `closed` (or seen the log start
/// over after it).
#[derive(Default)]
struct State {
    asked: u64,
    served: u64,
    closed: u64,
    stop: bool,
    /// The log's length after the last commit that wrote to it, and the
    /// commits since it last started over (the write connection's own).
    pages: i32,
    commits: i32,
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
            thread: Mutex::new(None),
            no_thread: std::sync::atomic::AtomicBool::new(false),
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
    /// if it does not yet.
    fn thread_runs(&self) -> bool {
        if self.no_thread.load(Ordering::Relaxed) {
            return false;
        }
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return true;
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
                *thread = Some(t);
                true
            }
            Err(e) => {
                tracing::warn!(store = %self.path.display(), error = %e, "no checkpoint thread: the write connection checkpoints");
                self.no_thread.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    /// After a commit on the write connection `conn` whose other callers
    /// have been answered, by the log's length then: below [`ASK_AT`]
    /// nothing; at [`SELF_AT`], or when the commits since the log started
    /// over wrote fewer than [`HEAVY`] pages each (small saves, whose
    /// checkpoint is short and whose commits a concurrent one would slow),
    /// a checkpoint on `conn` at once; otherwise a pass of the thread when
    /// none is asked for, nothing while one runs, and a checkpoint on
    /// `conn` of what was appended meanwhile once it is over. A checkpoint
    /// that could not run (another was running) is tried after the next
    /// commit.
    pub(crate) fn after_commit(&self, conn: &Connection, path: &str) {
        let pages = noted_pages();
        if pages == 0 {
            // Nothing written to the log (or nothing noted): no news.
            return;
        }
        let mut state = self.state();
        if pages < state.pages {
            // The log started over: every page of it was copied.
            state.commits = 0;
            if state.served == state.asked {
                state.closed = state.asked;
            }
        }
        state.pages = pages;
        state.commits = state.commits.saturating_add(1);
        if pages < ASK_AT {
            return;
        }
        let heavy = pages / state.commits.max(1) >= HEAVY;
        if pages < SELF_AT && heavy {
            if state.served < state.asked {
                return;
            }
            if state.closed == state.asked {
                drop(state);
                if self.thread_runs() {
                    self.state().asked += 1;
                    self.shared.wake.notify_one();
                    return;
                }
                state = self.state();
            }
        }
        let served = state.served;
        drop(state);
        match checkpoint(conn) {
            Ok(true) => {
                let mut state = self.state();
                state.closed = state.closed.max(served);
                drop(state);
                self.shared.by_writer.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
            }
        }
    }

    /// Passes the thread ran, and checkpoints the write connection ran.
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
        let pass = {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while (stalled || state.served == state.asked) && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
            state.asked
        };
        // A pass that could not run (another connection checkpointing) or
        // failed (a full disk) leaves the pages in the log, where they are
        // safe; the write connection copies them after the pass.
        match checkpoint(conn) {
            Ok(true) => {
                shared.ran.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
            }
        }
        shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .served = pass;
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.state().stop = true;
        self.shared.wake.notify_one();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}
