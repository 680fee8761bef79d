//! Backends: PostgreSQL, and in memory (`memory`, feature `memory`) for unit tests of an
//! application's code. A [`Coordinator`] is made on one of them and answers the same on both
//! (its methods are the one front door); inside the crate each concern has one seam, so a wing
//! never names the in-memory backend: `Locking`, `Signalling` and `Topics` here, and for what
//! users do not reach — a lease handle's release and fence (`Keeper`), a delivery's ack
//! (`Acker`), a started consumer (`Consumer`, behind a [`TopicConsumer`]), a rate limiter's buckets
//! (`Buckets`), a router's way to a key's holder (`Holders`). Each has its PostgreSQL
//! implementation beside its wing and its in-memory one under `memory`; what a coordinator
//! makes on either backend (a worker pool, a router, a rate limiter) is dispatched in `door`.
//!
//! The in-memory backend is **no substitute for testing against PostgreSQL**: it has no
//! connections to fail, no clock to disagree, no heartbeats, and no other processes. It keeps the
//! semantics an application's logic depends on — one holder per lease, strictly increasing
//! fencing tokens, fair waiting, loss reported once, delivery to every subscriber, request and
//! reply with errors and timeouts; for durable topics, one active consumer per name, delivery
//! at least once and in order, the same event again after a handler's `Err` or panic, a fenced
//! `Delivery::ack` (no retention, no horizon: every append is at once final) — and lets a test
//! force what PostgreSQL would do to it: a lost lease (`MemoryBackend::force_loss`) and a
//! listener reconnect (`MemoryBackend::reconnect`). What needs the actors (elections,
//! schedules, advisory locks, durable mail, a graceful shutdown) answers
//! [`pgcoord::ErrorKind::Unsupported`] there. The suites in `actors/tests/it/backends.rs` and
//! `backend_pools.rs` run the same tests against both.
//!
//! A job written against a [`Coordinator`], and its unit test on the in-memory backend:
//!
//! ```rust
//! use pgcoord_actors::backend::memory::MemoryBackend;
//! use pgcoord_actors::{Acquire, Coordinator, LossReason};
//!
//! async fn nightly(coordinator: Coordinator) -> pgcoord::Result<&'static str> {
//!     let lease = coordinator.acquire(Acquire::new("nightly").fail_if_locked()).await?;
//!     tokio::select! {
//!         _ = tokio::time::sleep(std::time::Duration::from_secs(3600)) => Ok("done"),
//!         Some(LossReason::TakenOver) = lease.lost() => Ok("stopped"),
//!     }
//! }
//! # actix_rt::System::new().block_on(async {
//! let backend = MemoryBackend::new();
//! let (ours, theirs) = (backend.coordinator("ours"), backend.coordinator("theirs"));
//! let job = actix_rt::spawn(nightly(ours.clone()));
//! tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! assert!(nightly(theirs).await.unwrap_err().is_not_acquired());
//! assert!(backend.force_loss("nightly")); // as if the lease expired and was taken over
//! assert_eq!(job.await.unwrap()?, "stopped");
//! # Ok::<_, pgcoord::Error>(()) }).unwrap();
//! ```

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};

use crate::call::Call;
use crate::leases::{
    Acquire, AcquirePermit, Claim, Get, GetLimit, Lease, ListPrefix, LockManager, SetLimit,
};
use crate::losses::{LockLost, SubscribeLockLost};
use crate::signals::{
    Ask, ConnState, ListenerActor, Publish, Serve, Signal, Subscribe, SubscribeConnState,
    Unsubscribe,
};
use crate::streams::told;
use crate::topics::{Append, Consume, ConsumerActor, TopicConsumer};
use pgcoord::topic::Cursor;

pub(crate) mod door;
#[cfg(feature = "memory")]
pub mod memory;
mod pools;

pub(crate) use crate::seam::BoxFuture;
pub(crate) use door::{Actors, Coordinator, Door};

/// Leases: what a [`LockManager`] does, as a backend.
pub(crate) trait Locking: Send + Sync {
    /// Acquires a lease as [`Acquire`] says (wait, timeout, fail-if-locked, data, keep).
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>>;
    /// Acquires a permit of a semaphore as [`AcquirePermit`] says (a fixed count, or the
    /// stored limit; timeout).
    fn acquire_permit(&self, request: AcquirePermit) -> BoxFuture<Result<Lease>>;
    /// Stores a limited semaphore's limit ([`SetLimit`]): lowered, the highest permits are
    /// taken back.
    fn set_limit(&self, request: SetLimit) -> BoxFuture<Result<pgcoord::lease::LimitChange>>;
    /// Inspects one lock, held or kept, granting nothing; [`pgcoord::ErrorKind::NotFound`] when
    /// there is none.
    fn get(&self, name: &str) -> BoxFuture<Result<LeaseInfo>>;
    /// The stored limit of semaphore `name` ([`SetLimit`]); `None` when it has none.
    fn limit(&self, name: &str) -> BoxFuture<Result<Option<u32>>>;
    /// Registers `recipient` for [`LockLost`], sent once per lease of this backend lost.
    fn subscribe_lock_lost(&self, recipient: Recipient<LockLost>) -> BoxFuture<Result<()>>;
    /// Takes each of the [`Claim`]'s names that is free now, without waiting: the leases
    /// granted (what a worker pool claims its keys with).
    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>>;
    /// Every lock whose name starts with `prefix` (all of them for `""`), by name, granting
    /// nothing (a worker pool's members and keys).
    fn list_prefix(&self, prefix: &str) -> BoxFuture<Result<Vec<LeaseInfo>>>;
    /// Whether the tenure of `name` with `token` was asked to step down, by a request stored in
    /// the database (`pgcoord::LeaseTable::request_resign`: an election's leader asked to
    /// resign, a worker pool's member asked to drain from `pgcoord ui`). Nobody asks the
    /// in-memory backend: `false` there.
    fn resign_requested(&self, name: &str, token: i64) -> BoxFuture<Result<bool>> {
        let _ = (name, token);
        Box::pin(async { Ok(false) })
    }
}

