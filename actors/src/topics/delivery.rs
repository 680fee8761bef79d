//! [`Delivery`]: one event handed to a consumer's handler, with the lease it is handled under
//! and the fenced ack that commits with the handler's effects.

use std::sync::Arc;

use pgcoord::Statements;
use pgcoord::topic::{Cursor, Event, TopicTable};
use pgcoord::{ErrorKind, Result};

use crate::leases::Lease;
use crate::seam::Borrowed;

/// One event handed to a consumer's handler, and the lease it is handled under.
pub struct Delivery {
    pub(crate) event: Event,
    pub(crate) tenure: Arc<DeliveryContext>,
}

/// What every delivery of one tenure shares: one reference per event, not one per field.
pub(crate) struct DeliveryContext {
    pub(crate) topic: String,
    pub(crate) consumer: String,
    pub(crate) acker: Arc<dyn Acker>,
    pub(crate) lease: Arc<Lease>,
}

/// Where [`Delivery::ack`] moves the consumer's cursor: the topic table, in the caller's
/// transaction; the in-memory backend has its own.
pub(crate) trait Acker: Send + Sync {
    /// Moves `consumer`'s cursor of `topic` forward to `cursor` on `tx`; false when it was
    /// there or past it already.
    fn ack<'a>(
        &'a self,
        tx: &'a dyn Statements,
        topic: &'a str,
        consumer: &'a str,
        cursor: Cursor,
    ) -> pgcoord::BoxFuture<'a, Result<bool>>;
}

impl Acker for TopicTable {
    fn ack<'a>(
        &'a self,
        tx: &'a dyn Statements,
        topic: &'a str,
        consumer: &'a str,
        cursor: Cursor,
    ) -> pgcoord::BoxFuture<'a, Result<bool>> {
        Box::pin(TopicTable::ack(self, tx, topic, consumer, cursor))
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("topic", &self.tenure.topic)
            .field("consumer", &self.tenure.consumer)
            .field("cursor", &self.event.cursor)
            .field("token", &self.tenure.lease.token())
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event's body decoded from MessagePack.
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.event.value()
    }

    /// The fencing token of the consumer's lease, for fencing writes elsewhere.
    pub fn token(&self) -> i64 {
        self.tenure.lease.token()
    }

    /// Acks the event inside `tx`, the transaction of the handler's effects, so effects and
    /// cursor commit together or not at all: each event's effects are applied once. Fenced by
    /// the consumer's lease: [`ErrorKind::LockLost`] once another instance took over, and
    /// [`ErrorKind::AlreadyAcknowledged`] when the cursor is already past the event. On either,
    /// the transaction must not commit (`?` drops it, which rolls it back). On the in-memory
    /// backend, pass the `MemoryBackend` as `tx`: the ack checks the lease and moves the cursor.
    pub async fn ack(&self, tx: &(impl Statements + ?Sized)) -> Result<()> {
        let DeliveryContext {
            topic,
            consumer,
            acker,
            lease,
        } = &*self.tenure;
        lease.fence(tx).await?;
        let cursor = self.event.cursor;
        let moved = (acker.ack(&Borrowed(tx), topic, consumer, cursor)).await?;
        if moved {
            return Ok(());
        }
        Err(pgcoord::Error::new(
            ErrorKind::AlreadyAcknowledged,
            format!("event {cursor} of topic {topic:?} was acknowledged already",),
        ))
    }
}
