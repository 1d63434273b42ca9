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
