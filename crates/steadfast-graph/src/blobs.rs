//! Large values of a thread, stored once: the rules both backends share.
//!
//! A checkpoint's large channel values (the saver picks them: those whose
//! serialized bytes are longer than the store's threshold) and a pending
//! write's large value are kept in `graph_blobs`, one row per thread and
//! SHA-256 of the bytes as stored (sealed, with encryption). The checkpoint
//! refers to its channel values in `graph_channels` (channel, type, hash); a
//! write refers to its value by `graph_writes.blob_hash`, its `blob` left
//! empty. A graph that carries one unchanged 1 MiB channel through fifty
//! checkpoints therefore stores it once per thread (without encryption).
//!
//! Blobs are shared within a thread (all its namespaces), not between
//! threads: every statement that adds or drops a thread's references runs
//! under that thread's lease row (a put, a delete, a prune, the target and
//! source of a copy), so no other writer can be about to refer to a blob
//! that a sweep finds unreferenced. A sweep runs in the transaction that
//! dropped references and deletes the thread's blobs nothing refers to any
//! more; deleting a thread deletes its blobs.
//!
//! Reading checks each blob against its name: a reference whose blob is
//! missing, or whose bytes do not hash to it, is `Corrupt`; so is a
//! checkpoint whose stored type (`blobs/N/TYPE`) counts other than the
//! references found, or a write whose type (`blob/TYPE`) and reference
//! disagree. Builds without blobs fail on those types instead of reading a
//! checkpoint without its large values.
//!
//! With encryption a blob holds the sealed value, bound to its checkpoint
//! and channel (or write) under a fresh nonce, so two checkpoints that carry
//! one value store two sealed copies: nothing is shared, as for runs
//! (`docs/security.md` says why). Reads happen in one snapshot (a read
//! transaction on SQLite, `REPEATABLE READ` on PostgreSQL), so a checkpoint
//! is never read without references a concurrent delete just dropped.

use std::collections::HashSet;

use steadfast::store::blob::BlobHash;
use steadfast::StoreError;

use crate::error::{store_err, GraphError, Result};

/// A blob's name: the SHA-256 of its bytes.
pub(crate) type Hash = [u8; 32];

/// The name of `data`.
pub(crate) fn hash_of(data: &[u8]) -> Hash {
    *BlobHash::of(data).as_bytes()
}

/// A large value on its way in: its name and bytes (sealed with encryption).
pub(crate) struct Blob {
    pub hash: Hash,
    pub data: Vec<u8>,
}

impl Blob {
    pub(crate) fn new(data: Vec<u8>) -> Self {
        Blob {
            hash: hash_of(&data),
            data,
        }
    }
}

/// A checkpoint's large channel value on its way in: channel, type, blob.
pub(crate) struct ChannelBlob {
    pub channel: String,
    pub r#type: String,
    pub blob: Blob,
}

/// Before the saver's type of a checkpoint that keeps large channel values
/// apart: `blobs/N/TYPE`, N their number. A build without blobs fails to
/// load such a checkpoint (an unknown type) rather than read it without
/// them, and a reader that finds fewer or more references knows.
const CHECKPOINT_MARK: &str = "blobs/";
/// Before the saver's type of a pending write whose value is a blob.
const WRITE_MARK: &str = "blob/";

/// Refuses a type the marks above would be confused with.
pub(crate) fn check_type(what: &str, ty: &str) -> Result<()> {
    if ty.starts_with(WRITE_MARK) || ty.starts_with(CHECKPOINT_MARK) {
        return Err(GraphError::InvalidInput(format!(
            "{what}: a serialization type may not begin with {WRITE_MARK:?} or {CHECKPOINT_MARK:?} (got {ty:?}); nothing was written"
        )));
    }
    Ok(())
}

/// The type a checkpoint is stored under, with `n` large channel values.
pub(crate) fn checkpoint_type(ty: &str, n: usize) -> String {
    if n == 0 {
        ty.to_string()
    } else {
        format!("{CHECKPOINT_MARK}{n}/{ty}")
    }
}

