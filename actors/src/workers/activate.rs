//! Keys that come to life: a pool made [`activate_keys`](WorkerPool::activate_keys) serves,
//! besides its own keys, every key recorded under it — a free, kept row of the key's lease,
//! written by a [`KeyRouter`](super::KeyRouter) whose message found no holder — under the same
//! fair share. Its claims keep their rows, so a recorded key stays known across moves. The
//! router rings the pool's doorbell after recording; a member that hears it rebalances at
//! once (at most every [`RING_GAP`]) instead of at its next tick. The doorbell only wakes: what
//! a member serves is read from the table.

use std::time::{Duration, Instant};

use actix::prelude::*;

use super::{StopWorker, WorkerPool, wire};
use crate::signals::SubscribeRaw;

/// Rings closer together than this make one look.
const RING_GAP: Duration = crate::signals::DOORBELL_GAP;

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    /// Serves keys that come to life on a message (see [`KeyRouter::activate_keys`](super::KeyRouter::activate_keys)):
    /// every key recorded under the pool, besides its own, shared fairly among the members;
    /// a recorded key's lease row is kept when it moves, so the key stays known (passivation
    /// stops an idle worker, and the next message wakes it). A routed pool hears the routers'
    /// doorbell and takes a new key at once; otherwise at its next tick. Every process's pool
    /// of the name should activate keys. A recorded key stays until its row is deleted (a
    /// free row `{pool}/keys/{key}` in the lock table).
    pub fn activate_keys(mut self) -> WorkerPool<W> {
        self.activate_keys = true;
        self
    }

    /// Listens for the routers' doorbell, when the pool activates keys and is routed.
    pub(super) fn start_activation(&mut self, ctx: &mut Context<Self>) {
        let listener = (self.routing.as_ref()).and_then(|r| r.listening.listener());
        if let (true, Some(listener)) = (self.activate_keys, listener) {
            listener.do_send(SubscribeRaw {
                channel: wire::pool_channel(&self.lock_table, &self.name),
                recipient: ctx.address().recipient(),
            });
        }
    }

    /// Whether `channel` is this pool's doorbell.
    pub(super) fn is_doorbell(&self, channel: &str) -> bool {
        self.activate_keys && channel == wire::pool_channel(&self.lock_table, &self.name)
    }

    /// The doorbell rang: a key may have been recorded. Rebalance now, or once [`RING_GAP`]
    /// after the last ring's rebalance.
    pub(super) fn rung(&mut self, ctx: &mut Context<Self>) {
        if self.look_scheduled {
            return;
        }
        self.look_scheduled = true;
        let wait =
            (self.rang_at).map_or(Duration::ZERO, |at| RING_GAP.saturating_sub(at.elapsed()));
        ctx.run_later(wait, |pool, ctx| {
            pool.look_scheduled = false;
            pool.rang_at = Some(Instant::now());
            pool.rebalance(ctx);
        });
    }
}
