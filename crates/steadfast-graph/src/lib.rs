//! LangGraph checkpoints through the Rust core: tables of their own on SQLite
//! (or an in-memory SQLite database) and PostgreSQL, with one writer per
//! thread.
//!
//! Three tables: `graph_checkpoints` (one row per checkpoint, its blob and
//! metadata as the saver serialized them), `graph_writes` (the pending writes
//! of each checkpoint's tasks) and `graph_threads` (who may write a thread, and
//! until when). Every write takes or renews the thread's lease in the same
//! transaction as the rows it writes; a write from another saver while the
//! holder is alive and its lease has not run out is refused with `Held`, so two
//! workers can never fork one thread's checkpoint chain without anyone knowing.
//!
//! The calls block (PostgreSQL's run on a runtime of the crate's own): call
//! them from a thread, not from inside an async task. The Python package's
//! `SteadfastSaver` binds this store.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use steadfast::postgres::{tokio_postgres, PgStore};
use steadfast::{Clock, Lease, Owner, StoreError, Timestamp};

mod blobs;
pub mod chains;
mod error;
use blobs::{Blob, ChannelBlob};
use error::store_err;
pub use error::{GraphError, Result};

/// Runs `fut` to its end on the crate's runtime (PostgreSQL's connections
/// live there).
fn block<F: std::future::Future>(fut: F) -> F::Output {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("steadfast-graph")
            .build()
            .unwrap_or_else(|e| panic!("cannot start the graph store's runtime: {e}"))
    })
    .block_on(fut)
}

/// The table layout this build writes; a store marked newer is refused.
/// Format 3 added the blob tables: a build of format 2 would read a
/// checkpoint without its large channel values.
const GRAPH_FORMAT: i64 = 3;
/// The largest checkpoint or write blob accepted (SQLite's own limit is 1 GB).
const MAX_BLOB_BYTES: usize = 256 << 20;
/// Metadata keys of LangGraph's delta channels, whose state needs the older
/// checkpoints: pruning to the latest would lose it.
const DELTA_KEYS: [&str; 2] = ["counters_since_delta_snapshot", "delta_writes_versioned"];

/// One checkpoint as returned to Python: thread, namespace, id, parent,
/// type, blob, metadata, pending writes, and the large channel values kept
/// apart from the blob ([`Channel`]), in channel order.
pub type Row = (
    String,
    String,
    String,
    Option<String>,
    String,
    Vec<u8>,
    String,
    Vec<Write>,
    Vec<Channel>,
);
/// A large channel value of a checkpoint, stored once per thread: channel,
/// type, bytes (as the saver serialized it).
pub type Channel = (String, String, Vec<u8>);
/// One pending write: task id, channel, type, blob, (task path, index) for order.
pub type Write = (String, String, String, Vec<u8>, String, i64);

/// Pending writes as columns (index, channel, type, blob, blob name), for
/// `unnest`.
type WriteColumns<'a> = (
    Vec<i64>,
    Vec<&'a str>,
    Vec<&'a str>,
    Vec<&'a [u8]>,
    Vec<Option<&'a [u8]>>,
);
/// A pending write on its way in: index, channel, type, bytes kept inline,
/// and the blob that holds a large value instead.
type PgWrite = (i64, String, String, Vec<u8>, Option<Blob>);

/// Who writes: this process and a number that tells savers in it apart.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Holder {
    #[serde(flatten)]
    owner: Owner,
    saver: u64,
}

impl Holder {
    fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    fn describe(stored: &str) -> String {
        match serde_json::from_str::<Holder>(stored) {
            Ok(h) => format!(
                "saver {:x} of process {} on {}",
                h.saver, h.owner.pid, h.owner.host
            ),
            Err(_) => format!("{stored:?}"),
        }
    }

    /// Whether a stored lease (holder, deadline by the wall clock, and by
    /// the holder's boot clock) still binds others at wall-clock time `now`,
    /// as the run loop judges a run's lease: on this host by the holder's
    /// process and the boot clock, from another host by the wall clock. An
    /// unreadable holder holds until its wall-clock deadline.
    fn holds(stored: &str, until: i64, local_until: Option<i64>, now: i64) -> bool {
        let Ok(h) = serde_json::from_str::<Holder>(stored) else {
            return until > now;
        };
        let at = |ms: i64| Timestamp::from_unix_millis(u64::try_from(ms).unwrap_or(0));
        let local = local_until.and_then(|ms| u64::try_from(ms).ok());
        steadfast::lease_holds(&Lease::new(h.owner, at(until)).local_until(local), at(now))
    }
}

enum Backend {
    /// The connection is boxed: it is far larger than a PostgreSQL handle.
    Sqlite {
        conn: Box<Mutex<Connection>>,
        at: String,
    },
    Pg {
        store: PgStore,
    },
}

/// LangGraph checkpoints in a store; see the module docs.
pub struct GraphStore {
    backend: Backend,
    me: Holder,
    lease_ms: i64,
    /// The generation of each thread's lease this saver took last; a thread
    /// whose lease another saver took since is written again only where the
    /// write extends its latest checkpoint.
    mine: Mutex<HashMap<String, i64>>,
    /// With encryption: every blob is sealed bound to its row.
    keys: Option<steadfast::seal::Keyring>,
    /// Values longer than this (in bytes, as stored) are kept as blobs.
    threshold: u64,
}

/// What a checkpoint's seal binds: where the row is and what it holds.
fn checkpoint_context(thread: &str, ns: &str, id: &str, ty: &str) -> Vec<Vec<u8>> {
    vec![
        b"checkpoint".to_vec(),
        thread.as_bytes().to_vec(),
        ns.as_bytes().to_vec(),
        id.as_bytes().to_vec(),
        ty.as_bytes().to_vec(),
    ]
}

/// What a pending write's seal binds.
fn write_context(
    thread: &str,
    ns: &str,
    id: &str,
    task: &str,
    idx: i64,
    channel: &str,
    ty: &str,
) -> Vec<Vec<u8>> {
    vec![
        b"write".to_vec(),
        thread.as_bytes().to_vec(),
        ns.as_bytes().to_vec(),
        id.as_bytes().to_vec(),
        task.as_bytes().to_vec(),
        idx.to_string().into_bytes(),
        channel.as_bytes().to_vec(),
        ty.as_bytes().to_vec(),
    ]
}

/// What the seal of a checkpoint's large channel value binds.
fn channel_context(thread: &str, ns: &str, id: &str, channel: &str, ty: &str) -> Vec<Vec<u8>> {
    vec![
        b"channel".to_vec(),
        thread.as_bytes().to_vec(),
        ns.as_bytes().to_vec(),
        id.as_bytes().to_vec(),
        channel.as_bytes().to_vec(),
        ty.as_bytes().to_vec(),
    ]
}

/// Refuses to copy onto a thread that has checkpoints.
fn occupied(target: &str, n: i64) -> Result<()> {
    if n > 0 {
        return Err(GraphError::InvalidInput(format!(
            "copy_thread: thread {target:?} already has {n} checkpoint(s); nothing was written"
        )));
    }
    Ok(())
}

/// Checkpoint metadata (JSON text, an object as `put` checked) as its
/// members. Read as a map, not as a `Value`: serde_json's reader of a
/// `Value` takes an object whose first member is named
/// `$serde_json::private::RawValue` as the text that member holds.
fn metadata_members(metadata: &str) -> Option<serde_json::Map<String, Value>> {
    serde_json::from_str(metadata).ok()
}

/// The run id a copied checkpoint keeps (from its metadata, as `put` got it).
fn run_id_of(metadata: &str) -> Option<String> {
    match metadata_members(metadata)?.get("run_id") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    }
}

/// A thread's lease as stored: its holder, its deadline by the wall clock
/// and by the holder's boot clock, and its generation.
struct ThreadRow {
    holder: String,
    until: i64,
    local_until: Option<i64>,
    generation: i64,
}

/// The columns of `graph_threads` a lease is judged by, in `ThreadRow`'s
/// order. The boot-clock deadline counts only when it was written with the
/// lease's generation: a saver of format 1 (opened before the upgrade) takes
/// and renews leases without writing one, and is judged by the wall clock.
const THREAD_COLUMNS: &str = "holder, until_ms,
    CASE WHEN local_generation = generation THEN local_until_ms END, generation";

/// What a write must do about the thread's lease, decided from its row.
enum LeaseStep {
    /// This saver holds it: renew.
    Renew,
    /// Free: take it with this new generation.
    Take(i64),
    /// Free, but another saver held it since this one last wrote: take it
    /// only if the write extends the thread's latest checkpoint.
    TakeIfHead(i64),
}

fn sql_err(at: &str, e: rusqlite::Error) -> GraphError {
    let corrupt = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase) | Some(rusqlite::ErrorCode::DatabaseCorrupt)
    );
    let msg = format!("graph store {at}: {e}");
    store_err(&if corrupt {
        StoreError::Corrupt {
            location: at.to_string(),
            reason: e.to_string(),
        }
    } else if matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked)
    ) {
        StoreError::unavailable(msg)
    } else {
        StoreError::backend(steadfast::StoreErrorKind::Unavailable, msg)
    })
}

fn pg_err(context: &str, e: tokio_postgres::Error) -> GraphError {
    store_err(&PgStore::map_error(e, context))
}

/// A thread's lease row in a SQLite transaction, if it has one.
fn thread_row_sqlite(
    tx: &rusqlite::Transaction<'_>,
    at: &str,
    thread: &str,
) -> Result<Option<ThreadRow>> {
    tx.query_row(
        &format!("SELECT {THREAD_COLUMNS} FROM graph_threads WHERE thread_id = ?1"),
        [thread],
        |r| {
            Ok(ThreadRow {
                holder: r.get(0)?,
                until: r.get(1)?,
                local_until: r.get(2)?,
                generation: r.get(3)?,
            })
        },
    )
    .optional()
    .map_err(|e| sql_err(at, e))
}

/// The keys in the environment when `encrypt`, refused when there are
/// none; `None` without encryption.
fn keyring(encrypt: bool) -> Result<Option<steadfast::seal::Keyring>> {
    if !encrypt {
        return Ok(None);
    }
    let keys = steadfast::seal::Keyring::from_env()
        .map_err(|e| GraphError::InvalidInput(e.to_string()))?;
    keys.map(Some).ok_or_else(|| {
        GraphError::InvalidInput(format!(
            "encrypt=True needs the keys: set {} or {}",
            steadfast::seal::KEY_ENV,
            steadfast::seal::KEY_FILE_ENV
        ))
    })
}

fn now_ms() -> i64 {
    steadfast::SystemClock.now().unix_millis() as i64
}

