//! Blobs (schema 2): large values stored once, by the SHA-256 of their text
//! (see `steadfast_core::store::blob`).
//!
//! - `blobs (hash, bytes, chunks)`: one row per content;
//! - `blob_chunks (hash, n, body)`: its text in `bytea` chunks of at most
//!   16 MiB (a value may reach 1 GiB, and no chunk nears the server's limit
//!   of one value);
//! - `blob_refs (run_id, hash)`: which runs refer to which blobs. Foreign
//!   keys tie references and chunks to their blob.
//!
//! A blob and the reference of the run that first refers to it are written
//! in the transaction of that run's record. Lifetime is reference counting
//! in the record's transaction, made safe against concurrent writers by row
//! locks on the blob: a writer about to refer to a stored blob takes a
//! `FOR KEY SHARE` lock on its row first (so writers of one content never
//! wait for each other), and a transaction that dropped references takes
//! `FOR UPDATE` on those blobs, in hash order, and only then looks, in a
//! statement of its own (so with a snapshot taken after the locks), for a
//! reference left. So a writer either committed its reference before that
//! look (which sees it and keeps the blob) or waits until the blob is gone
//! and stores it anew.

use std::collections::{BTreeSet, HashMap};

use futures_util::{pin_mut, TryStreamExt};
use steadfast_core::store::blob::{head_refs_in, refs_in, Blob, BlobHash};
use steadfast_core::store::rows::Place;
use steadfast_core::{BlobTotals, StoreError, Usage};
use tokio_postgres::Client;

use crate::error::map_err;

/// The largest chunk of a blob's text in one row.
const CHUNK: usize = 16 << 20;

/// How many times a writer looks again for a blob that another transaction
/// removed between two of its statements before it gives up.
const TRIES: usize = 8;

