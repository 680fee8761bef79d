//! Worker pools through the front door: a [`Coordinator`] makes a pool, a router and a routed
//! pool on either backend (each here, beside the door, because the backend answers it).

use actix::prelude::*;

use super::{Coordinator, Door};
use crate::losses::Shutdown;
use crate::workers::{KeyRouter, Routed, WorkerKey, WorkerPool};

/// Worker pools: on either backend.
impl Coordinator {
    /// The worker pool `name` over `keys`, run by this process (start it with `.start()`);
    /// `factory` makes the worker of one key. Every process of the fleet must use the same name
    /// and keys. On PostgreSQL, [`WorkerPool::new`] on this coordinator's lock manager; in
    /// memory, its members are the backend's coordinators, with a tick every 100 ms (nothing
    /// expires there: losses are forced).
    pub fn worker_pool<W>(
        &self,
        name: impl Into<String>,
        keys: Vec<String>,
        factory: impl Fn(WorkerKey) -> W + 'static,
    ) -> WorkerPool<W>
    where
        W: Actor<Context = Context<W>> + Handler<Shutdown>,
    {
        match &self.door {
            Door::Postgres(actors) => {
                WorkerPool::new(&actors.config, actors.locks.clone(), name, keys, factory)
            }
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.worker_pool(name.into(), keys, factory),
        }
    }

    /// A router to the workers of pool `pool` (the name its pools were made with), sent from
    /// this process: on PostgreSQL, [`KeyRouter::new`] on this coordinator's actors; in memory,
    /// it reaches the pools of the same backend.
    pub fn key_router(&self, pool: impl Into<String>) -> KeyRouter {
        match &self.door {
            Door::Postgres(actors) => {
                KeyRouter::new(pool, actors.locks.clone(), actors.signals.clone())
            }
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.key_router(pool.into()),
        }
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Routed>,
{
    /// [`routed`](Self::routed) through `coordinator`: on PostgreSQL its listener; in memory,
    /// answering the routers of the same backend ([`Coordinator::key_router`]).
    pub fn routed_by(self, coordinator: &Coordinator) -> WorkerPool<W> {
        match &coordinator.door {
            Door::Postgres(actors) => self.routed(actors.signals.clone()),
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.routed(self),
        }
    }
}
