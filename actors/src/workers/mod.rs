//! [`WorkerPool`]: exactly one worker actor per key across every process of a fleet.
//!
//! Each key is a lease (`"{pool}/keys/{key}"`); each process in the fleet is a member, a lease of
//! its own (`"{pool}/members/{owner}"`), so membership lives in PostgreSQL and ends with the
//! process. Every tick (a quarter lease) a pool counts the live members, takes its fair share
//! (`ceil(keys ÷ members)`, or by [`weight`](WorkerPool::weight)) — releasing keys above it, claiming free keys up to it in batched
//! statements ([`Claim`]) — and starts one worker per key it holds, handing it the key and its
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
//! most once ([`route`] says how, and what a caller can know).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;
use tracing::{debug, info, warn};

use crate::Call;
use crate::leases::{Acquire, Claim, Lease, ListPrefix, LockManager};
use crate::signals::{ListenerActor, Serve, StopServing};

mod members;
mod messages;
pub mod route;

pub use members::{MembersChanged, SubscribeMembers};
pub use messages::{AssignedKey, Assignment, Drain, GetAssignment, SetKeys, StopWorker, WorkerKey};
use route::Reply;
pub use route::{KeyRouter, Routed};

struct Running<W: Actor> {
    /// Shared with the worker's [`WorkerKey`]: released once both are done with it.
    lease: Arc<Lease>,
    worker: Addr<W>,
    /// Told to stop for idleness ([`WorkerPool::passivate_after`]): the key stays held, and
    /// the next routed message starts a worker again once this one has stopped.
    passive: bool,
    /// The worker's start or its last routed message.
    used: std::time::Instant,
}

/// How a routed pool answers its channel: the listener, and the request handler made where
/// the worker's `Handler<Routed>` is known.
struct Routing<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    listener: Addr<ListenerActor>,
    channel: String,
    serve: Option<MakeServe<W>>,
}

/// A pool handing its keys over before it stops.
#[derive(Default)]
struct Draining {
    /// Who asked, told once every key is released.
    waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Releases under way.
    releasing: Vec<tokio::task::JoinHandle<()>>,
    /// Every key is let go: waiting for the releases, then stopping.
    finishing: bool,
}

/// Makes the pool's [`Serve`] once its address exists.
type MakeServe<W> = Box<dyn FnOnce(Addr<WorkerPool<W>>) -> Serve>;

