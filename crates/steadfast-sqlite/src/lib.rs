//! The embedded default store of Steadfast (`sqlite:PATH`).
//!
//! One SQLite database in WAL mode with `synchronous=FULL`: a save is
//! acknowledged only after the COMMIT that holds it returned, which makes it
//! survive a process kill and a power loss. Saves queue for one write
//! connection; whichever caller finds it free commits everything queued in one
//! transaction (group commit), so concurrent runs share an fsync and a lone run
//! pays no thread hand-off. After a commit shared by several saves, the leader
//! waits up to 500 µs for as many saves to be queued again as that commit
//! carried, so that their callers share the next commit too. Loads use their
//! own connections.
//!
//! Each completed step is a row of the `steps` table (the run's history, also
//! readable with the `sqlite3` shell). A save appends the step's update and
//! rewrites only the run's head; the full state is snapshotted again only when
//! the updates since the last snapshot outweigh it, so the cost of a checkpoint
//! does not grow with the size of the state. Loading reads the snapshot and
//! merges the later updates.
//!
//! Several processes may share a database file: SQLite's locks serialize their
//! writers, and every save is compare-and-swap on the run's version.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::{run, update, StoreExt, Workflow};
//! use steadfast_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = SqliteStore::open(dir.path().join("runs.db"))?;
//! let wf = Workflow::builder("hello")
//!     .step("hi", |_, _| async { update(json!({"hi": 1})) })
//!     .build()
//!     .unwrap();
//! run("r1", &wf, &store).await.unwrap();
//! let history = store.history("r1").await?.unwrap();
//! assert_eq!(history[0].name, "hi");
//! # Ok::<(), steadfast_core::StoreError>(())
//! # }).unwrap();
//! ```

mod blobs;
mod checkpoint;
mod error;
mod progress;
mod schema;
#[doc(hidden)]
pub mod timings;
mod wait;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use steadfast_core::store::blob::{resolve_decisions, resolve_object, BlobHash, Resolver};
use steadfast_core::store::check_events;
use steadfast_core::store::head::around_writer;
use steadfast_core::store::head::encode_head_with_blobs;
use steadfast_core::store::plan::{plan_save_with_blobs, Plan};
use steadfast_core::store::rows::{rebuild, to_i64, HistoryRow, Place, RecordRow, SummaryRow};
use steadfast_core::store::{Rewrite, RunCache, SaveRequest};
use steadfast_core::{
    BlobTotals, Blobs, Capabilities, Document, Documents, Events, History, NewEvent, RunEvent,
    Usage,
};
use steadfast_core::{Checkpoint, ListFilter, RunSummary, StepRecord, Store, StoreError};
use tokio::sync::oneshot;

use crate::error::map_err;
pub use crate::schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use crate::wait::MAX_WRITE_WAIT;
use crate::writer::{Acct, Body, Head, Job, SaveJob, Writer};
pub use rusqlite;

/// Default limit of one run's state: 64 MiB.
pub const DEFAULT_MAX_STATE_BYTES: u64 = 64 << 20;

pub use steadfast_core::store::blob::DEFAULT_BLOB_THRESHOLD;

/// Default wait for another process's write lock: 10 seconds.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of a [`SqliteStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// The largest state (serialized) of one run.
    pub max_state_bytes: u64,
    /// How long a writer waits for the write lock while no one commits (a
    /// writer waits as long as others commit, up to [`MAX_WRITE_WAIT`]).
    pub busy_timeout: Duration,
    /// Values (top-level values of a state or of a step's update) whose
    /// JSON text is longer than this many bytes are stored once each, as
    /// blobs named by their SHA-256, and referred to from the records
    /// (default [`DEFAULT_BLOB_THRESHOLD`]; `?blob_threshold=` in a URL).
    pub blob_threshold: u64,
    /// Whether opening may create a missing database (and its directory).
    /// Without it, a missing store is [`StoreError::NotFound`], for commands
    /// that only read.
    pub create: bool,
    /// Deliberate defects for the durability tests (`mutants` feature).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub mutants: Mutants,
}

/// Deliberate defects, settable only with the `mutants` feature, so that the
/// tests can show they fail when a mechanism is missing.
#[cfg(feature = "mutants")]
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct Mutants {
    /// Skip the writers' queue and wait with SQLite's own busy handler only.
    pub native_busy_wait: bool,
    /// The checkpoint thread takes asks for passes and never runs one.
    pub stalled_checkpoint_thread: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            blob_threshold: DEFAULT_BLOB_THRESHOLD,
            create: true,
            #[cfg(feature = "mutants")]
            mutants: Mutants::default(),
        }
    }
}

