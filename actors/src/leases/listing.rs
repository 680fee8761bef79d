//! Inspection: [`Get`], [`List`] and [`ListPrefix`] — reads on the pool, safe to retry on
//! another connection whatever happened to the first.

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};

use super::{Get, List, LockManager};

/// Every lease whose name starts with the prefix, as `Get` reports one.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<LeaseInfo>>")]
pub struct ListPrefix(pub String);

impl Handler<Get> for LockManager {
    type Result = ResponseFuture<Result<LeaseInfo>>;

    fn handle(&mut self, Get(name): Get, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // A read: safe to retry on another connection whatever happened to the first.
        Box::pin(async move { table.get(&pool.idempotent(None), &name).await })
    }
}

impl Handler<List> for LockManager {
    type Result = ResponseFuture<Result<Vec<LeaseInfo>>>;

    fn handle(&mut self, _: List, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // A read: safe to retry on another connection whatever happened to the first.
        Box::pin(async move { table.list(&pool.idempotent(None)).await })
    }
}

impl Handler<ListPrefix> for LockManager {
    type Result = ResponseFuture<Result<Vec<LeaseInfo>>>;

    fn handle(&mut self, ListPrefix(prefix): ListPrefix, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // A read: safe to retry on another connection whatever happened to the first.
        Box::pin(async move { table.list_prefix(&pool.idempotent(None), &prefix).await })
    }
}
