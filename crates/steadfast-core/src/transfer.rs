//! Moving runs between stores: a line-per-run export format, and writing a
//! run into a store with the version, state and history it had in another.
//!
//! # The export format (version 1)
//!
//! JSON Lines: one run per line, each line one JSON object
//!
//! ```text
//! {"format":1,"sha256":"<64 hex digits>","record":{"run":{…},"history":[…]}}
//! ```
//!
//! - `format`: the version of this layout, 1;
//! - `record.run`: the run's checkpoint exactly as a `Checkpoint` serializes
//!   (head, state, version, times, lease, wait, decisions, audit, seal);
//! - `record.history`: its per-step records in index order (from 0, or from
//!   a prune's fold row), or `null` for a run without history rows;
//! - `sha256`: the SHA-256 of the `record` value written as compact JSON, in
//!   lowercase hex, so that a line changed or cut short is refused.
//!
//! An encrypted run is exported as it is stored (its values sealed), and
//! imports as such: its seal covers its run id and version, which
//! [`put_run`] keeps.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::{run, transfer, update, MemoryStore, Store, Workflow};
//!
//! let wf = Workflow::builder("w").step("a", |_, _| async { update(json!({"a": 1})) }).build()?;
//! let (from, to) = (MemoryStore::new(), MemoryStore::new());
//! run("r", &wf, &from).await?;
//! let line = transfer::export_line(&from, "r").await?.expect("the run exists");
//! let record = transfer::decode_line(&line, 1)?;
//! assert_eq!(transfer::put_run(&to, &record).await?, transfer::Put::Written);
//! assert_eq!(to.load("r").await.unwrap(), from.load("r").await.unwrap());
//! // Again: it is there already, and nothing is written.
//! assert!(matches!(transfer::put_run(&to, &record).await?, transfer::Put::Kept { .. }));
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::{Checkpoint, RunStatus, StepRecord};
use crate::engine::store_error;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::store::{ListFilter, SaveRequest, Store};

/// The version of the export layout this build writes and reads.
pub const EXPORT_FORMAT: u32 = 1;

/// The largest version an imported run may carry: 2^53, the largest
/// integer every store (Cosmos DB's JSON numbers included) keeps exactly.
pub const MAX_VERSION: u64 = 1 << 53;

/// The longest line [`decode_line`] takes: 64 MiB.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// One run as exported: its record and its history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Exported {
    /// The run's checkpoint.
    pub run: Checkpoint,
    /// Its per-step records, if the store it came from keeps them.
    pub history: Option<Vec<StepRecord>>,
}

