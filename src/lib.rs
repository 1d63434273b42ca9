#![doc = include_str!("../README.md")]

use std::sync::Arc;

pub use steadfast_core::*;

/// The JSON file store (`file:PATH`).
#[cfg(feature = "file")]
pub use steadfast_file as file;

/// The SQLite store (`sqlite:PATH`), the embedded default.
#[cfg(feature = "sqlite")]
pub use steadfast_sqlite as sqlite;

/// The store used when none is named: SQLite in `.steadfast/runs.db` under the
/// current directory.
pub const DEFAULT_STORE_URL: &str = "sqlite:.steadfast/runs.db";

/// Opens a store from a URL.
///
/// | URL | store |
/// | --- | --- |
/// | `sqlite:PATH` (also `sqlite://PATH`) | the SQLite store, the embedded default ([`DEFAULT_STORE_URL`]) |
/// | `file:PATH` (also `file://PATH`) | the JSON file store: every run in one file |
/// | `memory:` | [`MemoryStore`]: in this process only, for tests and examples |
///
/// Unknown schemes are [`StoreError::Unsupported`]; a URL without a path where one
/// is needed is [`StoreError::InvalidInput`].
///
/// ```
/// # fn main() -> Result<(), steadfast::StoreError> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = steadfast::open_store(&format!("file:{}/runs.json", dir.path().display()))?;
/// let memory = steadfast::open_store("memory:")?;
/// let sqlite = steadfast::open_store(&format!("sqlite:{}/runs.db", dir.path().display()))?;
/// assert!(steadfast::open_store("ftp://example").is_err());
/// # Ok(()) }
/// ```
pub fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open(url, true)
}

/// Opens a store from a URL like [`open_store`], but never creates one: a
/// `sqlite:` or `file:` store whose file does not exist is
/// [`StoreError::NotFound`], and nothing (not even a directory) is made.
/// For commands that only read or change existing runs.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("sqlite:{}/nothing/runs.db", dir.path().display());
/// let err = steadfast::open_existing_store(&url).err().expect("refused");
/// assert_eq!(err.kind(), steadfast::StoreErrorKind::NotFound);
/// assert!(!dir.path().join("nothing").exists());
/// ```
pub fn open_existing_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open(url, false)
}

fn open(url: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let (scheme, rest) = url.split_once(':').ok_or_else(|| {
        StoreError::InvalidInput(format!(
            "store URL {url:?} has no scheme; expected sqlite:PATH, file:PATH or memory:"
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
        "file" => open_file(url, path_of(url, rest)?, create),
        "sqlite" => open_sqlite(url, path_of(url, rest)?, create),
        other => Err(StoreError::Unsupported(format!(
            "store URL {url:?}: unknown scheme {other:?}; this build knows sqlite:, file: and memory:"
        ))),
    }
}

fn path_of<'a>(url: &str, rest: &'a str) -> Result<&'a str, StoreError> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(StoreError::InvalidInput(format!(
            "store URL {url:?} names no file; write SCHEME:PATH"
        )));
    }
    Ok(path)
}

#[cfg(feature = "sqlite")]
fn open_sqlite(_url: &str, path: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let opts = sqlite::SqliteOptions::default().create(create);
    Ok(Arc::new(sqlite::SqliteStore::open_with(path, opts)?))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(url: &str, _path: &str, _create: bool) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::Unsupported(format!(
        "store URL {url:?}: this build has no SQLite store (enable the `sqlite` feature)"
    )))
}

#[cfg(feature = "file")]
fn open_file(_url: &str, path: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let opts = file::FileStoreOptions::default().create(create);
    Ok(Arc::new(file::FileStore::open_with(
        file::OsFs,
        path,
        opts,
    )?))
}

#[cfg(not(feature = "file"))]
fn open_file(url: &str, _path: &str, _create: bool) -> Result<Arc<dyn Store>, StoreError> {
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
