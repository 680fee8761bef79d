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
//! released per tick; [`SubscribeMembers`] tells of members joining and leaving, and
//! [`KeyRouter::members`] lists them from any process.
//!
//! A worker runs only while its key's lease is held: when the lease is lost the pool tells the
//! worker to stop ([`StopWorker`]) at once — the holder learns of a loss before the server could
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{debug, warn};

use crate::backend::Locking;
use crate::leases::Lease;

mod activate;
mod build;
mod deliver;
mod drain;
mod mail;
mod members;
mod messages;
mod plan;
mod reach;
mod rebalance;
// The in-memory backend reaches holders through a `route::Holders` of its own.
pub(crate) mod route;
mod tasks;
// The in-memory backend's routes use the same channels.
pub(crate) mod wire;

use deliver::Routing;
use drain::Draining;
pub use members::{MembersChanged, SubscribeMembers};
pub use messages::{
    AssignedKey, Assignment, Drain, GetAssignment, Mail, SetKeys, StopWorker, WorkerKey, mail_topic,
};
pub use route::{KeyRouter, Routed};
pub use tasks::{TaskPool, Workers};

struct Running<W: Actor> {
    /// Shared with the worker's [`WorkerKey`]: released once both are done with it.
    lease: Arc<Lease>,
    worker: Addr<W>,
    /// Told to stop for idleness ([`WorkerPool::passivate_after`]): the key stays held, and
    /// the next routed message starts a worker again once this one has stopped.
    passive: bool,
    /// The worker's start or its last routed message.
    used: std::time::Instant,
    /// Told messages ([`KeyRouter::tell`]) handed to the worker and not yet handled.
    told: Arc<std::sync::atomic::AtomicUsize>,
}

