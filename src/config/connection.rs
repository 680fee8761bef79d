//! Connection settings: what the builder was told (a DSN or a `tokio_postgres::Config`), and
//! what pgcoord applies to every connection it makes — the pool's and the sessions'.

use std::str::FromStr;
use std::time::Duration;

use crate::error::Result;
use crate::tls::{ClientCert, RootCerts, SslMode, TlsRequest};

/// Where a connection goes, as the builder was told.
pub(super) enum Connection {
    Unset,
    Dsn(String),
    Pg(Box<tokio_postgres::Config>),
}

/// What every connection's settings get from the builder.
pub(super) struct Settings<'a> {
    pub(super) application_name: Option<&'a str>,
    pub(super) connect_timeout: Duration,
    pub(super) lease: Duration,
    pub(super) tcp_user_timeout: Option<Duration>,
}

impl Settings<'_> {
    /// The connection settings `connection` names, with pgcoord's application_name, connect
    /// timeout, keepalives and TCP_USER_TIMEOUT applied; the connect timeout in force; and the
    /// TLS settings it carries (a DSN's `sslmode` and `sslrootcert`, which tokio-postgres does
    /// not fully parse, or a `tokio_postgres::Config`'s mode), for the builder's to override.
    pub(super) fn apply(
        &self,
        connection: Connection,
    ) -> Result<(tokio_postgres::Config, Duration, TlsRequest)> {
        let mut tls = TlsRequest::default();
        let mut pg = match connection {
            Connection::Unset => unreachable!("callers handle an unset connection"),
            Connection::Dsn(dsn) => {
                let (rest, options) = super::dsn::take_tls_options(&dsn)?;
                tls.mode = options.sslmode.as_deref().map(str::parse).transpose()?;
                tls.roots = options.sslrootcert.as_deref().map(RootCerts::parse);
                tls.client_cert = ClientCert::given(options.sslcert, options.sslkey);
                let mut pg = tokio_postgres::Config::from_str(&rest)
                    .map_err(|e| super::dsn::refused(&rest, e))?;
                // As libpq: a DSN that names no password takes the password file's.
                if pg.get_password().is_none()
                    && let Some(password) = super::env::password_for_dsn(&pg)
                {
                    pg.password(password);
                }
                pg
            }
            Connection::Pg(pg) => {
                // Prefer is both the default and what "not said" means.
                tls.mode = match pg.get_ssl_mode() {
                    tokio_postgres::config::SslMode::Disable => Some(SslMode::Disable),
                    tokio_postgres::config::SslMode::Require => Some(SslMode::Require),
                    _ => None,
                };
                *pg
            }
        };
        match self.application_name {
            Some(name) => {
                pg.application_name(name);
            }
            None if pg.get_application_name().is_none() => {
                pg.application_name("pgcoord");
            }
            None => {}
        }
        let connect_timeout = match pg.get_connect_timeout() {
            Some(timeout) => *timeout,
            None => {
                pg.connect_timeout(self.connect_timeout);
                self.connect_timeout
            }
        };
        // Keepalives find a peer that vanished while the connection is idle; TCP_USER_TIMEOUT
        // one that vanished while data is in flight (keepalives do not fire then). Both scale
        // with the lease, so a half-open connection is noticed well within it.
        let clamp = |d: Duration| d.clamp(Duration::from_secs(1), Duration::from_secs(30));
        pg.keepalives(true)
            .keepalives_idle(clamp(self.lease / 4))
            .keepalives_interval(clamp(self.lease / 8))
            .keepalives_retries(3)
            .tcp_user_timeout(self.tcp_user_timeout.unwrap_or(clamp(self.lease / 2)));
        Ok((pg, connect_timeout, tls))
    }
}
