//! Setting and listing shared limits on a store (`steadfast limits`): each
//! key's size and rate, kept in its document beside who holds its slots.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use steadfast_core::{limits_ops, MemoryStore, Rate};
//! let store = MemoryStore::new();
//! limits_ops::set_limit(&store, "openai", Some(8), Some(Rate::parse("500/min", None)?)).await?;
//! let all = limits_ops::list_limits(&store).await?;
//! assert_eq!(all[0].key, "openai");
//! assert_eq!(all[0].doc.size, Some(8));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use crate::record::error::{invalid_input, store_error, Error, StoreError, StoreErrorKind};
use crate::record::limit::{check_limit_key, LimitDoc, Rate, LIMIT_PREFIX};
use crate::store::{documents_of, Store};

/// A limit as stored: its key and document.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LimitEntry {
    /// The key.
    pub key: String,
    /// Its size, rate, holders, bucket and pause.
    #[serde(flatten)]
    pub doc: LimitDoc,
    /// The document's version.
    pub version: u64,
}

/// Sets limit `key`'s size (none: each step's own) and rate (none: no
/// rate), keeping who holds its slots. Compare-and-swap, tried again when
/// steps take and give back slots meanwhile.
pub async fn set_limit<S: Store + ?Sized>(
    store: &S,
    key: &str,
    size: Option<u32>,
    rate: Option<Rate>,
) -> Result<LimitEntry, Error> {
    check_limit_key(key).map_err(|r| invalid_input("the limit's key", r))?;
    let op = format!("setting limit {key:?}");
    let docs = documents_of(store).map_err(|e| store_error("", &op, e))?;
    let doc_key = format!("{LIMIT_PREFIX}{key}");
    for _ in 0..100 {
        let current = docs
            .get_document(&doc_key)
            .await
            .map_err(|e| store_error("", &op, e))?;
        let (mut doc, version) = match &current {
            None => (LimitDoc::default(), None),
            Some(d) => (
                LimitDoc::from_value(&d.value).map_err(|reason| {
                    store_error(
                        "",
                        &op,
                        StoreError::Corrupt {
                            location: format!("document {doc_key:?}"),
                            reason,
                        },
                    )
                })?,
                Some(d.version),
            ),
        };
        doc.configure(size, rate.clone())
            .map_err(|r| invalid_input(&format!("limit {key:?}"), r))?;
        match docs.put_document(&doc_key, &doc.to_value(), version).await {
            Ok(v) => {
                return Ok(LimitEntry {
                    key: key.to_string(),
                    doc,
                    version: v,
                })
            }
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(store_error("", &op, e)),
        }
    }
    Err(store_error(
        "",
        &op,
        StoreError::Conflict {
            run_id: doc_key,
            expected: None,
            found: None,
        },
    ))
}

/// Every limit on the store, by key: its setting, who holds its slots now
/// (expired holders included until the next step of the key drops them).
pub async fn list_limits<S: Store + ?Sized>(store: &S) -> Result<Vec<LimitEntry>, Error> {
    let op = "listing limits";
    let docs = documents_of(store).map_err(|e| store_error("", op, e))?;
    let found = docs
        .list_documents(LIMIT_PREFIX)
        .await
        .map_err(|e| store_error("", op, e))?;
    found
        .into_iter()
        .map(|d| {
            let doc = LimitDoc::from_value(&d.value).map_err(|reason| {
                store_error(
                    "",
                    op,
                    StoreError::Corrupt {
                        location: format!("document {:?}", d.key),
                        reason,
                    },
                )
            })?;
            Ok(LimitEntry {
                key: d.key[LIMIT_PREFIX.len()..].to_string(),
                doc,
                version: d.version,
            })
        })
        .collect()
}
