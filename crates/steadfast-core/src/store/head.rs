//! What the SQL stores share: the head document (everything of a checkpoint
//! but its state, its steps and the columns a store filters on, as one JSON
//! text), JSON encoding with the store's error, and the per-run bookkeeping
//! a store remembers between a load and the saves that follow it.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::record::checkpoint::{
    AuditEntry, Checkpoint, Decision, Lease, Origin, PassedOver, RunStatus, StepFailure, Wait,
};
use crate::record::error::StoreError;
use crate::record::queue::Queue;
use crate::record::spend::Spend;
use crate::store::blob::STORED_DECISIONS_FORMAT;

/// The head document, as written.
#[derive(serde::Serialize)]
struct HeadOut<'a> {
    format: u32,
    attempts: u32,
    /// Sixteen hex digits: a head whose length does not change from save to
    /// save lets a store overwrite the row in place, rewriting only the
    /// pages that changed, instead of the whole row with its state snapshot.
    #[serde(serialize_with = "fixed_hex")]
    writer: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a StepFailure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<&'a Lease>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<&'a Wait>,
    #[serde(skip_serializing_if = "<[Decision]>::is_empty")]
    decisions: &'a [Decision],
    #[serde(skip_serializing_if = "Option::is_none")]
    seal: Option<&'a str>,
    #[serde(skip_serializing_if = "<[AuditEntry]>::is_empty")]
    audit: &'a [AuditEntry],
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<&'a Origin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend: Option<&'a Spend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    passed_over: Option<&'a PassedOver>,
    /// Last, always: PostgreSQL's claim reads a run's place from the end of
    /// the head's text (`head_ends_with_its_place_in_the_queue`).
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<&'a Queue>,
}

/// The head document, as read back (absent fields take their defaults).
#[derive(serde::Deserialize)]
struct HeadIn {
    format: u32,
    #[serde(default)]
    attempts: u32,
    #[serde(default, deserialize_with = "writer_bits")]
    writer: u64,
    #[serde(default)]
    error: Option<StepFailure>,
    #[serde(default)]
    lease: Option<Lease>,
    #[serde(default)]
    wait: Option<Wait>,
    #[serde(default)]
    decisions: Vec<Decision>,
    #[serde(default)]
    seal: Option<String>,
    #[serde(default)]
    audit: Vec<AuditEntry>,
    #[serde(default)]
    origin: Option<Origin>,
    #[serde(default)]
    spend: Option<Spend>,
    #[serde(default)]
    passed_over: Option<Box<PassedOver>>,
    #[serde(default)]
    queue: Option<Queue>,
}

fn fixed_hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:016x}"))
}

/// A writer number: written as sixteen hex digits, but also read as an
/// integer (the SQLite store's schema 2 kept the i64 with the same bits).
fn writer_bits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Bits {
        Hex(String),
        Unsigned(u64),
        Signed(i64),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        Bits::Hex(h) => u64::from_str_radix(&h, 16).map_err(serde::de::Error::custom)?,
        Bits::Unsigned(u) => u,
        Bits::Signed(i) => i as u64,
    })
}

/// The head document of `cp`: its format, attempts, writer, last error,
/// lease, wait and decisions, as one JSON text whose length does not change
/// when only numbers do.
///
/// ```
/// use steadfast_core::store::{decode_head, encode_head};
/// use steadfast_core::{Checkpoint, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// cp.attempts = 2;
/// cp.writer = u64::MAX;
/// let text = encode_head(&cp)?;
/// let mut back = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// decode_head(&text, &mut back).unwrap();
/// assert_eq!((back.attempts, back.writer), (2, u64::MAX));
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn encode_head(cp: &Checkpoint) -> Result<String, StoreError> {
    encode_head_as(cp, cp.format, &cp.decisions)
}

/// [`encode_head`] for a store with blobs: a decision's data whose text is
/// longer than `threshold` is written as a reference, its blob pushed to
/// `blobs` for the store to write with the head
/// ([`encode_decisions`](crate::store::blob::encode_decisions)). Only a
/// head that holds such data (or data that looks like a reference) is
/// written in [`STORED_DECISIONS_FORMAT`]; any other is [`encode_head`]'s.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::store::blob::{head_refs_in, STORED_DECISIONS_FORMAT};
/// use steadfast_core::store::head::{decode_head, encode_head_with_blobs};
/// use steadfast_core::store::rows::Place;
/// use steadfast_core::{Checkpoint, Decision, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// let doc = json!({"draft": "x".repeat(5000)});
/// cp.decisions.push(Decision::approve("review", "ada", Timestamp::EPOCH, Some(doc)));
/// let mut blobs = Vec::new();
/// let text = encode_head_with_blobs(&cp, 1024, &mut blobs)?;
/// assert_eq!(blobs.len(), 1);
/// let locate = |c: &str| c.to_string();
/// assert_eq!(head_refs_in(&text, &Place::new("r", &locate), "head")?, vec![blobs[0].hash]);
/// let mut back = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// decode_head(&text, &mut back).unwrap();
/// assert_eq!(back.format, STORED_DECISIONS_FORMAT, "a load resolves it before anyone sees it");
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn encode_head_with_blobs(
    cp: &Checkpoint,
    threshold: u64,
    blobs: &mut Vec<crate::store::blob::Blob>,
) -> Result<String, StoreError> {
    match crate::store::blob::encode_decisions(&cp.decisions, threshold, &cp.run_id, blobs)? {
        None => encode_head(cp),
        Some(stored) => encode_head_as(cp, STORED_DECISIONS_FORMAT, &stored),
    }
}