fn held(thread: &str, holder: &str, until_ms: i64) -> GraphError {
    GraphError::Held(format!(
        "thread {thread:?} is held by {} until {}; a second writer would fork its checkpoint chain, so nothing was written (the holder's lease runs out, or it calls release, or its process exits)",
        Holder::describe(holder),
        Timestamp::from_unix_millis(until_ms.max(0) as u64)
    ))
}

fn check_blob(what: &str, b: &[u8]) -> Result<()> {
    if b.len() > MAX_BLOB_BYTES {
        return Err(store_err(&StoreError::InvalidInput(format!(
            "{what} is {} bytes, over the limit of {MAX_BLOB_BYTES}; nothing was written",
            b.len()
        ))));
    }
    Ok(())
}

/// JSON equality as LangGraph's filters mean it: numbers by value, objects
/// whatever their key order, `true` never equal to 1.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Whether `metadata` (JSON text) has every key of `filter` with an equal
/// value; a null in the filter also matches a missing key.
fn matches(filter: &serde_json::Map<String, Value>, metadata: &str) -> bool {
    let Some(meta) = metadata_members(metadata) else {
        return false;
    };
    filter.iter().all(|(k, want)| match meta.get(k) {
        Some(have) => json_eq(have, want),
        None => want.is_null(),
    })
}

fn sort_writes(w: &mut [Write]) {
    w.sort_by(|a, b| (&a.4, &a.0, a.5).cmp(&(&b.4, &b.0, b.5)));
}

/// The query of `list`.
struct ListQuery {
    thread: Option<String>,
    ns: Option<String>,
    checkpoint: Option<String>,
    before: Option<String>,
    limit: Option<usize>,
    filter: Option<serde_json::Map<String, Value>>,
}

/// A PostgreSQL connection or transaction from the store's pool.
use steadfast::postgres::deadpool_postgres::GenericClient as Pg;
type PgParams<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// Runs `sql` as a statement prepared once per connection: a round trip
/// fewer than preparing it on every call. Errors say `ctx`.
async fn pexec<C: Pg + Sync>(c: &C, ctx: &str, sql: &str, params: PgParams<'_>) -> Result<u64> {
    let run = async {
        let st = c.prepare_cached(sql).await?;
        c.execute(&st, params).await
    };
    run.await.map_err(|e| pg_err(ctx, e))
}

/// Like [`pexec`], for the rows of a query.
async fn pquery<C: Pg + Sync>(
    c: &C,
    ctx: &str,
    sql: &str,
    params: PgParams<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    let run = async {
        let st = c.prepare_cached(sql).await?;
        c.query(&st, params).await
    };
    run.await.map_err(|e| pg_err(ctx, e))
}

/// Like [`pexec`], for a query of exactly one row.
async fn pquery_one<C: Pg + Sync>(
    c: &C,
    ctx: &str,
    sql: &str,
    params: PgParams<'_>,
) -> Result<tokio_postgres::Row> {
    let run = async {
        let st = c.prepare_cached(sql).await?;
        c.query_one(&st, params).await
    };
    run.await.map_err(|e| pg_err(ctx, e))
}

/// Begins a transaction on a pooled connection; errors say `ctx`.
async fn begin<'c>(
    client: &'c mut steadfast::postgres::deadpool_postgres::Object,
    ctx: &str,
) -> Result<steadfast::postgres::deadpool_postgres::Transaction<'c>> {
    client.transaction().await.map_err(|e| pg_err(ctx, e))
}

/// Commits `tx`; errors say `ctx`.
async fn commit(
    tx: steadfast::postgres::deadpool_postgres::Transaction<'_>,
    ctx: &str,
) -> Result<()> {
    tx.commit().await.map_err(|e| pg_err(ctx, e))
}

impl ListQuery {
    /// What follows `FROM table` for this query: its conditions, order and
    /// limit, with placeholders made by `placeholder(1)`, `placeholder(2)`…
    /// and the values they stand for, in order.
    fn sql(
        &self,
        limit: Option<usize>,
        placeholder: impl Fn(usize) -> String,
    ) -> (String, Vec<&String>) {
        let mut sql = String::from("WHERE 1 = 1");
        let mut values = Vec::new();
        for (col, op, v) in [
            ("thread_id", "=", &self.thread),
            ("ns", "=", &self.ns),
            ("checkpoint_id", "=", &self.checkpoint),
            ("checkpoint_id", "<", &self.before),
        ] {
            if let Some(v) = v {
                values.push(v);
                sql.push_str(&format!(" AND {col} {op} {}", placeholder(values.len())));
            }
        }
        sql.push_str(" ORDER BY checkpoint_id DESC, thread_id DESC, ns DESC");
        if let Some(n) = limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        (sql, values)
    }

    /// Adds `head` to `heads` if its metadata passes the filter; true once
    /// the limit is reached.
    fn keep(&self, head: Head, heads: &mut Vec<Head>) -> bool {
        if self.filter.as_ref().is_some_and(|f| !matches(f, &head.6)) {
            return false;
        }
        heads.push(head);
        self.limit.is_some_and(|n| heads.len() >= n)
    }
}

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS graph_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS graph_checkpoints (
  thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
  parent_id TEXT, type TEXT NOT NULL, blob BLOB NOT NULL, metadata TEXT NOT NULL, run_id TEXT,
  PRIMARY KEY (thread_id, ns, checkpoint_id));
CREATE INDEX IF NOT EXISTS graph_checkpoints_run ON graph_checkpoints (run_id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS graph_writes (
  thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL,
  idx INTEGER NOT NULL, channel TEXT NOT NULL, type TEXT NOT NULL, blob BLOB NOT NULL, task_path TEXT NOT NULL,
  PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx));
CREATE TABLE IF NOT EXISTS graph_threads (
  thread_id TEXT PRIMARY KEY, holder TEXT NOT NULL, until_ms INTEGER NOT NULL,
  generation INTEGER NOT NULL, local_until_ms INTEGER, local_generation INTEGER) WITHOUT ROWID;
";

fn pg_schema(s: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {s}.graph_meta (key text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.graph_checkpoints (
  thread_id text COLLATE \"C\" NOT NULL, ns text COLLATE \"C\" NOT NULL, checkpoint_id text COLLATE \"C\" NOT NULL,
  parent_id text, type text NOT NULL, blob bytea NOT NULL, metadata text NOT NULL, run_id text,
  PRIMARY KEY (thread_id, ns, checkpoint_id));
CREATE INDEX IF NOT EXISTS graph_checkpoints_run ON {s}.graph_checkpoints (run_id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS {s}.graph_writes (
  thread_id text COLLATE \"C\" NOT NULL, ns text COLLATE \"C\" NOT NULL, checkpoint_id text COLLATE \"C\" NOT NULL,
  task_id text COLLATE \"C\" NOT NULL, idx bigint NOT NULL, channel text NOT NULL, type text NOT NULL,
  blob bytea NOT NULL, task_path text COLLATE \"C\" NOT NULL,
  PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx));
CREATE TABLE IF NOT EXISTS {s}.graph_threads (
  thread_id text COLLATE \"C\" PRIMARY KEY, holder text NOT NULL, until_ms bigint NOT NULL,
  generation bigint NOT NULL, local_until_ms bigint, local_generation bigint);
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{s}.graph_threads'::regclass
                 AND attname = 'local_generation' AND NOT attisdropped) THEN
    ALTER TABLE {s}.graph_threads ADD COLUMN IF NOT EXISTS local_until_ms bigint,
      ADD COLUMN local_generation bigint;
  END IF;
END $$;"
    )
}

fn open_sqlite(url: &str) -> Result<Backend> {
    let (conn, at) = if url == "memory:" {
        (Connection::open_in_memory(), "memory:".to_string())
    } else {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or_default();
        if path.is_empty() {
            return Err(GraphError::InvalidInput(format!(
                "graph store URL {url:?}: expected sqlite:PATH, postgres://… or memory:"
            )));
        }
        // The Steadfast SQLite store's checks and connection: a private
        // directory (made 0700 when missing), a regular file of this user's
        // (no FIFO, device or planted file others can write) made 0600,
        // links resolved once, the same for SQLite's files beside it; WAL
        // with synchronous=FULL, so a commit is on disk when it returns.
        let sqlite = steadfast::sqlite::prepare_file(Path::new(path), true)
            .and_then(|p| steadfast::sqlite::connect(&p, Duration::from_secs(10)).map(|c| (c, p)))
            .map_err(|e| store_err(&e))?;
        (Ok(sqlite.0), sqlite.1.display().to_string())
    };
    let mut conn = conn.map_err(|e| sql_err(&at, e))?;
    // The tables, brought to this build's format in one transaction (format
    // 1 had no boot-clock deadline), or nothing changed for a newer format.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate);
    let tx = tx.map_err(|e| sql_err(&at, e))?;
    tx.execute_batch(SQLITE_SCHEMA)
        .and_then(|()| tx.execute_batch(blobs::SQLITE_TABLES))
        .map_err(|e| sql_err(&at, e))?;
    // Format 3: a write's large value is a blob it names.
    add_columns(
        &tx,
        "graph_writes",
        "blob_hash",
        "ALTER TABLE graph_writes ADD COLUMN blob_hash BLOB;",
    )
    .and_then(|()| tx.execute_batch(blobs::SQLITE_WRITES_INDEX))
    // Format 2: the boot-clock deadline.
    .and_then(|()| {
        add_columns(
            &tx,
            "graph_threads",
            "local_generation",
            "ALTER TABLE graph_threads ADD COLUMN local_until_ms INTEGER;
             ALTER TABLE graph_threads ADD COLUMN local_generation INTEGER;",
        )
    })
    .map_err(|e| sql_err(&at, e))?;
    let format: i64 = tx
        .query_row(
            "INSERT INTO graph_meta (key, value) VALUES ('format', ?1)
             ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value) RETURNING value",
            [GRAPH_FORMAT],
            |r| r.get(0),
        )
        .map_err(|e| sql_err(&at, e))?;
    check_format(&at, format)?;
    tx.commit().map_err(|e| sql_err(&at, e))?;
    Ok(Backend::Sqlite {
        conn: Box::new(Mutex::new(conn)),
        at,
    })
}

/// Runs `alter` (which adds `column`, and any others of its format) unless
/// `table` has `column` already.
fn add_columns(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    column: &str,
    alter: &str,
) -> rusqlite::Result<()> {
    let has: bool = tx.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        params![table, column],
        |r| r.get(0),
    )?;
    if has {
        Ok(())
    } else {
        tx.execute_batch(alter)
    }
}

