//! What the Cosmos tests share: the local protocol server (started by
//! `ci/cosmos/start.sh`, which prints the two variables read here), a key
//! file, and a database per test, dropped afterwards.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use steadfast_cosmos::{CosmosOptions, CosmosStore};

/// The well-known key of the local emulators (the test server checks no
/// signature, but the store signs every request).
pub const TEST_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

/// The server's `cosmos://HOST:PORT` and its certificate, or `None` (with
/// the reason printed) outside CI when none was started. Under CI a missing
/// server fails the test.
pub fn server() -> Option<(String, String)> {
    match (
        std::env::var("STEADFAST_TEST_COSMOS"),
        std::env::var("STEADFAST_TEST_COSMOS_CA"),
    ) {
        (Ok(url), Ok(ca)) => Some((url, ca)),
        _ if std::env::var("CI").is_ok_and(|v| !v.is_empty()) => {
            panic!("STEADFAST_TEST_COSMOS and STEADFAST_TEST_COSMOS_CA are not set: .ci/run starts the server (ci/cosmos/start.sh)")
        }
        _ => {
            eprintln!("skipped: no Cosmos test server (run ci/cosmos/start.sh DIR and export what it prints)");
            None
        }
    }
}

/// The fault-injecting proxy in front of the server (`ci/cosmos/faultproxy.js`,
/// started by `ci/cosmos/start.sh` beside it): its `cosmos://HOST:PORT` and
/// the certificate, or `None` outside CI when none was started. Under CI a
/// missing proxy fails the test.
pub fn proxy() -> Option<(String, String)> {
    match (
        std::env::var("STEADFAST_TEST_COSMOS_PROXY"),
        std::env::var("STEADFAST_TEST_COSMOS_CA"),
    ) {
        (Ok(url), Ok(ca)) => Some((url, ca)),
        _ if std::env::var("CI").is_ok_and(|v| !v.is_empty()) => {
            panic!("STEADFAST_TEST_COSMOS_PROXY and STEADFAST_TEST_COSMOS_CA are not set: .ci/run starts the proxy (ci/cosmos/start.sh)")
        }
        _ => {
            eprintln!("skipped: no Cosmos fault proxy (run ci/cosmos/start.sh DIR and export what it prints)");
            None
        }
    }
}

/// A fresh database on the server, dropped with the guard.
pub struct TestDb {
    pub url: String,
    _dir: tempfile::TempDir,
}

impl TestDb {
    pub fn new(server: &(String, String)) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let keyfile = dir.path().join("key");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&keyfile)
            .expect("the key file");
        f.write_all(TEST_KEY.as_bytes()).expect("write the key");
        let url = format!(
            "{}/t{:016x}/runs?keyfile={}&cafile={}",
            server.0,
            fastrand::u64(..),
            keyfile.display(),
            server.1
        );
        TestDb { url, _dir: dir }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        let path = self.url.split('?').next().unwrap_or("");
        path.rsplit('/').nth(1).unwrap_or("")
    }

    pub async fn store(&self, opts: CosmosOptions) -> CosmosStore {
        CosmosStore::open_with(&self.url, opts)
            .await
            .unwrap_or_else(|e| panic!("the Cosmos test server: {e}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let url = self.url.clone();
        steadfast_conformance::block_on_own_thread(move || async move {
            let opts = CosmosOptions::default().create(false);
            if let Ok(s) = CosmosStore::open_with(&url, opts).await {
                let _ = s.drop_database().await;
            }
        });
    }
}

/// A plain HTTP client for the test server, and the address of database
/// `db`'s container's items: for looking and changing behind the store's
/// back (the test server checks no signature).
fn raw_items(server: &(String, String), db: &str) -> Result<(reqwest::Client, String), String> {
    let tls = steadfast_core::store::tls::verified(Some(&server.1), "the Cosmos test server")
        .map_err(|e| e.to_string())?;
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .map_err(|e| e.to_string())?;
    let base = server.0.replacen("cosmos://", "https://", 1);
    Ok((http, format!("{base}/dbs/{db}/colls/runs/docs")))
}

/// The items a cross-partition `query` finds at `docs` (the test server
/// answers a query with no page size whole, in one page).
async fn raw_query(
    http: &reqwest::Client,
    docs: &str,
    query: &str,
) -> Result<Vec<serde_json::Value>, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let found: serde_json::Value = http
        .post(docs)
        .header("x-ms-documentdb-isquery", "True")
        .header("x-ms-documentdb-query-enablecrosspartition", "True")
        .header("content-type", "application/query+json")
        .body(serde_json::json!({ "query": query }).to_string())
        .send()
        .await
        .map_err(|x| e(&x))?
        .json()
        .await
        .map_err(|x| e(&x))?;
    match found["Documents"].as_array() {
        Some(items) => Ok(items.clone()),
        None => Err(format!("the query {query:?} answered {found}")),
    }
}

