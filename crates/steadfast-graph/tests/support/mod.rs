//! What the graph crate's tests share.

/// Drops a PostgreSQL test schema (and every table in it), named in `url`
/// as `schema=NAME`; quietly does nothing when the server cannot be had.
pub fn drop_schema(url: &str, schema: &str) {
    let base = url
        .split("schema=")
        .next()
        .unwrap_or(url)
        .trim_end_matches(['?', '&']);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        if let Ok((client, conn)) = tokio_postgres::connect(base, tokio_postgres::NoTls).await {
            tokio::spawn(conn);
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await;
        }
    });
}
