//! [`Release`]: ending a tenure on the server, batched with others when a burst is under way.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use tracing::warn;

use super::LockManager;
use super::messages::Release;
use super::permit::wake_released;
use crate::losses::{LossReason, Tenure};

impl Handler<Release> for LockManager {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, Release { name, token }: Release, _: &mut Context<Self>) -> Self::Result {
        // Forgotten before the statement runs, so a heartbeat in flight that no longer finds
        // the row does not report a loss.
        let Some(held) = self.holdings.remove(&name, token) else {
            let error = Error::new(
                ErrorKind::LockLost,
                format!("lease {name:?} (token {token}) was already released or lost"),
            );
            return Box::pin(actix::fut::ready(Err(error)));
        };
        self.count_held();
        let releaser = self.releaser();
        let shared_name: Arc<str> = Arc::from(name.as_str());
        // On its own task, so a manager stopping does not abandon a release it has already
        // taken out of its holdings. Bounded by the statement timeout; retried on another
        // connection only when its own was found dead before it was sent (a release that may
        // have run is not repeated: a second run would report the lease lost).
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
                    warn!(lease = %name, error = %e, "release failed; the lease expires on its own");
                    held.end(Tenure::Released);
                }
                Ok(()) => held.end(Tenure::Released),
            }
            wake_released(&act.context().queues, &name);
            result
        }))
    }
}
