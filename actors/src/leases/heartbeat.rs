//! The life of held leases in `LockManager`: the heartbeat (one renew statement for all of
//! them), the monotonic deadlines, and loss reports.
//!
//! Renewals run on a connection of their own: nothing that uses the pool can delay them. One
//! that hangs is cut off at the earliest deadline (or a quarter lease) and retried at once on a
//! new connection; one idle since the last tick answers a check first, within a share of that
//! bound, so a connection that died unseen costs little of it. A lease is reported lost only when its deadline passes unrenewed, or when a
//! renewal finds it gone on the server.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::__private::Failures;
use pgcoord::Error;
use tracing::{debug, warn};

use super::LockManager;
use super::counters::Counters;
use super::held::Held;
use super::permit::wake_released;
use crate::losses::{LockKey, LockLost, LossReason, Tenure};
use crate::session::Pinned;

/// The heartbeat's state: its connection, whether a renewal is under way, failures in a row.
#[derive(Default)]
pub(crate) struct Heartbeat {
    /// Its own connection, reopened when it fails.
    session: Option<Arc<Pinned>>,
    renewing: bool,
    failures: Failures,
}

impl Heartbeat {
    /// Renewals failed in a row now.
    pub(crate) fn failures(&self) -> u32 {
        self.failures.in_a_row()
    }
}

impl LockManager {
    /// Runs the heartbeat: one renew statement for every held lease.
    pub(crate) fn renew_all(&mut self, ctx: &mut Context<Self>) {
        // Too late for those: the sweep reports them; the rest are renewed.
        self.sweep_deadlines();
        let Some(earliest) = self.holdings.earliest_deadline() else {
            return;
        };
        if self.heartbeat.renewing {
            return;
        }
        // A renewal confirmed after the earliest deadline saves nothing, and one unanswered after
        // a quarter lease is stuck: a retry on a new connection still has most of the lease.
        let now = Instant::now();
        let attempt = self.config.statement_timeout().min(self.config.lease() / 4);
        let bound = earliest.min(now + attempt);
        self.heartbeat.renewing = true;
        Counters::add(&self.counters.renew_statements);
        let tenures = self.holdings.tenures();
        let session = self.heartbeat.session.clone().filter(|s| !s.is_broken());
        let (config, table) = (self.config.clone(), self.table.clone());
        let renew = async move {
            // One idle since the last tick may have died unseen (a partition): checked within a
            // share of the bound, so a dead one costs that share, not the whole bound.
            let session = match session {
                Some(session) if pgcoord::__private::answers(&session.client, bound).await => {
                    session
                }
                _ => {
                    let open = Pinned::open(&config, "heartbeat");
                    match tokio::time::timeout_at(bound.into(), open).await {
                        Ok(Ok(pinned)) => Arc::new(pinned),
                        Ok(Err(e)) => return (None, now, tenures, Err(e)),
                        Err(_) => {
                            let error = Error::new(
                                pgcoord::ErrorKind::Unavailable,
                                "no heartbeat connection before the earliest lease deadline",
                            );
                            return (None, now, tenures, Err(error));
                        }
                    }
                }
            };
            let sent = Instant::now();
            let statements = pgcoord::__private::until(&session.client, bound);
            let owner = table.owner(config.owner()).expect("a configured owner");
            let renewed = owner.renew_each(&statements, &tenures).await;
            (Some(session), sent, tenures, renewed)
        };
        ctx.spawn(
            renew
                .into_actor(self)
                .map(move |(session, sent, tenures, result), act, ctx| {
                    act.heartbeat.renewing = false;
                    act.heartbeat.session = session.filter(|s| !s.is_broken());
                    match result {
                        Ok(renewed) => {
                            act.heartbeat.failures.succeeded();
                            if let Some(metrics) = &act.metrics {
                                metrics.renew.record(sent.elapsed().as_secs_f64());
                            }
                            act.renewed(sent, tenures, renewed);
                        }
                        Err(e) => act.renew_failed(e, ctx),
                    }
                }),
        );
    }

    /// Moves the deadline of every lease the renewal confirmed, each by its own lease; the
    /// others are gone on the server.
    fn renewed(
        &mut self,
        sent: Instant,
        tenures: Vec<(Arc<str>, i64, Duration)>,
        renewed: Vec<i64>,
    ) {
        let renewed: HashSet<i64> = renewed.into_iter().collect();
        for (name, token, _) in tenures {
            if renewed.contains(&token) {
                self.holdings.extend(&name, token, sent);
            } else {
                self.lose(&name, token, LossReason::TakenOver);
            }
        }
    }

    /// Tries again soon: the leases are still ours until their deadlines.
    fn renew_failed(&mut self, error: Error, ctx: &mut Context<Self>) {
        let warn = self.heartbeat.failures.failed();
        let failures = self.heartbeat.failures.in_a_row();
        Counters::add(&self.counters.renew_failures);
        if let Some(metrics) = &self.metrics {
            metrics.renew_failures.increment(1);
        }
        if warn {
            warn!(
                error = %error,
                leases = self.holdings.len(),
                failures,
                "lease renewal failed; retrying (leases not renewed by their deadline are reported lost)"
            );
        }
        let retry = (self.heartbeat.failures)
            .delay(self.config.backoff(), 0)
            .max(Duration::from_millis(10))
            .min(self.config.heartbeat().unwrap_or(self.config.lease() / 4));
        debug!(?retry, "renewal retry scheduled");
        ctx.run_later(retry, |act, ctx| act.renew_all(ctx));
    }

    /// Reports every lease whose deadline has passed.
    pub(crate) fn sweep_deadlines(&mut self) {
        for (name, token) in self.holdings.past_deadline(Instant::now()) {
            let Some(held) = self.holdings.remove(&name, token) else {
                continue;
            };
            let on_release = held.on_release;
            self.announce_loss(&name, held, LossReason::DeadlinePassed);
            // A renewal may still land after we gave up: free the row so it does not linger.
            let releaser = &self.context().releaser;
            releaser.release_in_background(name, token, on_release, "after its deadline passed");
        }
    }

    /// Forgets a held lease and tells its holder and every subscriber, once.
    pub(crate) fn lose(&mut self, name: &str, token: i64, reason: LossReason) {
        if let Some(held) = self.holdings.remove(name, token) {
            self.announce_loss(name, held, reason);
        }
    }

    /// Tells the holder of a lease no longer held, and every subscriber, that it was lost.
    pub(crate) fn announce_loss(&mut self, name: &str, held: Held, reason: LossReason) {
        let token = held.token;
        held.end(Tenure::Lost(reason));
        self.report_loss(name, token, reason);
    }

    /// Counts the loss of `name`'s tenure `token` and tells every subscriber, once; its
    /// waiters here may try now.
    pub(crate) fn report_loss(&mut self, name: &str, token: i64, reason: LossReason) {
        Counters::add(&self.counters.lost);
        self.count_held();
        warn!(
            lease.name = name,
            lease.token = token,
            ?reason,
            "lease lost"
        );
        self.subscribers.broadcast(LockLost {
            key: LockKey::Lease(name.to_owned()),
            token: Some(token),
            reason,
        });
        wake_released(&self.context().queues, name);
    }
}
