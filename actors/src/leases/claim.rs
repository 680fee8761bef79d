//! [`Claim`]: take at once whichever of many leases are free, without waiting — what a worker
//! pool does with its share of keys — in batched statements.

use std::time::Instant;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::lease::AcquireRequest;

use super::{Lease, LockManager};
use crate::batch::MAX_BATCH;

/// Take each of `names` that is free now (not held, no other waiter first in line, its row
/// not locked), in one statement per thousand names; the others are left alone, not waited for.
/// Answers the leases granted. A caller that goes away has them released.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<Lease>>")]
pub struct Claim {
    /// The leases to take, distinct.
    pub names: Vec<String>,
}

impl Handler<Claim> for LockManager {
    type Result = ResponseActFuture<Self, Result<Vec<Lease>>>;

    fn handle(&mut self, Claim { mut names }: Claim, _: &mut Context<Self>) -> Self::Result {
        // Names held here already are not asked again (leases never stack).
        names.retain(|n| !self.held.contains_key(n.as_str()));
        names.sort();
        names.dedup();
        let (pool, table, owner, lease, sent_count) = (
            self.pool.clone(),
            self.table.clone(),
            self.config.owner().to_owned(),
            self.config.lease(),
            self.acquire_statements.clone(),
        );
        let claim = async move {
            let mut granted = Vec::new();
            for chunk in names.chunks(MAX_BATCH) {
                let requests: Vec<AcquireRequest<'_>> =
                    chunk.iter().map(|name| AcquireRequest::new(name)).collect();
                let statements = pool.statements(None);
                let sent = Instant::now();
                let grants = pgcoord::db::retry(|| {
                    sent_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    table.try_acquire_many(&statements, &requests, &owner, lease)
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
