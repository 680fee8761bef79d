//! [`Pinned`]: a dedicated connection owned by one part of the runtime (an advisory lock's
//! session, the heartbeat), never shared through a pool.

use pgcoord::__private::CachingClient;
use pgcoord::Result;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;

/// A dedicated connection and the task driving it. Dropping it closes the connection, which
/// ends its server session (and releases whatever advisory locks the session holds).
pub(crate) struct Pinned {
    pub(crate) client: CachingClient,
    driver: JoinHandle<()>,
    /// Turns true when the connection ends (closes when the driver is aborted).
    pub(crate) ended: watch::Receiver<bool>,
}

impl Pinned {
    /// Opens a connection named `"<application_name> <role>"` in `pg_stat_activity`, within the
    /// configured connect timeout.
    pub(crate) async fn open(config: &pgcoord::Config, role: &str) -> Result<Pinned> {
        let (client, connection) = pgcoord::__private::connect_as(config, role).await?;
        let (ended_tx, ended) = watch::channel(false);
        let role = role.to_owned();
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(error = %e, %role, "dedicated connection ended");
            }
            let _ = ended_tx.send(true);
        });
        Ok(Pinned {
            client: CachingClient::new(client, config.session_tls().clone()),
            driver,
            ended,
        })
    }

    /// True once the connection closed or was found unusable (a statement timed out on it).
    pub(crate) fn is_broken(&self) -> bool {
        self.client.is_broken()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.driver.abort();
    }
}
