//! The one front door: what a [`Coordinator`] answers on either backend, each call handed to
//! the seam of its concern ([`Locking`], [`Signalling`], [`Topics`]). The backend is chosen
//! once, when the coordinator is made; nothing here knows which it is. Each call's future owns
//! what it needs (`'static`), so it can be spawned; like any future it is to be awaited: one
//! dropped unawaited may or may not have made its request.

use std::future::Future;

use actix::prelude::*;
use futures_util::Stream;
use pgcoord::lease::LimitChange;
use pgcoord::topic::Cursor;
use pgcoord::{LeaseInfo, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

use pgcoord::{Config, Pool};

use super::{Locking, Signalling, Topics};
use crate::advisory::AdvisoryLocks;
use crate::leases::{Acquire, AcquirePermit, Claim, Lease, LockManager, SetLimit};
use crate::losses::{LockLost, SubscribeLockLost};
use crate::payloads::PayloadStoreActor;
use crate::signals::{Ask, ConnState, ListenerActor, Publish, Serve, Signal};
use crate::streams::{self, Heard, Subscription};
use crate::topics::{Append, Consume, TopicConsumer};

/// A pool to drain at shutdown, if it still runs.
pub(crate) type Drained = Box<dyn Fn() -> Option<Recipient<crate::Drain>> + Send>;

/// A process's pgcoord: on PostgreSQL, its actors over one connection pool
/// ([`connect`](Self::connect)); in memory, one process of a `backend::memory::MemoryBackend`,
/// for unit tests (feature `memory`). Its methods answer on both; the actors' addresses, for
/// actix code, are on PostgreSQL only. Cheap to clone; clones are the same process.
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) door: Door,
}

/// The PostgreSQL actors of one process, which share one connection pool.
#[derive(Clone)]
pub(crate) struct Actors {
    /// Leases.
    pub(crate) locks: Addr<LockManager>,
    /// Advisory locks, each on a session of its own (not from the pool).
    pub(crate) advisory: Addr<AdvisoryLocks>,
    /// Publish/subscribe and request/reply (supervised).
    pub(crate) signals: Addr<ListenerActor>,
    /// The payload store: large payloads put and fetched (fetches bounded to half the pool),
    /// expired rows deleted on a timer.
    pub(crate) payloads: Addr<PayloadStoreActor>,
    /// Appends to durable topics, batched.
    pub(crate) topics: Addr<crate::topics::TopicAppender>,
    /// What the actors were started with.
    pub(crate) config: Config,
    /// The pool they share.
    pub(crate) pool: Pool,
    /// The thread they run on: the actors this handle starts later (consumers, retention,
    /// schedules, observers) start there too, so a handle works from any thread (a tokio
    /// service's, through [`Runtime`](crate::Runtime)).
    pub(crate) arbiter: ArbiterHandle,
    /// Worker pools drained by [`shutdown`](Coordinator::shutdown) before anything is released.
    pub(crate) drained: std::sync::Arc<std::sync::Mutex<Vec<Drained>>>,
}

/// Which backend a coordinator runs on.
#[derive(Clone)]
pub(crate) enum Door {
    /// The actors, over one pool (shared: a coordinator is cloned freely).
    Postgres(std::sync::Arc<Actors>),
    /// One process of an in-memory backend.
    #[cfg(feature = "memory")]
    Memory(super::memory::MemoryCoordinator),
}

impl Door {
    pub(crate) fn locking(&self) -> &dyn Locking {
        match self {
            Door::Postgres(actors) => &actors.locks,
            #[cfg(feature = "memory")]
            Door::Memory(process) => process,
        }
    }

    pub(crate) fn signalling(&self) -> &dyn Signalling {
        match self {
            Door::Postgres(actors) => &actors.signals,
            #[cfg(feature = "memory")]
            Door::Memory(process) => process,
        }
    }

    pub(crate) fn topics(&self) -> &dyn Topics {
        match self {
            Door::Postgres(actors) => actors.as_ref(),
            #[cfg(feature = "memory")]
            Door::Memory(process) => process,
        }
    }

    /// The actors, when on PostgreSQL.
    pub(crate) fn postgres(&self) -> Option<&Actors> {
        match self {
            Door::Postgres(actors) => Some(actors),
            #[cfg(feature = "memory")]
            Door::Memory(_) => None,
        }
    }

    /// Ends `recipient`'s subscription to `channel` when called: what a dropped
    /// [`Subscription`] calls, holding no more than the seam it needs.
    fn unsubscriber(&self, channel: &str, recipient: Recipient<Signal>) -> streams::Unsubscribe {
        let channel = channel.to_owned();
        match self {
            Door::Postgres(actors) => {
                let signals = actors.signals.clone();
                Box::new(move || signals.unsubscribe(&channel, recipient))
            }
            #[cfg(feature = "memory")]
            Door::Memory(process) => {
                let process = process.clone();
                Box::new(move || process.unsubscribe(&channel, recipient))
            }
        }
    }

