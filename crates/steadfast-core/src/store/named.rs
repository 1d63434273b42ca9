//! The JSON text of large values, and the names of those met lately.
//!
//! Every save of a large value writes it as JSON text and names that text by
//! its SHA-256 ([`blob`](crate::store::blob)). Two things here make that
//! cheaper without changing a byte of what is stored:
//!
//! - A string is escaped a run at a time: a stretch with nothing to escape is
//!   copied whole instead of byte by byte. The text is exactly what
//!   `serde_json` writes (a property test compares the two).
//! - The texts named lately are kept, up to [`RECENT_BYTES`] in all, so that
//!   a value met again (a document an agent reads a second time, a state a
//!   store writes again whole) is recognised by comparing its bytes with
//!   them, and takes the name computed before instead of being hashed again.
//!   Only bytes equal to a named text get its name: there is no shorter
//!   fingerprint that two different values could share.
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

/// A text longer than this is named but not kept (one such value would push
/// out everything else).
const RECENT_ONE: usize = RECENT_BYTES / 4;

/// How many kept texts of the right length one lookup compares, at most (so
/// that many values of one length with a long common prefix cannot make a
/// lookup cost more than hashing would).
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

/// A text and its SHA-256.
#[derive(Clone, Debug)]
pub struct Named {
    /// The SHA-256 of `text`.
    pub digest: [u8; 32],
    /// The text, shared with the recent ones while it is kept.
    pub text: Arc<String>,
}

/// The texts named lately, the most recent first.
struct Recent {
    kept: VecDeque<Named>,
    bytes: usize,
}

static RECENT: Mutex<Recent> = Mutex::new(Recent {
    kept: VecDeque::new(),
    bytes: 0,
});

fn recent() -> std::sync::MutexGuard<'static, Recent> {
    // A panic while the lock was held left a list that is still whole (no
    // step below can leave it half-changed): go on with it.
    RECENT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A kept text of `len` bytes for which `same` holds, made the most recent.
fn find(len: usize, same: impl Fn(&str) -> bool) -> Option<Named> {
    let candidates: Vec<Named> = recent()
        .kept
        .iter()
        .filter(|n| n.text.len() == len)
        .take(COMPARED)
        .cloned()
        .collect();
    // Compared without the lock: another save may name meanwhile.
    let hit = candidates.into_iter().find(|n| same(&n.text))?;
    let mut r = recent();
    if let Some(at) = r.kept.iter().position(|n| Arc::ptr_eq(&n.text, &hit.text)) {
        if let Some(n) = r.kept.remove(at) {
            r.kept.push_front(n);
        }
    }
    Some(hit)
}

/// Keeps `named` as the most recent, forgetting the oldest past the budget.
fn keep(named: &Named) {
    if named.text.len() > RECENT_ONE {
        return;
    }
    let mut r = recent();
    // Two saves may name the same new text at once: keep it once.
    if r.kept.iter().any(|n| n.digest == named.digest) {
        return;
    }
    r.bytes += named.text.len();
    r.kept.push_front(named.clone());
    while r.bytes > RECENT_BYTES {
        match r.kept.pop_back() {
            Some(old) => r.bytes -= old.text.len(),
            None => break,
        }
    }
}

/// Names `text`: the name of an equal text met lately, or its SHA-256.
pub fn name_text(text: String) -> Named {
    if let Some(hit) = find(text.len(), |kept| kept == text) {
        return hit;
    }
    let named = Named {
        digest: Sha256::digest(text.as_bytes()).into(),
        text: Arc::new(text),
    };
    keep(&named);
    named
}

/// Names the JSON text of the string `s`, which must be [`plain`]: a text
/// met lately is found without writing the text out.
pub fn name_plain_str(s: &str) -> Named {
    debug_assert!(plain(s));
    let len = s.len() + 2;
    let same = |kept: &str| {
        let k = kept.as_bytes();
        // A kept text of this length that starts with a quote is a string's
        // text; with these inner bytes (no quote, no backslash) it is `"s"`.
        k.first() == Some(&b'"') && &k[1..len - 1] == s.as_bytes()
    };
    if let Some(hit) = find(len, same) {
        return hit;
    }
    let mut text = String::with_capacity(len);
    push_json_str(&mut text, s);
    name_text(text)
}

