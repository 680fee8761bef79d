//! Inspection: `Get` and `ListPrefix` — reads on the pool, safe to retry on
//! another connection whatever happened to the first — and the reaping of lapsed places in
//! line, as safe to repeat.

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};
use tracing::debug;

use super::LockManager;
use super::counters::Counters;
use super::messages::{Get, ListPrefix};

impl LockManager {
    /// Deletes the places in line that lapsed (see `LeaseTable::reap_lapsed_places`), on a
    /// task of its own: a place a dead process left behind is ignored by every grant already,
    /// and is gone within a lease of lapsing. A failure waits for the next time.
    pub(super) fn reap_lapsed_places(&self) {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        tokio::spawn(async move {
            match table.reap_lapsed_places(&pool.idempotent(None)).await {
                Ok(0) => {}
                Ok(reaped) => debug!(reaped, "lapsed places in line deleted"),
                Err(e) => debug!(error = %e, "cannot delete lapsed places in line; next time"),
            }
        });
    }
}

impl Handler<Get> for LockManager {
    type Result = ResponseFuture<Result<LeaseInfo>>;

    fn handle(&mut self, Get(name): Get, _: &mut Context<Self>) -> Self::Result {
        Counters::add(&self.counters.read_statements);
        let (pool, table) = (self.pool.clone(), self.table.clone());
        Box::pin(async move { table.get(&pool.idempotent(None), &name).await })
    }
}

impl Handler<ListPrefix> for LockManager {
    type Result = ResponseFuture<Result<Vec<LeaseInfo>>>;

    fn handle(&mut self, ListPrefix(prefix): ListPrefix, _: &mut Context<Self>) -> Self::Result {
        Counters::add(&self.counters.read_statements);
        let (pool, table) = (self.pool.clone(), self.table.clone());
        Box::pin(async move { table.list_prefix(&pool.idempotent(None), &prefix).await })
    }
}
