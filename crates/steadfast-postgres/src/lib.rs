//! The PostgreSQL store of Steadfast (`postgres://…`, `postgresql://…`), for
//! runs shared by workers on many machines.
//!
//! - **Layout.** A schema of its own (`?schema=NAME`, default `steadfast`),
//!   named in every statement (never through `search_path`, which
//!   connection poolers drop): a row per run in `runs` (the columns that
//!   `list` and workers filter on, the rest of the head as one JSON text,
//!   the last full state snapshot) and a row per completed step in `steps`
//!   (the history, whose updates since the snapshot also rebuild the
//!   state). A save appends the step's update and rewrites only the head;
//!   the state is snapshotted again only when the updates since the last
//!   snapshot outweigh it. Migrations are numbered and run in one
//!   transaction; a schema from a newer build is refused.
//! - **Compare-and-swap.** A fresh run is inserted only if absent; every
//!   other save is `UPDATE … WHERE version = $n`. Errors are mapped to the
//!   portable kinds by SQLSTATE. A connection lost during COMMIT is an
//!   unknown outcome, which the run loop resolves by loading the run.
//! - **Group commit.** Concurrent saves from one process share one
//!   transaction (one WAL flush), each member its own version check, so a
//!   conflicting member fails alone. A save is acknowledged only after
//!   COMMIT returned. Durability is the server's: with the default
//!   `synchronous_commit=on` and `fsync=on`, a returned COMMIT is on disk;
//!   [`PgStore::settings`] reads both back.
//! - **Workers.** Due runs are found through a partial index over runnable
//!   runs only and reserved with `FOR UPDATE SKIP LOCKED`; `LISTEN/NOTIFY`
//!   wakes idle workers when a run is started or decided. Leases, timers
//!   and gate timeouts are judged by the database server's clock.
//! - **TLS** through rustls: `sslmode=require` encrypts, `verify-full` also
//!   checks the certificate (`sslrootcert=PATH`, else the Mozilla roots).
//!
//! ```no_run
//! # async fn demo() -> Result<(), steadfast_core::StoreError> {
//! use steadfast_postgres::PgStore;
//! let store = PgStore::connect("postgres://app@db.internal/prod?schema=agents&sslmode=verify-full").await?;
//! # Ok(()) }
//! ```

mod blobs;
mod error;
mod schema;
mod url;
mod writer;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use steadfast_core::store::blob::{decision_refs, refs_of, resolve_decisions, BlobHash, Resolver};
use steadfast_core::store::check_events;
use steadfast_core::store::head::encode_head_with_blobs;
use steadfast_core::store::plan::{conflict, expect_version, plan_save_with_blobs, Plan};
use steadfast_core::store::rows::{
    no_row_to_fold, rebuild, still_merged, to_i64, HistoryRow, Place, RecordRow, SummaryRow,
};
use steadfast_core::store::{DueRequest, Rewrite, RunCache, SaveRequest};
use steadfast_core::{
    BlobTotals, Blobs, Capabilities, Document, Documents, Events, History, NewEvent, RunEvent,
    Schedule, Usage,
};
use steadfast_core::{
    Checkpoint, Clock, ListFilter, RunStatus, RunSummary, StepRecord, Store, StoreError,
    StoreErrorKind, SystemClock, Timestamp,
};
use tokio::sync::{oneshot, Notify};

use crate::error::{map_err, pool_err};
pub use crate::schema::SCHEMA_VERSION;
pub use crate::url::DEFAULT_SCHEMA;
use crate::writer::{SaveJob, StepRow, Writer};
/// The client crates, re-exported so that users of [`PgStore::connection`]
/// name the same versions.
pub use {deadpool_postgres, tokio_postgres};

pub use steadfast_core::store::blob::DEFAULT_BLOB_THRESHOLD;

/// Default limit of one run's state: 64 MiB.
pub const DEFAULT_MAX_STATE_BYTES: u64 = 64 << 20;

/// Default number of connections a store keeps: 16.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// The URL schemes this store answers to.
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Options of a [`PgStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PgOptions {
    /// The largest state (serialized) of one run.
    pub max_state_bytes: u64,
    /// The most connections the store opens.
    pub pool_size: usize,
    /// Whether connecting may create the schema. Without it, a missing
    /// schema is [`StoreError::NotFound`], for commands that only read.
    pub create: bool,
    /// The size (JSON text, bytes) above which a value is stored once as a
    /// blob named by its SHA-256 and referred to from the records (default
    /// [`DEFAULT_BLOB_THRESHOLD`]; `?blob_threshold=SIZE` in a URL, which
    /// wins over this).
    pub blob_threshold: u64,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            pool_size: DEFAULT_POOL_SIZE,
            create: true,
            blob_threshold: DEFAULT_BLOB_THRESHOLD,
        }
    }
}

impl PgOptions {
    /// Sets the per-run state limit.
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = bytes;
        self
    }
    /// Sets the most connections (at least 2: saves and reads).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(2);
        self
    }
    /// Sets whether connecting may create the schema.
    pub fn create(mut self, yes: bool) -> Self {
        self.create = yes;
        self
    }
    /// Sets the size above which a value is stored as a blob (checked when
    /// the store connects: 256 bytes to 1 GiB).
    pub fn blob_threshold(mut self, bytes: u64) -> Self {
        self.blob_threshold = bytes;
        self
    }
}

/// The durability settings of the server, read back from it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// `synchronous_commit`: `on` (or `remote_apply`, `remote_write`) makes a
    /// returned COMMIT durable; `off` and `local` with no standby... see the
    /// PostgreSQL manual.
    pub synchronous_commit: String,
    /// `fsync`: must be `on`.
    pub fsync: String,
    /// `server_version`.
    pub server_version: String,
    /// Whether the connection is encrypted (`pg_stat_ssl`).
    pub tls: bool,
}

/// Counters of a store's write transactions; see [`PgStore::write_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteStats {
    /// Transactions committed.
    pub commits: u64,
    /// Saves in them.
    pub writes: u64,
}

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.shared.display)
            .field("opts", &self.shared.opts)
            .finish_non_exhaustive()
    }
}

/// Every statement's text, with the schema filled in.
pub(crate) struct Sql {
    pub insert: String,
    pub update: String,
    load: String,
    history: String,
    list: String,
    delete: String,
    delete_if: String,
    delete_rows: String,
    claim: String,
    version: String,
    events_append: String,
    events_read: String,
    delete_events: String,
}

