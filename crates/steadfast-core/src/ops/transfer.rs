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
//! # Large values (version 2)
//!
//! [`ExportWriter`] carries each large value (a top-level value of a state
//! or of a step's update, or a decision's data, whose JSON text is over
//! [`EXPORT_BLOB_THRESHOLD`]) once per export, however many runs and steps hold it: the value's text
//! goes out first as blob lines, in parts of at most 8 MiB,
//!
//! ```text
//! {"format":2,"blob":"sha256:<64 hex digits>","bytes":N,"at":OFFSET,"text":"<part>"}
//! ```
//!
//! and the runs that hold it follow as lines of format 2, whose record is
//! as in version 1 but for those values: a reference
//! `{"$blob":"sha256:…","bytes":N}` in their place (and a value of the
//! caller's that looks like one escaped as `{"$blob":"literal","value":…}`);
//! a run whose decisions' data holds such a reference or escape has
//! `"format": 2` in its record (the checkpoint's own format, which builds
//! that do not read it refuse).
//! A run with no large value is written as version 1, which older builds
//! read. [`ImportReader`] reads both: it checks each blob against its hash
//! once whole, and refuses a run line that refers to a blob the export has
//! not carried before it (nothing of that run is written). The blobs read
//! are kept until the import ends.
//!
//! # Event logs (version 3)
//!
//! A run's event log (what its steps emitted, and the signals sent to it)
//! travels with it. [`ExportWriter`] writes a run that has events as event
//! lines, each at most [`EVENTS_PER_LINE`] events and about 8 MiB,
//!
//! ```text
//! {"format":3,"events":"<run id>","sha256":"<64 hex digits>","items":[{"seq":1,…},…]}
//! ```
//!
//! (`sha256` over the run id, a newline and `items` as written, so that a
//! line cannot be moved to another run), numbered from 1 with no gap,
//! followed by the run's line of format 3: as version 2 (large values may
//! be references), its record holding one more key,
//! `"events": {"last": N, "sha256": H}`: the number of its last event and
//! the SHA-256 of its event lines' checksums in order, so that the lines
//! cannot be dropped, swapped or taken from another export. [`ImportReader`]
//! refuses a run line whose events did not all come before it, events
//! without their run, and `events` in a line of an older format. Builds that
//! read only versions 1 and 2 refuse a line of version 3, so an older build
//! never imports a run without its events. [`put_run`] appends the events
//! while the run is still marked as being built, checks that the run is
//! still its own and that its log holds just those events, and only then
//! writes the record, so a run never appears complete without them.
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

use crate::engine::store_error;
use crate::record::checkpoint::{Checkpoint, StepRecord, COPIER, COPY_MARK};
use crate::record::error::{Error, StoreError, StoreErrorKind};
use crate::record::events::{NewEvent, RunEvent};
use crate::store::StoreExt as _;
use crate::store::{ListFilter, SaveRequest, Store};

/// The version of the export layout this build writes and reads.
pub const EXPORT_FORMAT: u32 = 1;

/// The largest version an imported run may carry: 2^53, the largest
/// integer every store (Cosmos DB's JSON numbers included) keeps exactly.
pub const MAX_VERSION: u64 = 1 << 53;

/// The version of the layout of a run line that refers to blobs, and of a
/// blob line ([`ExportWriter`]).
pub const EXPORT_FORMAT_BLOBS: u32 = 2;

/// The size above which an export carries a value once, as a blob: 64 KiB.
pub const EXPORT_BLOB_THRESHOLD: u64 = crate::store::blob::DEFAULT_BLOB_THRESHOLD;

/// The version of the layout of a run line that carries an event log, and
/// of an event line ([`ExportWriter`]).
pub const EXPORT_FORMAT_EVENTS: u32 = 3;

/// The most events one event line of an export holds.
pub const EVENTS_PER_LINE: usize = 1000;

/// The largest part of a blob's text in one line: 8 MiB, so that escaped
/// (at most six bytes for one) it stays within [`MAX_LINE_BYTES`].
const BLOB_PART: usize = 8 << 20;

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
    /// Its event log, whole, numbered from 1 (empty: none). Written as
    /// event lines of its own ([the module](self)), not in the run's line.
    #[serde(skip)]
    pub events: Vec<RunEvent>,
}

impl Exported {
    /// A run and its history, with no events.
    pub fn new(run: Checkpoint, history: Option<Vec<StepRecord>>) -> Self {
        Exported {
            run,
            history,
            events: Vec::new(),
        }
    }

    /// The same, with `events` as its event log.
    pub fn with_events(mut self, events: Vec<RunEvent>) -> Self {
        self.events = events;
        self
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    format: u32,
    sha256: String,
    record: Value,
}

/// A line as read: its record kept as the text it was written as.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine<'a> {
    format: u32,
    sha256: String,
    #[serde(borrow)]
    record: &'a serde_json::value::RawValue,
}

fn digest(record: &Value) -> String {
    // Writing a Value cannot fail.
    text_digest(&serde_json::to_vec(record).unwrap_or_default())
}

fn text_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Bytes as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first event of `events` not numbered as a whole log's would be
/// (1, 2, 3…): its number and the one due there.
fn misnumbered(events: &[RunEvent]) -> Option<(u64, u64)> {
    (1u64..)
        .zip(events)
        .find(|(due, e)| e.seq != *due)
        .map(|(due, e)| (e.seq, due))
}

