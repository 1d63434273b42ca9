//! The toolkit's writing side: how a save is written (the head alone, a
//! delta of one step, or a snapshot of the whole state), decided once for
//! every store that keeps snapshots and deltas, with the checks a save must
//! pass before anything is written.

use crate::record::checkpoint::StepRecord;
use crate::record::error::StoreError;
use crate::store::blob::{encode_object, Blob};
use crate::store::{
    check_head, check_size, check_state, encode_json, state_size, RunCache, SaveRequest,
};

/// A delta may grow to the snapshot's size before the next save writes a
/// snapshot again, and to at least this much (16 KiB) for small states.
pub const MIN_DELTA_BUDGET: u64 = 16 * 1024;

/// How many runs a store's [`Known`] cache remembers.
pub const KNOWN_RUNS: usize = 4096;

/// What a store knows of a run's stored record since its last load or save:
/// its version and steps, and the sizes of its snapshot and deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Known {
    /// The stored version.
    pub version: u64,
    /// Its completed steps.
    pub next: usize,
    /// The size of its snapshot, in bytes of JSON.
    pub snapshot_bytes: u64,
    /// The size of the deltas since the snapshot.
    pub delta_bytes: u64,
}

impl Known {
    /// What is known of a record.
    pub fn new(version: u64, next: usize, snapshot_bytes: u64, delta_bytes: u64) -> Self {
        Known {
            version,
            next,
            snapshot_bytes,
            delta_bytes,
        }
    }
}

/// A cache of [`Known`] records, per run.
pub type KnownRuns = RunCache<Known>;

/// A step's history row as a store writes it: its update as JSON text, times
/// in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepRow {
    /// The step's index.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// Its update, as JSON text.
    pub update: String,
    /// The attempt that succeeded.
    pub attempt: u32,
    /// When it started.
    pub started_at: u64,
    /// When it returned.
    pub finished_at: u64,
}

impl StepRow {
    /// The row of `step` of run `run_id`.
    pub fn of(step: &StepRecord, run_id: &str) -> Result<Self, StoreError> {
        Self::encoded(step, run_id, None)
    }

    /// The row of `step`, its update's large values as blobs when
    /// `blobs` gives a threshold (see [`plan_save_with_blobs`]).
    fn encoded(
        step: &StepRecord,
        run_id: &str,
        blobs: Option<(u64, &mut Vec<Blob>)>,
    ) -> Result<Self, StoreError> {
        let update = match blobs {
            Some((threshold, out)) => {
                encode_object(&step.update, threshold, run_id, "step's update", out)?
            }
            None => encode_json(&step.update, run_id, "step's update")?,
        };
        Ok(StepRow {
            index: step.index,
            name: step.name.clone(),
            update,
            attempt: step.attempt,
            started_at: step.started_at.unix_millis(),
            finished_at: step.finished_at.unix_millis(),
        })
    }
}

/// How a save is written. Exhaustive on purpose: a new way of writing is
/// one every store must handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The head alone; the stored state, steps and `next` stay
    /// ([`SaveRequest::head_only`]).
    Head,
    /// One step's row, appended to the deltas since the snapshot, and the
    /// head; the snapshot stays.
    Delta {
        /// The step's row.
        step: StepRow,
    },
    /// The whole state as the new snapshot (its deltas dropped), with the
    /// names of the steps it covers, the head, and the step's row if the
    /// save completes one.
    Snapshot {
        /// The state, as JSON text.
        state: String,
        /// The completed steps' names, as a JSON list.
        completed: String,
        /// The row of the step this save completes, if one.
        step: Option<StepRow>,
    },
}

impl Plan {
    /// What is known of the record once a save by this plan has landed at
    /// `version`, from what was known before it (`known`), for the next
    /// save's plan. A head-only save keeps what was known of the state.
    pub fn known_after(&self, version: u64, next: usize, known: Option<&Known>) -> Option<Known> {
        match self {
            Plan::Head => known.map(|k| Known {
                version,
                ..k.clone()
            }),
            Plan::Delta { step } => known.map(|k| Known {
                version,
                next,
                snapshot_bytes: k.snapshot_bytes,
                delta_bytes: k.delta_bytes + step.update.len() as u64,
            }),
            Plan::Snapshot { state, .. } => Some(Known::new(version, next, state.len() as u64, 0)),
        }
    }
}

