#![doc = include_str!("../README.md")]

use std::sync::Arc;

pub use steadfast_core::*;

/// The JSON file store (`file:PATH`).
#[cfg(feature = "file")]
pub use steadfast_file as file;

/// The SQLite store (`sqlite:PATH`), the embedded default.
#[cfg(feature = "sqlite")]
pub use steadfast_sqlite as sqlite;

/// The PostgreSQL store (`postgres://…`), for workers on many machines.
#[cfg(feature = "postgres")]
pub use steadfast_postgres as postgres;

/// The Azure Cosmos DB store (`cosmos://…`), with the `cosmos` feature.
#[cfg(feature = "cosmos")]
pub use steadfast_cosmos as cosmos;

/// Encryption at rest and tamper evidence for any store (`encryption`
/// feature, on by default): wrap a store in [`seal::SealedStore`].
#[cfg(feature = "encryption")]
pub use steadfast_seal as seal;

/// The store used when none is named: SQLite in `.steadfast/runs.db` under the
/// current directory.
pub const DEFAULT_STORE_URL: &str = "sqlite:.steadfast/runs.db";

/// Opens a store from a URL.
///
/// | URL | store |
/// | --- | --- |
/// | `sqlite:PATH` (also `sqlite://PATH`) | the SQLite store, the embedded default ([`DEFAULT_STORE_URL`]) |
/// | `file:PATH` (also `file://PATH`) | the JSON file store: every run in one file |
/// | `cosmos://HOST[:PORT]/DATABASE/CONTAINER` | the Azure Cosmos DB store (feature `cosmos`); the key from `$STEADFAST_COSMOS_KEY` or `?keyfile=PATH` |
/// | `postgres://…` (also `postgresql://…`) | the PostgreSQL store: libpq's URL, plus `schema=NAME` (default `steadfast`); see [`postgres`] |
/// | `memory:` | [`MemoryStore`]: in this process only, for tests and examples |
///
/// Unknown schemes are [`StoreError::Unsupported`]; a URL without a path where one
/// is needed is [`StoreError::InvalidInput`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let store = steadfast::open_store(&format!("file:{}/runs.json", dir.path().display())).await?;
/// let memory = steadfast::open_store("memory:").await?;
/// let sqlite = steadfast::open_store(&format!("sqlite:{}/runs.db", dir.path().display())).await?;
/// assert!(steadfast::open_store("ftp://example").await.is_err());
/// # Ok::<(), steadfast::StoreError>(())
/// # }).unwrap();
/// ```
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open(url, true).await
}

/// Opens a store from a URL like [`open_store`], but never creates one: a
/// `sqlite:` or `file:` store whose file does not exist is
/// [`StoreError::NotFound`], and nothing (not even a directory) is made.
/// For commands that only read or change existing runs.
///
/// A PostgreSQL store is never created either: a missing schema is
/// [`StoreError::NotFound`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("sqlite:{}/nothing/runs.db", dir.path().display());
/// let err = steadfast::open_existing_store(&url).await.err().expect("refused");
/// assert_eq!(err.kind(), steadfast::StoreErrorKind::NotFound);
/// assert!(!dir.path().join("nothing").exists());
/// # });
/// ```
pub async fn open_existing_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open(url, false).await
}

/// Every kind of store this build opens, by URL scheme: each store crate
/// declares its own [`Backend`](store::backend::Backend), and this is the
/// one list of them (the cargo features `sqlite`, `file`, `postgres` and
/// `cosmos` add theirs).
///
/// ```
/// let schemes: Vec<&str> = steadfast::BACKENDS.iter().flat_map(|b| b.schemes.iter().copied()).collect();
/// assert!(schemes.contains(&"memory") && schemes.contains(&"sqlite"));
/// ```
pub const BACKENDS: &[&store::backend::Backend] = &[
    #[cfg(feature = "sqlite")]
    &steadfast_sqlite::BACKEND,
    #[cfg(feature = "file")]
    &steadfast_file::BACKEND,
    #[cfg(feature = "postgres")]
    &steadfast_postgres::BACKEND,
    #[cfg(feature = "cosmos")]
    &steadfast_cosmos::BACKEND,
    &store::memory::BACKEND,
];

async fn open(url: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    // What messages show: never a password.
    let shown = store::redact_url(url);
    let known = || store::backend::Backend::schemes_of(BACKENDS);
    let (scheme, rest) = url.split_once(':').ok_or_else(|| {
        StoreError::InvalidInput(format!(
            "store URL {shown:?} has no scheme; this build opens {}",
            known()
        ))
    })?;
    let backend = BACKENDS
        .iter()
        .find(|b| b.answers(scheme))
        .ok_or_else(|| {
            StoreError::Unsupported(format!(
                "store URL {shown:?}: unknown scheme {scheme:?}; this build opens {} (the `sqlite`, `file`, `postgres` and `cosmos` cargo features add stores)",
                known()
            ))
        })?;
    (backend.open)(scheme, rest, create)
        .await
        .map_err(|e| match e {
            StoreError::InvalidInput(m) => {
                StoreError::InvalidInput(format!("store URL {shown:?}: {m}"))
            }
            other => other,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let msg = |u: &str| {
            rt.block_on(open_store(u))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(msg("runs.json").contains("no scheme"));
        assert!(msg("file:").contains("names no file"));
        assert!(msg("ftp:x").contains("sqlite:, file:"), "{}", msg("ftp:x"));
        assert!(msg("memory:x").contains("nothing after"));
        if cfg!(feature = "cosmos") {
            assert!(
                msg("cosmos://x").contains("no database"),
                "{}",
                msg("cosmos://x")
            );
        } else {
            assert!(msg("cosmos://x").contains("unknown scheme"));
        }
        let pg = msg("postgres://127.0.0.1/test?schema=No-Such");
        assert!(
            pg.contains("schema name") && pg.contains("store URL"),
            "{pg}"
        );
        let pg = msg("postgres://app:s3cret@127.0.0.1/test?schema=Bad");
        assert!(!pg.contains("s3cret") && pg.contains("app:***@"), "{pg}");
        let pg = msg("postgresql://127.0.0.1/test?sslmode=verify-ca");
        assert!(pg.contains("verify-full"), "{pg}");
    }
}
