//! The master-key authorization header of the Cosmos DB REST API: an
//! HMAC-SHA256, keyed with the account key, over the verb, the resource type,
//! the resource link and the date of the request.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// An account's master key, decoded. Its `Debug` never shows it.
#[derive(Clone)]
pub struct MasterKey(Vec<u8>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(***)")
    }
}

impl MasterKey {
    /// Decodes a key as the portal shows it (base64). The error never
    /// repeats the key.
    pub fn from_base64(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the key is empty".into());
        }
        STANDARD
            .decode(text)
            .map(MasterKey)
            .map_err(|_| format!("the key is not base64 ({} characters)", text.len()))
    }

    /// The decoded value of the `authorization` header for a request (the
    /// header itself carries it URL-encoded: see [`header_value`]).
    /// `resource_type` is `dbs`, `colls`, `docs`, `pkranges`…;
    /// `resource_link` the link of the resource (or of its parent for a
    /// feed, as the REST API specifies), case kept; `date` the RFC 1123 date
    /// sent in `x-ms-date`.
    pub fn sign(&self, verb: &str, resource_type: &str, resource_link: &str, date: &str) -> String {
        let payload = format!(
            "{}\n{}\n{}\n{}\n\n",
            verb.to_lowercase(),
            resource_type.to_lowercase(),
            resource_link,
            date.to_lowercase()
        );
        // An HMAC takes a key of any length.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        };
        mac.update(payload.as_bytes());
        let sig = STANDARD.encode(mac.finalize().into_bytes());
        format!("type=master&ver=1.0&sig={sig}")
    }
}

/// `decoded` URL-encoded for the `authorization` header.
pub fn header_value(decoded: &str) -> String {
    let mut out = String::with_capacity(decoded.len() * 3 / 2);
    for b in decoded.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors that the official JavaScript SDK's header generator gives.
    #[test]
    fn signatures_match_known_vectors() -> Result<(), String> {
        let key = MasterKey::from_base64(
            "dsZQi3KtZmCv1ljt3VNWNm7sQUF1y5rJfC6kv5JiwvW0EndXdDku/dKBp8/ufDToSxLzR/dkSVLW5Jb3NdIuuw==",
        )?;
        assert_eq!(
            key.sign(
                "GET",
                "dbs",
                "dbs/ToDoList",
                "Thu, 27 Apr 2017 00:51:12 GMT"
            ),
            "type=master&ver=1.0&sig=R+R+48ojEib0EGJrGcfIrj/fEHhfD/aT21ixX4ZxS6k="
        );
        let key = MasterKey::from_base64(
            "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==",
        )?;
        assert_eq!(
            key.sign(
                "PUT",
                "docs",
                "dbs/rest/colls/ckpt/docs/wf-1",
                "Sun, 29 Nov 2026 12:00:00 GMT"
            ),
            "type=master&ver=1.0&sig=CeNRcyb01TmnsK6dProbhvEW4KxvfhcZ5eY8lSYXSvo="
        );
        Ok(())
    }

    #[test]
    fn the_header_is_url_encoded_and_keys_never_show() {
        assert_eq!(
            header_value("type=master&ver=1.0&sig=a+b/c="),
            "type%3Dmaster%26ver%3D1.0%26sig%3Da%2Bb%2Fc%3D"
        );
        let key = MasterKey::from_base64("c2VjcmV0").expect("base64");
        assert_eq!(format!("{key:?}"), "MasterKey(***)");
        let err = MasterKey::from_base64("not base64 at all!").unwrap_err();
        assert!(!err.contains("not base64 at all"), "{err}");
    }
}
