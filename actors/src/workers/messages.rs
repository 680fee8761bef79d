//! What a [`WorkerPool`](super::WorkerPool) tells its workers and answers its callers.

use actix::prelude::*;

/// What a worker is for: its key and the fencing token of its key's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerKey {
    /// The key.
    pub key: String,
    /// The token of the lease that makes this worker the key's only one.
    pub token: i64,
}

/// Stop: the key's lease is lost or given to another process. Workers implement it as
/// `ctx.stop()`.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopWorker;

/// The keys a pool's process holds, with their tokens, and the live members it counted.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Assignment")]
pub struct GetAssignment;

/// What [`GetAssignment`] answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
pub struct Assignment {
    /// Keys held here, with their tokens, by key.
    pub keys: Vec<WorkerKey>,
    /// Live members at the last tick, this one included.
    pub members: usize,
    /// Workers started again after they stopped while their lease was held.
    pub restarts: u64,
}

/// Replaces the pool's keys: workers of keys no longer listed stop and their leases go.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SetKeys(pub Vec<String>);
