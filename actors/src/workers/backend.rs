//! What a pool runs on: the leases (a lock manager, or the in-memory backend) and, for a routed
//! pool, what answers its channel (a listener, or the in-memory backend). The pool's logic is
//! the same on both; only these calls differ.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};

use crate::Call;
use crate::backend::BoxFuture;
use crate::leases::{Acquire, Claim, Lease, ListPrefix, LockManager};
use crate::signals::{ListenerActor, Serve, StopServing};

/// The leases a pool takes its keys and membership from.
pub(super) trait PoolLocks {
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>>;
    fn list_prefix(&self, prefix: String) -> BoxFuture<Result<Vec<LeaseInfo>>>;
    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>>;
}

impl PoolLocks for Addr<LockManager> {
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>> {
        Box::pin(self.call(request))
    }

    fn list_prefix(&self, prefix: String) -> BoxFuture<Result<Vec<LeaseInfo>>> {
        Box::pin(self.call(ListPrefix(prefix)))
    }

    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>> {
        Box::pin(self.call(claim))
    }
}

#[cfg(feature = "memory")]
impl PoolLocks for crate::backend::memory::MemoryCoordinator {
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>> {
        crate::backend::Locking::acquire(self, request)
    }

    fn list_prefix(&self, prefix: String) -> BoxFuture<Result<Vec<LeaseInfo>>> {
        Box::pin(std::future::ready(Ok(
            crate::backend::memory::MemoryCoordinator::list_prefix(self, &prefix),
        )))
    }

    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>> {
        let coordinator = self.clone();
        Box::pin(async move { (coordinator.claim(claim.names, claim.keep_on_release)).await })
    }
}

/// What answers a routed pool's channel.
#[derive(Clone)]
pub(super) enum Listening {
    Listener(Addr<ListenerActor>),
    #[cfg(feature = "memory")]
    Memory(crate::backend::memory::MemoryCoordinator),
}

impl Listening {
    pub(super) fn serve(&self, serve: Serve) -> BoxFuture<Result<()>> {
        match self {
            Listening::Listener(listener) => Box::pin(listener.call(serve)),
            #[cfg(feature = "memory")]
            Listening::Memory(memory) => crate::backend::Signalling::serve(memory, serve),
        }
    }

    pub(super) fn stop_serving(&self, channel: String) {
        match self {
            Listening::Listener(listener) => listener.do_send(StopServing(channel)),
            #[cfg(feature = "memory")]
            Listening::Memory(memory) => {
                // Done when called; its future only answers Ok.
                drop(crate::backend::Signalling::stop_serving(memory, &channel));
            }
        }
    }

    /// The listener, for doorbells; none in memory (a pool there looks at its ticks).
    pub(super) fn listener(&self) -> Option<&Addr<ListenerActor>> {
        match self {
            Listening::Listener(listener) => Some(listener),
            #[cfg(feature = "memory")]
            Listening::Memory(_) => None,
        }
    }
}

/// The leases of a pool, shared with the tasks of its ticks.
pub(super) type Locks = Arc<dyn PoolLocks>;