impl SqliteOptions {
    /// Sets the per-run state limit.
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = bytes;
        self
    }
    /// Sets the lock wait.
    pub fn busy_timeout(mut self, d: Duration) -> Self {
        self.busy_timeout = d;
        self
    }
    /// Sets whether opening may create a missing database.
    pub fn create(mut self, yes: bool) -> Self {
        self.create = yes;
        self
    }
    /// Sets the size above which a value is stored as a blob (checked when
    /// the store opens: 256 bytes to 1 GiB).
    pub fn blob_threshold(mut self, bytes: u64) -> Self {
        self.blob_threshold = bytes;
        self
    }
}

/// The durability settings of a live connection, read back from SQLite itself
/// (a misspelt pragma is silently ignored, so these are checked, not assumed).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// `PRAGMA journal_mode`: `wal`.
    pub journal_mode: String,
    /// `PRAGMA synchronous`: 2 is FULL.
    pub synchronous: i64,
    /// `PRAGMA busy_timeout`, in milliseconds.
    pub busy_timeout_ms: i64,
}

/// Counters of a store's write transactions; see [`SqliteStore::write_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteStats {
    /// Transactions committed.
    pub commits: u64,
    /// Saves and deletes in them (conflicting members included).
    pub writes: u64,
    /// The longest this handle waited for the database's write lock (held
    /// by other processes or handles) before a transaction.
    pub longest_lock_wait: Duration,
    /// Saves and deletes that joined a transaction already begun (queued
    /// while it waited for the callers of the commit before it to come
    /// back), counted once it committed.
    pub joined: u64,
    /// Checkpoints (the log copied back into the database) that the
    /// store's checkpoint thread ran, each asked for by a commit of large
    /// values that found the log past 1,000 pages.
    pub checkpoints: u64,
    /// Checkpoints the write connection ran itself, after a commit: of a
    /// log of small commits past 1,000 pages, of the pages appended while
    /// the thread copied, or of a log that reached 4,000 pages.
    pub checkpoints_by_writer: u64,
}

/// The SQLite store. Cheap to clone; clones share one write connection.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    display: String,
    writer: Arc<Writer>,
    readers: Mutex<Vec<Connection>>,
    accts: RunCache<Acct>,
    opts: SqliteOptions,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .field("opts", &self.shared.opts)
            .finish_non_exhaustive()
    }
}

/// Checks a store file's path as opening the store does, before SQLite
/// touches it: its directory private (made 0700 when missing and `create`
/// is set), the file and SQLite's files beside it regular files of this
/// user's that no one else can write, links resolved once; with `create`,
/// a missing file is made, 0600. Returns the path to open. For tables kept
/// beside a store's in a file of their own (the LangGraph graph store).
pub fn prepare_file(path: &Path, create: bool) -> Result<PathBuf, StoreError> {
    let path = steadfast_core::local::prepare_store_file(path, create)?;
    for suffix in ["-wal", "-shm", "-journal", "-writer"] {
        let mut side = path.clone().into_os_string();
        side.push(suffix);
        steadfast_core::local::check_private_file(Path::new(&side))?;
    }
    if create {
        steadfast_core::local::create_private_file(&path)?;
    }
    Ok(path)
}

/// A connection to the file at `path` (checked by [`prepare_file`]) as the
/// store makes them: never creating the file, never through a link, WAL with
/// `synchronous=FULL` (a commit is on disk when it returns), waiting up to
/// `busy_timeout` for another writer's lock.
pub fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = open_raw(path, busy_timeout)?;
    configure(&conn, busy_timeout, &path.display().to_string())?;
    Ok(conn)
}

/// A connection to `path` that changes nothing yet.
fn open_raw(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let display = path.display();
    let conn = Connection::open_with_flags(path, open_flags())
        .map_err(|e| map_err(e, &format!("opening {display}")))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| map_err(e, &format!("setting busy_timeout on {display}")))?;
    Ok(conn)
}

