//! Worker pools on the in-memory backend: the pool's constructors, and how a router reaches a
//! key's holder here — the holder read from the lease, then asked on its member's channel.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{ErrorKind, Result};

use super::MemoryCoordinator;
use crate::Coordinator;
use crate::backend::Door;
use crate::backend::{Locking, Signalling};
use crate::workers::reach::Holders;
use crate::workers::wire;
use crate::{KeyRouter, Routed, Shutdown, WorkerKey, WorkerPool};

/// What stands for the lock table's name on the in-memory backend (routes are scoped to it).
const TABLE: &str = "memory";

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// The pool `name` over `keys` on the in-memory backend (feature `memory`), as the process
    /// `coordinator` is: for unit tests of an application's workers. Members are the backend's
    /// coordinators; a tick every 100 ms (nothing expires in memory: losses are forced, see
    /// [`MemoryBackend::force_loss`](super::MemoryBackend::force_loss)); routed with
    /// [`routed_in_memory`](Self::routed_in_memory). Not durable: durable mail needs
    /// PostgreSQL.
    ///
    /// # Panics
    ///
    /// When `coordinator` is on PostgreSQL (use [`WorkerPool::new`] there): a test's setup
    /// mistake.
    pub fn in_memory(
        coordinator: &Coordinator,
        name: impl Into<String>,
        keys: Vec<String>,
        factory: impl Fn(WorkerKey) -> W + 'static,
    ) -> WorkerPool<W> {
        let coordinator = process(coordinator);
        let (locks, owner) = (
            Arc::new(coordinator.clone()),
            coordinator.owner().to_owned(),
        );
        let tick = Duration::from_millis(100);
        WorkerPool::on(locks, TABLE.into(), owner, tick, name.into(), keys, factory)
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Routed>,
{
    /// [`routed`](Self::routed) on the in-memory backend: a pool made
    /// [`in_memory`](Self::in_memory) answers [`KeyRouter::in_memory`]s of `coordinator`'s
    /// backend. Panics as [`in_memory`](Self::in_memory) does.
    pub fn routed_in_memory(self, coordinator: &Coordinator) -> WorkerPool<W> {
        // No doorbell: a pool here looks at its ticks.
        self.routed_through(Arc::new(process(coordinator).clone()), None)
    }
}

impl KeyRouter {
    /// A router to the workers of pool `pool` on the in-memory backend (feature `memory`), sent
    /// from the process `coordinator` is: it reaches pools made
    /// [`WorkerPool::in_memory`] and [`routed_in_memory`](WorkerPool::routed_in_memory) on the
    /// same backend. Panics as [`WorkerPool::in_memory`] does.
    pub fn in_memory(pool: impl Into<String>, coordinator: &Coordinator) -> KeyRouter {
        let coordinator = Arc::new(process(coordinator).clone());
        KeyRouter::through(pool.into(), coordinator.clone(), coordinator)
    }
}

/// The in-memory process behind `coordinator`.
fn process(coordinator: &Coordinator) -> &MemoryCoordinator {
    match &coordinator.door {
        Door::Memory(process) => process,
        Door::Postgres(_) => {
            panic!("an in-memory worker pool or router on a PostgreSQL coordinator")
        }
    }
}

impl Holders for MemoryCoordinator {
    fn send_once<'a>(
        &'a self,
        pool: &'a str,
        lease: &'a str,
        request: Vec<u8>,
        left: Duration,
        record: bool,
        sent: &'a mut bool,
    ) -> pgcoord::BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            let owner = match self.get(lease).await {
                Ok(info) => info.owner,
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            let Some(owner) = owner else {
                if record {
                    self.keep_free(lease);
                }
                return Ok(None);
            };
            *sent = true;
            let channel = wire::channel(TABLE, pool, &owner);
            let ask = crate::signals::Ask::new(channel, request).timeout(left);
            self.ask(ask).await.map(Some)
        })
    }
}
