//! Worker pools on the in-memory backend: a pool and a router of a memory coordinator, and how a
//! router reaches a key's holder here — the holder read from the lease, then asked on its member's channel.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{ErrorKind, Result};

use super::MemoryCoordinator;
use crate::backend::{Locking, Signalling};
use crate::workers::reach::Holders;
use crate::workers::wire;
use crate::{KeyRouter, Routed, Shutdown, WorkerKey, WorkerPool};

/// What stands for the lock table's name on the in-memory backend (routes are scoped to it).
const TABLE: &str = "memory";

impl MemoryCoordinator {
    /// The pool `name` over `keys` in this process: members are the backend's coordinators; a
    /// tick every 100 ms (nothing expires in memory: losses are forced).
    pub(crate) fn worker_pool<W>(
        &self,
        name: String,
        keys: Vec<String>,
        factory: impl Fn(WorkerKey) -> W + 'static,
    ) -> WorkerPool<W>
    where
        W: Actor<Context = Context<W>> + Handler<Shutdown>,
    {
        let (locks, owner) = (Arc::new(self.clone()), self.owner().to_owned());
        let tick = Duration::from_millis(100);
        WorkerPool::on(locks, TABLE.into(), owner, tick, name, keys, factory)
    }

    /// `pool` routed here: it answers the backend's routers. No doorbell: it looks at its ticks.
    pub(crate) fn routed<W>(&self, pool: WorkerPool<W>) -> WorkerPool<W>
    where
        W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Routed>,
    {
        pool.routed_through(Arc::new(self.clone()), None)
    }

    /// A router to the workers of pool `pool`, from this process.
    pub(crate) fn key_router(&self, pool: String) -> KeyRouter {
        let process = Arc::new(self.clone());
        KeyRouter::through(pool, process.clone(), process)
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
                    self.shared.lock().leases.keep_free(lease);
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
