//! The toolkit's reading side, for stores that keep a run as a record row
//! (a snapshot of the state and the steps it covers) plus one history row
//! per step: rebuilding the checkpoint from them, reading history rows, and
//! the checked conversions of stored numbers. Every store gives the same
//! `Corrupt` errors for the same damage, named at its own location.

use crate::record::checkpoint::{Checkpoint, StepRecord};
use crate::record::error::StoreError;
use crate::record::state::{State, Update};
use crate::store::head::decode_head;
pub use crate::store::head::to_i64;
pub use crate::store::place::Place;
use crate::store::plan::Known;
use crate::store::RunSummary;

/// The fields of a stored JSON document (a document store's item), read
/// with the same checks as a row's columns: a field that is missing or of
/// another type is [`StoreError::Corrupt`] at the document's place.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    place: &'a Place<'a>,
    doc: &'a serde_json::Value,
}

impl<'a> Fields<'a> {
    /// The fields of `doc`, found at `place`.
    pub fn new(place: &'a Place<'a>, doc: &'a serde_json::Value) -> Self {
        Fields { place, doc }
    }

    /// A field that must be a number of at least zero.
    pub fn count(&self, field: &str) -> Result<u64, StoreError> {
        self.doc
            .get(field)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| {
                self.place
                    .corrupt(field, "missing or not a number of at least 0")
            })
    }

    /// A field that must be an integer, as stored (a store's checks of
    /// its range come after, as for a row's column).
    pub fn int(&self, field: &str) -> Result<i64, StoreError> {
        self.doc
            .get(field)
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(|| self.place.corrupt(field, "missing or not an integer"))
    }

    /// A field that must be an index or step count.
    pub fn index(&self, field: &str) -> Result<usize, StoreError> {
        let n = self.count(field)?;
        usize::try_from(n).map_err(|_| self.place.corrupt(field, format!("{n} is too large")))
    }

    /// A field that must be text.
    pub fn text(&self, field: &str) -> Result<&'a str, StoreError> {
        self.doc
            .get(field)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| self.place.corrupt(field, "missing or not text"))
    }

    /// A run's summary from the document's `run_id`, `workflow`, `status`,
    /// `next`, `version`, `created_at` and `updated_at`.
    pub fn summary(&self) -> Result<RunSummary, StoreError> {
        SummaryRow {
            run_id: self.text("run_id")?.to_string(),
            workflow: self.text("workflow")?.to_string(),
            status: self.text("status")?.to_string(),
            next: to_stored(self.count("next")?),
            version: to_stored(self.count("version")?),
            created_at: to_stored(self.count("created_at")?),
            updated_at: to_stored(self.count("updated_at")?),
            head: self
                .doc
                .get("head")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
        }
        .summary(self.place)
    }
}

