//! Connections: the shared pool, dedicated sessions, and the retry of transient conflicts.
//!
//! Two kinds of connection exist on purpose. Statements that need no session state (acquire,
//! renew, release, inspect, notify) borrow from a bb8 pool. Anything that lives in a session —
//! an advisory lock, a LISTEN — gets a dedicated connection that nobody else borrows: a pooled
//! session would hand its locks to the next borrower, and bb8 drops notifications.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Connection, NoTls, Socket};
use tracing::{debug, warn};

use crate::config::{Config, random_u64};
use crate::error::{Error, ErrorKind, Result};

/// The connection pool pgcoord's statements run on; its connections keep pgcoord's statements
/// prepared (see [`crate::statement`]).
pub type Pool = bb8::Pool<crate::statement::Manager>;

/// A connection that belongs to one owner and never returns to a pool, with the future that
/// drives it. The owner must spawn or poll the connection; dropping it closes the session.
pub type Dedicated = (Client, Connection<Socket, NoTlsStream>);

/// How many times [`retry`] runs an operation that keeps hitting serialization failures or
/// deadlocks.
pub const RETRY_ATTEMPTS: u32 = 5;

/// Builds the pool from the configuration. Connections are opened lazily, on first use.
pub fn pool(config: &Config) -> Pool {
    let manager = crate::statement::Manager::new(config.pg.clone());
    bb8::Pool::builder()
        .max_size(config.pool_size)
        .connection_timeout(config.pool_timeout)
        .test_on_check_out(false)
        .build_unchecked(manager)
}

/// Opens a dedicated connection outside the pool, for sessions that must stay pinned.
pub async fn connect(config: &Config) -> Result<Dedicated> {
    let (client, connection) = config.pg.connect(NoTls).await?;
    Ok((client, connection))
}

/// Opens a dedicated connection whose application_name says what it is for (`"<name> <role>"`,
/// for instance `pgcoord listener`), so it can be told apart in `pg_stat_activity`.
pub async fn connect_as(config: &Config, role: &str) -> Result<Dedicated> {
    let mut pg = config.pg.clone();
    let name = format!("{} {role}", pg.get_application_name().unwrap_or("pgcoord"));
    pg.application_name(&name);
    Ok(pg.connect(NoTls).await?)
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

/// Runs `operation` until it succeeds or fails with something other than a serialization failure
/// (40001) or deadlock (40P01), sleeping a bounded, jittered backoff between attempts. After
/// [`RETRY_ATTEMPTS`] conflicts the last one is returned as [`ErrorKind::FailedPrecondition`].
pub async fn retry<T, F, Fut>(mut operation: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match operation().await {
            Err(e) if e.is_retryable() => {
                attempt += 1;
                if attempt >= RETRY_ATTEMPTS {
                    warn!(attempts = attempt, error = %e, "giving up after repeated conflicts");
                    return Err(Error::new(
                        ErrorKind::FailedPrecondition,
                        format!("still conflicting after {attempt} attempts: {e}"),
                    )
                    .with_source(e));
                }
                tokio::time::sleep(backoff(attempt)).await;
            }
            other => return other,
        }
    }
}

/// Full-jitter exponential backoff: a random time up to 5 ms × 2^attempt, capped at 500 ms.
fn backoff(attempt: u32) -> Duration {
    let cap_ms = (5u64 << attempt.min(10)).min(500);
    Duration::from_millis(1 + random_u64() % cap_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(500));
        }
    }
}
