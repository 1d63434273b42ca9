//! The TLS client settings of network stores (the `tls` feature): rustls
//! with the ring provider, and the roots a store trusts.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

use crate::record::error::StoreError;

/// A TLS client configuration builder with the ring provider and safe
/// protocol versions, for a store to finish (roots or a verifier of its own).
pub fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, StoreError> {
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unsupported(format!("TLS: {e}")))
}

/// A TLS client that checks the server's certificate against the PEM
/// certificates of `ca_file` (which messages call `what`, the URL parameter
/// that named it), or the Mozilla roots when none is named. A file that
/// cannot be read or holds no certificate is refused.
pub fn verified(ca_file: Option<&str>, what: &str) -> Result<ClientConfig, StoreError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let bad =
                |e: &dyn std::fmt::Display| StoreError::InvalidInput(format!("{what} {path}: {e}"));
            let pem = std::fs::read(path)
                .map_err(|e| StoreError::io(format!("reading {what} {path}"), e))?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
            if roots.is_empty() {
                return Err(bad(&"holds no PEM certificate"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(builder()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
