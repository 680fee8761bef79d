//! Making a pool: its constructor on a lock manager, `on` for any backend's [`Locking`] (the
//! in-memory backend's constructors are in its module), and the options that shape its sharing
//! (keys that follow a stream, moves per tick, passivation, weight). Routing, durable mail and
//! keys that come to life have their own modules.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;

use super::running::Crew;
use super::{Shutdown, WorkerKey, WorkerPool};
use crate::backend::Locking;
use crate::leases::LockManager;

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// The pool `name` over `keys`, run by `locks` (whose config is `config`); `factory` makes
    /// the worker of one key. Every process of the fleet must use the same name and keys.
    pub fn new(
        config: &Config,
        locks: Addr<LockManager>,
        name: impl Into<String>,
        keys: Vec<String>,
        factory: impl Fn(WorkerKey) -> W + 'static,
    ) -> WorkerPool<W> {
        // A quarter lease; in poll-only mode at most a second, as waiters poll (no doorbell).
        let tick = crate::leases::poll_interval(config);
        let (table, owner) = (config.lock_table().quoted(), config.owner().to_owned());
        WorkerPool::on(
            Arc::new(locks),
            table,
            owner,
            tick,
            name.into(),
            keys,
            factory,
        )
    }

    /// The pool `name` over `keys` on `locks`, as `owner`, whose lock table is `lock_table`:
    /// a tick every `tick`.
    pub(crate) fn on(
        locks: Arc<dyn Locking>,
        lock_table: String,
        owner: String,
        tick: Duration,
        name: String,
        keys: Vec<String>,
        factory: impl Fn(WorkerKey) -> W + 'static,
    ) -> WorkerPool<W> {
        WorkerPool {
            metrics: crate::metrics::WorkerMetrics::new(&name),
            name,
            keys,
            locks,
            lock_table,
            owner,
            tick,
            crew: Crew::new(factory),
            round: Default::default(),
            membership: Default::default(),
            drain: None,
            routing: None,
            mailing: None,
            activation: Default::default(),
        }
    }

    /// Takes its keys from `keys` instead: each item is the whole set, replacing the last —
    /// customers added and removed as they come and go. Workers of keys no longer listed stop
    /// and their leases go. The pool keeps running with the last set when the stream ends.
    pub fn follow(
        mut self,
        keys: impl futures_util::Stream<Item = Vec<String>> + 'static,
    ) -> WorkerPool<W> {
        self.round.follow(Box::pin(keys));
        self
    }

    /// Moves at most `keys` keys per tick each way: at most that many released (above the fair
    /// share) and that many claimed, so a join or leave spreads its moves — and the workers'
    /// start-up cost — over several ticks. Unlimited by default; at least 1.
    pub fn max_moves(mut self, keys: usize) -> WorkerPool<W> {
        self.round.limit_moves(keys);
        self
    }

    /// Stops a key's worker after it has had no routed message for `idle` (checked each tick);
    /// the key stays held here, and its next routed message starts a worker again (given the
    /// same lease). For pools of many keys that are seldom used. Default: never.
    pub fn passivate_after(mut self, idle: Duration) -> WorkerPool<W> {
        self.crew.passivate_after(idle);
        self
    }

    /// This member's weight (default 1, at least 1): it takes its weight's part of the keys,
    /// `ceil(keys × weight ÷ total weight)` — a process with three times the cores can take
    /// three times the keys. Stored with its member lease, so every member counts it.
    pub fn weight(mut self, weight: u32) -> WorkerPool<W> {
        self.membership.weigh(weight);
        self
    }

    /// Tells `watcher` the pool's live members once it has counted them, and again whenever
    /// they change ([`MembersChanged`](super::MembersChanged); read at each tick, so a join or
    /// leave is told within about a quarter lease of the table showing it). A task pool's
    /// handle gives the same as a stream ([`Workers::members`](super::Workers::members)).
    pub fn members_to(mut self, watcher: Recipient<super::MembersChanged>) -> WorkerPool<W> {
        self.membership.subscribe(watcher);
        self
    }
}
