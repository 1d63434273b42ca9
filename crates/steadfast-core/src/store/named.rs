//! The JSON text of large values, and the names of those met lately.
//!
//! Every save of a large value writes it as JSON text and names that text by
//! its SHA-256 ([`blob`](crate::store::blob)). Two things here make that
//! cheaper without changing a byte of what is stored:
//!
//! - A string is escaped a run at a time: a stretch with nothing to escape is
//!   copied whole instead of byte by byte. The text is exactly what
//!   `serde_json` writes (a property test compares the two).
//! - The texts named lately are kept, up to [`RECENT_BYTES`] of memory and
//!   64 texts in all (a text over a quarter of that is not kept), so that
//!   a value met again (a document an agent reads a second time, a state a
//!   store writes again whole) is recognised by comparing its bytes with
//!   them, and takes the name computed before instead of being hashed again.
//!   Only bytes equal to a named text get its name: a fingerprint of bytes
//!   sampled across the texts only chooses which kept texts to compare.
//!
//! The kept texts are the values themselves, held in this process's memory
//! for as long as they stay among the most recent; nothing is written
//! anywhere.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// How many bytes of recently named texts are kept, at most.
pub const RECENT_BYTES: usize = 16 << 20;

/// How many kept texts of the right length and [`probe`] one lookup
/// compares, at most (so that many values of one length alike wherever the
/// probe looks cannot make a lookup cost more than hashing would). More
/// such values than this, met in turn, are hashed again: the worst case is
/// these comparisons and one SHA-256, as with no kept texts at all.
const COMPARED: usize = 4;

/// Whether `b` must be escaped in a JSON string (what `serde_json` escapes).
fn escaped(b: u8) -> bool {
    // `|`, not `||`: no branches, so that a chunk is checked in one pass.
    (b < 0x20) | (b == b'"') | (b == b'\\')
}

/// Bytes looked at together: a chunk with nothing to escape is copied whole.
const CHUNK: usize = 32;

fn chunk_has_escape(chunk: &[u8]) -> bool {
    chunk.iter().fold(false, |any, &b| any | escaped(b))
}

/// Whether the JSON text of `s` is `s` between quotes (nothing to escape).
pub fn plain(s: &str) -> bool {
    !s.as_bytes().chunks(CHUNK).any(chunk_has_escape)
}