fn encode_head_as(
    cp: &Checkpoint,
    format: u32,
    decisions: &[Decision],
) -> Result<String, StoreError> {
    encode_json(
        &HeadOut {
            format,
            attempts: cp.attempts,
            writer: cp.writer,
            error: cp.error.as_ref(),
            lease: cp.lease.as_ref(),
            wait: cp.wait.as_ref(),
            decisions,
            seal: cp.seal.as_deref(),
            audit: &cp.audit,
            origin: cp.origin.as_ref(),
            spend: cp.spend.as_ref(),
            passed_over: cp.passed_over.as_deref(),
            queue: cp.queue.as_ref(),
        },
        &cp.run_id,
        "head",
    )
}

/// Splits a head document as [`encode_head`] writes it around its writer
/// number: the text before the sixteen hex digits, the digits, and the text
/// after them. Two heads that differ in nothing but their writer split into
/// equal outer parts, which is how a store sees that a save leaves a head as
/// it was. `None` for a text not in that shape.
///
/// ```
/// use steadfast_core::store::head::{around_writer, encode_head};
/// use steadfast_core::{Checkpoint, Timestamp};
///
/// let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
/// cp.writer = 7;
/// let a = encode_head(&cp)?;
/// cp.writer = 8;
/// let b = encode_head(&cp)?;
/// let (x, y) = (around_writer(&a).unwrap(), around_writer(&b).unwrap());
/// assert_eq!((x.0, x.2), (y.0, y.2));
/// assert_eq!(x.1, "0000000000000007");
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn around_writer(doc: &str) -> Option<(&str, &str, &str)> {
    // `format` and `attempts` (numbers) come first: the first such key is the
    // head's own, and a key inside a string value would be escaped.
    const KEY: &str = "\"writer\":\"";
    // A plain scan: the key lies a few bytes in, where setting up a
    // substring searcher (`str::find`) would cost more than the search.
    let at = doc
        .as_bytes()
        .windows(KEY.len())
        .position(|w| w == KEY.as_bytes())?
        + KEY.len();
    let digits = doc.get(at..at + 16)?;
    let rest = doc.get(at + 16..)?;
    (digits.bytes().all(|b| b.is_ascii_hexdigit()) && rest.starts_with('"'))
        .then(|| (&doc[..at], digits, rest))
}

/// Reads a head document written by [`encode_head`] into `cp`; the error
/// says what is wrong and where (line and column), for a
/// [`StoreError::Corrupt`].
pub fn decode_head(text: &str, cp: &mut Checkpoint) -> Result<(), String> {
    let head: HeadIn = serde_json::from_str(text)
        .map_err(|e| format!("{e} (line {}, column {})", e.line(), e.column()))?;
    cp.format = head.format;
    cp.attempts = head.attempts;
    cp.writer = head.writer;
    cp.error = head.error;
    cp.lease = head.lease;
    cp.wait = head.wait;
    cp.decisions = head.decisions;
    cp.seal = head.seal;
    cp.audit = head.audit;
    cp.origin = head.origin;
    cp.spend = head.spend;
    cp.queue = head.queue;
    cp.passed_over = head.passed_over;
    Ok(())
}

/// What a run's summary takes from its head document: the spend record,
/// the place in the queue and the origin (for the version the run was
/// started with), read alone.
pub(crate) struct HeadSummary {
    pub(crate) spend: Option<Spend>,
    pub(crate) queue: Option<Queue>,
    pub(crate) origin: Option<Origin>,
}

/// The [`HeadSummary`] of a head document, checked.
pub(crate) fn summary_of(text: &str) -> Result<HeadSummary, String> {
    #[derive(serde::Deserialize)]
    struct SummaryOnly {
        #[serde(default)]
        spend: Option<Spend>,
        #[serde(default)]
        queue: Option<Queue>,
        #[serde(default)]
        origin: Option<Origin>,
    }
    let head: SummaryOnly = serde_json::from_str(text)
        .map_err(|e| format!("{e} (line {}, column {})", e.line(), e.column()))?;
    if let Some(s) = &head.spend {
        s.check().map_err(|r| format!("its spend record: {r}"))?;
    }
    if let Some(q) = &head.queue {
        q.check()
            .map_err(|r| format!("its place in the queue: {r}"))?;
    }
    if let Some(v) = head.origin.as_ref().and_then(|o| o.version.as_deref()) {
        crate::record::version::check_version("the version it was started with", v)?;
    }
    Ok(HeadSummary {
        spend: head.spend,
        queue: head.queue,
        origin: head.origin,
    })
}