impl Sql {
    fn new(q: &str) -> Sql {
        let steps_upsert = "INSERT INTO {s}.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
             SELECT run_id, $14, $15, $16, $17, $18, $19 FROM h WHERE $15::text IS NOT NULL
             ON CONFLICT (run_id, idx) DO UPDATE SET name = EXCLUDED.name, update_json = EXCLUDED.update_json,
                 attempt = EXCLUDED.attempt, started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at";
        let text = |s: &str| s.replace("{steps}", steps_upsert).replace("{s}", q);
        Sql {
            // $2 (expected) and $13 (delta bytes) are unused by a fresh
            // insert but typed, so that both statements take one list. $20
            // is the version written: expected + 1, or an imported one.
            insert: text(
                "WITH h AS (
                    INSERT INTO {s}.runs (run_id, workflow, status, next, version, created_at, updated_at, head,
                        snapshot, snapshot_steps, snapshot_next, snapshot_bytes, delta_bytes, wake_at)
                    SELECT $1, $3, $4, $5, $20, $6, $7, $8, $10, $11, $5, $12, 0, $9
                    WHERE $2::bigint IS NULL AND $13::bigint = 0
                    ON CONFLICT (run_id) DO NOTHING
                    RETURNING run_id, next, snapshot_bytes, delta_bytes),
                 s AS ({steps})
                 SELECT next, snapshot_bytes, delta_bytes,
                        EXISTS (SELECT 1 FROM {s}.blob_refs b WHERE b.run_id = $1) FROM h",
            ),
            update: text(
                "WITH h AS (
                    UPDATE {s}.runs SET workflow = $3, status = $4, next = COALESCE($5, next),
                        version = $20, created_at = $6, updated_at = $7, head = $8, wake_at = $9,
                        claimed_by = NULL, claimed_until = NULL,
                        snapshot = COALESCE($10, snapshot),
                        snapshot_steps = COALESCE($11, snapshot_steps),
                        snapshot_next = CASE WHEN $10::text IS NULL THEN snapshot_next ELSE $5 END,
                        snapshot_bytes = COALESCE($12, snapshot_bytes),
                        delta_bytes = CASE WHEN $10::text IS NULL THEN delta_bytes + $13 ELSE 0 END
                    WHERE run_id = $1 AND version = $2
                    RETURNING run_id, next, snapshot_bytes, delta_bytes),
                 s AS ({steps})
                 SELECT next, snapshot_bytes, delta_bytes FROM h",
            ),
            load: text(
                "SELECT workflow, status, next, version, created_at, updated_at, head,
                        snapshot, snapshot_steps, snapshot_next, snapshot_bytes, delta_bytes,
                        ARRAY(SELECT s.idx FROM {s}.steps s WHERE s.run_id = r.run_id
                              AND s.idx >= r.snapshot_next AND s.idx < r.next ORDER BY s.idx),
                        ARRAY(SELECT s.name FROM {s}.steps s WHERE s.run_id = r.run_id
                              AND s.idx >= r.snapshot_next AND s.idx < r.next ORDER BY s.idx),
                        ARRAY(SELECT s.update_json FROM {s}.steps s WHERE s.run_id = r.run_id
                              AND s.idx >= r.snapshot_next AND s.idx < r.next ORDER BY s.idx),
                        EXISTS (SELECT 1 FROM {s}.blob_refs b WHERE b.run_id = r.run_id)
                 FROM {s}.runs r WHERE r.run_id = $1",
            ),
            history: text(
                "SELECT s.idx, s.name, s.update_json, s.attempt, s.started_at, s.finished_at
                 FROM {s}.runs r LEFT JOIN {s}.steps s ON s.run_id = r.run_id AND s.idx < r.next
                 WHERE r.run_id = $1 ORDER BY s.idx",
            ),
            list: text(
                "SELECT run_id, workflow, status, next, version, created_at, updated_at, head FROM {s}.runs
                 WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR workflow = $2)
                   AND ($3::bigint IS NULL OR updated_at < $3) AND ($4::text IS NULL OR run_id > $4)
                 ORDER BY run_id LIMIT $5",
            ),
            // The run's row first: once it is deleted, every writer of the
            // run has committed or waits, and `delete_rows`, a statement of
            // its own (so with a snapshot taken after that), sees all the
            // rows and references they wrote.
            delete: text(
                "WITH d AS (DELETE FROM {s}.runs WHERE run_id = $1 RETURNING run_id)
                 SELECT count(*) FROM d",
            ),
            // The version the statement's snapshot saw comes back too, to
            // tell a conflict from an absent run.
            delete_if: text(
                "WITH d AS (DELETE FROM {s}.runs WHERE run_id = $1 AND version = $2 RETURNING run_id)
                 SELECT (SELECT count(*) FROM d), (SELECT version FROM {s}.runs WHERE run_id = $1)",
            ),
            // The history and references of a run just deleted; the blobs
            // they were the last to refer to go next (`blobs::free`).
            delete_rows: text(
                "WITH s AS (DELETE FROM {s}.steps WHERE run_id = $1),
                      e AS (DELETE FROM {s}.events WHERE run_id = $1),
                      b AS (DELETE FROM {s}.blob_refs WHERE run_id = $1 RETURNING hash)
                 SELECT ARRAY(SELECT hash FROM b)",
            ),
            // Numbered after the run's last event: two appends that race
            // read the same last number, and the second to commit fails on
            // the primary key and is tried again (`append_events`).
            // Watchers listening on the schema's channel (`$7`) are told.
            events_append: text(
                "WITH last AS (SELECT coalesce(max(seq), 0) AS n FROM {s}.events WHERE run_id = $1),
                      ins AS (
                        INSERT INTO {s}.events (run_id, seq, step, attempt, at, first, value)
                        SELECT $1, last.n + e.ord, e.step, e.attempt, e.at, e.first, e.value
                        FROM last, unnest($2::text[], $3::integer[], $4::bigint[], $5::boolean[], $6::text[])
                             WITH ORDINALITY AS e(step, attempt, at, first, value, ord)
                        RETURNING seq)
                 SELECT (SELECT max(seq) FROM ins), pg_notify($7, 'events')",
            ),
            delete_events: text("DELETE FROM {s}.events WHERE run_id = $1"),
            events_read: text(
                "SELECT seq, step, attempt, at, first, value FROM {s}.events
                 WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            ),
            // The server's clock decides what is due; a reservation lapses
            // by itself after the hold. The order is core's `fair_order`:
            // priority (highest first), then each run's turn within its
            // priority and partition, then the partitions' order drawn from
            // the seed ($6), then the due time and id. A run's place is
            // read from the end of its head's text, where `encode_head`
            // keeps it (after the last `"queue":{`: a decision's data may
            // hold a key of that name earlier), with plain string functions
            // (never parsed as JSON nor cast unchecked: no stored head can
            // make the claim fail).
            // Locked rows are skipped among a few more candidates than
            // asked for, so that workers claiming at once do not wait on
            // each other.
            claim: text(
                "WITH placed AS (
                    SELECT run_id, wake_at,
                        CASE WHEN strpos(head, '\"queue\":{') > 0
                             THEN reverse(split_part(reverse(right(head, 200)), '{:\"eueuq\"', 1)) END AS q
                    FROM {s}.runs
                    WHERE wake_at IS NOT NULL
                      AND wake_at <= (extract(epoch FROM statement_timestamp()) * 1000)::bigint
                      AND workflow = ANY($1) AND NOT (run_id = ANY($5))
                      AND (claimed_until IS NULL OR claimed_by = $2
                           OR claimed_until <= (extract(epoch FROM statement_timestamp()) * 1000)::bigint)),
                 queued AS (
                    SELECT run_id, wake_at,
                        COALESCE(substring(q from '^\"priority\":(-?[0-9]{1,4})[,}]')::int, 0) AS priority,
                        NULLIF(split_part(split_part(q, '\"partition\":\"', 2), '\"', 1), '') AS partition
                    FROM (SELECT run_id, wake_at,
                              CASE WHEN right(q, 2) = '}}' AND strpos(q, '{') = 0 THEN q END AS q
                          FROM placed) p),
                 turns AS (
                    SELECT run_id, wake_at, priority, partition,
                        row_number() OVER (PARTITION BY priority, partition ORDER BY wake_at, run_id) AS turn
                    FROM queued),
                 picked AS (
                    SELECT run_id, row_number() OVER (
                        ORDER BY priority DESC, turn,
                            substr(sha256(convert_to($6 || ' ' || COALESCE(partition, ''), 'UTF8')), 1, 8),
                            wake_at, run_id) AS ord
                    FROM turns
                    ORDER BY ord LIMIT $3::bigint * 2 + 16),
                 due AS (
                    SELECT r.run_id FROM {s}.runs r JOIN picked p ON r.run_id = p.run_id
                    WHERE r.wake_at IS NOT NULL
                      AND r.wake_at <= (extract(epoch FROM statement_timestamp()) * 1000)::bigint
                      AND r.workflow = ANY($1)
                      AND (r.claimed_until IS NULL OR r.claimed_by = $2
                           OR r.claimed_until <= (extract(epoch FROM statement_timestamp()) * 1000)::bigint)
                    ORDER BY p.ord LIMIT $3
                    FOR UPDATE OF r SKIP LOCKED)
                 UPDATE {s}.runs r SET claimed_by = $2,
                     claimed_until = (extract(epoch FROM statement_timestamp()) * 1000)::bigint + $4
                 FROM due WHERE r.run_id = due.run_id
                 RETURNING r.run_id, r.workflow, r.status, r.next, r.version, r.created_at, r.updated_at, r.head",
            ),
            version: text("SELECT version FROM {s}.runs WHERE run_id = $1"),
        }
    }
}