/// WAL with `synchronous=FULL` on a new connection.
fn configure(conn: &Connection, busy_timeout: Duration, path: &str) -> Result<(), StoreError> {
    // Switching a new database to WAL needs it to itself, and SQLite does not
    // wait for that with the busy handler: wait here, as long as for a lock.
    let start = std::time::Instant::now();
    let mode: String = loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Ok(mode) => break mode,
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy
                    && start.elapsed() < busy_timeout =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(map_err(e, &format!("enabling WAL on {path}"))),
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unsupported(format!(
            "{path}: SQLite refused WAL mode (journal_mode is {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| map_err(e, &format!("setting synchronous=FULL on {path}")))?;
    Ok(())
}

pub(crate) fn read_settings(conn: &Connection, path: &str) -> Result<Settings, StoreError> {
    let read = || -> rusqlite::Result<Settings> {
        Ok(Settings {
            journal_mode: conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?,
            synchronous: conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?,
            busy_timeout_ms: conn.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?,
        })
    };
    read().map_err(|e| map_err(e, &format!("reading settings of {path}")))
}

impl SqliteStore {
    /// Deletes a run, at version `expected` when given.
    async fn delete_at(&self, run_id: &str, expected: Option<u64>) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Delete {
            run_id: run_id.to_string(),
            expected,
            reply: tx,
        })
        .await;
        self.shared.accts.set(run_id, None);
        rx.await.map_err(|_| self.writer_gone_for(run_id))?
    }

    /// Opens (creating if needed) the database at `path` with default options.
    ///
    /// A missing parent directory is created with mode 0700 and a new database
    /// file with mode 0600. The schema is migrated to this build's version; a
    /// database from a newer build is refused.
    ///
    /// Before anything is changed, the file is checked: its directory and it
    /// must belong to this user and not be writable by group or others (a
    /// symbolic link of this user's is resolved once); it must be a Steadfast
    /// database (marked with [`APPLICATION_ID`]), an empty new one, or one
    /// written before the marker existed. A file refused is left as it was.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens the database at `path` with `opts`.
    pub fn open_with(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<Self, StoreError> {
        steadfast_core::store::blob::check_threshold(opts.blob_threshold)?;
        let path = prepare_file(path.as_ref(), opts.create)?;
        let display = path.display().to_string();
        // Look before changing anything, on a connection that cannot write
        // (closing a read-write one would checkpoint a refused file's WAL).
        // (SQLite may still create the shared-memory index `-shm` beside a WAL
        // database that lacks one.) A rollback journal left by a crash can
        // only be replayed by a connection that writes: then look read-write.
        let mut journal = path.clone().into_os_string();
        journal.push("-journal");
        let hot_journal = std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0);
        if !hot_journal {
            let look = Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_NOFOLLOW,
            )
            .map_err(|e| map_err(e, &format!("opening {display}")))?;
            look.busy_timeout(opts.busy_timeout)
                .map_err(|e| map_err(e, &format!("setting busy_timeout on {display}")))?;
            schema::check_identity(&look, &display)?;
        }
        // A hot journal's file is checked before WAL mode changes anything.
        let conn = open_raw(&path, opts.busy_timeout)?;
        if hot_journal {
            schema::check_identity(&conn, &display)?;
        }
        configure(&conn, opts.busy_timeout, &display)?;
        schema::migrate(&conn, &path, &display, opts.busy_timeout)?;
        let checkpointer = checkpoint::Checkpointer::new(
            &path,
            opts.busy_timeout,
            &conn,
            #[cfg(feature = "mutants")]
            opts.mutants.stalled_checkpoint_thread,
            #[cfg(not(feature = "mutants"))]
            false,
        );
        let writer = Arc::new(Writer {
            queue: Default::default(),
            conn: Mutex::new(conn),
            positions: Default::default(),
            path: display.clone(),
            longest_wait_us: Default::default(),
            joined: Default::default(),
            stall: opts.busy_timeout,
            queue_file: crate::wait::WriteQueue::of(&path),
            #[cfg(feature = "mutants")]
            native_busy_wait: opts.mutants.native_busy_wait,
            #[cfg(not(feature = "mutants"))]
            native_busy_wait: false,
            checkpointer,
        });
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                path,
                display,
                writer,
                readers: Mutex::new(Vec::new()),
                accts: RunCache::new(steadfast_core::store::plan::KNOWN_RUNS),
                opts,
            }),
        })
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// How many transactions this handle committed and how many saves and
    /// deletes they carried: with concurrent runs, more writes than commits is
    /// group commit at work.
    pub fn write_stats(&self) -> WriteStats {
        let (commits, writes) = self.shared.writer.queue.counts();
        let waited = self.shared.writer.longest_wait_us.load(Ordering::Relaxed);
        let (checkpoints, checkpoints_by_writer) = self.shared.writer.checkpointer.counts();
        WriteStats {
            commits,
            writes,
            longest_lock_wait: Duration::from_micros(waited),
            joined: self.shared.writer.joined.load(Ordering::Relaxed),
            checkpoints,
            checkpoints_by_writer,
        }
    }

    /// The durability settings of the live write connection and of a read
    /// connection.
    pub async fn settings(&self) -> Result<(Settings, Settings), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Settings { reply: tx }).await;
        let writer = rx.await.map_err(|_| self.writer_gone())??;
        let reader = self.read(read_settings).await?;
        Ok((writer, reader))
    }

    /// Queues a job and commits the queue if no one else is committing. On a
    /// multi-threaded runtime the commit runs on this thread: a lone job
    /// without leaving the executor, a batch inside `block_in_place`;
    /// elsewhere on a blocking thread (a current-thread runtime has no other
    /// thread to go on with the tasks that form the next batch).
    async fn submit(&self, job: Job) {
        let writer = &self.shared.writer;
        writer.queue.push(job);
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                // Someone else committing will take this job with their next
                // batch. A leader commits a lone job right here; only a batch
                // (or a wait for the lock) pays for leaving the async executor.
                if let Some(conn) = writer.try_lead().and_then(|c| writer.commit_lone(c)) {
                    tokio::task::block_in_place(|| writer.lead(conn));
                }
            }
            Ok(_) => {
                let writer = Arc::clone(writer);
                // The reply channel reports the outcome; a failed join leaves it
                // dropped, which the caller sees as an error.
                let _ = tokio::task::spawn_blocking(move || writer.drive()).await;
            }
            Err(_) => writer.drive(),
        }
    }

    fn writer_gone(&self) -> StoreError {
        StoreError::unavailable(format!(
            "the write to {} was abandoned",
            self.shared.display
        ))
    }

    /// A write of run `run_id` whose reply was dropped mid-batch (a
    /// committer that panicked) may follow a commit: its outcome is unknown,
    /// and the run loop looks.
    fn writer_gone_for(&self, run_id: &str) -> StoreError {
        StoreError::OutcomeUnknown {
            run_id: run_id.to_string(),
            source: self.writer_gone().into(),
        }
    }

    /// Whether run `run_id` is certainly absent, by one point query on an
    /// idle pooled connection that must not wait for anything (SQLite's
    /// handler for a busy file is off for it). `false` when that cannot be
    /// told at once, for the full load to find out.
    fn absent_at_once(&self, run_id: &str) -> bool {
        let Some(conn) = self
            .shared
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        else {
            return false;
        };
        let absent = conn.busy_timeout(Duration::ZERO).is_ok()
            && conn
                .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")
                .and_then(|mut st| st.exists([run_id]))
                .is_ok_and(|found| !found);
        // A connection whose patience cannot be given back is not pooled.
        if conn.busy_timeout(self.shared.opts.busy_timeout).is_ok() {
            self.shared
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
        absent
    }

    /// Runs `f` on a read connection from the pool, off the async executor.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &str) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = Arc::clone(&self.shared);
        let task = move || {
            let pooled = shared
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            let conn = match pooled {
                Some(c) => c,
                None => connect(&shared.path, shared.opts.busy_timeout)?,
            };
            let out = f(&conn, &shared.display);
            shared
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
            out
        };
        tokio::task::spawn_blocking(task)
            .await
            .map_err(|e| StoreError::unavailable(format!("SQLite reader thread failed: {e}")))?
    }
}