/// Encodes `v` as JSON text, or says which run's `what` could not be
/// encoded (nothing is written then).
pub fn encode_json<T: serde::Serialize>(
    v: &T,
    run_id: &str,
    what: &str,
) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| {
        StoreError::InvalidInput(format!(
            "run {run_id:?}: cannot encode its {what}: {e}; nothing was written"
        ))
    })
}

/// What a store remembers per run between a load and the saves that follow
/// it (the SQL stores: their snapshot and delta bookkeeping), for at most a
/// fixed number of runs; when full, it starts over (a forgotten run only
/// costs its next save a full snapshot).
#[derive(Debug)]
pub struct RunCache<T> {
    runs: Mutex<HashMap<String, T>>,
    capacity: usize,
}

impl<T: Clone> RunCache<T> {
    /// A cache of at most `capacity` runs.
    pub fn new(capacity: usize) -> Self {
        RunCache {
            runs: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// Remembers `value` for `run_id`, or forgets the run (`None`).
    pub fn set(&self, run_id: &str, value: Option<T>) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        match value {
            Some(v) => {
                if runs.len() >= self.capacity && !runs.contains_key(run_id) {
                    runs.clear();
                }
                runs.insert(run_id.to_string(), v);
            }
            None => {
                runs.remove(run_id);
            }
        }
    }

    /// After a save of `cp` that gave `saved`: remembers what a later save
    /// of the run needs, unless the save failed or completed the run (a
    /// completed run is not saved again, so it takes no room).
    pub fn after_save<E>(&self, cp: &Checkpoint, saved: &Result<T, E>) {
        let keep = saved
            .as_ref()
            .ok()
            .filter(|_| cp.status != RunStatus::Completed);
        self.set(&cp.run_id, keep.cloned());
    }

    /// What is remembered for `run_id`.
    pub fn get(&self, run_id: &str) -> Option<T> {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .cloned()
    }
}

/// A number a store writes (a version, a time, an index) as the signed
/// 64-bit integer SQL keeps: refused, never wrapped, past `i64::MAX`.
pub fn to_i64(run_id: &str, what: &str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| {
        StoreError::InvalidInput(format!(
            "run {run_id:?}: {what} {v} is over the largest a store keeps ({}); nothing was written",
            i64::MAX
        ))
    })
}

#[cfg(test)]
mod tests {
    /// PostgreSQL's claim finds a run's priority and partition at the end
    /// of its head's text, whatever else the head holds (a decision whose
    /// data has a "queue" of its own, a spend record).
    #[test]
    fn head_ends_with_its_place_in_the_queue() {
        use crate::record::queue::Queue;
        let mut cp = Checkpoint::new("r", "wf", crate::record::clock::Timestamp::EPOCH);
        cp.decisions
            .push(crate::record::checkpoint::Decision::approve(
                "g",
                "ada",
                crate::record::clock::Timestamp::EPOCH,
                Some(serde_json::json!({"queue": {"priority": 999}})),
            ));
        cp.spend = Some(crate::record::spend::Spend::default());
        cp.queue = Some(Queue::new(-12, Some("tenant:7/eu")).unwrap());
        let text = encode_head(&cp).unwrap();
        assert!(
            text.ends_with(r#","queue":{"priority":-12,"partition":"tenant:7/eu"}}"#),
            "{text}"
        );
        cp.queue = Some(Queue::new(5, None).unwrap());
        assert!(encode_head(&cp)
            .unwrap()
            .ends_with(r#","queue":{"priority":5}}"#));
        cp.queue = Some(Queue::new(0, Some("a")).unwrap());
        assert!(encode_head(&cp)
            .unwrap()
            .ends_with(r#","queue":{"partition":"a"}}"#));
    }

    use super::*;
    use crate::record::clock::Timestamp;

    /// A save that changes only numbers keeps the head's length, so that a
    /// store can overwrite the row in place (rewriting the whole row, state
    /// snapshot included, made W5's later steps 2-3x slower on SQLite).
    #[test]
    fn the_head_keeps_its_length_whatever_the_writer_number() {
        let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
        cp.writer = 1;
        let short = encode_head(&cp).expect("encodes");
        cp.writer = u64::MAX;
        let long = encode_head(&cp).expect("encodes");
        assert_eq!(short.len(), long.len(), "{short} / {long}");
        let mut back = Checkpoint::new("r", "wf", Timestamp::EPOCH);
        decode_head(&long, &mut back).expect("decodes");
        assert_eq!(back.writer, u64::MAX);
        decode_head(r#"{"format": 1, "writer": -5}"#, &mut back).expect("an integer writer");
        assert_eq!(back.writer, (-5i64) as u64);
        let err = decode_head(r#"{"format": 1, "attempts": "x"}"#, &mut back).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn the_run_cache_forgets_when_full() {
        let cache = RunCache::new(2);
        cache.set("a", Some(1));
        cache.set("b", Some(2));
        assert_eq!(cache.get("a"), Some(1));
        cache.set("c", Some(3));
        assert_eq!((cache.get("a"), cache.get("c")), (None, Some(3)));
        cache.set("c", None);
        assert_eq!(cache.get("c"), None);
    }
}