pub(crate) struct Shared {
    pub pool: Pool,
    pub schema: String,
    pub display: String,
    pub sql: Sql,
    pub writer: Writer,
    accts: RunCache<writer::Acct>,
    opts: PgOptions,
    clock: Arc<DbClock>,
    wake: Arc<Notify>,
    /// Woken (all waiters) when events were appended to some run.
    events_wake: Arc<Notify>,
    listener: Mutex<Option<tokio::task::AbortHandle>>,
    listen: (
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    ),
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(h) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

/// The database server's clock, read through this machine's monotonic
/// clock: the server's time is read when the store connects and again each
/// time a worker looks for due runs, and between two readings it advances
/// with this machine's monotonic clock. So leases and timers are judged by
/// one clock for all workers, and setting a worker's wall clock (by hand or
/// by NTP) changes nothing.
#[derive(Debug)]
pub struct DbClock {
    /// The server's time (ms since the epoch) at the instant beside it.
    anchor: Mutex<(i64, Instant)>,
}

impl Clock for DbClock {
    fn now(&self) -> Timestamp {
        let (server, at) = *self.anchor.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = at.elapsed().as_millis().min(i64::MAX as u128) as i64;
        Timestamp::from_unix_millis(server.saturating_add(elapsed).max(0) as u64)
    }
}

impl PgStore {
    /// Connects with default options; see [`PgStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// Connects to the database a `postgres://` URL names, creates the schema
    /// if missing (when `opts.create`), and migrates it to this build's
    /// version. A schema with other tables and no Steadfast marker, or from a
    /// newer build, is refused and left as it was.
    pub async fn connect_with(url: &str, mut opts: PgOptions) -> Result<Self, StoreError> {
        let parsed = url::parse(url)?;
        if let Some(t) = parsed.blob_threshold {
            opts.blob_threshold = t;
        }
        steadfast_core::store::blob::check_threshold(opts.blob_threshold)?;
        let tls = url::connector(&parsed.tls)?;
        let mgr = Manager::from_config(
            parsed.config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(opts.pool_size.max(2))
            .wait_timeout(Some(Duration::from_secs(30)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::InvalidInput(format!("store URL {}: {e}", parsed.display)))?;
        let display = parsed.display.clone();
        {
            let mut client = pool
                .get()
                .await
                .map_err(|e| pool_err(e, &format!("connecting to {display}")))?;
            if !opts.create {
                let exists = client
                    .query_opt(
                        "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                        &[&parsed.schema],
                    )
                    .await
                    .map_err(|e| {
                        map_err(
                            e,
                            &format!("looking for schema {} in {display}", parsed.schema),
                        )
                    })?;
                if exists.is_none() {
                    return Err(StoreError::NotFound(format!(
                        "no store: schema {} does not exist in {display}",
                        parsed.schema
                    )));
                }
            }
            let client: &mut tokio_postgres::Client = &mut client;
            schema::migrate(client, &parsed.schema).await?;
        }
        let q = schema::quote(&parsed.schema);
        let store = PgStore {
            shared: Arc::new(Shared {
                pool,
                sql: Sql::new(&q),
                schema: parsed.schema.clone(),
                display,
                writer: Writer::default(),
                accts: RunCache::new(steadfast_core::store::plan::KNOWN_RUNS),
                opts,
                clock: Arc::new(DbClock {
                    anchor: Mutex::new((SystemClock.now().unix_millis() as i64, Instant::now())),
                }),
                wake: Arc::new(Notify::new()),
                events_wake: Arc::new(Notify::new()),
                listener: Mutex::new(None),
                listen: (parsed.config, tls),
            }),
        };
        store.sync_clock().await?;
        Ok(store)
    }

    /// A connection from the store's pool, for tables of one's own kept
    /// beside the store's in its schema (the Python package keeps LangGraph
    /// checkpoints so). The caller names its tables with
    /// [`quoted_schema`](Self::quoted_schema) and must not touch the store's.
    pub async fn connection(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.shared
            .pool
            .get()
            .await
            .map_err(|e| pool_err(e, &format!("connecting to {}", self.shared.display)))
    }

    /// The store's schema, quoted for use in SQL.
    pub fn quoted_schema(&self) -> String {
        schema::quote(&self.shared.schema)
    }

    /// The store's URL with any password hidden, for messages.
    pub fn display_url(&self) -> &str {
        &self.shared.display
    }

    /// A PostgreSQL error as a store error, with what was being done.
    pub fn map_error(e: tokio_postgres::Error, context: &str) -> StoreError {
        map_err(e, context)
    }

    /// The size above which a value is stored as a blob (`?blob_threshold=`
    /// in the URL, [`PgOptions::blob_threshold`]); tables of the caller's
    /// in the same schema may keep their own large values by it.
    pub fn blob_threshold(&self) -> u64 {
        self.shared.opts.blob_threshold
    }

    /// The schema the store lives in.
    pub fn schema(&self) -> &str {
        &self.shared.schema
    }

    /// How many transactions this handle committed and how many saves they
    /// carried: with concurrent runs, more writes than commits is group
    /// commit at work.
    pub fn write_stats(&self) -> WriteStats {
        let (commits, writes) = self.shared.writer.queue.counts();
        WriteStats { commits, writes }
    }

    /// The server's durability settings.
    pub async fn settings(&self) -> Result<Settings, StoreError> {
        let client = self.client().await?;
        let ctx = || format!("reading the settings of {}", self.shared.display);
        let get = |name: &'static str| {
            let client = &client;
            async move {
                client
                    .query_one(&format!("SHOW {name}"), &[])
                    .await
                    .map(|r| r.get::<_, String>(0))
            }
        };
        Ok(Settings {
            synchronous_commit: get("synchronous_commit")
                .await
                .map_err(|e| map_err(e, &ctx()))?,
            fsync: get("fsync").await.map_err(|e| map_err(e, &ctx()))?,
            server_version: get("server_version")
                .await
                .map_err(|e| map_err(e, &ctx()))?,
            tls: client
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map(|r| r.get::<_, bool>(0))
                .map_err(|e| map_err(e, &ctx()))?,
        })
    }

    /// Drops the store's schema and everything in it. For tests and
    /// teardown; there is no undo.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                schema::quote(&self.shared.schema)
            ))
            .await
            .map_err(|e| map_err(e, &format!("dropping schema {}", self.shared.schema)))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.connection().await
    }

    /// Reads the server's clock, taken as of the middle of the round trip.
    async fn sync_clock(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let sent = Instant::now();
        let row = client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .await
            .map_err(|e| map_err(e, &format!("reading the clock of {}", self.shared.display)))?;
        let server: i64 = row.get(0);
        let mid = sent + sent.elapsed() / 2;
        *self
            .shared
            .clock
            .anchor
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = (server, mid);
        Ok(())
    }

    /// Starts the task that listens for work notifications, if it is not
    /// running: one connection of its own, reconnected when it drops (and
    /// then every waiter is woken, since notifications may have been missed).
    fn ensure_listener(&self) {
        let mut slot = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let (config, tls) = self.shared.listen.clone();
        let wake = Arc::clone(&self.shared.wake);
        let events_wake = Arc::clone(&self.shared.events_wake);
        let channel = self.shared.schema.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok((client, mut conn)) = config.connect(tls.clone()).await {
                    let wake2 = Arc::clone(&wake);
                    let events2 = Arc::clone(&events_wake);
                    let driver = tokio::spawn(async move {
                        let mut messages =
                            futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                        while let Some(Ok(msg)) = messages.next().await {
                            if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                                if n.payload() == EVENTS_PAYLOAD {
                                    events2.notify_waiters();
                                } else {
                                    wake2.notify_one();
                                }
                            }
                        }
                    });
                    if client
                        .batch_execute(&format!("LISTEN \"{channel}\""))
                        .await
                        .is_ok()
                    {
                        wake.notify_one();
                        events_wake.notify_waiters();
                        let _ = driver.await;
                    } else {
                        driver.abort();
                    }
                    drop(client);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        *slot = Some(task.abort_handle());
    }
}

