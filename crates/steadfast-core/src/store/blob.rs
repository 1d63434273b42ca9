//! Large values by reference: the rules every store with blobs shares.
//!
//! A top-level value of a state or of a step's update whose JSON text is
//! longer than a store's threshold is written once, as a *blob* named by the
//! SHA-256 of that text, and the record holds a small reference in its place:
//!
//! ```json
//! {"$blob": "sha256:<64 hex digits>", "bytes": 1048576}
//! ```
//!
//! A store writes a blob in the same transaction as (or, where there are no
//! transactions, durably before) the first record that refers to it, and the
//! same content is stored once however many steps and runs refer to it. On
//! the way out the store puts the value back ([`resolve_object`]): callers
//! never see a reference.
//!
//! A value of the caller's that looks like a reference (a top-level object
//! with a `$blob` member) is stored *escaped*, as
//! `{"$blob": "literal", "value": …}`, and given back as it was; so every
//! top-level object with a `$blob` member in a stored record is one of these
//! two shapes, and anything else there is [`StoreError::Corrupt`].
//!
//! ```
//! use serde_json::{json, Map, Value};
//! use steadfast_core::store::blob::{encode_object, resolve_object, Blob, BlobHash};
//! use steadfast_core::store::rows::Place;
//!
//! let big = "x".repeat(100);
//! let state: Map<String, Value> = json!({"doc": big, "n": 1}).as_object().unwrap().clone();
//! let mut blobs = Vec::new();
//! let text = encode_object(&state, 64, "r1", "state", &mut blobs)?;
//! assert_eq!(blobs.len(), 1);
//! assert!(text.contains("\"$blob\":\"sha256:"));
//!
//! // Reading it back: the store looks each reference up by its hash.
//! let mut stored: Map<String, Value> = serde_json::from_str(&text).unwrap();
//! let locate = |c: &str| format!("runs[\"r1\"].{c}");
//! let place = Place::new("r1", &locate);
//! resolve_object(&mut stored, &place, "snapshot", &mut |h: &BlobHash, _| {
//!     Ok(blobs.iter().find(|b| b.hash == *h).map(|b: &Blob| b.text.as_bytes().to_vec()))
//! })?;
//! assert_eq!(stored, state);
//! # Ok::<(), steadfast_core::StoreError>(())
//! ```

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::record::checkpoint::{Checkpoint, Decision, StepRecord, CHECKPOINT_FORMAT};
use crate::store::named;
use crate::store::place::Place;
use crate::StoreError;

/// The threshold above which a value is stored as a blob by default: 64 KiB
/// of JSON text.
pub const DEFAULT_BLOB_THRESHOLD: u64 = 64 << 10;

/// The smallest threshold a store takes: below it a reference would cost
/// about as much as the value.
pub const MIN_BLOB_THRESHOLD: u64 = 256;

/// The largest value a blob holds: 1 GiB of JSON text.
pub const MAX_BLOB_BYTES: u64 = 1 << 30;

/// The member that marks a reference (or an escaped value).
pub const MARK: &str = "$blob";

/// The mark's value on an escaped value of the caller's.
const LITERAL: &str = "literal";

/// The SHA-256 of a blob's content, which names it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobHash([u8; 32]);

impl BlobHash {
    /// The hash of `content`.
    pub fn of(content: &[u8]) -> Self {
        BlobHash(Sha256::digest(content).into())
    }

    /// The 32 bytes of the hash.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A hash from its 32 bytes (`None` for any other length).
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(BlobHash)
    }

    /// The 64 lowercase hex digits of the hash (a name for a file).
    pub fn hex(&self) -> String {
        let mut out = String::with_capacity(64);
        for b in self.0 {
            out.extend(hex_pair(b));
        }
        out
    }

    /// A hash from its text form, `sha256:` and 64 lowercase hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        Self::parse_hex(text.strip_prefix("sha256:")?)
    }

    /// A hash from its 64 lowercase hex digits.
    pub fn parse_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                _ => None,
            };
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(BlobHash(out))
    }
}

/// The two lowercase hex digits of `b`.
fn hex_pair(b: u8) -> [char; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [
        char::from(DIGITS[usize::from(b >> 4)]),
        char::from(DIGITS[usize::from(b & 0xf)]),
    ]
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 71];
        text[..7].copy_from_slice(b"sha256:");
        for (i, b) in self.0.into_iter().enumerate() {
            let [hi, lo] = hex_pair(b);
            // ASCII digits: one byte each.
            text[7 + 2 * i] = hi as u8;
            text[8 + 2 * i] = lo as u8;
        }
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A value to be stored once, under the hash of its JSON text.
#[derive(Clone, PartialEq, Eq)]
pub struct Blob {
    /// The SHA-256 of `text`.
    pub hash: BlobHash,
    /// The value, as JSON text (shared with the texts named lately, so
    /// that a value met again is not copied).
    pub text: Arc<String>,
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("hash", &self.hash)
            .field("bytes", &self.text.len())
            .finish()
    }
}

/// Checks a threshold given to a store: at least [`MIN_BLOB_THRESHOLD`] and
/// at most [`MAX_BLOB_BYTES`].
pub fn check_threshold(bytes: u64) -> Result<u64, StoreError> {
    if (MIN_BLOB_THRESHOLD..=MAX_BLOB_BYTES).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(StoreError::InvalidInput(format!(
            "a blob threshold of {bytes} bytes is out of range: give {MIN_BLOB_THRESHOLD} bytes to 1 GiB"
        )))
    }
}