/// Writes `blobs` that are not stored yet and run `run_id`'s references to
/// all of them, in hash order. Inside the record's transaction, after the
/// record's own statement (a conflict writes nothing).
///
/// Its statements are prepared once per connection (the pool's statement
/// cache): a save with blobs used to prepare all four again, four round
/// trips before its first write.
pub(crate) async fn write(
    client: &impl deadpool_postgres::GenericClient,
    q: &str,
    run_id: &str,
    blobs: &[Blob],
) -> Result<(), tokio_postgres::Error> {
    if blobs.is_empty() {
        return Ok(());
    }
    let mut sorted: Vec<&Blob> = blobs.iter().collect();
    sorted.sort_by_key(|b| b.hash);
    sorted.dedup_by(|a, b| a.hash == b.hash);
    let lock = client
        .prepare_cached(&format!(
            "SELECT 1 FROM {q}.blobs WHERE hash = $1 FOR KEY SHARE"
        ))
        .await?;
    let insert = client
        .prepare_cached(&format!(
            "INSERT INTO {q}.blobs (hash, bytes, chunks) VALUES ($1, $2, $3)
             ON CONFLICT (hash) DO NOTHING RETURNING 1"
        ))
        .await?;
    let chunk = client
        .prepare_cached(&format!(
            "INSERT INTO {q}.blob_chunks (hash, n, body) VALUES ($1, $2, $3)"
        ))
        .await?;
    let refer = client
        .prepare_cached(&format!(
            "INSERT INTO {q}.blob_refs (run_id, hash) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        ))
        .await?;
    for blob in sorted {
        let hash = &blob.hash.as_bytes()[..];
        for _ in 0..TRIES {
            // Stored: kept from removal until this transaction ends.
            if client.query_opt(&lock, &[&hash]).await?.is_some() {
                break;
            }
            let body = blob.text.as_bytes();
            let n = i32::try_from(body.chunks(CHUNK).len()).unwrap_or(i32::MAX);
            // An insert that meets one in flight waits for its outcome:
            // nothing when it committed (then locked as above), a new row
            // when it did not.
            let bytes = i64::try_from(body.len()).unwrap_or(i64::MAX);
            if client
                .query_opt(&insert, &[&hash, &bytes, &n])
                .await?
                .is_some()
            {
                for (i, part) in body.chunks(CHUNK).enumerate() {
                    let i = i32::try_from(i).unwrap_or(i32::MAX);
                    client.execute(&chunk, &[&hash, &i, &part]).await?;
                }
                break;
            }
        }
        // Refused by the foreign key if the blob is still missing after
        // every try: the record's transaction fails, and writes nothing.
        client.execute(&refer, &[&run_id, &hash]).await?;
    }
    Ok(())
}

/// The stored text of blob `hash` (`None`: not stored), streamed in, read up
/// to just past `expect` bytes (what the reference says). Chunks missing,
/// out of place or too many give a text of another length, which the
/// caller's check of the reference reports.
pub(crate) async fn fetch(
    client: &Client,
    q: &str,
    hash: &BlobHash,
    expect: u64,
) -> Result<Option<Vec<u8>>, tokio_postgres::Error> {
    let key = &hash.as_bytes()[..];
    let head = client
        .query_opt(
            &format!("SELECT bytes FROM {q}.blobs WHERE hash = $1"),
            &[&key],
        )
        .await?;
    let Some(head) = head else {
        return Ok(None);
    };
    let stored: i64 = head.get(0);
    let expect = usize::try_from(expect).unwrap_or(usize::MAX);
    // The stored size is only a hint: the reference's own check follows.
    let mut out = Vec::with_capacity(usize::try_from(stored).unwrap_or(0).min(expect));
    let rows = client
        .query_raw(
            &format!("SELECT body FROM {q}.blob_chunks WHERE hash = $1 ORDER BY n"),
            [key],
        )
        .await?;
    pin_mut!(rows);
    while let Some(row) = rows.try_next().await? {
        let part: &[u8] = row.get(0);
        if out.len().saturating_add(part.len()) > expect {
            // Longer than the reference says: a byte more is enough for its
            // check to refuse it.
            out.push(0);
            break;
        }
        out.extend_from_slice(part);
    }
    Ok(Some(out))
}

/// The stored texts of `wanted` blobs, each read once (`None` beside one
/// that is not stored), for a load's references.
pub(crate) async fn fetch_all(
    client: &Client,
    q: &str,
    wanted: &[(BlobHash, u64)],
    context: &str,
) -> Result<HashMap<BlobHash, Option<Vec<u8>>>, StoreError> {
    let mut out = HashMap::new();
    for (hash, bytes) in wanted {
        if out.contains_key(hash) {
            continue;
        }
        let text = fetch(client, q, hash, *bytes)
            .await
            .map_err(|e| map_err(e, &format!("{context}: reading blob {hash}")))?;
        out.insert(*hash, text);
    }
    Ok(out)
}

/// Removes each of `hashes` (references just dropped in this transaction)
/// that no run refers to any more; returns the bytes freed. Inside the
/// transaction that dropped them.
pub(crate) async fn free(
    client: &Client,
    q: &str,
    mut hashes: Vec<Vec<u8>>,
) -> Result<u64, tokio_postgres::Error> {
    if hashes.is_empty() {
        return Ok(0);
    }
    hashes.sort();
    hashes.dedup();
    // Every writer that took one of them up before this lock has committed
    // once it is granted; every later one waits for this transaction.
    client
        .execute(
            &format!("SELECT 1 FROM {q}.blobs WHERE hash = ANY($1) ORDER BY hash FOR UPDATE"),
            &[&hashes],
        )
        .await?;
    // A statement of its own: its snapshot sees those writers' references.
    let freed: i64 = client
        .query_one(
            &format!(
                "WITH d AS (DELETE FROM {q}.blobs b WHERE b.hash = ANY($1)
                     AND NOT EXISTS (SELECT 1 FROM {q}.blob_refs r WHERE r.hash = b.hash)
                     RETURNING bytes)
                 SELECT coalesce(sum(bytes), 0)::bigint FROM d"
            ),
            &[&hashes],
        )
        .await?
        .get(0);
    Ok(u64::try_from(freed).unwrap_or(0))
}

/// Makes run `run_id`'s references those its rows (its snapshot, its
/// head's decisions and the history below its `next`) hold, after a new snapshot or a rewrite, and
/// removes the blobs no run refers to any more. Rows at or past `next` (left
/// by a rewind, never read) go first. A row that does not read (a malformed
/// reference, a damaged value) leaves every reference as it is, with a
/// warning: nothing is freed on a guess, and the write goes on (a load
/// reports the damage where it reads that row). Inside the record's
/// transaction.
pub(crate) async fn recount(
    client: &Client,
    q: &str,
    run_id: &str,
    place: &Place<'_>,
) -> Result<(), tokio_postgres::Error> {
    let held: Vec<Vec<u8>> = client
        .query(
            &format!("SELECT hash FROM {q}.blob_refs WHERE run_id = $1"),
            &[&run_id],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    let record: Option<(String, String)> = client
        .query_opt(
            &format!("SELECT snapshot, head FROM {q}.runs WHERE run_id = $1"),
            &[&run_id],
        )
        .await?
        .map(|r| (r.get(0), r.get(1)));
    let mut texts = Vec::new();
    let mut head = None;
    if let Some((text, head_text)) = record {
        head = Some(head_text);
        client
            .execute(
                &format!(
                    "DELETE FROM {q}.steps s USING {q}.runs r
                     WHERE s.run_id = $1 AND r.run_id = $1 AND s.idx >= r.next"
                ),
                &[&run_id],
            )
            .await?;
        texts.push(("snapshot".to_string(), text));
        for row in client
            .query(
                &format!(
                    "SELECT idx, update_json FROM {q}.steps
                     WHERE run_id = $1 AND strpos(update_json, '\"$blob\"') > 0"
                ),
                &[&run_id],
            )
            .await?
        {
            let idx: i64 = row.get(0);
            texts.push((format!("steps[{idx}].update_json"), row.get(1)));
        }
    }
    let mut wanted = BTreeSet::new();
    let heads = head.iter().map(|h| head_refs_in(h, place, "head"));
    for refs in texts
        .iter()
        .map(|(column, text)| refs_in(text, place, column))
        .chain(heads)
    {
        match refs {
            Ok(refs) => wanted.extend(refs),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "blob references kept: a row of the run does not read");
                return Ok(());
            }
        }
    }
    let dropped: Vec<Vec<u8>> = held
        .into_iter()
        .filter(|h| BlobHash::from_slice(h).is_none_or(|h| !wanted.contains(&h)))
        .collect();
    if dropped.is_empty() {
        return Ok(());
    }
    client
        .execute(
            &format!("DELETE FROM {q}.blob_refs WHERE run_id = $1 AND hash = ANY($2)"),
            &[&run_id, &dropped],
        )
        .await?;
    free(client, q, dropped).await.map(drop)
}

