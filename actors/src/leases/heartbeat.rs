//! The life of held leases in `LockManager`: the heartbeat (one renew statement for all of
//! them), the monotonic deadlines, and loss reports.
//!
//! Renewals run on the heartbeat's own connection, so nothing that uses the pool — acquires
//! waiting on a contended name, an application's inspections, a pool exhausted by anything —
//! can delay them. Each renewal is bounded by the time left before the earliest deadline (and
//! the statement timeout): a renewal that hangs (a frozen backend, a black-holed connection) is
//! cancelled on the server, its connection is dropped, and the next renewal, on a new
//! connection, follows promptly instead of at the next tick. A lease is reported lost only when
//! its deadline passes without a confirmed renewal, or when a renewal finds it gone on the
//! server.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Error;
use tracing::{debug, warn};

use super::{Held, LockManager};
use crate::losses::{LockKey, LockLost, LossReason};
use crate::session::Pinned;

impl LockManager {
    /// Runs the heartbeat: one renew statement for every held lease.
    pub(crate) fn renew_all(&mut self, ctx: &mut Context<Self>) {
        if self.renewing || self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        let Some(earliest) = self.held.values().map(|h| h.deadline).min() else {
            return;
        };
        if earliest <= now {
            // Too late for that one: the sweep reports it; renew the rest.
            self.sweep_deadlines();
            if self.held.is_empty() {
                return;
            }
            return self.renew_all(ctx);
        }
        // A renewal confirmed after the earliest deadline cannot save that lease, and waiting
        // longer would delay the retry that may save the others. A renewal takes a round trip;
        // one that has not answered within a quarter of the lease is stuck, and a retry on a new
        // connection still has most of the lease left.
        let attempt = self.config.statement_timeout().min(self.config.lease() / 4);
        let bound = earliest.min(now + attempt);
        self.renewing = true;
        self.stats.renew_statements += 1;
        // The names are shared (`Arc<str>`), not copied: a tick allocates one vector.
        let snapshot: Vec<(Arc<str>, i64)> = self
            .held
            .iter()
            .map(|(name, h)| (name.clone(), h.token))
            .collect();
        let session = self.heartbeat.clone().filter(|s| !s.is_broken());
        let (config, table, lease) = (self.config.clone(), self.table.clone(), self.config.lease());
        let renew = async move {
            let session = match session {
                Some(session) => session,
                None => {
                    let opened =
                        tokio::time::timeout_at(bound.into(), Pinned::open(&config, "heartbeat"))
                            .await
                            .unwrap_or_else(|_| {
                                Err(Error::new(
                                    pgcoord::ErrorKind::Unavailable,
                                    "no heartbeat connection before the earliest lease deadline",
                                ))
                            });
                    match opened {
                        Ok(pinned) => Arc::new(pinned),
                        Err(e) => return (None, Instant::now(), snapshot, Err(e)),
                    }
                }
            };
            let sent = Instant::now();
            let statements = pgcoord::db::until(&session.client, bound);
            let owner = config.owner();
            let renewed = table.renew(&statements, owner, &snapshot, lease).await;
            (Some(session), sent, snapshot, renewed)
        };
        ctx.spawn(renew.into_actor(self).map(
            move |(session, sent, snapshot, result), act, ctx| {
                act.renewing = false;
                act.heartbeat = session.filter(|s| !s.is_broken());
                match result {
                    Ok(renewed) => {
                        act.renew_failures = 0;
                        if let Some(metrics) = &act.metrics {
                            metrics.renew.record(sent.elapsed().as_secs_f64());
                        }
                        act.renewed(sent, snapshot, renewed);
                    }
                    Err(e) => act.renew_failed(e, ctx),
                }
            },
        ));
    }

    /// Moves the deadline of every lease the renewal confirmed; the others are gone on the
    /// server.
    fn renewed(&mut self, sent: Instant, snapshot: Vec<(Arc<str>, i64)>, renewed: Vec<i64>) {
        let deadline = sent + self.config.lease() - self.margin();
        let renewed: HashSet<i64> = renewed.into_iter().collect();
        for (name, token) in snapshot {
            if renewed.contains(&token) {
                if let Some(held) = self.held.get_mut(&*name).filter(|h| h.token == token) {
                    held.deadline = deadline;
                }
            } else {
                self.lose(&name, token, LossReason::TakenOver);
            }
        }
    }

    /// Tries again soon: the leases are still ours until their deadlines.
    fn renew_failed(&mut self, error: Error, ctx: &mut Context<Self>) {
        self.renew_failures += 1;
        self.stats.renew_failures += 1;
        if let Some(metrics) = &self.metrics {
            metrics.renew_failures.increment(1);
        }
        // The first failure, then every power of two: an outage must not flood the log.
        if self.renew_failures.is_power_of_two() {
            warn!(
                error = %error,
                leases = self.held.len(),
                failures = self.renew_failures,
                "lease renewal failed; retrying (leases not renewed by their deadline are reported lost)"
            );
        }
        let retry = (self.config.backoff())
            .delay(self.renew_failures - 1)
            .max(Duration::from_millis(10))
            .min(self.config.heartbeat().unwrap_or(self.config.lease() / 4));
        debug!(?retry, "renewal retry scheduled");
        ctx.run_later(retry, |act, ctx| act.renew_all(ctx));
    }

    /// Reports every lease whose deadline has passed.
    pub(crate) fn sweep_deadlines(&mut self) {
        let now = Instant::now();
        let expired: Vec<(Arc<str>, i64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(name, h)| (name.clone(), h.token))
            .collect();
        for (name, token) in expired {
            self.lose(&name, token, LossReason::DeadlinePassed);
            // A renewal may still land after we gave up: free the row so it does not linger.
            let (pool, table) = (self.pool.clone(), self.table.clone());
            let owner = self.config.owner().to_owned();
            tokio::spawn(async move {
                let statements = pool.statements(None);
                if let Err(e) = table
                    .release(&statements, &name, &owner, token, false)
                    .await
                {
                    debug!(lease = %name, error = %e, "release after a passed deadline failed");
                }
            });
        }
    }

    /// Forgets a held lease and tells its holder and every subscriber, once.
    pub(crate) fn lose(&mut self, name: &str, token: i64, reason: LossReason) {
        if self.held.get(name).is_none_or(|h| h.token != token) {
            return;
        }
        let held = self.forget_lease(name).expect("checked above");
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
        self.subscribers.broadcast(lost);
        self.queues.wake(name);
    }
}
