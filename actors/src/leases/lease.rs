//! [`Lease`]: a held lease, released when dropped.

use std::sync::Arc;

use actix::Addr;
use actix::prelude::*;
use pgcoord::Statements;
use pgcoord::{Error, ErrorKind, LeaseTable, Result};
use serde::de::DeserializeOwned;

use super::LockManager;
use crate::losses::{LossReason, TenureWatch};
use crate::seam::{Borrowed, BoxFuture};

/// A lease this process holds. Its heartbeats run for exactly as long as it is held. Dropping
/// it releases it (in the background); [`Lease::release`] releases it and reports the outcome.
#[must_use = "dropping a Lease releases it at once"]
pub struct Lease {
    pub(crate) name: Arc<str>,
    pub(crate) token: i64,
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) holder: Arc<dyn Keeper>,
    pub(crate) tenure: TenureWatch,
    pub(crate) released: bool,
}

/// What keeps a backend's leases for their handles: it ends a tenure and guards writes with
/// it. The PostgreSQL side is [`ManagerKeeper`]; the in-memory backend has its own.
pub(crate) trait Keeper: Send + Sync {
    /// Ends the tenure `token` of `name`; [`ErrorKind::LockLost`] when it is not current.
    fn release(&self, name: String, token: i64) -> BoxFuture<Result<()>>;
    /// Ends it without waiting for the outcome (a dropped handle).
    fn release_later(&self, name: String, token: i64);
    /// The fencing guard, run on `client`: [`ErrorKind::LockLost`] unless `token` is `name`'s
    /// current tenure.
    fn fence<'a>(
        &'a self,
        client: &'a dyn Statements,
        name: &'a str,
        token: i64,
    ) -> pgcoord::BoxFuture<'a, Result<()>>;
}

/// The keeper of a `LockManager`'s leases.
pub(crate) struct ManagerKeeper {
    pub(crate) manager: Addr<LockManager>,
    pub(crate) table: Arc<LeaseTable>,
    /// The manager's owner identity, which the fencing guard matches with the token.
    pub(crate) owner: Arc<str>,
}

impl Keeper for ManagerKeeper {
    fn release(&self, name: String, token: i64) -> BoxFuture<Result<()>> {
        let released = self.manager.send(Release { name, token });
        Box::pin(async move {
            released.await.map_err(|e| {
                Error::new(ErrorKind::Unavailable, format!("lock manager stopped: {e}"))
            })?
        })
    }

    fn release_later(&self, name: String, token: i64) {
        self.manager.do_send(Release { name, token });
    }

    fn fence<'a>(
        &'a self,
        client: &'a dyn Statements,
        name: &'a str,
        token: i64,
    ) -> pgcoord::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let owner = self.table.owner(&self.owner)?;
            owner.fence(client, name, token).await
        })
    }
}

impl Lease {
    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this tenure: strictly greater than every earlier grant's in the same
    /// table, constant until the lease ends.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// The lock's data as of the grant.
    pub fn data(&self) -> Option<&[u8]> {
        self.data.as_deref()
    }

    /// The lock's data decoded from MessagePack; `None` when there is none.
    pub fn value<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.data
            .as_deref()
            .map(pgcoord::signal::from_payload)
            .transpose()
    }

    /// Why the lease was lost, once it has been.
    pub fn loss(&self) -> Option<LossReason> {
        crate::losses::loss_of(&self.tenure)
    }

    /// Resolves when the tenure ends: `Some(reason)` when the lease is lost, `None` when its
    /// holder released it (no loss). Pending while it is held. It does not borrow the lease,
    /// so it can be selected against the work the lease guards:
    ///
    /// ```ignore
    /// tokio::select! {
    ///     done = work(&lease) => done,
    ///     Some(reason) = lease.lost() => return Err(reason), // only on a loss
    /// }
    /// ```
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        // The manager gone without a word, the heartbeats went with it: the lease expires.
        crate::losses::when_ended(&self.tenure, LossReason::DeadlinePassed)
    }

    /// The fencing guard: run inside your own transaction, it fails with
    /// [`ErrorKind::LockLost`] unless this lease is still held with this token, and keeps it from
    /// being taken over or released until the transaction ends. Writes in that transaction are
    /// exclusive. A refused guard aborts the transaction (SQLSTATE `PC001`): nothing written in
    /// it commits. Keep such transactions short. Other drivers and languages call the same
    /// guard in SQL (docs/OPERATIONS.md, "Coordination in SQL").
    ///
    /// On the in-memory backend there is no transaction to guard: pass the `MemoryBackend` as
    /// `client`; the guard only checks that the lease is still held with this token.
    pub async fn fence(&self, client: &(impl Statements + ?Sized)) -> Result<()> {
        (self.holder)
            .fence(&Borrowed(client), &self.name, self.token)
            .await
    }

    /// Releases the lease. [`ErrorKind::LockLost`] when it was already lost.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.holder.release(self.name.to_string(), self.token).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            self.holder.release_later(self.name.to_string(), self.token);
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("lost", &self.loss())
            .finish()
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
