//! The schema and its numbered migrations.
//!
//! Every name is qualified with the store's schema (never `search_path`,
//! which connection poolers such as PgBouncer do not keep). The table
//! `meta` holds the number of migrations applied; each migration runs in one
//! transaction with the bump, under an advisory lock so that workers starting
//! together migrate once. A schema from a newer build is refused.

use steadfast_core::store::layout::{not_ours, pending};
use steadfast_core::StoreError;
use tokio_postgres::Client;

use crate::error::map_err;

/// Migration `i` brings the schema from version `i` to `i + 1`. `{s}` is the
/// quoted schema name.
const MIGRATIONS: &[&str] = &[
    // 1: one row per run (the columns `list` and workers filter on, the rest
    // of the head as one JSON document, the last full state snapshot and what
    // the deltas since it weigh), and one row per completed step (the history,
    // whose updates after `snapshot_next` also rebuild the state). JSON is
    // kept as text, byte for byte as written: `jsonb` would reorder keys and
    // drop duplicates. Times are milliseconds since the Unix epoch. Names
    // sort by byte (collation "C"), as `list` promises, whatever the
    // database's collation.
    //
    // `wake_at` is when a worker may next take the run (null: never, as for
    // finished runs); the partial index covers only such runs, so looking for
    // due work costs the same with a million finished runs in the table.
    // `claimed_by`/`claimed_until` reserve a due run for the worker that
    // found it, so that other workers skip it.
    "CREATE TABLE {s}.runs (
        run_id             text COLLATE \"C\" PRIMARY KEY,
        workflow           text COLLATE \"C\" NOT NULL,
        status             text COLLATE \"C\" NOT NULL,
        next               bigint NOT NULL,
        version            bigint NOT NULL,
        created_at         bigint NOT NULL,
        updated_at         bigint NOT NULL,
        head               text NOT NULL,
        snapshot           text NOT NULL,
        snapshot_completed text NOT NULL,
        snapshot_next      bigint NOT NULL,
        snapshot_bytes     bigint NOT NULL,
        delta_bytes        bigint NOT NULL,
        wake_at            bigint,
        claimed_by         text,
        claimed_until      bigint
    );
    -- Room in each page for the next version of a row, so that a save
    -- that changes no indexed column is a heap-only update (no index
    -- writes).
    ALTER TABLE {s}.runs SET (fillfactor = 70);
    CREATE INDEX runs_by_status ON {s}.runs (status, run_id);
    CREATE INDEX runs_by_workflow ON {s}.runs (workflow, run_id);
    CREATE INDEX runs_due ON {s}.runs (wake_at) WHERE wake_at IS NOT NULL;
    CREATE TABLE {s}.steps (
        run_id      text COLLATE \"C\" NOT NULL,
        idx         bigint NOT NULL,
        name        text NOT NULL,
        update_json text NOT NULL,
        attempt     bigint NOT NULL,
        started_at  bigint NOT NULL,
        finished_at bigint NOT NULL,
        PRIMARY KEY (run_id, idx)
    );",
    // 2: blobs, large values stored once by the SHA-256 of their text (see
    // `blobs`): one row per content, its text in chunks of at most 16 MiB
    // (a `bytea` value stays far from the server's 1 GB limit of one value,
    // and no chunk is held twice in memory on its way), and which runs
    // refer to which blobs. The foreign keys make a reference to a missing
    // blob impossible, whatever a writer does. Values stored before that
    // look like references are escaped (`blobs::escape_stored`) in the same
    // transaction. A process of an older build still running would read
    // references as the values themselves: the renamed column makes its
    // loads and snapshot writes fail ("column does not exist") instead.
    "ALTER TABLE {s}.runs RENAME COLUMN snapshot_completed TO snapshot_steps;
    CREATE TABLE {s}.blobs (
        hash   bytea PRIMARY KEY,
        bytes  bigint NOT NULL,
        chunks integer NOT NULL
    );
    CREATE TABLE {s}.blob_chunks (
        hash bytea NOT NULL REFERENCES {s}.blobs (hash) ON DELETE CASCADE,
        n    integer NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (hash, n)
    );
    CREATE TABLE {s}.blob_refs (
        run_id text COLLATE \"C\" NOT NULL,
        hash   bytea NOT NULL REFERENCES {s}.blobs (hash),
        PRIMARY KEY (run_id, hash)
    );
    CREATE INDEX blob_refs_by_hash ON {s}.blob_refs (hash);",
    // 3: each run's event log (what its steps emitted), numbered per run;
    // deleted with the run's history.
    "CREATE TABLE {s}.events (
        run_id  text COLLATE \"C\" NOT NULL,
        seq     bigint NOT NULL,
        step    text NOT NULL,
        attempt integer NOT NULL,
        at      bigint NOT NULL,
        first   boolean NOT NULL,
        value   text NOT NULL,
        PRIMARY KEY (run_id, seq)
    );",
    // 4: documents shared by every process on the store (concurrency
    // limits, rate buckets), each a JSON object with a version for
    // compare-and-swap.
    "CREATE TABLE {s}.documents (
        key     text COLLATE \"C\" PRIMARY KEY,
        value   text NOT NULL,
        version bigint NOT NULL
    );",
    // 5: no table changes. History rows may hold what a step ran as
    // (`__step` in their update), which a build before this schema would
    // merge into the run's state; the number alone makes such builds
    // refuse the schema.
    "-- step definitions in history rows",
];

