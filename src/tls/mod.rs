//! TLS: whether a connection encrypts and what it verifies (libpq's `sslmode` and
//! `sslrootcert`), the client certificate it shows when the server asks (`sslcert`, `sslkey`,
//! and `sslpassword` for an encrypted key), and [`Tls`], the connector every connection pgcoord opens is given — the
//! pool's, dedicated sessions', the listener's and cancel requests'.
//!
//! With the `tls` feature (on by default) connections use rustls, with the ring crypto provider
//! and no OpenSSL; without it, a configuration that needs TLS is refused when it is built.

use std::fmt;
use std::str::FromStr;

use tokio_postgres::Socket;
use tokio_postgres::tls::MakeTlsConnect;

use crate::error::{Error, ErrorKind, Result};

#[cfg(feature = "tls")]
mod key;
#[cfg(feature = "tls")]
mod verify;

#[cfg(feature = "tls")]
type Connector = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "tls"))]
type Connector = tokio_postgres::NoTls;

/// What a connection's stream is: TLS over a socket with the `tls` feature, the plain socket
/// without.
pub type TlsStream = <Connector as MakeTlsConnect<Socket>>::Stream;

/// Whether connections encrypt and what they verify, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Never encrypt.
    Disable,
    /// Encrypt when the server offers TLS, without verifying its certificate; plain otherwise.
    /// libpq's default, and pgcoord's.
    Prefer,
    /// Always encrypt; fail when the server does not offer TLS. The certificate is not verified
    /// unless a root certificate file is given (then as [`VerifyCa`](Self::VerifyCa), as libpq).
    Require,
    /// Always encrypt, and verify that the server's certificate is signed by a trusted root.
    VerifyCa,
    /// As [`VerifyCa`](Self::VerifyCa), and verify that the certificate is for the host connected
    /// to. What a connection over an untrusted network should use.
    VerifyFull,
}

impl SslMode {
    /// libpq's name of the mode (`verify-full`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the server's certificate is checked against root certificates.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// What tokio-postgres is told: whether to ask for TLS and whether to insist on it.
    fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

impl FromStr for SslMode {
    type Err = Error;

    /// libpq's names; `allow` is not supported (it falls back to plain text only after a
    /// plain connection was refused, which tokio-postgres cannot do).
    fn from_str(mode: &str) -> Result<SslMode> {
        Ok(match mode {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                    ),
                ));
            }
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where trusted root certificates come from, as libpq's `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCerts {
    /// A PEM file of one or more certificates.
    File(std::path::PathBuf),
    /// The operating system's store (`sslrootcert=system`).
    System,
}

impl RootCerts {
    pub(crate) fn parse(value: &str) -> RootCerts {
        match value {
            "system" => RootCerts::System,
            path => RootCerts::File(path.into()),
        }
    }
}

/// A secret setting (`sslpassword`): shown as `_` when debug-printed, as tokio-postgres shows
/// a password, so that no printed configuration carries it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("_")
    }
}

/// A client certificate and its private key (PEM files), as libpq's `sslcert` and `sslkey`,
/// with `sslpassword` for a key encrypted as PKCS#8: the server may ask for one
/// (`clientcert=verify-ca|verify-full` or the `cert` method in `pg_hba.conf`). Either file not
/// given means libpq's `~/.postgresql/postgresql.crt` or `.key`; no certificate file at all
/// means none is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientCert {
    pub(crate) cert: std::path::PathBuf,
    pub(crate) key: std::path::PathBuf,
    pub(crate) password: Option<Secret>,
}

impl ClientCert {
    /// The DSN's `sslcert`, `sslkey` and `sslpassword`, with libpq's defaults for the files not
    /// given; `None` when there is no certificate file to send.
    pub(crate) fn given(
        cert: Option<String>,
        key: Option<String>,
        password: Option<Secret>,
    ) -> Option<ClientCert> {
        let default = |file: &str| {
            std::env::var_os("HOME")
                .map(|home| std::path::Path::new(&home).join(".postgresql").join(file))
        };
        let cert = match cert {
            Some(cert) => std::path::PathBuf::from(cert),
            None => default("postgresql.crt").filter(|path| path.is_file())?,
        };
        let key = key
            .map(std::path::PathBuf::from)
            .or_else(|| default("postgresql.key"))?;
        Some(ClientCert {
            cert,
            key,
            password,
        })
    }
}