/// One process's part of a worker pool. Start it with [`WorkerPool::new`] and `.start()`;
/// [`crate::Shutdown`] (or dropping every address) stops its workers and releases its keys.
pub struct WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    name: String,
    keys: Vec<String>,
    locks: Addr<LockManager>,
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
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
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
        let name = name.into();
        WorkerPool {
            metrics: crate::metrics::WorkerMetrics::new(&name),
            name,
            keys,
            locks,
            owner: config.owner().to_owned(),
            tick: (config.lease() / 4).max(Duration::from_millis(10)),
            factory: Box::new(factory),
            membership: None,
            running: HashMap::new(),
            members: Vec::new(),
            watchers: Vec::new(),
            restarts: 0,
            ticking: false,
            ticks: 0,
            max_moves: usize::MAX,
            passivate_after: None,
            weight: 1,
            drain: None,
            key_stream: None,
            routing: None,
        }
    }

    /// Takes its keys from `keys` instead: each item is the whole set, replacing the last (as
    /// [`SetKeys`] does) — customers added and removed as they come and go. The pool keeps
    /// running with the last set when the stream ends.
    pub fn follow(
        mut self,
        keys: impl futures_util::Stream<Item = Vec<String>> + 'static,
    ) -> WorkerPool<W> {
        self.key_stream = Some(Box::pin(keys));
        self
    }

    /// Moves at most `keys` keys per tick each way: at most that many released (above the fair
    /// share) and that many claimed, so a join or leave spreads its moves — and the workers'
    /// start-up cost — over several ticks. Unlimited by default; at least 1.
    pub fn max_moves(mut self, keys: usize) -> WorkerPool<W> {
        self.max_moves = keys.max(1);
        self
    }

    /// Stops a key's worker after it has had no routed message for `idle` (checked each tick);
    /// the key stays held here, and its next routed message starts a worker again (given the
    /// same lease). For pools of many keys that are seldom used. Default: never.
    pub fn passivate_after(mut self, idle: Duration) -> WorkerPool<W> {
        self.passivate_after = Some(idle);
        self
    }

    /// This member's weight (default 1, at least 1): it takes its weight's part of the keys,
    /// `ceil(keys × weight ÷ total weight)` — a process with three times the cores can take
    /// three times the keys. Stored with its member lease, so every member counts it.
    pub fn weight(mut self, weight: u32) -> WorkerPool<W> {
        self.weight = weight.max(1);
        self
    }

    /// Replaces the keys: workers of keys no longer listed stop and their leases go.
    fn set_keys(&mut self, keys: Vec<String>) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|k| !keys.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.stop_key(&key);
        }
        self.keys = keys;
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

    /// A draining pool's tick: up to `max_moves` keys let go (each worker stopped before its
    /// lease goes); once none is left, the releases are awaited, the callers told, the pool
    /// stopped.
    fn drain_some(&mut self, ctx: &mut Context<Self>) {
        let going: Vec<String> = self.running.keys().take(self.max_moves).cloned().collect();
        let released: Vec<_> = going.iter().filter_map(|key| self.stop_key(key)).collect();
        let Some(drain) = self.drain.as_mut() else {
            return;
        };
        drain.releasing.extend(released);
        if !self.running.is_empty() || drain.finishing {
            return;
        }
        drain.finishing = true;
        let releasing = futures_util::future::join_all(std::mem::take(&mut drain.releasing));
        ctx.spawn(releasing.into_actor(self).map(|_, act, ctx| {
            for waiter in act.drain.take().map(|d| d.waiters).unwrap_or_default() {
                let _ = waiter.send(());
            }
            ctx.stop();
        }));
    }

    /// The members read at this tick: watchers are told of a change.
    fn set_members(&mut self, now: Vec<String>) {
        if let Some(change) = members::change(&self.members, &now) {
            // A watcher that stopped is dropped.
            self.watchers.retain(|w| w.try_send(change.clone()).is_ok());
        }
        self.members = now;
    }

    /// One round: membership, share, release above it, claim up to it, revive workers.
    fn rebalance(&mut self, ctx: &mut Context<Self>) {
        if self.ticking {
            return;
        }
        self.ticking = true;
        self.ticks += 1;
        // Losses first: a worker whose lease is gone stops now.
        let lost: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.lease.loss().is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in lost {
            warn!(pool.name = %self.name, worker.key = %key, "key's lease lost; its worker stops");
            if let Some(running) = self.running.remove(&key) {
                running.worker.do_send(StopWorker);
            }
        }
        self.metrics.keys.set(self.running.len() as f64);
        if let Some(idle) = self.passivate_after {
            for running in self.running.values_mut() {
                if !running.passive && running.used.elapsed() >= idle {
                    running.worker.do_send(StopWorker);
                    running.passive = true;
                }
            }
        }
        // Workers that stopped (a panic) while their lease is held start again.
        let dead: Vec<(String, Arc<Lease>)> = self
            .running
            .iter()
            .filter(|(_, r)| !r.passive && !r.worker.connected())
            .map(|(k, r)| (k.clone(), r.lease.clone()))
            .collect();
        for (key, lease) in dead {
            self.restarts += 1;
            warn!(pool.name = %self.name, worker.key = %key, "worker stopped while its key is held; starting it again");
            let worker = self.start_worker(&key, &lease);
            if let Some(running) = self.running.get_mut(&key) {
                running.worker = worker;
            }
        }
        let member_lease = format!("{}/members/{}", self.name, self.owner);
        let needs_membership =
            self.drain.is_none() && (self.membership.as_ref()).is_none_or(|m| m.loss().is_some());
        let (locks, prefix, key_prefix) = (
            self.locks.clone(),
            format!("{}/members/", self.name),
            format!("{}/keys/", self.name),
        );
        let first_tick = self.ticks == 1;
        let weight = self.weight;
        let round = async move {
            let membership = if needs_membership {
                let acquire = Acquire::new(member_lease)
                    .fail_if_locked()
                    .replace_data()
                    .value(&weight)?;
                Some(locks.call(acquire).await)
            } else {
                None
            };
            let members = locks.call(ListPrefix(prefix)).await?;
            let keys = locks.call(ListPrefix(key_prefix)).await?;
            Ok::<_, pgcoord::Error>((membership, members, keys))
        };
        ctx.spawn(round.into_actor(self).map(move |result, act, ctx| {
            act.ticking = false;
            let (membership, members, keys) = match result {
                Ok(found) => found,
                Err(e) => {
                    warn!(pool.name = %act.name, error = %e, "cannot rebalance; trying at the next tick");
                    return;
                }
            };
            match membership {
                // A drain began meanwhile: the lease is dropped, so released.
                Some(Ok(lease)) if act.drain.is_none() => act.membership = Some(lease),
                Some(Ok(_)) => {}
                Some(Err(e)) => debug!(pool.name = %act.name, error = %e, "not a member yet"),
                None => {}
            }
            let prefix = format!("{}/members/", act.name);
            act.set_members(members::live(&members, &prefix));
            if act.drain.is_some() {
                act.drain_some(ctx);
                return;
            }
            // Processes starting together register before anyone claims.
            if first_tick {
                return;
            }
            let share = members::share(&members, &prefix, &act.owner, act.weight, act.keys.len());
            if act.running.len() > share {
                let extra: Vec<String> = act
                    .running
                    .keys()
                    .take((act.running.len() - share).min(act.max_moves))
                    .cloned()
                    .collect();
                for key in extra {
                    act.stop_key(&key);
                }
                return;
            }
            let want = (share - act.running.len()).min(act.max_moves);
            if want == 0 {
                return;
            }
            let taken: std::collections::HashSet<&str> = keys
                .iter()
                .filter(|k| k.is_held())
                .map(|k| k.name.as_str())
                .collect();
            let free: Vec<String> = act
                .keys
                .iter()
                .filter(|k| !act.running.contains_key(k.as_str()))
                .map(|k| act.key_lease(k))
                .filter(|lease| !taken.contains(lease.as_str()))
                .take(want)
                .collect();
            if free.is_empty() {
                return;
            }
            let claim = act.locks.send(Claim { names: free });
            ctx.spawn(claim.into_actor(act).map(|result, act, ctx| match result {
                Ok(Ok(leases)) => {
                    let prefix = format!("{}/keys/", act.name);
                    for lease in leases {
                        let key = lease.name()[prefix.len()..].to_owned();
                        if !act.keys.contains(&key) {
                            continue; // keys changed meanwhile: dropped, so released
                        }
                        let (token, lost) = (lease.token(), lease.lost());
                        let lease = Arc::new(lease);
                        let worker = act.start_worker(&key, &lease);
                        let used = std::time::Instant::now();
                        let passive = false;
                        act.running.insert(key.clone(), Running { lease, worker, passive, used });
                        act.metrics.claimed.increment(1);
                        act.metrics.keys.set(act.running.len() as f64);
                        ctx.spawn(lost.into_actor(act).map(move |_, act, _| act.lost(&key, token)));
                    }
                }
                Ok(Err(e)) => warn!(pool.name = %act.name, error = %e, "cannot claim keys"),
                Err(e) => warn!(pool.name = %act.name, error = %e, "lock manager gone"),
            }));
        }));
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
            let served = routing.listener.send(serve(ctx.address()));
            ctx.spawn(served.into_actor(self).map(|served, act, _| {
                if !matches!(served, Ok(Ok(()))) {
                    warn!(pool.name = %act.name, "cannot serve routed messages; senders' calls time out");
                }
            }));
        }
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
                routing.listener.do_send(StopServing(routing.channel));
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

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker> + Handler<Routed>,
{
    /// Delivers messages from [`KeyRouter`]s to this pool's workers (which handle [`Routed`]),
    /// answering on this member's channel through `listener`. Every process's pool of the name
    /// should be routed, or messages to the keys of one that is not time out.
    pub fn routed(mut self, listener: Addr<ListenerActor>) -> WorkerPool<W> {
        let channel = route::channel(&self.name, &self.owner);
        let served = channel.clone();
        let serve = move |pool: Addr<WorkerPool<W>>| {
            Serve::new(served, move |request: Vec<u8>| {
                let pool = pool.clone();
                async move {
                    let routed = route::decode_request(request)?;
                    // A pool that stopped holds no key.
                    let reply = pool.send(Deliver(routed)).await.unwrap_or(Reply::NotHere);
                    Ok(reply.encode())
                }
            })
        };
        self.routing = Some(Routing {
            listener,
            channel,
            serve: Some(Box::new(serve)),
        });
        self
    }
}