/// The URL's stored version of a run, for a conflict's message.
pub(crate) async fn stored_version(shared: &Shared, run_id: &str) -> Option<u64> {
    let client = shared.pool.get().await.ok()?;
    let row = client
        .query_opt(&shared.sql.version, &[&run_id])
        .await
        .ok()??;
    u64::try_from(row.get::<_, i64>(0)).ok()
}

/// A lone write statement whose answer never came may have taken effect:
/// its outcome is unknown, not merely unavailable.
fn write_error(err: StoreError, run_id: &str) -> StoreError {
    if err.kind() == StoreErrorKind::Unavailable {
        StoreError::OutcomeUnknown {
            run_id: run_id.to_string(),
            source: err.into(),
        }
    } else {
        err
    }
}

/// Connects to the store a `postgres://` or `postgresql://` URL names (`rest`
/// is what follows the scheme and its colon), creating the schema only when
/// `create` is set.
pub async fn open_url(
    scheme: &str,
    rest: &str,
    create: bool,
) -> Result<Arc<dyn Store>, StoreError> {
    let url = format!("{scheme}:{rest}");
    Ok(Arc::new(
        PgStore::connect_with(&url, PgOptions::default().create(create)).await?,
    ))
}

/// This store as a backend of the facade: `postgres://…`.
pub const BACKEND: steadfast_core::store::backend::Backend =
    steadfast_core::store::backend::Backend::new(
        "postgres",
        URL_SCHEMES,
        "postgres://…",
        "many workers on many machines",
        |scheme, rest, create| Box::pin(open_url(scheme, rest, create)),
    );

/// How messages name a column of run `run_id` in this store.
pub(crate) fn locate(store: &Shared, run_id: &str) -> impl Fn(&str) -> String + Sync {
    let at = format!("{} {}.runs[{run_id:?}]", store.display, store.schema);
    move |column: &str| format!("{at}.{column}")
}

impl PgStore {
    fn decode(
        &self,
        run_id: &str,
        row: &tokio_postgres::Row,
    ) -> Result<(Checkpoint, writer::Acct), StoreError> {
        let locate = locate(&self.shared, run_id);
        let record = RecordRow {
            workflow: row.get(0),
            status: row.get(1),
            next: row.get(2),
            version: row.get(3),
            created_at: row.get(4),
            updated_at: row.get(5),
            head: row.get(6),
            snapshot: row.get(7),
            snapshot_completed: row.get(8),
            snapshot_next: row.get(9),
            snapshot_bytes: row.get(10),
            delta_bytes: row.get(11),
        };
        let idxs: Vec<i64> = row.get(12);
        let names: Vec<String> = row.get(13);
        let updates: Vec<String> = row.get(14);
        let deltas = idxs.into_iter().zip(names).zip(updates);
        let deltas = deltas.map(|((idx, name), text)| Ok((idx, name, text)));
        let (cp, known) = rebuild(&Place::new(run_id, &locate), record, deltas)?;
        let refs = row.get(15);
        Ok((cp, writer::Acct { known, refs }))
    }

