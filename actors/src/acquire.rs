//! The wait of one `Acquire`: attempts, reservation, wake-ups, deadline and cancellation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::OneshotSender;
use pgcoord::lease::{Attempt, Grant};
use pgcoord::{Error, LeaseTable, Pool, Result};
use tracing::debug;

use crate::lease::Lease;
use crate::messages::Acquire;
use crate::reply::caller_gone;
use crate::wake::Queues;

/// Everything the wait needs, cloned out of the manager so it runs without borrowing it.
pub(crate) struct AcquireJob {
    pub(crate) request: Acquire,
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) queues: Arc<Queues>,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    /// The longest a waiter sleeps without a wake-up.
    pub(crate) poll: Duration,
}

/// How a wait ended.
pub(crate) enum Outcome {
    /// Granted; `sent` is when the granting statement was sent, the start of the holder's
    /// monotonic deadline.
    Granted { grant: Grant, sent: Instant },
    /// Not granted, with the reason.
    Failed(Error),
    /// The caller went away before a grant.
    Cancelled,
}

pub(crate) type Reply = OneshotSender<Result<Lease>>;

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

impl AcquireJob {
    /// Waits for the lease. A statement in flight is never abandoned: cancellation and deadline
    /// are only acted on between attempts, so no grant happens that nobody sees.
    pub(crate) async fn run(self, reply: &mut Option<Reply>) -> Outcome {
        let name = self.request.name.clone();
        let queue = self.queues.join(&name);
        let deadline = self.request.timeout.map(|t| Instant::now() + t);
        let outcome = {
            let turn = tokio::select! {
                turn = queue.turn.lock() => Ok(turn),
                _ = caller_gone(reply) => Err(Outcome::Cancelled),
                _ = until(deadline) => Err(Outcome::Failed(Error::not_acquired(&name, None))),
            };
            match turn {
                Ok(_turn) => self.attempts(&queue.wake, deadline, reply).await,
                Err(outcome) => outcome,
            }
        };
        self.queues.leave(&name, queue);
        outcome
    }

    async fn attempts(
        &self,
        wake: &tokio::sync::Notify,
        deadline: Option<Instant>,
        reply: &mut Option<Reply>,
    ) -> Outcome {
        let Acquire {
            name,
            data,
            replace_data,
            fail_if_locked,
            ..
        } = &self.request;
        let mut reserved = false;
        let outcome = loop {
            // Waiting for a connection is safe to abandon (nothing was sent yet), so the caller's
            // deadline and departure bound it, even when the database cannot be reached.
            let client = tokio::select! {
                client = self.pool.get() => match client {
                    Ok(client) => client,
                    Err(e) => break Outcome::Failed(e.into()),
                },
                _ = caller_gone(reply) => break Outcome::Cancelled,
                _ = until(deadline) => break Outcome::Failed(Error::not_acquired(name, None)),
            };
            let sent = Instant::now();
            let attempt = pgcoord::db::retry(|| async {
                let attempt = self
                    .table
                    .try_acquire(
                        &*client,
                        name,
                        &self.owner,
                        data.as_deref(),
                        *replace_data,
                        self.lease,
                    )
                    .await?;
                if let (Attempt::Held(_), true) = (&attempt, *fail_if_locked) {
                    return Ok(Attempt::Held(self.table.holder(&*client, name).await?));
                }
                Ok(attempt)
            })
            .await;
            let holder = match attempt {
                Err(e) => break Outcome::Failed(e),
                Ok(Attempt::Granted(grant)) => break Outcome::Granted { grant, sent },
                Ok(Attempt::Held(holder)) if *fail_if_locked => {
                    break Outcome::Failed(Error::not_acquired(name, holder));
                }
                Ok(Attempt::Held(_)) => {
                    // Reserve the next grant, so a releaser cannot take it straight back.
                    let enqueued = self
                        .table
                        .enqueue(&*client, name, &self.owner, self.lease * 2);
                    match enqueued.await {
                        Ok(holder) => {
                            reserved = true;
                            holder
                        }
                        Err(e) => break Outcome::Failed(e),
                    }
                }
            };
            // Back to the pool while we wait.
            drop(client);
            // Wake on a release, at the holder's expiry, or on the polling fallback.
            let nap = holder
                .as_ref()
                .map_or(self.poll, |h| h.remaining + Duration::from_millis(1))
                .min(self.poll);
            debug!(%name, ?nap, ?holder, "waiting for the lease");
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(nap) => {}
                _ = caller_gone(reply) => break Outcome::Cancelled,
                _ = until(deadline) => break Outcome::Failed(Error::not_acquired(name, holder)),
            }
        };
        if reserved && !matches!(outcome, Outcome::Granted { .. }) {
            // Give the reservation up so the next waiter need not wait for it to lapse.
            if let Ok(client) = self.pool.get().await {
                let _ = self.table.dequeue(&*client, name, &self.owner).await;
            }
        }
        outcome
    }
}