fn check_format(at: &str, format: i64) -> Result<()> {
    let at = format!("the graph tables of {at} (table format)");
    steadfast::store::layout::check_version(&at, format, GRAPH_FORMAT).map_err(|e| store_err(&e))
}

async fn open_pg(url: &str) -> Result<Backend> {
    let store = PgStore::connect(url).await.map_err(|e| store_err(&e))?;
    let s = store.quoted_schema();
    let client = store.connection().await.map_err(|e| store_err(&e))?;
    let at = store.display_url().to_string();
    // A newer format is refused before anything is created or altered.
    let ctx = format!("reading the graph table format in {at}");
    let meta = format!("{s}.graph_meta");
    let exists = pquery_one(
        &client,
        &ctx,
        "SELECT to_regclass($1) IS NOT NULL",
        &[&meta],
    )
    .await?;
    if exists.get::<_, bool>(0) {
        let sql = format!("SELECT value FROM {meta} WHERE key = 'format'");
        if let Some(row) = pquery(&client, &ctx, &sql, &[]).await?.first() {
            check_format(&at, row.get(0))?;
        }
    }
    // Two savers creating the tables at once would race on the catalog; the
    // format is raised in the same transaction, so that no saver of an
    // older build opens tables changed under it without being refused.
    let mut client = client;
    let making = format!("creating the graph tables in {at}");
    let tx = begin(&mut client, &making).await?;
    tx.batch_execute(&format!(
        "SELECT pg_advisory_xact_lock(hashtext('steadfast graph tables')); {} {}",
        pg_schema(&s),
        blobs::pg_tables(&s)
    ))
    .await
    .map_err(|e| pg_err(&making, e))?;
    let row = pquery_one(
        &tx,
        &format!("reading the graph table format in {at}"),
        &format!(
            "INSERT INTO {s}.graph_meta (key, value) VALUES ('format', $1)
                 ON CONFLICT (key) DO UPDATE SET value = GREATEST({s}.graph_meta.value, $1) RETURNING value"
        ),
        &[&GRAPH_FORMAT],
    )
    .await?;
    check_format(&at, row.get(0))?;
    commit(tx, &making).await?;
    drop(client);
    Ok(Backend::Pg { store })
}

fn stale(thread: &str, what: &str) -> GraphError {
    GraphError::Held(format!(
        "thread {thread:?} was written by another saver after this saver's lease on it ran out; {what} does not extend its latest checkpoint and would fork its checkpoint chain, so nothing was written (start a new invocation, which reads the latest checkpoint, or call release(thread_id) first)"
    ))
}

impl GraphStore {
    /// The boot-clock deadline of a lease taken or renewed now.
    fn local_until(&self) -> Option<i64> {
        let ttl = Duration::from_millis(u64::try_from(self.lease_ms).unwrap_or(0));
        steadfast::local_deadline(ttl).and_then(|ms| i64::try_from(ms).ok())
    }

    /// The pid the store was opened in: after `fork()` a child would write
    /// as its parent over the parent's connection.
    fn check_process(&self) -> Result<()> {
        if std::process::id() != self.me.owner.pid {
            return Err(GraphError::InvalidInput(format!(
                "this graph store was opened in process {} and is used in process {} (a fork); open a new one in this process",
                self.me.owner.pid,
                std::process::id()
            )));
        }
        Ok(())
    }

    /// Held, when another saver's lease on `thread` (its row) still binds
    /// at `now`.
    fn not_held(&self, thread: &str, row: &ThreadRow, now: i64) -> Result<()> {
        let other = !row.holder.is_empty() && row.holder != self.me.text();
        if other && Holder::holds(&row.holder, row.until, row.local_until, now) {
            return Err(held(thread, &row.holder, row.until));
        }
        Ok(())
    }

    /// What to do about `thread`'s lease given its row and the time, or Held.
    fn decide(&self, thread: &str, row: Option<ThreadRow>, now: i64) -> Result<LeaseStep> {
        let mine = self
            .mine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(thread)
            .copied();
        let Some(row) = row else {
            return Ok(LeaseStep::Take(1));
        };
        // This saver's own lease, whatever generation it noted last (its
        // concurrent writes may note theirs in any order): only another
        // saver's lease in between makes a write stale.
        if row.holder == self.me.text() {
            return Ok(LeaseStep::Renew);
        }
        self.not_held(thread, &row, now)?;
        let next = row.generation.saturating_add(1);
        Ok(match mine {
            Some(g) if g != row.generation => LeaseStep::TakeIfHead(next),
            _ => LeaseStep::Take(next),
        })
    }

    fn took(&self, thread: &str, generation: Option<i64>) {
        if let Some(g) = generation {
            let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
            let noted = mine.entry(thread.to_string()).or_insert(g);
            *noted = (*noted).max(g);
        }
    }

    fn forget(&self, thread: Option<&str>) {
        let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
        match thread {
            Some(t) => {
                mine.remove(t);
            }
            None => mine.clear(),
        }
    }
    fn sqlite<T>(&self, f: impl FnOnce(&mut Connection, &str) -> Result<T> + Send) -> Result<T>
    where
        T: Send,
    {
        let Backend::Sqlite { conn, at } = &self.backend else {
            unreachable!("called only on SQLite")
        };
        let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c, at)
    }

    /// Takes or renews the lease on `thread` inside a SQLite write
    /// transaction, or refuses with Held. `head` is the checkpoint the write
    /// must extend if another saver wrote the thread since this one did
    /// (`(ns, checkpoint)`: a put's parent, or the checkpoint writes belong
    /// to). Returns the generation taken, to note after the commit.
    fn lease_sqlite(
        &self,
        tx: &rusqlite::Transaction<'_>,
        at: &str,
        thread: &str,
        head: (&str, Option<&str>, &str),
    ) -> Result<Option<i64>> {
        let now = now_ms();
        let row = thread_row_sqlite(tx, at, thread)?;
        let generation = match self.decide(thread, row, now)? {
            LeaseStep::Renew => None,
            LeaseStep::Take(g) => Some(g),
            LeaseStep::TakeIfHead(g) => {
                let (ns, extends, what) = head;
                let latest: Option<String> = tx
                    .query_row(
                        "SELECT max(checkpoint_id) FROM graph_checkpoints WHERE thread_id = ?1 AND ns = ?2",
                        params![thread, ns],
                        |r| r.get(0),
                    )
                    .map_err(|e| sql_err(at, e))?;
                if latest.as_deref() != extends {
                    return Err(stale(thread, what));
                }
                Some(g)
            }
        };
        let me = self.me.text();
        let until = now.saturating_add(self.lease_ms);
        let local = self.local_until();
        match generation {
            None => tx.execute("UPDATE graph_threads SET until_ms = ?2, local_until_ms = ?3,
                   local_generation = generation WHERE thread_id = ?1",
                params![thread, until, local],
            ),
            Some(g) => tx.execute("INSERT INTO graph_threads (thread_id, holder, until_ms, local_until_ms,
                   generation, local_generation) VALUES (?1, ?2, ?3, ?4, ?5, ?5)
                 ON CONFLICT (thread_id) DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms,
                   local_until_ms = excluded.local_until_ms, generation = excluded.generation,
                   local_generation = excluded.generation",
                params![thread, me, until, local, g],
            ),
        }
        .map_err(|e| sql_err(at, e))?;
        Ok(generation)
    }

    /// Refuses a copy's target that another live saver writes or that
    /// has checkpoints already (inside the copy's SQLite transaction).
    fn target_free_sqlite(
        &self,
        tx: &rusqlite::Transaction<'_>,
        at: &str,
        target: &str,
    ) -> Result<()> {
        self.not_held_sqlite(tx, at, target)?;
        let n: i64 = tx
            .query_row(
                "SELECT count(*) FROM graph_checkpoints WHERE thread_id = ?1",
                [target],
                |r| r.get(0),
            )
            .map_err(|e| sql_err(at, e))?;
        occupied(target, n)
    }

    /// The same inside a PostgreSQL transaction (locking the target's row).
    async fn target_free_pg(
        &self,
        tx: &steadfast::postgres::deadpool_postgres::Transaction<'_>,
        s: &str,
        target: &str,
        ctx: &str,
    ) -> Result<()> {
        self.lease_pg(tx, s, target, None).await?;
        let n: i64 = pquery_one(
            tx,
            ctx,
            &format!("SELECT count(*) FROM {s}.graph_checkpoints WHERE thread_id = $1"),
            &[&target],
        )
        .await?
        .get(0);
        occupied(target, n)
    }

    /// Locks the two threads of a copy in name order (so that two copies
    /// between the same threads cannot deadlock): the source's lease row
    /// for share, so that no write, prune or delete of the source changes
    /// its rows and blobs between the copy's statements; the target as
    /// [`target_free_pg`](Self::target_free_pg) does.
    async fn lock_source_and_target_pg(
        &self,
        tx: &steadfast::postgres::deadpool_postgres::Transaction<'_>,
        s: &str,
        source: &str,
        target: &str,
        ctx: &str,
    ) -> Result<()> {
        let lock_source = format!("SELECT 1 FROM {s}.graph_threads WHERE thread_id = $1 FOR SHARE");
        if source < target {
            pquery(tx, ctx, &lock_source, &[&source]).await?;
            self.target_free_pg(tx, s, target, ctx).await
        } else {
            self.target_free_pg(tx, s, target, ctx).await?;
            pquery(tx, ctx, &lock_source, &[&source]).await.map(drop)
        }
    }

    /// Refuses when another live saver holds `thread` (for deletes and
    /// copies, which take no lease of their own).
    fn not_held_sqlite(
        &self,
        tx: &rusqlite::Transaction<'_>,
        at: &str,
        thread: &str,
    ) -> Result<()> {
        match thread_row_sqlite(tx, at, thread)? {
            Some(row) => self.not_held(thread, &row, now_ms()),
            None => Ok(()),
        }
    }

    /// Takes or renews (`head` given) the lease on `thread` inside a
    /// PostgreSQL transaction, on the database's clock, or refuses with
    /// Held; without `head`, only locks the thread's row and checks that no
    /// other live saver holds it (deletes and copies). Returns the generation
    /// taken, to note after the commit.
    async fn lease_pg(
        &self,
        tx: &steadfast::postgres::deadpool_postgres::Transaction<'_>,
        s: &str,
        thread: &str,
        head: Option<(&str, Option<&str>, &str, Option<&str>)>,
    ) -> Result<Option<i64>> {
        let ctx = format!("taking the lease on thread {thread:?}");
        // One statement makes a row for a thread never written (so that two
        // copies, or a copy and a first write, serialize on it), locks it,
        // renews the lease when this saver holds it, and returns the row.
        let row = pquery_one(tx, &ctx,
                &format!(
                    "INSERT INTO {s}.graph_threads AS g (thread_id, holder, until_ms, generation)
                     VALUES ($1, '', 0, 0)
                     ON CONFLICT (thread_id) DO UPDATE SET until_ms = CASE
                       WHEN $4 AND g.holder = $2
                       THEN (extract(epoch from clock_timestamp()) * 1000)::bigint + $3
                       ELSE g.until_ms END,
                       local_until_ms = CASE WHEN $4 AND g.holder = $2 THEN $5 ELSE g.local_until_ms END,
                       local_generation = CASE WHEN $4 AND g.holder = $2 THEN g.generation ELSE g.local_generation END
                     RETURNING {THREAD_COLUMNS}, (extract(epoch from clock_timestamp()) * 1000)::bigint"
                ),
                &[&thread, &self.me.text(), &self.lease_ms, &head.is_some(), &self.local_until()],
            )
            .await?;
        let now: i64 = row.get(4);
        let row = ThreadRow {
            holder: row.get(0),
            until: row.get(1),
            local_until: row.get(2),
            generation: row.get(3),
        };
        let Some((ns, extends, what, inserting)) = head else {
            self.not_held(thread, &row, now)?;
            return Ok(None);
        };
        let generation = match self.decide(thread, Some(row), now)? {
            LeaseStep::Renew => None,
            LeaseStep::Take(g) => Some(g),
            LeaseStep::TakeIfHead(g) => {
                // The checkpoint being saved may be in the table already: its
                // insert is sent along with this transaction's first statement.
                let latest: Option<String> = pquery_one(tx, &ctx,
                        &format!(
                            "SELECT max(checkpoint_id) FROM {s}.graph_checkpoints
                             WHERE thread_id = $1 AND ns = $2 AND ($3::text IS NULL OR checkpoint_id <> $3)"
                        ),
                        &[&thread, &ns, &inserting],
                    )
                    .await?
                    .get(0);
                if latest.as_deref() != extends {
                    return Err(stale(thread, what));
                }
                Some(g)
            }
        };
        if let Some(g) = generation {
            pexec(
                tx,
                &ctx,
                &format!(
                    "UPDATE {s}.graph_threads SET holder = $2, until_ms = $3, generation = $4,
                       local_until_ms = $5, local_generation = $4 WHERE thread_id = $1"
                ),
                &[
                    &thread,
                    &self.me.text(),
                    &now.saturating_add(self.lease_ms),
                    &g,
                    &self.local_until(),
                ],
            )
            .await?;
        }
        Ok(generation)
    }
}