    /// A run's row as a checkpoint, its values put back: when its state or
    /// a decision refers to blobs, the row is read again with them in one read-only
    /// `REPEATABLE READ` transaction, so that a rewrite or a delete
    /// committed between two reads cannot take a blob from under the load.
    async fn load_row(
        &self,
        client: &mut deadpool_postgres::Object,
        run_id: &str,
        row: &tokio_postgres::Row,
    ) -> Result<Option<(Checkpoint, writer::Acct)>, StoreError> {
        let (mut cp, known) = self.decode(run_id, row)?;
        let locate = locate(&self.shared, run_id);
        let place = Place::new(run_id, &locate);
        if refs_of(&cp.state).is_empty() && decision_refs(&cp).is_empty() {
            // Escaped values only, if any.
            steadfast_core::store::blob::resolve_object(
                &mut cp.state,
                &place,
                "state",
                &mut |_, _| Ok(None),
            )?;
            resolve_decisions(&mut cp, &place, &mut |_, _| Ok(None))?;
            return Ok(Some((cp, known)));
        }
        let ctx = || format!("loading run {run_id:?} from {}", self.shared.display);
        let tx = self.read_snapshot(client, &ctx).await?;
        let stmt = tx
            .prepare_cached(&self.shared.sql.load)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let Some(row) = tx
            .query_opt(&stmt, &[&run_id])
            .await
            .map_err(|e| map_err(e, &ctx()))?
        else {
            return Ok(None);
        };
        let (mut cp, known) = self.decode(run_id, &row)?;
        let q = self.quoted_schema();
        let mut wanted = refs_of(&cp.state);
        for r in decision_refs(&cp) {
            if !wanted.contains(&r) {
                wanted.push(r);
            }
        }
        let mut got = blobs::fetch_all(tx.client(), &q, &wanted, &ctx()).await?;
        tx.commit().await.map_err(|e| map_err(e, &ctx()))?;
        // A blob is taken once: a decision's data often is the state's
        // value under the gate's name, which the resolver keeps opened.
        let mut fetch = |h: &BlobHash, _: u64| Ok(got.remove(h).flatten());
        Resolver::new(&mut fetch).resolve_record(&mut cp, &place)?;
        Ok(Some((cp, known)))
    }

    /// A read-only transaction that sees one snapshot throughout.
    async fn read_snapshot<'c>(
        &self,
        client: &'c mut deadpool_postgres::Object,
        ctx: &(dyn Fn() -> String + Sync),
    ) -> Result<deadpool_postgres::Transaction<'c>, StoreError> {
        client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| map_err(e, &ctx()))
    }

    /// Deletes run `run_id` (only at `version`, when given) with its
    /// references, and the blobs they were the last to refer to, in one
    /// transaction. Returns the statement's row: whether the run was
    /// deleted and, for `delete_if`, the version it found.
    async fn delete_with_blobs(
        &self,
        run_id: &str,
        version: Option<i64>,
    ) -> Result<tokio_postgres::Row, StoreError> {
        let ctx = || format!("deleting run {run_id:?} from {}", self.shared.display);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| map_err(e, &ctx()))?;
        let row = match version {
            None => {
                let stmt = tx
                    .prepare_cached(&self.shared.sql.delete)
                    .await
                    .map_err(|e| map_err(e, &ctx()))?;
                tx.query_one(&stmt, &[&run_id]).await
            }
            Some(v) => {
                let stmt = tx
                    .prepare_cached(&self.shared.sql.delete_if)
                    .await
                    .map_err(|e| map_err(e, &ctx()))?;
                tx.query_one(&stmt, &[&run_id, &v]).await
            }
        }
        .map_err(|e| map_err(e, &ctx()))?;
        if row.get::<_, i64>(0) == 0 && version.is_none() {
            // Events may be there without the run (emitted before its first
            // save): they go too.
            let stmt = tx
                .prepare_cached(&self.shared.sql.delete_events)
                .await
                .map_err(|e| map_err(e, &ctx()))?;
            tx.execute(&stmt, &[&run_id])
                .await
                .map_err(|e| map_err(e, &ctx()))?;
        }
        if row.get::<_, i64>(0) > 0 {
            let stmt = tx
                .prepare_cached(&self.shared.sql.delete_rows)
                .await
                .map_err(|e| map_err(e, &ctx()))?;
            let released: Vec<Vec<u8>> = tx
                .query_one(&stmt, &[&run_id])
                .await
                .map_err(|e| map_err(e, &ctx()))?
                .get(0);
            blobs::free(tx.client(), &self.quoted_schema(), released)
                .await
                .map_err(|e| error::race_is_transient(e, &ctx()))?;
        }
        tx.commit()
            .await
            .map_err(|e| write_error(map_err(e, &ctx()), run_id))?;
        Ok(row)
    }
}

