//! [`AdvisoryGuard`]: a held advisory lock, released when dropped.

use actix::Addr;
use pgcoord::{Error, ErrorKind, Result};

use super::{AdvisoryLocks, AdvisoryUnlock};
use crate::losses::{LossReason, TenureWatch};

/// An advisory lock held on a session of its own. Dropping the guard releases the lock (in the
/// background); [`release`](AdvisoryGuard::release) releases it and reports the outcome;
/// [`lost`](AdvisoryGuard::lost) resolves if the lock is lost first (its session failed,
/// stopped answering pings, or the actor stopped).
#[must_use = "dropping an AdvisoryGuard releases the lock at once"]
pub struct AdvisoryGuard {
    key: i64,
    locks: Addr<AdvisoryLocks>,
    lost: TenureWatch,
    released: bool,
}

impl AdvisoryGuard {
    pub(super) fn new(key: i64, locks: Addr<AdvisoryLocks>, lost: TenureWatch) -> AdvisoryGuard {
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

    /// The message that unlocks this tenure, and no other.
    fn unlock(&self) -> AdvisoryUnlock {
        AdvisoryUnlock {
            key: self.key,
            tenure: self.lost.clone(),
        }
    }

    /// Why the lock was lost, once it has been.
    pub fn loss(&self) -> Option<LossReason> {
        crate::losses::loss_of(&self.lost)
    }

    /// Resolves when the tenure ends: `Some(reason)` when the lock is lost (the actor stopping
    /// is [`LossReason::Shutdown`]), `None` when it was released (no loss). Pending while held.
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        // The actor is gone without a word, and with it the session: the server released it.
        crate::losses::when_ended(&self.lost, LossReason::Shutdown)
    }

    /// Releases the lock. [`ErrorKind::LockLost`] when it was already lost.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.locks.send(self.unlock()).await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("advisory locks stopped: {e}"),
            )
        })?
    }
}

impl Drop for AdvisoryGuard {
    fn drop(&mut self) {
        // Ended already (lost): nothing to unlock. The message names this tenure anyway, so a
        // later tenure of the same key is never unlocked by it.
        let ended = self.lost.ended();
        if !self.released && !ended {
            self.locks.do_send(self.unlock());
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