impl Exported {
    /// A run and its history.
    pub fn new(run: Checkpoint, history: Option<Vec<StepRecord>>) -> Self {
        Exported { run, history }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    format: u32,
    sha256: String,
    record: Value,
}

fn digest(record: &Value) -> String {
    // Writing a Value cannot fail.
    let bytes = serde_json::to_vec(record).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Encodes one run as a line of the export format (without its newline).
pub fn encode_line(record: &Exported) -> Result<String, Error> {
    let value = serde_json::to_value(record).map_err(|e| Error::InvalidInput {
        what: format!("the export of run {:?}", record.run.run_id),
        reason: e.to_string(),
    })?;
    let line = Line {
        format: EXPORT_FORMAT,
        sha256: digest(&value),
        record: value,
    };
    serde_json::to_string(&line).map_err(|e| Error::InvalidInput {
        what: format!("the export of run {:?}", record.run.run_id),
        reason: e.to_string(),
    })
}

/// A line of the export format around any `record` value, its checksum
/// right: for the fuzz targets, which must get past the checksum to reach
/// the checks behind it. Not part of the supported API.
#[doc(hidden)]
pub fn line_for_fuzzing(record: Value) -> String {
    let line = Line {
        format: EXPORT_FORMAT,
        sha256: digest(&record),
        record,
    };
    serde_json::to_string(&line).unwrap_or_default()
}

/// Decodes line `lineno` (1-based, for messages) of an export, checking its
/// format, its checksum and that the run is one a store would take: a valid
/// run id, a consistent record (version at least 1, `next` matching the
/// completed steps), history rows below `next` with the names the record
/// gives them, in order.
pub fn decode_line(line: &str, lineno: usize) -> Result<Exported, Error> {
    let bad = |reason: String| Error::InvalidInput {
        what: format!("line {lineno} of the export"),
        reason,
    };
    if line.len() > MAX_LINE_BYTES {
        return Err(bad(format!(
            "it is {} bytes, over the limit of {MAX_LINE_BYTES}",
            line.len()
        )));
    }
    let parsed: Line =
        serde_json::from_str(line).map_err(|e| bad(format!("not an export line: {e}")))?;
    if parsed.format != EXPORT_FORMAT {
        return Err(bad(format!(
            "format {} is not understood by this build (it reads {EXPORT_FORMAT})",
            parsed.format
        )));
    }
    if digest(&parsed.record) != parsed.sha256 {
        return Err(bad(
            "its checksum does not match its record: the line was changed or damaged".into(),
        ));
    }
    let mut record: Exported = serde_path_to_error::deserialize(parsed.record)
        .map_err(|e| bad(format!("at `{}`: {}", e.path(), e.inner())))?;
    // Earlier builds exported a run with steps and no rows as `[]`.
    if record.history.as_ref().is_some_and(|h| h.is_empty()) && record.run.next > 0 {
        record.history = None;
    }
    let run = &record.run;
    crate::validate_run_id(&run.run_id).map_err(|e| bad(e.to_string()))?;
    run.check()
        .map_err(|e| bad(format!("run {:?}: {e}", run.run_id)))?;
    if run.version > MAX_VERSION {
        return Err(bad(format!(
            "run {:?}: version {} is over the largest a store keeps exactly ({MAX_VERSION})",
            run.run_id, run.version
        )));
    }
    if let Some(history) = &record.history {
        if history.iter().any(|r| r.index >= run.next)
            || !crate::ops::history_is_whole(run, history)
        {
            return Err(bad(format!(
                "run {:?}: its {} history rows do not match the record's {} completed steps",
                run.run_id,
                history.len(),
                run.next
            )));
        }
    }
    Ok(record)
}

/// The export line of run `run_id` of `store`, or `None` if it is absent. A
/// store that keeps no history exports `history: null`.
pub async fn export_line<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
) -> Result<Option<String>, Error> {
    match export_run(store, run_id).await? {
        Some(record) => encode_line(&record).map(Some),
        None => Ok(None),
    }
}

/// Run `run_id` of `store` with its history, or `None` if it is absent.
pub async fn export_run<S: Store + ?Sized>(
    store: &S,
    run_id: &str,
) -> Result<Option<Exported>, Error> {
    let Some(run) = store
        .load(run_id)
        .await
        .map_err(|e| store_error(run_id, "load for export", e))?
    else {
        return Ok(None);
    };
    let history = match store.history(run_id).await {
        // A run with completed steps and no rows (written before its store
        // kept history) has none to export.
        Ok(Some(h)) if h.is_empty() && run.next > 0 => None,
        Ok(h) => h,
        Err(e) if e.kind() == StoreErrorKind::Unsupported => None,
        Err(e) => return Err(store_error(run_id, "reading the history for export", e)),
    };
    // A save between the two reads: the history is read again with the run.
    if let Some(h) = &history {
        if !crate::ops::history_is_whole(&run, h) {
            return Err(store_error(
                run_id,
                "export",
                StoreError::Conflict {
                    run_id: run_id.to_string(),
                    expected: Some(run.version),
                    found: None,
                },
            ));
        }
    }
    Ok(Some(Exported { run, history }))
}

/// What [`put_run`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Put {
    /// The run was absent and is written now.
    Written,
    /// An older version of it (`was`) was replaced.
    Replaced {
        /// The version it had here.
        was: u64,
    },
    /// It is here with the same or a newer version: nothing was written.
    Kept {
        /// The version it has here.
        version: u64,
    },
}

/// Writes `record` into `store` as it was where it came from: the same
/// version, state, head and history. Idempotent: a run already here at the
/// same or a newer version is kept as it is ([`Put::Kept`]); an older one
/// is deleted (on condition of its version) and written again.
///
/// The history is written step by step, as a run would have (one save per
/// step, each carrying its row), with the run marked cancelled (and an
/// audit entry saying why) so that no worker takes it half written; the
/// last save writes the record itself, with its own version, status and
/// lease. A copy cut short leaves that marked run, which the next copy
/// replaces. A record this store cannot take
/// (over its size limit, a value it refuses) is an error naming the run.
///
/// Two copies or imports of one run at the same moment both end well: a
/// write that meets another (a conflict) looks at the store again and
/// decides anew, a few times, before it gives up with the conflict.
pub async fn put_run<S: Store + ?Sized>(store: &S, record: &Exported) -> Result<Put, Error> {
    let mut tries = 0;
    loop {
        match put_once(store, record).await {
            Err(e) if e.is_conflict() && tries < 8 => {
                tries += 1;
                // Let the other writer finish before looking again.
                tokio::time::sleep(std::time::Duration::from_millis(
                    fastrand::u64(1..20) * tries,
                ))
                .await;
            }
            done => return done,
        }
    }
}

