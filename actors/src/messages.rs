//! The messages `LockManager` answers, and the `LockLost` broadcast.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};
use serde::Serialize;

use crate::lease::Lease;

/// Acquire a lease. Waits until it is free unless [`fail_if_locked`](Acquire::fail_if_locked);
/// a [`timeout`](Acquire::timeout) bounds the wait. Dropping the request (or letting actix's
/// `send(..).timeout(..)` expire) cancels the wait; a lease granted after the caller gave up is
/// released at once, so none is left behind that nobody holds. For the same reason an `Acquire`
/// sent with `do_send` does nothing: there is nobody to hand the lease to.
#[derive(Debug, Clone)]
pub struct Acquire {
    pub(crate) name: String,
    pub(crate) data: Option<Vec<u8>>,
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
        self.data = Some(data.into());
        self
    }

    /// Typed data, stored as MessagePack (`rmp_serde::to_vec_named`); read it back with
    /// [`Lease::value`] or [`crate::Get`].
    pub fn value<T: Serialize>(self, value: &T) -> Result<Acquire> {
        let bytes = rmp_serde::to_vec_named(value).map_err(|e| {
            pgcoord::Error::new(
                pgcoord::ErrorKind::Other,
                format!("cannot encode data: {e}"),
            )
            .with_source(e)
        })?;
        Ok(self.data(bytes))
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

/// Release a lease by name and token. [`Lease::release`] sends it; a dropped [`Lease`] sends it
/// too. [`pgcoord::ErrorKind::LockLost`] when the lease was already lost or released.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub struct Release {
    /// The lease's name.
    pub name: String,
    /// The fencing token of the tenure to end.
    pub token: i64,
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
/// Leases that could not be renewed are reported through [`LockLost`].
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub struct RenewNow;

/// Register for [`LockLost`] broadcasts.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SubscribeLockLost(pub Recipient<LockLost>);

/// Counters of what the manager has done, for tests and monitoring.
#[derive(Debug, Clone, Message)]
#[rtype(result = "ManagerStats")]
pub struct GetStats;

/// What [`GetStats`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
pub struct ManagerStats {
    /// Leases held now.
    pub held: usize,
    /// Renew statements sent (one per heartbeat tick with leases held, plus prompt retries).
    pub renew_statements: u64,
    /// Renewals that failed (connection lost, no answer in time) and were retried.
    pub renew_failures: u64,
    /// Leases granted.
    pub granted: u64,
    /// Leases reported lost.
    pub lost: u64,
}

/// Which lock was lost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKey {
    /// A lease, by name.
    Lease(String),
    /// An advisory lock, by key.
    Advisory(i64),
}

/// Why a lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The server says the lease is no longer this tenure's: its row is gone or carries
    /// another token (it expired and was taken over, or was deleted), or it had already expired
    /// on the server when a renewal reached it (a renewal never revives an expired lease).
    TakenOver,
    /// No renewal was confirmed before the holder's own deadline (the database may be
    /// unreachable); the server may give the lease away from now on.
    DeadlinePassed,
    /// The session holding an advisory lock failed: the server released the lock.
    ConnectionLost,
    /// The manager stopped ([`Shutdown`] or its System ending) and released the lock.
    Shutdown,
    /// The session holding an advisory lock stopped answering pings. Its server session may
    /// still be alive, but the lock is given up: keeping a lock already lost is the worse bug.
    Stalled,
}

/// Broadcast to every subscriber, exactly once per lost lock.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct LockLost {
    /// The lock.
    pub key: LockKey,
    /// The fencing token of the lost tenure (leases only).
    pub token: Option<i64>,
    /// Why it was lost.
    pub reason: LossReason,
}

/// Take an advisory lock on a dedicated session of its own. With no
/// [`wait`](AdvisoryLock::wait), one try: [`pgcoord::ErrorKind::NotAcquired`] at once when it is
/// taken. Re-acquiring a key this manager holds is refused ([`pgcoord::ErrorKind::AlreadyHeld`]):
/// locks never stack. A caller that gives up while waiting cancels the wait on the server.
#[derive(Debug, Clone)]
pub struct AdvisoryLock {
    pub(crate) key: i64,
    pub(crate) mode: pgcoord::advisory::Mode,
    pub(crate) wait: Option<Duration>,
}

impl Message for AdvisoryLock {
    type Result = Result<()>;
}

impl AdvisoryLock {
    /// The exclusive lock on `key`, tried once.
    pub fn new(key: i64) -> AdvisoryLock {
        AdvisoryLock {
            key,
            mode: pgcoord::advisory::Mode::Exclusive,
            wait: None,
        }
    }

    /// The lock on [`pgcoord::advisory::key_for_name`]`(name)`.
    pub fn named(name: &str) -> AdvisoryLock {
        AdvisoryLock::new(pgcoord::advisory::key_for_name(name))
    }

    /// Take it in shared mode. Default: exclusive.
    pub fn shared(mut self) -> AdvisoryLock {
        self.mode = pgcoord::advisory::Mode::Shared;
        self
    }

    /// Wait up to `timeout` for it (enforced by the server's `lock_timeout`). Default: one try.
    pub fn wait(mut self, timeout: Duration) -> AdvisoryLock {
        self.wait = Some(timeout);
        self
    }
}

/// Release an advisory lock this manager holds and close its session.
/// [`pgcoord::ErrorKind::LockLost`] when it was lost (and already reported) or not held.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub struct AdvisoryUnlock(pub i64);

/// Stop the manager: every advisory session is closed (releasing its locks) and every held lease
/// released. A manager runs until this is sent or its System stops: its timers keep it alive.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Shutdown;