/// What run `run_id` stores (`None`: absent), as of one statement.
pub(crate) async fn usage(
    client: &Client,
    q: &str,
    run_id: &str,
) -> Result<Option<Usage>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            &format!(
                "SELECT octet_length(r.head)::bigint + octet_length(r.snapshot)
                        + octet_length(r.snapshot_steps)
                        + (SELECT coalesce(sum(octet_length(s.update_json) + octet_length(s.name)), 0)
                           FROM {q}.steps s WHERE s.run_id = r.run_id AND s.idx < r.next)::bigint,
                        (SELECT count(*) FROM {q}.blob_refs x WHERE x.run_id = r.run_id),
                        (SELECT coalesce(sum(b.bytes), 0) FROM {q}.blob_refs x
                         JOIN {q}.blobs b ON b.hash = x.hash WHERE x.run_id = r.run_id)::bigint,
                        (SELECT coalesce(sum(b.bytes), 0) FROM {q}.blob_refs x
                         JOIN {q}.blobs b ON b.hash = x.hash WHERE x.run_id = r.run_id
                           AND EXISTS (SELECT 1 FROM {q}.blob_refs o
                                       WHERE o.hash = x.hash AND o.run_id <> x.run_id))::bigint
                 FROM {q}.runs r WHERE r.run_id = $1"
            ),
            &[&run_id],
        )
        .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(row.map(|r| Usage::new(n(r.get(0)), n(r.get(1)), n(r.get(2)), n(r.get(3)))))
}

/// The store's blobs in all.
pub(crate) async fn totals(client: &Client, q: &str) -> Result<BlobTotals, tokio_postgres::Error> {
    let row = client
        .query_one(
            &format!("SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM {q}.blobs"),
            &[],
        )
        .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(BlobTotals::new(n(row.get(0)), n(row.get(1))))
}

/// Inside the migration to schema 2: escapes the values stored before it
/// that look like references, so that they read back as they were written.
pub(crate) async fn escape_stored(
    tx: &tokio_postgres::Transaction<'_>,
    q: &str,
    schema: &str,
) -> Result<(), StoreError> {
    use steadfast_core::store::blob::escape_lookalikes;
    let ctx = || format!("escaping values that look like blob references in schema {schema}");
    let map = |e| map_err(e, &ctx());
    let runs = tx
        .query(
            &format!(
                "SELECT run_id, snapshot FROM {q}.runs WHERE strpos(snapshot, '\"$blob\"') > 0"
            ),
            &[],
        )
        .await
        .map_err(map)?;
    for row in runs {
        let (run_id, text): (String, String) = (row.get(0), row.get(1));
        if let Some(escaped) = escape_lookalikes(&text) {
            tx.execute(
                &format!("UPDATE {q}.runs SET snapshot = $2 WHERE run_id = $1"),
                &[&run_id, &escaped],
            )
            .await
            .map_err(map)?;
        }
    }
    let steps = tx
        .query(
            &format!(
                "SELECT run_id, idx, update_json FROM {q}.steps
                 WHERE strpos(update_json, '\"$blob\"') > 0"
            ),
            &[],
        )
        .await
        .map_err(map)?;
    for row in steps {
        let (run_id, idx, text): (String, i64, String) = (row.get(0), row.get(1), row.get(2));
        if let Some(escaped) = escape_lookalikes(&text) {
            tx.execute(
                &format!("UPDATE {q}.steps SET update_json = $3 WHERE run_id = $1 AND idx = $2"),
                &[&run_id, &idx, &escaped],
            )
            .await
            .map_err(map)?;
        }
    }
    Ok(())
}