/// A size as a store URL gives it: bytes, or a number with `KiB`, `MiB` or
/// `GiB` (`64KiB`), checked as a threshold ([`check_threshold`]).
pub fn parse_size(text: &str) -> Result<u64, StoreError> {
    let bad = || {
        StoreError::InvalidInput(format!(
            "{text:?} is not a size: give bytes, or a number with KiB, MiB or GiB (64KiB)"
        ))
    };
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    check_threshold(n.checked_mul(scale).ok_or_else(bad)?)
}

/// The size of a reference as [`encode_object`] writes it (a blob of
/// `bytes` bytes): `{"$blob":"sha256:<64>","bytes":N}`.
fn reference_size(bytes: u64) -> u64 {
    let digits = bytes.checked_ilog10().unwrap_or(0) as u64 + 1;
    // {"$blob":"sha256: (17) + 64 + ","bytes": (10) + digits + } (1)
    17 + 64 + 10 + digits + 1
}

/// A local store's URL split at its `?`: the path, and the blob threshold
/// its query sets (`blob_threshold=SIZE`, the one option such URLs take;
/// anything else is refused, naming `store`).
pub fn split_url_options<'u>(
    store: &str,
    rest: &'u str,
) -> Result<(&'u str, Option<u64>), StoreError> {
    let Some((path, query)) = rest.split_once('?') else {
        return Ok((rest, None));
    };
    let mut threshold = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("blob_threshold", size)) => {
                threshold = Some(parse_size(size).map_err(|e| match e {
                    StoreError::InvalidInput(why) => StoreError::InvalidInput(format!(
                        "{store} URL parameter blob_threshold: {why}"
                    )),
                    other => other,
                })?)
            }
            _ => {
                return Err(StoreError::InvalidInput(format!(
                "{store} URL parameter {pair:?} is not known; the one taken is blob_threshold=SIZE"
            )))
            }
        }
    }
    Ok((path, threshold))
}

/// The size of `value` as a store with blobs at `threshold` writes it in a
/// record: its JSON text (an escaped look-alike with its escape), or a
/// reference when that is longer than the threshold. A value over
/// [`MAX_BLOB_BYTES`], which no store takes, counts in full.
pub fn stored_value_size(value: &Value, threshold: u64) -> u64 {
    let size = named::json_len(value);
    if size > threshold && size <= MAX_BLOB_BYTES {
        reference_size(size)
    } else if looks_like_mark(value) {
        // {"$blob":"literal","value": and }
        size + 28
    } else {
        size
    }
}

/// The size of the object `map` as a store with blobs at `threshold`
/// writes it in a record ([`stored_value_size`] for each value).
pub fn stored_size(map: &Map<String, Value>, threshold: u64) -> u64 {
    let entries: u64 = map
        .iter()
        .map(|(k, v)| named::json_str_len(k) + 1 + stored_value_size(v, threshold))
        .sum();
    2 + entries + (map.len() as u64).saturating_sub(1)
}

/// The size of `map`, an object in stored form (references and escaped
/// values in place), as a record holds it; `None` when a value of it that
/// is neither a reference nor escaped is longer than `threshold` (a value
/// stored before the store had blobs, or under a higher threshold), so
/// that the map is not what a save at `threshold` writes.
pub fn stored_form_size(map: &Map<String, Value>, threshold: u64) -> Option<u64> {
    let mut entries: u64 = 0;
    for (k, v) in map {
        let size = named::json_len(v);
        if size > threshold && !looks_like_mark(v) {
            return None;
        }
        entries += named::json_str_len(k) + 1 + size;
    }
    Some(2 + entries + (map.len() as u64).saturating_sub(1))
}

/// Whether a caller's value needs escaping, or a stored one is a reference
/// or escaped: an object with a `$blob` member.
pub(crate) fn looks_like_mark(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.contains_key(MARK))
}

/// A top-level value's JSON text, or the string it is when that needs no
/// escaping: such a string, met lately, is named without being written out
/// again (see [`named`]).
enum Text<'v> {
    Plain(&'v str),
    Written(String),
}

impl<'v> Text<'v> {
    fn of(value: &'v Value, run_id: &str, what: &str) -> Result<Self, StoreError> {
        match value {
            Value::String(s) if named::plain(s) => Ok(Text::Plain(s)),
            other => named::json_text(other).map(Text::Written).map_err(|e| {
                StoreError::InvalidInput(format!(
                    "run {run_id:?}: cannot encode its {what}: {e}; nothing was written"
                ))
            }),
        }
    }

    /// The length of the text, quotes included.
    fn len(&self) -> usize {
        match self {
            Text::Plain(s) => s.len() + 2,
            Text::Written(text) => text.len(),
        }
    }

    fn name(self) -> named::Named {
        match self {
            Text::Plain(s) => named::name_plain_str(s),
            Text::Written(text) => named::name_text(text),
        }
    }

    fn push_into(self, out: &mut String) {
        match self {
            Text::Plain(s) => named::push_plain_str(out, s),
            Text::Written(text) => out.push_str(&text),
        }
    }
}

/// Writes `map` as a JSON object, each top-level value whose text is longer
/// than `threshold` bytes replaced by a reference and pushed to `blobs`
/// (once per content), each value of the caller's that looks like a
/// reference escaped. A value over [`MAX_BLOB_BYTES`] is refused
/// ([`StoreError::TooLarge`]), naming it; nothing is written.
pub fn encode_object(
    map: &Map<String, Value>,
    threshold: u64,
    run_id: &str,
    what: &str,
    blobs: &mut Vec<Blob>,
) -> Result<String, StoreError> {
    let mut out = String::with_capacity(64);
    out.push('{');
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        named::push_json_str(&mut out, key);
        out.push(':');
        push_stored(&mut out, value, threshold, run_id, what, blobs)?;
    }
    out.push('}');
    Ok(out)
}

