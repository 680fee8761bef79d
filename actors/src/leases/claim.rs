//! [`Claim`]: take at once whichever of many leases are free, without waiting — what a worker
//! pool does with its share of keys — in batched statements.

use std::time::Instant;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::lease::{AcquireRequest, Grant};

use super::context::Counters;
use super::messages::Claim;
use super::{Lease, LockManager};
use crate::batch::MAX_BATCH;

impl Handler<Claim> for LockManager {
    type Result = ResponseActFuture<Self, Result<Vec<Lease>>>;

    fn handle(&mut self, Claim { mut names }: Claim, _: &mut Context<Self>) -> Self::Result {
        // Names held here are not asked again (leases never stack), nor names a wait here is
        // under way for: its turn excludes any other grant of the name to this manager.
        let queues = self.context().queues.clone();
        names.retain(|n| !self.holdings.contains(n) && !queues.busy(n));
        names.sort();
        names.dedup();
        let context = self.context();
        let claim = async move {
            let mut granted: Vec<(String, Grant, Instant)> = Vec::new();
            let owner = context.statements();
            for chunk in names.chunks(MAX_BATCH) {
                let requests: Vec<AcquireRequest<'_>> =
                    chunk.iter().map(|name| AcquireRequest::new(name)).collect();
                let statements = context.pool.statements(None);
                let sent = Instant::now();
                let grants = pgcoord::db::retry(|| {
                    Counters::add(&context.counters.acquire_statements);
                    owner.try_acquire_many(&statements, &requests, context.lease)
                })
                .await?;
                granted.extend(grants.into_iter().map(|(name, grant)| (name, grant, sent)));
            }
            Ok(granted)
        };
        Box::pin(
            claim
                .into_actor(self)
                .map(|result: Result<Vec<_>>, act, ctx| {
                    let granted = result?;
                    Ok(granted
                        .into_iter()
                        .map(|(name, grant, sent)| act.lease_for(name, false, grant, sent, ctx))
                        .collect())
                }),
        )
    }
}
