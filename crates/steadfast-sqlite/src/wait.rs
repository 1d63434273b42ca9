//! Waiting for the database's write lock without starving.
//!
//! SQLite's own busy handler sleeps longer the longer a connection has waited
//! (up to 100 ms a try), so under heavy load a writer that has waited long
//! keeps losing the lock to newcomers, and fails after `busy_timeout` even
//! though the store is busy only because others are committing. Polling more
//! often instead costs so much CPU, with hundreds of waiting processes, that
//! the lock's holder is starved of it.
//!
//! So writers queue first, in the kernel: each takes an exclusive `flock` on
//! the sidecar file `DB-writer` (0600) before `BEGIN IMMEDIATE` and keeps it
//! until its transaction ends. A blocked waiter sleeps without polling and has
//! the same chance as a newcomer whenever the lock is released. The wait is
//! bounded by progress: it gives up only when no one has committed for
//! `busy_timeout` (a holder that hangs, such as a stopped process), or after
//! [`MAX_WRITE_WAIT`] in all.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use steadfast_core::{StoreError, StoreErrorKind};

/// The longest any one write waits for its turn while others make progress.
pub const MAX_WRITE_WAIT: Duration = Duration::from_secs(600);

/// How often a waiter looks whether others still commit.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The queue's sidecar file of the database at `db`.
pub(crate) fn queue_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-writer");
    PathBuf::from(p)
}

/// A counter that changes whenever another connection commits.
fn data_version(conn: &Connection) -> Option<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0)).ok()
}

/// Why a turn could not be had.
pub(crate) enum Refused {
    /// The sidecar file could not be opened or locked.
    Io(std::io::Error),
    /// No one committed for `stall` (`false`), or the wait passed
    /// [`MAX_WRITE_WAIT`] (`true`); how long it waited.
    Stalled(Duration, bool),
}

/// The turn to write: the queue's lock, held until this is dropped.
pub(crate) struct Turn {
    file: Option<Arc<File>>,
    /// How long it took to get.
    pub waited: Duration,
}

impl Turn {
    /// No turn at all (the `native_busy_wait` mutant).
    pub(crate) fn none() -> Turn {
        Turn {
            file: None,
            waited: Duration::ZERO,
        }
    }

    fn held(file: Arc<File>, waited: Duration) -> Turn {
        Turn {
            file: Some(file),
            waited,
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // The kept file stays open: its lock must be given back by hand.
        if let Some(file) = self.file.take() {
            let _ = file.unlock();
        }
    }
}

/// Whether the locked `file` is still the file at `path` (not removed or
/// replaced meanwhile, which would split the queue in two).
fn still_there(file: &File, path: &Path) -> bool {
    identity(file).is_some_and(|id| at_path(id, path))
}

/// A file's device and inode.
type Identity = (u64, u64);

/// The identity of an open file (which never changes while it is open).
fn identity(file: &File) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Whether the file with identity `id` is the one at `path` (so it is not
/// removed, replaced or moved away): one look at the path.
fn at_path(id: Identity, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id)
}

/// The write queue of one database: its sidecar file, kept open between
/// turns so that a turn had without waiting costs a lock and a look at the
/// file, not an open and a close besides. Every caller holds the store's
/// write connection while it holds a turn: two turns on the kept file at
/// once would share its lock.
pub(crate) struct WriteQueue {
    path: PathBuf,
    /// The kept file and its identity.
    kept: Mutex<Option<(Arc<File>, Identity)>>,
}

impl WriteQueue {
    /// The queue of the database at `db`.
    pub(crate) fn of(db: &Path) -> WriteQueue {
        WriteQueue {
            path: queue_path(db),
            kept: Mutex::new(None),
        }
    }

