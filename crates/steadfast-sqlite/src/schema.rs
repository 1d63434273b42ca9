//! The database schema and its numbered migrations.
//!
//! `PRAGMA user_version` holds the number of migrations applied. Each is applied
//! in one transaction with the version bump; a database from a newer build is
//! refused rather than guessed at.

use rusqlite::Connection;
use steadfast_core::store::layout::{check_version, not_ours, pending};
use steadfast_core::StoreError;

use crate::error::map_err;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: one row per run (its head, plus the last full state snapshot and what
    // the deltas since it weigh) and one row per completed step (the history,
    // whose updates after `snapshot_next` also rebuild the state).
    "CREATE TABLE runs (
        run_id             TEXT PRIMARY KEY NOT NULL,
        workflow           TEXT NOT NULL,
        status             TEXT NOT NULL,
        next               INTEGER NOT NULL,
        version            INTEGER NOT NULL,
        format             INTEGER NOT NULL,
        created_at         INTEGER NOT NULL,
        updated_at         INTEGER NOT NULL,
        attempts           INTEGER NOT NULL,
        error              TEXT,
        writer             INTEGER NOT NULL,
        snapshot           TEXT NOT NULL,
        snapshot_completed TEXT NOT NULL,
        snapshot_next      INTEGER NOT NULL,
        snapshot_bytes     INTEGER NOT NULL,
        delta_bytes        INTEGER NOT NULL
    );
    CREATE INDEX runs_by_status ON runs (status, run_id);
    CREATE INDEX runs_by_workflow ON runs (workflow, run_id);
    CREATE TABLE steps (
        run_id      TEXT NOT NULL,
        idx         INTEGER NOT NULL,
        name        TEXT NOT NULL,
        update_json TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL,
        PRIMARY KEY (run_id, idx)
    );",
    // 2: leases, gate and timer waits, and gate decisions, as JSON.
    "ALTER TABLE runs ADD COLUMN lease TEXT;
     ALTER TABLE runs ADD COLUMN wait TEXT;
     ALTER TABLE runs ADD COLUMN decisions TEXT;",
    // 3: the head as one JSON document; only what `list` filters or sorts on
    // keeps a column of its own, so a new checkpoint field needs no migration.
    // A value that is not valid JSON is carried over as a string, so that its
    // run alone reads as corrupt, not the whole database.
    "ALTER TABLE runs ADD COLUMN head TEXT NOT NULL DEFAULT '{}';
     UPDATE runs SET head = json_object(
         'format', format, 'attempts', attempts, 'writer', writer,
         'error', CASE WHEN json_valid(error) THEN json(error) ELSE error END,
         'lease', CASE WHEN json_valid(lease) THEN json(lease) ELSE lease END,
         'wait', CASE WHEN json_valid(wait) THEN json(wait) ELSE wait END,
         'decisions', CASE WHEN decisions IS NULL THEN json('[]')
                           WHEN json_valid(decisions) THEN json(decisions) ELSE decisions END);
     ALTER TABLE runs DROP COLUMN format;
     ALTER TABLE runs DROP COLUMN attempts;
     ALTER TABLE runs DROP COLUMN error;
     ALTER TABLE runs DROP COLUMN writer;
     ALTER TABLE runs DROP COLUMN lease;
     ALTER TABLE runs DROP COLUMN wait;
     ALTER TABLE runs DROP COLUMN decisions;",
    // 4: the history clustered by its key (WITHOUT ROWID), so that recording
    // a step writes one b-tree, not a table and its key's index: a
    // checkpoint with an update under about 1 KB dirties a page fewer (a
    // larger one spills to overflow pages either way). Copied in key order;
    // the copy needs free space about the history's size, twice over while
    // the log holds it.
    "CREATE TABLE steps_clustered (
        run_id      TEXT NOT NULL,
        idx         INTEGER NOT NULL,
        name        TEXT NOT NULL,
        update_json TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL,
        PRIMARY KEY (run_id, idx)
    ) WITHOUT ROWID;
    INSERT INTO steps_clustered SELECT run_id, idx, name, update_json, attempt, started_at,
        finished_at, duration_ms FROM steps ORDER BY run_id, idx;
    DROP TABLE steps;
    ALTER TABLE steps_clustered RENAME TO steps;",
    // 5: a step whose save leaves the run's head as it was (same status,
    // workflow and head document) is recorded by its history row alone, so
    // that an ordinary checkpoint writes one b-tree page, not two. Rows at or
    // above the head's `next` are such steps: each carries the version, the
    // time and the writer number of its save, and the last of them is the
    // run's progress. The next save that rewrites the head takes them into
    // it. Rows written before this migration lie below `next` and keep NULL
    // here. A process of an older build still running on the file would
    // read the head alone and write over such rows: the trigger refuses its
    // head writes, which all set the version (this build takes the rows in
    // first, so never trips it).
    "ALTER TABLE steps ADD COLUMN version INTEGER;
     ALTER TABLE steps ADD COLUMN saved_at INTEGER;
     ALTER TABLE steps ADD COLUMN writer TEXT;
     CREATE TRIGGER runs_behind_progress BEFORE UPDATE OF version ON runs
     WHEN NEW.version < (SELECT max(version) FROM steps WHERE run_id = OLD.run_id AND idx >= OLD.next)
     BEGIN
         SELECT RAISE(ABORT, 'this run has steps recorded by a newer build of Steadfast (schema 5): upgrade this process');
     END;",
    // 6: blobs, large values stored once by the SHA-256 of their text (see
    // `blobs`), and which runs refer to them. Values stored before that look
    // like references are escaped by `blobs::escape_stored` in the same
    // transaction. A process of an older build still running on the file
    // would read references as the values themselves: the renamed column
    // makes its loads and snapshot writes fail ("no such column") instead.
    "ALTER TABLE runs RENAME COLUMN snapshot_completed TO snapshot_steps;
    CREATE TABLE blobs (
        hash   BLOB PRIMARY KEY NOT NULL,
        bytes  INTEGER NOT NULL,
        chunks INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE blob_chunks (
        hash BLOB NOT NULL,
        n    INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (hash, n)
    );
    CREATE TABLE blob_refs (
        run_id TEXT NOT NULL,
        hash   BLOB NOT NULL,
        PRIMARY KEY (run_id, hash)
    ) WITHOUT ROWID;
    CREATE INDEX blob_refs_by_hash ON blob_refs (hash);",
    // 7: each run's event log (what its steps emitted), numbered per run.
    // A run's events go with it: the writer deletes them with the run, and
    // so does the trigger when a process of an older build deletes one.
    "CREATE TABLE events (
        run_id  TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        step    TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        at      INTEGER NOT NULL,
        first   INTEGER NOT NULL,
        value   TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TRIGGER events_go_with_their_run AFTER DELETE ON runs
    BEGIN
        DELETE FROM events WHERE run_id = OLD.run_id;
    END;",
    // 8: documents shared by every process on the store (concurrency
    // limits, rate buckets), each a JSON object with a version for
    // compare-and-swap.
    "CREATE TABLE documents (
        key     TEXT PRIMARY KEY NOT NULL,
        value   TEXT NOT NULL,
        version INTEGER NOT NULL
    ) WITHOUT ROWID;",
    // 9: no table changes. History rows may hold what a step ran as
    // (`__step` in their update), which a build before this schema would
    // merge into the run's state; the number alone makes such builds
    // refuse the store.
    "-- step definitions in history rows",
];

