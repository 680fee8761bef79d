//! [`PayloadExpiry`]: deletes expired rows of the payload table on a timer.
//!
//! Large payloads themselves go straight from the `ListenerActor` to its
//! [`PayloadStore`](pgcoord::payload::PayloadStore) (on a task per message, never through a
//! mailbox: an actor hop would add latency and serialize fetches without doing anything). What
//! is left to own is the table's lifetime: rows outlive their message by the payload TTL, and
//! something has to delete them.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::payload::PayloadTable;
use tracing::{debug, warn};

/// Deletes expired payload rows every `expire_every`. A `Coordinator` starts one.
pub struct PayloadExpiry {
    table: PayloadTable,
    expire_every: Duration,
}

impl PayloadExpiry {
    /// An actor over `table`, deleting expired rows every `expire_every` (a tenth of the
    /// time-to-live is a sensible choice).
    pub fn new(table: PayloadTable, expire_every: Duration) -> PayloadExpiry {
        PayloadExpiry {
            table,
            expire_every,
        }
    }
}

impl Actor for PayloadExpiry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.expire_every, |act, ctx| {
            let table = act.table.clone();
            ctx.spawn(
                async move { table.delete_expired().await }
                    .into_actor(act)
                    .map(|result, _, _| match result {
                        Ok(n) => debug!(deleted = n, "expired payloads deleted"),
                        Err(e) => warn!(error = %e, "cannot delete expired payloads"),
                    }),
            );
        });
    }
}

/// Delete expired payloads now; returns how many.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<u64>")]
pub struct DeleteExpired;

impl Handler<DeleteExpired> for PayloadExpiry {
    type Result = ResponseFuture<Result<u64>>;
    fn handle(&mut self, _: DeleteExpired, _: &mut Context<Self>) -> Self::Result {
        let table = self.table.clone();
        Box::pin(async move { table.delete_expired().await })
    }
}

impl Handler<crate::losses::Shutdown> for PayloadExpiry {
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
