//! How a router reaches a key's holder: the seam ([`Holders`], one implementation per backend)
//! and its PostgreSQL side ([`Reach`]): one
//! statement that reads a key's holder and notifies it, through the lock manager's sender to
//! leases' holders (its notices batch with every other router's of the manager), answered
//! through the listener. The lock table's name scopes a routed pool's channels. The sender is
//! asked of the manager once per router (see [`route`](super::route)).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use tracing::debug;

use super::wire::{pool_channel, scope};
use crate::Call;
use crate::leases::{HolderNotices, LockManager};
use crate::signals::{AskThrough, ListenerActor};

/// What a router reaches keys' holders through, one per backend: on PostgreSQL, one statement
/// that reads a key's holder and notifies it ([`HolderReach`]), answered through the listener.
pub(crate) trait Holders: Send + Sync {
    /// One request to the holder of `lease`, a key of pool `pool`: its answer, or `None` when
    /// nobody holds the key (nothing was sent; with `record`, the key is recorded and the
    /// pool's doorbell rung). `sent` is set while a worker may have the request.
    fn send_once<'a>(
        &'a self,
        pool: &'a str,
        lease: &'a str,
        request: Vec<u8>,
        left: Duration,
        record: bool,
        sent: &'a mut bool,
    ) -> pgcoord::BoxFuture<'a, Result<Option<Vec<u8>>>>;
}

/// Asks a lock manager for its [`HolderReach`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "HolderReach")]
struct GetHolderReach;

/// Sends to keys' holders through one manager's pool. Cheap to clone.
#[derive(Clone)]
struct HolderReach {
    /// The lock table's name, quoted and qualified as the statements use it: what scopes a
    /// routed pool's channels to the deployment whose leases they serve.
    lock_table: String,
    notices: HolderNotices,
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

/// The PostgreSQL side: the lock manager's sender to holders, and the listener for answers.
pub(super) struct Reach {
    locks: Addr<LockManager>,
    listener: Addr<ListenerActor>,
    /// The lock manager's sender to holders and its table's name, asked of `locks` once.
    reach: tokio::sync::OnceCell<HolderReach>,
}

impl Reach {
    /// A reach through `locks`'s sender, hearing answers through `listener`.
    pub(super) fn new(locks: Addr<LockManager>, listener: Addr<ListenerActor>) -> Reach {
        Reach {
            locks,
            listener,
            reach: tokio::sync::OnceCell::new(),
        }
    }
}

impl Holders for Reach {
    fn send_once<'a>(
        &'a self,
        pool: &'a str,
        lease: &'a str,
        request: Vec<u8>,
        left: Duration,
        record: bool,
        sent: &'a mut bool,
    ) -> pgcoord::BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            let reach = (self.reach)
                .get_or_try_init(|| self.locks.send(GetHolderReach))
                .await
                .map_err(|_| Error::new(ErrorKind::Unavailable, "the lock manager stopped"))?;
            let scope = scope(&reach.lock_table, pool);
            // Who the statement found holding the key: unset if it did not run to the end.
            let holder = Arc::new(std::sync::OnceLock::<Option<String>>::new());
            let send = {
                let (reach, lease, holder) = (reach.clone(), lease.to_owned(), holder.clone());
                Box::new(move |text: String| -> crate::seam::BoxFuture<Result<()>> {
                    Box::pin(async move {
                        let owner = reach.notices.notify(lease, scope, text).await?;
                        let nobody = owner.is_none();
                        let _ = holder.set(owner);
                        if nobody {
                            return Err(Error::new(ErrorKind::NotFound, "nobody holds the key"));
                        }
                        Ok(())
                    })
                })
            };
            // From here a worker may have it, unless the statement found no holder.
            *sent = true;
            let ask = AskThrough {
                send,
                payload: request,
                timeout: left,
            };
            match self.listener.call(ask).await {
                Err(_) if holder.get() == Some(&None) => {
                    *sent = false;
                    if record {
                        // Again at each look: the doorbell is not to be trusted to ring.
                        let doorbell = pool_channel(&reach.lock_table, pool);
                        if let Err(e) = reach.notices.record_and_ring(lease, &doorbell).await {
                            debug!(error = %e, "cannot record the key; looking again");
                        }
                    }
                    Ok(None)
                }
                Err(e) => Err(e),
                Ok(answer) => Ok(Some(answer)),
            }
        })
    }
}
