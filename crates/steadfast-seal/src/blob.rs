//! Sealing opaque bytes bound to where they belong, for stores of other
//! shapes than runs (the Python package's LangGraph checkpoints).
//!
//! A sealed blob is `SFB1`, the key id's length (one byte) and the key id,
//! a 96-bit nonce, then AES-256-GCM ciphertext and tag. The associated data
//! is the caller's context (for a checkpoint: its thread, namespace, id and
//! kind), so a blob moved to another row does not open.

use ring::aead::{Aad, Nonce, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use steadfast_core::StoreError;

use crate::{aad, Keyring};

const MAGIC: &[u8] = b"SFB1";
const TAG_LEN: usize = 16;

/// Whether `bytes` look like a sealed blob (its magic prefix).
pub fn is_sealed_blob(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

fn data(context: &[&[u8]]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = vec![b"steadfast-blob-1"];
    parts.extend_from_slice(context);
    aad(&parts)
}

/// Seals `plain` under the keyring's current key, bound to `context`.
pub fn seal_blob(keys: &Keyring, context: &[&[u8]], plain: &[u8]) -> Result<Vec<u8>, StoreError> {
    let (id, key) = keys.current_key();
    let id_len = u8::try_from(id.len())
        .map_err(|_| StoreError::InvalidInput(format!("key id {id:?} is over 255 bytes")))?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).map_err(|_| {
        StoreError::Unsupported("the system's random number generator failed".into())
    })?;
    let mut body = plain.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(data(context)),
        &mut body,
    )
    .map_err(|_| StoreError::InvalidInput("a blob is too large to encrypt".into()))?;
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + id.len() + NONCE_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.push(id_len);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Opens a blob sealed by [`seal_blob`] for the same `context`; `place`
/// names it in the error ([`StoreError::Corrupt`]) when it does not open.
pub fn open_blob(
    keys: &Keyring,
    place: &str,
    context: &[&[u8]],
    sealed: &[u8],
) -> Result<Vec<u8>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        location: place.to_string(),
        reason,
    };
    let rest = sealed
        .strip_prefix(MAGIC)
        .ok_or_else(|| corrupt("is not sealed (written without encryption?)".into()))?;
    let (&id_len, rest) = rest
        .split_first()
        .ok_or_else(|| corrupt("is damaged (too short)".into()))?;
    let id_len = usize::from(id_len);
    if rest.len() < id_len + NONCE_LEN + TAG_LEN {
        return Err(corrupt("is damaged (too short)".into()));
    }
    let (id, rest) = rest.split_at(id_len);
    let id = std::str::from_utf8(id).map_err(|_| corrupt("is damaged (key id)".into()))?;
    let key = keys.get(id).ok_or_else(|| {
        corrupt(format!(
            "was sealed with key {id:?}, which is not among the keys given ({})",
            keys.ids().collect::<Vec<_>>().join(", ")
        ))
    })?;
    let (nonce, body) = rest.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce)
        .map_err(|_| corrupt("is damaged (nonce)".into()))?;
    let mut body = body.to_vec();
    let plain = key
        .open_in_place(nonce, Aad::from(data(context)), &mut body)
        .map_err(|_| {
            corrupt(format!(
                "does not open with key {id:?}: it was changed, or moved from another row"
            ))
        })?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keyring {
        Keyring::parse("k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=").expect("a key")
    }

    #[test]
    fn a_blob_opens_only_in_its_own_context_and_unchanged() {
        let k = keys();
        let sealed = seal_blob(&k, &[b"thread-1", b"cp-1"], b"secret state").expect("seal");
        assert!(is_sealed_blob(&sealed));
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let opened = open_blob(&k, "here", &[b"thread-1", b"cp-1"], &sealed).expect("open");
        assert_eq!(opened, b"secret state");
        let moved = open_blob(&k, "here", &[b"thread-2", b"cp-1"], &sealed).expect_err("moved");
        assert!(
            moved.to_string().contains("moved from another row"),
            "{moved}"
        );
        // The context's parts are length-prefixed: shifting a byte from one
        // part to the next is another context.
        assert!(open_blob(&k, "here", &[b"thread-1c", b"p-1"], &sealed).is_err());
        for i in [4, sealed.len() / 2, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(
                open_blob(&k, "here", &[b"thread-1", b"cp-1"], &bad).is_err(),
                "byte {i}"
            );
        }
        assert!(open_blob(&k, "here", &[b"thread-1", b"cp-1"], b"plain").is_err());
        assert!(open_blob(&k, "here", &[b"thread-1", b"cp-1"], &sealed[..10]).is_err());
        let other =
            Keyring::parse("k2:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").expect("a key");
        assert!(open_blob(&other, "here", &[b"thread-1", b"cp-1"], &sealed).is_err());
    }
}