/// What one endpoint's connections were told about TLS, from the DSN and from the builder; the
/// builder's settings win.
#[derive(Default)]
pub(crate) struct TlsRequest {
    pub(crate) mode: Option<SslMode>,
    pub(crate) roots: Option<RootCerts>,
    pub(crate) client_cert: Option<ClientCert>,
    #[cfg(feature = "tls")]
    pub(crate) client_config: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl TlsRequest {
    /// The mode in force, after libpq's rules: no mode given means `prefer` (`verify-full`
    /// with the system's roots, which refuse anything weaker); `require` with a root
    /// certificate file verifies like `verify-ca`; a rustls configuration of the caller's means
    /// `require` unless a mode says otherwise.
    fn mode(&self) -> Result<SslMode> {
        #[cfg(feature = "tls")]
        let custom = self.client_config.is_some();
        #[cfg(not(feature = "tls"))]
        let custom = false;
        Ok(match (self.mode, &self.roots) {
            (None, Some(RootCerts::System)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCerts::System)) if mode != SslMode::VerifyFull => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "sslmode={mode} may not be used with sslrootcert=system: use verify-full"
                    ),
                ));
            }
            (Some(SslMode::Require), Some(RootCerts::File(_))) => SslMode::VerifyCa,
            (Some(mode), _) => mode,
            (None, _) if custom => SslMode::Require,
            (None, _) => SslMode::Prefer,
        })
    }

    /// The mode in force ([`mode`](Self::mode)) and the connector that implements it, root
    /// certificates loaded. `pg` is told whether to ask for TLS and whether to insist.
    pub(crate) fn resolve(self, pg: &mut tokio_postgres::Config) -> Result<Tls> {
        let mut mode = self.mode()?;
        if pg.get_hosts().is_empty() {
            // tokio-postgres does no TLS handshake without a host name (it refuses one to a
            // `hostaddr` alone, even under `prefer`).
            match mode {
                SslMode::Disable => {}
                // What `prefer` meant before TLS was built in: plain.
                SslMode::Prefer => mode = SslMode::Disable,
                mode => {
                    return Err(Error::new(
                        ErrorKind::InvalidConfig,
                        format!(
                            "sslmode={mode} needs the server's host name: give host= (with \
                             hostaddr= for the address to connect to)"
                        ),
                    ));
                }
            }
        }
        pg.ssl_mode(mode.negotiation());
        #[cfg(feature = "tls")]
        let connector = {
            let config = match self.client_config {
                Some(config) => config,
                None if mode == SslMode::Disable => verify::unverified(None)?,
                None => verify::client_config(mode, self.roots, self.client_cert)?,
            };
            tokio_postgres_rustls::MakeRustlsConnect::new((*config).clone())
        };
        #[cfg(not(feature = "tls"))]
        let connector = match mode {
            SslMode::Disable | SslMode::Prefer => tokio_postgres::NoTls,
            mode => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "sslmode={mode} needs TLS, and pgcoord was built without its `tls` feature"
                    ),
                ));
            }
        };
        Ok(Tls { mode, connector })
    }
}

/// The TLS connector of one endpoint's connections ([`Config::tls`](crate::Config::tls)): pass
/// it wherever tokio-postgres wants a `MakeTlsConnect`, for instance to build a bb8-postgres pool
/// to share with pgcoord. Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    mode: SslMode,
    connector: Connector,
}

impl Tls {
    /// The mode in force, after the DSN's and the builder's settings.
    pub fn mode(&self) -> SslMode {
        self.mode
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish()
    }
}

impl MakeTlsConnect<Socket> for Tls {
    type Stream = TlsStream;
    type TlsConnect = <Connector as MakeTlsConnect<Socket>>::TlsConnect;
    type Error = <Connector as MakeTlsConnect<Socket>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        MakeTlsConnect::<Socket>::make_tls_connect(&mut self.connector, domain)
    }
}

/// What failed in a TLS handshake, said plainly, when `error` (a failed connect) was one: the
/// server's certificate not trusted or not for this host, or no TLS on a server that must
/// offer it. `None` for every other failure, including a connection reset mid-handshake.
pub(crate) fn handshake_failure(error: &tokio_postgres::Error, host: &str) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        // io::Error's `source` skips the error it wraps; `get_ref` is that error.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        #[cfg(feature = "tls")]
        for candidate in [Some(e), inner].into_iter().flatten() {
            if let Some(rustls) = candidate.downcast_ref::<rustls::Error>() {
                return Some(verify::explain(rustls, host));
            }
        }
        if e.to_string() == "server does not support TLS" {
            return Some("the server does not offer TLS, and sslmode requires it".into());
        }
        cause = inner.or_else(|| e.source());
    }
    let _ = host;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(mode: Option<SslMode>, roots: Option<&str>) -> Result<SslMode> {
        TlsRequest {
            mode,
            roots: roots.map(RootCerts::parse),
            ..TlsRequest::default()
        }
        .mode()
    }

    #[test]
    fn libpq_rules_decide_the_mode_in_force() {
        use SslMode::*;
        assert_eq!(mode(None, None).unwrap(), Prefer);
        assert_eq!(mode(Some(Disable), None).unwrap(), Disable);
        assert_eq!(mode(Some(Require), None).unwrap(), Require);
        assert_eq!(mode(Some(Require), Some("/ca.pem")).unwrap(), VerifyCa);
        assert_eq!(mode(Some(VerifyFull), Some("/ca.pem")).unwrap(), VerifyFull);
        assert_eq!(mode(None, Some("system")).unwrap(), VerifyFull);
        assert_eq!(mode(Some(VerifyFull), Some("system")).unwrap(), VerifyFull);
        for weak in [Disable, Prefer, Require, VerifyCa] {
            let e = mode(Some(weak), Some("system")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        }
    }

    #[test]
    fn modes_parse_from_and_print_as_libpq_names() {
        for name in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            assert_eq!(name.parse::<SslMode>().unwrap().to_string(), name);
        }
        let e = "allow".parse::<SslMode>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    }
}
