//! [`Manager`]: how pgcoord's own pool makes, checks and drops its connections.

use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;

use crate::error::{Error, Result};
use crate::statement::CachingClient;
use crate::tls::Tls;

/// The bb8 manager of [`CachingClient`]s: bb8-postgres's connection handling, bounded by the
/// connect timeout as a whole, plus the statement cache.
pub struct Manager {
    postgres: PostgresConnectionManager<Tls>,
    config: tokio_postgres::Config,
    tls: Tls,
    connect_timeout: Duration,
    prepare: bool,
    /// The password file, if it was ignored for being readable by others.
    ignored_passfile: Option<String>,
}

impl Manager {
    /// A manager connecting with `config` and `tls`, each connect bounded by `connect_timeout`,
    /// whose connections keep statements prepared.
    pub fn new(config: tokio_postgres::Config, tls: Tls, connect_timeout: Duration) -> Manager {
        Manager {
            postgres: PostgresConnectionManager::new(config.clone(), tls.clone()),
            config,
            tls,
            connect_timeout,
            prepare: true,
            ignored_passfile: None,
        }
    }

    /// Connections whose "password missing" says that the password file at `path` was ignored
    /// for being readable by others.
    pub fn ignored_passfile(self, path: Option<String>) -> Manager {
        Manager {
            ignored_passfile: path,
            ..self
        }
    }

    /// Connections that prepare nothing (see `ConfigBuilder::prepared_statements`).
    pub fn unprepared(self) -> Manager {
        Manager {
            prepare: false,
            ..self
        }
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = CachingClient;
    type Error = Error;

    async fn connect(&self) -> Result<CachingClient> {
        match tokio::time::timeout(self.connect_timeout, self.postgres.connect()).await {
            Ok(Ok(client)) if self.prepare => Ok(CachingClient::new(client, self.tls.clone())),
            Ok(Ok(client)) => Ok(CachingClient::unprepared(client, self.tls.clone())),
            Ok(Err(e)) => Err(super::connect::connect_failed(
                &self.config,
                self.ignored_passfile.as_deref(),
                e,
            )),
            Err(_) => Err(super::connect::connect_timed_out(
                &self.config,
                self.connect_timeout,
            )),
        }
    }

    async fn is_valid(&self, conn: &mut CachingClient) -> Result<()> {
        Ok(self.postgres.is_valid(conn.client_mut()).await?)
    }

    fn has_broken(&self, conn: &mut CachingClient) -> bool {
        conn.is_broken()
    }
}
