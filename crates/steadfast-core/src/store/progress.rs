//! Progress rows: history rows at or after a run head's own `next`, each
//! written by a save that recorded one step and left the head as it was (see
//! [`step_only`]), and carrying that save's version, time and writer number.
//! The last of them is where the run is; the next save that rewrites the
//! head takes them into it. A store that keeps them writes one row per
//! ordinary step instead of two. The rules live here, once: which save may
//! be written so ([`step_only`]), and whether rows read back are whole
//! ([`check`]), so that the SQL stores judge them alike.

use std::sync::Arc;

use crate::store::head::around_writer;
use crate::store::plan::{Known, Plan, StepRow};
use crate::store::rows::{Place, RecordRow};
use crate::Checkpoint;
use crate::StoreError;

/// A progress row as read: what its save recorded (absent on a damaged row)
/// and the size of its update in bytes.
pub struct Row {
    /// The step's index.
    pub idx: i64,
    /// The version its save wrote.
    pub version: Option<i64>,
    /// When it was saved, in milliseconds since the epoch.
    pub saved_at: Option<i64>,
    /// Its save's writer number, as sixteen hex digits.
    pub writer: Option<String>,
    /// The size of its update, in bytes.
    pub bytes: i64,
}

/// Where a run's progress rows leave it.
#[derive(Debug, PartialEq, Eq)]
pub struct Progress {
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
    pub fn writer_bits(&self) -> u64 {
        // Checked to be sixteen hex digits when the rows were.
        u64::from_str_radix(&self.writer, 16).unwrap_or(0)
    }
}

/// Checks the progress rows of a run whose head is at `head_next` and
/// `head_version` (given in index order, all at or after `head_next`): they
/// must follow the head without a gap, each with its version, time and
/// writer number, the versions rising above the head's. `None` without rows.
pub fn check<'r>(
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

impl Progress {
    /// Puts where the rows leave the run into its head's row as read: the
    /// `next`, version and time of the last row, and their updates' size
    /// added to the deltas'.
    pub fn apply(&self, row: &mut RecordRow) {
        row.next = self.next;
        row.version = self.version;
        row.updated_at = self.saved_at;
        row.delta_bytes = row.delta_bytes.saturating_add(self.bytes);
    }
}

/// What a store remembers of a run's stored record between its saves: what
/// the next save's plan needs ([`Known`]) and the head as stored (its status,
/// workflow and document), to tell a save that leaves the head as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Where the record is, for the plan.
    pub known: Known,
    /// The status as stored.
    pub status: &'static str,
    /// The workflow's name as stored.
    pub workflow: Arc<str>,
    /// The head document as stored.
    pub doc: Arc<str>,
}

/// A save that its step's history row records alone.
#[derive(Debug)]
pub struct StepOnly {
    /// The step's row.
    pub step: StepRow,
    /// The save's writer number, as the head document writes it (sixteen
    /// hex digits).
    pub writer: String,
}

/// Whether a save planned as `plan` may be recorded by its step's row alone
/// (a progress row): it is a delta, the stored record is known (`stored`)
/// at the version just below the one written, and the head it writes
/// (`cp`, encoded as `doc`) differs from the stored one in nothing but its
/// writer number, its `next` and its time, which the row carries. Otherwise
/// the plan comes back, to be written as a head.
///
/// ```
/// use std::sync::Arc;
/// use serde_json::json;
/// use steadfast_core::store::head::encode_head;
/// use steadfast_core::store::plan::{plan_save, Known};
/// use steadfast_core::store::progress::{step_only, Stored};
/// use steadfast_core::store::SaveRequest;
/// use steadfast_core::{Checkpoint, StepRecord, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// let stored = Stored {
///     known: Known::new(4, 0, 100, 0),
///     status: cp.status.as_str(),
///     workflow: Arc::from("wf"),
///     doc: Arc::from(encode_head(&cp)?),
/// };
/// cp.completed = vec!["a".into()];
/// cp.next = 1;
/// cp.writer = 9;
/// let step = StepRecord::new(0, "a", json!({"x": 1}).as_object().unwrap().clone(), 1, Timestamp::EPOCH, Timestamp::EPOCH);
/// let req = SaveRequest::new(&cp, Some(4)).with_step(&step);
/// let plan = plan_save(&req, Some(&stored.known), 1 << 20)?;
/// let doc = encode_head(&cp)?;
/// let only = step_only(plan, Some(&stored), &cp, &doc, req.new_version()).expect("one row");
/// assert_eq!(only.writer, "0000000000000009");
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn step_only(
    plan: Plan,
    stored: Option<&Stored>,
    cp: &Checkpoint,
    doc: &str,
    new_version: u64,
) -> Result<StepOnly, Plan> {
    let Plan::Delta { step } = plan else {
        return Err(plan);
    };
    let Some(s) = stored else {
        return Err(Plan::Delta { step });
    };
    let same_labels = s.status == cp.status.as_str() && *s.workflow == *cp.workflow;
    let follows = new_version == s.known.version.saturating_add(1);
    if same_labels && follows {
        if let (Some((before, _, after)), Some((b, writer, a))) =
            (around_writer(&s.doc), around_writer(doc))
        {
            if (before, after) == (b, a) {
                return Ok(StepOnly {
                    step,
                    writer: writer.to_string(),
                });
            }
        }
    }
    Err(Plan::Delta { step })
}

#[cfg(test)]
mod tests {
    use super::{check, Row};
    use crate::store::rows::Place;
    use crate::StoreErrorKind;
    use proptest::prelude::*;

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
