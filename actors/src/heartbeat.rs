//! The life of held leases in `LockManager`: the heartbeat (one renew statement for all of
//! them), the monotonic deadlines, and loss reports.

use std::collections::HashSet;
use std::time::Instant;

use actix::prelude::*;
use pgcoord::Error;
use tracing::warn;

use crate::manager::{Held, LockManager};
use crate::messages::{LockKey, LockLost, LossReason};

impl LockManager {
    /// Runs the heartbeat: one renew statement for every held lease.
    pub(crate) fn renew_all(&mut self, ctx: &mut Context<Self>) {
        if self.renewing || self.held.is_empty() {
            return;
        }
        self.renewing = true;
        self.stats.renew_statements += 1;
        let snapshot: Vec<(String, i64)> = self
            .held
            .iter()
            .map(|(name, h)| (name.clone(), h.token))
            .collect();
        let (pool, table, lease) = (self.pool.clone(), self.table.clone(), self.config.lease());
        let sent = Instant::now();
        let renew = async move {
            let client = pool.get().await?;
            let renewed = table.renew(&*client, &snapshot, lease).await?;
            Ok::<_, Error>((snapshot, renewed))
        };
        ctx.spawn(renew.into_actor(self).map(move |result, act, _| {
            act.renewing = false;
            match result {
                Ok((snapshot, renewed)) => {
                    let deadline = sent + act.config.lease() - act.margin();
                    let renewed: HashSet<_> = renewed.into_iter().collect();
                    for (name, token) in snapshot {
                        if renewed.contains(&(name.clone(), token)) {
                            if let Some(held) = act.held.get_mut(&name).filter(|h| h.token == token) {
                                held.deadline = deadline;
                            }
                        } else {
                            act.lose(&name, token, LossReason::TakenOver);
                        }
                    }
                }
                Err(e) => warn!(
                    error = %e,
                    leases = act.held.len(),
                    "lease renewal failed; leases not renewed in time are reported lost at their deadline"
                ),
            }
        }));
    }

    /// Reports every lease whose deadline has passed.
    pub(crate) fn sweep_deadlines(&mut self) {
        let now = Instant::now();
        let expired: Vec<(String, i64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(name, h)| (name.clone(), h.token))
            .collect();
        for (name, token) in expired {
            self.lose(&name, token, LossReason::DeadlinePassed);
            // A renewal may still land after we gave up: free the row so it does not linger.
            let (pool, table) = (self.pool.clone(), self.table.clone());
            tokio::spawn(async move {
                if let Ok(client) = pool.get().await {
                    let _ = table.release(&*client, &name, token, false).await;
                }
            });
        }
    }

    /// Forgets a held lease and tells its holder and every subscriber, once.
    pub(crate) fn lose(&mut self, name: &str, token: i64, reason: LossReason) {
        if self.held.get(name).is_none_or(|h| h.token != token) {
            return;
        }
        let held = self.held.remove(name).expect("checked above");
        self.announce_loss(name, held, reason);
    }

    /// Tells the holder of a lease no longer in `held`, and every subscriber, that it was lost.
    pub(crate) fn announce_loss(&mut self, name: &str, held: Held, reason: LossReason) {
        self.stats.lost += 1;
        warn!(lease = name, token = held.token, ?reason, "lease lost");
        let _ = held.lost.send(Some(reason));
        let lost = LockLost {
            key: LockKey::Lease(name.to_owned()),
            token: Some(held.token),
            reason,
        };
        self.broadcast(lost);
        self.queues.wake(name);
    }

    /// Sends `lost` to every subscriber, forgetting those that are gone.
    pub(crate) fn broadcast(&mut self, lost: LockLost) {
        // do_send ignores the mailbox's capacity: a loss report must never be dropped because a
        // subscriber is busy.
        self.subscribers.retain(|s| {
            s.do_send(lost.clone());
            s.connected()
        });
    }
}