/// Encodes one run as a line of the export format (without its newline).
/// A run with events takes more than one line: it is refused here, and
/// [`ExportWriter`] writes it.
pub fn encode_line(record: &Exported) -> Result<String, Error> {
    if !record.events.is_empty() {
        return Err(Error::InvalidInput {
            what: format!("the export of run {:?}", record.run.run_id),
            reason: format!(
                "it has {} events, which one line of format {EXPORT_FORMAT} cannot carry: write it with ExportWriter",
                record.events.len()
            ),
        });
    }
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
/// gives them, in order. It reads version 1; an export with large values
/// carried once (version 2) is read by [`ImportReader`].
pub fn decode_line(line: &str, lineno: usize) -> Result<Exported, Error> {
    decode_run_line(line, lineno, EXPORT_FORMAT).map(|(record, _)| record)
}

/// How an error names line `lineno` of an export.
fn bad_line(lineno: usize) -> impl Fn(String) -> Error {
    move |reason| Error::InvalidInput {
        what: format!("line {lineno} of the export"),
        reason,
    }
}

/// Refuses a line over [`MAX_LINE_BYTES`].
fn check_length(line: &str, lineno: usize) -> Result<(), Error> {
    if line.len() > MAX_LINE_BYTES {
        return Err(bad_line(lineno)(format!(
            "it is {} bytes, over the limit of {MAX_LINE_BYTES}",
            line.len()
        )));
    }
    Ok(())
}

/// What a run line of version 3 says of its event lines: the number of its
/// last event, and the checksum of the lines' checksums in order.
struct LogSeal {
    last: u64,
    chain: String,
}

/// The checksum of an event line: over its run id and its items' text, so
/// that the line cannot be moved to another run.
fn event_digest(run_id: &str, items: &str) -> String {
    let mut h = Sha256::new();
    h.update(run_id.as_bytes());
    h.update(b"\n");
    h.update(items.as_bytes());
    hex(&h.finalize())
}

/// The checksum of a run's event lines as a whole: over each line's
/// checksum, in order.
#[derive(Clone, Debug, Default)]
struct Chain(Sha256);

impl Chain {
    fn add(&mut self, line_digest: &str) {
        self.0.update(line_digest.as_bytes());
    }

    fn hex(&self) -> String {
        hex(&self.0.clone().finalize())
    }
}

/// What one event weighs towards [`MAX_EXPORT_EVENT_BYTES`]: its value's
/// JSON, its step's name, and 128 bytes for the rest of it as held in
/// memory.
fn weight(e: &RunEvent) -> u64 {
    crate::store::json_size(&e.value) + e.step.len() as u64 + 128
}

/// [`decode_line`] for a run line of version `format`; with what it says of
/// its event lines for version 3 ([`EXPORT_FORMAT_EVENTS`]), which must say
/// it.
fn decode_run_line(
    line: &str,
    lineno: usize,
    format: u32,
) -> Result<(Exported, Option<LogSeal>), Error> {
    let bad = bad_line(lineno);
    check_length(line, lineno)?;
    let parsed: RawLine =
        serde_json::from_str(line).map_err(|e| bad(format!("not an export line: {e}")))?;
    if parsed.format != format {
        return Err(bad(format!(
            "format {} is not understood here (this reads {format})",
            parsed.format
        )));
    }
    let text = parsed.record.get();
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not an export line: {e}")))?;
    // The checksum covers the record as written. A record whose text is
    // intact but holds a number that does not come back the same once read
    // (an integer past 2^64) matches it only as text.
    if digest(&value) != parsed.sha256 && text_digest(text.as_bytes()) != parsed.sha256 {
        return Err(bad(
            "its checksum does not match its record: the line was changed or damaged".into(),
        ));
    }
    let events = match (format, value.get("events")) {
        (EXPORT_FORMAT_EVENTS, Some(e)) => {
            let last = e.get("last").and_then(Value::as_u64).filter(|n| *n >= 1);
            let chain = e.get("sha256").and_then(Value::as_str);
            match (last, chain, e.as_object().map(|o| o.len())) {
                (Some(last), Some(chain), Some(2)) => Some(LogSeal {
                    last,
                    chain: chain.to_string(),
                }),
                _ => return Err(bad(
                    "its `events` must be {\"last\": N, \"sha256\": …}: the number of its last event (1 or more) and the checksum of its event lines".into(),
                )),
            }
        }
        (EXPORT_FORMAT_EVENTS, None) => {
            return Err(bad(
                "a run line of format 3 must give its events (`events`: the number of its last event and the checksum of its event lines)".into(),
            ))
        }
        (_, Some(_)) => {
            return Err(bad(format!(
                "a run line of format {format} cannot carry events (`events` is for format 3): the line was changed"
            )))
        }
        (_, None) => None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let mut record: Exported = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.inner().to_string();
        // An integer past 2^64 reads as a float, which a count refuses.
        let huge = inner
            .split_once("floating point `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .and_then(|(n, _)| n.parse::<f64>().ok())
            .is_some_and(|n| n.fract() == 0.0 && n.abs() >= u64::MAX as f64);
        if huge {
            bad(format!(
                "at `{}`: the number is too large for this field ({inner})",
                e.path()
            ))
        } else {
            bad(format!("at `{}`: {inner}", e.path()))
        }
    })?;
    // Earlier builds exported a run with steps and no rows as `[]`.
    if record.history.as_ref().is_some_and(|h| h.is_empty()) && record.run.next > 0 {
        record.history = None;
    }
    let run = &record.run;
    crate::validate_run_id(&run.run_id).map_err(|e| bad(e.to_string()))?;
    // From version 2 on, a decision's data may be a reference (which the
    // reader resolves); a line of version 1 holds values only.
    let checked = match format {
        EXPORT_FORMAT => run.check(),
        _ => run.check_stored(),
    };
    checked.map_err(|e| bad(format!("run {:?}: {e}", run.run_id)))?;
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
    Ok((record, events))
}

/// Writes runs as export lines, each large value once per export (see
/// [the module](self)).
#[derive(Debug, Default)]
pub struct ExportWriter {
    /// The blobs written so far.
    sent: std::collections::HashSet<crate::store::blob::BlobHash>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlobLine {
    format: u32,
    blob: String,
    bytes: u64,
    at: u64,
    text: String,
}

impl ExportWriter {
    /// A writer that has written nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands `put` the lines of `record`, one at a time (without their
    /// newlines): the blob lines of the large values it holds that no
    /// earlier run of this export held, then the run's line.
    pub fn write(
        &mut self,
        record: &Exported,
        put: &mut dyn FnMut(&str) -> Result<(), Error>,
    ) -> Result<(), Error> {
        use crate::store::blob::encode_map;
        let id = record.run.run_id.as_str();
        let invalid = |e: StoreError| Error::InvalidInput {
            what: format!("the export of run {id:?}"),
            reason: e.to_string(),
        };
        let mut blobs = Vec::new();
        let mut run = record.run.clone();
        run.state = encode_map(&run.state, EXPORT_BLOB_THRESHOLD, id, "state", &mut blobs)
            .map_err(invalid)?;
        let mut history = record.history.clone();
        for row in history.iter_mut().flatten() {
            row.update = encode_map(
                &row.update,
                EXPORT_BLOB_THRESHOLD,
                id,
                "step's update",
                &mut blobs,
            )
            .map_err(invalid)?;
        }
        // A decision's large data too (the same content as the state's
        // value under the gate's name, once approved: carried once).
        if let Some(stored) = crate::store::blob::encode_decisions(
            &run.decisions,
            EXPORT_BLOB_THRESHOLD,
            id,
            &mut blobs,
        )
        .map_err(invalid)?
        {
            run.decisions = stored;
            run.format = crate::store::blob::STORED_DECISIONS_FORMAT;
        }
        if blobs.is_empty() && record.events.is_empty() {
            return put(&encode_line(record)?);
        }
        for blob in &blobs {
            if !self.sent.insert(blob.hash) {
                continue;
            }
            let text = blob.text.as_str();
            let mut at = 0;
            while at < text.len() {
                let mut end = (at + BLOB_PART).min(text.len());
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                let line = BlobLine {
                    format: EXPORT_FORMAT_BLOBS,
                    blob: blob.hash.to_string(),
                    bytes: text.len() as u64,
                    at: at as u64,
                    text: text[at..end].to_string(),
                };
                put(
                    &serde_json::to_string(&line).map_err(|e| Error::InvalidInput {
                        what: format!("the export of run {id:?}"),
                        reason: e.to_string(),
                    })?,
                )?;
                at = end;
            }
        }
        let (format, chain) = match record.events.last() {
            None => (EXPORT_FORMAT_BLOBS, None),
            Some(_) => (
                EXPORT_FORMAT_EVENTS,
                Some(write_event_lines(id, &record.events, put)?),
            ),
        };
        let mut value =
            serde_json::to_value(Exported::new(run, history)).map_err(|e| Error::InvalidInput {
                what: format!("the export of run {id:?}"),
                reason: e.to_string(),
            })?;
        if let (Some(last), Some(chain), Value::Object(map)) =
            (record.events.last(), chain, &mut value)
        {
            map.insert(
                "events".into(),
                serde_json::json!({"last": last.seq, "sha256": chain}),
            );
        }
        let line = Line {
            format,
            sha256: digest(&value),
            record: value,
        };
        put(
            &serde_json::to_string(&line).map_err(|e| Error::InvalidInput {
                what: format!("the export of run {id:?}"),
                reason: e.to_string(),
            })?,
        )
    }
}

/// The most one run's event log may weigh in an export: 1 GiB, counting
/// each event's value as JSON, its step's name and 128 bytes more (so at
/// most about 8 million events).
pub const MAX_EXPORT_EVENT_BYTES: u64 = 1 << 30;

/// An event line as written: its checksum covers its run id and its items.
#[derive(Serialize)]
#[serde(deny_unknown_fields)]
struct EventLine<'a> {
    format: u32,
    events: &'a str,
    sha256: String,
    items: &'a serde_json::value::RawValue,
}

/// An event line as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEventLine<'a> {
    format: u32,
    events: String,
    sha256: String,
    #[serde(borrow)]
    items: &'a serde_json::value::RawValue,
}

/// Hands `put` run `id`'s events as event lines, checking that they are
/// numbered 1, 2, 3… and within [`MAX_EXPORT_EVENT_BYTES`]; returns the
/// checksum of the lines as a whole, for the run's line.
fn write_event_lines(
    id: &str,
    events: &[RunEvent],
    put: &mut dyn FnMut(&str) -> Result<(), Error>,
) -> Result<String, Error> {
    let refuse = |reason: String| Error::InvalidInput {
        what: format!("the export of run {id:?}"),
        reason,
    };
    let mut total = 0u64;
    let mut items: Vec<String> = Vec::new();
    let mut size = 0usize;
    let mut chain = Chain::default();
    let mut flush = |items: &mut Vec<String>| -> Result<(), Error> {
        let text = format!("[{}]", items.join(","));
        items.clear();
        let raw =
            serde_json::value::RawValue::from_string(text).map_err(|e| refuse(e.to_string()))?;
        let line = EventLine {
            format: EXPORT_FORMAT_EVENTS,
            events: id,
            sha256: event_digest(id, raw.get()),
            items: &raw,
        };
        chain.add(&line.sha256);
        put(&serde_json::to_string(&line).map_err(|e| refuse(e.to_string()))?)
    };
    if let Some((found, due)) = misnumbered(events) {
        return Err(refuse(format!(
            "its event log has event {found} where {due} was due: an export carries a log whole, numbered from 1"
        )));
    }
    for event in events {
        let text = serde_json::to_string(event).map_err(|e| refuse(e.to_string()))?;
        total += weight(event);
        if total > MAX_EXPORT_EVENT_BYTES {
            return Err(refuse(format!(
                "its event log is over {MAX_EXPORT_EVENT_BYTES} bytes, the most an export carries for one run"
            )));
        }
        if !items.is_empty() && (items.len() == EVENTS_PER_LINE || size + text.len() > BLOB_PART) {
            flush(&mut items)?;
            size = 0;
        }
        size += text.len() + 1;
        items.push(text);
    }
    if !items.is_empty() {
        flush(&mut items)?;
    }
    Ok(chain.hex())
}

/// The blobs an import has read whole and checked, kept until the end in a
/// temporary file with no name (it goes when the reader does, or the
/// process), so that the reader holds one blob in memory at a time rather
/// than every blob the export carried. A blob read back is checked against
/// its hash again as it is put into its run.
#[derive(Debug, Default)]
struct Spilled {
    /// Made at the first blob.
    file: Option<std::fs::File>,
    /// Where each blob lies in the file: its offset and length.
    at: std::collections::HashMap<crate::store::blob::BlobHash, (u64, usize)>,
    /// The file's length.
    end: u64,
    /// Blobs that could not be kept, and why: a run that refers to one
    /// fails with that reason (not as a dangling reference).
    lost: std::collections::HashMap<crate::store::blob::BlobHash, String>,
}

impl Spilled {
    /// Keeps `text`, the blob named `hash` read from lines `from` to `to`
    /// (once: a blob carried again is already kept). A blob that cannot be
    /// written to the file is noted as lost, for the runs that refer to it.
    fn put(&mut self, hash: crate::store::blob::BlobHash, text: &[u8], from: usize, to: usize) {
        use std::os::unix::fs::FileExt;
        if self.at.contains_key(&hash) {
            return;
        }
        let file = match &mut self.file {
            Some(file) => Ok(file),
            none => tempfile::tempfile().map(|f| none.insert(f)),
        };
        match file.and_then(|f| f.write_all_at(text, self.end)) {
            Ok(()) => {
                self.lost.remove(&hash);
                self.at.insert(hash, (self.end, text.len()));
                self.end += text.len() as u64;
            }
            Err(e) => {
                self.lost.insert(
                    hash,
                    format!("blob {hash} (lines {from} to {to}) could not be kept in a temporary file until its runs: {e}"),
                );
            }
        }
    }

