//! What the PostgreSQL tests share: the server's URL and a schema of their
//! own per test, dropped afterwards.
#![allow(dead_code)]

use steadfast_postgres::{PgOptions, PgStore};

/// The server the tests use: `$STEADFAST_TEST_PG`, else the local one that
/// CI starts. A test never skips for want of it: it fails, naming the URL.
pub fn server_url() -> String {
    std::env::var("STEADFAST_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A fresh schema name.
pub fn fresh_schema() -> String {
    format!("t_{:016x}", fastrand::u64(..))
}

/// The URL of `schema` on the test server.
pub fn url_with_schema(schema: &str) -> String {
    let base = server_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}schema={schema}")
}

/// Drops its schema when dropped (on a thread of its own, since the test's
/// runtime may be gone by then).
pub struct DropSchema(pub String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        // Straight SQL, not the store: a test may have left the schema in a
        // state the store refuses to open (foreign tables, a newer version).
        let schema = self.0.clone();
        steadfast_conformance::block_on_own_thread(move || async move {
            if let Ok((client, conn)) =
                tokio_postgres::connect(&server_url(), tokio_postgres::NoTls).await
            {
                tokio::spawn(conn);
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
            }
        });
    }
}

/// A store in a fresh schema, and the guard that drops it.
pub async fn fresh_store(opts: PgOptions) -> (PgStore, DropSchema) {
    let schema = fresh_schema();
    let url = url_with_schema(&schema);
    let store = PgStore::connect_with(&url, opts).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL at {} (set STEADFAST_TEST_PG): {e}",
            server_url()
        )
    });
    (store, DropSchema(schema))
}
