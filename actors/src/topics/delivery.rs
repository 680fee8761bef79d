//! [`Delivery`]: one event handed to a consumer's handler, with the lease it is handled under
//! and the fenced ack that commits with the handler's effects.

use std::sync::Arc;

use pgcoord::statement::Statements;
use pgcoord::topic::{Event, TopicTable};
use pgcoord::{ErrorKind, Result};

use crate::leases::Lease;

/// One event handed to a consumer's handler, and the lease it is handled under.
pub struct Delivery {
    pub(super) event: Event,
    pub(super) topic: Arc<str>,
    pub(super) consumer: Arc<str>,
    pub(super) table: Arc<TopicTable>,
    pub(super) lease: Arc<Lease>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("topic", &self.topic)
            .field("consumer", &self.consumer)
            .field("cursor", &self.event.cursor)
            .field("token", &self.lease.token())
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
        self.lease.token()
    }

    /// Acks the event inside `tx`, the transaction of the handler's effects, so effects and
    /// cursor commit together or not at all: each event's effects are applied once. Fenced by
    /// the consumer's lease: [`ErrorKind::LockLost`] once another instance took over, and
    /// [`ErrorKind::AlreadyAcknowledged`] when the cursor is already past the event. On either,
    /// the transaction must not commit (`?` drops it, which rolls it back).
    pub async fn ack(&self, tx: &(impl Statements + ?Sized)) -> Result<()> {
        self.lease.fence(tx).await?;
        let cursor = self.event.cursor;
        if self
            .table
            .ack(tx, &self.topic, &self.consumer, cursor)
            .await?
        {
            return Ok(());
        }
        Err(pgcoord::Error::new(
            ErrorKind::AlreadyAcknowledged,
            format!(
                "event {cursor} of topic {:?} was acknowledged already",
                self.topic
            ),
        ))
    }
}
