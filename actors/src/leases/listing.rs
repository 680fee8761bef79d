//! Inspection: [`Get`], [`List`] and [`ListPrefix`] — reads on the pool, safe to retry on
//! another connection whatever happened to the first.

use actix::prelude::*;
use pgcoord::{LeaseInfo, Result};

use super::LockManager;
use super::counters::Counters;
use super::messages::{Get, List, ListPrefix};

impl Handler<Get> for LockManager {
    type Result = ResponseFuture<Result<LeaseInfo>>;

    fn handle(&mut self, Get(name): Get, _: &mut Context<Self>) -> Self::Result {
        Counters::add(&self.counters.read_statements);
        let (pool, table) = (self.pool.clone(), self.table.clone());
        Box::pin(async move { table.get(&pool.idempotent(None), &name).await })
    }
}

impl Handler<List> for LockManager {
    type Result = ResponseFuture<Result<Vec<LeaseInfo>>>;

    fn handle(&mut self, _: List, _: &mut Context<Self>) -> Self::Result {
        Counters::add(&self.counters.read_statements);
        let (pool, table) = (self.pool.clone(), self.table.clone());
        Box::pin(async move { table.list(&pool.idempotent(None)).await })
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