/// How every connection opens the file: never creating it (that is
/// `create_private_file`'s, with mode 0600) and never through a symbolic link.
fn open_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
}

/// The URL schemes this store answers to: `sqlite:PATH` (or `sqlite://PATH`).
pub const URL_SCHEMES: &[&str] = &["sqlite"];

/// Opens the database that a `sqlite:` URL names (`rest` is what follows
/// the scheme), creating it only when `create` is set.
///
/// What follows a `?` sets options: `blob_threshold=SIZE` (bytes, or with
/// `KiB`, `MiB` or `GiB`), the size above which a value is stored as a blob.
pub fn open_url(rest: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let (rest, threshold) = steadfast_core::store::blob::split_url_options("sqlite", rest)?;
    let path = steadfast_core::local::url_path(rest)?;
    let mut opts = SqliteOptions::default().create(create);
    if let Some(t) = threshold {
        opts.blob_threshold = t;
    }
    Ok(Arc::new(SqliteStore::open_with(path, opts)?))
}

/// This store as a backend of the facade: `sqlite:PATH`.
pub const BACKEND: steadfast_core::store::backend::Backend =
    steadfast_core::store::backend::Backend::new(
        "sqlite",
        URL_SCHEMES,
        "sqlite:PATH",
        "the embedded default: one machine, many runs, no server",
        |_, rest, create| Box::pin(std::future::ready(open_url(rest, create))),
    );