    /// The turn, if it can be had without waiting: `None` when another
    /// writer holds it (or the kept file was removed or replaced: the
    /// waiting path opens the file that is there now).
    pub(crate) fn try_turn(&self) -> Result<Option<Turn>, Refused> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let (file, id) = match &*kept {
            Some((file, id)) => (Arc::clone(file), *id),
            None => {
                let file = open_queue(&self.path)?;
                let id = identity(&file).ok_or_else(|| {
                    Refused::Io(std::io::Error::other("the queue file cannot be looked at"))
                })?;
                let (file, id) = kept.insert((Arc::new(file), id));
                (Arc::clone(file), *id)
            }
        };
        match file.try_lock() {
            Ok(()) => {
                // The file removed, replaced or moved away since it was
                // opened: the queue is on the file at the path now.
                if at_path(id, &self.path) {
                    return Ok(Some(Turn::held(file, Duration::ZERO)));
                }
                let _ = file.unlock();
                *kept = None;
                Ok(None)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                *kept = None;
                Err(Refused::Io(e))
            }
        }
    }

    /// Waits for this writer's turn as the module's documentation describes.
    pub(crate) fn take_turn(&self, conn: &Connection, stall: Duration) -> Result<Turn, Refused> {
        if let Some(turn) = self.try_turn()? {
            return Ok(turn);
        }
        let queue = self.path.as_path();
        let start = Instant::now();
        // A queue file removed or replaced while it was awaited: queue again
        // on the file that is there now.
        for _ in 0..8 {
            let turn = wait_for_turn(queue, conn, stall, start)?;
            if turn.file.as_ref().is_some_and(|f| still_there(f, queue)) {
                return Ok(turn);
            }
        }
        Err(Refused::Io(std::io::Error::other(
            "the write queue's file keeps being replaced",
        )))
    }
}

fn open_queue(queue: &Path) -> Result<File, Refused> {
    steadfast_core::local::no_follow(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600),
    )
    .open(queue)
    .map_err(Refused::Io)
}

fn wait_for_turn(
    queue: &Path,
    conn: &Connection,
    stall: Duration,
    start: Instant,
) -> Result<Turn, Refused> {
    let file = open_queue(queue)?;
    match file.try_lock() {
        Ok(()) => return Ok(Turn::held(Arc::new(file), Duration::ZERO)),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => return Err(Refused::Io(e)),
    }
    // Block in the kernel on a helper thread, so that this one can watch for
    // progress and give up. A lock the helper gets after that is released at
    // once: its file is dropped with the unsent (or unread) message.
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("steadfast-sqlite-queue".into())
        .spawn(move || {
            let got = file.lock().map(|()| file);
            let _ = tx.send(got);
        })
        .map_err(Refused::Io)?;
    let mut seen = data_version(conn);
    let mut progress = Instant::now();
    loop {
        match rx.recv_timeout(LOOK_EVERY) {
            Ok(Ok(file)) => return Ok(Turn::held(Arc::new(file), start.elapsed())),
            Ok(Err(e)) => return Err(Refused::Io(e)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Refused::Io(std::io::Error::other(
                    "the thread waiting for the write queue stopped",
                )))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                let version = data_version(conn);
                if version.is_some() && version != seen {
                    seen = version;
                    progress = now;
                }
                if now - progress >= stall {
                    return Err(Refused::Stalled(now - start, false));
                }
                if now - start >= MAX_WRITE_WAIT {
                    return Err(Refused::Stalled(now - start, true));
                }
            }
        }
    }
}

/// The error of a write that did not get its turn.
pub(crate) fn refused_error(refused: Refused, path: &str, stall: Duration) -> StoreError {
    match refused {
        Refused::Io(e) => StoreError::io(
            format!(
                "waiting for the write queue {}",
                queue_path(Path::new(path)).display()
            ),
            e,
        ),
        Refused::Stalled(waited, true) => StoreError::backend(
            StoreErrorKind::Unavailable,
            format!(
                "{path} is busy: waited {:.1} s for the write lock while others committed, \
                 the longest a write waits; nothing was written",
                waited.as_secs_f64()
            ),
        ),
        Refused::Stalled(waited, false) => StoreError::backend(
            StoreErrorKind::Unavailable,
            format!(
                "{path} is busy: waited {:.1} s for the write lock and no one committed for {} \
                 (a process holding it may be stopped or hung); nothing was written",
                waited.as_secs_f64(),
                humantime::format_duration(stall)
            ),
        ),
    }
}