#[async_trait]
impl Store for PgStore {
    fn capabilities(&self) -> Capabilities<'_> {
        let clock = Arc::clone(&self.shared.clock) as Arc<dyn Clock>;
        Capabilities::none()
            .history(self)
            .schedule(self)
            .clock(clock)
            .max_state_bytes(self.shared.opts.max_state_bytes)
            .blobs(self)
            .events(self)
            .documents(self)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let mut client = self.client().await?;
        let ctx = || format!("loading run {run_id:?} from {}", self.shared.display);
        let stmt = client
            .prepare_cached(&self.shared.sql.load)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let row = client
            .query_opt(&stmt, &[&run_id])
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        // A load that fails (damage, say) forgets what was known of the run:
        // the next save plans from the stored record, not from before.
        let loaded = match row {
            Some(row) => self
                .load_row(&mut client, run_id, &row)
                .await
                .inspect_err(|_| self.shared.accts.set(run_id, None))?,
            None => None,
        };
        drop(client);
        let Some((cp, acct)) = loaded else {
            self.shared.accts.set(run_id, None);
            return Ok(None);
        };
        self.shared.accts.set(run_id, Some(acct));
        Ok(Some(cp))
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let cp = req.checkpoint;
        let run_id = &cp.run_id;
        let acct = self.shared.accts.get(run_id);
        let threshold = self.shared.opts.blob_threshold;
        let (plan, mut blobs) = plan_save_with_blobs(
            &req,
            acct.as_ref().map(|a| &a.known),
            self.shared.opts.max_state_bytes,
            threshold,
        )?;
        // A decision's large data is a blob too, written with the record.
        let head = encode_head_with_blobs(cp, threshold, &mut blobs)?;
        // Whether the stored run may refer to blobs: what the last load or
        // save of this process saw, if the run is still at that version (no
        // one else can have added a reference without moving the version,
        // and this save expects it), otherwise yes.
        let refs_before = match (&acct, req.expected) {
            (Some(a), Some(v)) if a.known.version == v => a.refs,
            _ => true,
        };
        // A new snapshot of a stored run (a rewind's included) may replace
        // the last reference to some blobs: its transaction counts again. A
        // run that refers to none has nothing to count, and its save stays
        // one statement.
        let recount =
            matches!(plan, Plan::Snapshot { .. }) && req.expected.is_some() && refs_before;
        let (next, snapshot, delta_bytes, step) = match plan {
            Plan::Head => (None, None, 0, None),
            Plan::Delta { step } => (
                Some(cp.next),
                None,
                to_i64(run_id, "update size", step.update.len() as u64)?,
                Some(step),
            ),
            Plan::Snapshot {
                state,
                completed,
                step,
            } => {
                let bytes = to_i64(run_id, "state size", state.len() as u64)?;
                (Some(cp.next), Some((state, completed, bytes)), 0, step)
            }
        };
        let next = next.map(|n| to_i64(run_id, "next", n as u64)).transpose()?;
        let step = step.map(|s| StepRow::of(s, run_id)).transpose()?;
        let wake_at = cp.runnable_at();
        // Workers hear of runs that became runnable now without a worker
        // of their own: started, or decided at a gate.
        let notify = cp.status != RunStatus::Running && wake_at.is_some_and(|t| t <= cp.updated_at);
        let (tx, rx) = oneshot::channel();
        writer::submit(
            &self.shared,
            SaveJob {
                run_id: run_id.clone(),
                expected: req.expected,
                version: to_i64(run_id, "version", req.new_version())?,
                workflow: cp.workflow.clone(),
                status: cp.status.as_str(),
                next,
                created_at: to_i64(run_id, "created_at", cp.created_at.unix_millis())?,
                updated_at: to_i64(run_id, "updated_at", cp.updated_at.unix_millis())?,
                head,
                wake_at: wake_at
                    .map(|t| to_i64(run_id, "wake time", t.unix_millis()))
                    .transpose()?,
                snapshot,
                delta_bytes,
                step,
                notify,
                blobs,
                recount,
                refs_before,
                deadlocks: 0,
                reply: tx,
                ticket: 0,
            },
        )
        .await;
        let result = rx.await.map_err(|_| StoreError::OutcomeUnknown {
            run_id: run_id.clone(),
            source: "the committing task stopped before it answered".into(),
        })?;
        self.shared.accts.after_save(cp, &result);
        result.map(|a| a.known.version)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        let client = self.client().await?;
        let ctx = || format!("listing runs in {}", self.shared.display);
        let stmt = client
            .prepare_cached(&self.shared.sql.list)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let limit = filter.limit.map(|l| l.min(i64::MAX as usize) as i64);
        let rows = client
            .query(
                &stmt,
                &[
                    &filter.status.map(|s| s.as_str()),
                    &filter.workflow,
                    &filter
                        .updated_before
                        .map(|t| t.unix_millis().min(i64::MAX as u64) as i64),
                    &filter.after,
                    &limit,
                ],
            )
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        rows.iter().map(|r| self.summary(r)).collect()
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.shared.accts.set(run_id, None);
        let row = self.delete_with_blobs(run_id, None).await?;
        Ok(row.get::<_, i64>(0) > 0)
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        let ctx = || format!("deleting run {run_id:?} from {}", self.shared.display);
        self.shared.accts.set(run_id, None);
        let row = self
            .delete_with_blobs(run_id, Some(to_i64(run_id, "version", version)?))
            .await?;
        if row.get::<_, i64>(0) > 0 {
            return Ok(true);
        }
        // The statement's snapshot may predate a delete that won the race:
        // look again before calling it a conflict.
        let found = match row.get::<_, Option<i64>>(1) {
            None => None,
            Some(_) => self
                .client()
                .await?
                .query_opt(&self.shared.sql.version, &[&run_id])
                .await
                .map_err(|e| map_err(e, &ctx()))?
                .map(|r| r.get::<_, i64>(0)),
        };
        match found {
            None => Ok(false),
            Some(found) => Err(conflict(run_id, Some(version), u64::try_from(found).ok())),
        }
    }
}

/// How many times an append that lost a race for its numbers is tried
/// again before the conflict is returned.
const EVENT_APPEND_TRIES: usize = 64;

/// Each write is one statement, committed as a save is.
/// The least text greater than every text that starts with `prefix`, in
/// code point order (`None`: there is none, as for an empty prefix).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last as u32 + 1 {
            0xD800 => Some('\u{E000}'),
            n => char::from_u32(n),
        };
        if let Some(c) = next {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[async_trait]
impl Documents for PgStore {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        let ctx = || format!("reading document {key:?} in {}", self.shared.display);
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT value, version FROM {}.documents WHERE key = $1",
                    self.schema_q()
                ),
                &[&key],
            )
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        row.map(|r| self.document_of(key, r.get(0), r.get(1)))
            .transpose()
    }

    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        steadfast_core::store::check_document(key, value)?;
        let text = steadfast_core::store::encode_json(value, key, "document")?;
        let ctx = || format!("writing document {key:?} in {}", self.shared.display);
        let s = &self.schema_q();
        let client = self.client().await?;
        let n = match expected {
            None => client
                .execute(
                    &format!("INSERT INTO {s}.documents (key, value, version) VALUES ($1, $2, 1) ON CONFLICT (key) DO NOTHING"),
                    &[&key, &text],
                )
                .await,
            Some(v) => {
                let v = i64::try_from(v).unwrap_or(i64::MAX - 1);
                client
                    .execute(
                        &format!("UPDATE {s}.documents SET value = $2, version = $3 + 1 WHERE key = $1 AND version = $3"),
                        &[&key, &text, &v],
                    )
                    .await
            }
        }
        .map_err(|e| map_err(e, &ctx()))?;
        if n == 0 {
            let found: Option<i64> = client
                .query_opt(
                    &format!("SELECT version FROM {s}.documents WHERE key = $1"),
                    &[&key],
                )
                .await
                .map_err(|e| map_err(e, &ctx()))?
                .map(|r| r.get(0));
            return Err(StoreError::Conflict {
                run_id: key.to_string(),
                expected,
                found: found.and_then(|v| u64::try_from(v).ok()),
            });
        }
        Ok(expected.map_or(1, |v| v + 1))
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        let ctx = || format!("listing documents in {}", self.shared.display);
        let client = self.client().await?;
        // A range of the key's index (collation "C": code point order), so
        // that a listing reads only its keys, not the whole table.
        let rows = match prefix_end(prefix) {
            Some(end) => {
                client
                    .query(
                        &format!(
                            "SELECT key, value, version FROM {}.documents WHERE key >= $1 AND key < $2 AND starts_with(key, $1) ORDER BY key",
                            self.schema_q()
                        ),
                        &[&prefix, &end],
                    )
                    .await
            }
            None => {
                client
                    .query(
                        &format!(
                            "SELECT key, value, version FROM {}.documents WHERE key >= $1 AND starts_with(key, $1) ORDER BY key",
                            self.schema_q()
                        ),
                        &[&prefix],
                    )
                    .await
            }
        }
        .map_err(|e| map_err(e, &ctx()))?;
        rows.iter()
            .map(|r| self.document_of(r.get::<_, &str>(0), r.get(1), r.get(2)))
            .collect()
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        let ctx = || format!("deleting document {key:?} in {}", self.shared.display);
        let client = self.client().await?;
        let v = i64::try_from(expected).unwrap_or(i64::MAX);
        let n = client
            .execute(
                &format!(
                    "DELETE FROM {}.documents WHERE key = $1 AND version = $2",
                    self.schema_q()
                ),
                &[&key, &v],
            )
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        Ok(n > 0)
    }
}