/// The stored text of blob `hash`, for a load's references.
fn fetch_blob(
    conn: &Connection,
    hash: &BlobHash,
    bytes: u64,
    path: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    blobs::fetch(conn, hash, bytes)
        .map_err(|e| map_err(e, &format!("reading blob {hash} in {path}")))
}

/// How messages name a column of run `run_id` in the database at `path`.
fn locate(path: &str, run_id: &str) -> impl Fn(&str) -> String + Sync {
    let at = format!("{path} runs[{run_id:?}]");
    move |column: &str| format!("{at}.{column}")
}

struct Loaded {
    cp: Checkpoint,
    acct: Acct,
}

fn load_run(conn: &Connection, path: &str, run_id: &str) -> Result<Option<Loaded>, StoreError> {
    let ctx = || format!("loading run {run_id:?} from {path}");
    // One read transaction: the head and the history rows as of one commit.
    let _snapshot = conn
        .unchecked_transaction()
        .map_err(|e| map_err(e, &ctx()))?;
    let row: Option<RecordRow> = conn
        .prepare_cached(
            "SELECT workflow, status, next, version, created_at, updated_at, head,
                    snapshot, snapshot_steps, snapshot_next, snapshot_bytes, delta_bytes
             FROM runs WHERE run_id = ?1",
        )
        .and_then(|mut st| {
            st.query_row([run_id], |r| {
                Ok(RecordRow {
                    workflow: r.get(0)?,
                    status: r.get(1)?,
                    next: r.get(2)?,
                    version: r.get(3)?,
                    created_at: r.get(4)?,
                    updated_at: r.get(5)?,
                    head: r.get(6)?,
                    snapshot: r.get(7)?,
                    snapshot_completed: r.get(8)?,
                    snapshot_next: r.get(9)?,
                    snapshot_bytes: r.get(10)?,
                    delta_bytes: r.get(11)?,
                })
            })
            .optional()
        })
        .map_err(|e| map_err(e, &ctx()))?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    let locate = locate(path, run_id);
    let place = Place::new(run_id, &locate);
    // Steps recorded by their rows alone say where the run is now.
    let rows = progress::read_rows(conn, run_id, row.next).map_err(|e| map_err(e, &ctx()))?;
    let progress = progress::check(&place, row.next, row.version, &rows)?;
    let writer = progress.as_ref().map(progress::Progress::writer_bits);
    if let Some(p) = &progress {
        row.next = p.next;
        row.version = p.version;
        row.updated_at = p.saved_at;
        row.delta_bytes = row.delta_bytes.saturating_add(p.bytes);
    }
    let mut st = conn
        .prepare_cached("SELECT idx, name, update_json FROM steps WHERE run_id = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx")
        .map_err(|e| map_err(e, &ctx()))?;
    let mut rows = st
        .query(params![run_id, row.snapshot_next, row.next])
        .map_err(|e| map_err(e, &ctx()))?;
    let deltas = std::iter::from_fn(|| match rows.next() {
        Ok(Some(r)) => Some(
            (|| Ok::<_, rusqlite::Error>((r.get(0)?, r.get(1)?, r.get(2)?)))()
                .map_err(|e| map_err(e, &ctx())),
        ),
        Ok(None) => None,
        Err(e) => Some(Err(map_err(e, &ctx()))),
    });
    let doc: std::sync::Arc<str> = row.head.as_str().into();
    let (mut cp, known) = rebuild(&place, row, deltas)?;
    drop(rows);
    drop(st);
    let mut fetch = |h: &BlobHash, n| fetch_blob(conn, h, n, path);
    Resolver::new(&mut fetch).resolve_record(&mut cp, &place)?;
    if let Some(writer) = writer {
        cp.writer = writer;
    }
    let acct = Acct {
        known,
        status: cp.status.as_str(),
        workflow: cp.workflow.as_str().into(),
        doc,
    };
    Ok(Some(Loaded { cp, acct }))
}

