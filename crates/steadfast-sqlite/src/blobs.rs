//! Blobs (schema 6): large values stored once, by the SHA-256 of their text
//! (see `steadfast_core::store::blob`).
//!
//! - `blobs (hash, bytes, chunks)`: one row per content;
//! - `blob_chunks (hash, n, body)`: its text in chunks of at most 16 MiB (a
//!   value may reach 1 GiB, past SQLite's own limit of one value);
//! - `blob_refs (run_id, hash)`: which runs refer to which blobs.
//!
//! A blob and the reference of the run that first refers to it are written in
//! the transaction of that run's record; a later run that refers to the same
//! content adds its reference only. Lifetime is reference counting in the
//! record's transaction: deleting a run, or rewriting its history (a fold, a
//! rewind), recounts that run's references from its rows, and a blob no run
//! refers to any more goes in the same transaction. Writers are serialized by
//! SQLite's write lock, so a writer about to refer to a content either commits
//! before a deletion (which then sees its reference) or after it (and then
//! writes the blob anew).

use std::collections::BTreeSet;

use rusqlite::{params, Connection, OptionalExtension};
use steadfast_core::store::blob::{head_refs_in, refs_in, Blob, BlobHash};
use steadfast_core::store::rows::Place;
use steadfast_core::{BlobTotals, StoreError, Usage};

use crate::error::map_err;

/// The largest chunk of a blob's text in one row.
const CHUNK: usize = 16 << 20;

/// Writes `blobs` that are not stored yet and run `run_id`'s references to
/// all of them. Inside the write transaction.
pub(crate) fn write(conn: &Connection, run_id: &str, blobs: &[Blob]) -> rusqlite::Result<()> {
    for blob in blobs {
        let hash = &blob.hash.as_bytes()[..];
        let stored = conn
            .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
            .exists([hash])?;
        if !stored {
            let body = blob.text.as_bytes();
            let chunks = body.chunks(CHUNK);
            conn.prepare_cached("INSERT INTO blobs (hash, bytes, chunks) VALUES (?1, ?2, ?3)")?
                .execute(params![hash, body.len() as i64, chunks.len() as i64])?;
            let mut st =
                conn.prepare_cached("INSERT INTO blob_chunks (hash, n, body) VALUES (?1, ?2, ?3)")?;
            for (n, chunk) in chunks.enumerate() {
                st.execute(params![hash, n as i64, chunk])?;
            }
        }
        conn.prepare_cached("INSERT OR IGNORE INTO blob_refs (run_id, hash) VALUES (?1, ?2)")?
            .execute(params![run_id, hash])?;
    }
    Ok(())
}

/// The stored text of blob `hash` (`None`: not stored), read up to just
/// past `expect` bytes (what the reference says). Chunks missing, out of
/// place or too many give a text of another length, which the caller's
/// check of the reference reports.
pub(crate) fn fetch(
    conn: &Connection,
    hash: &BlobHash,
    expect: u64,
) -> rusqlite::Result<Option<Vec<u8>>> {
    let key = &hash.as_bytes()[..];
    let head: Option<(i64, i64)> = conn
        .prepare_cached("SELECT bytes, chunks FROM blobs WHERE hash = ?1")?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((bytes, _)) = head else {
        return Ok(None);
    };
    // The stored size is only a hint: the reference's own check follows.
    let expect = usize::try_from(expect).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0).min(expect));
    let mut st = conn.prepare_cached("SELECT body FROM blob_chunks WHERE hash = ?1 ORDER BY n")?;
    let mut rows = st.query([key])?;
    while let Some(row) = rows.next()? {
        match row.get_ref(0)? {
            rusqlite::types::ValueRef::Blob(b) | rusqlite::types::ValueRef::Text(b) => {
                if out.len().saturating_add(b.len()) > expect {
                    // Longer than the reference says: a byte more is
                    // enough for its check to refuse it.
                    out.push(0);
                    break;
                }
                out.extend_from_slice(b)
            }
            _ => return Ok(Some(Vec::new())),
        }
    }
    Ok(Some(out))
}

