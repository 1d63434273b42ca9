//! Keys: where they come from, how they are checked, and how they are named.

use std::fmt;
use std::path::Path;

use base64::Engine;
use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};

/// The environment variable that holds the keys themselves.
pub const KEY_ENV: &str = "STEADFAST_ENCRYPTION_KEY";
/// The environment variable that names a key file (mode 0600).
pub const KEY_FILE_ENV: &str = "STEADFAST_ENCRYPTION_KEY_FILE";

/// The largest key file read.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// A key could not be had: what is wrong, never the key itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

/// The keys a [`SealedStore`](crate::SealedStore) seals and opens with, each
/// named by an id. The first is the current key: new writes use it. The
/// others open what was written under them, until `steadfast rekey` (or
/// [`SealedStore::rekey`](crate::SealedStore::rekey)) has rewritten it.
///
/// The text form is one `ID:KEY` entry per line (or separated by commas),
/// where `ID` is 1 to 32 of `A-Z a-z 0-9 _ . -` and `KEY` is 32 random bytes
/// in base64 (`head -c 32 /dev/urandom | base64`); blank lines and lines
/// starting with `#` are skipped.
///
/// ```
/// let keys = steadfast_seal::Keyring::parse(
///     "2026-11:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=\n\
///      2026-10:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
/// )?;
/// assert_eq!(keys.current(), "2026-11");
/// // Debug output names the keys, never shows them.
/// assert!(!format!("{keys:?}").contains("q83v"));
/// # Ok::<(), steadfast_seal::KeyError>(())
/// ```
pub struct Keyring {
    keys: Vec<(String, LessSafeKey)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

pub(crate) fn valid_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Keyring {
    /// Reads keys from their text form (see the type's documentation).
    /// Errors say which entry is wrong, never what it holds.
    pub fn parse(text: &str) -> Result<Keyring, KeyError> {
        let mut keys: Vec<(String, LessSafeKey)> = Vec::new();
        // Comment lines go first, so that a comma in one splits nothing.
        let entries = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('#'))
            .flat_map(|line| line.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty());
        for (n, entry) in entries.enumerate() {
            let n = n + 1;
            let Some((id, key)) = entry.split_once(':') else {
                return Err(KeyError(format!(
                    "key entry {n} is not ID:KEY (an id, a colon, 32 bytes in base64)"
                )));
            };
            let id = id.trim();
            if !valid_id(id) {
                return Err(KeyError(format!(
                    "key entry {n}: the id must be 1 to 32 of A-Z a-z 0-9 _ . -"
                )));
            }
            if keys.iter().any(|(have, _)| have == id) {
                return Err(KeyError(format!(
                    "key entry {n}: the id {id:?} appears twice"
                )));
            }
            let key = key.trim();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(key)
                .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(key))
                .map_err(|_| KeyError(format!("key {id:?} is not base64")))?;
            if bytes.len() != 32 {
                return Err(KeyError(format!(
                    "key {id:?} is {} bytes; AES-256 needs 32 (head -c 32 /dev/urandom | base64)",
                    bytes.len()
                )));
            }
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| KeyError(format!("key {id:?} was refused by AES-256-GCM")))?;
            keys.push((id.to_string(), LessSafeKey::new(unbound)));
        }
        if keys.is_empty() {
            return Err(KeyError("no key given (expected ID:KEY)".into()));
        }
        Ok(Keyring { keys })
    }

    /// Reads keys from a file that only its owner can read: a regular file
    /// (not a symbolic link) of this user's, mode 0600 or stricter, at most
    /// 64 KiB.
    pub fn from_file(path: &Path) -> Result<Keyring, KeyError> {
        let text = steadfast_core::local::read_secret_file(path, "key file", MAX_KEY_FILE, false)
            .map_err(KeyError)?;
        Keyring::parse(&text).map_err(|e| KeyError(format!("key file {}: {e}", path.display())))
    }

    /// The keys named by the environment: `STEADFAST_ENCRYPTION_KEY` (the
    /// keys) or `STEADFAST_ENCRYPTION_KEY_FILE` (a key file); `None` when
    /// neither is set. Both set is an error.
    pub fn from_env() -> Result<Option<Keyring>, KeyError> {
        let direct = std::env::var_os(KEY_ENV);
        let file = std::env::var_os(KEY_FILE_ENV);
        match (direct, file) {
            (Some(_), Some(_)) => Err(KeyError(format!(
                "both {KEY_ENV} and {KEY_FILE_ENV} are set; set one"
            ))),
            (Some(text), None) => {
                let text = text
                    .into_string()
                    .map_err(|_| KeyError(format!("{KEY_ENV} is not UTF-8")))?;
                Keyring::parse(&text)
                    .map(Some)
                    .map_err(|e| KeyError(format!("{KEY_ENV}: {e}")))
            }
            (None, Some(path)) => Keyring::from_file(Path::new(&path)).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The id of the current key.
    pub fn current(&self) -> &str {
        &self.keys[0].0
    }

    /// The ids of all keys, the current one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }

    pub(crate) fn current_key(&self) -> (&str, &LessSafeKey) {
        let (id, key) = &self.keys[0];
        (id, key)
    }

    pub(crate) fn get(&self, id: &str) -> Option<&LessSafeKey> {
        self.keys
            .iter()
            .find(|(have, _)| have == id)
            .map(|(_, k)| k)
    }
}