#[async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .history(self)
            .max_state_bytes(self.shared.opts.max_state_bytes)
            .blobs(self)
            .events(self)
            .documents(self)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        // A run that is not there (the engine looks before every new run)
        // is answered here, without a hand-off to a blocking thread.
        if self.absent_at_once(run_id) {
            self.shared.accts.set(run_id, None);
            return Ok(None);
        }
        let id = run_id.to_string();
        // A load that fails (damage, say) forgets what was known of the run:
        // the next save plans from the stored record, not from before.
        let loaded = self
            .read(move |conn, path| load_run(conn, path, &id))
            .await
            .inspect_err(|_| self.shared.accts.set(run_id, None))?;
        self.shared
            .accts
            .set(run_id, loaded.as_ref().map(|l| l.acct.clone()));
        Ok(loaded.map(|l| l.cp))
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let cp = req.checkpoint;
        let acct = self.shared.accts.get(&cp.run_id);
        let threshold = self.shared.opts.blob_threshold;
        let (plan, mut blobs) = plan_save_with_blobs(
            &req,
            acct.as_ref().map(|a| &a.known),
            self.shared.opts.max_state_bytes,
            threshold,
        )?;
        let doc = encode_head_with_blobs(cp, threshold, &mut blobs)?;
        // The status and workflow name as stored: the row's labels (and the
        // indexes over them) need no update.
        let same_labels = acct
            .as_ref()
            .is_some_and(|a| a.status == cp.status.as_str() && *a.workflow == *cp.workflow);
        let body = match (plan, &acct) {
            (Plan::Head, _) => Body::Head,
            // The head document as stored too, but for the writer number
            // (new with every save): the step's row alone records it, with
            // that number (a delta plan means the stored version is the one
            // known).
            (Plan::Delta { step }, Some(a))
                if same_labels && req.new_version() == a.known.version.saturating_add(1) =>
            {
                match (around_writer(&a.doc), around_writer(&doc)) {
                    (Some((before, _, after)), Some((b, writer, f)))
                        if (before, after) == (b, f) =>
                    {
                        Body::Step {
                            step,
                            snapshot_bytes: a.known.snapshot_bytes,
                            delta_bytes: a.known.delta_bytes,
                            writer: writer.to_string(),
                        }
                    }
                    _ => Body::Delta { step, same_labels },
                }
            }
            (Plan::Delta { step }, _) => Body::Delta { step, same_labels },
            (
                Plan::Snapshot {
                    state,
                    completed,
                    step,
                },
                _,
            ) => Body::Snapshot {
                state,
                completed,
                step,
            },
        };
        let head = Head {
            workflow: cp.workflow.clone(),
            status: cp.status.as_str(),
            next: to_i64(&cp.run_id, "next", cp.next as u64)?,
            created_at: to_i64(&cp.run_id, "created_at", cp.created_at.unix_millis())?,
            updated_at: to_i64(&cp.run_id, "updated_at", cp.updated_at.unix_millis())?,
            doc,
        };
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Save(Box::new(SaveJob {
            run_id: cp.run_id.clone(),
            expected: req.expected,
            version: req.new_version(),
            head,
            body,
            blobs,
            reply: tx,
        })))
        .await;
        let result = rx.await.map_err(|_| self.writer_gone_for(&cp.run_id))?;
        self.shared.accts.after_save(cp, &result);
        result.map(|a| a.known.version)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        let f = filter.clone();
        self.read(move |conn, path| {
            let ctx = || format!("listing runs in {path}");
            let mut st = conn
                .prepare_cached(
                    // A run's last progress row, if any, says how far it is.
                    // (A damaged one reads NULL, which is reported corrupt.)
                    "SELECT r.run_id, r.workflow, r.status,
                            CASE WHEN p.idx IS NULL THEN r.next ELSE p.idx + 1 END,
                            CASE WHEN p.idx IS NULL THEN r.version ELSE p.version END,
                            r.created_at,
                            CASE WHEN p.idx IS NULL THEN r.updated_at ELSE p.saved_at END AS saved,
                            r.head
                     FROM runs r LEFT JOIN steps p ON p.run_id = r.run_id
                         AND p.idx = (SELECT max(idx) FROM steps WHERE run_id = r.run_id)
                         AND p.idx >= r.next
                     WHERE (?1 IS NULL OR r.status = ?1) AND (?2 IS NULL OR r.workflow = ?2)
                       AND (?3 IS NULL OR saved < ?3) AND (?4 IS NULL OR r.run_id > ?4)
                     ORDER BY r.run_id LIMIT ?5",
                )
                .map_err(|e| map_err(e, &ctx()))?;
            let limit = f.limit.map_or(-1, |l| l.min(i64::MAX as usize) as i64);
            let rows = st
                .query_map(
                    params![
                        f.status.map(|s| s.as_str()),
                        f.workflow,
                        f.updated_before
                            .map(|t| i64::try_from(t.unix_millis()).unwrap_or(i64::MAX)),
                        f.after,
                        limit
                    ],
                    |r| {
                        Ok(SummaryRow {
                            run_id: r.get(0)?,
                            workflow: r.get(1)?,
                            status: r.get(2)?,
                            next: r.get(3)?,
                            version: r.get(4)?,
                            created_at: r.get(5)?,
                            updated_at: r.get(6)?,
                            head: r.get(7)?,
                        })
                    },
                )
                .map_err(|e| map_err(e, &ctx()))?;
            let mut out = Vec::new();
            for row in rows {
                let row = row.map_err(|e| map_err(e, &ctx()))?;
                let run_id = row.run_id.clone();
                let locate = locate(path, &run_id);
                out.push(row.summary(&Place::new(&run_id, &locate))?);
            }
            Ok(out)
        })
        .await
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.delete_at(run_id, None).await
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.delete_at(run_id, Some(version)).await
    }
}

