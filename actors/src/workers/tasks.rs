//! [`TaskPool`]: a worker pool whose worker of each key is an async closure — the pool for a
//! service that is not actix. It is a [`WorkerPool`] underneath: the same leases, shares, moves
//! and losses; each key's worker an actor of this module that runs the closure's future.
//! [`Workers`] is the running pool's handle.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use futures_util::Stream;
use pgcoord::{Error, ErrorKind, Result};

use super::{Assignment, Drain, MembersChanged, SetKeys, Shutdown};
use super::{SubscribeMembers, WorkerKey, WorkerPool};
use crate::Coordinator;
use crate::streams::{forward, told};

type Work = Box<dyn Fn(WorkerKey) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// A worker pool whose worker of each key is `work(key)`, an async closure: started by
/// [`Coordinator::run_tasks`] from any thread. Every process of the fleet runs the pool with
/// the same name and keys; each key's closure runs in one process at a time, while that process
/// holds the key's lease ([`WorkerKey`]: the key, its token, `fence`, `lost`).
///
/// The closure's future is dropped when the key's lease is lost or the key moves (at an
/// `.await`, as any cancelled future): fence the work's writes with the key
/// ([`WorkerKey::fence`]) — that, not the drop, is what makes a late write harmless. A future
/// that returns is done with its key here: it runs again when the key comes back, or after a
/// panic (at the pool's next tick).
pub struct TaskPool {
    name: String,
    keys: Vec<String>,
    work: Work,
    max_moves: usize,
    weight: u32,
}

impl std::fmt::Debug for TaskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskPool")
            .field("name", &self.name)
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl TaskPool {
    /// The pool `name` over `keys`, each key's worker `work(key)`.
    pub fn new<F, Fut>(name: impl Into<String>, keys: Vec<String>, work: F) -> TaskPool
    where
        F: Fn(WorkerKey) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        TaskPool {
            name: name.into(),
            keys,
            work: Box::new(move |key| Box::pin(work(key))),
            max_moves: usize::MAX,
            weight: 1,
        }
    }

    /// At most `keys` keys released and claimed per tick ([`WorkerPool::max_moves`]).
    pub fn max_moves(mut self, keys: usize) -> TaskPool {
        self.max_moves = keys.max(1);
        self
    }

    /// This member's weight ([`WorkerPool::weight`]).
    pub fn weight(mut self, weight: u32) -> TaskPool {
        self.weight = weight.max(1);
        self
    }
}

/// A running [`TaskPool`] in this process. Dropping it stops the pool here: each worker's
/// future dropped, then its key's lease released, for another member to claim.
/// [`Coordinator::shutdown`] drains it first while it runs.
pub struct Workers {
    pool: Addr<WorkerPool<KeyTask>>,
    arbiter: ArbiterHandle,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers").finish_non_exhaustive()
    }
}

impl Workers {
    /// The keys held here with their tokens, and the live members counted at the last tick.
    pub async fn assignment(&self) -> Result<Assignment> {
        self.pool
            .send(crate::GetStats::new())
            .await
            .map_err(stopped)
    }

    /// Replaces the keys: workers of keys no longer listed stop, their leases go.
    pub async fn set_keys(&self, keys: Vec<String>) -> Result<()> {
        self.pool.send(SetKeys(keys)).await.map_err(stopped)
    }

    /// The live members now, then each change, as a stream ([`MembersChanged`]).
    pub async fn members(
        &self,
    ) -> Result<impl Stream<Item = MembersChanged> + Send + Unpin + use<>> {
        let (forwarder, feed) = forward(&self.arbiter, None);
        told(self.pool.send(SubscribeMembers(forwarder.recipient()))).await?;
        Ok(feed)
    }

    /// Hands every key over, then stops ([`Drain`]): for a rolling deploy, drain then exit.
    /// [`ErrorKind::Timeout`] when not done `within` (the pool goes on draining).
    pub async fn drain(&self, within: Duration) -> Result<()> {
        tokio::time::timeout(within, self.pool.send(Drain))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("the pool's keys were not all handed over within {within:?}"),
                )
            })?
            .or(Ok(()))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Its workers stopped, then their leases released (as the pool's stop does).
        self.pool.do_send(crate::losses::Shutdown);
    }
}

fn stopped(e: MailboxError) -> Error {
    Error::new(ErrorKind::Unavailable, format!("the pool stopped: {e}"))
}

impl Coordinator {
    /// Starts `pool` in this process, on the actors' thread; callable from any thread. Typed
    /// errors for a bad pool name or key, before anything starts.
    pub fn run_tasks(&self, pool: TaskPool) -> Result<Workers> {
        let actors = self.actors("task pools")?;
        let name = pgcoord::config::validate_name("pool", pool.name)?;
        for key in &pool.keys {
            // Each key is the lease `{pool}/keys/{key}`: a name a lease can have.
            pgcoord::config::validate_name("a key's lease", format!("{name}/keys/{key}"))?;
        }
        let (config, locks) = (actors.config.clone(), actors.locks.clone());
        let (keys, work) = (pool.keys, pool.work);
        let (max_moves, weight) = (pool.max_moves, pool.weight);
        let started = WorkerPool::start_in_arbiter(&actors.arbiter, move |_| {
            // One closure for every key's worker, on this thread only.
            let work: Rc<Work> = Rc::new(work);
            WorkerPool::new(&config, locks, name, keys, move |key| KeyTask {
                key: Some(key),
                work: work.clone(),
            })
            .max_moves(max_moves)
            .weight(weight)
        });
        Coordinator::drain_while_running(actors, started.downgrade().recipient());
        Ok(Workers {
            pool: started,
            arbiter: actors.arbiter.clone(),
        })
    }
}

/// One key's worker: runs the closure's future until told to stop.
pub(crate) struct KeyTask {
    key: Option<WorkerKey>,
    work: Rc<Work>,
}

impl Actor for KeyTask {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(key) = self.key.take() {
            ctx.spawn((self.work)(key).into_actor(self));
        }
    }
}

impl Handler<Shutdown> for KeyTask {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        // Stopping drops the future.
        ctx.stop();
    }
}
