//! [`WorkerPool`]: exactly one worker actor per key across every process of a fleet.
//!
//! Each key is a lease (`"{pool}/keys/{key}"`); each process in the fleet is a member, a lease of
//! its own (`"{pool}/members/{owner}"`), so membership lives in PostgreSQL and ends with the
//! process. Every tick (a quarter lease; in poll-only mode at most a second) a pool counts the live members, takes its fair share
//! (`ceil(keys ÷ members)`, or by [`weight`](WorkerPool::weight)) — releasing keys above it, claiming free keys up to it in batched
//! statements ([`Claim`](crate::leases::Claim)) — and starts one worker per key it holds, handing it the key and its
//! lease's fencing token ([`WorkerKey`]). A process that starts waits one tick before claiming,
//! so processes starting together share from the start; when one joins or leaves, keys move
//! within about two ticks, half a lease. [`WorkerPool::max_moves`] bounds the keys claimed and
//! released per tick; [`WorkerPool::members_to`] tells of members joining and leaving, and
//! [`KeyRouter::members`] lists them from any process.
//!
//! A worker runs only while its key's lease is held: when the lease is lost the pool tells the
//! worker to stop ([`Shutdown`]) at once — the holder learns of a loss before the server could
//! grant the key elsewhere — and a worker that stops or dies (actix: a panicking handler stops
//! its actor) while the lease is held is started again. Workers should fence their writes with
//! the key's lease ([`WorkerKey::fence`]): that, not the stop message, is what makes a late write
//! harmless.
//!
//! A pool made [`routed`](WorkerPool::routed) also delivers messages to its workers by key: a
//! [`KeyRouter`] in any process of the fleet sends to the key's worker wherever it runs, at
//! most once ([`route`] says how, and what a caller can know). A pool made
//! [`durable`](WorkerPool::durable) also hands each key's durable mail ([`mail_topic`], appended
//! in the sender's transaction) to its worker as [`Mail`], at least once and in order, across
//! crashes and moves (`mail` says how).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{debug, warn};

use crate::backend::Locking;

mod activate;
mod build;
// The model `models::routing` runs a member's verdict on a routed message, and a round's plan.
pub(crate) mod deliver;
mod drain;
mod hand_over;
mod mail;
mod members;
mod messages;
pub(crate) mod plan;
pub(crate) mod reach;
mod rebalance;
mod running;
// The in-memory backend reaches holders through a `route::Holders` of its own.
pub(crate) mod route;
mod tasks;
// The in-memory backend's routes use the same channels.
pub(crate) mod wire;

use crate::losses::Shutdown;
use activate::Activation;
use deliver::Routing;
use drain::Draining;
use mail::Mailing;
pub use members::MembersChanged;
use members::Membership;
pub(crate) use members::SubscribeMembers;
pub(crate) use messages::SetKeys;
pub use messages::{Assignment, Drain, Mail, WorkerKey, mail_topic};
use rebalance::Rounds;
pub use route::{KeyRouter, Routed};
use running::Crew;
pub use tasks::{TaskPool, Workers};

