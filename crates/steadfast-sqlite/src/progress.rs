//! Progress rows (schema 5): history rows at or after the head's `next`,
//! each recorded by a save that left the head as it was and carrying that
//! save's version, time and writer number. The last of them is where the run
//! is; the next save that rewrites the head takes them into it. Core's
//! check of them (`steadfast_core::store::progress::check`) serves the load
//! that reads them and the writer that takes them in, so that both see a
//! damaged row the same way.

use rusqlite::{params, Connection};
pub(crate) use steadfast_core::store::progress::{check, Progress, Row};
use steadfast_core::store::rows::Place;
use steadfast_core::StoreError;

/// A run whose progress rows lie ahead of its head's own columns.
pub(crate) struct Ahead {
    /// The head's own `next` and version, as its row stores them.
    pub head_next: i64,
    pub head_version: i64,
    /// Where its rows leave it.
    pub progress: Progress,
}

/// Inside the write transaction: reads and checks run `run_id`'s progress
/// rows (`None`: the run is absent or has none). Damaged rows are `Corrupt`.
/// Writes nothing: a head write that follows takes them in itself (see
/// `writer::apply_save`), or [`absorb`] does.
pub(crate) fn ahead(
    conn: &Connection,
    run_id: &str,
    path: &str,
) -> Result<Option<Ahead>, StoreError> {
    let ctx = || format!("reading the progress of run {run_id:?} in {path}");
    let map = |e| crate::error::map_err(e, &ctx());
    let Some((head_next, head_version)) = head_at(conn, run_id).map_err(map)? else {
        return Ok(None);
    };
    let rows = read_rows(conn, run_id, head_next).map_err(map)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let locate = crate::locate(path, run_id);
    let progress = check(&Place::new(run_id, &locate), head_next, head_version, &rows)?;
    Ok(progress.map(|progress| Ahead {
        head_next,
        head_version,
        progress,
    }))
}

/// Inside the write transaction: takes run `run_id`'s progress rows into its
/// head (their last one's version, time, writer number and index, their
/// updates' size), so that the head's own columns say where the run is. What
/// the run is does not change, only where it is written, so a save that goes
/// on to conflict may leave this done. Damaged rows are `Corrupt`, and nothing
/// is written.
pub(crate) fn absorb(conn: &Connection, run_id: &str, path: &str) -> Result<(), StoreError> {
    let Some(Ahead { progress: p, .. }) = ahead(conn, run_id, path)? else {
        return Ok(());
    };
    conn.prepare_cached(
        // A head that is not JSON keeps its text (the head write that
        // follows replaces it, as it would without progress rows).
        "UPDATE runs SET next = ?2, version = ?3, updated_at = ?4,
             head = CASE WHEN json_valid(head) THEN json_set(head, '$.writer', ?5) ELSE head END,
             delta_bytes = delta_bytes + ?6
         WHERE run_id = ?1",
    )
    .and_then(|mut st| {
        st.execute(params![
            run_id, p.next, p.version, p.saved_at, p.writer, p.bytes
        ])
    })
    .map_err(|e| {
        crate::error::map_err(e, &format!("updating the head of run {run_id:?} in {path}"))
    })?;
    Ok(())
}

/// The `next` and version the head of run `run_id` stores in its own
/// columns (`None`: the run is absent); its progress rows may lie beyond.
pub(crate) fn head_at(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<(i64, i64)>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT next, version FROM runs WHERE run_id = ?1")?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

/// The rows of run `run_id` at or after `from`, in index order.
pub(crate) fn read_rows(conn: &Connection, run_id: &str, from: i64) -> rusqlite::Result<Vec<Row>> {
    let mut st = conn.prepare_cached(
        "SELECT idx, version, saved_at, writer, octet_length(update_json) FROM steps
         WHERE run_id = ?1 AND idx >= ?2 ORDER BY idx",
    )?;
    let rows = st.query_map(params![run_id, from], |r| {
        Ok(Row {
            idx: r.get(0)?,
            version: r.get(1)?,
            saved_at: r.get(2)?,
            writer: r.get(3)?,
            bytes: r.get(4)?,
        })
    })?;
    rows.collect()
}