/// Writes go through the writer's next transaction, as saves do.
#[async_trait]
impl Documents for SqliteStore {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        let k = key.to_string();
        self.read(move |conn, path| {
            let ctx = || format!("reading document {k:?} in {path}");
            let row: Option<(String, i64)> = conn
                .prepare_cached("SELECT value, version FROM documents WHERE key = ?1")
                .and_then(|mut st| {
                    st.query_row([&k], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .map_err(|e| map_err(e, &ctx()))?;
            row.map(|(text, version)| document_of(&k, &text, version, path))
                .transpose()
        })
        .await
    }

    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        steadfast_core::store::check_document(key, value)?;
        let text = steadfast_core::store::encode_json(value, key, "document")?;
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Document {
            key: key.to_string(),
            value: Some(text),
            expected,
            reply: tx,
        })
        .await;
        rx.await.map_err(|_| self.writer_gone_for(key))?
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        let p = prefix.to_string();
        self.read(move |conn, path| {
            let ctx = || format!("listing documents in {path}");
            let mut st = conn
                .prepare_cached(
                    "SELECT key, value, version FROM documents WHERE key >= ?1 ORDER BY key",
                )
                .map_err(|e| map_err(e, &ctx()))?;
            let rows = st
                .query_map([&p], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .map_err(|e| map_err(e, &ctx()))?;
            let mut out = Vec::new();
            for row in rows {
                let (key, text, version) = row.map_err(|e| map_err(e, &ctx()))?;
                if !key.starts_with(&p) {
                    break;
                }
                out.push(document_of(&key, &text, version, path)?);
            }
            Ok(out)
        })
        .await
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Document {
            key: key.to_string(),
            value: None,
            expected: Some(expected),
            reply: tx,
        })
        .await;
        Ok(rx.await.map_err(|_| self.writer_gone_for(key))?? > 0)
    }
}

/// A document row read back ([`decode_document`](steadfast_core::store::decode_document)).
fn document_of(key: &str, text: &str, version: i64, path: &str) -> Result<Document, StoreError> {
    let version = u64::try_from(version).unwrap_or(0);
    steadfast_core::store::decode_document(key, text, version, path)
}