/// A count as a row keeps it (saturating: only for numbers already read).
fn to_stored(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A run's row as `list` reads it, numbers as SQL hands them over.
#[derive(Debug)]
pub struct SummaryRow {
    /// The run.
    pub run_id: String,
    /// Its workflow's name.
    pub workflow: String,
    /// Its status, as text.
    pub status: String,
    /// Completed steps.
    pub next: i64,
    /// The version.
    pub version: i64,
    /// When it was created, in milliseconds.
    pub created_at: i64,
    /// When it was last saved, in milliseconds.
    pub updated_at: i64,
    /// The head document ([`encode_head`](crate::store::encode_head)),
    /// for the spend it records; `None` shows none.
    pub head: Option<String>,
}

impl SummaryRow {
    /// The run's summary; a number or status that does not read back is
    /// [`StoreError::Corrupt`] at `place` (which names the row's run).
    pub fn summary(self, place: &Place<'_>) -> Result<RunSummary, StoreError> {
        let mut cp = Checkpoint::new(
            self.run_id.as_str(),
            self.workflow,
            place.millis("created_at", self.created_at)?,
        );
        cp.status = place.status("status", &self.status)?;
        cp.next = place.index("next", self.next)?;
        cp.version = place.count("version", self.version)?;
        cp.updated_at = place.millis("updated_at", self.updated_at)?;
        if let Some(head) = &self.head {
            let head =
                crate::store::head::summary_of(head).map_err(|r| place.corrupt("head", r))?;
            (cp.spend, cp.queue, cp.origin) = (head.spend, head.queue, head.origin);
        }
        Ok(RunSummary::from(&cp))
    }
}

/// A run's record as a store keeps it, numbers as SQL hands them over: its
/// labels and counts, its head document
/// ([`encode_head`](crate::store::encode_head)), the snapshot of its state
/// after its first `snapshot_next` steps (their names in
/// `snapshot_completed`), and what the snapshot and the deltas since weigh.
#[derive(Debug)]
pub struct RecordRow {
    /// The workflow's name.
    pub workflow: String,
    /// The status, as text.
    pub status: String,
    /// Completed steps.
    pub next: i64,
    /// The version.
    pub version: i64,
    /// When the run was created, in milliseconds.
    pub created_at: i64,
    /// When it was last saved, in milliseconds.
    pub updated_at: i64,
    /// The head document.
    pub head: String,
    /// The state's snapshot, as JSON text.
    pub snapshot: String,
    /// The names of the steps the snapshot covers, as a JSON list.
    pub snapshot_completed: String,
    /// How many steps the snapshot covers.
    pub snapshot_next: i64,
    /// The snapshot's size in bytes.
    pub snapshot_bytes: i64,
    /// The size of the deltas since the snapshot.
    pub delta_bytes: i64,
}

/// One step's delta as a load reads it: its index, its name, its update as
/// JSON text.
pub type Delta = (i64, String, String);

/// Rebuilds a checkpoint from its record row and the history rows from
/// `snapshot_next` on (in index order): the snapshot, then each step's
/// update merged in order; with what the store knows of the record for its
/// next save. A number that does not read back, a step missing, a count
/// that disagrees, text that does not decode or a record that fails its
/// checks is [`StoreError::Corrupt`] at its place; never a partial
/// checkpoint. A record whose decisions hold references (format
/// [`STORED_DECISIONS_FORMAT`](crate::store::blob::STORED_DECISIONS_FORMAT)) comes back in that format, for the store to
/// put their data back with
/// [`resolve_decisions`](crate::store::blob::resolve_decisions) as it does
/// the state's values.
pub fn rebuild(
    place: &Place<'_>,
    row: RecordRow,
    deltas: impl IntoIterator<Item = Result<Delta, StoreError>>,
) -> Result<(Checkpoint, Known), StoreError> {
    let status = place.status("status", &row.status)?;
    let (next, snapshot_next) = (
        place.count("next", row.next)?,
        place.count("snapshot_next", row.snapshot_next)?,
    );
    let mut state: State = place.json("snapshot", &row.snapshot)?;
    let mut completed: Vec<String> = place.json("snapshot_completed", &row.snapshot_completed)?;
    if completed.len() as u64 != snapshot_next || snapshot_next > next {
        return Err(place.corrupt(
            "snapshot_next",
            format!("{snapshot_next} disagrees with the snapshot or next ({next})"),
        ));
    }
    let mut expect = snapshot_next;
    for delta in deltas {
        let (idx, name, text) = delta?;
        if place.count("steps", idx)? != expect {
            return Err(place.corrupt(
                "steps",
                format!("step {expect} is missing from the history"),
            ));
        }
        let update: Update = place.json(&format!("steps[{idx}].update_json"), &text)?;
        crate::record::state::merge(&mut state, update);
        completed.push(name);
        expect += 1;
    }
    if expect != next {
        return Err(place.corrupt(
            "steps",
            format!("step {expect} is missing from the history"),
        ));
    }
    let mut cp = Checkpoint::new(
        place.run_id(),
        row.workflow,
        place.millis("created_at", row.created_at)?,
    );
    decode_head(&row.head, &mut cp).map_err(|reason| place.corrupt("head", reason))?;
    cp.status = status;
    cp.next = place.index("next", row.next)?;
    cp.completed = completed;
    cp.state = state;
    cp.version = place.count("version", row.version)?;
    cp.updated_at = place.millis("updated_at", row.updated_at)?;
    // A head whose decisions hold references is resolved by the store.
    cp.check_stored()
        .map_err(|reason| place.corrupt("head", reason))?;
    let known = Known::new(
        cp.version,
        cp.next,
        place.count("snapshot_bytes", row.snapshot_bytes)?,
        place.count("delta_bytes", row.delta_bytes)?,
    );
    Ok((cp, known))
}

/// One history row as a store keeps it, numbers as SQL hands them over.
#[derive(Debug)]
#[non_exhaustive]
pub struct HistoryRow {
    /// The step's index.
    pub index: i64,
    /// Its name.
    pub name: String,
    /// Its update, as JSON text.
    pub update: String,
    /// The attempt that succeeded.
    pub attempt: i64,
    /// When it started, in milliseconds.
    pub started_at: i64,
    /// When it returned, in milliseconds.
    pub finished_at: i64,
}

impl HistoryRow {
    /// A history row.
    pub fn new(
        index: i64,
        name: String,
        update: String,
        attempt: i64,
        started_at: i64,
        finished_at: i64,
    ) -> Self {
        HistoryRow {
            index,
            name,
            update,
            attempt,
            started_at,
            finished_at,
        }
    }

    /// The step record it holds; a negative number or text that does not
    /// decode is [`StoreError::Corrupt`] at its place.
    pub fn record(self, place: &Place<'_>) -> Result<StepRecord, StoreError> {
        let at = |field: &str| format!("steps[{}].{field}", self.index);
        let index = place.index(&at("idx"), self.index)?;
        let update: Update = place.json(&at("update_json"), &self.update)?;
        Ok(StepRecord::new(
            index,
            &self.name,
            update,
            place.attempt(&at("attempt"), self.attempt)?,
            place.millis(&at("started_at"), self.started_at)?,
            place.millis(&at("finished_at"), self.finished_at)?,
        ))
    }
}

/// The refusal of a history rewrite (or fold) that names a row a load
/// still merges into the state (at or above the snapshot's `snapshot_next`):
/// it is not history yet.
pub fn still_merged(run_id: &str, index: u64, snapshot_next: u64) -> StoreError {
    StoreError::InvalidInput(format!(
        "run {run_id:?}: step {index} is still merged into the state on load (snapshot at {snapshot_next}); \
         save the run without a step first"
    ))
}

/// The refusal of a fold into a step that has no history row.
pub fn no_row_to_fold(run_id: &str, index: u64) -> StoreError {
    StoreError::InvalidInput(format!(
        "run {run_id:?}: step {index} has no history row to fold into"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunStatus, Timestamp};

    fn place() -> (String, impl Fn(&str) -> String + Sync) {
        ("r".to_string(), |c: &str| format!("t runs[\"r\"].{c}"))
    }

    fn row(next: i64, snapshot_next: i64, completed: &str) -> RecordRow {
        let cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
        RecordRow {
            workflow: "wf".into(),
            status: "running".into(),
            next,
            version: 3,
            created_at: 0,
            updated_at: 0,
            head: crate::store::encode_head(&cp).unwrap(),
            snapshot: r#"{"a":1}"#.into(),
            snapshot_completed: completed.into(),
            snapshot_next,
            snapshot_bytes: 7,
            delta_bytes: 0,
        }
    }

    #[test]
    fn a_record_is_rebuilt_from_its_snapshot_and_deltas() {
        let (id, locate) = place();
        let p = Place::new(&id, &locate);
        let (cp, known) = rebuild(
            &p,
            row(2, 1, r#"["s0"]"#),
            [Ok((1, "s1".to_string(), r#"{"b":2}"#.to_string()))],
        )
        .unwrap();
        assert_eq!(known, Known::new(3, 2, 7, 0));
        assert_eq!(cp.completed, ["s0", "s1"]);
        assert_eq!(cp.state["b"], 2);
        // A missing step, counts that disagree, damaged text: corrupt, where.
        let err = rebuild(
            &p,
            row(3, 1, r#"["s0"]"#),
            [Ok((1, "s1".into(), "{}".into()))],
        )
        .unwrap_err();
        assert!(err.to_string().contains("step 2 is missing"), "{err}");
        let err = rebuild(&p, row(1, 2, r#"["s0"]"#), []).unwrap_err();
        assert!(err.to_string().contains("snapshot_next"), "{err}");
        let err = rebuild(
            &p,
            row(2, 1, r#"["s0"]"#),
            [Ok((1, "s1".into(), "{".into()))],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("t runs[\"r\"].steps[1].update_json"),
            "{err}"
        );
    }

    /// Stored numbers are converted with checks: a negative one is corrupt
    /// on every store, never wrapped into a huge one.
    #[test]
    fn negative_numbers_are_corrupt_never_wrapped() {
        let (id, locate) = place();
        let p = Place::new(&id, &locate);
        assert!(p.count("version", -1).is_err());
        assert_eq!(p.count("version", 7).unwrap(), 7);
        let bad = HistoryRow::new(0, "s".into(), "{}".into(), -2, 0, 0);
        let err = bad.record(&p).unwrap_err().to_string();
        assert!(
            err.contains("steps[0].attempt") && err.contains("negative"),
            "{err}"
        );
        assert!(to_i64("r", "version", u64::MAX).is_err());
    }

    /// A list row and a JSON document read back with the same checks: a
    /// negative number, an unknown status or a missing field is corrupt,
    /// at the row's place.
    #[test]
    fn summaries_are_read_with_checks() {
        let (id, locate) = place();
        let p = Place::new(&id, &locate);
        let row = |status: &str, next: i64| SummaryRow {
            run_id: "r".into(),
            workflow: "wf".into(),
            status: status.into(),
            next,
            version: 2,
            created_at: 5,
            updated_at: 6,
            head: None,
        };
        let s = row("waiting", 3).summary(&p).unwrap();
        assert_eq!((s.next, s.version, s.status), (3, 2, RunStatus::Waiting));
        let err = row("waiting", -1).summary(&p).unwrap_err().to_string();
        assert!(
            err.contains("t runs[\"r\"].next") && err.contains("negative"),
            "{err}"
        );
        assert!(row("asleep", 1).summary(&p).is_err());
        let doc = serde_json::json!({"run_id": "r", "workflow": "wf", "status": "completed",
            "next": 1, "version": 4, "created_at": 1, "updated_at": 2});
        assert_eq!(Fields::new(&p, &doc).summary().unwrap().version, 4);
        let mut bad = doc.clone();
        bad["version"] = serde_json::json!(-4);
        let err = Fields::new(&p, &bad).summary().unwrap_err().to_string();
        assert!(err.contains("version"), "{err}");
        bad.as_object_mut().unwrap().remove("workflow");
        assert!(Fields::new(&p, &bad).text("workflow").is_err());
    }
}
