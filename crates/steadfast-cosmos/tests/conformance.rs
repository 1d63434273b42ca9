//! The store conformance suite on `CosmosStore`, against the local Cosmos
//! protocol server, each check in a database of its own.

mod support;

use steadfast_conformance::{
    events_conformance, history_conformance, history_rewrite_conformance, store_conformance,
    Config, TestStore,
};
use steadfast_cosmos::CosmosOptions;

async fn make(cfg: Config) -> TestStore {
    let Some(server) = support::server() else {
        // Outside CI without a server: an empty memory store keeps the
        // check from failing for want of it (the skip is printed).
        return TestStore::new(steadfast_core::MemoryStore::with_state_limit(
            cfg.state_limit,
        ));
    };
    let db = support::TestDb::new(&server);
    let store = db
        .store(
            CosmosOptions::default()
                .max_state_bytes(cfg.state_limit)
                .blob_threshold(1024),
        )
        .await;
    let name = db.name().to_string();
    TestStore::with_guard(store, db)
        .with_blob_loss(move || lose_blobs(server.clone(), name.clone()))
}

/// Deletes every blob item (parts and manifests) of database `db` on the
/// server behind the store's back, with plain requests (the test server
/// checks no signature); the references stay. Says how many blobs (their
/// manifests) there were.
async fn lose_blobs(server: (String, String), db: String) -> Result<u64, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let tls = steadfast_core::store::tls::verified(Some(&server.1), "the Cosmos test server")
        .map_err(|x| e(&x))?;
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .map_err(|x| e(&x))?;
    let base = server.0.replacen("cosmos://", "https://", 1);
    let docs = format!("{base}/dbs/{db}/colls/runs/docs");
    let found: serde_json::Value = http
        .post(&docs)
        .header("x-ms-documentdb-isquery", "True")
        .header("x-ms-documentdb-query-enablecrosspartition", "True")
        .header("content-type", "application/query+json")
        .body(
            serde_json::json!({"query": "SELECT c.id, c.pk, c.kind FROM c \
                WHERE c.kind = 'blob' OR c.kind = 'blob_manifest'"})
            .to_string(),
        )
        .send()
        .await
        .map_err(|x| e(&x))?
        .json()
        .await
        .map_err(|x| e(&x))?;
    let items = found["Documents"]
        .as_array()
        .ok_or_else(|| format!("the query for blob items answered {found}"))?;
    let mut manifests = 0;
    for item in items {
        let (Some(id), Some(pk)) = (item["id"].as_str(), item["pk"].as_str()) else {
            return Err(format!("a blob item without its id or key: {item}"));
        };
        let answer = http
            .delete(format!("{docs}/{id}"))
            .header(
                "x-ms-documentdb-partitionkey",
                serde_json::json!([pk]).to_string(),
            )
            .send()
            .await
            .map_err(|x| e(&x))?;
        if !answer.status().is_success() {
            return Err(format!("deleting {id} answered {}", answer.status()));
        }
        manifests += u64::from(item["kind"] == "blob_manifest");
    }
    Ok(manifests)
}

store_conformance!(make);
history_conformance!(make);
history_rewrite_conformance!(make);
events_conformance!(make);

/// The same suite through the encryption seal: sealing changes nothing the
/// store promises.
mod sealed {
    use super::*;

    async fn make(cfg: Config) -> TestStore {
        let keys =
            steadfast_seal::Keyring::parse("k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")
                .expect("a test key");
        let Some(server) = support::server() else {
            return TestStore::new(steadfast_core::MemoryStore::with_state_limit(
                cfg.state_limit,
            ));
        };
        let db = support::TestDb::new(&server);
        let store = db
            .store(
                CosmosOptions::default()
                    .max_state_bytes(cfg.state_limit * 2)
                    .blob_threshold(1024),
            )
            .await;
        let sealed = steadfast_seal::SealedStore::new(std::sync::Arc::new(store), keys)
            .max_state_bytes(cfg.state_limit);
        let name = db.name().to_string();
        TestStore::with_guard(sealed, db)
            .with_blob_loss(move || lose_blobs(server.clone(), name.clone()))
    }

    store_conformance!(make);
    history_conformance!(make);
    history_rewrite_conformance!(make);
    events_conformance!(make);
}