    /// The blob named `hash`, if it was kept.
    fn get(&self, hash: &crate::store::blob::BlobHash) -> Result<Option<Vec<u8>>, StoreError> {
        use std::os::unix::fs::FileExt;
        if let Some(why) = self.lost.get(hash) {
            return Err(StoreError::unavailable(why.clone()));
        }
        let (Some(&(at, len)), Some(file)) = (self.at.get(hash), &self.file) else {
            return Ok(None);
        };
        let mut text = Vec::new();
        text.try_reserve_exact(len).map_err(|e| {
            StoreError::unavailable(format!(
                "reading blob {hash} back from the import's temporary file: no memory for its {len} bytes: {e}"
            ))
        })?;
        text.resize(len, 0);
        file.read_exact_at(&mut text, at).map_err(|e| {
            StoreError::unavailable(format!(
                "reading blob {hash} back from the import's temporary file: {e}"
            ))
        })?;
        Ok(Some(text))
    }

    /// The bytes of blobs kept.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.end
    }
}

/// Events read for the run whose line is still to come.
#[derive(Debug)]
struct PendingEvents {
    run: String,
    items: Vec<RunEvent>,
    bytes: u64,
    from: usize,
    chain: Chain,
}

/// Reads export lines of any version, keeping the blobs they carry to
/// put the large values back into the runs that follow (see
/// [the module](self)).
#[derive(Debug, Default)]
pub struct ImportReader {
    /// Blobs read whole and checked, kept in a temporary file.
    blobs: Spilled,
    /// The blob being read: its hash, its size, its text so far, and the
    /// line it started on.
    partial: Option<(crate::store::blob::BlobHash, u64, Vec<u8>, usize)>,
    /// The events read for the next run line.
    events: Option<PendingEvents>,
}

#[derive(Deserialize)]
struct Peek {
    format: Option<u32>,
    blob: Option<serde::de::IgnoredAny>,
    events: Option<serde::de::IgnoredAny>,
}

impl ImportReader {
    /// A reader that has read nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads line `lineno` (1-based, for messages): a run, its large values
    /// put back, or `None` for a part of a blob. A run that refers to a
    /// blob the export has not carried whole before it is refused, naming
    /// the blob, as is a blob whose text does not match its hash or whose
    /// parts do not follow each other.
    pub fn line(&mut self, line: &str, lineno: usize) -> Result<Option<Exported>, Error> {
        use crate::store::blob::{BlobHash, Resolver, MAX_BLOB_BYTES};
        let bad = bad_line(lineno);
        check_length(line, lineno)?;
        let peek: Peek =
            serde_json::from_str(line).map_err(|e| bad(format!("not an export line: {e}")))?;
        if peek.blob.is_some() {
            let part: BlobLine =
                serde_json::from_str(line).map_err(|e| bad(format!("not a blob line: {e}")))?;
            if part.format != EXPORT_FORMAT_BLOBS {
                return Err(bad(format!(
                    "a blob line of format {} is not understood by this build",
                    part.format
                )));
            }
            let hash = BlobHash::parse(&part.blob)
                .ok_or_else(|| bad(format!("{:?} is not a blob's name", part.blob)))?;
            if part.bytes > MAX_BLOB_BYTES {
                return Err(bad(format!(
                    "blob {hash} of {} bytes is over the largest value a store takes ({MAX_BLOB_BYTES})",
                    part.bytes
                )));
            }
            let (h, bytes, mut text, from) = match self.partial.take() {
                None if part.at == 0 => (hash, part.bytes, Vec::new(), lineno),
                Some(p) if p.0 == hash && p.1 == part.bytes => p,
                Some((other, _, _, from)) => {
                    return Err(bad(format!(
                        "blob {other}, begun on line {from}, ends before its last part"
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "a part of blob {hash} at offset {} comes without the parts before it",
                        part.at
                    )))
                }
            };
            if part.at != text.len() as u64 {
                return Err(bad(format!(
                    "a part of blob {h} at offset {} follows {} bytes of it",
                    part.at,
                    text.len()
                )));
            }
            text.extend_from_slice(part.text.as_bytes());
            if text.len() as u64 > bytes {
                return Err(bad(format!("blob {h} is longer than its {bytes} bytes")));
            }
            if text.len() as u64 == bytes {
                if BlobHash::of(&text) != h {
                    return Err(bad(format!(
                        "blob {h} (lines {from} to {lineno}) does not match its hash: damaged"
                    )));
                }
                self.blobs.put(h, &text, from, lineno);
            } else {
                self.partial = Some((h, bytes, text, from));
            }
            return Ok(None);
        }
        if let Some((h, _, _, from)) = &self.partial {
            return Err(bad(format!(
                "blob {h}, begun on line {from}, ends before its last part"
            )));
        }
        if peek.events.is_some() {
            self.event_line(line, lineno)?;
            return Ok(None);
        }
        let (mut record, last_event) = match peek.format {
            Some(f @ (EXPORT_FORMAT_BLOBS | EXPORT_FORMAT_EVENTS)) => {
                decode_run_line(line, lineno, f)?
            }
            _ => (decode_line(line, lineno)?, None),
        };
        let id = record.run.run_id.clone();
        let pending = self.events.take();
        match (pending, last_event) {
            (None, None) => {}
            (Some(p), _) if p.run != id => {
                return Err(bad(format!(
                    "the events of run {:?} (from line {}) are followed by the line of run {id:?}, not of their own run",
                    p.run, p.from
                )))
            }
            (Some(p), Some(seal)) if p.items.len() as u64 != seal.last => {
                return Err(bad(format!(
                    "run {id:?} has {} events, and the export carries {} of them before its line; nothing of the run was written",
                    seal.last,
                    p.items.len()
                )))
            }
            (Some(p), Some(seal)) if p.chain.hex() != seal.chain => {
                return Err(bad(format!(
                    "the event lines before run {id:?}'s line (from line {}) are not the ones exported with it; nothing of the run was written",
                    p.from
                )))
            }
            (Some(p), Some(_)) => record.events = p.items,
            (Some(p), None) => {
                return Err(bad(format!(
                    "the events of run {id:?} (from line {}) are followed by a line of the run that does not count them",
                    p.from
                )))
            }
            (None, Some(seal)) => {
                return Err(bad(format!(
                    "run {id:?} has {} events, and the export does not carry them before its line; nothing of the run was written",
                    seal.last
                )))
            }
        }
        if peek.format == Some(EXPORT_FORMAT) || peek.format.is_none() {
            return Ok(Some(record));
        }
        let locate = |column: &str| format!("line {lineno} of the export, run {id:?}, {column}");
        let place = crate::store::rows::Place::new(&id, &locate);
        let blobs = &self.blobs;
        let mut fetch = |h: &BlobHash, _: u64| blobs.get(h);
        let mut resolver = Resolver::new(&mut fetch);
        let refused = |e: StoreError| {
            match e {
            StoreError::Corrupt { location, reason } => Error::InvalidInput {
                what: location,
                reason: format!("{reason} (the export does not carry it before this line); nothing of the run was written"),
            },
            other => store_error(
                &id,
                &format!("line {lineno} of the export: putting its large values back"),
                other,
            ),
        }
        };
        resolver
            .resolve_record(&mut record.run, &place)
            .map_err(refused)?;
        if let Some(rows) = record.history.as_mut() {
            resolver
                .resolve_rows(rows, &place, |i| format!("history[{i}].update"))
                .map_err(refused)?;
        }
        Ok(Some(record))
    }

    /// Reads an event line: checked whole, then kept for its run's line.
    fn event_line(&mut self, line: &str, lineno: usize) -> Result<(), Error> {
        let bad = bad_line(lineno);
        let parsed: RawEventLine =
            serde_json::from_str(line).map_err(|e| bad(format!("not an event line: {e}")))?;
        if parsed.format != EXPORT_FORMAT_EVENTS {
            return Err(bad(format!(
                "an event line of format {} is not understood by this build",
                parsed.format
            )));
        }
        let id = parsed.events;
        crate::validate_run_id(&id).map_err(|e| bad(e.to_string()))?;
        if event_digest(&id, parsed.items.get()) != parsed.sha256 {
            return Err(bad(format!(
                "the checksum of run {id:?}'s events does not match them and their run: the line was changed or damaged"
            )));
        }
        let items: Vec<RunEvent> = serde_json::from_str(parsed.items.get())
            .map_err(|e| bad(format!("run {id:?}'s events: {e}")))?;
        if items.is_empty() || items.len() > EVENTS_PER_LINE {
            return Err(bad(format!(
                "an event line holds 1 to {EVENTS_PER_LINE} events, not {}",
                items.len()
            )));
        }
        let mut pending = match self.events.take() {
            None => PendingEvents {
                run: id.clone(),
                items: Vec::new(),
                bytes: 0,
                from: lineno,
                chain: Chain::default(),
            },
            Some(p) if p.run == id => p,
            Some(p) => {
                return Err(bad(format!(
                    "the events of run {:?} (from line {}) are followed by events of run {id:?}, not by their run's line",
                    p.run, p.from
                )))
            }
        };
        let news: Vec<NewEvent> = items.iter().map(RunEvent::unnumbered).collect();
        crate::store::check_events(&id, &news).map_err(|e| bad(e.to_string()))?;
        pending.chain.add(&parsed.sha256);
        for event in &items {
            let due = pending.items.len() as u64 + 1;
            if event.seq != due {
                return Err(bad(format!(
                    "run {id:?}'s event {} comes where event {due} was due: an event line is missing, repeated or out of order",
                    event.seq
                )));
            }
            pending.bytes += weight(event);
            if pending.bytes > MAX_EXPORT_EVENT_BYTES {
                return Err(bad(format!(
                    "run {id:?}'s events are over {MAX_EXPORT_EVENT_BYTES} bytes, the most an import takes for one run"
                )));
            }
            pending.items.push(event.clone());
        }
        self.events = Some(pending);
        Ok(())
    }