/// Removes run `run_id`'s references, and the blobs no run refers to any
/// more. Inside the write transaction.
pub(crate) fn release(conn: &Connection, run_id: &str) -> rusqlite::Result<()> {
    let held = held_by(conn, run_id)?;
    conn.prepare_cached("DELETE FROM blob_refs WHERE run_id = ?1")?
        .execute([run_id])?;
    free_unreferenced(conn, held.iter())
}

/// Makes run `run_id`'s references those its rows (its snapshot, its
/// head's decisions and its history) hold, after a rewrite, and removes the blobs no run refers to
/// any more. A row that does not read (a malformed reference, a damaged
/// value) leaves every reference as it is, with a warning: nothing is freed
/// on a guess, and the write goes on (a load reports the damage where it
/// reads that row). Inside the write transaction.
pub(crate) fn recount(conn: &Connection, run_id: &str, path: &str) -> Result<(), StoreError> {
    let ctx = || format!("counting the blobs of run {run_id:?} in {path}");
    let map = |e| map_err(e, &ctx());
    let Some(wanted) = referred(conn, run_id, path) else {
        return Ok(());
    };
    let held = held_by(conn, run_id).map_err(map)?;
    let dropped: Vec<Vec<u8>> = held
        .into_iter()
        .filter(|h| BlobHash::from_slice(h).is_none_or(|h| !wanted.contains(&h)))
        .collect();
    let mut del = conn
        .prepare_cached("DELETE FROM blob_refs WHERE run_id = ?1 AND hash = ?2")
        .map_err(map)?;
    for hash in &dropped {
        del.execute(params![run_id, hash]).map_err(map)?;
    }
    free_unreferenced(conn, dropped.iter()).map_err(map)
}