/// Publish/subscribe and request/reply: what a [`ListenerActor`] does, as
/// a backend.
pub(crate) trait Signalling: Send + Sync {
    /// Sends to every subscriber of the channel ([`Publish`]).
    fn publish(&self, publish: Publish) -> BoxFuture<Result<()>>;
    /// Delivers every message on `channel` to `recipient` ([`Subscribe`]).
    fn subscribe(&self, channel: &str, recipient: Recipient<Signal>) -> BoxFuture<Result<()>>;
    /// Ends a subscription ([`Unsubscribe`]), at once: a dropped subscription calls it.
    fn unsubscribe(&self, channel: &str, recipient: Recipient<Signal>);
    /// Answers requests on a channel ([`Serve`]).
    fn serve(&self, serve: Serve) -> BoxFuture<Result<()>>;
    /// Stops answering requests on `channel` ([`Unsubscribe::serving`]).
    fn stop_serving(&self, channel: &str) -> BoxFuture<Result<()>>;
    /// A request and its reply ([`Ask`]).
    fn ask(&self, ask: Ask) -> BoxFuture<Result<Vec<u8>>>;
    /// Registers `recipient` for [`ConnState`] broadcasts.
    fn subscribe_conn_state(&self, recipient: Recipient<ConnState>) -> BoxFuture<Result<()>>;
}

/// Durable topics: what the topic appender and consumer actors do, as a
/// backend.
pub(crate) trait Topics: Send + Sync {
    /// Appends an event ([`Append`]); its cursor.
    fn append(&self, append: Append) -> BoxFuture<Result<Cursor>>;
    /// Starts consuming as [`Consume`] says, until [`TopicConsumer::stop`]. Typed errors for bad
    /// settings, before anything starts.
    fn consume(&self, consume: Consume) -> Result<TopicConsumer>;
}

impl Locking for Addr<LockManager> {
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>> {
        Box::pin(self.call(request))
    }

    fn acquire_permit(&self, request: AcquirePermit) -> BoxFuture<Result<Lease>> {
        Box::pin(self.call(request))
    }

    fn set_limit(&self, request: SetLimit) -> BoxFuture<Result<pgcoord::lease::LimitChange>> {
        Box::pin(self.call(request))
    }

    fn get(&self, name: &str) -> BoxFuture<Result<LeaseInfo>> {
        Box::pin(self.call(Get(name.to_owned())))
    }

    fn limit(&self, name: &str) -> BoxFuture<Result<Option<u32>>> {
        Box::pin(self.call(GetLimit(name.to_owned())))
    }

    fn subscribe_lock_lost(&self, recipient: Recipient<LockLost>) -> BoxFuture<Result<()>> {
        Box::pin(told(self.send(SubscribeLockLost(recipient))))
    }

    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>> {
        Box::pin(self.call(claim))
    }

    fn list_prefix(&self, prefix: &str) -> BoxFuture<Result<Vec<LeaseInfo>>> {
        Box::pin(self.call(ListPrefix(prefix.to_owned())))
    }

    fn resign_requested(&self, name: &str, token: i64) -> BoxFuture<Result<bool>> {
        let asked = crate::election::ResignRequested {
            name: name.to_owned(),
            token,
        };
        Box::pin(self.call(asked))
    }
}

impl Topics for Actors {
    fn append(&self, append: Append) -> BoxFuture<Result<Cursor>> {
        Box::pin(self.topics.call(append))
    }

    fn consume(&self, consume: Consume) -> Result<TopicConsumer> {
        consume.check()?;
        let consumer = ConsumerActor::new(
            consume,
            pgcoord::TopicTable::new(&self.config),
            self.pool.clone(),
            self.locks.clone(),
            self.signals.clone(),
        );
        let consumer = Actor::start_in_arbiter(&self.arbiter, |_| consumer);
        Ok(TopicConsumer::new(std::sync::Arc::new(consumer)))
    }
}

impl Signalling for Addr<ListenerActor> {
    fn publish(&self, publish: Publish) -> BoxFuture<Result<()>> {
        Box::pin(self.call(publish))
    }

    fn subscribe(&self, channel: &str, recipient: Recipient<Signal>) -> BoxFuture<Result<()>> {
        Box::pin(self.call(Subscribe::new(channel.to_owned(), recipient)))
    }

    fn unsubscribe(&self, channel: &str, recipient: Recipient<Signal>) {
        self.do_send(Unsubscribe::new(channel.to_owned(), recipient));
    }

    fn serve(&self, serve: Serve) -> BoxFuture<Result<()>> {
        Box::pin(self.call(serve))
    }

    fn stop_serving(&self, channel: &str) -> BoxFuture<Result<()>> {
        Box::pin(told(self.send(Unsubscribe::serving(channel))))
    }

    fn ask(&self, ask: Ask) -> BoxFuture<Result<Vec<u8>>> {
        Box::pin(self.call(ask))
    }

    fn subscribe_conn_state(&self, recipient: Recipient<ConnState>) -> BoxFuture<Result<()>> {
        Box::pin(told(self.send(SubscribeConnState(recipient))))
    }
}