/// Appends the stored form of one value: a reference (its blob pushed to
/// `blobs`, once per content) when its text is longer than `threshold`, an
/// escaped value when it looks like a reference, else its text.
fn push_stored(
    out: &mut String,
    value: &Value,
    threshold: u64,
    run_id: &str,
    what: &str,
    blobs: &mut Vec<Blob>,
) -> Result<(), StoreError> {
    let text = Text::of(value, run_id, what)?;
    let bytes = text.len() as u64;
    if bytes > threshold {
        if bytes > MAX_BLOB_BYTES {
            return Err(StoreError::TooLarge {
                run_id: run_id.to_string(),
                what: "value",
                size: bytes,
                limit: MAX_BLOB_BYTES,
            });
        }
        let named = text.name();
        let hash = BlobHash(named.digest);
        // The same content twice in one save (a state and the update
        // that set it) is kept once.
        if !blobs.iter().any(|b| b.hash == hash) {
            blobs.push(Blob {
                hash,
                text: named.text,
            });
        }
        out.push_str(&format!("{{\"{MARK}\":\"{hash}\",\"bytes\":{bytes}}}"));
    } else if looks_like_mark(value) {
        out.push_str(&format!("{{\"{MARK}\":\"{LITERAL}\",\"value\":"));
        text.push_into(out);
        out.push('}');
    } else {
        text.push_into(out);
    }
    Ok(())
}

/// `text` (a stored object written before this store had blobs) with each
/// top-level value that looks like a reference escaped, so that it reads
/// back as it was written; `None` when nothing needs escaping (or the text
/// is not a JSON object, which a load reports as it always did).
pub fn escape_lookalikes(text: &str) -> Option<String> {
    if !text.contains(MARK) {
        return None;
    }
    let mut map: Map<String, Value> = serde_json::from_str(text).ok()?;
    if !escape_lookalikes_in(&mut map) {
        return None;
    }
    serde_json::to_string(&map).ok()
}

/// [`escape_lookalikes`] on a decoded object: escapes in place each
/// top-level value that looks like a reference; whether any did.
pub fn escape_lookalikes_in(map: &mut Map<String, Value>) -> bool {
    let mut changed = false;
    for value in map.values_mut() {
        if looks_like_mark(value) {
            let inner = std::mem::take(value);
            let mut wrapped = Map::new();
            wrapped.insert(MARK.to_string(), Value::from(LITERAL));
            wrapped.insert("value".to_string(), inner);
            *value = Value::Object(wrapped);
            changed = true;
        }
    }
    changed
}

/// Whether a stored record has anything to put back on a load: a reference
/// or an escaped value in its state, or decisions whose data its format
/// says are stored with references ([`STORED_DECISIONS_FORMAT`]).
pub fn record_holds_marks(cp: &Checkpoint) -> bool {
    holds_marks(&cp.state) || cp.format == STORED_DECISIONS_FORMAT
}

/// Step rows as a store with blobs at `threshold` keeps them: each row's
/// update with its large values as references (their blobs added to
/// `blobs`) and look-alikes escaped ([`encode_map`]), for a rewrite of run
/// `run_id`'s history.
pub fn encode_rows(
    records: &[StepRecord],
    threshold: u64,
    run_id: &str,
    blobs: &mut Vec<Blob>,
) -> Result<Vec<StepRecord>, StoreError> {
    records
        .iter()
        .map(|r| {
            let mut row = r.clone();
            row.update = encode_map(&r.update, threshold, run_id, "step's update", blobs)?;
            Ok(row)
        })
        .collect()
}

/// Whether a stored object holds a reference or an escaped value (any
/// top-level value with a `$blob` member).
pub fn holds_marks(map: &Map<String, Value>) -> bool {
    map.values().any(looks_like_mark)
}

/// [`encode_object`], decoded again: the object as a store with blobs
/// keeps it, for a store that holds records as values (references are
/// small, so the text parsed back is too).
pub fn encode_map(
    map: &Map<String, Value>,
    threshold: u64,
    run_id: &str,
    what: &str,
    blobs: &mut Vec<Blob>,
) -> Result<Map<String, Value>, StoreError> {
    let text = encode_object(map, threshold, run_id, what, blobs)?;
    serde_json::from_str(&text).map_err(|e| {
        StoreError::InvalidInput(format!(
            "run {run_id:?}: the {what} does not read back as written: {e}"
        ))
    })
}

pub use crate::record::checkpoint::STORED_DECISIONS_FORMAT;

/// The decisions of a record as a store with blobs keeps them, or `None`
/// when they are kept as they are: each decision's data whose JSON text is
/// longer than `threshold` becomes a reference (its blob pushed to `blobs`,
/// once per content), and data that looks like a reference is escaped. A
/// store that gets `Some` writes these decisions with the record's format
/// set to [`STORED_DECISIONS_FORMAT`].
///
/// ```
/// use serde_json::json;
/// use steadfast_core::store::blob::encode_decisions;
/// use steadfast_core::{Decision, Timestamp};
///
/// let small = Decision::approve("review", "ada", Timestamp::EPOCH, Some(json!({"ok": true})));
/// let mut blobs = Vec::new();
/// assert!(encode_decisions(&[small.clone()], 1024, "r", &mut blobs)?.is_none());
/// let big = Decision::approve("draft", "ada", Timestamp::EPOCH, Some(json!("x".repeat(2000))));
/// let stored = encode_decisions(&[small, big], 1024, "r", &mut blobs)?.unwrap();
/// assert_eq!(blobs.len(), 1);
/// assert!(stored[1].data.as_ref().unwrap()["$blob"].as_str().unwrap().starts_with("sha256:"));
/// # Ok::<(), steadfast_core::StoreError>(())
/// ```
pub fn encode_decisions(
    decisions: &[Decision],
    threshold: u64,
    run_id: &str,
    blobs: &mut Vec<Blob>,
) -> Result<Option<Vec<Decision>>, StoreError> {
    let needs = |v: &Value| looks_like_mark(v) || named::json_len(v) > threshold;
    if !decisions.iter().filter_map(|d| d.data.as_ref()).any(needs) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(decisions.len());
    for d in decisions {
        let data = match &d.data {
            Some(v) if needs(v) => {
                let mut text = String::new();
                push_stored(&mut text, v, threshold, run_id, "decision data", blobs)?;
                Some(serde_json::from_str(&text).map_err(|e| {
                    StoreError::InvalidInput(format!(
                        "run {run_id:?}: the decision data at gate {:?} does not read back as written: {e}",
                        d.gate
                    ))
                })?)
            }
            other => other.clone(),
        };
        out.push(Decision {
            gate: d.gate.clone(),
            approved: d.approved,
            by: d.by.clone(),
            at: d.at,
            data,
            reason: d.reason.clone(),
            waited_since: d.waited_since,
        });
    }
    Ok(Some(out))
}