    /// Where streams' forwarders run: the actors' thread; in memory, the System the coordinator
    /// was made in.
    fn arbiter(&self) -> Result<ArbiterHandle> {
        match self {
            Door::Postgres(actors) => Ok(actors.arbiter.clone()),
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.arbiter(),
        }
    }
}

/// Leases, signals and topics: on either backend.
impl Coordinator {
    /// The owner identity this process holds its leases as.
    pub fn owner(&self) -> &str {
        match &self.door {
            Door::Postgres(actors) => actors.config.owner(),
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.owner(),
        }
    }

    /// Acquires a lease as [`Acquire`] says (wait, timeout, fail-if-locked, data, keep).
    pub fn acquire(&self, request: Acquire) -> impl Future<Output = Result<Lease>> + Send + use<> {
        self.door.locking().acquire(request)
    }

    /// Acquires a permit of a semaphore as [`AcquirePermit`] says (a fixed count, or the stored
    /// limit; timeout).
    pub fn acquire_permit(
        &self,
        request: AcquirePermit,
    ) -> impl Future<Output = Result<Lease>> + Send + use<> {
        self.door.locking().acquire_permit(request)
    }

    /// Stores a limited semaphore's limit ([`SetLimit`]): lowered, the highest permits are
    /// taken back.
    pub fn set_limit(
        &self,
        request: SetLimit,
    ) -> impl Future<Output = Result<LimitChange>> + Send + use<> {
        self.door.locking().set_limit(request)
    }

    /// Takes each of the [`Claim`]'s names that is free now, without waiting: the leases
    /// granted (what a worker pool claims its keys with).
    pub fn claim(&self, claim: Claim) -> impl Future<Output = Result<Vec<Lease>>> + Send + use<> {
        self.door.locking().claim(claim)
    }

    /// Inspects one lock, held or kept, granting nothing; [`pgcoord::ErrorKind::NotFound`] when there is
    /// none.
    pub fn get(&self, name: &str) -> impl Future<Output = Result<LeaseInfo>> + Send + use<> {
        self.door.locking().get(name)
    }

    /// The stored limit of semaphore `name` ([`SetLimit`]); `None` when it has none.
    pub fn limit(&self, name: &str) -> impl Future<Output = Result<Option<u32>>> + Send + use<> {
        self.door.locking().limit(name)
    }

