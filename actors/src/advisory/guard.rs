//! [`AdvisoryGuard`]: a held advisory lock, released when dropped.

use actix::Addr;
use pgcoord::{Error, ErrorKind, Result};
use tokio::sync::watch;

use super::{AdvisoryLocks, AdvisoryUnlock};
use crate::losses::LossReason;

/// An advisory lock held on a session of its own. Dropping the guard releases the lock (in the
/// background); [`release`](AdvisoryGuard::release) releases it and reports the outcome;
/// [`lost`](AdvisoryGuard::lost) resolves if the lock is lost first (its session failed,
/// stopped answering pings, or the actor stopped).
pub struct AdvisoryGuard {
    key: i64,
    locks: Addr<AdvisoryLocks>,
    lost: watch::Receiver<Option<LossReason>>,
    released: bool,
}

impl AdvisoryGuard {
    pub(super) fn new(
        key: i64,
        locks: Addr<AdvisoryLocks>,
        lost: watch::Receiver<Option<LossReason>>,
    ) -> AdvisoryGuard {
        AdvisoryGuard {
            key,
            locks,
            lost,
            released: false,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> i64 {
        self.key
    }

    /// Why the lock was lost, once it has been.
    pub fn loss(&self) -> Option<LossReason> {
        *self.lost.borrow()
    }

    /// Resolves when the lock is lost (or ended otherwise: released by an [`AdvisoryUnlock`], or
    /// the actor stopped — then [`LossReason::Shutdown`]); pending forever while it is held.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        // The actor is gone, and with it the session: the server released the lock.
        crate::losses::when_lost(&self.lost, LossReason::Shutdown)
    }

    /// Releases the lock. [`ErrorKind::LockLost`] when it was already lost.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.locks
            .send(AdvisoryUnlock(self.key))
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("advisory locks stopped: {e}"),
                )
            })?
    }
}

impl Drop for AdvisoryGuard {
    fn drop(&mut self) {
        // The sender lives with the session: once it is gone, this tenure ended (lost, or
        // released by an `AdvisoryUnlock`), and a later tenure of the same key is not ours.
        let ended = self.lost.has_changed().is_err();
        if !self.released && !ended && self.loss().is_none() {
            self.locks.do_send(AdvisoryUnlock(self.key));
        }
    }
}

impl std::fmt::Debug for AdvisoryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryGuard")
            .field("key", &self.key)
            .field("lost", &self.loss())
            .finish()
    }
}
