//! [`RunNow`]: one message that has an actor do now what its timer does.

use actix::Message;
use pgcoord::Result;

/// Do now what the actor's timer does, without waiting for the next tick; answers how many
/// things it did:
///
/// - a `LockManager` renews every held lease in one statement (for configurations with
///   heartbeats off) and answers how many leases it renews; a lease that could not be renewed
///   is reported through [`LockLost`](crate::LockLost);
/// - a `TopicRetention` trims its topic as a tick would: the events deleted;
/// - a `PayloadStoreActor` deletes the expired payloads: the rows deleted
///   ([`ErrorKind::InvalidConfig`](pgcoord::ErrorKind::InvalidConfig) when it has no table to
///   expire).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<u64>")]
pub struct RunNow;
