//! Store URLs (`postgres://…`, `postgresql://…`) and TLS through rustls.
//!
//! The URL is libpq's, with Steadfast's own parameters taken out before the
//! driver sees it: `schema` (default `steadfast`), `blob_threshold` (the
//! size above which a value is stored once as a blob), and `sslmode` and
//! `sslrootcert`, which are handled here because the driver knows only
//! `disable`, `prefer` and `require`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use steadfast_core::StoreError;
use tokio_postgres::config::SslMode;

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "steadfast";

/// What a store URL says.
pub(crate) struct Parsed {
    pub config: tokio_postgres::Config,
    pub schema: String,
    /// `blob_threshold=SIZE`, checked.
    pub blob_threshold: Option<u64>,
    pub tls: Tls,
    /// The URL without its password, for messages.
    pub display: String,
}

/// How the connection is secured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tls {
    /// `sslmode=disable`.
    Off,
    /// `prefer` (the default) and `require`: encrypted when (`prefer`) or
    /// because (`require`) the server offers it, the certificate unchecked,
    /// as libpq does.
    Unverified,
    /// `verify-full`: the certificate must chain to a trusted root (the
    /// `sslrootcert` file, else the Mozilla roots) and name the host.
    Verified { root_cert: Option<String> },
}

pub(crate) fn parse(url: &str) -> Result<Parsed, StoreError> {
    let bad = |why: String| StoreError::InvalidInput(format!("store URL: {why}"));
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut schema = DEFAULT_SCHEMA.to_string();
    let mut mode = "prefer".to_string();
    let mut root_cert = None;
    let mut blob_threshold = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "schema" => schema = v.to_string(),
            "sslmode" => mode = v.to_string(),
            "sslrootcert" => root_cert = Some(v.to_string()),
            "blob_threshold" => {
                blob_threshold = Some(
                    steadfast_core::store::blob::parse_size(v)
                        .map_err(|e| match e {
                            StoreError::InvalidInput(why) => bad(format!("blob_threshold: {why}")),
                            other => other,
                        })?,
                );
            }
            "options" => {
                return Err(bad(
                    "the `options` parameter is not taken (settings such as search_path would not survive a connection pooler); use ?schema=NAME".into(),
                ))
            }
            _ => rest.push(pair),
        }
    }
    crate::schema::check_schema_name(&schema)?;
    let (tls, ssl_mode) = match mode.as_str() {
        "disable" => (Tls::Off, SslMode::Disable),
        "prefer" | "allow" => (Tls::Unverified, SslMode::Prefer),
        "require" => (Tls::Unverified, SslMode::Require),
        "verify-full" => (Tls::Verified { root_cert }, SslMode::Require),
        "verify-ca" => return Err(bad(
            "sslmode=verify-ca is not supported; use verify-full, which also checks the host name"
                .into(),
        )),
        other => {
            return Err(bad(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-full"
            )))
        }
    };
    let driver_url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config: tokio_postgres::Config = driver_url.parse().map_err(|e| bad(format!("{e}")))?;
    config.ssl_mode(ssl_mode);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(std::time::Duration::from_secs(10));
    }
    // A server that vanished without closing the connection (a half-open
    // TCP connection) would otherwise hold every save of the process for the
    // kernel's retransmission timeout, about a quarter of an hour.
    if config.get_keepalives_idle() == std::time::Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(std::time::Duration::from_secs(30));
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(std::time::Duration::from_secs(30));
    }
    config.application_name("steadfast");
    let display = redact(url);
    Ok(Parsed {
        config,
        schema,
        blob_threshold,
        tls,
        display,
    })
}

/// The URL with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    steadfast_core::store::redact_url(url)
}

/// The rustls connector for `tls`.
pub(crate) fn connector(tls: &Tls) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    let config = match tls {
        Tls::Off | Tls::Unverified => {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            steadfast_core::store::tls::builder()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth()
        }
        Tls::Verified { root_cert } => {
            steadfast_core::store::tls::verified(root_cert.as_deref(), "sslrootcert")?
        }
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Accepts any server certificate, as libpq's `require` does: the link is
/// encrypted against eavesdroppers, not authenticated. The handshake's
/// signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steadfast_parameters_are_taken_out() -> Result<(), StoreError> {
        let p = parse(
            "postgres://u:secret@127.0.0.1:5432/test?schema=s1&sslmode=require&connect_timeout=3",
        )?;
        assert_eq!(p.schema, "s1");
        assert_eq!(p.tls, Tls::Unverified);
        assert_eq!(p.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(p.config.get_dbname(), Some("test"));
        assert_eq!(
            p.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        assert!(!p.display.contains("secret"), "{}", p.display);
        let d = parse("postgresql://127.0.0.1/test")?;
        assert_eq!(d.schema, DEFAULT_SCHEMA);
        assert_eq!(d.tls, Tls::Unverified);
        assert_eq!(d.blob_threshold, None);
        let b = parse("postgres://h/db?blob_threshold=1MiB&schema=s2")?;
        assert_eq!((b.blob_threshold, b.schema.as_str()), (Some(1 << 20), "s2"));
        let v = parse("postgres://h/db?sslmode=verify-full&sslrootcert=/x.pem")?;
        assert_eq!(
            v.tls,
            Tls::Verified {
                root_cert: Some("/x.pem".into())
            }
        );
        Ok(())
    }

    /// A primary and its standby in one URL: the driver tries the hosts in
    /// order and keeps the one that takes writes (scripts/faults/pg-failover.sh
    /// runs workers through such a URL while the primary fails over).
    #[test]
    fn several_hosts_and_the_writable_one_are_taken() -> Result<(), StoreError> {
        use tokio_postgres::config::{Host, TargetSessionAttrs};
        let p = parse(
            "postgres://u:pw@10.0.0.1:5441,10.0.0.2:5442/db?target_session_attrs=read-write&schema=s",
        )?;
        assert_eq!(
            p.config.get_hosts(),
            [Host::Tcp("10.0.0.1".into()), Host::Tcp("10.0.0.2".into())]
        );
        assert_eq!(p.config.get_ports(), [5441, 5442]);
        assert_eq!(
            p.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(p.schema, "s");
        assert!(!p.display.contains("pw"), "{}", p.display);
        Ok(())
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("postgres://h/db?schema=Bad-Name", "schema name"),
            ("postgres://h/db?sslmode=verify-ca", "verify-ca"),
            ("postgres://h/db?sslmode=sometimes", "sslmode"),
            ("postgres://h/db?options=-csearch_path%3Dx", "options"),
            ("postgres://h:notaport/db", "store URL"),
            ("postgres://h/db?blob_threshold=12", "out of range"),
            ("postgres://h/db?blob_threshold=2GiB", "out of range"),
            ("postgres://h/db?blob_threshold=1MB", "not a size"),
        ] {
            let e = parse(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://u:pw@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("postgres://u@h/db?password=pw&x=1"),
            "postgres://u@h/db?password=***&x=1"
        );
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
        // The driver takes everything up to the first `@` as user and password.
        assert_eq!(
            redact("postgres://app:pa/ss@db/prod"),
            "postgres://app:***@db/prod"
        );
    }
}
