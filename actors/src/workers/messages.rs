//! What a [`WorkerPool`](super::WorkerPool) tells its workers and answers its callers.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::Statements;

use crate::LossReason;
use crate::leases::Lease;
use crate::topics::Delivery;
use pgcoord::topic::Event;

/// What a worker is for: its key, and the lease that makes it the key's only worker across the
/// fleet. The pool keeps the lease (renewed, released after the worker stopped); the worker
/// fences its writes with it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerKey {
    /// The key.
    pub key: String,
    /// The fencing token of the key's lease.
    pub token: i64,
    pub(super) lease: Arc<Lease>,
}

impl WorkerKey {
    /// The fencing guard of the key's lease, run inside the worker's own transaction: it fails
    /// with [`ErrorKind::LockLost`](pgcoord::ErrorKind::LockLost) unless the key's lease is
    /// still held with this token, and keeps it from moving until the transaction ends (see
    /// [`Lease::fence`]).
    pub async fn fence(&self, client: &(impl Statements + ?Sized)) -> Result<()> {
        self.lease.fence(client).await
    }

    /// Why the key's lease was lost, once it has been.
    pub fn loss(&self) -> Option<LossReason> {
        self.lease.loss()
    }

    /// Resolves when the key's tenure here ends (see [`Lease::lost`]).
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        self.lease.lost()
    }

    /// The key's lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// What a worker pool answers to [`GetStats`](crate::GetStats): the keys its process holds,
/// with their tokens, and the live members it counted (more may be told in later versions).
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct Assignment {
    /// Keys held here (not lost), each with its lease's fencing token.
    pub keys: BTreeMap<String, i64>,
    /// Live members at the last tick, this one included.
    pub members: usize,
    /// Workers started again after they stopped while their lease was held.
    pub restarts: u64,
    /// Rebalancing rounds begun so far (one per tick).
    pub ticks: u64,
    /// Keys held here whose idle worker was stopped ([`passivate_after`](super::WorkerPool::passivate_after)).
    pub passive: usize,
    /// Read statements of a durable pool's mail so far.
    pub mail_reads: u64,
}

/// Replaces the pool's keys: workers of keys no longer listed stop and their leases go. What
/// [`Workers::set_keys`](super::Workers::set_keys) sends; an actor pool follows a stream of
/// sets instead ([`WorkerPool::follow`](super::WorkerPool::follow)).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct SetKeys(pub(crate) Vec<String>);

/// Hand every key over, then stop — for rolling deploys: drain, then exit. The pool leaves the
/// membership at once (the other members' shares grow to cover its keys), then lets its keys go
/// at once and at its ticks, at most [`max_moves`](super::WorkerPool::max_moves) each time, each worker stopped
/// before its key's lease is released; another member claims each at its next tick. Resolves
/// once every key is released and the pool stopped (or the pool stopped another way).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Drain;

/// The durable topic of the mail to `key`'s worker in pool `pool`: `"{pool}/mail/{key}"`.
/// Append to it to send the worker a message that outlives crashes (see [`WorkerPool::durable`](super::WorkerPool::durable)).
pub fn mail_topic(pool: &str, key: &str) -> String {
    format!("{pool}/mail/{key}")
}

/// A message from a key's durable mail, handed to the key's worker (in a pool made
/// [`durable`](super::WorkerPool::durable)). Answer `Ok` once it is handled (the pool acks it then) or
/// `Err` to have it handed over again; or ack it in the transaction of its effects with
/// [`ack`](Self::ack).
#[derive(Debug, Message)]
#[rtype(result = "std::result::Result<(), String>")]
pub struct Mail {
    pub(super) key: String,
    pub(super) delivery: Delivery,
}

impl Mail {
    /// The key it was sent to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The event: its cursor in the key's mail, when it was appended, its bytes.
    pub fn event(&self) -> &Event {
        self.delivery.event()
    }

    /// The body decoded from MessagePack (as [`TopicTable::append_value`](pgcoord::TopicTable::append_value) encodes it).
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.delivery.value()
    }

    /// The fencing token of the key's lease.
    pub fn token(&self) -> i64 {
        self.delivery.token()
    }

    /// Acks the message inside `tx`, the transaction of its effects, fenced by the key's lease:
    /// effects and ack commit together or not at all, so each message's effects are applied
    /// once. [`LockLost`](pgcoord::ErrorKind::LockLost) once the key moved on,
    /// [`AlreadyAcknowledged`](pgcoord::ErrorKind::AlreadyAcknowledged) when it was acked
    /// before; on either, `tx` must not commit.
    pub async fn ack(&self, tx: &(impl Statements + ?Sized)) -> Result<()> {
        self.delivery.ack(tx).await
    }
}
