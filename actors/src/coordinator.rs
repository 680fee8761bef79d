//! [`Coordinator`]: starts the three actors in the current actix System.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::Config;
use pgcoord::payload::PayloadTable;

use crate::listener::ListenerActor;
use crate::manager::LockManager;
use crate::payload_actor::PayloadStoreActor;

/// The addresses of a process's pgcoord actors.
#[derive(Clone)]
pub struct Coordinator {
    /// Leases and advisory locks.
    pub locks: Addr<LockManager>,
    /// Publish/subscribe and request/reply (supervised).
    pub signals: Addr<ListenerActor>,
    /// The payload store and its expiry timer.
    pub payloads: Addr<PayloadStoreActor>,
}

impl Coordinator {
    /// Checks the server, then starts the actors as [`start`](Self::start) does: the start that
    /// can fail. [`pgcoord::ErrorKind::Unavailable`] (with the cause) when the database cannot
    /// be reached within the connect timeout, [`pgcoord::ErrorKind::ReadOnly`] on a standby,
    /// [`pgcoord::ErrorKind::NotFound`] when the tables do not exist (`pgcoord::schema::migrate`).
    pub async fn connect(config: Config) -> pgcoord::Result<Coordinator> {
        pgcoord::db::check_server(&config).await?;
        Ok(Coordinator::start(config))
    }

    /// Starts a supervised `ListenerActor` with the payload table as its store, a `LockManager`
    /// that hears lease releases through it (so the process has one LISTEN connection), and a
    /// `PayloadStoreActor`. Must run inside an actix System; the tables must exist
    /// (`pgcoord::schema::migrate`). Nothing is checked: with the database down, everything
    /// starts and becomes usable when it is back. Prefer [`connect`](Self::connect) to learn of a
    /// wrong DSN or missing tables at once.
    pub fn start(config: Config) -> Coordinator {
        let table = PayloadTable::new(&config, pgcoord::db::pool(&config));
        let expire_every = (config.payload_ttl() / 10).max(std::time::Duration::from_secs(1));
        let signals =
            ListenerActor::new(config.clone(), Some(Arc::new(table.clone()))).start_supervised();
        Coordinator {
            // One LISTEN connection per process: lease wake-ups come through the listener.
            locks: LockManager::with_listener(config, signals.clone()).start(),
            payloads: PayloadStoreActor::new(table, expire_every).start(),
            signals,
        }
    }
}
