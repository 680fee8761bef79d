//! Every message a `LockManager` answers:
//!
//! | message | answer |
//! |---|---|
//! | [`Acquire`] | `Result<Lease>`: a lease, waited for as the request says |
//! | [`AcquirePermit`] | `Result<Lease>`: a permit of a counting semaphore, a slot's lease |
//! | [`SetLimit`] | a limited semaphore's stored limit, changed |
//! | [`Release`] | `Result<()>`: the tenure ended (what [`Lease::release`] sends) |
//! | [`Claim`] | `Result<Vec<Lease>>`: whichever of many leases are free now |
//! | `Get`, `GetLimit`, `ListPrefix` | what the table says, granting nothing: asked through the coordinator's `get`, `limit` and `list_prefix` |
//! | [`RunNow`](crate::RunNow) | `Result<u64>`: every held lease renewed now; how many |
//! | [`GetStats`](crate::GetStats)`<ManagerStats>` | [`ManagerStats`] |
//! | [`SubscribeLockLost`](crate::SubscribeLockLost) | `()`: [`LockLost`](crate::LockLost) from now on |
//! | [`Shutdown`](crate::Shutdown) | `()`: every lease released, the manager stopped |

use super::held::OnRelease;
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
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Lease>")]
pub struct Acquire {
    pub(crate) name: String,
    /// Shared, not copied, between the wait and a batched first attempt.
    pub(crate) data: Option<bytes::Bytes>,
    pub(crate) replace_data: bool,
    pub(crate) on_release: OnRelease,
    pub(crate) fail_if_locked: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) priority: i32,
    /// `None`: the manager's lease.
    pub(crate) lease: Option<Duration>,
}

impl Acquire {
    /// Acquire the lease `name` (1 to 255 bytes), waiting as long as it takes.
    pub fn new(name: impl Into<String>) -> Acquire {
        Acquire {
            name: name.into(),
            data: None,
            replace_data: false,
            on_release: OnRelease::default(),
            fail_if_locked: false,
            timeout: None,
            priority: 0,
            lease: None,
        }
    }

    /// Holds this lease for `lease` at a time instead of the manager's
    /// ([`ConfigBuilder::lease`](pgcoord::ConfigBuilder::lease)): the server frees it `lease`
    /// after the last renewal its holder made, and the holder reports it lost a tenth earlier.
    /// The heartbeat renews it by its own lease at every beat. At least the manager's lease (its
    /// heartbeat and deadline sweep are paced for that; a shorter lease needs a manager
    /// configured with it) and at most [`MAX_LEASE`](crate::MAX_LEASE); `InvalidConfig`
    /// otherwise. A longer lease tolerates longer pauses of its holder, and is taken over that
    /// much later when its holder dies.
    pub fn lease(mut self, lease: Duration) -> Acquire {
        self.lease = Some(lease);
        self
    }

    /// Waits with `priority` (default 0): among the processes waiting for the lease, the one
    /// with the highest priority is granted it at its next release, then the others in arrival
    /// order. A preferred holder (an election's preferred candidate) waits with a higher one.
    /// Only the order of the line: one holder at a time holds whatever the priorities, and a
    /// lower-priority waiter can wait as long as higher ones keep coming.
    pub fn priority(mut self, priority: i32) -> Acquire {
        self.priority = priority;
        self
    }

    /// Data stored with the lock. A kept row's data wins unless
    /// [`replace_data`](Self::replace_data) is set; a lease taken over from a holder that
    /// stopped renewing gets this data, never the old holder's. Default: none.
    pub fn data(mut self, data: impl Into<Vec<u8>>) -> Acquire {
        self.data = Some(bytes::Bytes::from(data.into()));
        self
    }

    /// Typed data, stored as MessagePack (pgcoord's one codec, `pgcoord::signal::to_payload`);
    /// read it back with [`Lease::value`] or
    /// [`Coordinator::get`](crate::Coordinator::get).
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
        self.on_release.keep = true;
        self
    }

    /// Announce the release even when nobody is in line (an election's term: its observers
    /// do not line up).
    pub(crate) fn announce_always(mut self) -> Acquire {
        self.on_release.announce_always = true;
        self
    }

    /// Try once: fail with [`pgcoord::ErrorKind::NotAcquired`] (naming the holder) when the
    /// lease is taken. Default: wait.
    pub fn fail_if_locked(mut self) -> Acquire {
        self.fail_if_locked = true;
        self
    }

    /// Answer within `timeout`, whatever the connections do: with the lease, with
    /// [`pgcoord::ErrorKind::NotAcquired`] when it stayed taken, or with
    /// [`pgcoord::ErrorKind::Unavailable`] when the database did not answer in time. A grant
    /// whose answer was lost is released by the manager after the answer, never left held.
    /// Default: wait as long as it takes.
    pub fn timeout(mut self, timeout: Duration) -> Acquire {
        self.timeout = Some(timeout);
        self
    }
}