/// One process's part of a worker pool. Start it with [`WorkerPool::new`] and `.start()`;
/// [`crate::Shutdown`] stops its workers and releases its keys (its ticks keep it running when
/// every address is dropped).
pub struct WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    name: String,
    keys: Vec<String>,
    locks: Arc<dyn Locking>,
    /// The lock table's name (routed requests' channels are scoped to it).
    lock_table: String,
    owner: String,
    tick: Duration,
    metrics: crate::metrics::WorkerMetrics,
    /// The workers of the keys held here.
    crew: Crew<W>,
    /// One round at a time, and how far each moves.
    round: Rounds,
    /// Its member lease, weight, and the members it last read.
    membership: Membership,
    /// Set by [`Drain`]: the pool hands its keys over and stops.
    drain: Option<Draining>,
    /// Set by [`WorkerPool::routed`]: routed messages go to the workers.
    routing: Option<Routing<W>>,
    /// Set by [`WorkerPool::durable`]: each key's durable mail goes to its worker.
    mailing: Option<Mailing<W>>,
    /// Keys recorded under the pool, served too once [`WorkerPool::activate_keys`].
    activation: Activation,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// The pool's keys are `keys` now: the workers of keys it no longer has stop, and their
    /// leases go.
    fn set_keys(&mut self, keys: Vec<String>) {
        let gone: Vec<String> = self
            .crew
            .keys()
            .filter(|k| !keys.contains(k) && !self.activation.has(k))
            .cloned()
            .collect();
        for key in gone {
            self.stop_key(&key);
        }
        self.keys = keys;
    }

    /// Whether `key` is the pool's: one of its keys, or recorded under it.
    fn has_key(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key) || self.activation.has(key)
    }

    fn key_lease(&self, key: &str) -> String {
        format!("{}/keys/{key}", self.name)
    }

    /// Stops `key`'s worker, waits until it has stopped and dropped its copy of the lease (its
    /// [`WorkerKey`], and any clone of it), then lets the lease go: another process can start
    /// the key's next worker only after this one ended. The wait is on the worker's own code,
    /// not the network: a worker that does not stop keeps its key's lease (renewed, and warned
    /// about every tick) rather than let a second worker start.
    fn stop_key(&mut self, key: &str) -> Option<tokio::task::JoinHandle<()>> {
        self.crew.stop(key).map(|(lease, worker)| {
            self.metrics.released.increment(1);
            self.metrics.keys.set(self.crew.len() as f64);
            let (tick, key) = (self.tick, key.to_owned());
            actix::spawn(async move {
                let mut warn_at = std::time::Instant::now() + tick;
                let mut lease = lease;
                let lease = loop {
                    if !worker.connected() {
                        match Arc::try_unwrap(lease) {
                            Ok(lease) => break lease,
                            Err(shared) => lease = shared,
                        }
                    }
                    if std::time::Instant::now() >= warn_at {
                        warn!(worker.key = %key, "a worker told to stop is still running (or keeps its WorkerKey); its key stays held");
                        warn_at += tick;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                };
                if let Err(e) = lease.release().await {
                    debug!(error = %e, "releasing a key's lease");
                }
            })
        })
    }

    /// The lease of `key` (with `token`) is lost: its worker stops now, before the server could
    /// grant the key to another process.
    fn lost(&mut self, key: &str, token: i64) {
        if self.crew.lost(key, token) {
            warn!(pool.name = %self.name, worker.key = %key, "key's lease lost; its worker stops");
            self.metrics.keys.set(self.crew.len() as f64);
        }
    }
}

impl<W> Actor for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(keys) = self.round.take_followed() {
            ctx.add_stream(keys);
        }
        self.start_routing(ctx);
        self.start_mail(ctx);
        self.start_activation(ctx);
        self.rebalance(ctx);
        ctx.run_interval(self.tick, |act, ctx| act.rebalance(ctx));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let keys: Vec<String> = self.crew.keys().cloned().collect();
        let released: Vec<_> = keys.iter().filter_map(|key| self.stop_key(key)).collect();
        self.stop_routing(released);
        self.membership.leave();
    }
}

impl<W> Handler<crate::GetStats<Assignment>> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = Assignment;

    fn handle(&mut self, _: crate::GetStats<Assignment>, _: &mut Context<Self>) -> Assignment {
        Assignment {
            keys: self.crew.assigned(),
            members: self.membership.count(),
            ticks: self.round.ticks(),
            passive: self.crew.passive(),
            restarts: self.crew.restarts(),
            mail_reads: self.mailing.as_ref().map_or(0, Mailing::reads),
        }
    }
}

impl<W> Handler<SetKeys> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = ();

    fn handle(&mut self, SetKeys(keys): SetKeys, _: &mut Context<Self>) {
        self.set_keys(keys);
    }
}

impl<W> StreamHandler<Vec<String>> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    fn handle(&mut self, keys: Vec<String>, _: &mut Context<Self>) {
        self.set_keys(keys);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The last set stays; the pool goes on.
    }
}

impl<W> Handler<crate::losses::Shutdown> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl<W> Handler<SubscribeMembers> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = ();

    fn handle(&mut self, SubscribeMembers(watcher): SubscribeMembers, _: &mut Context<Self>) {
        // The members as of now first, when there are any yet.
        self.membership.subscribe(watcher);
    }
}
