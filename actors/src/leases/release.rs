//! [`Release`]: ending a tenure on the server, batched with others when a burst is under way.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use tracing::warn;

use super::LockManager;
use super::messages::Release;
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
        let context = self.context();
        let releaser = context.releaser.clone();
        let shared_name: Arc<str> = Arc::from(name.as_str());
        // The name's turn, taken now when free, before any other wait of the name can.
        let queue = context.queues.join(&name);
        let turn = queue.turn.clone().try_lock_owned().ok();
        // On a task of its own, so the manager stopping abandons no release, and holding the
        // name's turn: no wait, claim or check of the name runs here while it does. Bounded by
        // the statement timeout; retried on another connection only when its own was found
        // dead before it was sent (a release that may have run is not repeated: a second run
        // would report the lease lost). Batched with others when a burst is under way.
        let release = tokio::spawn(async move {
            let turn = match turn {
                Some(turn) => turn,
                None => queue.turn.clone().lock_owned().await,
            };
            let on_release = held.on_release;
            let result = releaser
                .release(shared_name.clone(), token, on_release)
                .await;
            // Gone on the server before we released it: that is a loss, reported once.
            let lost = matches!(&result, Err(e) if e.is_lock_lost());
            match &result {
                Err(_) if lost => held.end(Tenure::Lost(LossReason::TakenOver)),
                Err(e) => {
                    warn!(lease.name = %shared_name, error = %e, "release failed; the lease expires on its own");
                    held.end(Tenure::Released);
                }
                Ok(()) => held.end(Tenure::Released),
            }
            context.queues.give_back(queue, Some(turn));
            context.queues.wake_released(&shared_name);
            (result, lost)
        });
        let release = async move {
            release.await.unwrap_or_else(|e| {
                let error = Error::new(ErrorKind::Other, format!("release task failed: {e}"));
                (Err(error), false)
            })
        };
        Box::pin(release.into_actor(self).map(move |(result, lost), act, _| {
            if lost {
                act.report_loss(&name, token, LossReason::TakenOver);
            }
            result
        }))
    }
}
