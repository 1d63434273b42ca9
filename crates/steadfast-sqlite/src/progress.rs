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
    // The last row so far, its writer borrowed (copied once, at the end).
    let mut last: Option<(Progress, &'r str)> = None;
    for row in rows {
        // Named only when something is wrong (this runs for every row of
        // every load and head write).
        let at = || format!("steps[{}]", row.idx);
        let expect = last.as_ref().map_or(head_next, |(p, _)| p.next);
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
                &at(),
                format!(
                    "step {} lies at or after the head's next ({head_next}) but lacks the version, time or writer of its save",
                    row.idx
                ),
            ));
        };
        let after = last.as_ref().map_or(head_version, |(p, _)| p.version);
        if version <= after {
            return Err(place.corrupt(
                &format!("{}.version", at()),
                format!("{version} does not follow version {after}"),
            ));
        }
        if saved_at < 0 {
            return Err(place.corrupt(
                &format!("{}.saved_at", at()),
                format!("{saved_at} is before 1970"),
            ));
        }
        if writer.len() != 16 || !writer.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(place.corrupt(
                &format!("{}.writer", at()),
                format!("{writer:?} is not a writer number"),
            ));
        }
        let bytes = last
            .as_ref()
            .map_or(0, |(p, _)| p.bytes)
            .saturating_add(row.bytes);
        last = Some((
            Progress {
                next: row.idx.saturating_add(1),
                version,
                saved_at,
                writer: String::new(),
                bytes,
            },
            writer.as_str(),
        ));
    }
    Ok(last.map(|(p, writer)| Progress {
        writer: writer.to_string(),
        ..p
    }))
}

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

#[cfg(test)]
mod tests {
    use super::{check, Row};
    use proptest::prelude::*;
    use steadfast_core::store::rows::Place;
    use steadfast_core::StoreErrorKind;

    /// A row as the test makes it: a step of the index (0: the next one;
    /// more: a gap), a step of the version (0 or less: not rising), and
    /// fields that may be missing or malformed.
    fn row() -> impl Strategy<Value = (i64, i64, bool, Option<i64>, Option<String>, i64)> {
        (
            prop_oneof![8 => Just(0i64), 1 => 1i64..3],
            prop_oneof![8 => 1i64..4, 1 => -2i64..1],
            prop_oneof![9 => Just(true), 1 => Just(false)],
            prop_oneof![8 => (0..i64::MAX).prop_map(Some), 1 => (i64::MIN..0).prop_map(Some), 1 => Just(None)],
            prop_oneof![
                8 => any::<u64>().prop_map(|w| Some(format!("{w:016x}"))),
                1 => Just(None),
                1 => "[0-9a-zA-Z\"]{0,20}".prop_map(Some),
            ],
            0i64..10_000,
        )
    }

    proptest! {
        /// `check` accepts exactly the rows that follow the head without a
        /// gap, each complete, versions rising above the head's, and then
        /// says where they leave the run; anything else is `Corrupt`.
        #[test]
        fn progress_rows_are_accepted_exactly_when_whole(
            head_next in 0i64..1000,
            head_version in 0i64..1000,
            made in prop::collection::vec(row(), 0..8),
        ) {
            let mut rows = Vec::new();
            let (mut idx, mut version) = (head_next, head_version);
            let mut whole = true;
            for (gap, rise, has_version, saved_at, writer, bytes) in made {
                idx += gap;
                version += rise;
                let writer_ok = writer
                    .as_ref()
                    .is_some_and(|w| w.len() == 16 && w.bytes().all(|b| b.is_ascii_hexdigit()));
                whole &= gap == 0
                    && rise > 0
                    && has_version
                    && saved_at.is_some_and(|t| t >= 0)
                    && writer_ok;
                let version = has_version.then_some(version);
                rows.push(Row { idx, version, saved_at, writer, bytes });
                idx += 1;
            }
            let locate = |c: &str| format!("test.db runs[\"r\"].{c}");
            let got = check(&Place::new("r", &locate), head_next, head_version, &rows);
            match (got, rows.last()) {
                (Ok(None), None) => {}
                (Ok(Some(p)), Some(last)) => {
                    prop_assert!(whole, "damaged rows were accepted");
                    prop_assert_eq!(p.next, head_next + rows.len() as i64);
                    prop_assert_eq!(Some(p.version), last.version);
                    prop_assert_eq!(Some(p.saved_at), last.saved_at);
                    prop_assert_eq!(Some(&p.writer), last.writer.as_ref());
                    prop_assert_eq!(p.bytes, rows.iter().map(|r| r.bytes).sum::<i64>());
                }
                (Err(e), Some(_)) => {
                    prop_assert!(!whole, "whole rows were refused: {}", e);
                    prop_assert_eq!(e.kind(), StoreErrorKind::Corrupt);
                }
                (other, _) => prop_assert!(false, "unexpected {:?}", other.map(|p| p.is_some())),
            }
        }
    }
}