    /// Checks that the export did not end in the middle of a blob, or with
    /// events whose run's line never came.
    pub fn finish(&self) -> Result<(), Error> {
        if let Some(p) = &self.events {
            return Err(Error::InvalidInput {
                what: "the export".into(),
                reason: format!(
                    "it ends with {} events of run {:?} (from line {}) and no line of the run",
                    p.items.len(),
                    p.run,
                    p.from
                ),
            });
        }
        match &self.partial {
            None => Ok(()),
            Some((h, bytes, text, from)) => Err(Error::InvalidInput {
                what: "the export".into(),
                reason: format!(
                    "it ends inside blob {h}, begun on line {from}: {} of its {bytes} bytes",
                    text.len()
                ),
            }),
        }
    }
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
            return Err(conflict_in(run_id, "export", Some(run.version), None));
        }
    }
    let events = read_log(store, run_id).await?;
    if !events.is_empty() {
        // The log belongs to the run read: not to one deleted and made
        // again under its id between the reads.
        let again = store
            .load(run_id)
            .await
            .map_err(|e| store_error(run_id, "load for export", e))?;
        if again.as_ref().map(|c| (c.version, c.writer)) != Some((run.version, run.writer)) {
            let found = again.map(|c| c.version);
            return Err(conflict_in(run_id, "export", Some(run.version), found));
        }
    }
    Ok(Some(Exported::new(run, history).with_events(events)))
}

/// Run `run_id`'s whole event log (empty on a store without one), read
/// after its record, so that every signal the record took is in it.
async fn read_log<S: Store + ?Sized>(store: &S, run_id: &str) -> Result<Vec<RunEvent>, Error> {
    let Some(log) = store.capabilities().events else {
        return Ok(Vec::new());
    };
    let mut events: Vec<RunEvent> = Vec::new();
    let mut weight_so_far = 0u64;
    loop {
        let page = log
            .read_events(run_id, events.len() as u64, EVENTS_PER_LINE)
            .await
            .map_err(|e| store_error(run_id, "reading the event log for export", e))?;
        let got = page.len();
        for event in page {
            if event.seq != events.len() as u64 + 1 {
                return Err(store_error(
                    run_id,
                    "reading the event log for export",
                    StoreError::Corrupt {
                        location: format!("the event log of run {run_id:?}"),
                        reason: format!("event {} follows event {}", event.seq, events.len()),
                    },
                ));
            }
            weight_so_far += weight(&event);
            if weight_so_far > MAX_EXPORT_EVENT_BYTES {
                return Err(Error::InvalidInput {
                    what: format!("the export of run {run_id:?}"),
                    reason: format!(
                        "its event log is over {MAX_EXPORT_EVENT_BYTES} bytes (at event {}), the most an export or a copy carries for one run",
                        event.seq
                    ),
                });
            }
            events.push(event);
        }
        if got < EVENTS_PER_LINE {
            return Ok(events);
        }
    }
}

/// Appends `events` (a log whole, numbered from 1) to run `id`'s log here,
/// in appends the store takes, checking that they land under their own
/// numbers (the log was empty).
async fn append_log<S: Store + ?Sized>(
    store: &S,
    id: &str,
    events: &[RunEvent],
) -> Result<(), Error> {
    let Some(log) = store.capabilities().events else {
        return Err(Error::InvalidInput {
            what: format!("the import of run {id:?}"),
            reason: format!(
                "it has {} events and this store keeps no event log",
                events.len()
            ),
        });
    };
    let (most, bytes) = log.append_bounds();
    let most = most.clamp(1, crate::record::events::MAX_EVENTS_PER_APPEND);
    let mut at = 0;
    while at < events.len() {
        let mut batch = Vec::new();
        let mut size = 0u64;
        while at + batch.len() < events.len() && batch.len() < most {
            let e = &events[at + batch.len()];
            let len = crate::store::json_size(&e.value);
            if !batch.is_empty() && size + len > bytes {
                break;
            }
            size += len;
            batch.push(e.unnumbered());
        }
        let last = log
            .append_events(id, &batch)
            .await
            .map_err(|e| store_error(id, "import of the event log", e))?;
        at += batch.len();
        if last != at as u64 {
            return Err(log_not_ours(id, at as u64, last));
        }
    }
    Ok(())
}

/// The error for a log that holds other events than the import wrote:
/// not a conflict (which would say another writer owns the run now), so
/// that a replacement puts the run it replaced back.
fn log_not_ours(id: &str, want: u64, found: u64) -> Error {
    store_error(
        id,
        "import of the event log",
        StoreError::Corrupt {
            location: format!("the event log of run {id:?} here"),
            reason: format!(
                "it holds {found} events where the import wrote {want}: something else appended to it meanwhile; import again"
            ),
        },
    )
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

/// How [`put_run_with`] and [`copy_with`] treat the runs already there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PutOptions {
    /// Replace an older version of a run even while a live process holds
    /// it (its lease has not lapsed). Without it, such a run is refused
    /// with [`Error::Held`] and left as it is.
    ///
    /// What it costs: the holder's step that is running goes on (its side
    /// effects happen), but its result is never saved: the holder's next
    /// save is refused and it stops, saying the run was replaced. Where the
    /// record written is older than the holder's progress, the steps it did
    /// since run again when the run is resumed.
    pub force: bool,
}

impl PutOptions {
    /// Replaces runs a live process holds; see [`PutOptions::force`].
    pub fn force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }
}

/// [`put_run_with`] with the default options: a run a live process holds
/// is refused.
pub async fn put_run<S: Store + ?Sized>(store: &S, record: &Exported) -> Result<Put, Error> {
    put_run_with(store, record, &PutOptions::default()).await
}