/// The first schema with blobs.
const BLOBS_SCHEMA: i64 = 2;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Creates the schema if missing and applies the migrations it lacks, in one
/// transaction. Refuses a schema that holds other tables but no Steadfast
/// marker, and one from a newer build.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<(), StoreError> {
    let q = quote(schema);
    let ctx = |what: &str| format!("{what} of schema {schema}");
    // A schema already at this build's version needs nothing: then a role
    // that may only read and write its tables (no CREATE on the database or
    // the schema) can open the store.
    let meta = format!("{q}.meta");
    let has_meta: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&meta])
        .await
        .map_err(|e| map_err(e, &ctx("looking at the version")))?
        .get(0);
    if has_meta {
        let version: Option<i64> = client
            .query_opt(
                &format!("SELECT value FROM {q}.meta WHERE key = 'schema_version'"),
                &[],
            )
            .await
            .map_err(|e| map_err(e, &ctx("reading the version")))?
            .map(|r| r.get(0));
        if version == Some(SCHEMA_VERSION) {
            return Ok(());
        }
    }
    let tx = client
        .transaction()
        .await
        .map_err(|e| map_err(e, &ctx("starting the migration")))?;
    // One migrator at a time per schema, across processes.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))",
        &[&format!("steadfast schema {schema}")],
    )
    .await
    .map_err(|e| map_err(e, &ctx("locking for the migration")))?;
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {q}"))
        .await
        .map_err(|e| map_err(e, &ctx("creating")))?;
    let tables: Vec<String> = tx
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .map_err(|e| map_err(e, &ctx("listing the tables")))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let current: i64 = if tables.iter().any(|t| t == "meta") {
        let row = tx
            .query_opt(
                &format!("SELECT value FROM {q}.meta WHERE key = 'schema_version'"),
                &[],
            )
            .await
            .map_err(|e| map_err(e, &ctx("reading the version")))?;
        match row {
            Some(r) => r.get(0),
            None => {
                return Err(StoreError::Corrupt {
                    location: format!("schema {schema}"),
                    reason: "its meta table has no schema_version".into(),
                })
            }
        }
    } else if tables.is_empty() {
        tx.batch_execute(&format!(
            "CREATE TABLE {q}.meta (key text PRIMARY KEY, value bigint NOT NULL);
             INSERT INTO {q}.meta VALUES ('schema_version', 0);"
        ))
        .await
        .map_err(|e| map_err(e, &ctx("creating the meta table")))?;
        0
    } else {
        let why = format!("it has the tables {} and no meta table", tables.join(", "));
        return Err(not_ours(
            &format!("schema {schema}"),
            &why,
            "Name another with ?schema=NAME.",
        ));
    };
    for (n, sql) in pending(&format!("schema {schema}"), current, MIGRATIONS)? {
        tx.batch_execute(&sql.replace("{s}", &q))
            .await
            .map_err(|e| map_err(e, &ctx(&format!("applying migration {n}"))))?;
    }
    if current > 0 && current < BLOBS_SCHEMA {
        crate::blobs::escape_stored(&tx, &q, schema).await?;
    }
    if current < SCHEMA_VERSION {
        tx.execute(
            &format!("UPDATE {q}.meta SET value = $1 WHERE key = 'schema_version'"),
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(|e| map_err(e, &ctx("recording the version")))?;
    }
    tx.commit()
        .await
        .map_err(|e| map_err(e, &ctx("committing the migration")))?;
    Ok(())
}

/// Checks a schema name: 1-63 bytes of lowercase ASCII letters, digits and
/// `_`, not starting with a digit and not `pg_`-prefixed (so that it needs no
/// escaping anywhere and never names a system schema).
pub(crate) fn check_schema_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && !name.starts_with("pg_")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "schema name {name:?}: use 1-63 lowercase letters, digits and '_', not starting with a digit or 'pg_'"
        )))
    }
}

/// The schema name as an SQL identifier.
pub(crate) fn quote(schema: &str) -> String {
    format!("\"{schema}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in [
            "steadfast",
            "t_1",
            "_x",
            "a23456789012345678901234567890123456789012345678901234567890123",
        ] {
            assert!(check_schema_name(good).is_ok(), "{good}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "1abc",
            "Caps",
            "a-b",
            "a\"b",
            "pg_catalog",
            long.as_str(),
            "a b",
            "é",
        ] {
            assert!(check_schema_name(bad).is_err(), "{bad:?}");
        }
    }
}
