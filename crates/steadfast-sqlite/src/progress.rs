//! Progress rows (schema 5): history rows at or after the head's `next`,
//! each recorded by a save that left the head as it was and carrying that
//! save's version, time and writer number. The last of them is where the run
//! is; the next save that rewrites the head takes them into it. One check
//! here serves the load that reads them and the writer that takes them in,
//! so that both see a damaged row the same way.

use rusqlite::{params, Connection};
use steadfast_core::store::rows::Place;
use steadfast_core::StoreError;

/// A progress row as read: what its save recorded (absent on a damaged row)
/// and the size of its update in bytes.
pub(crate) struct Row {
    pub idx: i64,
    pub version: Option<i64>,
    pub saved_at: Option<i64>,
    pub writer: Option<String>,
    pub bytes: i64,
}

/// Where a run's progress rows leave it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The index after the last row.
    pub next: i64,
    /// The last row's version.
    pub version: i64,
    /// The last row's time, in milliseconds.
    pub saved_at: i64,
    /// The last row's writer number, as the head document writes it.
    pub writer: String,
    /// Their updates' size in bytes.
    pub bytes: i64,
}

impl Progress {
    /// The writer number.
    pub(crate) fn writer_bits(&self) -> u64 {
        // Checked to be sixteen hex digits when the rows were.
        u64::from_str_radix(&self.writer, 16).unwrap_or(0)
    }
}

/// Checks the progress rows of a run whose head is at `head_next` and
/// `head_version` (given in index order, all at or after `head_next`): they
/// must follow the head without a gap, each with its version, time and
/// writer number, the versions rising above the head's. `None` without rows.
pub(crate) fn check<'r>(
    place: &Place<'_>,
    head_next: i64,
    head_version: i64,
    rows: impl IntoIterator<Item = &'r Row>,
) -> Result<Option<Progress>, StoreError> {
    let mut last: Option<Progress> = None;
    for row in rows {
        let at = format!("steps[{}]", row.idx);
        let expect = last.as_ref().map_or(head_next, |p| p.next);
        if row.idx != expect {
            return Err(place.corrupt(
                "steps",
                format!("step {expect} is missing from the history"),
            ));
        }
        let (Some(version), Some(saved_at), Some(writer)) =
            (row.version, row.saved_at, row.writer.as_ref())
        else {
            return Err(place.corrupt(
                &at,
                format!(
                    "step {} lies at or after the head's next ({head_next}) but lacks the version, time or writer of its save",
                    row.idx
                ),
            ));
        };
        let after = last.as_ref().map_or(head_version, |p| p.version);
        if version <= after {
            return Err(place.corrupt(
                &format!("{at}.version"),
                format!("{version} does not follow version {after}"),
            ));
        }
        if writer.len() != 16 || !writer.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(place.corrupt(
                &format!("{at}.writer"),
                format!("{writer:?} is not a writer number"),
            ));
        }
        last = Some(Progress {
            next: row.idx.saturating_add(1),
            version,
            saved_at,
            writer: writer.clone(),
            bytes: last
                .as_ref()
                .map_or(0, |p| p.bytes)
                .saturating_add(row.bytes),
        });
    }
    Ok(last)
}

/// Inside the write transaction: takes run `run_id`'s progress rows into its
/// head (their last one's version, time, writer number and index, their
/// updates' size), so that the head's own columns say where the run is. What
/// the run is does not change, only where it is written, so a save that goes
/// on to conflict may leave this done. Damaged rows are `Corrupt`, and nothing
/// is written.
pub(crate) fn absorb(conn: &Connection, run_id: &str, path: &str) -> Result<(), StoreError> {
    let ctx = || format!("reading the progress of run {run_id:?} in {path}");
    let map = |e| crate::error::map_err(e, &ctx());
    let head: Option<(i64, i64)> = conn
        .prepare_cached("SELECT next, version FROM runs WHERE run_id = ?1")
        .and_then(|mut st| {
            use rusqlite::OptionalExtension;
            st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(map)?;
    let Some((head_next, head_version)) = head else {
        return Ok(());
    };
    let rows = read_rows(conn, run_id, head_next).map_err(map)?;
    if rows.is_empty() {
        return Ok(());
    }
    let locate = crate::locate(path, run_id);
    let Some(p) = check(&Place::new(run_id, &locate), head_next, head_version, &rows)? else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE runs SET next = ?2, version = ?3, updated_at = ?4,
             head = json_set(head, '$.writer', ?5), delta_bytes = delta_bytes + ?6
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

/// The rows of run `run_id` at or after `from`, in index order.
pub(crate) fn read_rows(conn: &Connection, run_id: &str, from: i64) -> rusqlite::Result<Vec<Row>> {
    let mut st = conn.prepare_cached(
        "SELECT idx, version, saved_at, writer, length(CAST(update_json AS BLOB)) FROM steps
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
