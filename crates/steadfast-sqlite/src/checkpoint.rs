//! The log copied back into the database off the committing thread.
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
//! that connection). Past the same mark, when its commits are small (a
//! step's row, a few pages each), it checkpoints itself, as SQLite would,
//! but after answering the callers of the commit: the checkpoint is short,
//! and one running beside the commits would slow their syncs. When its
//! commits are large (new large values), it asks a thread of the store's
//! own to checkpoint on a connection of its own. That checkpoint is PASSIVE:
//! it never waits for a writer or a reader and never blocks one, so the
//! callers go on to their next steps while it copies, and their commits
//! append to the log meanwhile. The log starts over from its beginning only
//! when a write transaction begins with every page of it copied, which a
//! thread copying behind a stream of commits never leaves it; so once the
//! thread's pass is over, the write connection copies the few pages appended
//! during it itself, after answering the callers of its next commit, and the
//! transaction after that starts the log over. Should the thread fall far
//! behind (the log at four times the mark), the write connection checkpoints
//! itself at once, so the log stays bounded whatever the thread does.
//!
//! Nothing here changes what a commit promises: a commit is durable once its
//! log pages are synced (`synchronous=FULL`), and a checkpoint interrupted
//! by a crash is finished by the next connection to open the file.

use std::cell::Cell;
use std::os::raw::c_int;
use std::path::Path;
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

/// A checkpoint of the log on `conn`, never waiting for a writer or reader
/// (its row, how many pages it copied, is not needed).
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// The thread that checkpoints for a store's write connection, and its
/// counters.
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
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
/// copied what came after each pass up to `closed`.
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
    /// Starts the thread on a new connection to `path` and sets the WAL hook
    /// on `writer` (which turns off SQLite's automatic checkpoint there).
    pub(crate) fn start(
        path: &Path,
        busy_timeout: Duration,
        writer: &Connection,
    ) -> Result<Checkpointer, StoreError> {
        let conn = crate::connect(path, busy_timeout)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            ran: AtomicU64::new(0),
            by_writer: AtomicU64::new(0),
        });
        let display = path.display().to_string();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("steadfast-sqlite-checkpoint".into())
                .spawn(move || run(&conn, &shared, &display))
                .map_err(|e| {
                    StoreError::unavailable(format!(
                        "starting the checkpoint thread of {}: {e}",
                        path.display()
                    ))
                })?
        };
        writer.wal_hook(Some(note_pages));
        Ok(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// After a commit on the write connection `conn` whose callers have been
    /// answered, by the log's length then: below [`ASK_AT`] nothing; at
    /// [`SELF_AT`], or when the commits since the log started over wrote
    /// fewer than [`HEAVY`] pages each (small saves, whose checkpoint is
    /// short and whose commits a concurrent one would slow down), a
    /// checkpoint on `conn` at once; otherwise a pass of the thread when
    /// none is asked for, nothing while one runs, and a checkpoint on `conn`
    /// of what was appended meanwhile once it is over.
    pub(crate) fn after_commit(&self, conn: &Connection, path: &str) {
        let pages = noted_pages();
        if pages == 0 {
            // Nothing written to the log (or nothing noted): no news.
            return;
        }
        let mut state = self.state();
        if pages < state.pages {
            state.commits = 0;
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
                state.asked += 1;
                self.shared.wake.notify_one();
                return;
            }
        }
        state.closed = state.served;
        drop(state);
        if let Err(e) = checkpoint(conn) {
            tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
        }
        self.shared.by_writer.fetch_add(1, Ordering::Relaxed);
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
fn run(conn: &Connection, shared: &Shared, path: &str) {
    loop {
        let pass = {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while state.served == state.asked && !state.stop {
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
        // A failure (another connection checkpointing, a full disk) leaves
        // the pages in the log, where they are safe; the write connection
        // tries after the pass, and at its own mark.
        if let Err(e) = checkpoint(conn) {
            tracing::debug!(store = path, error = %e, "checkpoint of the log did not run");
        }
        shared.ran.fetch_add(1, Ordering::Relaxed);
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
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