/// The blobs run `run_id`'s rows refer to, or `None` (with a warning) when
/// a row does not read.
fn referred(conn: &Connection, run_id: &str, path: &str) -> Option<BTreeSet<BlobHash>> {
    let locate = crate::locate(path, run_id);
    let place = Place::new(run_id, &locate);
    let damaged = |e: &dyn std::fmt::Display| {
        tracing::warn!(run_id, error = %e, "blob references kept: a row of the run does not read");
    };
    let read = || -> Result<BTreeSet<BlobHash>, StoreError> {
        let map = |e| map_err(e, &format!("reading run {run_id:?} in {path}"));
        let mut wanted = BTreeSet::new();
        let record: Option<(String, String)> = conn
            .prepare_cached("SELECT snapshot, head FROM runs WHERE run_id = ?1")
            .and_then(|mut st| {
                st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(map)?;
        if let Some((snapshot, head)) = record {
            wanted.extend(refs_in(&snapshot, &place, "snapshot")?);
            // A decision's data may be a blob too.
            wanted.extend(head_refs_in(&head, &place, "head")?);
        }
        let mut st = conn
            .prepare_cached(
                "SELECT idx, update_json FROM steps WHERE run_id = ?1 AND instr(update_json, '\"$blob\"') > 0",
            )
            .map_err(map)?;
        let rows = st
            .query_map([run_id], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(map)?;
        for row in rows {
            let (idx, text) = row.map_err(map)?;
            wanted.extend(refs_in(
                &text,
                &place,
                &format!("steps[{idx}].update_json"),
            )?);
        }
        Ok(wanted)
    };
    read().map_err(|e| damaged(&e)).ok()
}

/// Whether run `run_id` refers to any blob.
pub(crate) fn holds_any(conn: &Connection, run_id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM blob_refs WHERE run_id = ?1 LIMIT 1")?
        .exists([run_id])
}

/// The hashes run `run_id` refers to.
fn held_by(conn: &Connection, run_id: &str) -> rusqlite::Result<Vec<Vec<u8>>> {
    conn.prepare_cached("SELECT hash FROM blob_refs WHERE run_id = ?1")?
        .query_map([run_id], |r| r.get(0))?
        .collect()
}

/// Removes each of `hashes` that no run refers to.
fn free_unreferenced<'h>(
    conn: &Connection,
    hashes: impl Iterator<Item = &'h Vec<u8>>,
) -> rusqlite::Result<()> {
    for hash in hashes {
        let referred = conn
            .prepare_cached("SELECT 1 FROM blob_refs WHERE hash = ?1 LIMIT 1")?
            .exists([hash])?;
        if !referred {
            conn.prepare_cached("DELETE FROM blob_chunks WHERE hash = ?1")?
                .execute([hash])?;
            conn.prepare_cached("DELETE FROM blobs WHERE hash = ?1")?
                .execute([hash])?;
        }
    }
    Ok(())
}

/// What run `run_id` stores (`None`: absent). Inside a read transaction.
pub(crate) fn usage(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<Usage>> {
    let record: Option<i64> = conn
        .prepare_cached(
            "SELECT length(CAST(head AS BLOB)) + length(CAST(snapshot AS BLOB))
                    + length(CAST(snapshot_steps AS BLOB))
                    + (SELECT coalesce(sum(length(CAST(update_json AS BLOB)) + length(CAST(name AS BLOB))), 0)
                       FROM steps WHERE run_id = ?1)
             FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], |r| r.get(0))
        .optional()?;
    let Some(record) = record else {
        return Ok(None);
    };
    let (blobs, bytes, shared): (i64, i64, i64) = conn
        .prepare_cached(
            "SELECT count(*), coalesce(sum(b.bytes), 0),
                    coalesce(sum(CASE WHEN EXISTS (SELECT 1 FROM blob_refs o
                                                   WHERE o.hash = r.hash AND o.run_id != r.run_id)
                                      THEN b.bytes ELSE 0 END), 0)
             FROM blob_refs r JOIN blobs b ON b.hash = r.hash WHERE r.run_id = ?1",
        )?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Some(Usage::new(n(record), n(blobs), n(bytes), n(shared))))
}

/// The store's blobs in all.
pub(crate) fn totals(conn: &Connection) -> rusqlite::Result<BlobTotals> {
    let (blobs, bytes): (i64, i64) = conn
        .prepare_cached("SELECT count(*), coalesce(sum(bytes), 0) FROM blobs")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(BlobTotals::new(n(blobs), n(bytes)))
}

/// Inside the migration to schema 6: escapes the values stored before it
/// that look like references, so that they read back as they were written.
pub(crate) fn escape_stored(conn: &Connection, path: &str) -> Result<(), StoreError> {
    use steadfast_core::store::blob::escape_lookalikes;
    let ctx = || format!("escaping values that look like blob references in {path}");
    let map = |e| map_err(e, &ctx());
    let runs: Vec<(String, String)> = conn
        .prepare(
            "SELECT run_id, snapshot FROM runs
             WHERE typeof(snapshot) = 'text' AND instr(snapshot, '\"$blob\"') > 0",
        )
        .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(map)?;
    for (run_id, text) in runs {
        if let Some(escaped) = escape_lookalikes(&text) {
            conn.execute(
                "UPDATE runs SET snapshot = ?2 WHERE run_id = ?1",
                params![run_id, escaped],
            )
            .map_err(map)?;
        }
    }
    let steps: Vec<(String, i64, String)> = conn
        .prepare(
            "SELECT run_id, idx, update_json FROM steps
             WHERE typeof(update_json) = 'text' AND instr(update_json, '\"$blob\"') > 0",
        )
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(map)?;
    for (run_id, idx, text) in steps {
        if let Some(escaped) = escape_lookalikes(&text) {
            conn.execute(
                "UPDATE steps SET update_json = ?3 WHERE run_id = ?1 AND idx = ?2",
                params![run_id, idx, escaped],
            )
            .map_err(map)?;
        }
    }
    Ok(())
}