impl PgStore {
    /// The schema's name, quoted for SQL.
    fn schema_q(&self) -> String {
        crate::schema::quote(&self.shared.schema)
    }

    /// A document row read back ([`decode_document`](steadfast_core::store::decode_document)).
    fn document_of(&self, key: &str, text: String, version: i64) -> Result<Document, StoreError> {
        let version = u64::try_from(version).unwrap_or(0);
        steadfast_core::store::decode_document(key, &text, version, &self.shared.display)
    }
}

#[async_trait]
impl Events for PgStore {
    /// One statement, which also tells the watchers that listen on the
    /// schema's channel (at commit).
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        steadfast_core::validate_run_id(run_id)
            .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
        let texts = check_events(run_id, events)?;
        let ctx = || {
            format!(
                "appending events to run {run_id:?} in {}",
                self.shared.display
            )
        };
        let steps: Vec<&str> = events.iter().map(|e| e.step.as_str()).collect();
        let attempts: Vec<i32> = events
            .iter()
            .map(|e| i32::try_from(e.attempt).unwrap_or(i32::MAX))
            .collect();
        let ats = events
            .iter()
            .map(|e| to_i64(run_id, "an event's time", e.at.unix_millis()))
            .collect::<Result<Vec<i64>, _>>()?;
        let firsts: Vec<bool> = events.iter().map(|e| e.first).collect();
        let channel = self.events_channel();
        let mut tries = 0;
        loop {
            tries += 1;
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&self.shared.sql.events_append)
                .await
                .map_err(|e| map_err(e, &ctx()))?;
            match client
                .query_one(
                    &stmt,
                    &[&run_id, &steps, &attempts, &ats, &firsts, &texts, &channel],
                )
                .await
            {
                Ok(row) => {
                    let last: Option<i64> = row.get(0);
                    return last.and_then(|n| u64::try_from(n).ok()).ok_or_else(|| {
                        StoreError::unavailable(format!("{}: no number came back", ctx()))
                    });
                }
                Err(e) => {
                    let err = map_err(e, &ctx());
                    if err.kind() != StoreErrorKind::Conflict || tries >= EVENT_APPEND_TRIES {
                        return Err(write_error(err, run_id));
                    }
                    // Another append took these numbers first.
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(100..2_000))).await;
                }
            }
        }
    }

    /// Woken by the notification of any append in the schema (LISTEN on a
    /// connection of its own), or after `timeout`.
    async fn wait_for_events(&self, _run_id: &str, timeout: Duration) {
        self.ensure_listener();
        let _ = tokio::time::timeout(timeout, self.shared.events_wake.notified()).await;
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let ctx = || {
            format!(
                "reading the events of run {run_id:?} in {}",
                self.shared.display
            )
        };
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&self.shared.sql.events_read)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(&stmt, &[&run_id, &after, &limit])
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let corrupt = |reason: String| StoreError::Corrupt {
                    location: format!(
                        "{}, events of run {run_id:?}, event {seq}",
                        self.shared.display
                    ),
                    reason,
                };
                let text: String = r.get(5);
                let value = serde_json::from_str(&text)
                    .map_err(|e| corrupt(format!("its value is not JSON: {e}")))?;
                let (Ok(seq), Ok(attempt), Ok(at)) = (
                    u64::try_from(seq),
                    u32::try_from(r.get::<_, i32>(2)),
                    u64::try_from(r.get::<_, i64>(3)),
                ) else {
                    return Err(corrupt(
                        "its number, attempt or time is out of range".into(),
                    ));
                };
                let mut event = NewEvent::new(
                    r.get::<_, String>(1),
                    attempt,
                    steadfast_core::Timestamp::from_unix_millis(at),
                    value,
                );
                event.first = r.get(4);
                Ok(event.numbered(seq))
            })
            .collect()
    }
}

/// The payload of an append's notification on the schema's channel (the
/// workers' wake-ups say `work`).
const EVENTS_PAYLOAD: &str = "events";

impl PgStore {
    /// The channel appends notify: the schema's, as for workers.
    fn events_channel(&self) -> String {
        self.shared.schema.clone()
    }
}

#[async_trait]
impl History for PgStore {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let mut client = self.client().await?;
        let ctx = || {
            format!(
                "reading the history of run {run_id:?} in {}",
                self.shared.display
            )
        };
        let stmt = client
            .prepare_cached(&self.shared.sql.history)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let rows = client
            .query(&stmt, &[&run_id])
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let locate = locate(&self.shared, run_id);
        let place = Place::new(run_id, &locate);
        let marked = rows.iter().any(|r| {
            r.get::<_, Option<&str>>(2)
                .is_some_and(|t| t.contains(steadfast_core::store::blob::MARK))
        });
        if !marked {
            return history_records(&rows, &place).map(Some);
        }
        // Rows that refer to blobs (or escape values): read again with the
        // blobs in one snapshot, and open each blob once.
        let tx = self.read_snapshot(&mut client, &ctx).await?;
        let rows = tx
            .query(&stmt, &[&run_id])
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = history_records(&rows, &place)?;
        let mut wanted = Vec::new();
        for record in &out {
            wanted.extend(refs_of(&record.update));
        }
        let q = self.quoted_schema();
        let mut got = blobs::fetch_all(tx.client(), &q, &wanted, &ctx()).await?;
        tx.commit().await.map_err(|e| map_err(e, &ctx()))?;
        let mut fetch = |h: &BlobHash, _: u64| Ok(got.remove(h).flatten());
        Resolver::new(&mut fetch)
            .resolve_rows(&mut out, &place, |i| format!("steps[{i}].update_json"))?;
        Ok(Some(out))
    }
    /// Applies `rewrite` in one statement guarded by the version, then
    /// stores the blobs its rows refer to and counts the run's references
    /// again, in one transaction.
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let (rows, new_blobs) = rewrite.rows_with_blobs(run_id, self.shared.opts.blob_threshold)?;
        // A rewrite may add references (rows written inline before are
        // stored as blobs now) without a save: what was known of the run is
        // forgotten, before and after, so that its next save counts again.
        self.shared.accts.set(run_id, None);
        let done = self
            .rewrite_rows(run_id, expected, &rewrite, rows, new_blobs)
            .await;
        self.shared.accts.set(run_id, None);
        done
    }
}