/// The first schema with blobs.
const BLOBS_SCHEMA: i64 = 6;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `PRAGMA application_id` of a Steadfast database: "STDF".
pub const APPLICATION_ID: i32 = 0x5354_4446;

/// Checks, without changing anything, that the database is one this build
/// may open: new and empty, marked as Steadfast's with a schema version this
/// build knows, or written by a build from before the marker (schema 1 or 2,
/// with exactly the tables `runs` and `steps`). Anything else is refused.
pub(crate) fn check_identity(conn: &Connection, path: &str) -> Result<(), StoreError> {
    let ctx = || format!("reading the header of {path}");
    // One read transaction, so that the three reads see one moment (another
    // process may be creating the schema right now).
    let snapshot = (conn.is_autocommit())
        .then(|| conn.unchecked_transaction())
        .transpose()
        .map_err(|e| map_err(e, &ctx()))?;
    let app: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| map_err(e, &ctx()))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| map_err(e, &ctx()))?;
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, 7) != 'sqlite_' ORDER BY name")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| map_err(e, &ctx()))?;
    drop(snapshot);
    let foreign = |why: String| Err(not_ours(path, &why, "Name another file for the store."));
    match app {
        APPLICATION_ID => {}
        0 if version == 0 && tables.is_empty() => return Ok(()),
        0 if (1..=2).contains(&version) && tables == ["runs", "steps"] => return Ok(()),
        0 if tables.is_empty() => {
            return foreign(format!("it has no tables but schema version {version}"))
        }
        0 => {
            return foreign(format!(
                "it has the tables {} and schema version {version}",
                tables.join(", ")
            ))
        }
        other => return foreign(format!("its application id is {other:#010x}")),
    }
    check_version(&format!("database {path}"), version, SCHEMA_VERSION)
}

pub(crate) fn migrate(
    conn: &Connection,
    file: &std::path::Path,
    path: &str,
    stall: std::time::Duration,
) -> Result<(), StoreError> {
    // Nearly every open finds the schema current: then it needs no write lock,
    // which many processes opening one store at once would queue for.
    let read = |conn: &Connection| -> rusqlite::Result<(i64, i32)> {
        Ok((
            conn.query_row("PRAGMA user_version", [], |r| r.get(0))?,
            conn.query_row("PRAGMA application_id", [], |r| r.get(0))?,
        ))
    };
    let (version, marked) =
        read(conn).map_err(|e| map_err(e, &format!("reading the schema version of {path}")))?;
    if version == SCHEMA_VERSION && marked == APPLICATION_ID {
        return Ok(());
    }
    let _turn = crate::wait::WriteQueue::of(file)
        .take_turn(conn, stall)
        .map_err(|refused| crate::wait::refused_error(refused, path, stall))?;
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| map_err(e, &format!("starting the schema migration of {path}")))?;
    let applied = apply_migrations(conn, path).and_then(|()| {
        conn.execute_batch("COMMIT")
            .map_err(|e| map_err(e, &format!("committing the schema migration of {path}")))
    });
    if applied.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    applied
}

/// Inside the write transaction: checks the file again and brings its schema
/// to this build's version.
fn apply_migrations(tx: &Connection, path: &str) -> Result<(), StoreError> {
    // Another process may have changed the file since it was checked.
    check_identity(tx, path)?;
    let current: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| map_err(e, &format!("reading the schema version of {path}")))?;
    for (n, sql) in pending(&format!("database {path}"), current, MIGRATIONS)? {
        tx.execute_batch(sql)
            .map_err(|e| map_err(e, &format!("applying migration {n} to {path}")))?;
    }
    if current > 0 && current < BLOBS_SCHEMA {
        crate::blobs::escape_stored(tx, path)?;
    }
    if current < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| map_err(e, &format!("recording the schema version of {path}")))?;
    }
    let marked: i32 = tx
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| map_err(e, &format!("reading the header of {path}")))?;
    if marked != APPLICATION_ID {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(|e| map_err(e, &format!("marking {path} as a Steadfast database")))?;
    }
    Ok(())
}