#[async_trait]
impl Events for SqliteStore {
    /// Appends in the writer's next transaction, shared with other runs'
    /// saves (group commit).
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        steadfast_core::validate_run_id(run_id)
            .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
        let texts = check_events(run_id, events)?;
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Events {
            run_id: run_id.to_string(),
            events: events.iter().cloned().zip(texts).collect(),
            reply: tx,
        })
        .await;
        rx.await.map_err(|_| self.writer_gone_for(run_id))?
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let id = run_id.to_string();
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn, path| {
            let ctx = || format!("reading the events of run {id:?} in {path}");
            let mut st = conn
                .prepare_cached(
                    "SELECT seq, step, attempt, at, first, value FROM events \
                     WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(|e| map_err(e, &ctx()))?;
            let rows = st
                .query_map(rusqlite::params![id, after, limit], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, bool>(4)?,
                        r.get::<_, String>(5)?,
                    ))
                })
                .map_err(|e| map_err(e, &ctx()))?;
            let mut out = Vec::new();
            for row in rows {
                let (seq, step, attempt, at, first, text) = row.map_err(|e| map_err(e, &ctx()))?;
                let corrupt = |reason: String| StoreError::Corrupt {
                    location: format!("{path}, events of run {id:?}, event {seq}"),
                    reason,
                };
                let value = serde_json::from_str(&text)
                    .map_err(|e| corrupt(format!("its value is not JSON: {e}")))?;
                let (Ok(seq), Ok(attempt), Ok(at)) = (
                    u64::try_from(seq),
                    u32::try_from(attempt),
                    u64::try_from(at),
                ) else {
                    return Err(corrupt(
                        "its number, attempt or time is out of range".into(),
                    ));
                };
                let mut event = NewEvent::new(
                    step,
                    attempt,
                    steadfast_core::Timestamp::from_unix_millis(at),
                    value,
                );
                event.first = first;
                out.push(event.numbered(seq));
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl Blobs for SqliteStore {
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError> {
        let id = run_id.to_string();
        self.read(move |conn, path| {
            let ctx = || format!("measuring run {id:?} in {path}");
            let _snapshot = conn
                .unchecked_transaction()
                .map_err(|e| map_err(e, &ctx()))?;
            blobs::usage(conn, &id).map_err(|e| map_err(e, &ctx()))
        })
        .await
    }

    fn threshold(&self) -> u64 {
        self.shared.opts.blob_threshold
    }

    async fn blob_totals(&self) -> Result<BlobTotals, StoreError> {
        self.read(|conn, path| {
            blobs::totals(conn).map_err(|e| map_err(e, &format!("measuring the blobs of {path}")))
        })
        .await
    }
}

#[async_trait]
impl History for SqliteStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let id = run_id.to_string();
        self.read(move |conn, path| {
            let ctx = || format!("reading the history of run {id:?} in {path}");
            let _snapshot = conn
                .unchecked_transaction()
                .map_err(|e| map_err(e, &ctx()))?;
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")
                .and_then(|mut st| st.query_row([&id], |r| r.get(0)).optional())
                .map_err(|e| map_err(e, &ctx()))?;
            if found.is_none() {
                return Ok(None);
            }
            // Every row is history: those below the head's `next`, and the
            // progress rows after it (a rewritten run keeps none above).
            let mut st = conn
                .prepare_cached(
                    "SELECT idx, name, update_json, attempt, started_at, finished_at FROM steps
                     WHERE run_id = ?1 ORDER BY idx",
                )
                .map_err(|e| map_err(e, &ctx()))?;
            let rows = st
                .query_map(params![id], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })
                .map_err(|e| map_err(e, &ctx()))?;
            let locate = locate(path, &id);
            let place = Place::new(&id, &locate);
            let mut out = Vec::new();
            // Steps that reread one document open its blob once.
            let mut fetch = |h: &BlobHash, n: u64| fetch_blob(conn, h, n, path);
            let mut resolver = Resolver::new(&mut fetch);
            for row in rows {
                let (idx, name, update, attempt, started, finished) =
                    row.map_err(|e| map_err(e, &ctx()))?;
                let mut record = HistoryRow::new(idx, name, update, attempt, started, finished)
                    .record(&place)?;
                resolver.resolve(
                    &mut record.update,
                    &place,
                    &format!("steps[{idx}].update_json"),
                )?;
                out.push(record);
            }
            Ok(Some(out))
        })
        .await
    }
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let (rows, blobs) = rewrite.rows_with_blobs(run_id, self.shared.opts.blob_threshold)?;
        self.submit(Job::Rewrite {
            run_id: run_id.to_string(),
            expected,
            rows,
            delete_below: rewrite.delete_below().map(|i| i as i64),
            blobs,
            reply: tx,
        })
        .await;
        rx.await
            .map_err(|_| self.writer_gone_for(run_id))?
            .map(drop)
    }
}

/// Builds a checkpoint from the text columns `[workflow, status, head,
/// snapshot, snapshot_completed]`, the integer columns `[next, version,
/// created_at, updated_at, snapshot_next]` and history rows `(idx, name,
/// update_json)` of one run, as loading it does. For the fuzz targets and
/// their corpus replay; not part of the supported API.
#[doc(hidden)]
pub fn decode_record_for_fuzzing(
    run_id: &str,
    text: [String; 5],
    ints: [i64; 5],
    deltas: Vec<(i64, String, String)>,
) -> Result<Checkpoint, StoreError> {
    let [workflow, status, head, snapshot, snapshot_completed] = text;
    let [next, version, created_at, updated_at, snapshot_next] = ints;
    let row = RecordRow {
        workflow,
        status,
        next,
        version,
        created_at,
        updated_at,
        head,
        snapshot,
        snapshot_completed,
        snapshot_next,
        snapshot_bytes: 0,
        delta_bytes: 0,
    };
    let locate = locate("fuzz.db", run_id);
    let place = Place::new(run_id, &locate);
    let deltas = deltas.into_iter().map(Ok);
    let (mut cp, _) = rebuild(&place, row, deltas)?;
    // As a load does, with no blob stored.
    resolve_object(&mut cp.state, &place, "state", &mut |_, _| Ok(None))?;
    resolve_decisions(&mut cp, &place, &mut |_, _| Ok(None))?;
    Ok(cp)
}