/// How many bytes of texts are kept now (for tests).
#[cfg(test)]
fn kept_bytes() -> usize {
    let r = recent();
    debug_assert_eq!(r.bytes, r.kept.iter().map(|n| n.text.len()).sum::<usize>());
    r.bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sha(text: &str) -> [u8; 32] {
        Sha256::digest(text.as_bytes()).into()
    }

    /// Held by the tests that look at what is kept, which another test
    /// naming many values at once would push out.
    static KEPT: Mutex<()> = Mutex::new(());

    fn alone() -> std::sync::MutexGuard<'static, ()> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn every_escape_is_written_as_serde_json_writes_it() {
        let all: String = (0u8..0x80).map(char::from).collect();
        let s = format!("{all}é\u{2028}😀 \"quoted\" \\ {all}");
        let mut out = String::new();
        push_json_str(&mut out, &s);
        assert_eq!(out, serde_json::to_string(&s).unwrap());
        assert!(!plain(&s));
        assert!(plain("nothing to escape, even é and 😀 and /"));
    }

    #[test]
    fn a_value_met_again_keeps_its_name_and_one_byte_off_gets_its_own() {
        let _alone = alone();
        let doc = "k".repeat(200_000);
        let first = name_plain_str(&doc);
        assert_eq!(first.digest, sha(&format!("\"{doc}\"")));
        let again = name_plain_str(&doc);
        assert_eq!(again.digest, first.digest);
        assert!(Arc::ptr_eq(&again.text, &first.text), "met again, shared");

        // Same length, one byte different, in the middle and at each end.
        for at in [0, 100_000, 199_999] {
            let mut other = doc.clone().into_bytes();
            other[at] = b'j';
            let other = String::from_utf8(other).unwrap();
            let named = name_plain_str(&other);
            assert_eq!(named.digest, sha(&format!("\"{other}\"")), "byte {at}");
            assert_ne!(named.digest, first.digest);
        }
        // The same text given whole finds the same name.
        assert_eq!(name_text(format!("\"{doc}\"")).digest, first.digest);
        // A non-string text of the same length is not taken for it.
        let array = format!("[{}]", "1".repeat(doc.len()));
        assert_eq!(array.len(), doc.len() + 2);
        assert_eq!(name_text(array.clone()).digest, sha(&array));
    }

    #[test]
    fn what_is_kept_stays_within_its_budget() {
        let _alone = alone();
        for i in 0..40 {
            let doc = format!("{i:04}{}", "b".repeat(1 << 20));
            name_plain_str(&doc);
            assert!(kept_bytes() <= RECENT_BYTES, "{}", kept_bytes());
        }
        // One value over a quarter of the budget is named, not kept.
        let big = "h".repeat(RECENT_ONE + 1);
        let named = name_plain_str(&big);
        assert_eq!(named.digest, sha(&format!("\"{big}\"")));
        assert!(!recent().kept.iter().any(|n| n.digest == named.digest));
    }

    proptest! {
        #[test]
        fn strings_are_written_as_serde_json_writes_them(
            s in proptest::string::string_regex("(.|[\\x00-\\x1f\"\\\\]){0,200}").unwrap()
        ) {
            let mut out = String::new();
            push_json_str(&mut out, &s);
            prop_assert_eq!(&out, &serde_json::to_string(&s).unwrap());
            prop_assert_eq!(plain(&s), out.len() == s.len() + 2);
            prop_assert_eq!(json_text(&Value::String(s.clone())).unwrap(), out);
        }

        #[test]
        fn a_name_is_always_the_sha256_of_the_text(
            picks in proptest::collection::vec((0usize..6, 0usize..300, any::<u8>()), 1..40)
        ) {
            // A few values of one length, met again and changed by a byte.
            let base: Vec<String> = (0..6).map(|k| format!("{k}{}", "v".repeat(299))).collect();
            for (k, at, b) in picks {
                let mut bytes = base[k].clone().into_bytes();
                if b % 2 == 0 {
                    bytes[at] = b'a' + b % 26;
                }
                let s = String::from_utf8(bytes).unwrap();
                let text = serde_json::to_string(&s).unwrap();
                prop_assert_eq!(name_plain_str(&s).digest, sha(&text));
                prop_assert_eq!(name_text(text.clone()).digest, sha(&text));
            }
        }
    }
}
