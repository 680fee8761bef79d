//! The rustls side: root certificates, the certificate check each [`SslMode`] asks for, and
//! plain words for what a failed handshake means.
//!
//! rustls verifies everything or nothing by default; libpq's modes sit between. `prefer` and
//! `require` encrypt without checking the certificate (the handshake's signatures are still
//! checked, so the peer holds the certificate's key); `verify-ca` checks the chain to a trusted
//! root but not the host name; `verify-full` checks both.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::{ClientCert, RootCerts, SslMode};
use crate::error::{Error, ErrorKind, Result};

/// The ALPN protocol PostgreSQL 17 names; servers before 17 ignore it, 17 and later require it
/// for direct TLS negotiation (`sslnegotiation=direct`).
const ALPN: &[u8] = b"postgresql";

/// One crypto provider for pgcoord's connections, named here rather than taken from the
/// process-wide default, so an application that links another provider changes nothing.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration for `mode` (which is not `disable`) with `roots`.
pub(super) fn client_config(
    mode: SslMode,
    roots: Option<RootCerts>,
    client_cert: Option<ClientCert>,
) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(load_roots(roots)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| invalid(format!("cannot verify with these root certificates: {e}")))?;
            match mode {
                SslMode::VerifyCa => Arc::new(ChainOnly(webpki)),
                _ => webpki,
            }
        }
        _ => Arc::new(Unverified(provider.clone())),
    };
    build(provider, verifier, client_cert)
}

/// A configuration that encrypts without verifying the certificate.
pub(super) fn unverified(client_cert: Option<ClientCert>) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    build(
        provider.clone(),
        Arc::new(Unverified(provider)),
        client_cert,
    )
}

fn build(
    provider: Arc<CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
    client_cert: Option<ClientCert>,
) -> Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(client) => {
            let (chain, key) = read_client_cert(&client)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                invalid(format!(
                    "the client certificate {} and key {}: {e}",
                    client.cert.display(),
                    client.key.display()
                ))
            })?
        }
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// The trusted roots: the file given; without one, libpq's `~/.postgresql/root.crt` when it
/// exists, else the operating system's store.
fn load_roots(roots: Option<RootCerts>) -> Result<RootCertStore> {
    let roots = roots.unwrap_or_else(|| match default_root_file() {
        Some(path) => RootCerts::File(path),
        None => RootCerts::System,
    });
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            for cert in read_pem(&path, "root certificates")? {
                store
                    .add(cert)
                    .map_err(|e| invalid(format!("root certificate in {}: {e}", path.display())))?;
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(invalid(format!(
                    "no root certificates found in the system's store ({}); give a file with sslrootcert",
                    errors.join("; ")
                )));
            }
        }
    }
    Ok(store)
}

/// The client certificate chain and its key (see `key::load`).
fn read_client_cert(
    client: &ClientCert,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = read_pem(&client.cert, "the client certificate")?;
    let key = super::key::load(&client.key, client.password.as_ref())?;
    Ok((chain, key))
}

fn default_root_file() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("HOME")?).join(".postgresql/root.crt");
    path.is_file().then_some(path)
}

/// The certificates in the PEM file `path`; `what` names them in errors.
fn read_pem(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let unreadable = |e: &dyn std::fmt::Display| {
        invalid(format!("cannot read {what} from {}: {e}", path.display()))
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(&e))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| unreadable(&e))?;
    if certs.is_empty() {
        return Err(unreadable(&"no PEM certificate in the file"));
    }
    Ok(certs)
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, message)
}

/// What a rustls error in a handshake with `host` means, for an error message.
pub(super) fn explain(error: &rustls::Error, host: &str) -> String {
    use CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "the server's certificate is not signed by a trusted root certificate (see sslrootcert)"
                .to_owned()
        }
        rustls::Error::InvalidCertificate(C::NotValidForName) => {
            format!("the server's certificate is not valid for {host}")
        }
        rustls::Error::InvalidCertificate(C::NotValidForNameContext { presented, .. }) => {
            let names: Vec<&str> = presented.iter().map(|name| plain_name(name)).collect();
            format!(
                "the server's certificate is not valid for {host} (it is for {})",
                names.join(", ")
            )
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the server's certificate has expired".to_owned()
        }
        other => format!("TLS handshake failed: {other}"),
    }
}

/// `localhost` of rustls's `DnsName("localhost")`, `127.0.0.1` of `IpAddress(127.0.0.1)`.
fn plain_name(presented: &str) -> &str {
    let inner = presented
        .strip_prefix("DnsName(")
        .or_else(|| presented.strip_prefix("IpAddress("))
        .and_then(|rest| rest.strip_suffix(')'));
    match inner {
        Some(name) => name.trim_matches('"'),
        None => presented,
    }
}

/// `prefer` and `require`: any certificate, but the handshake's signatures checked.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
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
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
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

/// `verify-ca`: the chain to a trusted root is checked (webpki checks it before the name), the
/// host name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