    /// Every lock whose name starts with `prefix` (all of them for `""`), by name, granting
    /// nothing.
    pub fn list_prefix(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<LeaseInfo>>> + Send + use<> {
        self.door.locking().list_prefix(prefix)
    }

    /// Sends to every subscriber of the channel ([`Publish`]).
    pub fn publish(&self, publish: Publish) -> impl Future<Output = Result<()>> + Send + use<> {
        self.door.signalling().publish(publish)
    }

    /// Answers requests on a channel ([`Serve`]), until [`stop_serving`](Self::stop_serving).
    pub fn serve(&self, serve: Serve) -> impl Future<Output = Result<()>> + Send + use<> {
        self.door.signalling().serve(serve)
    }

    /// Stops answering requests on `channel`.
    pub fn stop_serving(&self, channel: &str) -> impl Future<Output = Result<()>> + Send + use<> {
        self.door.signalling().stop_serving(channel)
    }

    /// A request and its reply ([`Ask`]).
    pub fn ask(&self, ask: Ask) -> impl Future<Output = Result<Vec<u8>>> + Send + use<> {
        self.door.signalling().ask(ask)
    }

    /// [`ask`](Self::ask), with the reply decoded from MessagePack into `R` (what a
    /// [`Serve::typed`] handler answers); a reply that does not decode is an error of kind
    /// [`pgcoord::ErrorKind::Other`] that says so.
    pub fn ask_returning<R: DeserializeOwned>(
        &self,
        ask: Ask,
    ) -> impl Future<Output = Result<R>> + Send + use<R> {
        let reply = self.ask(ask);
        async move { pgcoord::signal::from_payload(&reply.await?) }
    }

    /// Appends `body` to durable topic `topic`: its cursor. On PostgreSQL in a transaction of
    /// its own, batched with the appends under way (group commit); in memory, at once. The
    /// body is copied when the call is made. Typed errors for a bad topic name
    /// ([`pgcoord::ErrorKind::InvalidName`]) or a body over `pgcoord::topic::MAX_BODY_BYTES`
    /// ([`pgcoord::ErrorKind::PayloadTooLarge`]), nothing appended. Appending in your own
    /// transaction is the core's [`TopicTable::append`](pgcoord::topic::TopicTable::append),
    /// which takes the same arguments after the client.
    pub fn append(
        &self,
        topic: &str,
        body: &[u8],
    ) -> impl Future<Output = Result<Cursor>> + Send + use<> {
        self.door.topics().append(Append::new(topic, body))
    }

    /// [`append`](Self::append)s `value` encoded as MessagePack with named fields (read it with
    /// `Event::value`), as the core's
    /// [`TopicTable::append_value`](pgcoord::topic::TopicTable::append_value). A value that
    /// does not encode is an error of kind [`pgcoord::ErrorKind::Other`] that says so, and
    /// nothing is sent.
    pub fn append_value<T: Serialize + ?Sized>(
        &self,
        topic: &str,
        value: &T,
    ) -> pgcoord::BoxFuture<'static, Result<Cursor>> {
        // Encoded now, so the future borrows nothing of `value`'s.
        match pgcoord::signal::to_payload(value) {
            Ok(body) => Box::pin(self.append(topic, &body)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Starts a consumer of durable topic events in this process as [`Consume`] says: it
    /// delivers while it holds the consumer's lease, and waits for it otherwise. Typed errors
    /// for a bad name, window or poll, before anything starts. It runs until
    /// [`TopicConsumer::stop`] or the System stops (dropping the handle does not stop it).
    pub fn consume(&self, consume: Consume) -> Result<TopicConsumer> {
        self.door.topics().consume(consume)
    }

    /// A [`RateLimiter`](crate::RateLimiter) at `rate`: fleet-wide rate limits per key, each
    /// take one statement on the server's clock (in memory, the backend's buckets, shared by its
    /// coordinators).
    pub fn rate_limiter(&self, rate: pgcoord::rate::RateLimit) -> crate::RateLimiter {
        match &self.door {
            Door::Postgres(actors) => {
                let table = pgcoord::RateTable::new(&actors.config);
                crate::RateLimiter::new(table, actors.pool.clone(), rate)
            }
            #[cfg(feature = "memory")]
            Door::Memory(process) => process.rate_limiter(rate),
        }
    }

    /// Every message published on `channel` from now on, and a
    /// [`Heard::Gap`](crate::Heard::Gap) wherever some may have been missed, as a stream.
    /// Dropping it unsubscribes. Typed errors for a bad channel name. Answers once the channel is
    /// listened on: while the listener has no connection that is the next connection's LISTEN,
    /// however long that takes — bound it with `tokio::time::timeout`; a subscription given up
    /// before it answered is undone.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        // A bad name is refused before anything is registered.
        pgcoord::ident::Ident::channel(channel)?;
        let channel = channel.to_owned();
        let ours = channel.clone();
        let keep = move |heard: &Heard| match heard {
            Heard::Signal(_) => true,
            Heard::Gap(state) => state.may_have_missed(&ours),
        };
        let (forwarder, feed) = streams::forward(&self.door.arbiter()?, Some(Box::new(keep)));
        let recipient = forwarder.clone().recipient::<Signal>();
        // Made before anything is registered: an error or a caller giving up below drops it,
        // which unsubscribes (a LISTEN left behind would be a leak).
        let unsubscribe = self.door.unsubscriber(&channel, recipient.clone());
        let subscription = Subscription::new(feed, channel.clone(), unsubscribe);
        // Connection states first: a gap between the two registrations is then reported.
        let signalling = self.door.signalling();
        signalling
            .subscribe_conn_state(forwarder.recipient())
            .await?;
        signalling.subscribe(&channel, recipient).await?;
        Ok(subscription)
    }

    /// Every lock this process loses from now on — leases and advisory locks alike, each once
    /// ([`LockLost`]) — as a stream. Dropping it unsubscribes.
    pub async fn lock_losses(&self) -> Result<impl Stream<Item = LockLost> + Send + Unpin + use<>> {
        let (forwarder, feed) = streams::forward(&self.door.arbiter()?, None);
        let locking = self.door.locking();
        locking
            .subscribe_lock_lost(forwarder.clone().recipient())
            .await?;
        // Advisory locks are PostgreSQL's alone.
        if let Some(actors) = self.door.postgres() {
            let subscribe = actors
                .advisory
                .send(SubscribeLockLost(forwarder.recipient()));
            streams::told(subscribe).await?;
        }
        Ok(feed)
    }

    /// The listener's connection states from now on ([`ConnState`]; the current one first), as
    /// a stream: `Reconnected` and `MessageLost` are what a service resyncs on. Dropping it
    /// unsubscribes.
    pub async fn conn_states(
        &self,
    ) -> Result<impl Stream<Item = ConnState> + Send + Unpin + use<>> {
        let (forwarder, feed) = streams::forward(&self.door.arbiter()?, None);
        let signalling = self.door.signalling();
        signalling
            .subscribe_conn_state(forwarder.recipient())
            .await?;
        Ok(feed)
    }
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("Coordinator");
        debug.field("owner", &self.owner());
        // The configuration's own Debug never shows the password.
        if let Some(actors) = self.door.postgres() {
            debug.field("lock_table", &actors.config.lock_table().to_string());
        }
        debug.finish_non_exhaustive()
    }
}
