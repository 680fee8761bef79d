//! `Proclaim`: a leader's new value, stored with its lease and announced in one statement.

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};

use crate::leases::LockManager;

/// Store `value` as the data of the lease `name` held with `token`, and announce it on the
/// election channel (`pgcoord::election`). [`ErrorKind::LockLost`] when this manager no longer
/// holds that lease with that token.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct Proclaim {
    /// The election (the lease's name).
    pub(crate) name: String,
    /// The term's token.
    pub(crate) token: i64,
    /// The value to proclaim.
    pub(crate) value: Vec<u8>,
}

impl Handler<Proclaim> for LockManager {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, proclaim: Proclaim, _: &mut Context<Self>) -> Self::Result {
        if !self.holds(&proclaim.name, proclaim.token) {
            let error = Error::new(
                ErrorKind::LockLost,
                format!(
                    "election {:?} is not led here with token {}",
                    proclaim.name, proclaim.token
                ),
            );
            return Box::pin(std::future::ready(Err(error)));
        }
        let context = self.context();
        // Not repeated once it may have run (a second one would announce twice); a connection
        // found dead before sending is replaced.
        Box::pin(async move {
            let Proclaim { name, token, value } = proclaim;
            let statements = context.pool.statements(None);
            (context.statements())
                .proclaim(&statements, &name, token, &value)
                .await
        })
    }
}