/// Acquire a permit of the semaphore `name` with `permits` permits (every process must use the
/// same count), or of a semaphore whose limit is stored ([`limited`](AcquirePermit::limited)).
/// The [`Lease`] answered is the slot's: its token, `lost()`, fencing guard and release are a
/// lease's. Waits until a permit is free unless given a [`timeout`](AcquirePermit::timeout), as
/// hard as [`Acquire::timeout`]; dropping the request cancels the wait, and a permit granted
/// after the caller left is released at once.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Lease>")]
pub struct AcquirePermit {
    pub(crate) name: String,
    /// `None`: the stored limit.
    pub(crate) permits: Option<u32>,
    pub(crate) timeout: Option<Duration>,
    /// `None`: the manager's lease.
    pub(crate) lease: Option<Duration>,
}

impl AcquirePermit {
    /// A permit of `name`, one of `permits` (1 to `pgcoord::lease::MAX_PERMITS`).
    pub fn new(name: impl Into<String>, permits: u32) -> AcquirePermit {
        AcquirePermit {
            name: name.into(),
            permits: Some(permits),
            timeout: None,
            lease: None,
        }
    }

    /// A permit of `name` under the limit stored for it with [`SetLimit`], read at each
    /// attempt: raised, more are admitted at once; lowered, the highest permits are taken back
    /// (their holders see [`LockLost`](crate::LockLost)) and nobody is admitted beyond the new
    /// limit. `NotFound` when no limit is stored. A limited semaphore's names (`"{name}#{i}"`)
    /// are its own: do not also use `name` as a plain semaphore.
    pub fn limited(name: impl Into<String>) -> AcquirePermit {
        AcquirePermit {
            name: name.into(),
            permits: None,
            timeout: None,
            lease: None,
        }
    }

    /// Give up after `timeout` with [`pgcoord::ErrorKind::NotAcquired`].
    pub fn timeout(mut self, timeout: Duration) -> AcquirePermit {
        self.timeout = Some(timeout);
        self
    }

    /// Holds the permit for `lease` at a time instead of the manager's, as
    /// [`Acquire::lease`] does.
    pub fn lease(mut self, lease: Duration) -> AcquirePermit {
        self.lease = Some(lease);
        self
    }
}

/// Store `permits` (0 to `pgcoord::lease::MAX_PERMITS`; 0 admits nobody) as the limit of
/// semaphore `name`, for [`AcquirePermit::limited`]. Raised, waiters are woken at once. Lowered,
/// the permits of the slots at or above the new limit are taken back, each at once or when the
/// fenced transaction its holder is in ends: their fenced writes fail from then on, and they see
/// [`LockLost`](crate::LockLost) (`TakenOver`) at their next renewal. Answers what changed.
/// (`pgcoord::LeaseTable::set_limit`.)
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<pgcoord::lease::LimitChange>")]
pub struct SetLimit {
    pub(crate) name: String,
    pub(crate) permits: u32,
}

impl SetLimit {
    /// The limit of `name`, `permits` permits.
    pub fn new(name: impl Into<String>, permits: u32) -> SetLimit {
        SetLimit {
            name: name.into(),
            permits,
        }
    }
}

/// The stored limit of semaphore `name`; `None` when it has none.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<u32>>")]
pub(crate) struct GetLimit(pub(crate) String);

/// Take each of `names` that is free now (not held, no other waiter first in line, its row
/// not locked, no wait for it under way here), in one statement per
/// [`MAX_NAMES_PER_STATEMENT`](pgcoord::lease::MAX_NAMES_PER_STATEMENT) names; the others
/// are left alone, not waited for. Answers the leases granted. A caller that goes away has them
/// released.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<Lease>>")]
#[non_exhaustive]
pub struct Claim {
    /// The leases to take, distinct.
    pub names: Vec<String>,
    /// Keep each row (free, with its data) when its lease is released, as
    /// [`Acquire::keep_on_release`] does.
    pub keep_on_release: bool,
}

impl Claim {
    /// Claims `names`, each row deleted when its lease is released.
    pub fn new(names: Vec<String>) -> Claim {
        Claim {
            names,
            keep_on_release: false,
        }
    }

    /// Keeps each row (free) when its lease is released.
    pub fn keep_on_release(mut self) -> Claim {
        self.keep_on_release = true;
        self
    }
}

/// Inspect one lock (held or kept). Grants nothing. [`pgcoord::ErrorKind::NotFound`] when
/// there is no row.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<LeaseInfo>")]
pub(crate) struct Get(pub(crate) String);

/// Every lease whose name starts with the prefix (all of them for `""`), as `Get` reports one.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<LeaseInfo>>")]
pub(crate) struct ListPrefix(pub(crate) String);

/// Release every held lease now, and answer, once the statements are done, how many were
/// released on the server. Each holder is told its lease ended with
/// [`LossReason::Shutdown`](crate::LossReason::Shutdown) (so `lost()` resolves), before the
/// statements run. From then on nothing more is granted (waits end with `Unavailable`), and the
/// answer also waits for releases under way before. The manager keeps running: what
/// [`Coordinator::shutdown`](crate::Coordinator::shutdown) sends first.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub(crate) struct ReleaseAll;

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
    /// Reads sent: lookups of one lock and listings (an election observer's reads among them).
    pub read_statements: u64,
    /// Leases reported lost.
    pub lost: u64,
    /// Renewals that failed in a row now: 0 when the last one succeeded (or none was needed).
    pub renewals_failing: u32,
    /// Times every waiter was told to ask again: the lease channel's listener connected, or
    /// may have missed announcements (each costs a waiter at most one attempt).
    pub woken_all: u64,
}
