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

/// The connect timeout when neither the connection settings, the builder nor the environment
/// give one.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What every connection's settings get from the builder, and the environment DSNs are
/// completed from.
pub(super) struct Settings<'a> {
    pub(super) application_name: Option<&'a str>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) lease: Duration,
    pub(super) tcp_user_timeout: Option<Duration>,
    /// An environment variable by name (the process's, but for tests).
    pub(super) var: &'a dyn Fn(&str) -> Option<String>,
}

/// One connection's settings, as [`Settings::apply`] leaves them.
pub(super) struct Applied {
    pub(super) pg: tokio_postgres::Config,
    /// The connect timeout in force.
    pub(super) connect_timeout: Duration,
    /// The TLS the settings ask for, for the builder's to override.
    pub(super) tls: TlsRequest,
    /// The password file, when it was needed and ignored for being readable by others.
    pub(super) ignored_passfile: Option<String>,
}

impl Settings<'_> {
    /// The connection settings `connection` names — a DSN completed from the environment as
    /// libpq completes it (`merge::merge`) — with pgcoord's application_name, connect timeout,
    /// keepalives and TCP_USER_TIMEOUT applied, and the TLS settings they carry (a DSN's
    /// `ssl*` options, which tokio-postgres does not fully parse, or a
    /// `tokio_postgres::Config`'s mode).
    pub(super) fn apply(&self, connection: Connection) -> Result<Applied> {
        let mut tls = TlsRequest::default();
        let mut ignored_passfile = None;
        let (mut pg, own_timeout) = match connection {
            Connection::Unset => unreachable!("callers handle an unset connection"),
            Connection::Dsn(dsn) => {
                let (rest, mut options) = super::dsn::take_tls_options(&dsn)?;
                let mut pg = tokio_postgres::Config::from_str(&rest)
                    .map_err(|e| super::dsn::refused(&rest, e))?;
                let own_timeout = pg.get_connect_timeout().copied();
                ignored_passfile =
                    super::merge::merge(&mut pg, &mut options, self.var, super::passfile::load)?;
                tls.mode = options.sslmode.as_deref().map(str::parse).transpose()?;
                tls.roots = options.sslrootcert.as_deref().map(RootCerts::parse);
                tls.client_cert =
                    ClientCert::given(options.sslcert, options.sslkey, options.sslpassword);
                (pg, own_timeout)
            }
            Connection::Pg(pg) => {
                // Prefer is both the default and what "not said" means.
                tls.mode = match pg.get_ssl_mode() {
                    tokio_postgres::config::SslMode::Disable => Some(SslMode::Disable),
                    tokio_postgres::config::SslMode::Require => Some(SslMode::Require),
                    _ => None,
                };
                let own_timeout = pg.get_connect_timeout().copied();
                (*pg, own_timeout)
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
        // The connection settings' own, else the builder's, else the environment's.
        let connect_timeout = (own_timeout.or(self.connect_timeout))
            .or(pg.get_connect_timeout().copied())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        pg.connect_timeout(connect_timeout);
        // Keepalives find a peer that vanished while the connection is idle; TCP_USER_TIMEOUT
        // one that vanished while data is in flight (keepalives do not fire then). Both scale
        // with the lease, so a half-open connection is noticed well within it.
        let clamp = |d: Duration| d.clamp(Duration::from_secs(1), Duration::from_secs(30));
        pg.keepalives(true)
            .keepalives_idle(clamp(self.lease / 4))
            .keepalives_interval(clamp(self.lease / 8))
            .keepalives_retries(3)
            .tcp_user_timeout(self.tcp_user_timeout.unwrap_or(clamp(self.lease / 2)));
        Ok(Applied {
            pg,
            connect_timeout,
            tls,
            ignored_passfile,
        })
    }
}