/// A routed message arrived for a key: to its worker, if this process holds the key.
#[derive(Message)]
#[rtype(result = "Reply")]
struct Deliver(Routed);

impl<W> Handler<Deliver> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker> + Handler<Routed>,
{
    type Result = ResponseFuture<Reply>;

    fn handle(&mut self, Deliver(routed): Deliver, _: &mut Context<Self>) -> Self::Result {
        let not_here = || -> Self::Result { Box::pin(async { Reply::NotHere }) };
        let Some(running) = self.running.get(&routed.key) else {
            return not_here();
        };
        // Held, not lost: the key's only worker is here, or one is started for it.
        if running.lease.loss().is_some() {
            return not_here();
        }
        if running.passive {
            // The idle worker has not stopped yet: nothing delivered; the router looks again.
            if running.worker.connected() {
                return not_here();
            }
            let worker = self.start_worker(&routed.key, &running.lease.clone());
            if let Some(running) = self.running.get_mut(&routed.key) {
                running.worker = worker;
                running.passive = false;
            }
        }
        let Some(running) = self.running.get_mut(&routed.key) else {
            return not_here();
        };
        if !running.worker.connected() {
            return not_here();
        }
        running.used = std::time::Instant::now();
        let worker = running.worker.clone();
        let handled = worker.send(routed);
        Box::pin(async move {
            match handled.await {
                Ok(Ok(answer)) => Reply::Handled(answer),
                Ok(Err(why)) => Reply::Failed(why),
                // It was in the worker's mailbox: handled or not, no one can say.
                Err(_) => Reply::Unknown,
            }
        })
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

impl<W> Handler<Drain> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> Self::Result {
        let (told, drained) = tokio::sync::oneshot::channel();
        let first = self.drain.is_none();
        self.drain
            .get_or_insert_with(Draining::default)
            .waiters
            .push(told);
        if first {
            info!(pool.name = %self.name, keys = self.running.len(), "draining: handing every key over");
            // Out of the membership first: the other members' shares grow to cover these keys.
            if let Some(membership) = self.membership.take() {
                actix::spawn(async move {
                    let _ = membership.release().await;
                });
            }
        }
        // Resolves also when the pool stopped another way (its keys are then released too).
        Box::pin(async move {
            let _ = drained.await;
        })
    }
}
