//! The life of held leases in `LockManager`, the I/O of the book (`book`): the heartbeat (one
//! renew statement for all of them), the deadline sweep, and loss reports.
//!
//! Renewals run on a connection of their own: nothing that uses the pool can delay them. One
//! that hangs is cut off at the earliest deadline (or a quarter lease) and retried at once on a
//! new connection; one idle since the last tick answers a check first, within a share of that
//! bound, so a connection that died unseen costs little of it. A lease is reported lost only
//! when its deadline passes unrenewed, or when a renewal finds it gone on the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::__private::Failures;
use pgcoord::Error;
use tracing::{debug, warn};

use super::LockManager;
use super::book::{Answer, Verdict};
use super::counters::Counters;
use super::held::Held;
use crate::losses::{LockKey, LockLost, LossReason, Tenure};
use crate::session::Pinned;

/// The heartbeat's state: its connection and failures in a row (the renewal under way is the
/// book's).
#[derive(Default)]
pub(crate) struct Heartbeat {
    /// Its own connection, reopened when it fails.
    session: Option<Arc<Pinned>>,
    failures: Failures,
}

impl Heartbeat {
    /// Renewals failed in a row now.
    pub(crate) fn failures(&self) -> u32 {
        self.failures.in_a_row()
    }
}

impl LockManager {
    /// Runs the heartbeat: one renew statement for every held lease, as the book plans it.
    pub(crate) fn renew_all(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        // Too late for those: the sweep reports them; the rest are renewed.
        self.sweep_deadlines(now);
        let (timeout, lease) = (self.config.statement_timeout(), self.config.lease());
        let Some(renewal) = self.holdings.plan(now, timeout, lease) else {
            return;
        };
        Counters::add(&self.counters.renew_statements);
        let bound = renewal.bound;
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
                        Ok(Err(e)) => return (None, now, renewal, Err(e)),
                        Err(_) => {
                            let error = Error::new(
                                pgcoord::ErrorKind::Unavailable,
                                "no heartbeat connection before the earliest lease deadline",
                            );
                            return (None, now, renewal, Err(error));
                        }
                    }
                }
            };
            let sent = Instant::now();
            let statements = pgcoord::__private::until(&session.client, bound);
            let owner = table.owner(config.owner()).expect("a configured owner");
            let renewed = owner.renew_each(&statements, &renewal.tenures).await;
            (Some(session), sent, renewal, renewed)
        };
        ctx.spawn(
            renew
                .into_actor(self)
                .map(move |(session, sent, renewal, result), act, ctx| {
                    act.heartbeat.session = session.filter(|s| !s.is_broken());
                    let (answer, failed) = match result {
                        Ok(tokens) => (Answer::Renewed(tokens), None),
                        Err(e) => (Answer::Unknown, Some(e)),
                    };
                    for (name, token, verdict) in act.holdings.answered(renewal, sent, answer) {
                        if let Verdict::Lost(reason, held) = verdict {
                            act.announce_loss(&name, token, held, reason);
                        }
                    }
                    match failed {
                        None => {
                            act.heartbeat.failures.succeeded();
                            if let Some(metrics) = &act.metrics {
                                metrics.renew.record(sent.elapsed().as_secs_f64());
                            }
                        }
                        Some(e) => act.renew_failed(e, ctx),
                    }
                }),
        );
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

    /// Reports every lease whose deadline has passed at `now`.
    pub(crate) fn sweep_deadlines(&mut self, now: Instant) {
        for (name, token, held) in self.holdings.sweep(now) {
            let on_release = held.on_release;
            self.announce_loss(&name, token, held, LossReason::DeadlinePassed);
            // A renewal may still land after we gave up: free the row so it does not linger.
            let releaser = &self.context().releaser;
            releaser.release_in_background(name, token, on_release, "after its deadline passed");
        }
    }

    /// Tells the holder of a lease no longer held, and every subscriber, that it was lost.
    pub(crate) fn announce_loss(&mut self, name: &str, token: i64, held: Held, reason: LossReason) {
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
        self.context().queues.wake_released(name);
    }
}