/// Appends `b`'s escape, as `serde_json` writes it.
fn push_escape(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        0x08 => out.push_str("\\b"),
        0x09 => out.push_str("\\t"),
        0x0a => out.push_str("\\n"),
        0x0c => out.push_str("\\f"),
        0x0d => out.push_str("\\r"),
        _ => {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

/// Appends the JSON text of the string `s`, quotes included.
pub fn push_json_str(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push('"');
    // `from`: the first byte not yet appended. Every escaped byte is ASCII,
    // so each slice below starts and ends on a character boundary.
    let mut from = 0;
    for (n, chunk) in bytes.chunks(CHUNK).enumerate() {
        if chunk_has_escape(chunk) {
            for (k, &b) in chunk.iter().enumerate() {
                if escaped(b) {
                    let at = n * CHUNK + k;
                    out.push_str(&s[from..at]);
                    push_escape(out, b);
                    from = at + 1;
                }
            }
        }
    }
    out.push_str(&s[from..]);
    out.push('"');
}

/// The JSON text of `value`, byte for byte what `serde_json::to_string`
/// writes; a string is escaped a run at a time.
pub fn json_text(value: &Value) -> Result<String, serde_json::Error> {
    match value {
        Value::String(s) => {
            let mut out = String::new();
            push_json_str(&mut out, s);
            Ok(out)
        }
        other => serde_json::to_string(other),
    }
}

/// How many bytes `b` takes in a JSON string (1, or its escape's length).
fn escaped_len(b: u8) -> u64 {
    match b {
        b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

/// The length of the JSON text of the string `s`, quotes included, without
/// writing it.
pub fn json_str_len(s: &str) -> u64 {
    let extra: u64 = s
        .as_bytes()
        .chunks(CHUNK)
        .filter(|c| chunk_has_escape(c))
        .flat_map(|c| c.iter())
        .map(|&b| escaped_len(b) - 1)
        .sum();
    s.len() as u64 + 2 + extra
}

/// The length of the JSON text of `value` as `serde_json::to_string` writes
/// it, without writing it; strings are measured a run at a time.
pub fn json_len(value: &Value) -> u64 {
    // With a stack of its own, not recursion: a value too deep to store is
    // sized before the check that refuses it, and must not overflow ours.
    let mut total = 0;
    let mut todo = vec![value];
    while let Some(v) = todo.pop() {
        total += match v {
            Value::Null => 4,
            Value::Bool(true) => 4,
            Value::Bool(false) => 5,
            Value::Number(n) => serialized_len(n),
            Value::String(s) => json_str_len(s),
            Value::Array(items) => {
                todo.extend(items);
                2 + (items.len() as u64).saturating_sub(1)
            }
            Value::Object(map) => {
                todo.extend(map.values());
                object_frame_len(map)
            }
        };
    }
    total
}

/// The size of `v` written by serde_json as compact JSON, in bytes, counted
/// as it is written (the text is not kept).
pub fn serialized_len<T: serde::Serialize + ?Sized>(v: &T) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing into a counter fails only for a value serde_json cannot write
    // at all, which every store refuses before sizing it.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The length of the JSON text of the object `map` ([`json_len`]).
pub fn json_object_len(map: &serde_json::Map<String, Value>) -> u64 {
    object_frame_len(map) + map.values().map(json_len).sum::<u64>()
}

/// What an object's text holds besides its values: the braces, each key
/// with its colon, and the commas.
fn object_frame_len(map: &serde_json::Map<String, Value>) -> u64 {
    2 + map.keys().map(|k| json_str_len(k) + 1).sum::<u64>() + (map.len() as u64).saturating_sub(1)
}

/// A text and its SHA-256.
#[derive(Clone, Debug)]
pub struct Named {
    /// The SHA-256 of `text`.
    pub digest: [u8; 32],
    /// The text, shared with the recent ones while it is kept.
    pub text: Arc<String>,
}

/// The texts named lately, the most recent first, within a budget of
/// bytes (each counted by what it holds in memory) and of entries.
pub struct Recent {
    kept: VecDeque<Kept>,
    bytes: usize,
    budget: usize,
}

/// A kept text with its [`probe`].
struct Kept {
    named: Named,
    probe: u64,
}

/// How many bytes of a text its [`probe`] samples.
const PROBED: usize = 32;

/// How many bytes at each end of a text its [`probe`] takes besides.
const PROBED_ENDS: usize = 16;

/// A fingerprint of a text of `len` bytes (`at(i)` is its byte `i`) from
/// its first and last [`PROBED_ENDS`] bytes and [`PROBED`] more spread
/// evenly over it: texts of one length that differ there are told apart
/// without comparing them whole. Only a lookup's choice of what to compare
/// depends on it; a name is given only to bytes equal to the kept text.
fn probe(len: usize, at: impl Fn(usize) -> u8) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |i: usize| h = (h ^ u64::from(at(i))).wrapping_mul(PRIME);
    let ends = PROBED_ENDS.min(len);
    (0..ends).for_each(&mut mix);
    (len - ends..len).for_each(&mut mix);
    let n = PROBED.min(len) as u64;
    let last = len.saturating_sub(1) as u64;
    let gaps = n.saturating_sub(1).max(1);
    for k in 0..n {
        mix((k * last / gaps) as usize);
    }
    h
}

/// The [`probe`] of `"s"`, the text of the plain string `s`, read from `s`
/// without writing the text.
fn probe_plain_str(s: &str) -> u64 {
    let b = s.as_bytes();
    let len = b.len() + 2;
    probe(len, |i| {
        if i == 0 || i == len - 1 {
            b'"'
        } else {
            b[i - 1]
        }
    })
}

/// The [`probe`] of `text`.
fn probe_text(text: &str) -> u64 {
    let b = text.as_bytes();
    probe(b.len(), |i| b[i])
}

/// What one kept text counts against the budget: the memory its text holds,
/// and its entry.
fn weight(named: &Named) -> usize {
    named.text.capacity() + std::mem::size_of::<Named>() + 16
}

impl Recent {
    /// An empty list that keeps at most `budget` bytes.
    pub const fn new(budget: usize) -> Self {
        Recent {
            kept: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    /// The most recent kept texts of `len` bytes with this [`probe`], at
    /// most [`COMPARED`].
    fn candidates(&self, len: usize, probe: u64) -> Vec<Named> {
        self.kept
            .iter()
            .filter(|k| k.probe == probe && k.named.text.len() == len)
            .take(COMPARED)
            .map(|k| k.named.clone())
            .collect()
    }

    /// Makes the kept entry at `at` the most recent.
    fn bring_forward(&mut self, at: usize) {
        if let Some(k) = self.kept.remove(at) {
            self.kept.push_front(k);
        }
    }

    /// Makes `text`, if still kept, the most recent.
    fn touch(&mut self, text: &Arc<String>) {
        if let Some(at) = self
            .kept
            .iter()
            .position(|k| Arc::ptr_eq(&k.named.text, text))
        {
            self.bring_forward(at);
        }
    }

    /// Keeps `named` as the most recent, forgetting the oldest past the
    /// budget; a text over a quarter of the budget is not kept.
    fn keep(&mut self, named: &Named) {
        if weight(named) > self.budget / 4 {
            return;
        }
        // Two saves may name the same new text at once: keep it once, as
        // the most recent.
        if let Some(at) = self
            .kept
            .iter()
            .position(|k| k.named.digest == named.digest)
        {
            self.bring_forward(at);
            return;
        }
        let kept = Kept {
            named: named.clone(),
            probe: probe_text(&named.text),
        };
        self.bytes += weight(named);
        self.kept.push_front(kept);
        while self.bytes > self.budget || self.kept.len() > RECENT_ENTRIES {
            match self.kept.pop_back() {
                Some(old) => self.bytes -= weight(&old.named),
                None => break,
            }
        }
    }
}

/// The most texts kept at once (so that a lookup looks at few entries,
/// even when the values are small).
const RECENT_ENTRIES: usize = 64;

/// The texts this process named lately.
static RECENT: Mutex<Recent> = Mutex::new(Recent::new(RECENT_BYTES));

fn lock(recent: &Mutex<Recent>) -> std::sync::MutexGuard<'_, Recent> {
    // A panic while the lock was held left a list that is still whole (no
    // method above can leave it half-changed): go on with it.
    recent.lock().unwrap_or_else(|e| e.into_inner())
}

/// A text of `len` bytes with this [`probe`] in `recent` for which `same`
/// holds, made the most recent.
fn find(
    recent: &Mutex<Recent>,
    len: usize,
    probe: u64,
    same: impl Fn(&str) -> bool,
) -> Option<Named> {
    let candidates = lock(recent).candidates(len, probe);
    // Compared without the lock: another save may name meanwhile.
    let hit = candidates.into_iter().find(|n| same(&n.text))?;
    lock(recent).touch(&hit.text);
    Some(hit)
}

/// Hashes `text` and keeps it in `recent`.
fn hash_and_keep(recent: &Mutex<Recent>, text: String) -> Named {
    let named = Named {
        digest: Sha256::digest(text.as_bytes()).into(),
        text: Arc::new(text),
    };
    lock(recent).keep(&named);
    named
}

/// Names `text`, the JSON text of a value: the name of an equal text met
/// lately, or its SHA-256.
pub fn name_text(text: String) -> Named {
    name_text_in(&RECENT, text)
}

fn name_text_in(recent: &Mutex<Recent>, text: String) -> Named {
    match find(recent, text.len(), probe_text(&text), |kept| kept == text) {
        Some(hit) => hit,
        None => hash_and_keep(recent, text),
    }
}

/// Names the JSON text of the string `s`, which must be [`plain`]: a text
/// met lately is found without writing the text out.
pub fn name_plain_str(s: &str) -> Named {
    name_plain_str_in(&RECENT, s)
}

fn name_plain_str_in(recent: &Mutex<Recent>, s: &str) -> Named {
    debug_assert!(plain(s));
    let len = s.len() + 2;
    let same = |kept: &str| {
        let k = kept.as_bytes();
        // Every kept text is the JSON text of a value, so one of this
        // length that starts and ends with a quote is a string's; with
        // these inner bytes (no quote, no backslash) it is `"s"`.
        k.first() == Some(&b'"') && k.last() == Some(&b'"') && &k[1..len - 1] == s.as_bytes()
    };
    match find(recent, len, probe_plain_str(s), same) {
        Some(hit) => hit,
        None => {
            let mut text = String::with_capacity(len);
            push_plain_str(&mut text, s);
            hash_and_keep(recent, text)
        }
    }
}

/// Appends the JSON text of `s`, which must be [`plain`]: `s` in quotes.
pub fn push_plain_str(out: &mut String, s: &str) {
    debug_assert!(plain(s));
    out.reserve(s.len() + 2);
    out.push('"');
    out.push_str(s);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sha(text: &str) -> [u8; 32] {
        Sha256::digest(text.as_bytes()).into()
    }

    fn local(budget: usize) -> Mutex<Recent> {
        Mutex::new(Recent::new(budget))
    }

    /// The kept texts, the most recent first, and checks the count.
    fn kept(recent: &Mutex<Recent>) -> Vec<String> {
        let r = lock(recent);
        assert_eq!(
            r.bytes,
            r.kept.iter().map(|k| weight(&k.named)).sum::<usize>()
        );
        assert!(r.bytes <= r.budget && r.kept.len() <= RECENT_ENTRIES);
        for k in &r.kept {
            assert_eq!(k.probe, probe_text(&k.named.text));
        }
        r.kept.iter().map(|k| k.named.text.to_string()).collect()
    }

    #[test]
    fn every_escape_is_written_as_serde_json_writes_it() {
        let all: String = (0u8..0x80).map(char::from).collect();
        let s = format!("{all}é\u{2028}😀 \"quoted\" \\ {all}");
        let mut out = String::new();
        push_json_str(&mut out, &s);
        assert_eq!(out, serde_json::to_string(&s).unwrap());
        assert_eq!(json_str_len(&s), out.len() as u64);
        assert!(!plain(&s));
        assert!(plain("nothing to escape, even é and 😀 and /"));
        assert!(plain(""));
    }

    #[test]
    fn a_value_met_again_keeps_its_name_and_one_byte_off_gets_its_own() {
        let recent = local(RECENT_BYTES);
        let doc = "k".repeat(200_000);
        let first = name_plain_str_in(&recent, &doc);
        assert_eq!(first.digest, sha(&format!("\"{doc}\"")));
        let again = name_plain_str_in(&recent, &doc);
        assert_eq!(again.digest, first.digest);
        assert!(Arc::ptr_eq(&again.text, &first.text), "met again, shared");

        // Same length, one byte different, in the middle and at each end.
        for at in [0, 100_000, 199_999] {
            let mut other = doc.clone().into_bytes();
            other[at] = b'j';
            let other = String::from_utf8(other).unwrap();
            let named = name_plain_str_in(&recent, &other);
            assert_eq!(named.digest, sha(&format!("\"{other}\"")), "byte {at}");
            assert_ne!(named.digest, first.digest);
        }
        // The same text given whole finds the same name.
        assert_eq!(
            name_text_in(&recent, format!("\"{doc}\"")).digest,
            first.digest
        );
    }

    #[test]
    fn more_texts_of_one_length_than_a_lookup_compares_are_each_found_again() {
        // An agent's run rereading five documents of one size: each met
        // again is recognised (its kept text shared), not hashed again.
        let recent = local(RECENT_BYTES);
        let docs: Vec<String> = (0..COMPARED + 2)
            .map(|k| format!("{k}{}", "d".repeat(100_000)))
            .collect();
        let first: Vec<Named> = docs.iter().map(|d| name_plain_str_in(&recent, d)).collect();
        for round in 0..3 {
            for (d, named) in docs.iter().zip(&first) {
                let again = name_plain_str_in(&recent, d);
                assert!(
                    Arc::ptr_eq(&again.text, &named.text),
                    "round {round}: {}",
                    &d[..1]
                );
                let text = format!("\"{d}\"");
                assert!(Arc::ptr_eq(&name_text_in(&recent, text).text, &named.text));
            }
        }
    }

    #[test]
    fn texts_that_differ_where_the_probe_looks_have_different_probes() {
        assert_ne!(probe_text("aaaa"), probe_text("aaab"));
        assert_ne!(probe_text("baaa"), probe_text("aaaa"));
        // A byte among the spread samples of a long text.
        let long = "m".repeat(10_000);
        let mut mid = long.clone().into_bytes();
        mid[15 * (10_000 - 1) / 31] = b'n';
        let mid = String::from_utf8(mid).unwrap();
        assert_ne!(probe_text(&long), probe_text(&mid));
    }

    #[test]
    fn a_text_kept_again_becomes_the_most_recent_and_is_counted_once() {
        let recent = local(RECENT_BYTES);
        let (a, b) = ("[\"a\"]".to_string(), "[\"b\"]".to_string());
        hash_and_keep(&recent, a.clone());
        hash_and_keep(&recent, b.clone());
        let bytes = lock(&recent).bytes;
        assert_eq!(kept(&recent), [b.clone(), a.clone()]);
        // Named again without being found (two saves naming it at once).
        hash_and_keep(&recent, a.clone());
        assert_eq!(kept(&recent), [a, b]);
        assert_eq!(lock(&recent).bytes, bytes);
    }

    #[test]
    fn names_given_by_threads_at_once_are_each_the_sha256_of_their_text() {
        // Threads naming the same few texts of one length, and texts one
        // byte off them, at once: whatever is kept, found or hashed, a
        // name is always its own text's.
        let recent = Arc::new(local(2 << 20));
        let base: Vec<String> = (0..8)
            .map(|k| format!("{k}{}", "t".repeat(20_000)))
            .collect();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (recent, base) = (Arc::clone(&recent), base.clone());
                std::thread::spawn(move || {
                    for i in 0..300usize {
                        let mut bytes = base[(i * 7 + t) % base.len()].clone().into_bytes();
                        if (i + t) % 3 == 0 {
                            let at = (i * 131) % bytes.len();
                            bytes[at] = b'u';
                        }
                        let s = String::from_utf8(bytes).unwrap();
                        let named = name_plain_str_in(&recent, &s);
                        assert_eq!(named.digest, sha(&format!("\"{s}\"")));
                        assert_eq!(*named.text, format!("\"{s}\""));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        kept(&recent);
    }

    #[test]
    fn a_kept_text_that_is_not_a_string_is_not_taken_for_one() {
        let recent = local(RECENT_BYTES);
        // `[1,2,3]` holds the same inner bytes as the string `1,2,3`.
        name_text_in(&recent, "[1,2,3]".to_string());
        let named = name_plain_str_in(&recent, "1,2,3");
        assert_eq!(named.digest, sha("\"1,2,3\""));
        assert_eq!(*named.text, "\"1,2,3\"");
        // Nor is a text that starts with a quote but is not this string's.
        name_text_in(&recent, "\"a\"".to_string());
        assert_eq!(name_plain_str_in(&recent, "a").digest, sha("\"a\""));
    }

    #[test]
    fn the_oldest_is_forgotten_first_and_a_text_met_again_is_the_newest() {
        let one = weight(&Named {
            digest: [0; 32],
            text: Arc::new(String::with_capacity(1002)),
        });
        let recent = local(one * 4);
        for c in ['a', 'b', 'c', 'd'] {
            name_plain_str_in(&recent, &c.to_string().repeat(1000));
        }
        // Met again: `a` becomes the newest, so `b` goes first.
        name_plain_str_in(&recent, &"a".repeat(1000));
        name_plain_str_in(&recent, &"e".repeat(1000));
        let firsts: Vec<char> = kept(&recent)
            .iter()
            .map(|t| t.chars().nth(1).unwrap())
            .collect();
        assert_eq!(firsts, ['e', 'a', 'd', 'c']);
        // A text over a quarter of the budget is named but not kept.
        let big = "h".repeat(one);
        assert_eq!(
            name_plain_str_in(&recent, &big).digest,
            sha(&format!("\"{big}\""))
        );
        assert_eq!(kept(&recent).len(), 4);
    }

    #[test]
    fn what_is_kept_stays_within_its_budget_of_bytes_and_entries() {
        let recent = local(4 << 20);
        for i in 0..40 {
            name_plain_str_in(&recent, &format!("{i:04}{}", "b".repeat(300_000)));
            kept(&recent);
        }
        assert!(kept(&recent).len() < 40);
        for i in 0..200 {
            name_text_in(&recent, format!("[{i}]"));
        }
        assert_eq!(kept(&recent).len(), RECENT_ENTRIES);
        // The process's own list, used by `encode_object`, keeps to its own.
        name_plain_str(&"g".repeat(1 << 20));
        kept(&RECENT);
    }

    fn any_text() -> impl Strategy<Value = String> {
        proptest::string::string_regex("(.|[\\x00-\\x1f\"\\\\]){0,40}").unwrap()
    }

    /// Any JSON value: every kind, nested, strings with escapes.
    fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any_text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 40, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(any_text(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn probes_of_a_string_and_of_its_text_agree(
            s in proptest::string::string_regex("[a-z0-9é😀 ]{0,100}").unwrap()
        ) {
            prop_assert_eq!(probe_plain_str(&s), probe_text(&format!("\"{s}\"")));
        }

        #[test]
        fn lengths_are_those_of_serde_json_text(value in any_value()) {
            prop_assert_eq!(json_len(&value), serde_json::to_string(&value).unwrap().len() as u64);
            if let Value::String(s) = &value {
                prop_assert_eq!(json_str_len(s), json_len(&value));
            }
        }

        #[test]
        fn strings_are_written_as_serde_json_writes_them(
            s in proptest::string::string_regex("(.|[\\x00-\\x1f\"\\\\]){0,200}").unwrap()
        ) {
            let mut out = String::new();
            push_json_str(&mut out, &s);
            prop_assert_eq!(&out, &serde_json::to_string(&s).unwrap());
            prop_assert_eq!(json_str_len(&s), out.len() as u64);
            prop_assert_eq!(plain(&s), out.len() == s.len() + 2);
            prop_assert_eq!(json_text(&Value::String(s.clone())).unwrap(), out);
        }

        #[test]
        fn a_name_is_always_the_sha256_of_the_text(
            picks in proptest::collection::vec((0usize..6, 0usize..300, any::<u8>()), 1..40)
        ) {
            // A few values of one length, met again and changed by a byte,
            // beside non-string texts of the same length.
            let recent = local(1 << 20);
            let base: Vec<String> = (0..6).map(|k| format!("{k}{}", "v".repeat(299))).collect();
            for (k, at, b) in picks {
                let mut bytes = base[k].clone().into_bytes();
                if b % 2 == 0 {
                    bytes[at] = b'a' + b % 26;
                }
                let s = String::from_utf8(bytes).unwrap();
                let text = serde_json::to_string(&s).unwrap();
                let array = format!("[{}]", s);
                prop_assert_eq!(name_text_in(&recent, array.clone()).digest, sha(&array));
                prop_assert_eq!(name_plain_str_in(&recent, &s).digest, sha(&text));
                prop_assert_eq!(name_text_in(&recent, text.clone()).digest, sha(&text));
            }
        }
    }
}
