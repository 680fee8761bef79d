//! Dedicated connections: opened outside the pool, bounded by the connect timeout as a whole,
//! every failure classified with its cause.

use std::time::Duration;

use tokio_postgres::{Client, Connection, Socket};
use tracing::debug;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::tls::{Tls, TlsStream};

/// A connection that belongs to one owner and never returns to a pool, with the future that
/// drives it. The owner must spawn or poll the connection; dropping it closes the session.
pub type Dedicated = (Client, Connection<Socket, TlsStream>);

/// Opens a dedicated connection outside the pool, for sessions that must stay pinned, with the
/// session settings ([`Config::session_pg_config`]). Bounded by the connect timeout; every
/// failure is [`ErrorKind::Unavailable`] with the cause as source.
pub async fn connect(config: &Config) -> Result<Dedicated> {
    connect_with(
        &config.session_pg,
        &config.session_tls,
        config.connect_timeout,
        config.ignored_passfile.as_deref(),
    )
    .await
}

/// Opens a dedicated connection whose application_name says what it is for (`"<name> <role>"`,
/// for instance `pgcoord listener`), so it can be told apart in `pg_stat_activity`.
pub async fn connect_as(config: &Config, role: &str) -> Result<Dedicated> {
    let mut pg = config.session_pg.clone();
    let name = format!("{} {role}", pg.get_application_name().unwrap_or("pgcoord"));
    pg.application_name(&name);
    let passfile = config.ignored_passfile.as_deref();
    connect_with(&pg, &config.session_tls, config.connect_timeout, passfile).await
}

/// Connects with `pg`, the whole handshake (TCP, TLS, startup, authentication) bounded by
/// `timeout`: an endpoint that accepts TCP and then says nothing must not hang the caller.
/// `ignored_passfile` is the password file ignored for being readable by others, if it was.
pub(crate) async fn connect_with(
    pg: &tokio_postgres::Config,
    tls: &Tls,
    timeout: Duration,
    ignored_passfile: Option<&str>,
) -> Result<Dedicated> {
    match tokio::time::timeout(timeout, pg.connect(tls.clone())).await {
        Ok(Ok(connected)) => Ok(connected),
        Ok(Err(e)) => Err(connect_failed(pg, ignored_passfile, e)),
        Err(_) => Err(connect_timed_out(pg, timeout)),
    }
}

/// The error of a failed connect. A server that refuses us for a reason of its own keeps its
/// SQLSTATE's kind: [`ErrorKind::AuthenticationFailed`] (so is a password the server asks for
/// and the settings lack, which says so when the password file was ignored, `ignored_passfile`),
/// [`ErrorKind::DatabaseNotFound`]; a TLS handshake that failed on the certificate is
/// [`ErrorKind::Tls`], said plainly; everything else — refused, reset, not PostgreSQL at all —
/// is [`ErrorKind::Unavailable`].
pub(crate) fn connect_failed(
    pg: &tokio_postgres::Config,
    ignored_passfile: Option<&str>,
    e: tokio_postgres::Error,
) -> Error {
    let host = describe(pg);
    if let Some(failure) = crate::tls::handshake_failure(&e, host_name(&host)) {
        return Error::new(
            ErrorKind::Tls,
            format!("cannot connect to {host}: {failure}"),
        )
        .with_source(e);
    }
    // tokio-postgres says "error connecting to server" and keeps the reason (refused, reset,
    // an unexpected message) in its source: the message carries both.
    let mut reason = std::error::Error::source(&e)
        .map(|s| format!(": {s}"))
        .unwrap_or_default();
    // tokio-postgres's words when the server asks for a password the settings lack.
    let password_missing = pg.get_password().is_none() && reason == ": password missing";
    let kind = match crate::error::classify(&e) {
        ErrorKind::Other if password_missing => ErrorKind::AuthenticationFailed,
        ErrorKind::Other if e.code().is_none() => ErrorKind::Unavailable,
        kind => kind,
    };
    if let Some(path) = ignored_passfile
        && password_missing
    {
        reason = format!(
            "{reason} (the password file {path} was ignored: its permissions are too open, \
             group or others may read it; chmod 0600 it)"
        );
    }
    Error::new(kind, format!("cannot connect to {host}: {e}{reason}")).with_source(e)
}

/// The error of a connect that did not finish in time.
pub(crate) fn connect_timed_out(pg: &tokio_postgres::Config, timeout: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "cannot connect to {}: no answer within {timeout:?}",
            describe(pg)
        ),
    )
    .with_source(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// `host:port` of the first host, for error messages (never the password).
pub(crate) fn describe(pg: &tokio_postgres::Config) -> String {
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => match pg.get_hostaddrs().first() {
            Some(address) => address.to_string(),
            None => "localhost".to_owned(),
        },
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// The host part of [`describe`]'s `host:port`.
fn host_name(host_port: &str) -> &str {
    host_port
        .rsplit_once(':')
        .map_or(host_port, |(host, _)| host)
}

/// Opens a dedicated connection and drives it on a tokio task, logging how it ended. For
/// sessions that do not need the connection's asynchronous messages.
pub async fn connect_spawned(config: &Config) -> Result<Client> {
    let (client, connection) = connect(config).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "dedicated connection ended");
        }
    });
    Ok(client)
}

/// One round trip on a dedicated session (an advisory lock's, the listener's): whether it is
/// alive. [`ErrorKind::Timeout`] when unanswered within `timeout`, the connection's error when
/// it failed.
#[tracing::instrument(skip_all, level = "trace")]
pub async fn ping(client: &Client, timeout: Duration) -> Result<()> {
    match tokio::time::timeout(timeout, client.simple_query("")).await {
        Ok(result) => result.map(drop).map_err(Error::from),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("session did not answer a ping within {timeout:?}"),
        )),
    }
}
