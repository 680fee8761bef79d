//! The messages [`AdvisoryLocks`](super::AdvisoryLocks) answers.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Result;

use super::AdvisoryGuard;

/// Take an advisory lock on a dedicated session of its own; the answer is an [`AdvisoryGuard`]:
/// the lock is held while the guard lives, and released when it is dropped or
/// [released](AdvisoryGuard::release). With no [`timeout`](AdvisoryLock::timeout), one try:
/// [`pgcoord::ErrorKind::NotAcquired`] at once when it is taken. Re-acquiring a key held here is
/// refused ([`pgcoord::ErrorKind::AlreadyHeld`]): locks never stack. A caller that gives up
/// while waiting cancels the wait on the server.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<AdvisoryGuard>")]
pub struct AdvisoryLock {
    pub(crate) key: i64,
    pub(crate) mode: pgcoord::advisory::Mode,
    pub(crate) timeout: Option<Duration>,
}

impl AdvisoryLock {
    /// The exclusive lock on `key`, tried once.
    pub fn new(key: i64) -> AdvisoryLock {
        AdvisoryLock {
            key,
            mode: pgcoord::advisory::Mode::Exclusive,
            timeout: None,
        }
    }

    /// The lock on [`pgcoord::advisory::key_for_name`]`(name)`.
    pub fn named(name: &str) -> AdvisoryLock {
        AdvisoryLock::new(pgcoord::advisory::key_for_name(name))
    }

    /// The lock sqlx's `PgAdvisoryLock::new(name)` takes
    /// ([`pgcoord::advisory::key_like_sqlx`]): for a service moving from sqlx, whose processes
    /// not moved yet must still exclude the moved ones.
    pub fn named_like_sqlx(name: &str) -> AdvisoryLock {
        AdvisoryLock::new(pgcoord::advisory::key_like_sqlx(name))
    }

    /// Take it in shared mode. Default: exclusive.
    pub fn shared(mut self) -> AdvisoryLock {
        self.mode = pgcoord::advisory::Mode::Shared;
        self
    }

    /// Waits for it, and answers within `timeout` whatever the connections do, as every
    /// pgcoord timeout does: the session is opened within it, and the wait on the server is
    /// its `lock_timeout`, set to what is left less a share for the answer to come back, so a
    /// wait that ends leaves nothing behind on the server. Default: one try, bounded by the
    /// statement timeout.
    pub fn timeout(mut self, timeout: Duration) -> AdvisoryLock {
        self.timeout = Some(timeout);
        self
    }
}

/// Release the tenure of an advisory lock that `tenure` watches: sent by its [`AdvisoryGuard`]
/// only (released, or dropped), so no other code of the process can unlock a key someone else
/// holds, and a guard whose tenure ended cannot unlock a later tenure of its key: either would
/// leave that tenure's holder believing it holds the lock. [`pgcoord::ErrorKind::LockLost`]
/// when that tenure was lost (and already reported).
#[derive(Clone, Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct AdvisoryUnlock {
    pub(crate) key: i64,
    pub(crate) tenure: crate::losses::TenureWatch,
}

/// What `AdvisoryLocks` answers to [`GetStats`](crate::GetStats).
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct AdvisoryStats {
    /// Locks held now, each on a session of its own.
    pub held: usize,
    /// Open sessions that hold no lock, kept for the next acquire.
    pub idle_sessions: usize,
    /// Locks granted.
    pub granted: u64,
    /// Locks released by their holder (an unlock or a dropped guard).
    pub released: u64,
    /// Locks reported lost (session ended, ping failed or unanswered, shutdown).
    pub lost: u64,
}
