//! The database schema and its numbered migrations.
//!
//! `PRAGMA user_version` holds the number of migrations applied. Each is applied
//! in one transaction with the version bump; a database from a newer build is
//! refused rather than guessed at.

use rusqlite::{Connection, TransactionBehavior};
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
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(crate) fn migrate(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| map_err(e, &format!("starting the schema migration of {path}")))?;
    let current: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| map_err(e, &format!("reading the schema version of {path}")))?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Unsupported(format!(
            "database {path} has schema version {current}, newer than this build understands ({SCHEMA_VERSION}); upgrade Steadfast"
        )));
    }
    if current < 0 {
        return Err(StoreError::Corrupt {
            location: path.to_string(),
            reason: format!("schema version {current} is negative"),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        tx.execute_batch(sql)
            .map_err(|e| map_err(e, &format!("applying migration {} to {path}", i + 1)))?;
    }
    if current < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| map_err(e, &format!("recording the schema version of {path}")))?;
    }
    tx.commit()
        .map_err(|e| map_err(e, &format!("committing the schema migration of {path}")))?;
    Ok(())
}