/// Decides how `req` is written, and checks it first: the head
/// ([`check_head`]), a head-only save of an absent run, and the state
/// within `limit` bytes with every value one that loads back. A delta when
/// this save completes the step after the one `known` (the stored record,
/// at the version expected) covers, and the deltas since the snapshot still
/// weigh less than the snapshot (or [`MIN_DELTA_BUDGET`]); otherwise the
/// whole state. A delta checks only the step's update (the stored state
/// passed these checks when it was written) and the state's size only when
/// the snapshot and the deltas could exceed the limit.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::store::plan::{plan_save, Known, Plan};
/// use steadfast_core::store::SaveRequest;
/// use steadfast_core::{Checkpoint, StepRecord, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// cp.completed = vec!["a".into()];
/// cp.next = 1;
/// let step = StepRecord::new(0, "a", json!({"x": 1}).as_object().unwrap().clone(), 1, Timestamp::EPOCH, Timestamp::EPOCH);
/// let req = SaveRequest::new(&cp, Some(4)).with_step(&step);
/// // Nothing known of the stored record: a snapshot.
/// assert!(matches!(plan_save(&req, None, 1 << 20)?, Plan::Snapshot { .. }));
/// // The record at version 4 with no steps: a delta.
/// let known = Known::new(4, 0, 100, 0);
/// assert!(matches!(plan_save(&req, Some(&known), 1 << 20)?, Plan::Delta { .. }));
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn plan_save(
    req: &SaveRequest<'_>,
    known: Option<&Known>,
    limit: u64,
) -> Result<Plan, StoreError> {
    plan(req, known, limit, None)
}

/// [`plan_save`] for a store with blobs ([`crate::store::blob`]): each
/// top-level value of the state or of the step's update whose text is longer
/// than `threshold` bytes is written as a reference, and its blob returned
/// beside the plan (each content once), for the store to write in the same
/// transaction as the record; values that look like references are
/// escaped. `limit` bounds the record as written (references in place of
/// the blobs); a value over [`MAX_BLOB_BYTES`](crate::store::blob::MAX_BLOB_BYTES)
/// is refused.
pub fn plan_save_with_blobs(
    req: &SaveRequest<'_>,
    known: Option<&Known>,
    limit: u64,
    threshold: u64,
) -> Result<(Plan, Vec<Blob>), StoreError> {
    let mut blobs = Vec::new();
    let plan = plan(req, known, limit, Some((threshold, &mut blobs)))?;
    Ok((plan, blobs))
}

fn plan(
    req: &SaveRequest<'_>,
    known: Option<&Known>,
    limit: u64,
    mut blobs: Option<(u64, &mut Vec<Blob>)>,
) -> Result<Plan, StoreError> {
    let cp = req.checkpoint;
    let run_id = &cp.run_id;
    check_head(cp)?;
    if req.head_only {
        if req.expected.is_none() {
            return Err(head_only_of_absent(run_id));
        }
        return Ok(Plan::Head);
    }
    // Checked before anything writes it as text: a value nested too deep
    // must be refused here, not overflow the stack of the writer that
    // recurses into it (the state is checked below, before its text).
    if let Some(step) = req.step {
        check_state(run_id, "update", &step.update)?;
    }
    if let (Some(step), Some(k)) = (req.step, known) {
        if Some(k.version) == req.expected && follows_stored(step, cp.next, k.next) {
            let mark = blobs.as_ref().map_or(0, |(_, b)| b.len());
            let row = StepRow::encoded(step, run_id, blobs.as_mut().map(|(t, b)| (*t, &mut **b)))?;
            let budget = k.snapshot_bytes.max(MIN_DELTA_BUDGET);
            let inline = k.snapshot_bytes + k.delta_bytes + row.update.len() as u64;
            if k.delta_bytes + row.update.len() as u64 <= budget {
                // The snapshot and the deltas bound the state's size. With
                // blobs the record holds references: past the limit, the
                // snapshot below (written with references) says its size.
                match blobs {
                    None if inline > limit => {
                        check_size(run_id, "state", state_size(&cp.state), limit)?;
                        return Ok(Plan::Delta { step: row });
                    }
                    Some(_) if inline > limit => {}
                    _ => return Ok(Plan::Delta { step: row }),
                }
            }
            // Not a delta after all: the snapshot writes its own blobs.
            if let Some((_, b)) = blobs.as_mut() {
                b.truncate(mark);
            }
        }
    }
    check_state(run_id, "state", &cp.state)?;
    let state = match blobs.as_mut() {
        Some((threshold, out)) => encode_object(&cp.state, *threshold, run_id, "state", out)?,
        None => encode_json(&cp.state, run_id, "state")?,
    };
    check_size(run_id, "state", state.len() as u64, limit)?;
    let step = match req.step {
        Some(s) => Some(StepRow::encoded(
            s,
            run_id,
            blobs.as_mut().map(|(t, b)| (*t, &mut **b)),
        )?),
        None => None,
    };
    Ok(Plan::Snapshot {
        state,
        completed: encode_json(&cp.completed, run_id, "list of steps")?,
        step,
    })
}