/// One process's part of a worker pool. Start it with [`WorkerPool::new`] and `.start()`;
/// [`crate::Shutdown`] stops its workers and releases its keys (its ticks keep it running when
/// every address is dropped).
pub struct WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    name: String,
    keys: Vec<String>,
    locks: Arc<dyn Locking>,
    /// The lock table's name (routed requests' channels are scoped to it).
    lock_table: String,
    owner: String,
    tick: Duration,
    factory: Box<dyn Fn(WorkerKey) -> W>,
    membership: Option<Lease>,
    running: HashMap<String, Running<W>>,
    /// The live members at the last tick, by owner (this one included once registered).
    members: Vec<String>,
    watchers: Vec<Recipient<MembersChanged>>,
    restarts: u64,
    ticking: bool,
    ticks: u64,
    /// At most this many keys released, and this many claimed, per tick.
    max_moves: usize,
    /// Idle workers stop after this long; their keys stay held.
    passivate_after: Option<Duration>,
    /// This member's weight: its share is its part of the members' total weight.
    weight: u32,
    metrics: crate::metrics::WorkerMetrics,
    /// Set by [`Drain`]: the pool hands its keys over and stops.
    drain: Option<Draining>,
    /// Key sets to follow, each replacing the last (see [`WorkerPool::follow`]).
    key_stream: Option<std::pin::Pin<Box<dyn futures_util::Stream<Item = Vec<String>>>>>,
    routing: Option<Routing<W>>,
    /// Set by [`WorkerPool::durable`]: each key's durable mail goes to its worker.
    mailing: Option<mail::Mailing<W>>,
    /// Set by [`WorkerPool::activate_keys`]: keys recorded under the pool are served too.
    activate_keys: bool,
    /// The keys recorded under the pool at the last tick that are not in `keys`.
    recorded: std::collections::HashSet<String>,
    /// The routers' doorbell: when a ring makes the pool look for recorded keys.
    doorbell: crate::signals::doorbell::Gate,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    /// leases go.
    fn set_keys(&mut self, keys: Vec<String>) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|k| !keys.contains(k) && !self.recorded.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.stop_key(&key);
        }
        self.keys = keys;
    }

    /// Whether `key` is the pool's: one of its keys, or recorded under it.
    fn has_key(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key) || self.recorded.contains(key)
    }

    fn key_lease(&self, key: &str) -> String {
        format!("{}/keys/{key}", self.name)
    }

    fn start_worker(&self, key: &str, lease: &Arc<Lease>) -> Addr<W> {
        (self.factory)(WorkerKey {
            key: key.to_owned(),
            token: lease.token(),
            lease: lease.clone(),
        })
        .start()
    }

    /// The worker of `key` to hand a message to, when this process holds the key (not lost):
    /// started again if it was passivated and has stopped. None while a passivated worker is
    /// still stopping (nothing is delivered; the caller tries again), or when not held here.
    fn awake_worker(&mut self, key: &str) -> Option<Addr<W>> {
        let running = self.running.get(key)?;
        if running.lease.loss().is_some() {
            return None;
        }
        if running.passive {
            if running.worker.connected() {
                return None;
            }
            let worker = self.start_worker(key, &running.lease.clone());
            let running = self.running.get_mut(key)?;
            running.worker = worker;
            running.passive = false;
        }
        let running = self.running.get_mut(key)?;
        if !running.worker.connected() {
            return None;
        }
        running.used = std::time::Instant::now();
        Some(running.worker.clone())
    }

    /// Stops `key`'s worker, waits until it has stopped and dropped its copy of the lease (its
    /// [`WorkerKey`], and any clone of it), then lets the lease go: another process can start
    /// the key's next worker only after this one ended. The wait is on the worker's own code,
    /// not the network: a worker that does not stop keeps its key's lease (renewed, and warned
    /// about every tick) rather than let a second worker start.
    fn stop_key(&mut self, key: &str) -> Option<tokio::task::JoinHandle<()>> {
        self.running.remove(key).map(|Running { lease, worker, .. }| {
            self.metrics.released.increment(1);
            self.metrics.keys.set(self.running.len() as f64);
            worker.do_send(StopWorker);
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
        if self
            .running
            .get(key)
            .is_some_and(|r| r.lease.token() == token)
        {
            warn!(pool.name = %self.name, worker.key = %key, "key's lease lost; its worker stops");
            if let Some(running) = self.running.remove(key) {
                running.worker.do_send(StopWorker);
            }
            self.metrics.keys.set(self.running.len() as f64);
        }
    }

    /// The members read at this tick: watchers are told of a change.
    fn set_members(&mut self, now: Vec<String>) {
        if let Some(change) = members::change(&self.members, &now) {
            // A watcher that stopped is dropped.
            self.watchers.retain(|w| w.try_send(change.clone()).is_ok());
        }
        self.members = now;
    }
}

impl<W> Actor for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(keys) = self.key_stream.take() {
            ctx.add_stream(keys);
        }
        if let Some(routing) = self.routing.as_mut()
            && let Some(serve) = routing.serve.take()
        {
            // Listened to from here on, also across the listener's reconnects.
            let served = routing.signals.serve(serve(ctx.address()));
            ctx.spawn(served.into_actor(self).map(|served, act, _| {
                if served.is_err() {
                    warn!(pool.name = %act.name, "cannot serve routed messages; senders' calls time out");
                }
            }));
        }
        self.start_mail(ctx);
        self.start_activation(ctx);
        self.rebalance(ctx);
        ctx.run_interval(self.tick, |act, ctx| act.rebalance(ctx));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let keys: Vec<String> = self.running.keys().cloned().collect();
        let released: Vec<_> = keys.iter().filter_map(|key| self.stop_key(key)).collect();
        if let Some(routing) = self.routing.take() {
            // Served until the keys are released and a tick more: a router that read this
            // process as a key's holder is told "not here" (the pool is gone) and looks again,
            // instead of waiting out its deadline for an answer nobody would send.
            let tick = self.tick;
            actix::spawn(async move {
                futures_util::future::join_all(released).await;
                tokio::time::sleep(tick).await;
                let _ = routing.signals.stop_serving(&routing.channel).await;
            });
        }
        if let Some(membership) = self.membership.take() {
            actix::spawn(async move {
                let _ = membership.release().await;
            });
        }
    }
}

impl<W> Handler<GetAssignment> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = Assignment;

    fn handle(&mut self, _: GetAssignment, _: &mut Context<Self>) -> Assignment {
        let mut keys: Vec<AssignedKey> = self
            .running
            .iter()
            .filter(|(_, r)| r.lease.loss().is_none())
            .map(|(key, r)| AssignedKey {
                key: key.clone(),
                token: r.lease.token(),
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        Assignment {
            keys,
            members: self.members.len().max(1),
            ticks: self.ticks,
            passive: self.running.values().filter(|r| r.passive).count(),
            restarts: self.restarts,
            mail_reads: self.mailing.as_ref().map_or(0, |m| m.reads),
        }
    }
}

impl<W> Handler<SetKeys> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ();

    fn handle(&mut self, SetKeys(keys): SetKeys, _: &mut Context<Self>) {
        self.set_keys(keys);
    }
}

impl<W> StreamHandler<Vec<String>> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
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
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl<W> Handler<SubscribeMembers> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ();

    fn handle(&mut self, SubscribeMembers(watcher): SubscribeMembers, _: &mut Context<Self>) {
        // The members as of now first, when there are any yet.
        if let Some(now) = members::change(&[], &self.members)
            && watcher.try_send(now).is_err()
        {
            return;
        }
        self.watchers.push(watcher);
    }
}
