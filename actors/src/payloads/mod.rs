//! [`PayloadStoreActor`]: puts and gets large payloads, and expires old rows on a timer.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::payload::{PayloadStore, PayloadTable};
use tracing::{debug, warn};

/// Owns the payload table and deletes expired rows every `expire_every`.
pub struct PayloadStoreActor {
    table: PayloadTable,
    expire_every: Duration,
}

impl PayloadStoreActor {
    /// An actor over `table`, expiring rows every `expire_every` (a tenth of the time-to-live is
    /// a sensible choice).
    pub fn new(table: PayloadTable, expire_every: Duration) -> PayloadStoreActor {
        PayloadStoreActor {
            table,
            expire_every,
        }
    }
}

impl Actor for PayloadStoreActor {
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

/// Store a payload; returns its key.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<String>")]
pub struct PutPayload(pub Vec<u8>);

/// Fetch a payload by key; [`pgcoord::ErrorKind::NotFound`] when it expired or never existed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<u8>>")]
pub struct GetPayload(pub String);

/// Delete expired payloads now; returns how many.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<u64>")]
pub struct DeleteExpired;

impl Handler<PutPayload> for PayloadStoreActor {
    type Result = ResponseFuture<Result<String>>;
    fn handle(&mut self, PutPayload(bytes): PutPayload, _: &mut Context<Self>) -> Self::Result {
        let table = self.table.clone();
        Box::pin(async move { table.put(bytes).await })
    }
}

impl Handler<GetPayload> for PayloadStoreActor {
    type Result = ResponseFuture<Result<Vec<u8>>>;
    fn handle(&mut self, GetPayload(key): GetPayload, _: &mut Context<Self>) -> Self::Result {
        let table = self.table.clone();
        Box::pin(async move { table.get(&key).await })
    }
}

impl Handler<DeleteExpired> for PayloadStoreActor {
    type Result = ResponseFuture<Result<u64>>;
    fn handle(&mut self, _: DeleteExpired, _: &mut Context<Self>) -> Self::Result {
        let table = self.table.clone();
        Box::pin(async move { table.delete_expired().await })
    }
}

impl Handler<crate::losses::Shutdown> for PayloadStoreActor {
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