/// A stored checkpoint type read back: the saver's type and how many large
/// channel values the checkpoint refers to.
pub(crate) fn read_checkpoint_type(place: &str, stored: &str) -> Result<(String, usize)> {
    let Some(rest) = stored.strip_prefix(CHECKPOINT_MARK) else {
        return Ok((stored.to_string(), 0));
    };
    match rest.split_once('/').map(|(n, ty)| (n.parse::<usize>(), ty)) {
        Some((Ok(n), ty)) if n > 0 => Ok((ty.to_string(), n)),
        _ => Err(corrupt(place, format!("has the malformed type {stored:?}"))),
    }
}

/// The type a pending write is stored under.
pub(crate) fn write_type(ty: &str, large: bool) -> String {
    if large {
        format!("{WRITE_MARK}{ty}")
    } else {
        ty.to_string()
    }
}

/// A stored write type read back, checked against whether the row names a
/// blob.
pub(crate) fn read_write_type(place: &str, stored: &str, has_blob: bool) -> Result<String> {
    match (stored.strip_prefix(WRITE_MARK), has_blob) {
        (Some(ty), true) => Ok(ty.to_string()),
        (None, false) => Ok(stored.to_string()),
        (Some(_), false) => Err(corrupt(
            place,
            format!("has type {stored:?}, of a large value, but names no blob"),
        )),
        (None, true) => Err(corrupt(
            place,
            format!("names a blob, but its type {stored:?} is not that of a large value"),
        )),
    }
}

/// Checks that a checkpoint has the large channel values its type counts.
pub(crate) fn check_channel_count(place: &str, want: usize, found: usize) -> Result<()> {
    if want == found {
        return Ok(());
    }
    Err(corrupt(
        place,
        format!("refers to {want} large channel value(s), but {found} are stored"),
    ))
}

fn corrupt(place: &str, reason: String) -> GraphError {
    store_err(&StoreError::Corrupt {
        location: place.to_string(),
        reason,
    })
}

/// Checks what a read found for a reference: the blob must exist and hash
/// to its name. `seen` holds the blobs (thread and name) already checked in
/// this read: the same one met again is the same row, so it is hashed once.
pub(crate) fn checked(
    place: &str,
    thread: &str,
    hash: &[u8],
    data: Option<Vec<u8>>,
    seen: &mut HashSet<(String, Hash)>,
) -> Result<Vec<u8>> {
    let corrupt = |reason: String| corrupt(place, reason);
    let Ok(name) = <Hash>::try_from(hash) else {
        return Err(corrupt(format!(
            "refers to a blob by a name of {} bytes, not a SHA-256",
            hash.len()
        )));
    };
    let Some(data) = data else {
        return Err(corrupt(format!(
            "refers to blob {}, which is not in the store",
            BlobHash::from_slice(&name).map_or_else(String::new, |h| h.to_string())
        )));
    };
    let key = (thread.to_string(), name);
    if !seen.contains(&key) {
        if hash_of(&data) != name {
            return Err(corrupt(format!(
                "blob {} does not hash to its name: its {} bytes were changed",
                BlobHash::from_slice(&name).map_or_else(String::new, |h| h.to_string()),
                data.len()
            )));
        }
        seen.insert(key);
    }
    Ok(data)
}

/// The blob tables and the writes' reference column (SQLite).
pub(crate) const SQLITE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS graph_blobs (
  thread_id TEXT NOT NULL, hash BLOB NOT NULL, data BLOB NOT NULL,
  PRIMARY KEY (thread_id, hash));