/// Adds to a save's `blobs` each of `head_blobs` (what
/// [`encode_head_with_blobs`](crate::store::head::encode_head_with_blobs)
/// gave) that `stored` does not name, each content once. `stored`: the
/// blobs the run's stored head refers to, at the version the save expects
/// (empty when not known). Such a blob is stored, and so is the run's
/// reference to it (a store counts a head's references with the rest, and
/// the save fails if another changed the run meanwhile), so a save that
/// carries the decision again need not write it again.
///
/// ```
/// use steadfast_core::store::blob::{add_head_blobs, Blob, BlobHash};
///
/// let blob = |t: &str| Blob { hash: BlobHash::of(t.as_bytes()), text: t.to_string().into() };
/// let mut blobs = vec![blob("\"a\"")];
/// add_head_blobs(&mut blobs, vec![blob("\"a\""), blob("\"b\""), blob("\"c\"")], &[blob("\"c\"").hash]);
/// assert_eq!(blobs, vec![blob("\"a\""), blob("\"b\"")]);
/// ```
pub fn add_head_blobs(blobs: &mut Vec<Blob>, head_blobs: Vec<Blob>, stored: &[BlobHash]) {
    for blob in head_blobs {
        if !stored.contains(&blob.hash) && !blobs.iter().any(|b| b.hash == blob.hash) {
            blobs.push(blob);
        }
    }
}

/// The decisions' data of `cp` keyed by place, taken out of it: what
/// [`resolve_decisions`] resolves as one stored object.
fn take_decision_data(cp: &mut Checkpoint) -> Map<String, Value> {
    let mut map = Map::new();
    for (i, d) in cp.decisions.iter_mut().enumerate() {
        if let Some(v) = d.data.take() {
            map.insert(i.to_string(), v);
        }
    }
    map
}

fn put_decision_data(cp: &mut Checkpoint, mut map: Map<String, Value>) {
    for (i, d) in cp.decisions.iter_mut().enumerate() {
        // Data `null` is no data, as a decision made and stored inline has.
        d.data = map.remove(&i.to_string()).filter(|v| !v.is_null());
    }
}

