#![doc = include_str!("../README.md")]

use std::sync::Arc;

pub use steadfast_core::*;

/// The JSON file store (`file:PATH`).
#[cfg(feature = "file")]
pub use steadfast_file as file;

/// Opens a store from a URL.
///
/// | URL | store |
/// | --- | --- |
/// | `memory:` | [`MemoryStore`]: in this process only, for tests and examples |
/// | `file:PATH` (also `file://PATH`) | the JSON [`file::FileStore`]: every run in one file |
///
/// Unknown schemes are [`StoreError::Unsupported`]; a URL without a path where one
/// is needed is [`StoreError::InvalidInput`].
///
/// ```
/// # fn main() -> Result<(), steadfast::StoreError> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = steadfast::open_store(&format!("file:{}/runs.json", dir.path().display()))?;
/// let memory = steadfast::open_store("memory:")?;
/// assert!(steadfast::open_store("ftp://example").is_err());
/// # Ok(()) }
/// ```
pub fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let (scheme, rest) = url.split_once(':').ok_or_else(|| {
        StoreError::InvalidInput(format!(
            "store URL {url:?} has no scheme; expected memory: or file:PATH"
        ))
    })?;
    match scheme {
        "memory" => {
            if !rest.is_empty() {
                return Err(StoreError::InvalidInput(format!(
                    "store URL {url:?}: memory: takes nothing after the colon"
                )));
            }
            Ok(Arc::new(MemoryStore::new()))
        }
        "file" => open_file(url, rest),
        other => Err(StoreError::Unsupported(format!(
            "store URL {url:?}: unknown scheme {other:?}; this build knows memory: and file:"
        ))),
    }
}

#[cfg(feature = "file")]
fn open_file(url: &str, rest: &str) -> Result<Arc<dyn Store>, StoreError> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(StoreError::InvalidInput(format!(
            "store URL {url:?} names no file; write file:PATH"
        )));
    }
    Ok(Arc::new(file::FileStore::open(path)?))
}

#[cfg(not(feature = "file"))]
fn open_file(url: &str, _rest: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::Unsupported(format!(
        "store URL {url:?}: this build has no file store (enable the `file` feature)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let msg = |u: &str| {
            open_store(u)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(msg("runs.json").contains("no scheme"));
        assert!(msg("file:").contains("names no file"));
        assert!(msg("memory:x").contains("nothing after"));
        assert!(msg("cosmos://x").contains("unknown scheme"));
    }
}
