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
/// | `memory:` (`memory:?blob_threshold=SIZE`: large values kept once, as blobs) | [`MemoryStore`]: in this process only, for tests and examples |
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
    Ok(open_with(url, &OpenOptions::default().create(true))
        .await?
        .store)
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
    Ok(open_with(url, &OpenOptions::default()).await?.store)
}

/// How [`open_with`] opens a store.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenOptions {
    /// Whether a missing store may be made (a file, its directory, a schema).
    pub create: bool,
    /// With keys given: also read records written in plain text, so that
    /// `rekey` can seal them (the `steadfast rekey --migrate-plaintext` case);
    /// without it they are refused as not encrypted.
    pub accept_plaintext: bool,
}

impl OpenOptions {
    /// Allows making a missing store.
    pub fn create(mut self, yes: bool) -> Self {
        self.create = yes;
        self
    }
    /// Reads plaintext records through the keys too.
    pub fn accept_plaintext(mut self, yes: bool) -> Self {
        self.accept_plaintext = yes;
        self
    }
}

/// A store opened by [`open_with`], under the encryption policy.
#[non_exhaustive]
pub struct Opened {
    /// The store to run and operate on: with keys in the environment, the
    /// sealing store; without, one that refuses a sealed record rather than
    /// read it (and resume it, or decide its gate) as plain values.
    pub store: Arc<dyn Store>,
    /// The store as it is, records as they are stored: for moving records
    /// (export, import, copy) and reading heads, never for running.
    pub raw: Arc<dyn Store>,
    /// The sealing store, when keys are given (for `rekey`).
    #[cfg(feature = "encryption")]
    pub sealed: Option<Arc<seal::SealedStore>>,
}

/// Opens the store a URL names under the one policy every front end
/// shares (the library, the `steadfast` command, `steadfast serve`, Python):
/// with `STEADFAST_ENCRYPTION_KEY` or `STEADFAST_ENCRYPTION_KEY_FILE` set,
/// every value is sealed on its way in and opened on its way out
/// ([`seal::SealedStore`]); without, a sealed record is refused, never read
/// as plain text. A key that cannot be read is [`StoreError::InvalidInput`],
/// before the store is opened or made.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use steadfast::{open_with, OpenOptions};
/// let opened = open_with("memory:", &OpenOptions::default().create(true)).await?;
/// assert!(opened.store.load("nothing").await?.is_none());
/// # Ok::<(), steadfast::StoreError>(())
/// # }).unwrap();
/// ```
pub async fn open_with(url: &str, opts: &OpenOptions) -> Result<Opened, StoreError> {
    #[cfg(feature = "encryption")]
    let keys = seal::Keyring::from_env().map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    let raw = open_raw(url, opts.create).await?;
    #[cfg(feature = "encryption")]
    {
        let sealed = keys.map(|keys| {
            Arc::new(
                seal::SealedStore::new(Arc::clone(&raw), keys)
                    .accept_plaintext(opts.accept_plaintext),
            )
        });
        let store: Arc<dyn Store> = match &sealed {
            Some(s) => Arc::clone(s) as Arc<dyn Store>,
            None => Arc::new(seal::RefuseSealed::new(Arc::clone(&raw))),
        };
        Ok(Opened { store, raw, sealed })
    }
    #[cfg(not(feature = "encryption"))]
    {
        let _ = opts.accept_plaintext;
        Ok(Opened {
            store: Arc::clone(&raw),
            raw,
        })
    }
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

/// Opens the store a URL names as it is, without the encryption policy.
async fn open_raw(url: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
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
