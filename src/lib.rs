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

/// A kind of store this build can open: the URL schemes it answers to, and
/// how it opens the rest of the URL (a path, for the file-based stores).
/// Each backend declares its own, so a new store adds one entry here.
struct Backend {
    schemes: &'static [&'static str],
    open: OpenUrl,
}

/// Opens what follows a URL's scheme (given too, for stores with several);
/// `create` allows making a new store.
type OpenUrl = for<'a> fn(scheme: &'a str, rest: &'a str, create: bool) -> Opening<'a>;

/// A store being opened.
type Opening<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Arc<dyn Store>, StoreError>> + Send + 'a>,
>;

fn backends() -> Vec<Backend> {
    let mut all = vec![Backend {
        schemes: &["memory"],
        open: |_, rest, _| {
            Box::pin(std::future::ready(if rest.is_empty() {
                Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
            } else {
                Err(StoreError::InvalidInput(
                    "memory: takes nothing after the colon".into(),
                ))
            }))
        },
    }];
    #[cfg(feature = "sqlite")]
    all.push(Backend {
        schemes: sqlite::URL_SCHEMES,
        open: |_, rest, create| Box::pin(std::future::ready(sqlite::open_url(rest, create))),
    });
    #[cfg(feature = "file")]
    all.push(Backend {
        schemes: file::URL_SCHEMES,
        open: |_, rest, create| Box::pin(std::future::ready(file::open_url(rest, create))),
    });
    #[cfg(feature = "cosmos")]
    all.push(Backend {
        schemes: cosmos::URL_SCHEMES,
        open: |_, rest, create| Box::pin(cosmos::open_url(rest, create)),
    });
    #[cfg(feature = "postgres")]
    all.push(Backend {
        schemes: postgres::URL_SCHEMES,
        open: |scheme, rest, create| Box::pin(postgres::open_url(scheme, rest, create)),
    });
    all
}

async fn open(url: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    // What messages show: never a password.
    let shown = store::redact_url(url);
    let known = || {
        backends()
            .iter()
            .flat_map(|b| b.schemes.iter().map(|s| format!("{s}:")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (scheme, rest) = url.split_once(':').ok_or_else(|| {
        StoreError::InvalidInput(format!(
            "store URL {shown:?} has no scheme; this build opens {}",
            known()
        ))
    })?;
    let backend = backends()
        .into_iter()
        .find(|b| b.schemes.contains(&scheme))
        .ok_or_else(|| {
            StoreError::Unsupported(format!(
                "store URL {shown:?}: unknown scheme {scheme:?}; this build opens {} (the `sqlite`, `file`, `postgres` and `cosmos` cargo features add those stores)",
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