/// The pending writes of one checkpoint (SQLite), large values read from
/// their blobs and checked.
fn read_writes_sqlite(
    c: &Connection,
    at: &str,
    thread: &str,
    ns: &str,
    id: &str,
    seen: &mut HashSet<(String, blobs::Hash)>,
) -> Result<Vec<Write>> {
    let mut st = c
        .prepare_cached(
            "SELECT w.task_id, w.channel, w.type, w.blob, w.task_path, w.idx, w.blob_hash, b.data
             FROM graph_writes w LEFT JOIN graph_blobs b
               ON b.thread_id = w.thread_id AND b.hash = w.blob_hash
             WHERE w.thread_id = ?1 AND w.ns = ?2 AND w.checkpoint_id = ?3",
        )
        .map_err(|e| sql_err(at, e))?;
    type Raw = (Write, Option<Vec<u8>>, Option<Vec<u8>>);
    let raw = st
        .query_map(params![thread, ns, id], |r| {
            Ok((
                (
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ),
                r.get(6)?,
                r.get(7)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<Raw>, _>>())
        .map_err(|e| sql_err(at, e))?;
    let mut w = raw
        .into_iter()
        .map(|(w, hash, data)| resolve_write(thread, id, w, hash, data, seen))
        .collect::<Result<Vec<Write>>>()?;
    sort_writes(&mut w);
    Ok(w)
}

/// A pending write as read: its stored type checked against whether it
/// names a blob, and the blob's bytes (checked) in place of its own.
fn resolve_write(
    thread: &str,
    checkpoint: &str,
    mut w: Write,
    hash: Option<Vec<u8>>,
    data: Option<Vec<u8>>,
    seen: &mut HashSet<(String, blobs::Hash)>,
) -> Result<Write> {
    let place = write_place(thread, checkpoint, &w);
    w.2 = blobs::read_write_type(&place, &w.2, hash.is_some())?;
    if let Some(hash) = hash {
        w.3 = blobs::checked(&place, thread, &hash, data, seen)?;
    }
    Ok(w)
}

/// Where a pending write is, for errors.
fn write_place(thread: &str, checkpoint: &str, w: &Write) -> String {
    format!(
        "write {} of task {:?} to checkpoint {checkpoint:?} of thread {thread:?}",
        w.5, w.0
    )
}

/// Where a checkpoint's large channel value is, for errors.
fn channel_place(thread: &str, checkpoint: &str, channel: &str) -> String {
    format!("channel {channel:?} of checkpoint {checkpoint:?} of thread {thread:?}")
}

/// The large channel values of one checkpoint (SQLite), read and checked.
fn read_channels_sqlite(
    c: &Connection,
    at: &str,
    thread: &str,
    ns: &str,
    id: &str,
    seen: &mut HashSet<(String, blobs::Hash)>,
) -> Result<Vec<Channel>> {
    let mut st = c
        .prepare_cached(blobs::SQLITE_READ_CHANNELS)
        .map_err(|e| sql_err(at, e))?;
    type Raw = (String, String, Vec<u8>, Option<Vec<u8>>);
    let raw = st
        .query_map(params![thread, ns, id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<Raw>, _>>())
        .map_err(|e| sql_err(at, e))?;
    raw.into_iter()
        .map(|(channel, ty, hash, data)| {
            let place = channel_place(thread, id, &channel);
            let data = blobs::checked(&place, thread, &hash, data, seen)?;
            Ok((channel, ty, data))
        })
        .collect()
}

/// Stores the blobs of a thread it lacks (SQLite, in the caller's
/// transaction, under the thread's lease).
fn put_blobs_sqlite<'b>(
    tx: &rusqlite::Transaction<'_>,
    at: &str,
    thread: &str,
    blobs: impl IntoIterator<Item = &'b Blob>,
) -> Result<()> {
    for b in blobs {
        let have: bool = tx
            .prepare_cached(
                "SELECT count(*) > 0 FROM graph_blobs WHERE thread_id = ?1 AND hash = ?2",
            )
            .and_then(|mut st| st.query_row(params![thread, &b.hash[..]], |r| r.get(0)))
            .map_err(|e| sql_err(at, e))?;
        if !have {
            tx.prepare_cached(blobs::SQLITE_PUT_BLOB)
                .and_then(|mut st| st.execute(params![thread, &b.hash[..], b.data]))
                .map_err(|e| sql_err(at, e))?;
        }
    }
    Ok(())
}

/// Replaces the large channel values a checkpoint refers to (SQLite, in
/// the transaction that saves it), sweeping blobs left without references.
fn put_channels_sqlite(
    tx: &rusqlite::Transaction<'_>,
    at: &str,
    thread: &str,
    ns: &str,
    id: &str,
    channels: &[ChannelBlob],
) -> Result<()> {
    let dropped = tx
        .prepare_cached(
            "DELETE FROM graph_channels WHERE thread_id = ?1 AND ns = ?2 AND checkpoint_id = ?3",
        )
        .and_then(|mut st| st.execute(params![thread, ns, id]))
        .map_err(|e| sql_err(at, e))?;
    put_blobs_sqlite(tx, at, thread, channels.iter().map(|c| &c.blob))?;
    for c in channels {
        tx.prepare_cached(
            "INSERT INTO graph_channels (thread_id, ns, checkpoint_id, channel, type, hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut st| {
            st.execute(params![
                thread,
                ns,
                id,
                c.channel,
                c.r#type,
                &c.blob.hash[..]
            ])
        })
        .map_err(|e| sql_err(at, e))?;
    }
    if dropped > 0 {
        sweep_sqlite(tx, at, thread)?;
    }
    Ok(())
}

/// Deletes the blobs of `thread` nothing refers to any more (SQLite).
fn sweep_sqlite(tx: &rusqlite::Transaction<'_>, at: &str, thread: &str) -> Result<()> {
    tx.prepare_cached(blobs::SQLITE_SWEEP)
        .and_then(|mut st| st.execute([thread]))
        .map(drop)
        .map_err(|e| sql_err(at, e))
}

/// Stores the blobs of a thread it lacks (PostgreSQL, in the caller's
/// transaction, under the thread's lease); each goes in a statement of its
/// own, so that many large values never make one message over the
/// protocol's limit.
async fn put_blobs_pg<'b>(
    tx: &steadfast::postgres::deadpool_postgres::Transaction<'_>,
    s: &str,
    ctx: &str,
    thread: &str,
    blobs: impl IntoIterator<Item = &'b Blob>,
) -> Result<()> {
    let mut wanted: Vec<&Blob> = blobs.into_iter().collect();
    wanted.sort_by_key(|b| b.hash);
    wanted.dedup_by_key(|b| b.hash);
    if wanted.is_empty() {
        return Ok(());
    }
    let names: Vec<&[u8]> = wanted.iter().map(|b| &b.hash[..]).collect();
    let have: HashSet<Vec<u8>> = pquery(
        tx,
        ctx,
        &format!("SELECT hash FROM {s}.graph_blobs WHERE thread_id = $1 AND hash = ANY($2)"),
        &[&thread, &names],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let insert = format!(
        "INSERT INTO {s}.graph_blobs (thread_id, hash, data) VALUES ($1, $2, $3)
         ON CONFLICT (thread_id, hash) DO NOTHING"
    );
    for b in wanted.into_iter().filter(|b| !have.contains(&b.hash[..])) {
        pexec(tx, ctx, &insert, &[&thread, &&b.hash[..], &b.data]).await?;
    }
    Ok(())
}

/// Deletes the blobs of `threads` nothing refers to any more (PostgreSQL).
async fn sweep_pg(
    tx: &steadfast::postgres::deadpool_postgres::Transaction<'_>,
    s: &str,
    ctx: &str,
    threads: &[String],
) -> Result<()> {
    pexec(tx, ctx, &blobs::pg_sweep(s), &[&threads])
        .await
        .map(drop)
}

type Head = (
    String,
    String,
    String,
    Option<String>,
    String,
    Vec<u8>,
    String,
);

fn head_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Head> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

fn head_pg(r: &tokio_postgres::Row) -> Head {
    (
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    )
}

/// A checkpoint row with its writes and large channel values, its stored
/// type read back and checked against the values found.
fn assemble(h: Head, w: Vec<Write>, channels: Vec<Channel>) -> Result<Row> {
    let place = format!("checkpoint {:?} of thread {:?}", h.2, h.0);
    let (ty, want) = blobs::read_checkpoint_type(&place, &h.4)?;
    blobs::check_channel_count(&place, want, channels.len())?;
    Ok((h.0, h.1, h.2, h.3, ty, h.5, h.6, w, channels))
}

const COLS: &str = "thread_id, ns, checkpoint_id, parent_id, type, blob, metadata";

impl GraphStore {
    /// Opens (creating the tables when missing) the graph store a URL names:
    /// `sqlite:PATH`, `postgres://…` (with `?schema=NAME`) or `memory:`.
    /// `lease_seconds` is how long a thread stays this saver's after its
    /// last write.
    pub fn open(url: &str, lease: Duration, encrypt: bool) -> Result<Self> {
        let keys = keyring(encrypt)?;
        steadfast::limits::LEASE
            .check("lease_seconds", lease)
            .map_err(GraphError::InvalidInput)?;
        let (backend, threshold) = if url.starts_with("postgres://")
            || url.starts_with("postgresql://")
        {
            let owned = url.to_string();
            let backend = block(async move { open_pg(&owned).await })?;
            let threshold = match &backend {
                Backend::Pg { store } => store.blob_threshold(),
                Backend::Sqlite { .. } => unreachable!("open_pg opens PostgreSQL"),
            };
            (backend, threshold)
        } else if url.starts_with("sqlite:") || url == "memory:" || url.starts_with("memory:?") {
            let (base, threshold) = steadfast::store::blob::split_url_options("graph store", url)
                .map_err(|e| store_err(&e))?;
            (
                open_sqlite(base)?,
                threshold.unwrap_or(steadfast::store::blob::DEFAULT_BLOB_THRESHOLD),
            )
        } else {
            return Err(store_err(&StoreError::Unsupported(format!(
                "graph store URL {}: expected sqlite:PATH, postgres://… or memory:",
                steadfast::store::redact_url(url)
            ))));
        };
        Ok(GraphStore {
            backend,
            me: Holder {
                owner: steadfast::current_owner(),
                saver: fastrand::u64(..),
            },
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            mine: Mutex::new(HashMap::new()),
            keys,
            threshold,
        })
    }

    /// The size in bytes above which a value is kept as a blob, once per
    /// thread: a pending write's value here, a checkpoint's channel value
    /// by the saver's choice (`?blob_threshold=SIZE` in the URL, 64 KiB by
    /// default).
    pub fn blob_threshold(&self) -> u64 {
        self.threshold
    }

    /// Saves a checkpoint (replacing one with the same id), taking or
    /// renewing the thread's lease in the same transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        thread_id: String,
        ns: String,
        checkpoint_id: String,
        parent_id: Option<String>,
        r#type: String,
        blob: Vec<u8>,
        metadata: String,
        run_id: Option<String>,
        channels: Vec<Channel>,
    ) -> Result<()> {
        self.check_process()?;
        check_blob("the checkpoint", &blob)?;
        blobs::check_type(&format!("checkpoint {checkpoint_id:?}"), &r#type)?;
        let blob = self.seal(
            &checkpoint_context(&thread_id, &ns, &checkpoint_id, &r#type),
            blob,
        )?;
        let channels = self.channel_blobs(&thread_id, &ns, &checkpoint_id, channels)?;
        let r#type = blobs::checkpoint_type(&r#type, channels.len());
        serde_json::from_str::<serde_json::Map<String, Value>>(&metadata).map_err(|e| {
            GraphError::InvalidInput(format!(
                "the metadata of checkpoint {checkpoint_id:?} is not a JSON object: {e}; nothing was written"
            ))
        })?;
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                let what = format!("checkpoint {checkpoint_id:?} (a child of {parent_id:?})");
                let generation =
                    self.lease_sqlite(&tx, at, &thread_id, (&ns, parent_id.as_deref(), &what))?;
                tx.execute("INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (thread_id, ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id,
                       type = excluded.type, blob = excluded.blob, metadata = excluded.metadata, run_id = excluded.run_id",
                    params![thread_id, ns, checkpoint_id, parent_id, r#type, blob, metadata, run_id],
                )
                .map_err(|e| sql_err(at, e))?;
                put_channels_sqlite(&tx, at, &thread_id, &ns, &checkpoint_id, &channels)?;
                tx.commit().map_err(|e| sql_err(at, e))?;
                self.took(&thread_id, generation);
                Ok(())
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = format!("saving checkpoint {checkpoint_id:?} of thread {thread_id:?}");
                let tx = begin(&mut client, &ctx).await?;
                let what = format!("checkpoint {checkpoint_id:?} (a child of {parent_id:?})");
                // The lease and the row go out together (pipelined); the
                // row is rolled back if the lease is refused.
                let head = (ns.as_str(), parent_id.as_deref(), what.as_str(), Some(checkpoint_id.as_str()));
                let sql = format!(
                    "INSERT INTO {s}.graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (thread_id, ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id,
                       type = excluded.type, blob = excluded.blob, metadata = excluded.metadata, run_id = excluded.run_id"
                );
                let row: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                    [&thread_id, &ns, &checkpoint_id, &parent_id, &r#type, &blob, &metadata, &run_id];
                // A checkpoint saved again drops the references it had.
                let drop_refs = format!(
                    "DELETE FROM {s}.graph_channels WHERE thread_id = $1 AND ns = $2 AND checkpoint_id = $3"
                );
                let key: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&thread_id, &ns, &checkpoint_id];
                // Biased: the lease's statement always goes out first, so
                // that the thread's row is locked before any other.
                let (lease, saved, dropped) = tokio::join!(
                    biased;
                    self.lease_pg(&tx, &s, &thread_id, Some(head)),
                    pexec(&tx, &ctx, &sql, &row),
                    pexec(&tx, &ctx, &drop_refs, &key)
                );
                let generation = lease?;
                saved?;
                let dropped = dropped?;
                if !channels.is_empty() {
                    put_blobs_pg(&tx, &s, &ctx, &thread_id, channels.iter().map(|c| &c.blob)).await?;
                    let names: Vec<&str> = channels.iter().map(|c| c.channel.as_str()).collect();
                    let types: Vec<&str> = channels.iter().map(|c| c.r#type.as_str()).collect();
                    let hashes: Vec<&[u8]> = channels.iter().map(|c| &c.blob.hash[..]).collect();
                    pexec(&tx, &ctx,
                        &format!(
                            "INSERT INTO {s}.graph_channels (thread_id, ns, checkpoint_id, channel, type, hash)
                             SELECT $1, $2, $3, c.channel, c.type, c.hash
                             FROM unnest($4::text[], $5::text[], $6::bytea[]) AS c(channel, type, hash)"
                        ),
                        &[&thread_id, &ns, &checkpoint_id, &names, &types, &hashes],
                    )
                    .await?;
                }
                if dropped > 0 {
                    sweep_pg(&tx, &s, &ctx, std::slice::from_ref(&thread_id)).await?;
                }
                commit(tx, &ctx).await?;
                self.took(&thread_id, generation);
                Ok(())
            }),
        }
    }

    /// Saves a task's pending writes: `(idx, channel, type, blob)`; an index
    /// of 0 or more is written once, a negative one (LangGraph's special
    /// channels) replaces what was there. Takes or renews the lease.
    #[allow(clippy::too_many_arguments)]
    pub fn put_writes(
        &self,
        thread_id: String,
        ns: String,
        checkpoint_id: String,
        task_id: String,
        task_path: String,
        writes: Vec<(i64, String, String, Vec<u8>)>,
    ) -> Result<()> {
        self.check_process()?;
        for w in &writes {
            check_blob(&format!("the write to channel {:?}", w.1), &w.3)?;
        }
        let writes = writes
            .into_iter()
            .map(|(idx, channel, ty, blob)| {
                let ctx = write_context(
                    &thread_id,
                    &ns,
                    &checkpoint_id,
                    &task_id,
                    idx,
                    &channel,
                    &ty,
                );
                blobs::check_type(&format!("the write to channel {channel:?}"), &ty)?;
                let (inline, large) = self.write_blob(self.seal(&ctx, blob)?);
                let ty = blobs::write_type(&ty, large.is_some());
                Ok((idx, channel, ty, inline, large))
            })
            .collect::<Result<Vec<_>>>()?;
        // Rows replaced may have held a blob, and a write kept once leaves
        // the blob just stored for it without a reference: sweep after.
        let sweep = writes.iter().any(|w| w.0 < 0 || w.4.is_some());
        const INSERT: &str = "INTO graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash)";
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                let what = format!("writes to checkpoint {checkpoint_id:?}");
                let generation =
                    self.lease_sqlite(&tx, at, &thread_id, (&ns, Some(&checkpoint_id), &what))?;
                for (idx, channel, ty, blob, large) in &writes {
                    let verb = if *idx < 0 {
                        "INSERT OR REPLACE"
                    } else {
                        "INSERT OR IGNORE"
                    };
                    let written = tx
                        .prepare_cached(&format!(
                            "{verb} {INSERT} VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                        ))
                        .and_then(|mut st| {
                            st.execute(params![
                                thread_id,
                                ns,
                                checkpoint_id,
                                task_id,
                                idx,
                                channel,
                                ty,
                                blob,
                                task_path,
                                large.as_ref().map(|b| &b.hash[..])
                            ])
                        })
                        .map_err(|e| sql_err(at, e))?;
                    if written > 0 {
                        put_blobs_sqlite(&tx, at, &thread_id, large)?;
                    }
                }
                if writes.iter().any(|w| w.0 < 0) {
                    sweep_sqlite(&tx, at, &thread_id)?;
                }
                tx.commit().map_err(|e| sql_err(at, e))?;
                self.took(&thread_id, generation);
                Ok(())
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = format!(
                    "saving writes of checkpoint {checkpoint_id:?} of thread {thread_id:?}"
                );
                let tx = begin(&mut client, &ctx).await?;
                let what = format!("writes to checkpoint {checkpoint_id:?}");
                // Two statements at most (writes that replace, writes kept
                // once), sent with the lease (pipelined) and rolled back if the
                // lease is refused.
                let (replace, once): (Vec<_>, Vec<_>) = writes.iter().partition(|w| w.0 < 0);
                let statement = |conflict: &str| {
                    format!(
                        "INSERT INTO {s}.graph_writes (thread_id, ns, checkpoint_id, task_id, task_path, idx, channel, type, blob, blob_hash)
                         SELECT $1, $2, $3, $4, $5, w.idx, w.channel, w.type, w.blob, w.blob_hash
                         FROM unnest($6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::bytea[])
                           AS w(idx, channel, type, blob, blob_hash)
                         ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) {conflict}"
                    )
                };
                fn columns<'a>(ws: &[&'a PgWrite]) -> WriteColumns<'a> {
                    (
                        ws.iter().map(|w| w.0).collect::<Vec<i64>>(),
                        ws.iter().map(|w| w.1.as_str()).collect::<Vec<&str>>(),
                        ws.iter().map(|w| w.2.as_str()).collect::<Vec<&str>>(),
                        ws.iter().map(|w| w.3.as_slice()).collect::<Vec<&[u8]>>(),
                        ws.iter()
                            .map(|w| w.4.as_ref().map(|b| &b.hash[..]))
                            .collect::<Vec<Option<&[u8]>>>(),
                    )
                }
                let (r, o) = (columns(&replace), columns(&once));
                let replace_sql = statement(
                    "DO UPDATE SET channel = excluded.channel, type = excluded.type, blob = excluded.blob,
                       task_path = excluded.task_path, blob_hash = excluded.blob_hash",
                );
                let once_sql = statement("DO NOTHING");
                let head = (
                    ns.as_str(),
                    Some(checkpoint_id.as_str()),
                    what.as_str(),
                    None,
                );
                let (lease, replaced, kept) = tokio::join!(
                    biased;
                    self.lease_pg(&tx, &s, &thread_id, Some(head)),
                    async {
                        if replace.is_empty() {
                            return Ok(0);
                        }
                        pexec(
                            &tx,
                            &ctx,
                            &replace_sql,
                            &[
                                &thread_id,
                                &ns,
                                &checkpoint_id,
                                &task_id,
                                &task_path,
                                &r.0,
                                &r.1,
                                &r.2,
                                &r.3,
                                &r.4,
                            ],
                        )
                        .await
                    },
                    async {
                        if once.is_empty() {
                            return Ok(0);
                        }
                        pexec(
                            &tx,
                            &ctx,
                            &once_sql,
                            &[
                                &thread_id,
                                &ns,
                                &checkpoint_id,
                                &task_id,
                                &task_path,
                                &o.0,
                                &o.1,
                                &o.2,
                                &o.3,
                                &o.4,
                            ],
                        )
                        .await
                    }
                );
                let generation = lease?;
                replaced?;
                kept?;
                put_blobs_pg(
                    &tx,
                    &s,
                    &ctx,
                    &thread_id,
                    writes.iter().filter_map(|w| w.4.as_ref()),
                )
                .await?;
                if sweep {
                    sweep_pg(&tx, &s, &ctx, std::slice::from_ref(&thread_id)).await?;
                }
                commit(tx, &ctx).await?;
                self.took(&thread_id, generation);
                Ok(())
            }),
        }
    }

    /// The checkpoint `checkpoint_id` of a thread's namespace, or its latest
    /// when None, with its pending writes; None when there is none.
    pub fn get(
        &self,
        thread_id: String,
        ns: String,
        checkpoint_id: Option<String>,
    ) -> Result<Option<Row>> {
        let q = ListQuery {
            thread: Some(thread_id),
            ns: Some(ns),
            checkpoint: checkpoint_id,
            before: None,
            limit: Some(1),
            filter: None,
        };
        let mut rows = self.query(q)?;
        rows.truncate(1);
        Ok(rows.pop())
    }

    /// Checkpoints newest first (by id), each with its pending writes. None
    /// for `thread_id` or `ns` means any; `before` keeps ids below it;
    /// `filter` is a JSON object whose keys must each equal the metadata's.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &self,
        thread_id: Option<String>,
        ns: Option<String>,
        checkpoint_id: Option<String>,
        before: Option<String>,
        limit: Option<i128>,
        filter: Option<String>,
    ) -> Result<Vec<Row>> {
        let limit = match limit {
            Some(n) if n < 0 => {
                return Err(GraphError::InvalidInput(format!(
                    "limit={n}: expected 0 or more"
                )))
            }
            // More rows than a signed 64-bit count cannot exist.
            Some(n) => Some(usize::try_from(n.min(i64::MAX as i128)).unwrap_or(usize::MAX)),
            None => None,
        };
        let filter = filter
            .map(|f| {
                serde_json::from_str::<serde_json::Map<String, Value>>(&f).map_err(|e| {
                    GraphError::InvalidInput(format!("the filter is not a JSON object: {e}"))
                })
            })
            .transpose()?
            .filter(|f| !f.is_empty());
        let q = ListQuery {
            thread: thread_id,
            ns,
            checkpoint: checkpoint_id,
            before,
            limit,
            filter,
        };
        self.query(q)
    }

    /// Deletes a thread: its checkpoints and writes in every namespace, and
    /// this saver's lease on it. Held when another live saver writes it.
    pub fn delete_thread(&self, thread_id: String) -> Result<()> {
        self.delete_threads(vec![thread_id], false)
    }

    /// Deletes every checkpoint whose metadata's run id is one of `run_ids`,
    /// with its writes. Held when another live saver writes a thread they
    /// are in.
    pub fn delete_for_runs(&self, run_ids: Vec<String>) -> Result<()> {
        self.check_process()?;
        if run_ids.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                let mut doomed: Vec<(String, String, String)> = Vec::new();
                for run in &run_ids {
                    let mut st = tx
                        .prepare_cached(
                            "SELECT thread_id, ns, checkpoint_id FROM graph_checkpoints WHERE run_id = ?1",
                        )
                        .map_err(|e| sql_err(at, e))?;
                    let found = st
                        .query_map([run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                        .map_err(|e| sql_err(at, e))?;
                    doomed.extend(found);
                }
                let mut threads: Vec<&String> = doomed.iter().map(|d| &d.0).collect();
                threads.sort();
                threads.dedup();
                for t in &threads {
                    self.not_held_sqlite(&tx, at, t)?;
                }
                for (t, ns, id) in &doomed {
                    for table in ["graph_checkpoints", "graph_writes", "graph_channels"] {
                        tx.execute(&format!("DELETE FROM {table} WHERE thread_id = ?1 AND ns = ?2 AND checkpoint_id = ?3"),
                            params![t, ns, id],
                        )
                        .map_err(|e| sql_err(at, e))?;
                    }
                }
                for t in threads {
                    sweep_sqlite(&tx, at, t)?;
                }
                tx.commit().map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = "deleting the checkpoints of runs";
                let tx = begin(&mut client, ctx).await?;
                let threads = pquery(&tx, ctx,
                        &format!(
                            "SELECT DISTINCT thread_id FROM {s}.graph_checkpoints WHERE run_id = ANY($1) ORDER BY 1"
                        ),
                        &[&run_ids],
                    )
                    .await?;
                let threads: Vec<String> = threads.iter().map(|t| t.get(0)).collect();
                for t in &threads {
                    self.lease_pg(&tx, &s, t, None).await?;
                }
                // Only the threads locked above: a thread whose first
                // checkpoint of these runs landed since is left alone.
                for table in ["graph_writes", "graph_channels"] {
                    pexec(
                        &tx,
                        ctx,
                        &format!(
                            "DELETE FROM {s}.{table} w USING {s}.graph_checkpoints c
                             WHERE c.run_id = ANY($1) AND c.thread_id = ANY($2)
                               AND w.thread_id = c.thread_id AND w.ns = c.ns
                               AND w.checkpoint_id = c.checkpoint_id"
                        ),
                        &[&run_ids, &threads],
                    )
                    .await?;
                }
                pexec(
                    &tx,
                    ctx,
                    &format!(
                        "DELETE FROM {s}.graph_checkpoints WHERE run_id = ANY($1) AND thread_id = ANY($2)"
                    ),
                    &[&run_ids, &threads],
                )
                .await?;
                sweep_pg(&tx, &s, ctx, &threads).await?;
                commit(tx, ctx).await
            }),
        }
    }

    /// Copies every checkpoint and write of thread `source` to `target`,
    /// which must have none; one transaction. Held when another live saver
    /// writes `target`.
    pub fn copy_thread(&self, source: String, target: String) -> Result<()> {
        self.check_process()?;
        if source == target {
            return Err(GraphError::InvalidInput(format!(
                "copy_thread: source and target are both {source:?}; nothing was written"
            )));
        }
        if self.keys.is_some() {
            return self.copy_sealed(&source, &target);
        }
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                self.target_free_sqlite(&tx, at, &target)?;
                tx.execute("INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                     SELECT ?2, ns, checkpoint_id, parent_id, type, blob, metadata, run_id
                     FROM graph_checkpoints WHERE thread_id = ?1",
                    params![source, target],
                )
                .map_err(|e| sql_err(at, e))?;
                tx.execute("INSERT OR REPLACE INTO graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash)
                     SELECT ?2, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash
                     FROM graph_writes WHERE thread_id = ?1",
                    params![source, target],
                )
                .and_then(|_| tx.execute("INSERT INTO graph_channels (thread_id, ns, checkpoint_id, channel, type, hash)
                     SELECT ?2, ns, checkpoint_id, channel, type, hash FROM graph_channels WHERE thread_id = ?1",
                    params![source, target],
                ))
                .and_then(|_| tx.execute("INSERT OR IGNORE INTO graph_blobs (thread_id, hash, data)
                     SELECT ?2, hash, data FROM graph_blobs WHERE thread_id = ?1",
                    params![source, target],
                ))
                .map_err(|e| sql_err(at, e))?;
                // Writes the target had without checkpoints may have been
                // replaced, and the source's blobs may not all be wanted.
                sweep_sqlite(&tx, at, &target)?;
                tx.commit().map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = format!("copying thread {source:?} to {target:?}");
                let tx = begin(&mut client, &ctx).await?;
                self.lock_source_and_target_pg(&tx, &s, &source, &target, &ctx).await?;
                pexec(
                    &tx,
                    &ctx,
                    &format!(
                        "INSERT INTO {s}.graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                         SELECT $2, ns, checkpoint_id, parent_id, type, blob, metadata, run_id
                         FROM {s}.graph_checkpoints WHERE thread_id = $1"
                    ),
                    &[&source, &target],
                )
                .await?;
                pexec(
                    &tx,
                    &ctx,
                    &format!(
                        "INSERT INTO {s}.graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash)
                         SELECT $2, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash
                         FROM {s}.graph_writes WHERE thread_id = $1
                         ON CONFLICT DO NOTHING"
                    ),
                    &[&source, &target],
                )
                .await?;
                pexec(
                    &tx,
                    &ctx,
                    &format!(
                        "INSERT INTO {s}.graph_channels (thread_id, ns, checkpoint_id, channel, type, hash)
                         SELECT $2, ns, checkpoint_id, channel, type, hash
                         FROM {s}.graph_channels WHERE thread_id = $1"
                    ),
                    &[&source, &target],
                )
                .await?;
                pexec(
                    &tx,
                    &ctx,
                    &format!(
                        "INSERT INTO {s}.graph_blobs (thread_id, hash, data)
                         SELECT $2, hash, data FROM {s}.graph_blobs WHERE thread_id = $1
                         ON CONFLICT DO NOTHING"
                    ),
                    &[&source, &target],
                )
                .await?;
                sweep_pg(&tx, &s, &ctx, std::slice::from_ref(&target)).await?;
                commit(tx, &ctx).await
            }),
        }
    }

    /// Retention: with `keep_latest`, keeps only the newest checkpoint of
    /// each namespace of each thread (and its writes); otherwise deletes the
    /// threads. One transaction. Refuses (Unsupported) to thin a thread whose
    /// delta channels need its older checkpoints.
    pub fn prune(&self, thread_ids: Vec<String>, keep_latest: bool) -> Result<()> {
        self.check_process()?;
        if !keep_latest {
            return self.delete_threads(thread_ids, true);
        }
        let delta = |thread: &str, metadata: &str| -> Result<()> {
            let Some(m) = metadata_members(metadata) else {
                return Ok(());
            };
            if let Some(k) = DELTA_KEYS.iter().find(|k| m.contains_key(**k)) {
                return Err(GraphError::Unsupported(format!(
                    "prune: thread {thread:?} has delta channels (metadata key {k:?}) whose state needs its older checkpoints; nothing was deleted"
                )));
            }
            Ok(())
        };
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                for t in &thread_ids {
                    self.not_held_sqlite(&tx, at, t)?;
                    let mut st = tx
                        .prepare_cached("SELECT metadata FROM graph_checkpoints WHERE thread_id = ?1")
                        .map_err(|e| sql_err(at, e))?;
                    let metas = st
                        .query_map([t], |r| r.get::<_, String>(0))
                        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                        .map_err(|e| sql_err(at, e))?;
                    for m in metas {
                        delta(t, &m)?;
                    }
                }
                for t in &thread_ids {
                    for table in ["graph_checkpoints", "graph_writes", "graph_channels"] {
                        tx.execute(&format!(
                                "DELETE FROM {table} WHERE thread_id = ?1 AND NOT EXISTS (
                                   SELECT 1 FROM (SELECT ns, max(checkpoint_id) AS latest FROM graph_checkpoints
                                                  WHERE thread_id = ?1 GROUP BY ns) k
                                   WHERE k.ns = {table}.ns AND k.latest = {table}.checkpoint_id)"
                            ),
                            [t],
                        )
                        .map_err(|e| sql_err(at, e))?;
                    }
                    // Only each namespace's latest is left: its parent is gone.
                    tx.execute("UPDATE graph_checkpoints SET parent_id = NULL WHERE thread_id = ?1",
                        [t],
                    )
                    .map_err(|e| sql_err(at, e))?;
                    sweep_sqlite(&tx, at, t)?;
                }
                tx.commit().map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = "pruning threads";
                let tx = begin(&mut client, ctx).await?;
                let mut sorted = thread_ids.clone();
                sorted.sort();
                sorted.dedup();
                for t in &sorted {
                    self.lease_pg(&tx, &s, t, None).await?;
                }
                let metas = pquery(&tx, ctx,
                        &format!("SELECT thread_id, metadata FROM {s}.graph_checkpoints WHERE thread_id = ANY($1)"),
                        &[&sorted],
                    )
                    .await?;
                for m in metas {
                    delta(m.get(0), m.get(1))?;
                }
                let latest = format!(
                    "SELECT thread_id, ns, max(checkpoint_id) AS latest FROM {s}.graph_checkpoints
                     WHERE thread_id = ANY($1) GROUP BY thread_id, ns"
                );
                for table in ["graph_writes", "graph_channels", "graph_checkpoints"] {
                    pexec(
                        &tx,
                        ctx,
                        &format!(
                            "DELETE FROM {s}.{table} x WHERE x.thread_id = ANY($1) AND NOT EXISTS (
                               SELECT 1 FROM ({latest}) k WHERE k.thread_id = x.thread_id AND k.ns = x.ns
                                 AND k.latest = x.checkpoint_id)"
                        ),
                        &[&sorted],
                    )
                    .await?;
                }
                pexec(
                    &tx,
                    ctx,
                    &format!("UPDATE {s}.graph_checkpoints SET parent_id = NULL WHERE thread_id = ANY($1)"),
                    &[&sorted],
                )
                .await?;
                sweep_pg(&tx, &s, ctx, &sorted).await?;
                commit(tx, ctx).await
            }),
        }
    }

    /// Gives up this saver's lease on a thread, so that another may write it
    /// at once. Nothing happens when another saver holds it.
    pub fn release(&self, thread_id: String) -> Result<()> {
        self.release_where(Some(thread_id))
    }

    /// Gives up every lease this saver holds.
    pub fn close(&self) -> Result<()> {
        self.release_where(None)
    }
}

