//! A router's reach on PostgreSQL: the lock manager's sender to leases' holders (its notices
//! batch with every other router's of the manager), and the lock table's name, which scopes a
//! routed pool's channels. Asked of the manager once per router (see [`route`](super::route)).

use actix::prelude::*;

use crate::leases::{HolderNotices, LockManager};

/// Asks a lock manager for its [`HolderReach`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "HolderReach")]
pub(super) struct GetHolderReach;

/// Sends to keys' holders through one manager's pool. Cheap to clone.
#[derive(Clone)]
pub(super) struct HolderReach {
    /// The lock table's name, quoted and qualified as the statements use it: what scopes a
    /// routed pool's channels to the deployment whose leases they serve.
    pub(super) lock_table: String,
    pub(super) notices: HolderNotices,
}

impl Handler<GetHolderReach> for LockManager {
    type Result = MessageResult<GetHolderReach>;

    fn handle(&mut self, _: GetHolderReach, _: &mut Context<Self>) -> Self::Result {
        MessageResult(HolderReach {
            lock_table: self.config().lock_table().quoted(),
            notices: self.holder_notices(),
        })
    }
}