/// Whether a save of a record with `next` completed steps, completing
/// `step`, completes the step right after the stored record's last (the
/// stored record, at the version the save expects, has `stored_next`
/// completed steps). The record's state is then the stored state with the
/// step's update merged over it ([`merge`](crate::merge)), so a store may
/// write the update alone: SQLite and PostgreSQL as a delta row
/// ([`plan_save`]), the file store by merging it into the stored state
/// under its lock ([`Write::after_step_with_blobs`](crate::store::image::Write::after_step_with_blobs)).
///
/// ```
/// use steadfast_core::store::plan::follows_stored;
/// use steadfast_core::{StepRecord, Timestamp};
///
/// let step = StepRecord::new(2, "c", Default::default(), 1, Timestamp::EPOCH, Timestamp::EPOCH);
/// assert!(follows_stored(&step, 3, 2));
/// assert!(!follows_stored(&step, 3, 1), "the stored record lacks step 1");
/// assert!(!follows_stored(&step, 5, 2), "the record skips steps");
/// ```
pub fn follows_stored(step: &StepRecord, next: usize, stored_next: usize) -> bool {
    step.index == stored_next && stored_next.checked_add(1) == Some(next)
}

/// The refusal of a head-only save of a run that does not exist.
pub fn head_only_of_absent(run_id: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "run {run_id:?}: a head-only save needs the run to exist"
    ))
}

/// A conflict unless the stored version `found` (`None`: the run is
/// absent) is `expected`.
pub fn expect_version(run_id: &str, expected: u64, found: Option<u64>) -> Result<(), StoreError> {
    if found == Some(expected) {
        return Ok(());
    }
    Err(conflict(run_id, Some(expected), found))
}

/// [`StoreError::Conflict`]: run `run_id` was expected at `expected` and
/// found at `found`.
pub fn conflict(run_id: &str, expected: Option<u64>, found: Option<u64>) -> StoreError {
    StoreError::Conflict {
        run_id: run_id.to_string(),
        expected,
        found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::clock::Timestamp;
    use crate::store::Rewrite;

    fn record(index: usize, update: serde_json::Value) -> StepRecord {
        let update = update.as_object().cloned().unwrap_or_default();
        StepRecord::new(index, "s", update, 1, Timestamp::EPOCH, Timestamp::EPOCH)
    }

    /// A rewrite is checked when it is made, so no store sees a value it
    /// could not read back; a fold deletes below its one record.
    #[test]
    fn rewrites_are_checked_when_made() {
        let ok = [
            record(0, serde_json::json!({"a": 1})),
            record(1, serde_json::json!({})),
        ];
        let rw = Rewrite::replace("r", &ok).unwrap();
        assert_eq!((rw.is_fold(), rw.delete_below()), (false, None));
        assert_eq!(rw.rows("r").unwrap()[0], (0, r#"{"a":1}"#.to_string()));
        let fold = Rewrite::fold("r", &ok[1]).unwrap();
        assert_eq!(fold.delete_below(), Some(1));
        assert!(fold.with_records("r", &ok[..1]).unwrap().is_fold());
        assert!(
            fold.with_records("r", &ok).is_err(),
            "a fold of two records"
        );
        let mut deep = serde_json::json!(1);
        for _ in 0..200 {
            deep = serde_json::json!([deep]);
        }
        let bad = [record(0, serde_json::json!({ "deep": deep }))];
        assert!(Rewrite::replace("r", &bad).is_err());
        assert!(Rewrite::fold("r", &bad[0]).is_err());
        assert!(expect_version("r", 3, Some(3)).is_ok());
        let err = expect_version("r", 3, None).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict { found: None, .. }),
            "{err}"
        );
    }
}