impl GraphStore {
    fn release_where(&self, thread: Option<String>) -> Result<()> {
        self.check_process()?;
        self.forget(thread.as_deref());
        let me = self.me.text();
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                c.execute(
                    "UPDATE graph_threads SET holder = '', until_ms = 0
                     WHERE holder = ?1 AND (?2 IS NULL OR thread_id = ?2)",
                    params![me, thread],
                )
                .map(drop)
                .map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let client = store.connection().await.map_err(|e| store_err(&e))?;
                pexec(
                    &client,
                    "releasing leases",
                    &format!(
                        "UPDATE {s}.graph_threads SET holder = '', until_ms = 0
                             WHERE holder = $1 AND ($2::text IS NULL OR thread_id = $2)"
                    ),
                    &[&me, &thread],
                )
                .await
                .map(drop)
            }),
        }
    }

    fn delete_threads(&self, threads: Vec<String>, _pruning: bool) -> Result<()> {
        self.check_process()?;
        let me = self.me.text();
        let done = match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                for t in &threads {
                    self.not_held_sqlite(&tx, at, t)?;
                }
                for t in &threads {
                    for table in ["graph_checkpoints", "graph_writes", "graph_channels", "graph_blobs"] {
                        tx.execute(&format!("DELETE FROM {table} WHERE thread_id = ?1"), [t])
                            .map_err(|e| sql_err(at, e))?;
                    }
                    tx.execute("UPDATE graph_threads SET holder = '', until_ms = 0 WHERE thread_id = ?1 AND holder = ?2",
                        params![t, me],
                    )
                    .map_err(|e| sql_err(at, e))?;
                }
                tx.commit().map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => {
                block(async {
                    let s = store.quoted_schema();
                    let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                    let ctx = "deleting threads";
                    let tx = begin(&mut client, ctx).await?;
                    let mut sorted = threads.clone();
                    sorted.sort();
                    sorted.dedup();
                    for t in &sorted {
                        self.lease_pg(&tx, &s, t, None).await?;
                    }
                    for table in ["graph_writes", "graph_checkpoints", "graph_channels", "graph_blobs"] {
                        pexec(
                            &tx,
                            ctx,
                            &format!("DELETE FROM {s}.{table} WHERE thread_id = ANY($1)"),
                            &[&sorted],
                        )
                        .await?;
                    }
                    pexec(
                    &tx,
                    ctx,
                    &format!(
                        "UPDATE {s}.graph_threads SET holder = '', until_ms = 0
                         WHERE thread_id = ANY($1) AND holder = $2"
                    ),
                    &[&sorted, &me],
                )
                .await?;
                    commit(tx, ctx).await
                })
            }
        };
        if done.is_ok() {
            for t in &threads {
                self.forget(Some(t));
            }
        }
        done
    }

    /// The rows a `get` or `list` asks for, newest first, with their writes.
    /// The rows of a query with their blobs opened (with encryption).
    fn query(&self, q: ListQuery) -> Result<Vec<Row>> {
        let rows = self.query_raw(q)?;
        rows.into_iter().map(|r| self.open_row(r)).collect()
    }

    fn open_row(&self, mut r: Row) -> Result<Row> {
        let place = format!("checkpoint {:?} of thread {:?}", r.2, r.0);
        r.5 = self.open_blob(&place, &checkpoint_context(&r.0, &r.1, &r.2, &r.4), r.5)?;
        for w in &mut r.7 {
            let place = write_place(&r.0, &r.2, w);
            let ctx = write_context(&r.0, &r.1, &r.2, &w.0, w.5, &w.1, &w.2);
            w.3 = self.open_blob(&place, &ctx, std::mem::take(&mut w.3))?;
        }
        for ch in &mut r.8 {
            let place = channel_place(&r.0, &r.2, &ch.0);
            let ctx = channel_context(&r.0, &r.1, &r.2, &ch.0, &ch.1);
            ch.2 = self.open_blob(&place, &ctx, std::mem::take(&mut ch.2))?;
        }
        Ok(r)
    }

    /// A checkpoint's large channel values on their way in: checked,
    /// sealed (with encryption) and named.
    fn channel_blobs(
        &self,
        thread: &str,
        ns: &str,
        id: &str,
        channels: Vec<Channel>,
    ) -> Result<Vec<ChannelBlob>> {
        let mut seen = HashSet::new();
        channels
            .into_iter()
            .map(|(channel, ty, data)| {
                if !seen.insert(channel.clone()) {
                    return Err(GraphError::InvalidInput(format!(
                        "checkpoint {id:?}: channel {channel:?} is given twice; nothing was written"
                    )));
                }
                check_blob(&format!("the value of channel {channel:?}"), &data)?;
                blobs::check_type(&format!("the value of channel {channel:?}"), &ty)?;
                let data = self.seal(&channel_context(thread, ns, id, &channel, &ty), data)?;
                Ok(ChannelBlob {
                    channel,
                    r#type: ty,
                    blob: Blob::new(data),
                })
            })
            .collect()
    }

    /// A pending write's stored form: its bytes inline, or (over the
    /// threshold) empty, with the blob it refers to.
    fn write_blob(&self, data: Vec<u8>) -> (Vec<u8>, Option<Blob>) {
        if data.len() as u64 > self.threshold {
            (Vec::new(), Some(Blob::new(data)))
        } else {
            (data, None)
        }
    }

    fn seal(&self, context: &[Vec<u8>], plain: Vec<u8>) -> Result<Vec<u8>> {
        match &self.keys {
            None => Ok(plain),
            Some(k) => {
                let parts: Vec<&[u8]> = context.iter().map(Vec::as_slice).collect();
                steadfast::seal::seal_blob(k, &parts, &plain).map_err(|e| store_err(&e))
            }
        }
    }

    fn open_blob(&self, place: &str, context: &[Vec<u8>], stored: Vec<u8>) -> Result<Vec<u8>> {
        match &self.keys {
            None if steadfast::seal::is_sealed_blob(&stored) => {
                Err(store_err(&StoreError::Corrupt {
                    location: place.to_string(),
                    reason: "is encrypted: open the saver with encrypt=True and the key".into(),
                }))
            }
            None => Ok(stored),
            Some(k) => {
                let parts: Vec<&[u8]> = context.iter().map(Vec::as_slice).collect();
                steadfast::seal::open_blob(k, place, &parts, &stored).map_err(|e| store_err(&e))
            }
        }
    }

    /// `copy_thread` with encryption: every blob is opened for the source
    /// row and sealed again for the target's (a seal binds its thread).
    fn copy_sealed(&self, source: &str, target: &str) -> Result<()> {
        let rows = self.query(ListQuery {
            thread: Some(source.to_string()),
            ns: None,
            checkpoint: None,
            before: None,
            limit: None,
            filter: None,
        })?;
        let mut copied = Vec::with_capacity(rows.len());
        for r in rows {
            let blob = self.seal(&checkpoint_context(target, &r.1, &r.2, &r.4), r.5.clone())?;
            let mut writes = Vec::with_capacity(r.7.len());
            for w in &r.7 {
                let ctx = write_context(target, &r.1, &r.2, &w.0, w.5, &w.1, &w.2);
                let (inline, large) = self.write_blob(self.seal(&ctx, w.3.clone())?);
                writes.push((
                    w.0.clone(),
                    w.4.clone(),
                    w.5,
                    w.1.clone(),
                    blobs::write_type(&w.2, large.is_some()),
                    inline,
                    large,
                ));
            }
            let channels = self.channel_blobs(target, &r.1, &r.2, r.8)?;
            let ty = blobs::checkpoint_type(&r.4, channels.len());
            copied.push((r.1, r.2, r.3, ty, blob, r.6, writes, channels));
        }
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| sql_err(at, e))?;
                self.target_free_sqlite(&tx, at, target)?;
                for (ns, id, parent, ty, blob, meta, writes, channels) in &copied {
                    let run_id = run_id_of(meta);
                    tx.execute(
                        "INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![target, ns, id, parent, ty, blob, meta, run_id],
                    )
                    .map_err(|e| sql_err(at, e))?;
                    for (task, path, idx, channel, ty, blob, large) in writes {
                        tx.execute(
                            "INSERT OR REPLACE INTO graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                            params![target, ns, id, task, idx, channel, ty, blob, path, large.as_ref().map(|b| &b.hash[..])],
                        )
                        .map_err(|e| sql_err(at, e))?;
                        put_blobs_sqlite(&tx, at, target, large)?;
                    }
                    put_channels_sqlite(&tx, at, target, ns, id, channels)?;
                }
                sweep_sqlite(&tx, at, target)?;
                tx.commit().map_err(|e| sql_err(at, e))
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = format!("copying thread {source:?} to {target:?}");
                let tx = begin(&mut client, &ctx).await?;
                self.target_free_pg(&tx, &s, target, &ctx).await?;
                for (ns, id, parent, ty, blob, meta, writes, channels) in &copied {
                    let run_id = run_id_of(meta);
                    pexec(
                        &tx,
                        &ctx,
                        &format!(
                            "INSERT INTO {s}.graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata, run_id)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
                        ),
                        &[&target, ns, id, parent, ty, blob, meta, &run_id],
                    )
                    .await?;
                    for (task, path, idx, channel, ty, blob, large) in writes {
                        pexec(
                            &tx,
                            &ctx,
                            &format!(
                                "INSERT INTO {s}.graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, blob_hash)
                                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING"
                            ),
                            &[&target, ns, id, task, idx, channel, ty, blob, path, &large.as_ref().map(|b| &b.hash[..])],
                        )
                        .await?;
                        put_blobs_pg(&tx, &s, &ctx, target, large).await?;
                    }
                    put_blobs_pg(&tx, &s, &ctx, target, channels.iter().map(|c| &c.blob)).await?;
                    for c in channels {
                        pexec(
                            &tx,
                            &ctx,
                            &format!(
                                "INSERT INTO {s}.graph_channels (thread_id, ns, checkpoint_id, channel, type, hash)
                                 VALUES ($1, $2, $3, $4, $5, $6)"
                            ),
                            &[&target, ns, id, &c.channel, &c.r#type, &&c.blob.hash[..]],
                        )
                        .await?;
                    }
                }
                sweep_pg(&tx, &s, &ctx, &[target.to_string()]).await?;
                commit(tx, &ctx).await
            }),
        }
    }

    fn query_raw(&self, mut q: ListQuery) -> Result<Vec<Row>> {
        self.check_process()?;
        // SQL takes a signed 64-bit limit; more rows than that cannot exist.
        q.limit = q.limit.map(|n| n.min(i64::MAX as usize));
        if q.limit == Some(0) {
            return Ok(Vec::new());
        }
        // A filter is applied to each row's metadata here, so the database
        // cannot stop at the limit.
        let sql_limit = if q.filter.is_some() { None } else { q.limit };
        match &self.backend {
            Backend::Sqlite { .. } => self.sqlite(|c, at| {
                // One read transaction: the checkpoints, their writes and
                // their blobs from one snapshot.
                let c = c.transaction().map_err(|e| sql_err(at, e))?;
                let (rest, values) = q.sql(sql_limit, |i| format!("?{i}"));
                let sql = format!("SELECT {COLS} FROM graph_checkpoints {rest}");
                let args: Vec<&dyn rusqlite::ToSql> =
                    values.iter().map(|v| *v as &dyn rusqlite::ToSql).collect();
                let mut st = c.prepare_cached(&sql).map_err(|e| sql_err(at, e))?;
                let mut rows = st.query(args.as_slice()).map_err(|e| sql_err(at, e))?;
                let mut heads = Vec::new();
                while let Some(r) = rows.next().map_err(|e| sql_err(at, e))? {
                    let h = head_row(r).map_err(|e| sql_err(at, e))?;
                    if q.keep(h, &mut heads) {
                        break;
                    }
                }
                drop(rows);
                drop(st);
                let mut seen = HashSet::new();
                let read = heads
                    .into_iter()
                    .map(|h| {
                        let w = read_writes_sqlite(&c, at, &h.0, &h.1, &h.2, &mut seen)?;
                        let ch = read_channels_sqlite(&c, at, &h.0, &h.1, &h.2, &mut seen)?;
                        assemble(h, w, ch)
                    })
                    .collect::<Result<Vec<Row>>>()?;
                c.commit().map_err(|e| sql_err(at, e))?;
                Ok(read)
            }),
            Backend::Pg { store } => block(async {
                let s = store.quoted_schema();
                let mut client = store.connection().await.map_err(|e| store_err(&e))?;
                let ctx = "reading checkpoints";
                // One snapshot for the checkpoints, their writes and blobs.
                let client = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(|e| pg_err(ctx, e))?;
                let (rest, values) = q.sql(sql_limit, |i| format!("${i}"));
                let sql = format!("SELECT {COLS} FROM {s}.graph_checkpoints {rest}");
                let args: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
                    .iter()
                    .map(|v| *v as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                let rows = pquery(&client, ctx, &sql, &args).await?;
                let mut heads = Vec::new();
                for r in &rows {
                    if q.keep(head_pg(r), &mut heads) {
                        break;
                    }
                }
                if heads.is_empty() {
                    return Ok(Vec::new());
                }
                let threads: Vec<&str> = heads.iter().map(|h| h.0.as_str()).collect();
                let namespaces: Vec<&str> = heads.iter().map(|h| h.1.as_str()).collect();
                let ids: Vec<&str> = heads.iter().map(|h| h.2.as_str()).collect();
                let writes_sql = format!(
                    "SELECT w.thread_id, w.ns, w.checkpoint_id, w.task_id, w.channel, w.type, w.blob,
                       w.task_path, w.idx, w.blob_hash, b.data
                     FROM {s}.graph_writes w LEFT JOIN {s}.graph_blobs b
                       ON b.thread_id = w.thread_id AND b.hash = w.blob_hash
                     WHERE (w.thread_id, w.ns, w.checkpoint_id) IN (
                       SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))"
                );
                let channels_sql = blobs::pg_read_channels(&s);
                let keys: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&threads, &namespaces, &ids];
                let (writes, channels) = tokio::join!(
                    pquery(&client, ctx, &writes_sql, &keys),
                    pquery(&client, ctx, &channels_sql, &keys)
                );
                let mut seen = HashSet::new();
                type Key = (String, String, String);
                let mut by_key: HashMap<Key, Vec<Write>> = HashMap::new();
                for r in writes? {
                    let key: Key = (r.get(0), r.get(1), r.get(2));
                    let w: Write = (r.get(3), r.get(4), r.get(5), r.get(6), r.get(7), r.get(8));
                    let w = resolve_write(&key.0, &key.2, w, r.get(9), r.get(10), &mut seen)?;
                    by_key.entry(key).or_default().push(w);
                }
                let mut channels_of: HashMap<Key, Vec<Channel>> = HashMap::new();
                for r in channels? {
                    let key: Key = (r.get(0), r.get(1), r.get(2));
                    let channel: String = r.get(3);
                    let hash: Vec<u8> = r.get(5);
                    let place = channel_place(&key.0, &key.2, &channel);
                    let data = blobs::checked(&place, &key.0, &hash, r.get(6), &mut seen)?;
                    channels_of
                        .entry(key)
                        .or_default()
                        .push((channel, r.get(4), data));
                }
                let read = heads
                    .into_iter()
                    .map(|h| {
                        let key = (h.0.clone(), h.1.clone(), h.2.clone());
                        let mut w = by_key.remove(&key).unwrap_or_default();
                        sort_writes(&mut w);
                        let ch = channels_of.remove(&key).unwrap_or_default();
                        assemble(h, w, ch)
                    })
                    .collect::<Result<Vec<Row>>>()?;
                commit(client, ctx).await?;
                Ok(read)
            }),
        }
    }
}
