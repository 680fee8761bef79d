//! Keys that come to life: a pool made [`activate_keys`](WorkerPool::activate_keys) serves,
//! besides its own keys, every key recorded under it — a free, kept row of the key's lease,
//! written by a [`KeyRouter`](super::KeyRouter) whose message found no holder — under the same
//! fair share. Its claims keep their rows, so a recorded key stays known across moves. The
//! router rings the pool's doorbell after recording; a member that hears it rebalances at
//! once (a look per doorbell gap, at most) instead of at its next tick. The doorbell only wakes:
//! what a member serves is read from the table.

use std::collections::HashSet;
use std::time::Instant;

use actix::prelude::*;
use pgcoord::LeaseInfo;

use super::{Shutdown, WorkerPool, wire};
use crate::signals::SubscribeRaw;
use crate::signals::doorbell::{Gate, Go};

/// A pool's keys that come to life: whether it serves them, which it found, and its doorbell.
#[derive(Default)]
pub(super) struct Activation {
    /// Set by [`WorkerPool::activate_keys`]: keys recorded under the pool are served too.
    on: bool,
    /// The keys recorded under the pool at the last tick that are not its own.
    recorded: HashSet<String>,
    /// The routers' doorbell: when a ring makes the pool look for recorded keys.
    doorbell: Gate,
}

impl Activation {
    /// Whether the pool serves keys that come to life.
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// Whether `key` was recorded under the pool (and is not one of its own).
    pub(super) fn has(&self, key: &str) -> bool {
        self.recorded.contains(key)
    }

    /// The keys recorded under the pool that are not its own.
    pub(super) fn recorded(&self) -> impl Iterator<Item = &String> {
        self.recorded.iter()
    }

    /// Notes the keys recorded under the pool, held or not: those of `keys` (the rows under
    /// `prefix`) that are not among `own`.
    pub(super) fn note(&mut self, keys: &[LeaseInfo], prefix: &str, own: &[String]) {
        self.recorded = (keys.iter())
            .filter_map(|k| k.name.strip_prefix(prefix))
            .filter(|k| !own.iter().any(|own| own == k))
            .map(str::to_owned)
            .collect();
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// Serves keys that come to life on a message (see [`KeyRouter::activate_keys`](super::KeyRouter::activate_keys)):
    /// every key recorded under the pool, besides its own, shared fairly among the members;
    /// a recorded key's lease row is kept when it moves, so the key stays known (passivation
    /// stops an idle worker, and the next message wakes it). A routed pool hears the routers'
    /// doorbell and takes a new key at once; otherwise at its next tick. Every process's pool
    /// of the name should activate keys. A recorded key stays until its row is deleted (a
    /// free row `{pool}/keys/{key}` in the lock table).
    pub fn activate_keys(mut self) -> WorkerPool<W> {
        self.activation.on = true;
        self
    }

    /// Listens for the routers' doorbell, when the pool activates keys and is routed.
    pub(super) fn start_activation(&mut self, ctx: &mut Context<Self>) {
        let listener = (self.routing.as_ref()).and_then(|r| r.listener());
        if let (true, Some(listener)) = (self.activation.on, listener) {
            listener.do_send(SubscribeRaw {
                channel: wire::pool_channel(&self.lock_table, &self.name),
                recipient: ctx.address().recipient(),
            });
        }
    }

    /// Whether `channel` is this pool's doorbell.
    pub(super) fn is_doorbell(&self, channel: &str) -> bool {
        self.activation.on && channel == wire::pool_channel(&self.lock_table, &self.name)
    }

    /// The doorbell rang: a key may have been recorded. Rebalance now, or at the end of the
    /// doorbell's gap after the last ring's look.
    pub(super) fn rung(&mut self, ctx: &mut Context<Self>) {
        let go = self.activation.doorbell.ring(Instant::now());
        self.look(ctx, go);
    }

    /// Does what the doorbell's gate says. A look is over once started (its statements are the
    /// rebalance's own), and counts as finding nothing: every ring's look opens a gap.
    fn look(&mut self, ctx: &mut Context<Self>, go: Go) {
        match go {
            Go::Covered => {}
            Go::At(at) => {
                ctx.run_later(at.saturating_duration_since(Instant::now()), |pool, ctx| {
                    let go = pool.activation.doorbell.due(Instant::now());
                    pool.look(ctx, go);
                });
            }
            Go::Now => {
                self.rebalance(ctx);
                let go = self.activation.doorbell.finished(false, Instant::now());
                self.look(ctx, go);
            }
        }
    }
}