async fn put_once<S: Store + ?Sized>(store: &S, record: &Exported) -> Result<Put, Error> {
    let run = &record.run;
    let id = run.run_id.as_str();
    crate::validate_run_id(id)?;
    let existing = store
        .load(id)
        .await
        .map_err(|e| store_error(id, "load before import", e))?;
    let outcome = match &existing {
        Some(e) if e.version >= run.version && !half_written(e) => {
            return Ok(Put::Kept { version: e.version })
        }
        Some(e) => {
            store.delete_if(id, e.version).await.map_err(|err| {
                store_error(id, "removal of the older version before import", err)
            })?;
            Put::Replaced { was: e.version }
        }
        None => Put::Written,
    };
    let history = record.history.as_deref().unwrap_or(&[]);
    if history.len() as u64 > run.version {
        return Err(Error::InvalidInput {
            what: format!("the import of run {id:?}"),
            reason: format!(
                "its version {} is below its {} history rows; nothing was written",
                run.version,
                history.len()
            ),
        });
    }
    let mut expected = None;
    if !history.is_empty() {
        let mut cp = Checkpoint::new(id, &run.workflow, run.created_at);
        // Not runnable while it is written: a copy cut short leaves a run
        // that says so, which copying again replaces.
        cp.status = RunStatus::Cancelled;
        cp.push_audit(crate::checkpoint::AuditEntry::new(
            crate::checkpoint::AuditAction::Cancel {
                was: RunStatus::Running,
                reason: Some(HALF_WRITTEN.into()),
            },
            COPIER,
            crate::Clock::now(&crate::SystemClock),
        ));
        // A pruned history starts at its fold row: the steps below it are
        // recorded by name only.
        let first = history[0].index;
        cp.completed = run.completed[..first.min(run.next)].to_vec();
        cp.next = cp.completed.len();
        // What the run started with: its state less what the steps wrote.
        let written: std::collections::HashSet<&str> = history
            .iter()
            .flat_map(|r| r.update.keys().map(String::as_str))
            .collect();
        cp.state = run
            .state
            .iter()
            .filter(|(k, _)| !written.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for r in history {
            for (k, v) in &r.update {
                cp.state.insert(k.clone(), v.clone());
            }
            cp.completed.push(run.completed[r.index].clone());
            cp.next += 1;
            cp.updated_at = r.finished_at;
            cp.writer = fastrand::u64(1..);
            let v = store
                .save(SaveRequest::new(&cp, expected).with_step(r))
                .await
                .map_err(|e| store_error(id, &format!("import of step {}", r.index), e))?;
            expected = Some(v);
        }
    }
    let req = SaveRequest::new(run, expected).writing_version(run.version);
    store
        .save(req)
        .await
        .map_err(|e| store_error(id, "import of the record", e))?;
    Ok(outcome)
}

/// [`put_run`] for each record, all at once (a store that groups
/// concurrent writes, SQLite, commits them together); the results in the
/// records' order.
pub async fn put_runs<S: Store + ?Sized>(
    store: &S,
    records: &[Exported],
) -> Vec<Result<Put, Error>> {
    futures_util::future::join_all(records.iter().map(|r| put_run(store, r))).await
}

/// The reason of the mark a run being written carries.
const HALF_WRITTEN: &str =
    "being copied in: a copy or import that stopped here left it unfinished; run it again";

/// Who marks a run being written.
const COPIER: &str = "steadfast copy";

/// Whether `cp` is a run that a copy or import left half written (it is
/// replaced whatever its version).
fn half_written(cp: &Checkpoint) -> bool {
    cp.status == RunStatus::Cancelled
        && cp.audit.last().is_some_and(|a| {
            a.by == COPIER
                && matches!(&a.action, crate::checkpoint::AuditAction::Cancel { reason: Some(r), .. } if r == HALF_WRITTEN)
        })
}

/// What [`copy`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyReport {
    /// Runs written that were absent.
    pub written: u64,
    /// Runs that replaced an older version.
    pub replaced: u64,
    /// Runs already there at the same or a newer version.
    pub kept: u64,
    /// Runs that vanished from the source while the copy ran.
    pub vanished: u64,
}

/// How many runs of a page [`copy`] moves at once.
const IN_FLIGHT: usize = 32;

/// Copies every run of `from` into `to` with [`put_run`], page by page in
/// run id order: resumable and idempotent (what arrived already is kept,
/// a newer record is never overwritten). `progress` is called after each
/// page. A run saved in the source while it is copied may arrive as the
/// version read; copying again brings the newer one.
pub async fn copy<A: Store + ?Sized, B: Store + ?Sized>(
    from: &A,
    to: &B,
    mut progress: impl FnMut(&CopyReport),
) -> Result<CopyReport, Error> {
    let mut report = CopyReport::default();
    let mut filter = ListFilter::new().limit(500);
    loop {
        let page = filter
            .next_page(from)
            .await
            .map_err(|e| store_error("*", "listing runs to copy", e))?;
        if page.is_empty() {
            break;
        }
        for chunk in page.chunks(IN_FLIGHT) {
            let moves = chunk.iter().map(|s| async move {
                let mut tries = 0;
                loop {
                    match export_run(from, &s.run_id).await {
                        Ok(None) => return Ok(None),
                        Ok(Some(rec)) => return put_run(to, &rec).await.map(Some),
                        Err(e) if e.is_conflict() && tries < 5 => tries += 1,
                        Err(e) => return Err(e),
                    }
                }
            });
            for done in futures_util::future::join_all(moves).await {
                match done? {
                    None => report.vanished += 1,
                    Some(Put::Written) => report.written += 1,
                    Some(Put::Replaced { .. }) => report.replaced += 1,
                    Some(Put::Kept { .. }) => report.kept += 1,
                }
            }
        }
        progress(&report);
    }
    Ok(report)
}
