//! The messages `LockManager` answers.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};
use serde::Serialize;

use super::lease::Lease;
pub use super::lease::Release;

/// Acquire a lease. Waits until it is free unless [`fail_if_locked`](Acquire::fail_if_locked);
/// a [`timeout`](Acquire::timeout) bounds the wait. Dropping the request (or letting actix's
/// `send(..).timeout(..)` expire) cancels the wait; a lease granted after the caller gave up is
/// released at once, so none is left behind that nobody holds. For the same reason an `Acquire`
/// sent with `do_send` does nothing: there is nobody to hand the lease to.
#[derive(Debug, Clone)]
pub struct Acquire {
    pub(crate) name: String,
    /// Shared, not copied, between the wait and a batched first attempt.
    pub(crate) data: Option<bytes::Bytes>,
    pub(crate) replace_data: bool,
    pub(crate) keep_on_release: bool,
    pub(crate) fail_if_locked: bool,
    pub(crate) timeout: Option<Duration>,
}

impl Message for Acquire {
    type Result = Result<Lease>;
}

impl Acquire {
    /// Acquire the lease `name` (1 to 255 bytes), waiting as long as it takes.
    pub fn new(name: impl Into<String>) -> Acquire {
        Acquire {
            name: name.into(),
            data: None,
            replace_data: false,
            keep_on_release: false,
            fail_if_locked: false,
            timeout: None,
        }
    }

    /// Data stored with the lock. A kept row's existing data wins unless
    /// [`replace_data`](Self::replace_data) is set. Default: none.
    pub fn data(mut self, data: impl Into<Vec<u8>>) -> Acquire {
        self.data = Some(bytes::Bytes::from(data.into()));
        self
    }

    /// Typed data, stored as MessagePack (pgcoord's one codec, `pgcoord::signal::to_payload`);
    /// read it back with [`Lease::value`] or [`Get`].
    pub fn value<T: Serialize>(self, value: &T) -> Result<Acquire> {
        Ok(self.data(pgcoord::signal::to_payload(value)?))
    }

    /// Replace the data of a kept row instead of reusing it. Default: off.
    pub fn replace_data(mut self) -> Acquire {
        self.replace_data = true;
        self
    }

    /// On release, keep the row and its data, free for the next holder. Default: the row is
    /// deleted.
    pub fn keep_on_release(mut self) -> Acquire {
        self.keep_on_release = true;
        self
    }

    /// Try once: fail with [`pgcoord::ErrorKind::NotAcquired`] (naming the holder) when the
    /// lease is taken. Default: wait.
    pub fn fail_if_locked(mut self) -> Acquire {
        self.fail_if_locked = true;
        self
    }

    /// Give up waiting after `timeout`, with [`pgcoord::ErrorKind::NotAcquired`]. Default: wait
    /// as long as it takes.
    pub fn timeout(mut self, timeout: Duration) -> Acquire {
        self.timeout = Some(timeout);
        self
    }
}

/// Inspect one lock (held or kept). Grants nothing. [`pgcoord::ErrorKind::NotFound`] when
/// there is no row.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<LeaseInfo>")]
pub struct Get(pub String);

/// Inspect every lock in the table. Grants nothing.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<LeaseInfo>>")]
pub struct List;

/// Renew every held lease now, in one statement; for configurations with heartbeats off.
/// Leases that could not be renewed are reported through [`LockLost`](crate::LockLost).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub struct RenewNow;

/// What a `LockManager` answers to [`GetStats`](crate::GetStats).
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct ManagerStats {
    /// Leases held now.
    pub held: usize,
    /// Renew statements sent (one per heartbeat tick with leases held, plus prompt retries).
    pub renew_statements: u64,
    /// Renewals that failed (connection lost, no answer in time) and were retried.
    pub renew_failures: u64,
    /// Leases granted.
    pub granted: u64,
    /// Acquire statements sent: single attempts, and batches of concurrent first attempts
    /// counted once each.
    pub acquire_statements: u64,
    /// Release statements sent: single releases, and batches of concurrent releases counted
    /// once each.
    pub release_statements: u64,
    /// Leases reported lost.
    pub lost: u64,
    /// Leases a release handed to this process that were held from the announcement alone: it
    /// named the nonce of the waiter's last refused attempt, so no statement was needed.
    pub handovers_from_announcement: u64,
    /// Leases handed to this process that were held after reading their row: the announcement
    /// proved nothing (no nonce, another, heard late) or was missed (found at the next attempt).
    pub handovers_from_row: u64,
}