/// Writes `record` into `store` as it was where it came from: the same
/// version, state, head and history. Idempotent: a run already here at the
/// same or a newer version is kept as it is ([`Put::Kept`]); an older one
/// is replaced.
///
/// Everything that decides whether the record can be written is checked
/// before anything is ([`check_writable`]): that it is consistent (its
/// history rows match its steps, its version is at least its number of
/// rows), that every value loads back, and that the state, after every
/// step as it is written, is within the store's limit
/// ([`Capabilities::max_state_bytes`](crate::store::Capabilities::max_state_bytes)). A record that fails is an error that says
/// so, and the store is not touched. An older run that a live process holds
/// is refused with [`Error::Held`] unless `opts` forces it.
///
/// An older run is read whole (record and history) before it is deleted
/// (on condition of its version), so that if writing the new one fails
/// even so (the store fails, a file store's whole file outgrows its
/// limit), the old one is written back as it was, and the error says
/// whether that worked. A run that cannot be read back whole is not
/// replaced.
///
/// The history is written step by step, as a run would have (one save per
/// step, each carrying its row), with the run marked as being built
/// ([`Checkpoint::being_built`]) so that no worker takes it and retention
/// leaves it alone; the last save writes the record itself, with its own
/// version, status and lease. A copy cut short leaves that marked run,
/// which the next copy replaces.
///
/// Two copies or imports of one run at the same moment both end well: a
/// write that meets another (a conflict) looks at the store again and
/// decides anew, a few times, before it gives up with the conflict.
pub async fn put_run_with<S: Store + ?Sized>(
    store: &S,
    record: &Exported,
    opts: &PutOptions,
) -> Result<Put, Error> {
    let id = record.run.run_id.as_str();
    crate::validate_run_id(id)?;
    check_writable(record, store.max_state_bytes(), store.blob_threshold())?;
    if !record.events.is_empty() && store.capabilities().events.is_none() {
        return Err(Error::InvalidInput {
            what: format!("the import of run {id:?}"),
            reason: format!(
                "it has {} events and this store keeps no event log; nothing was written",
                record.events.len()
            ),
        });
    }
    let mut tries = 0;
    loop {
        match put_once(store, record, opts).await {
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

/// Checks everything about `record` that decides whether a store can take
/// it, before anything is written: its consistency, its values (each
/// history row's update, the state, decisions' data), and the size of its
/// state after each step as [`put_run_with`] writes them, against `limit`
/// (none: not checked).
///
/// `blob_threshold`: the store keeps values longer than this as blobs
/// ([`Blobs::threshold`](crate::store::Blobs::threshold)), so they count
/// as references towards the limit.
pub fn check_writable(
    record: &Exported,
    limit: Option<u64>,
    blob_threshold: Option<u64>,
) -> Result<(), Error> {
    let run = &record.run;
    let id = run.run_id.as_str();
    let refuse = |reason: String| Error::InvalidInput {
        what: format!("the import of run {id:?}"),
        reason: format!("{reason}; nothing was written"),
    };
    run.check().map_err(refuse)?;
    if run.version > MAX_VERSION {
        return Err(refuse(format!(
            "its version {} is over the largest a store keeps exactly ({MAX_VERSION})",
            run.version
        )));
    }
    let history = record.history.as_deref().unwrap_or(&[]);
    if history.len() as u64 > run.version {
        return Err(refuse(format!(
            "its version {} is below its {} history rows",
            run.version,
            history.len()
        )));
    }
    if !history.is_empty() && !crate::ops::history_is_whole(run, history) {
        return Err(refuse(format!(
            "its {} history rows do not match its {} completed steps",
            history.len(),
            run.next
        )));
    }
    let as_input = |e: StoreError| match e {
        StoreError::InvalidInput(reason) => Error::InvalidInput {
            what: format!("the import of run {id:?}"),
            reason,
        },
        other => store_error(id, "checking the import", other),
    };
    crate::store::check_head(run).map_err(as_input)?;
    crate::store::check_state(id, "the state", &run.state).map_err(as_input)?;
    if let Some((found, due)) = misnumbered(&record.events) {
        return Err(refuse(format!(
            "its event log has event {found} where {due} was due (a log is carried whole, numbered from 1)"
        )));
    }
    for chunk in record
        .events
        .chunks(crate::record::events::MAX_EVENTS_PER_APPEND)
    {
        let news: Vec<NewEvent> = chunk.iter().map(RunEvent::unnumbered).collect();
        crate::store::check_events(id, &news).map_err(as_input)?;
    }
    for r in history {
        crate::store::check_state(id, &format!("step {}'s update", r.index), &r.update)
            .map_err(as_input)?;
    }
    let Some(limit) = limit else {
        return Ok(());
    };
    let too_large = |size: u64, when: String| {
        refuse(format!(
            "{when} is {size} bytes, over the store's limit of {limit} bytes"
        ))
    };
    // The state as each save writes it: what the run started with, then
    // each step's update merged in order, then the record's own.
    let mut sizes = Sizes {
        blob_threshold,
        ..Sizes::default()
    };
    let written: std::collections::HashSet<&str> = history
        .iter()
        .flat_map(|r| r.update.keys().map(String::as_str))
        .collect();
    for (k, v) in run
        .state
        .iter()
        .filter(|(k, _)| !written.contains(k.as_str()))
    {
        sizes.set(k, v);
    }
    for r in history {
        for (k, v) in &r.update {
            if k != crate::record::state::STEP_KEY {
                sizes.set(k, v);
            }
        }
        if sizes.total() > limit {
            return Err(too_large(
                sizes.total(),
                format!("its state after step {} ({})", r.index, r.name),
            ));
        }
    }
    let last = match blob_threshold {
        Some(t) => crate::store::blob::stored_size(&run.state, t),
        None => crate::store::state_size(&run.state),
    };
    if last > limit {
        return Err(too_large(last, "its state".into()));
    }
    Ok(())
}

/// The serialized size of a state kept up to date as keys are set, without
/// writing the whole state out each time.
#[derive(Default)]
struct Sizes<'a> {
    entries: std::collections::HashMap<&'a str, u64>,
    sum: u64,
    /// Values longer count as a blob's reference.
    blob_threshold: Option<u64>,
}

impl<'a> Sizes<'a> {
    fn set(&mut self, key: &'a str, value: &Value) {
        use crate::store::named::{json_len, json_str_len};
        // `"k":v`, as the entry stands in its map (measured as the stores
        // measure it).
        let value = match self.blob_threshold {
            Some(t) => crate::store::blob::stored_value_size(value, t),
            None => json_len(value),
        };
        let size = json_str_len(key) + 1 + value;
        if let Some(old) = self.entries.insert(key, size) {
            self.sum -= old;
        }
        self.sum += size;
    }

    fn total(&self) -> u64 {
        // Braces, and a comma between entries.
        2 + self.sum + (self.entries.len() as u64).saturating_sub(1)
    }
}

async fn put_once<S: Store + ?Sized>(
    store: &S,
    record: &Exported,
    opts: &PutOptions,
) -> Result<Put, Error> {
    let run = &record.run;
    let id = run.run_id.as_str();
    let existing = store
        .load(id)
        .await
        .map_err(|e| store_error(id, "load before import", e))?;
    let Some(existing) = existing else {
        write_record(store, record).await.map_err(|f| f.error)?;
        return Ok(Put::Written);
    };
    if existing.version >= run.version && !existing.being_built() {
        return Ok(Put::Kept {
            version: existing.version,
        });
    }
    if !opts.force {
        crate::ops::check_not_held(&existing, crate::engine::Runner::new(store).now())?;
    }
    // Read whole first: what cannot be written back is never deleted.
    let old = match export_run(store, id).await {
        Ok(Some(old)) if old.run.version == existing.version => old,
        // It changed or went since it was looked at: look again.
        Ok(_) => return Err(conflict(id, existing.version)),
        Err(e) if e.is_conflict() => {
            // The record and its history disagreed: another writer between
            // the two reads (look again), or, at the same version, a
            // history that does not match its record.
            let now = store.load(id).await.ok().flatten().map(|c| c.version);
            if now != Some(existing.version) {
                return Err(e);
            }
            return Err(not_replaced(
                id,
                existing.version,
                StoreError::Corrupt {
                    location: format!("the history of run {id:?}"),
                    reason: "its rows do not match its record's completed steps".into(),
                },
            ));
        }
        Err(Error::Store { source, .. }) => return Err(not_replaced(id, existing.version, source)),
        Err(e) => return Err(e),
    };
    // And it must be writable as it is, should it have to be put back.
    if let Err(e) = check_writable(&old, store.max_state_bytes(), store.blob_threshold()) {
        return Err(Error::InvalidInput {
            what: format!("the import of run {id:?}"),
            reason: format!(
                "the run there (version {}) could not be written back if writing its replacement failed ({}), so it is not replaced; nothing was written",
                old.run.version,
                crate::record::error::chain(&e)
            ),
        });
    }
    match store.delete_if(id, old.run.version).await {
        Ok(true) => {}
        Ok(false) => return Err(conflict(id, old.run.version)),
        Err(e) => {
            return Err(store_error(
                id,
                "removal of the older version before import",
                e,
            ))
        }
    }
    match write_record(store, record).await {
        Ok(()) => Ok(Put::Replaced {
            was: old.run.version,
        }),
        // Another writer took the id meanwhile (another import of it, a
        // start): what is there is theirs, and the put looks again.
        Err(f) if f.error.is_conflict() => Err(f.error),
        Err(f) => Err(restore(store, &old, f).await),
    }
}

/// The error for a run there that cannot be read back whole: it is not
/// replaced.
fn not_replaced(id: &str, version: u64, source: StoreError) -> Error {
    store_error(
        id,
        &format!(
            "reading the run there (version {version}) whole before replacing it (it is not replaced; nothing was written)"
        ),
        source,
    )
}

/// After writing a replacement failed: puts the run that was there back as
/// it was, removing only what this write left (its own half-written run,
/// at the version it last wrote), and says what happened.
async fn restore<S: Store + ?Sized>(store: &S, old: &Exported, failed: Unwritten) -> Error {
    let id = old.run.run_id.as_str();
    let back: Result<(), Error> = async {
        let left = store
            .load(id)
            .await
            .map_err(|e| store_error(id, "load before putting the run back", e))?;
        match left {
            None => {}
            Some(cp) if Some((cp.version, cp.writer)) == failed.last => {
                store
                    .delete_if(id, cp.version)
                    .await
                    .map_err(|e| store_error(id, "removal of the unfinished import", e))?;
            }
            Some(cp) => {
                return Err(store_error(
                    id,
                    "putting the run back",
                    StoreError::Conflict {
                        run_id: id.to_string(),
                        expected: failed.last.map(|(v, _)| v),
                        found: Some(cp.version),
                    },
                ))
            }
        }
        write_record(store, old).await.map_err(|f| f.error)
    }
    .await;
    let cause = crate::record::error::chain(&failed.error);
    let source = match failed.error {
        Error::Store { source, .. } => source,
        other => StoreError::backend(
            StoreErrorKind::Unavailable,
            crate::record::error::chain(&other),
        ),
    };
    match back {
        Ok(()) => store_error(
            id,
            &format!(
                "import (writing it failed; the run that was there, version {}, was put back as it was)",
                old.run.version
            ),
            source,
        ),
        Err(again) => store_error(
            id,
            &format!(
                "import (writing it failed: {cause}; the run that was there, version {}, could not be put back: {}; it is lost from this store unless it is imported again from a copy)",
                old.run.version,
                crate::record::error::chain(&again)
            ),
            source,
        ),
    }
}

fn conflict(id: &str, expected: u64) -> Error {
    conflict_in(id, "import", Some(expected), None)
}

/// A conflict met by `what` on run `id`: it was at `expected`, and is now
/// at `found`.
fn conflict_in(id: &str, what: &str, expected: Option<u64>, found: Option<u64>) -> Error {
    store_error(
        id,
        what,
        StoreError::Conflict {
            run_id: id.to_string(),
            expected,
            found,
        },
    )
}

/// A [`write_record`] that failed: why, and the version and writer number
/// of its last save that landed (none: it wrote nothing).
struct Unwritten {
    error: Error,
    last: Option<(u64, u64)>,
}

/// Writes `record` where no run of its id is: its history step by step
/// under the building mark, then the record itself.
async fn write_record<S: Store + ?Sized>(store: &S, record: &Exported) -> Result<(), Unwritten> {
    let run = &record.run;
    let id = run.run_id.as_str();
    let history = record.history.as_deref().unwrap_or(&[]);
    let mut last: Option<(u64, u64)> = None;
    let fail = |error: Error, last| Unwritten { error, last };
    if !history.is_empty() {
        // Its age while it is written is when the writing began.
        let now = crate::engine::Runner::new(store).now();
        let mut cp = Checkpoint::new(id, &run.workflow, run.created_at);
        cp.mark_building(COPY_MARK.into(), COPIER, now);
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
            crate::record::state::merge_ref(&mut cp.state, &r.update);
            cp.completed.push(run.completed[r.index].clone());
            cp.next += 1;
            cp.writer = fastrand::u64(1..);
            let v = save_known(
                store,
                SaveRequest::new(&cp, last.map(|(v, _)| v)).with_step(r),
            )
            .await
            .map_err(|e| {
                fail(
                    store_error(id, &format!("import of step {}", r.index), e),
                    last,
                )
            })?;
            last = Some((v, cp.writer));
        }
    }
    if !record.events.is_empty() {
        // The log is written while the run is marked as being built, so
        // that it never stands complete without its events.
        if last.is_none() {
            let now = crate::engine::Runner::new(store).now();
            let mut cp = run.clone();
            cp.lease = None;
            cp.mark_building(COPY_MARK.into(), COPIER, now);
            cp.writer = fastrand::u64(1..);
            let v = save_known(store, SaveRequest::new(&cp, None))
                .await
                .map_err(|e| fail(store_error(id, "import of the record", e), last))?;
            last = Some((v, cp.writer));
        }
        append_log(store, id, &record.events)
            .await
            .map_err(|e| fail(e, last))?;
        // Still ours, and its log only what this import wrote: another
        // import of the run may have replaced the unfinished one meanwhile.
        let now = store.load(id).await.map_err(|e| {
            fail(
                store_error(id, "load before the import's last save", e),
                last,
            )
        })?;
        if now.as_ref().map(|c| (c.version, c.writer)) != last {
            let (expected, found) = (last.map(|(v, _)| v), now.map(|c| c.version));
            return Err(fail(conflict_in(id, "import", expected, found), last));
        }
        let n = record.events.len() as u64;
        let tail = store
            .capabilities()
            .events
            .map(|log| log.read_events(id, n - 1, 2));
        if let Some(tail) = tail {
            let tail = tail
                .await
                .map_err(|e| fail(store_error(id, "reading back the imported log", e), last))?;
            if tail.len() != 1 || tail[0].seq != n {
                let found = tail.last().map_or(n - 1, |e| e.seq);
                return Err(fail(log_not_ours(id, n, found), last));
            }
        }
    }
    let req = SaveRequest::new(run, last.map(|(v, _)| v)).writing_version(run.version);
    save_known(store, req)
        .await
        .map_err(|e| fail(store_error(id, "import of the record", e), last))?;
    Ok(())
}

/// Saves; after an error that leaves the outcome open, looks at the store
/// and recognises the save by its version and writer number.
async fn save_known<S: Store + ?Sized>(store: &S, req: SaveRequest<'_>) -> Result<u64, StoreError> {
    let (version, writer) = (req.new_version(), req.checkpoint.writer);
    match store.save(req).await {
        Err(e) if e.kind() == StoreErrorKind::OutcomeUnknown => {
            match store.load(&req.checkpoint.run_id).await {
                Ok(Some(s)) if s.version == version && s.writer == writer => Ok(version),
                _ => Err(e),
            }
        }
        done => done,
    }
}

/// [`put_run`] for each record, all at once (a store that groups
/// concurrent writes, SQLite, commits them together); the results in the
/// records' order.
pub async fn put_runs<S: Store + ?Sized>(
    store: &S,
    records: &[Exported],
) -> Vec<Result<Put, Error>> {
    put_runs_with(store, records, &PutOptions::default()).await
}

/// [`put_run_with`] for each record, all at once; the results in the
/// records' order.
pub async fn put_runs_with<S: Store + ?Sized>(
    store: &S,
    records: &[Exported],
    opts: &PutOptions,
) -> Vec<Result<Put, Error>> {
    futures_util::future::join_all(records.iter().map(|r| put_run_with(store, r, opts))).await
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
    progress: impl FnMut(&CopyReport),
) -> Result<CopyReport, Error> {
    copy_with(from, to, &PutOptions::default(), progress).await
}

/// [`copy`] with options: with [`PutOptions::force`], a run that a live
/// process holds in `to` is replaced by a newer one all the same.
pub async fn copy_with<A: Store + ?Sized, B: Store + ?Sized>(
    from: &A,
    to: &B,
    opts: &PutOptions,
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
                        Ok(Some(rec)) => return put_run_with(to, &rec, opts).await.map(Some),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A line whose record text is intact (its checksum matches the text)
    /// but whose version is past 2^64 says that the number is too large,
    /// where it is, not that the checksum fails; a float where a count
    /// belongs is refused without that claim.
    #[test]
    fn a_version_past_64_bits_is_too_large_not_a_bad_checksum() {
        let mut cp = Checkpoint::new("r", "wf", crate::Timestamp::EPOCH);
        cp.version = 7;
        let line = encode_line(&Exported::new(cp, None)).unwrap();
        let line: Value = serde_json::from_str(&line).unwrap();
        let record = serde_json::to_string(&line["record"]).unwrap();
        for (number, says) in [
            ("18446744073709551616", "too large"),
            ("1e300", "too large"),
            ("7.5", "floating point"),
            ("-1", "invalid value"),
            ("\"7\"", "invalid type"),
        ] {
            let text = record.replace("\"version\":7", &format!("\"version\":{number}"));
            assert_ne!(text, record);
            let crafted = format!(
                "{{\"format\":1,\"sha256\":\"{}\",\"record\":{text}}}",
                text_digest(text.as_bytes())
            );
            let err = decode_line(&crafted, 3).unwrap_err().to_string();
            assert!(err.contains("line 3"), "{err}");
            assert!(err.contains("run.version"), "{err}");
            assert!(err.contains(says), "{number}: {err}");
            assert!(!err.contains("checksum"), "{number}: {err}");
            if number != "18446744073709551616" && number != "1e300" {
                assert!(!err.contains("too large"), "{err}");
            }
        }
        // Changed after the checksum was taken: the checksum says so.
        let text = record.replace("\"version\":7", "\"version\":8");
        let crafted = format!(
            "{{\"format\":1,\"sha256\":\"{}\",\"record\":{text}}}",
            text_digest(record.as_bytes())
        );
        let err = decode_line(&crafted, 1).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    /// A run with `doc` in its state and in its one history row.
    fn run_with(id: &str, doc: &Value) -> Exported {
        let mut cp = Checkpoint::new(id, "wf", crate::Timestamp::EPOCH);
        cp.state.insert("doc".into(), doc.clone());
        cp.state
            .insert("odd".into(), serde_json::json!({"$blob": "literal"}));
        cp.completed = vec!["a".into()];
        cp.next = 1;
        cp.version = 1;
        let mut update = crate::State::new();
        update.insert("doc".into(), doc.clone());
        let row = StepRecord::new(
            0,
            "a",
            update,
            1,
            crate::Timestamp::EPOCH,
            crate::Timestamp::EPOCH,
        );
        Exported::new(cp, Some(vec![row]))
    }

    fn write_all(records: &[Exported]) -> Vec<String> {
        let mut writer = ExportWriter::new();
        let mut lines = Vec::new();
        for r in records {
            writer
                .write(r, &mut |l| {
                    lines.push(l.to_string());
                    Ok(())
                })
                .unwrap();
        }
        lines
    }

    fn read_all(lines: &[String]) -> Result<Vec<Exported>, Error> {
        let mut reader = ImportReader::new();
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if let Some(r) = reader.line(l, i + 1)? {
                out.push(r);
            }
        }
        reader.finish()?;
        Ok(out)
    }

    #[test]
    fn a_large_value_goes_out_once_and_comes_back_in_every_run() {
        let doc = Value::String("d".repeat(100 << 10));
        let small = run_with("s", &serde_json::json!(1));
        let records = vec![run_with("a", &doc), run_with("b", &doc), small.clone()];
        let lines = write_all(&records);
        // One blob line, two runs that refer to it, one plain run.
        assert_eq!(
            lines.len(),
            4,
            "{:?}",
            lines.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        assert!(lines[0].contains("\"blob\""));
        let total: usize = lines.iter().map(String::len).sum();
        assert!(
            total < 110 << 10,
            "the value went out more than once: {total} bytes"
        );
        // A run without large values is a line older builds read.
        assert_eq!(decode_line(&lines[3], 4).unwrap(), small);
        assert_eq!(read_all(&lines).unwrap(), records);
    }

    /// A decision's large data goes out once, with the state's value of
    /// the same content, and comes back as it was; small data that looks
    /// like a reference comes back as given; a line whose decision refers
    /// to a blob the export did not carry is refused.
    #[test]
    fn a_decisions_large_data_goes_out_once_and_comes_back() {
        use crate::record::checkpoint::Decision;
        let doc = Value::String("d".repeat(100 << 10));
        let fake = serde_json::json!({"$blob": format!("sha256:{}", "0".repeat(64)), "bytes": 3});
        let decided = |id: &str, state: &Value| {
            let mut r = run_with(id, state);
            r.run.decisions = vec![
                Decision::approve("g", "ada", crate::Timestamp::EPOCH, Some(doc.clone())),
                Decision::approve("h", "ada", crate::Timestamp::EPOCH, Some(fake.clone())),
            ];
            r
        };
        // The decision alone holds the document; then a run whose state
        // holds it too.
        let records = vec![decided("a", &serde_json::json!(1)), decided("b", &doc)];
        let lines = write_all(&records);
        assert_eq!(lines.len(), 3, "one blob line and the runs'");
        let total: usize = lines.iter().map(String::len).sum();
        assert!(
            total < 110 << 10,
            "the value went out more than once: {total} bytes"
        );
        assert!(
            lines[1].contains("\"format\":2,"),
            "the record says its decisions hold references"
        );
        assert_eq!(read_all(&lines).unwrap(), records);
        let err = read_all(&lines[1..2]).unwrap_err().to_string();
        assert!(err.contains("decisions"), "{err}");
        // Data under the threshold stays in a line of version 1.
        let mut small = run_with("s", &serde_json::json!(1));
        small.run.decisions = vec![Decision::approve(
            "g",
            "ada",
            crate::Timestamp::EPOCH,
            Some(serde_json::json!(1)),
        )];
        let lines = write_all(std::slice::from_ref(&small));
        assert_eq!(decode_line(&lines[0], 1).unwrap(), small);
    }

    /// The reader keeps the blobs it has read in its temporary file, not
    /// in memory, each once, and reads them back into every run that refers
    /// to them; a blob the file could not take fails the runs that refer to
    /// it with that reason, not as a blob the export left out.
    #[test]
    fn blobs_wait_for_their_runs_in_a_temporary_file() {
        let one = Value::String("d".repeat(100 << 10));
        let two = Value::String("e".repeat(200 << 10));
        let records = vec![
            run_with("a", &one),
            run_with("b", &two),
            run_with("c", &one),
        ];
        let lines = write_all(&records);
        let mut reader = ImportReader::new();
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            out.extend(reader.line(l, i + 1).unwrap());
        }
        // Each document's JSON text once: its quotes and characters.
        assert_eq!(reader.blobs.bytes(), (100 << 10) + 2 + (200 << 10) + 2);
        assert_eq!(reader.blobs.at.len(), 2);
        assert!(reader.blobs.file.is_some());
        reader.finish().unwrap();
        assert_eq!(out, records);

        // Nothing read: no file made.
        let plain = write_all(&[run_with("s", &serde_json::json!(1))]);
        assert!(read_all(&plain).is_ok());
        let mut reader = ImportReader::new();
        reader.line(&plain[0], 1).unwrap();
        assert!(reader.blobs.file.is_none());

        // A blob the file could not take.
        let lines = write_all(&[run_with("a", &one)]);
        let mut reader = ImportReader::new();
        let hash =
            crate::store::blob::BlobHash::of(serde_json::to_string(&one).unwrap().as_bytes());
        reader.blobs.lost.insert(hash, "the disk is full".into());
        let err = reader.line(&lines[1], 2).unwrap_err().to_string();
        assert!(err.contains("run \"a\""), "{err}");
        let source = std::error::Error::source(&reader.line(&lines[1], 2).unwrap_err())
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(source.contains("the disk is full"), "{source}");

        // A file that takes no writes: the blob is lost, and read back as
        // the reason; carried again into a file that takes it, it is kept.
        let text = serde_json::to_string(&one).unwrap();
        let mut kept = Spilled {
            file: Some(std::fs::File::open("/dev/null").unwrap()),
            ..Spilled::default()
        };
        kept.put(hash, text.as_bytes(), 3, 4);
        let err = kept.get(&hash).unwrap_err().to_string();
        assert!(
            err.contains("lines 3 to 4") && err.contains("could not be kept"),
            "{err}"
        );
        kept.file = Some(tempfile::tempfile().unwrap());
        kept.put(hash, text.as_bytes(), 7, 7);
        assert_eq!(kept.get(&hash).unwrap().as_deref(), Some(text.as_bytes()));
    }

    #[test]
    fn a_blob_over_one_line_is_split_and_checked() {
        // Quotes are escaped on their way out: the parts stay within a line.
        let doc = Value::String("\"".repeat(5 << 20));
        let records = vec![run_with("a", &doc)];
        let lines = write_all(&records);
        assert_eq!(lines.len(), 3, "two parts and the run");
        assert!(lines.iter().all(|l| l.len() <= MAX_LINE_BYTES));
        assert_eq!(read_all(&lines).unwrap(), records);
        // Parts out of order, a part missing, the export cut short.
        let swapped = vec![lines[1].clone(), lines[0].clone(), lines[2].clone()];
        let err = read_all(&swapped).unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("without the parts before it"),
            "{err}"
        );
        let err = read_all(&[lines[0].clone(), lines[2].clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ends before its last part"), "{err}");
        let err = read_all(&lines[..1]).unwrap_err().to_string();
        assert!(err.contains("ends inside blob"), "{err}");
    }

    #[test]
    fn a_dangling_or_damaged_blob_is_refused_with_its_line() {
        let doc = Value::String("d".repeat(100 << 10));
        let lines = write_all(&[run_with("a", &doc)]);
        // The blob left out: the run that refers to it is refused.
        let err = read_all(&lines[1..]).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("run \"a\""), "{err}");
        assert!(err.contains("does not carry it"), "{err}");
        // One character changed in the blob's text.
        let damaged = vec![lines[0].replacen("ddd", "dxd", 1), lines[1].clone()];
        let err = read_all(&damaged).unwrap_err().to_string();
        assert!(err.contains("does not match its hash"), "{err}");
        // A format 2 line is not taken by the reader of format 1 alone.
        assert!(decode_line(&lines[1], 2).is_err());
        // Crafted blob lines: a size past 1 GiB, a name that is not a hash,
        // an offset far past the start, a field too many.
        let hash = format!("sha256:{}", "a".repeat(64));
        for (line, says) in [
            (
                format!(
                    r#"{{"format":2,"blob":"{hash}","bytes":1099511627776,"at":0,"text":"x"}}"#
                ),
                "over the largest value",
            ),
            (
                r#"{"format":2,"blob":"sha256:xyz","bytes":1,"at":0,"text":"x"}"#.to_string(),
                "not a blob's name",
            ),
            (
                format!(
                    r#"{{"format":2,"blob":"{hash}","bytes":9,"at":18446744073709551615,"text":"x"}}"#
                ),
                "without the parts before it",
            ),
            (
                format!(r#"{{"format":2,"blob":"{hash}","bytes":1,"at":0,"text":"x","more":1}}"#),
                "not a blob line",
            ),
        ] {
            let err = read_all(&[line]).unwrap_err().to_string();
            assert!(
                err.contains("line 1") && err.contains(says),
                "{says}: {err}"
            );
        }
    }

    /// `n` events of run `id`'s step `a`, numbered from 1.
    fn events(n: usize) -> Vec<RunEvent> {
        (0..n)
            .map(|i| {
                let mut e = NewEvent::new(
                    "a",
                    1 + (i / 1000) as u32,
                    crate::Timestamp::from_unix_millis(1_700_000_000_000 + i as u64),
                    serde_json::json!({"i": i, "big": u64::MAX}),
                );
                e.first = i % 1000 == 0;
                e.numbered(i as u64 + 1)
            })
            .collect()
    }

    /// A run with events goes out as event lines and a line of format 3,
    /// and comes back equal, beside runs without events and large values.
    #[test]
    fn a_runs_events_go_out_in_lines_of_their_own_and_come_back_whole() {
        let doc = Value::String("d".repeat(100 << 10));
        let with = run_with("e", &doc).with_events(events(2500));
        let without = run_with("plain", &serde_json::json!(1));
        let lines = write_all(&[with.clone(), without.clone()]);
        let formats: Vec<u64> = lines
            .iter()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["format"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        // The blob, three event lines, the run; then the plain run.
        assert_eq!(formats, [2, 3, 3, 3, 3, 1], "{formats:?}");
        assert_eq!(read_all(&lines).unwrap(), [with.clone(), without]);
        // An older reader (format 1 only) refuses the run line, and says
        // why, rather than import the run without its events.
        let err = decode_line(&lines[4], 5).unwrap_err().to_string();
        assert!(err.contains("format 3 is not understood"), "{err}");
        // One line cannot carry the events.
        let err = encode_line(&with).unwrap_err().to_string();
        assert!(err.contains("ExportWriter"), "{err}");
    }

    /// Event lines lost, repeated, reordered, changed, of another run or
    /// without their run are each refused with the line and what is wrong.
    #[test]
    fn damaged_event_lines_are_refused() {
        let with = run_with("e", &serde_json::json!(1)).with_events(events(2500));
        let other = run_with("f", &serde_json::json!(1)).with_events(events(3));
        let lines = write_all(&[with, other]);
        assert_eq!(lines.len(), 6);
        let drop = |i: usize| -> Vec<String> {
            let mut l = lines.clone();
            l.remove(i);
            l
        };
        let swap = |i: usize, j: usize| -> Vec<String> {
            let mut l = lines.clone();
            l.swap(i, j);
            l
        };
        let mut repeated = lines.clone();
        repeated.insert(1, lines[0].clone());
        let mut changed = lines.clone();
        changed[1] = changed[1].replace("\"i\":1000", "\"i\":1001");
        assert_ne!(changed[1], lines[1]);
        let mut foreign = lines.clone();
        foreign[1] = lines[4].clone();
        let mut seq_changed = lines.clone();
        seq_changed[5] = lines[5].replace("\"last\":3", "\"last\":2");
        assert_ne!(seq_changed[5], lines[5]);
        for (case, lines, says) in [
            ("second line lost", drop(1), "where event 1001 was due"),
            ("last event line lost", drop(2), "carries 2000 of them"),
            ("a line twice", repeated, "where event 1001 was due"),
            ("out of order", swap(0, 1), "where event 1 was due"),
            ("changed", changed, "checksum"),
            ("another run's events", foreign, "not by their run's line"),
            ("the run's count changed", seq_changed, "checksum"),
            ("the run's line lost", drop(3), "not by their run's line"),
            ("another run's line", swap(3, 5), "not of their own run"),
            ("the events lost", drop(4), "does not carry them"),
            ("the last run's line lost", drop(5), "no line of the run"),
        ] {
            let err = read_all(&lines).unwrap_err().to_string();
            assert!(err.contains(says), "{case}: {err}");
            assert!(err.contains("line"), "{case}: {err}");
        }
        // A run line of format 3 whose count is missing.
        let mut v: Value = serde_json::from_str(&lines[5]).unwrap();
        v["record"].as_object_mut().unwrap().remove("events");
        v["sha256"] = digest(&v["record"]).into();
        let mut l = lines.clone();
        l[5] = v.to_string();
        let err = read_all(&l).unwrap_err().to_string();
        assert!(err.contains("number of its last event"), "{err}");
        // Made to look older (format 2, outside the checksum) without its
        // event line: refused, not read as a run without events.
        let l = vec![lines[5].replace("\"format\":3", "\"format\":2")];
        let err = read_all(&l).unwrap_err().to_string();
        assert!(err.contains("cannot carry events"), "{err}");
    }

    /// An event line is bound to its run and to the run line it was
    /// exported with: relabelled for another run, or spliced from another
    /// export of the same run with as many events, it is refused.
    #[test]
    fn event_lines_cannot_move_to_another_run_or_export() {
        let a = run_with("e", &serde_json::json!(1)).with_events(events(3));
        let mut other_log = events(3);
        other_log[1].value = serde_json::json!("another log");
        let b = run_with("e", &serde_json::json!(1)).with_events(other_log);
        let f = run_with("f", &serde_json::json!(1)).with_events(events(3));
        let (la, lb, lf) = (write_all(&[a]), write_all(&[b]), write_all(&[f]));
        assert_eq!((la.len(), lb.len(), lf.len()), (2, 2, 2));
        // f's events relabelled as e's, before e's line.
        let relabelled = lf[0].replace("\"events\":\"f\"", "\"events\":\"e\"");
        assert_ne!(relabelled, lf[0]);
        let err = read_all(&[relabelled, la[1].clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match them and their run"), "{err}");
        // Another export's events of the same run and count.
        let err = read_all(&[lb[0].clone(), la[1].clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the ones exported with it"), "{err}");
        // Each export alone reads back.
        assert_eq!(read_all(&lb).unwrap()[0].events[1].value, "another log");
    }

    /// What an import would refuse is refused before anything is written:
    /// a log not numbered from 1, an event no store takes.
    #[test]
    fn bad_logs_are_refused_before_writing() {
        let mut gap = run_with("e", &serde_json::json!(1)).with_events(events(3));
        gap.events.remove(1);
        let err = check_writable(&gap, None, None).unwrap_err().to_string();
        assert!(err.contains("event 3 where 2 was due"), "{err}");
        let mut bad = run_with("e", &serde_json::json!(1)).with_events(events(3));
        bad.events[2].attempt = 0;
        let err = check_writable(&bad, None, None).unwrap_err().to_string();
        assert!(err.contains("attempt 0"), "{err}");
        // And the writer will not write such a log either.
        let mut writer = ExportWriter::new();
        let err = writer.write(&gap, &mut |_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("numbered from 1"), "{err}");
    }

    /// Hostile event lines, each with a good checksum so that the check
    /// behind it is reached: no events, a bad or empty run id, a number 0
    /// or past 64 bits, attempt 0, an empty step name, a value nested past
    /// the limit or over the size limit, a time that is no time, a field
    /// of the wrong type, too many events: each a clear error naming the
    /// line, never a panic.
    #[test]
    fn hostile_event_lines_are_clear_errors() {
        let line = |run: &str, items: &str| {
            format!(
                r#"{{"format":3,"events":{},"sha256":"{}","items":{items}}}"#,
                serde_json::json!(run),
                event_digest(run, items)
            )
        };
        let ev = |fields: &str| {
            format!(
                r#"[{{"step":"a","attempt":1,"at":"2026-01-01T00:00:00Z","value":1,{fields}}}]"#
            )
        };
        let deep = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        let many = format!(
            "[{}]",
            (1..=1001)
                .map(|i| format!(
                    r#"{{"seq":{i},"step":"a","attempt":1,"at":"2026-01-01T00:00:00Z","value":1}}"#
                ))
                .collect::<Vec<_>>()
                .join(",")
        );
        let cases: Vec<(String, &str)> = vec![
            (line("e", "[]"), "1 to 1000 events"),
            (line("", &ev(r#""seq":1"#)), "line 4"),
            (line("../x", &ev(r#""seq":1"#)), "line 4"),
            (line("e", &ev(r#""seq":0"#)), "where event 1 was due"),
            (line("e", &ev(r#""seq":18446744073709551616"#)), "line 4"),
            (line("e", &ev(r#""seq":-1"#)), "line 4"),
            (line("e", &ev(r#""seq":1,"first":"yes""#)), "line 4"),
            (
                line(
                    "e",
                    &ev(r#""seq":1"#).replace(r#""attempt":1"#, r#""attempt":0"#),
                ),
                "attempt 0",
            ),
            (
                line(
                    "e",
                    &ev(r#""seq":1"#).replace(r#""step":"a""#, r#""step":"""#),
                ),
                "step name",
            ),
            (
                line(
                    "e",
                    &ev(r#""seq":1"#).replace(r#""value":1"#, &format!(r#""value":{deep}"#)),
                ),
                "line 4",
            ),
            (
                line(
                    "e",
                    &ev(r#""seq":1"#).replace(
                        r#""value":1"#,
                        &format!(r#""value":"{}""#, "x".repeat(200_000)),
                    ),
                ),
                "event value",
            ),
            (
                line(
                    "e",
                    &ev(r#""seq":1"#).replace("2026-01-01T00:00:00Z", "tomorrow"),
                ),
                "line 4",
            ),
            (line("e", &many), "1 to 1000 events"),
        ];
        let good = write_all(&[run_with("g", &serde_json::json!(1))]);
        for (bad, says) in cases {
            // Three good lines first, so that the error names line 4.
            let lines = [good[0].clone(), good[0].clone(), good[0].clone(), bad];
            let err = read_all(&lines).unwrap_err().to_string();
            assert!(err.contains("line 4"), "{says}: {err}");
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    /// A memory store whose event log gets one stray event beside the
    /// next append once armed, as if something else appended meanwhile.
    struct Meddler {
        inner: crate::MemoryStore,
        armed: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl Store for Meddler {
        async fn load(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
            self.inner.load(id).await
        }
        async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
            self.inner.save(req).await
        }
        async fn list(&self, f: &ListFilter) -> Result<Vec<crate::RunSummary>, StoreError> {
            self.inner.list(f).await
        }
        async fn delete(&self, id: &str) -> Result<bool, StoreError> {
            self.inner.delete(id).await
        }
        async fn delete_if(&self, id: &str, v: u64) -> Result<bool, StoreError> {
            self.inner.delete_if(id, v).await
        }
        fn capabilities(&self) -> crate::store::Capabilities<'_> {
            let mut c = self.inner.capabilities();
            c.events = Some(self);
            c
        }
    }

    #[async_trait::async_trait]
    impl crate::store::Events for Meddler {
        async fn append_events(&self, id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
            let log = self.inner.capabilities().events.expect("a log");
            if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                log.append_events(id, &events[..1]).await?;
            }
            log.append_events(id, events).await
        }
        async fn read_events(
            &self,
            id: &str,
            after: u64,
            limit: usize,
        ) -> Result<Vec<RunEvent>, StoreError> {
            let log = self.inner.capabilities().events.expect("a log");
            log.read_events(id, after, limit).await
        }
    }

    /// A replacement whose log meets events it did not write fails, and
    /// puts the run it replaced back with its own log, no stray event; a
    /// clean replacement takes the newer log whole.
    #[test]
    fn a_replacement_that_meets_a_stray_event_puts_the_old_run_back_with_its_log() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let store = Meddler {
                    inner: crate::MemoryStore::new(),
                    armed: false.into(),
                };
                async fn log(s: &Meddler) -> Vec<RunEvent> {
                    let log = s.inner.capabilities().events.unwrap();
                    log.read_events("r", 0, 100).await.unwrap()
                }
                let old = run_with("r", &serde_json::json!(1)).with_events(events(3));
                let mut new = run_with("r", &serde_json::json!(2)).with_events(events(5));
                new.run.version = 5;
                assert_eq!(put_run(&store, &old).await.unwrap(), Put::Written);
                assert_eq!(log(&store).await, old.events);
                store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
                let err = put_run(&store, &new).await.unwrap_err();
                let err = crate::record::error::chain(&err);
                assert!(err.contains("something else appended"), "{err}");
                assert!(err.contains("was put back"), "{err}");
                let back = store.load("r").await.unwrap().unwrap();
                assert_eq!(back.version, old.run.version);
                assert_eq!(back.state, old.run.state);
                assert_eq!(log(&store).await, old.events);
                assert!(matches!(
                    put_run(&store, &new).await.unwrap(),
                    Put::Replaced { was: 1 }
                ));
                assert_eq!(log(&store).await, new.events);
            });
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever is done to an export's lines (a line lost, repeated,
        /// moved, cut short or with a byte changed), what an import reads is
        /// either refused or a run exactly as exported: never a run with
        /// part of its log, or another run's.
        #[test]
        fn a_damaged_export_never_reads_as_a_different_run(
            what in 0u8..6,
            at in 0usize..64,
            to in 0usize..64,
            cut in 0usize..4096,
        ) {
            let runs = [
                run_with("e", &serde_json::json!(1)).with_events(events(2100)),
                run_with("f", &serde_json::json!(2)).with_events(
                    events(5)
                        .into_iter()
                        .map(|mut e| {
                            e.value = serde_json::json!({"of": "f", "seq": e.seq});
                            e
                        })
                        .collect(),
                ),
                run_with("g", &Value::String("d".repeat(100 << 10))),
            ];
            let mut lines = write_all(&runs);
            let n = lines.len();
            let (i, j) = (at % n, to % n);
            match what {
                0 => { lines.remove(i); }
                1 => { let l = lines[i].clone(); lines.insert(j, l); }
                2 => { let l = lines.remove(i); lines.insert(j.min(n - 1), l); }
                3 => { let l = &mut lines[i]; let c = cut % l.len(); l.truncate(c); }
                4 => {
                    // Relabelled for the other run that has events.
                    let l = &mut lines[i];
                    *l = if l.contains("\"events\":\"e\"") {
                        l.replace("\"events\":\"e\"", "\"events\":\"f\"")
                    } else {
                        l.replace("\"events\":\"f\"", "\"events\":\"e\"")
                    };
                }
                _ => {
                    let mut bytes = std::mem::take(&mut lines[i]).into_bytes();
                    let c = cut % bytes.len();
                    bytes[c] = if bytes[c] == b'7' { b'8' } else { b'7' };
                    lines[i] = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
            let mut reader = ImportReader::new();
            for (k, line) in lines.iter().enumerate() {
                match reader.line(line, k + 1) {
                    Ok(Some(got)) => {
                        let want = runs.iter().find(|r| r.run.run_id == got.run.run_id);
                        proptest::prop_assert_eq!(Some(&got), want);
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
        }
    }
}