/// How many items of each kind (`head`, `step`, `chunk`, `blob`,
/// `blob_manifest`, …) database `db` holds on the server, asked behind the
/// store's back.
pub async fn count_kinds(
    server: &(String, String),
    db: &str,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let (http, docs) = raw_items(server, db)?;
    let mut kinds = std::collections::BTreeMap::new();
    for item in raw_query(&http, &docs, "SELECT c.kind FROM c").await? {
        let kind = item["kind"].as_str().unwrap_or("(none)").to_string();
        *kinds.entry(kind).or_insert(0) += 1;
    }
    Ok(kinds)
}

/// Deletes every blob item (parts and manifests) of database `db` on the
/// server behind the store's back; the references stay. Says how many
/// blobs (their manifests) there were.
pub async fn lose_blobs(server: (String, String), db: String) -> Result<u64, String> {
    let (http, docs) = raw_items(&server, &db)?;
    let query =
        "SELECT c.id, c.pk, c.kind FROM c WHERE c.kind = 'blob' OR c.kind = 'blob_manifest'";
    let mut manifests = 0;
    for item in raw_query(&http, &docs, query).await? {
        let (Some(id), Some(pk)) = (item["id"].as_str(), item["pk"].as_str()) else {
            return Err(format!("a blob item without its id or key: {item}"));
        };
        if !delete_raw(&server, &db, pk, id).await? {
            return Err(format!("{id} was not there to delete"));
        }
        manifests += u64::from(item["kind"] == "blob_manifest");
    }
    Ok(manifests)
}

/// Deletes item `id` of partition `pk` of database `db` behind the store's
/// back (as a delete or an append cut short would leave it); says whether
/// it was there.
pub async fn delete_raw(
    server: &(String, String),
    db: &str,
    pk: &str,
    id: &str,
) -> Result<bool, String> {
    let (http, docs) = raw_items(server, db)?;
    let answer = http
        .delete(format!("{docs}/{id}"))
        .header(
            "x-ms-documentdb-partitionkey",
            serde_json::json!([pk]).to_string(),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    match answer.status().as_u16() {
        200..=299 => Ok(true),
        404 => Ok(false),
        s => Err(format!("deleting {id} answered {s}")),
    }
}

/// Replaces (or creates) `item` in database `db` behind the store's back:
/// damage, or a planted item, as the store would find it.
pub async fn upsert_raw(
    server: &(String, String),
    db: &str,
    item: &serde_json::Value,
) -> Result<(), String> {
    let (http, docs) = raw_items(server, db)?;
    let pk = item["pk"].as_str().ok_or("an item without its key")?;
    let answer = http
        .post(&docs)
        .header("content-type", "application/json")
        .header("x-ms-documentdb-is-upsert", "True")
        .header(
            "x-ms-documentdb-partitionkey",
            serde_json::json!([pk]).to_string(),
        )
        .body(item.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!(
            "upserting {} answered {}",
            item["id"],
            answer.status()
        ));
    }
    Ok(())
}

/// Every item of kind `kind` in database `db`, whole.
pub async fn items_of_kind(
    server: &(String, String),
    db: &str,
    kind: &str,
) -> Result<Vec<serde_json::Value>, String> {
    let (http, docs) = raw_items(server, db)?;
    raw_query(
        &http,
        &docs,
        &format!("SELECT * FROM c WHERE c.kind = '{kind}'"),
    )
    .await
}