impl PgStore {
    /// [`History::rewrite`]'s transaction.
    async fn rewrite_rows(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: &Rewrite<'_>,
        rows: Vec<(i64, String)>,
        new_blobs: Vec<steadfast_core::store::blob::Blob>,
    ) -> Result<(), StoreError> {
        let (idx, texts): (Vec<i64>, Vec<String>) = rows.into_iter().unzip();
        let delete_below = rewrite.delete_below().map(|i| i as i64);
        let mut client = self.client().await?;
        let ctx = || {
            format!(
                "rewriting the history of run {run_id:?} in {}",
                self.shared.display
            )
        };
        // One statement: the run's row locked, the version and every index
        // checked, then the rows replaced (or none). Rows from the snapshot
        // on are merged into the state by a load, so they are refused.
        let q = format!("\"{}\"", self.shared.schema);
        let sql = format!(
            "WITH r AS (SELECT version, snapshot_next AS next FROM {q}.runs WHERE run_id = $1 FOR UPDATE),
                  ok AS (SELECT 1 FROM r WHERE r.version = $2
                         AND NOT EXISTS (SELECT 1 FROM unnest($3::bigint[]) i WHERE i >= r.next)),
                  u AS (UPDATE {q}.steps s SET update_json = x.update_json
                        FROM unnest($3::bigint[], $4::text[]) AS x(idx, update_json)
                        WHERE s.run_id = $1 AND s.idx = x.idx AND EXISTS (SELECT 1 FROM ok)
                        RETURNING 1),
                  d AS (DELETE FROM {q}.steps s
                        WHERE s.run_id = $1 AND s.idx < $5::bigint AND EXISTS (SELECT 1 FROM ok)
                          AND EXISTS (SELECT 1 FROM {q}.steps f WHERE f.run_id = $1 AND f.idx = $5::bigint))
             SELECT (SELECT version FROM r), (SELECT next FROM r), (SELECT count(*) FROM u)"
        );
        let tx = client.transaction().await.map_err(|e| map_err(e, &ctx()))?;
        let row = tx
            .query_one(
                &sql,
                &[
                    &run_id,
                    &to_i64(run_id, "version", expected)?,
                    &idx,
                    &texts,
                    &delete_below,
                ],
            )
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let version: Option<i64> = row.get(0);
        let next: Option<i64> = row.get(1);
        expect_version(
            run_id,
            expected,
            version.and_then(|v| u64::try_from(v).ok()),
        )?;
        if let Some(i) = idx.iter().find(|i| Some(**i) >= next) {
            let next = next.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
            return Err(still_merged(run_id, u64::try_from(*i).unwrap_or(0), next));
        }
        if let Some(below) = delete_below.filter(|_| row.get::<_, i64>(2) == 0) {
            return Err(no_row_to_fold(run_id, u64::try_from(below).unwrap_or(0)));
        }
        // The rows replaced or folded away may have been the last to refer
        // to some blobs.
        let q = self.quoted_schema();
        let locate = locate(&self.shared, run_id);
        blobs::write(&tx, &q, run_id, &new_blobs)
            .await
            .map_err(|e| error::race_is_transient(e, &ctx()))?;
        blobs::recount(tx.client(), &q, run_id, &Place::new(run_id, &locate))
            .await
            .map_err(|e| error::race_is_transient(e, &ctx()))?;
        tx.commit()
            .await
            .map_err(|e| write_error(map_err(e, &ctx()), run_id))
    }
}

#[async_trait]
impl Blobs for PgStore {
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError> {
        let client = self.client().await?;
        blobs::usage(&client, &self.quoted_schema(), run_id)
            .await
            .map_err(|e| {
                map_err(
                    e,
                    &format!("measuring run {run_id:?} in {}", self.shared.display),
                )
            })
    }

    fn threshold(&self) -> u64 {
        self.shared.opts.blob_threshold
    }

    async fn blob_totals(&self) -> Result<BlobTotals, StoreError> {
        let client = self.client().await?;
        blobs::totals(&client, &self.quoted_schema())
            .await
            .map_err(|e| {
                map_err(
                    e,
                    &format!("measuring the blobs of {}", self.shared.display),
                )
            })
    }
}

#[async_trait]
impl Schedule for PgStore {
    async fn claim_due(&self, due: &DueRequest<'_>) -> Result<Vec<RunSummary>, StoreError> {
        // Keep the worker's clock in step with the server's while it polls.
        self.sync_clock().await?;
        let client = self.client().await?;
        let ctx = || format!("looking for due runs in {}", self.shared.display);
        let stmt = client
            .prepare_cached(&self.shared.sql.claim)
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        let workflows: Vec<&str> = due.workflows.to_vec();
        let skip: Vec<&str> = due.skip.to_vec();
        let limit = due.limit.min(10_000) as i64;
        let hold = due.hold.as_millis().min(i64::MAX as u128) as i64;
        // A fresh seed per claim: the partitions' order within a round is
        // drawn anew (core's `fair_order`).
        let seed = fastrand::u64(..).to_string();
        let rows = client
            .query(
                &stmt,
                &[&workflows, &due.worker, &limit, &hold, &skip, &seed],
            )
            .await
            .map_err(|e| map_err(e, &ctx()))?;
        rows.iter().map(|r| self.summary(r)).collect()
    }
    async fn wait_for_work(&self, timeout: Duration) {
        self.ensure_listener();
        let _ = tokio::time::timeout(timeout, self.shared.wake.notified()).await;
    }
}

/// The history rows of a run as records, their values as stored.
fn history_records(
    rows: &[tokio_postgres::Row],
    place: &Place<'_>,
) -> Result<Vec<StepRecord>, StoreError> {
    let mut out = Vec::new();
    for r in rows {
        let Some(idx) = r.get::<_, Option<i64>>(0) else {
            continue;
        };
        let row = HistoryRow::new(idx, r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        out.push(row.record(place)?);
    }
    Ok(out)
}

impl PgStore {
    fn summary(&self, r: &tokio_postgres::Row) -> Result<RunSummary, StoreError> {
        let run_id: String = r.get(0);
        let locate = locate(&self.shared, &run_id);
        let row = SummaryRow {
            run_id: run_id.clone(),
            workflow: r.get(1),
            status: r.get(2),
            next: r.get(3),
            version: r.get(4),
            created_at: r.get(5),
            updated_at: r.get(6),
            head: r.get(7),
        };
        row.summary(&Place::new(&run_id, &locate))
    }
}

#[cfg(test)]
mod prefix_end_tests {
    use super::prefix_end;

    #[test]
    fn the_end_of_a_prefix_bounds_exactly_its_extensions() {
        assert_eq!(prefix_end("limit:").as_deref(), Some("limit;"));
        assert_eq!(prefix_end("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        let end = prefix_end("ab/").expect("an end");
        for key in ["ab/", "ab/x", "ab/\u{10FFFF}\u{10FFFF}"] {
            assert!(key >= "ab/" && key < end.as_str(), "{key}");
        }
        for key in ["ab", "ab0", "ac"] {
            assert!(!(key >= "ab/" && key < end.as_str()), "{key}");
        }
    }
}