/// Puts back the decisions' data of a record of format
/// [`STORED_DECISIONS_FORMAT`], resolved as one object by `resolve`, and
/// then its format to [`CHECKPOINT_FORMAT`]; a record of another format
/// is left as it is, and so is the format when `resolve` fails.
fn resolve_decision_data(
    cp: &mut Checkpoint,
    resolve: impl FnOnce(&mut Map<String, Value>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    if cp.format != STORED_DECISIONS_FORMAT {
        return Ok(());
    }
    let mut map = take_decision_data(cp);
    let resolved = resolve(&mut map);
    put_decision_data(cp, map);
    resolved.map(|()| cp.format = CHECKPOINT_FORMAT)
}

/// The column messages name decisions' data by.
const DECISIONS_COLUMN: &str = "head.decisions";

/// The well-formed references of a loaded record's decisions (empty unless
/// its format is [`STORED_DECISIONS_FORMAT`]), each once with its size:
/// what a store that reads asynchronously fetches beside the state's
/// ([`refs_of`]) before it resolves them.
pub fn decision_refs(cp: &Checkpoint) -> Vec<(BlobHash, u64)> {
    if cp.format != STORED_DECISIONS_FORMAT {
        return Vec::new();
    }
    let mut out: Vec<(BlobHash, u64)> = Vec::new();
    for v in cp.decisions.iter().filter_map(|d| d.data.as_ref()) {
        if let Stored::Ref(hash, bytes) = classify(v) {
            if !out.iter().any(|(h, n)| *h == hash && *n == bytes) {
                out.push((hash, bytes));
            }
        }
    }
    out
}

/// Puts back the decisions' data of a loaded record whose format is
/// [`STORED_DECISIONS_FORMAT`] (references by their blobs, escaped values
/// as given) and sets its format to [`CHECKPOINT_FORMAT`]; a record of
/// another format is left as it is. A missing or damaged blob, or a
/// malformed reference, is [`StoreError::Corrupt`] at the decision.
pub fn resolve_decisions(
    cp: &mut Checkpoint,
    place: &Place<'_>,
    fetch: &mut Fetch<'_>,
) -> Result<(), StoreError> {
    resolve_decision_data(cp, |map| {
        resolve_object(map, place, DECISIONS_COLUMN, fetch)
    })
}

/// The blobs a stored head document refers to (its decisions' data, when
/// its format is [`STORED_DECISIONS_FORMAT`]), each once: what a store
/// counts, beside its snapshot's and its history's references, as a run's
/// own. A head that does not read, or a malformed reference, is
/// [`StoreError::Corrupt`] at `column`.
pub fn head_refs_in(
    text: &str,
    place: &Place<'_>,
    column: &str,
) -> Result<Vec<BlobHash>, StoreError> {
    #[derive(serde::Deserialize)]
    struct DecisionData {
        #[serde(default)]
        data: Option<Value>,
    }
    #[derive(serde::Deserialize)]
    struct HeadRefs {
        format: u32,
        #[serde(default)]
        decisions: Vec<DecisionData>,
    }
    // Most heads hold no reference: no need to parse them.
    if !text.contains(MARK) {
        return Ok(Vec::new());
    }
    let head: HeadRefs = serde_json::from_str(text)
        .map_err(|e| place.corrupt(column, format!("does not read: {e}")))?;
    if head.format != STORED_DECISIONS_FORMAT {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (i, d) in head.decisions.iter().enumerate() {
        match d.data.as_ref().map(classify) {
            Some(Stored::Ref(hash, _)) if !out.contains(&hash) => out.push(hash),
            Some(Stored::Malformed(why)) => {
                return Err(place.corrupt(&format!("{column}.decisions[{i}]"), why));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// How a store finds a blob's stored content by its hash (`None`: not
/// stored), for [`resolve_object`]; the second argument is the size the
/// reference gives, past which a store may stop reading (the check that
/// follows refuses any other size).
pub type Fetch<'a> = dyn FnMut(&BlobHash, u64) -> Result<Option<Vec<u8>>, StoreError> + 'a;

/// What a stored top-level value is.
enum Stored<'a> {
    /// A value as it was given.
    Plain,
    /// An escaped value of the caller's.
    Literal,
    /// A reference.
    Ref(BlobHash, u64),
    /// An object with a `$blob` member of neither shape.
    Malformed(&'a str),
}

fn classify(v: &Value) -> Stored<'_> {
    let Value::Object(m) = v else {
        return Stored::Plain;
    };
    let Some(mark) = m.get(MARK) else {
        return Stored::Plain;
    };
    match mark.as_str() {
        Some(LITERAL) if m.len() == 2 && m.contains_key("value") => Stored::Literal,
        Some(LITERAL) => {
            Stored::Malformed("an escaped value must have exactly `$blob` and `value`")
        }
        Some(text) => match (
            BlobHash::parse(text),
            m.get("bytes").and_then(Value::as_u64),
        ) {
            (Some(hash), Some(bytes)) if m.len() == 2 && bytes <= MAX_BLOB_BYTES => {
                Stored::Ref(hash, bytes)
            }
            (None, _) => Stored::Malformed("`$blob` is neither \"literal\" nor a sha256: hash"),
            _ => Stored::Malformed(
                "a reference must have exactly `$blob` and `bytes` (at most 1 GiB)",
            ),
        },
        None => Stored::Malformed("`$blob` is not a string"),
    }
}

/// The blobs a stored object (a snapshot's or an update's text) refers to,
/// each once. A malformed reference is [`StoreError::Corrupt`] at `column`.
pub fn refs_in(text: &str, place: &Place<'_>, column: &str) -> Result<Vec<BlobHash>, StoreError> {
    // Most records hold no reference: no need to parse them.
    if !text.contains(MARK) {
        return Ok(Vec::new());
    }
    let map: Map<String, Value> = serde_json::from_str(text)
        .map_err(|e| place.corrupt(column, format!("not a JSON object: {e}")))?;
    let mut out = Vec::new();
    for (key, value) in &map {
        match classify(value) {
            Stored::Ref(hash, _) if !out.contains(&hash) => out.push(hash),
            Stored::Malformed(why) => {
                return Err(place.corrupt(&format!("{column}[{key:?}]"), why));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The well-formed references among the top-level values of a decoded
/// stored object, each once, with the size each gives: what a store that
/// reads asynchronously fetches before [`Resolver::resolve`] (malformed
/// ones are left for it to report).
pub fn refs_of(map: &Map<String, Value>) -> Vec<(BlobHash, u64)> {
    let mut out: Vec<(BlobHash, u64)> = Vec::new();
    for value in map.values() {
        if let Stored::Ref(hash, bytes) = classify(value) {
            if !out.iter().any(|(h, n)| *h == hash && *n == bytes) {
                out.push((hash, bytes));
            }
        }
    }
    out
}

/// Resolves the references of many stored objects (a run's history rows)
/// and opens each blob once: a value read again is a copy of the one
/// already opened and checked.
pub struct Resolver<'f> {
    fetch: &'f mut Fetch<'f>,
    /// Each blob opened so far: its size and value.
    opened: std::collections::HashMap<BlobHash, (u64, Value)>,
}

impl<'f> Resolver<'f> {
    /// A resolver that finds blobs with `fetch`.
    pub fn new(fetch: &'f mut Fetch<'f>) -> Self {
        Resolver {
            fetch,
            opened: std::collections::HashMap::new(),
        }
    }

    /// [`resolve_object`], with the blobs opened before kept.
    pub fn resolve(
        &mut self,
        map: &mut Map<String, Value>,
        place: &Place<'_>,
        column: &str,
    ) -> Result<(), StoreError> {
        // A value opened earlier in this same object counts as opened too
        // (a state that holds one document under two keys).
        let opened = std::cell::RefCell::new(std::mem::take(&mut self.opened));
        let fetch = &mut *self.fetch;
        let result = resolve_with(
            map,
            place,
            column,
            &mut |hash, bytes| {
                let known = opened
                    .borrow()
                    .get(hash)
                    .filter(|(n, _)| *n == bytes)
                    .map(|(_, v)| v.clone());
                // A reference of another size is checked against the content
                // again (and found wrong).
                Ok(match known {
                    Some(v) => Opened::Value(v),
                    None => match fetch(hash, bytes)? {
                        Some(content) => Opened::Content(content),
                        None => Opened::Missing,
                    },
                })
            },
            &mut |hash, bytes, v| {
                opened.borrow_mut().insert(hash, (bytes, v.clone()));
            },
        );
        self.opened = opened.into_inner();
        result
    }
}

impl Resolver<'_> {
    /// [`resolve_decisions`], with the blobs opened before kept (a
    /// decision's data is often the state's value under the gate's name).
    pub fn resolve_decisions(
        &mut self,
        cp: &mut Checkpoint,
        place: &Place<'_>,
    ) -> Result<(), StoreError> {
        resolve_decision_data(cp, |map| self.resolve(map, place, DECISIONS_COLUMN))
    }

    /// Puts back every value of a record: its state (column `state`), then
    /// its gates' decisions, each blob opened once for both.
    pub fn resolve_record(
        &mut self,
        cp: &mut Checkpoint,
        place: &Place<'_>,
    ) -> Result<(), StoreError> {
        self.resolve(&mut cp.state, place, "state")?;
        self.resolve_decisions(cp, place)
    }

    /// Puts back every value of history rows' updates, each blob opened
    /// once for all of them; `column` names row `index`'s update where an
    /// error must say where it is (`history[3].update`, say).
    pub fn resolve_rows(
        &mut self,
        rows: &mut [StepRecord],
        place: &Place<'_>,
        column: impl Fn(usize) -> String,
    ) -> Result<(), StoreError> {
        for row in rows {
            self.resolve(&mut row.update, place, &column(row.index))?;
        }
        Ok(())
    }
}

/// What a lookup of a blob gave.
enum Opened {
    /// Its value, opened and checked before.
    Value(Value),
    /// Its content as stored, to check.
    Content(Vec<u8>),
    /// Nothing.
    Missing,
}

/// Puts back every value of a stored object: a reference is replaced by the
/// blob `fetch` finds for its hash (its content as stored), an escaped value
/// by the value. A blob that is missing, of another length than its
/// reference says, whose content does not hash to its name or is not JSON is
/// [`StoreError::Corrupt`] at `column`, as is a malformed reference.
pub fn resolve_object(
    map: &mut Map<String, Value>,
    place: &Place<'_>,
    column: &str,
    fetch: &mut Fetch<'_>,
) -> Result<(), StoreError> {
    resolve_with(
        map,
        place,
        column,
        &mut |hash, bytes| {
            Ok(match fetch(hash, bytes)? {
                Some(content) => Opened::Content(content),
                None => Opened::Missing,
            })
        },
        &mut |_, _, _| {},
    )
}

type Lookup<'a> = dyn FnMut(&BlobHash, u64) -> Result<Opened, StoreError> + 'a;

fn resolve_with(
    map: &mut Map<String, Value>,
    place: &Place<'_>,
    column: &str,
    lookup: &mut Lookup<'_>,
    opened: &mut dyn FnMut(BlobHash, u64, &Value),
) -> Result<(), StoreError> {
    for (key, value) in map.iter_mut() {
        let at = || format!("{column}[{key:?}]");
        match classify(value) {
            Stored::Plain => {}
            Stored::Literal => {
                if let Value::Object(m) = value {
                    let inner = m.remove("value").unwrap_or(Value::Null);
                    *value = inner;
                }
            }
            Stored::Malformed(why) => return Err(place.corrupt(&at(), why)),
            Stored::Ref(hash, bytes) => match lookup(&hash, bytes)? {
                Opened::Missing => {
                    return Err(place.corrupt(
                        &at(),
                        format!("refers to blob {hash}, which is not in the store"),
                    ))
                }
                Opened::Value(v) => *value = v,
                Opened::Content(content) => {
                    *value =
                        open(&content, hash, bytes).map_err(|why| place.corrupt(&at(), why))?;
                    opened(hash, bytes, value);
                }
            },
        }
    }
    Ok(())
}

/// A blob's value from its stored content, checked against its reference.
fn open(content: &[u8], hash: BlobHash, bytes: u64) -> Result<Value, String> {
    if content.len() as u64 != bytes {
        return Err(format!(
            "blob {hash} holds {} bytes where its reference says {bytes}",
            content.len()
        ));
    }
    if BlobHash::of(content) != hash {
        return Err(format!("blob {hash} does not hash to its name (damaged)"));
    }
    serde_json::from_slice(content).map_err(|e| format!("blob {hash} is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreErrorKind;
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn round_trip(
        map: &Map<String, Value>,
        threshold: u64,
    ) -> (String, Vec<Blob>, Map<String, Value>) {
        let mut blobs = Vec::new();
        let text = encode_object(map, threshold, "r", "state", &mut blobs).unwrap();
        let mut back: Map<String, Value> = serde_json::from_str(&text).unwrap();
        let locate = |c: &str| c.to_string();
        let place = Place::new("r", &locate);
        resolve_object(&mut back, &place, "snapshot", &mut |h, _| {
            Ok(blobs
                .iter()
                .find(|b| b.hash == *h)
                .map(|b| b.text.as_bytes().to_vec()))
        })
        .unwrap();
        (text, blobs, back)
    }

    #[test]
    fn a_big_value_goes_to_a_blob_once_and_comes_back() {
        let doc = "d".repeat(1000);
        let map = obj(json!({"a": doc, "b": doc, "small": 1}));
        let (text, blobs, back) = round_trip(&map, 256);
        assert_eq!(blobs.len(), 1, "the same content is one blob");
        assert_eq!(back, map);
        assert!(text.len() < 300, "{text}");
        assert_eq!(blobs[0].hash, BlobHash::of(blobs[0].text.as_bytes()));
        assert_eq!(
            refs_in(&text, &Place::new("r", &|c: &str| c.into()), "s").unwrap(),
            vec![blobs[0].hash]
        );
    }

    #[test]
    fn a_value_that_looks_like_a_reference_is_escaped_and_given_back() {
        let fake = json!({"$blob": "sha256:00", "bytes": 3});
        let map = obj(json!({"x": fake, "y": {"$blob": "literal", "value": 1}}));
        let (text, blobs, back) = round_trip(&map, 1 << 20);
        assert!(blobs.is_empty());
        assert_eq!(back, map);
        assert!(text.contains("\"literal\""));
    }

    #[test]
    fn damage_is_corrupt_with_its_place() {
        let doc = "d".repeat(1000);
        let map = obj(json!({"doc": doc}));
        let mut blobs = Vec::new();
        let text = encode_object(&map, 256, "r", "state", &mut blobs).unwrap();
        let locate = |c: &str| format!("db runs[\"r\"].{c}");
        let place = Place::new("r", &locate);
        let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
            ("missing", None),
            ("shorter", Some(blobs[0].text.as_bytes()[1..].to_vec())),
            (
                "changed",
                Some(blobs[0].text.replace('d', "e").into_bytes()),
            ),
        ];
        for (name, content) in cases {
            let mut back: Map<String, Value> = serde_json::from_str(&text).unwrap();
            let err = resolve_object(&mut back, &place, "snapshot", &mut |_, _| {
                Ok(content.clone())
            })
            .unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{name}: {err}");
            assert!(
                err.to_string().contains("snapshot[\"doc\"]"),
                "{name}: {err}"
            );
        }
        for bad in [
            json!({"$blob": 1}),
            json!({"$blob": "sha256:zz", "bytes": 1}),
            json!({"$blob": "literal"}),
            json!({"$blob": blobs[0].hash.to_string()}),
            json!({"$blob": blobs[0].hash.to_string(), "bytes": 1, "more": 2}),
        ] {
            let mut back = obj(json!({ "v": bad }));
            let err =
                resolve_object(&mut back, &place, "snapshot", &mut |_, _| Ok(None)).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{bad}: {err}");
            let text = serde_json::to_string(&obj(json!({ "v": bad }))).unwrap();
            assert!(refs_in(&text, &place, "s").is_err(), "{bad}");
        }
    }

    #[test]
    fn values_stored_before_blobs_are_escaped_once() {
        let old = r#"{"a":{"$blob":"x"},"b":1,"c":{"$blob":"literal","value":2}}"#;
        let escaped = escape_lookalikes(old).unwrap();
        let mut back: Map<String, Value> = serde_json::from_str(&escaped).unwrap();
        let locate = |c: &str| c.to_string();
        resolve_object(&mut back, &Place::new("r", &locate), "s", &mut |_, _| {
            Ok(None)
        })
        .unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<Map<String, Value>>(old).unwrap()
        );
        assert_eq!(escape_lookalikes(r#"{"a":{"b":{"$blob":1}}}"#), None);
        assert_eq!(escape_lookalikes("not json $blob"), None);
    }

    #[test]
    fn stored_sizes_are_the_texts_written() {
        for n in [300usize, 999, 1000, 123_456] {
            let map = obj(json!({"doc": "d".repeat(n), "small": [1, 2], "like": {"$blob": 1}}));
            let mut blobs = Vec::new();
            let text = encode_object(&map, 256, "r", "state", &mut blobs).unwrap();
            assert_eq!(stored_size(&map, 256), text.len() as u64, "{text}");
        }
    }

    #[test]
    fn a_resolver_opens_each_blob_once() {
        let doc = "d".repeat(1000);
        // One document under two keys of one object, and again in each row.
        let map = obj(json!({"doc": doc, "copy": doc, "n": 1}));
        let mut blobs = Vec::new();
        let text = encode_object(&map, 256, "r", "state", &mut blobs).unwrap();
        let stored: Map<String, Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(refs_of(&stored), vec![(blobs[0].hash, 1002)]);
        let mut fetched = 0;
        let mut fetch = |h: &BlobHash, _: u64| {
            fetched += 1;
            Ok(blobs
                .iter()
                .find(|b| b.hash == *h)
                .map(|b| b.text.as_bytes().to_vec()))
        };
        let locate = |c: &str| c.to_string();
        let place = Place::new("r", &locate);
        let mut resolver = Resolver::new(&mut fetch);
        for _ in 0..3 {
            let mut row: Map<String, Value> = serde_json::from_str(&text).unwrap();
            resolver.resolve(&mut row, &place, "u").unwrap();
            assert_eq!(row, map);
        }
        // A reference to the same blob with another size is still refused.
        let mut wrong = obj(json!({"doc": {"$blob": blobs[0].hash.to_string(), "bytes": 5}}));
        assert!(resolver.resolve(&mut wrong, &place, "u").is_err());
        drop(resolver);
        assert_eq!(fetched, 2, "opened once, then once for the wrong size");
    }

    #[test]
    fn too_large_and_out_of_range() {
        assert!(check_threshold(MIN_BLOB_THRESHOLD - 1).is_err());
        assert!(check_threshold(MAX_BLOB_BYTES + 1).is_err());
        assert_eq!(
            check_threshold(DEFAULT_BLOB_THRESHOLD).unwrap(),
            DEFAULT_BLOB_THRESHOLD
        );
        assert!(BlobHash::parse("sha256:ABCD").is_none());
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in [
            "",
            "KiB",
            "64kb",
            "-1",
            "2GiB",
            "10",
            "99999999999999999999GiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let h = BlobHash::of(b"x");
        assert_eq!(BlobHash::parse(&h.to_string()), Some(h));
        assert_eq!(BlobHash::from_slice(h.as_bytes()), Some(h));
    }

    proptest! {
        #[test]
        fn a_hash_is_written_as_its_hex_digits_and_read_back(bytes in proptest::array::uniform32(any::<u8>())) {
            let h = BlobHash::from_slice(&bytes).unwrap();
            let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(h.hex(), want.clone());
            prop_assert_eq!(h.to_string(), format!("sha256:{want}"));
            prop_assert_eq!(BlobHash::parse_hex(&want), Some(h));
            prop_assert_eq!(BlobHash::parse(&h.to_string()), Some(h));
            prop_assert_eq!(BlobHash::parse(&want), None);
            prop_assert_eq!(BlobHash::parse_hex(&want[1..]), None);
            if want.bytes().any(|c| c.is_ascii_alphabetic()) {
                prop_assert_eq!(BlobHash::parse_hex(&want.to_uppercase()), None);
            }
        }
    }

    /// Edges of a decision's data: text exactly at the threshold stays in
    /// the head, one byte over is a blob; an empty string, an empty object
    /// and data nested as deep as a store takes (and large) round-trip.
    #[test]
    fn decision_data_at_the_edges_round_trips() {
        use crate::store::head::{decode_head, encode_head_with_blobs};
        use crate::Timestamp;
        let mut deep = json!("x".repeat(300));
        // As deep as a store takes (100 levels, the data's own included).
        for _ in 0..99 {
            deep = json!([deep]);
        }
        let at = |n: usize| json!("a".repeat(n - 2));
        let cases = [
            (at(256), 0),
            (at(257), 1),
            (json!(""), 0),
            (json!({}), 0),
            (deep, 1),
        ];
        for (data, want) in cases {
            let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
            cp.decisions.push(Decision::approve(
                "g",
                "ada",
                Timestamp::EPOCH,
                Some(data.clone()),
            ));
            crate::store::check_head(&cp).unwrap();
            let mut blobs = Vec::new();
            let text = encode_head_with_blobs(&cp, 256, &mut blobs).unwrap();
            assert_eq!(blobs.len(), want, "{:.60}", data.to_string());
            let mut back = Checkpoint::new("r", "wf", Timestamp::EPOCH);
            decode_head(&text, &mut back).unwrap();
            let locate = |c: &str| c.to_string();
            resolve_decisions(&mut back, &Place::new("r", &locate), &mut |h, _| {
                Ok(blobs
                    .iter()
                    .find(|b| b.hash == *h)
                    .map(|b| b.text.as_bytes().to_vec()))
            })
            .unwrap();
            assert_eq!(back.decisions, cp.decisions);
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "[a-z$]{0,40}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("$blob".to_string()),
                        Just("value".to_string()),
                        "[a-z]{1,3}"
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the caller's values (references look-alikes included)
        /// and wherever the threshold, what comes back is what went in.
        #[test]
        fn any_object_round_trips(
            entries in prop::collection::btree_map("[a-z$]{1,4}", value(), 0..6),
            threshold in 0u64..200,
        ) {
            let map: Map<String, Value> = entries.into_iter().collect();
            let (_, blobs, back) = round_trip(&map, threshold);
            prop_assert_eq!(back, map);
            for b in &blobs {
                prop_assert!(b.text.len() as u64 > threshold);
            }
        }

        /// Whatever the decisions' data (look-alikes included) and wherever
        /// the threshold, a head written with blobs reads back, once
        /// resolved, as the record it was; the references it lists are the
        /// blobs written; and a head that needs none is the plain head.
        #[test]
        fn any_decisions_round_trip_through_a_head(
            datas in prop::collection::vec(
                prop::option::of(prop_oneof![
                    value(),
                    value().prop_map(|v| json!({ "$blob": v })),
                    "[a-z]{0,300}".prop_map(Value::from),
                ]),
                0..5,
            ),
            threshold in 0u64..200,
        ) {
            use crate::store::head::{decode_head, encode_head, encode_head_with_blobs};
            use crate::Timestamp;
            let mut cp = Checkpoint::new("r", "wf", Timestamp::EPOCH);
            for (i, data) in datas.into_iter().enumerate() {
                cp.decisions.push(Decision::approve(&format!("g{i}"), "ada", Timestamp::EPOCH, data));
            }
            let mut blobs = Vec::new();
            let text = encode_head_with_blobs(&cp, threshold, &mut blobs).unwrap();
            let locate = |c: &str| c.to_string();
            let place = Place::new("r", &locate);
            let mut listed = head_refs_in(&text, &place, "head").unwrap();
            listed.sort();
            let mut written: Vec<BlobHash> = blobs.iter().map(|b| b.hash).collect();
            written.sort();
            prop_assert_eq!(listed, written);
            let mut back = Checkpoint::new("r", "wf", Timestamp::EPOCH);
            decode_head(&text, &mut back).unwrap();
            if back.format == CHECKPOINT_FORMAT {
                prop_assert_eq!(&text, &encode_head(&cp).unwrap());
            }
            resolve_decisions(&mut back, &place, &mut |h, _| {
                Ok(blobs.iter().find(|b| b.hash == *h).map(|b| b.text.as_bytes().to_vec()))
            })
            .unwrap();
            prop_assert_eq!(back.format, CHECKPOINT_FORMAT);
            prop_assert_eq!(back.decisions, cp.decisions);
        }
    }
}
