//! Replies that outlive their handler: the pieces shared by the messages whose work runs on
//! inside an actor (`Acquire`, `AdvisoryLock`, `Request`) and must notice a caller that left.
//!
//! actix hands a custom `MessageResponse` the reply channel itself; watching it close is how a
//! dropped `send(..)` (or an expired `send(..).timeout(..)`) cancels the work.

use actix::dev::OneshotSender;
use pgcoord::{Error, Result};

/// Resolves when nobody waits for the reply any more: the caller dropped its request, or sent
/// it with `do_send` and never wanted one.
pub(crate) async fn caller_gone<T>(reply: &mut Option<OneshotSender<T>>) {
    if let Some(reply) = reply {
        reply.closed().await
    }
}

/// Answers at once with `error`, for requests refused before any work started.
pub(crate) fn refuse<T>(reply: Option<OneshotSender<Result<T>>>, error: Error) {
    if let Some(reply) = reply {
        let _ = reply.send(Err(error));
    }
}

/// Resolves at `deadline`; never without one.
pub(crate) async fn deadline_passes(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
