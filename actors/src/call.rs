//! [`Call`]: one `?` for a message whose answer is a `pgcoord::Result`, instead of two (one for
//! actix's `MailboxError`, one for pgcoord's error).

use std::future::Future;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};

/// Sends a message and flattens the answer: an actor that stopped (or whose mailbox closed) is
/// [`ErrorKind::Unavailable`], like a database that cannot be reached.
///
/// ```no_run
/// use pgcoord_actors::{Acquire, Call, LockManager};
///
/// async fn take(manager: actix::Addr<LockManager>) -> pgcoord::Result<()> {
///     let lease = manager.call(Acquire::new("leader")).await?;
///     lease.release().await
/// }
/// ```
pub trait Call<A: Actor> {
    /// `send(message)`, with the mailbox's error folded into pgcoord's.
    fn call<M, T>(&self, message: M) -> impl Future<Output = Result<T>> + 'static
    where
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message<Result = Result<T>> + Send + 'static,
        T: Send + 'static;
}

impl<A: Actor> Call<A> for Addr<A> {
    fn call<M, T>(&self, message: M) -> impl Future<Output = Result<T>> + 'static
    where
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message<Result = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let answer = self.send(message);
        async move {
            answer.await.map_err(|e| {
                Error::new(ErrorKind::Unavailable, format!("the actor stopped: {e}"))
            })?
        }
    }
}