CREATE TABLE IF NOT EXISTS graph_channels (
  thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, channel TEXT NOT NULL,
  type TEXT NOT NULL, hash BLOB NOT NULL,
  PRIMARY KEY (thread_id, ns, checkpoint_id, channel)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS graph_channels_hash ON graph_channels (thread_id, hash);
";

/// Added to `graph_writes` by format 3 (SQLite), after the column exists.
pub(crate) const SQLITE_WRITES_INDEX: &str = "CREATE INDEX IF NOT EXISTS graph_writes_hash
  ON graph_writes (thread_id, blob_hash) WHERE blob_hash IS NOT NULL;";

/// The same for PostgreSQL, in schema `s`.
pub(crate) fn pg_tables(s: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {s}.graph_blobs (
  thread_id text COLLATE \"C\" NOT NULL, hash bytea NOT NULL, data bytea NOT NULL,
  PRIMARY KEY (thread_id, hash));
CREATE TABLE IF NOT EXISTS {s}.graph_channels (
  thread_id text COLLATE \"C\" NOT NULL, ns text COLLATE \"C\" NOT NULL,
  checkpoint_id text COLLATE \"C\" NOT NULL, channel text COLLATE \"C\" NOT NULL,
  type text NOT NULL, hash bytea NOT NULL,
  PRIMARY KEY (thread_id, ns, checkpoint_id, channel));
CREATE INDEX IF NOT EXISTS graph_channels_hash ON {s}.graph_channels (thread_id, hash);
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{s}.graph_writes'::regclass
                 AND attname = 'blob_hash' AND NOT attisdropped) THEN
    ALTER TABLE {s}.graph_writes ADD COLUMN blob_hash bytea;
  END IF;
END $$;
CREATE INDEX IF NOT EXISTS graph_writes_hash ON {s}.graph_writes (thread_id, blob_hash)
  WHERE blob_hash IS NOT NULL;"
    )
}

/// Deletes the blobs of thread `?1` that nothing refers to (SQLite).
pub(crate) const SQLITE_SWEEP: &str = "DELETE FROM graph_blobs WHERE thread_id = ?1
  AND NOT EXISTS (SELECT 1 FROM graph_channels c
                  WHERE c.thread_id = graph_blobs.thread_id AND c.hash = graph_blobs.hash)
  AND NOT EXISTS (SELECT 1 FROM graph_writes w
                  WHERE w.thread_id = graph_blobs.thread_id AND w.blob_hash = graph_blobs.hash)";

/// Deletes the blobs of the threads in `$1` that nothing refers to.
pub(crate) fn pg_sweep(s: &str) -> String {
    format!(
        "DELETE FROM {s}.graph_blobs b WHERE b.thread_id = ANY($1)
  AND NOT EXISTS (SELECT 1 FROM {s}.graph_channels c WHERE c.thread_id = b.thread_id AND c.hash = b.hash)
  AND NOT EXISTS (SELECT 1 FROM {s}.graph_writes w WHERE w.thread_id = b.thread_id AND w.blob_hash = b.hash)"
    )
}

/// Adds blob `?2` (bytes `?3`) to thread `?1` unless it has it (SQLite).
pub(crate) const SQLITE_PUT_BLOB: &str = "INSERT INTO graph_blobs (thread_id, hash, data)
  VALUES (?1, ?2, ?3) ON CONFLICT (thread_id, hash) DO NOTHING";

/// The large channel values of checkpoint (`?1`, `?2`, `?3`) with their
/// blobs (data NULL when missing), SQLite.
pub(crate) const SQLITE_READ_CHANNELS: &str = "SELECT c.channel, c.type, c.hash, b.data
  FROM graph_channels c LEFT JOIN graph_blobs b ON b.thread_id = c.thread_id AND b.hash = c.hash
  WHERE c.thread_id = ?1 AND c.ns = ?2 AND c.checkpoint_id = ?3 ORDER BY c.channel";

/// A read of many checkpoints' channel values, for the keys in arrays
/// `$1`, `$2`, `$3`: thread, ns, checkpoint, channel, type, hash, data.
pub(crate) fn pg_read_channels(s: &str) -> String {
    format!(
        "SELECT c.thread_id, c.ns, c.checkpoint_id, c.channel, c.type, c.hash, b.data
  FROM {s}.graph_channels c LEFT JOIN {s}.graph_blobs b ON b.thread_id = c.thread_id AND b.hash = c.hash
  WHERE (c.thread_id, c.ns, c.checkpoint_id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))
  ORDER BY c.channel"
    )
}
