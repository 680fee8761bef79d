//! [`Release`]: ending a tenure on the server, batched with others when a burst is under way.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use tracing::warn;

use super::{LockManager, Release};
use crate::losses::LossReason;

impl Handler<Release> for LockManager {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, Release { name, token }: Release, _: &mut Context<Self>) -> Self::Result {
        // Forget it before the statement runs, so a heartbeat in flight that no longer finds
        // the row does not report a loss.
        if self
            .held
            .get(name.as_str())
            .is_none_or(|h| h.token != token)
        {
            let error = Error::new(
                ErrorKind::LockLost,
                format!("lease {name:?} (token {token}) was already released or lost"),
            );
            return Box::pin(actix::fut::ready(Err(error)));
        }
        // Started with the actor, before any message is handled.
        let releaser = self.releaser.clone().expect("started");
        let held = self.forget_lease(&name).expect("checked above");
        let shared_name: Arc<str> = Arc::from(name.as_str());
        // On its own task, so a manager stopping (Shutdown) does not abandon a release it has
        // already taken out of `held`. Bounded by the statement timeout; retried on another
        // connection only when its own was found dead before it was sent (a release that may
        // have run is not repeated: a second run would report the lease lost). Batched with
        // others when a burst is under way.
        let keep = held.keep_on_release;
        let release = tokio::spawn(async move { releaser.release(shared_name, token, keep).await });
        let release = async move {
            release.await.unwrap_or_else(|e| {
                Err(Error::new(
                    ErrorKind::Other,
                    format!("release task failed: {e}"),
                ))
            })
        };
        Box::pin(release.into_actor(self).map(move |result, act, _| {
            match &result {
                // Gone on the server before we released it: that is a loss, reported once.
                Err(e) if e.is_lock_lost() => act.announce_loss(&name, held, LossReason::TakenOver),
                Err(e) => {
                    warn!(lease = %name, error = %e, "release failed; the lease expires on its own")
                }
                Ok(()) => {}
            }
            super::semaphore::wake_released(&act.queues, &name);
            result
        }))
    }
}
