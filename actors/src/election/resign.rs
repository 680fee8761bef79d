//! [`RequestResign`]: ask an election's leader to step down. The request is a row for the term
//! leading now (`pgcoord::LeaseTable::request_resign`); the leader finds it by looking, at each
//! heartbeat ([`Leadership::resign_requested`](super::Leadership::resign_requested)), never on a
//! notification's word, and resigns once its work is wound down.

use actix::prelude::*;
use pgcoord::Result;

use crate::leases::LockManager;

/// Ask the leader of election `name` to step down. Answers the term asked (its token), `None`
/// when no one leads. Not a release: the term lasts until its leader resigns, so its work ends
/// before the next term begins. Recorded as asked by this manager's owner identity.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<i64>>")]
#[non_exhaustive]
pub struct RequestResign {
    /// The election (its lease's name).
    pub name: String,
}

impl Handler<RequestResign> for LockManager {
    type Result = ResponseFuture<Result<Option<i64>>>;

    fn handle(&mut self, request: RequestResign, _: &mut Context<Self>) -> Self::Result {
        let context = self.context();
        // Safe to repeat: a second request for the same term replaces the first.
        Box::pin(async move {
            let statements = context.pool.idempotent(None);
            (context.table)
                .request_resign(&statements, &request.name, &context.owner)
                .await
        })
    }
}

/// Whether the term of `name` held with `token` was asked to step down.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<bool>")]
pub(crate) struct ResignRequested {
    pub(crate) name: String,
    pub(crate) token: i64,
}

impl Handler<ResignRequested> for LockManager {
    type Result = ResponseFuture<Result<bool>>;

    fn handle(&mut self, asked: ResignRequested, _: &mut Context<Self>) -> Self::Result {
        let context = self.context();
        Box::pin(async move {
            let statements = context.pool.idempotent(None);
            (context.statements())
                .resign_requested(&statements, &asked.name, asked.token)
                .await
        })
    }
}
