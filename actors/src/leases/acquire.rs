//! The wait of one `Acquire`: attempts, its place in line, wake-ups, deadline and cancellation.
//!
//! Every attempt is bounded: waiting for a pooled connection and the statement itself end at the
//! caller's deadline, or after the statement timeout when the caller has none. An attempt never
//! waits on another transaction's row lock (the acquire statement uses `NOWAIT`, see
//! `pgcoord::lease`), and the connection goes back to the pool between attempts, so waiters
//! cannot exhaust the pool that releases and inspection need.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::dev::OneshotSender;
use pgcoord::db::until;
use pgcoord::lease::{Attempt, Grant};
use pgcoord::{Error, ErrorKind, LeaseTable, Pool, Result};

use tracing::debug;

use super::lease::Lease;
use super::messages::Acquire;
use super::wake::{Handed, NameQueue, Queues};
use crate::reply::caller_gone;

/// Everything the wait needs, cloned out of the manager so it runs without borrowing it.
pub(crate) struct AcquireJob {
    pub(crate) request: Acquire,
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) queues: Arc<Queues>,
    /// The names the manager holds now, shared with it.
    pub(crate) holding: Arc<Mutex<HashSet<Arc<str>>>>,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    /// The longest a waiter sleeps without a wake-up.
    pub(crate) poll: Duration,
    /// Where the first attempt goes, to share a statement with concurrent ones.
    pub(crate) batcher: Option<super::batch::acquire::AcquireBatcher>,
    /// The manager's count of acquire statements sent.
    pub(crate) statements_sent: Arc<std::sync::atomic::AtomicU64>,
    /// The manager's count of handed leases taken, by how.
    pub(crate) handovers: Arc<super::unclaimed::HandoverCounts>,
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

/// A refused attempt of a wait, which wrote the waiter's place in line: its nonce, and when it
/// was sent. A release that hands the lease to that place announces the nonce, and granted it
/// after `sent` (the place had that nonce only once the attempt committed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) nonce: i64,
    pub(crate) sent: Instant,
    /// The name's orphan checks begun before it was sent (`NameQueue::orphan_checks`): one
    /// begun since may have released what was handed to us.
    pub(crate) orphan_checks: u64,
}

pub(crate) async fn until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// The error for a lease this manager holds already: leases never stack.
pub(crate) fn already_held(name: &str) -> Error {
    Error::new(
        ErrorKind::AlreadyHeld,
        format!("lease {name:?} is already held by this manager"),
    )
}

impl AcquireJob {
    /// Waits for the lease. A statement in flight is never abandoned (each is bounded):
    /// cancellation and deadline are acted on between statements, so no grant happens that
    /// nobody sees.
    pub(crate) async fn run(self, reply: &mut Option<Reply>) -> Outcome {
        let name = self.request.name.clone();
        let queue = self.queues.join(&name);
        let deadline = self.request.timeout.map(|t| Instant::now() + t);
        let outcome = if self.request.fail_if_locked {
            // One try, now: when local callers already wait for the name, it is not free, and
            // taking it ahead of them would not be fair either.
            match queue.turn.try_lock() {
                Ok(_turn) if self.holds(&name) => Outcome::Failed(already_held(&name)),
                Ok(_turn) => self.attempts(&queue, deadline, reply).await,
                Err(_) => Outcome::Failed(Error::not_acquired(&name, self.holder(&name).await)),
            }
        } else {
            let turn = tokio::select! {
                turn = queue.turn.lock() => Ok(turn),
                _ = caller_gone(reply) => Err(Outcome::Cancelled),
                _ = until_deadline(deadline) => Err(Outcome::Failed(Error::not_acquired(&name, None))),
            };
            match turn {
                // A local caller ahead in the queue got it meanwhile.
                Ok(_turn) if self.holds(&name) => Outcome::Failed(already_held(&name)),
                Ok(_turn) => self.attempts(&queue, deadline, reply).await,
                Err(outcome) => outcome,
            }
        };
        if let Some(Handed { token, .. }) = self.queues.leave(&name, queue) {
            let ours = matches!(&outcome, Outcome::Granted { grant, .. } if grant.token == token);
            if !ours {
                self.give_back(&name, token).await;
            }
        }
        outcome
    }

    async fn attempts(
        &self,
        queue: &NameQueue,
        deadline: Option<Instant>,
        reply: &mut Option<Reply>,
    ) -> Outcome {
        let wake = &queue.wake;
        let Acquire {
            name,
            data,
            replace_data,
            fail_if_locked,
            ..
        } = &self.request;
        let mut in_line = false;
        let mut busy = 0u32;
        // Whether an attempt of this wait found the lease held by another (or its row busy): a
        // lease of ours found afterwards was handed to us while we waited. One ours from the
        // start is not taken (a process before this one with the same owner identity, say): it
        // is waited out, as any holder's.
        let mut refused_by_another = false;
        // The nonce of our last attempt that wrote our place in line, and when it was sent: a
        // handover announced with that nonce was made for this wait after that moment.
        let mut placed: Option<Placed> = None;
        // A token handed to an earlier waiter of ours that left is not trusted: the attempt
        // below finds the lease ours if it still is, and takes it as the server has it.
        let _ = queue.take_handed();
        // `fail_if_locked` asks alone: it needs the holder when not granted.
        let mut batched = self.batcher.as_ref().filter(|_| !*fail_if_locked);
        let outcome = loop {
            if let Some(handed) = queue.take_handed() {
                // Handed to us by a release (see `hand_over` in `pgcoord::lease`); taken when
                // the announcement proves it ours, or the row does. Otherwise the attempt below
                // asks.
                if let Some(outcome) = self.take_handed(queue, handed, placed).await {
                    break outcome;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Outcome::Failed(Error::not_acquired(name, None));
            }
            let bound = bound_from_now(deadline, self.pool.statement_timeout());
            // The first attempt goes through the batching task (see `batch`); a batch of one
            // comes back unanswered and is sent below as the single statement. The guard marks
            // this one as under way until its statement returns, so a burst is seen as one.
            let mut under_way = None;
            let mut batch = None;
            if let Some(batcher) = batched.take() {
                let (guard, alone) = batcher.enter();
                under_way = Some(guard);
                batch = (!alone).then_some(batcher);
            }
            if let Some(batcher) = batch {
                // Abandoning the batch's answer is safe: a grant nobody takes is released.
                let first = tokio::select! {
                    first = batcher.first_attempt(name, data.clone(), *replace_data, bound) => first,
                    _ = caller_gone(reply) => break Outcome::Cancelled,
                };
                match first {
                    Some((Ok(Attempt::Granted(grant)), sent)) => {
                        break Outcome::Granted { grant, sent };
                    }
                    Some((Err(e), _)) if e.is_unavailable() => {
                        // Unknown outcome, as after a single attempt (below).
                        let cleaned = self.release_orphan(name, deadline).await;
                        if cleaned && deadline.is_some_and(|d| Instant::now() < d) {
                            continue;
                        }
                        break Outcome::Failed(e);
                    }
                    Some((Err(e), _)) => break Outcome::Failed(e),
                    // Not granted in the batch (or not batched): ask alone, at once.
                    Some((Ok(_), _)) | None => continue,
                }
            }
            // Waiting for a connection is safe to abandon (nothing was sent yet), so the caller's
            // departure ends it too. A busy pool is waited for until the caller's deadline (a
            // caller that waits 10 s for a lease also waits for a connection), without one for
            // the statement timeout; a failed connect ends the wait at once. Either way it is
            // `Unavailable` with the cause: an unreachable database is never reported as
            // contention.
            let conn = tokio::select! {
                conn = self.pool.checkout(deadline.unwrap_or(bound)) => match conn {
                    Ok(conn) => conn,
                    Err(e) => break Outcome::Failed(e),
                },
                _ = caller_gone(reply) => break Outcome::Cancelled,
            };
            // The statement's own bound starts once it has a connection.
            let bound = bound_from_now(deadline, self.pool.statement_timeout());
            let statements = until(&*conn, bound);
            let sent = Instant::now();
            // New for every attempt, so a handover names the attempt that wrote the place.
            let nonce: i64 = rand::random();
            // Counted before it is sent: an orphan check begun afterwards may release what a
            // handover to this attempt's place grants.
            let orphan_checks = queue.orphan_checks();
            // A waiting attempt may put us in line even when its answer is lost: from here on,
            // leaving without the lease must take us out (dequeuing is safe to repeat).
            in_line |= !*fail_if_locked;
            let attempt = pgcoord::db::retry(|| async {
                self.statements_sent
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // A waiter's lost attempt also puts it in line, in the same statement.
                let (table, owner, data) = (&self.table, &self.owner, data.as_deref());
                let (replace, lease) = (*replace_data, self.lease);
                let attempt = if *fail_if_locked {
                    table
                        .try_acquire(&statements, name, owner, data, replace, lease)
                        .await?
                } else {
                    let wait_for = lease * 2;
                    let queued = table.try_acquire_or_queue(
                        &statements,
                        name,
                        owner,
                        data,
                        replace,
                        lease,
                        wait_for,
                        nonce,
                    );
                    queued.await?
                };
                match (&attempt, *fail_if_locked) {
                    (Attempt::Held(_) | Attempt::Busy, true) => {
                        Ok(Attempt::Held(self.table.holder(&statements, name).await?))
                    }
                    _ => Ok(attempt),
                }
            })
            .await;
            drop(under_way);
            // Refused, waiting: the statement wrote our place, with this attempt's nonce.
            let wrote_place = !*fail_if_locked && matches!(attempt, Ok(Attempt::Held(_)));
            let holder = match attempt {
                Err(e) if e.is_unavailable() => {
                    // The acquire may have run and granted a lease nobody received: free it. Once
                    // that is done the attempt left nothing behind, so a caller with time left
                    // tries again (on another connection: this one was discarded).
                    drop(conn);
                    // The check releases any lease of the name this owner holds: one handed
                    // to our place meanwhile too, whose announcement is then no longer taken
                    // on our last attempt's nonce (see `take_handed`).
                    let cleaned = self.release_orphan(name, deadline).await;
                    if cleaned && deadline.is_some_and(|d| Instant::now() < d) {
                        debug!(%name, error = %e, "acquire attempt failed on its connection; trying again");
                        continue;
                    }
                    break Outcome::Failed(e);
                }
                Err(e) => break Outcome::Failed(e),
                Ok(Attempt::Granted(grant)) => break Outcome::Granted { grant, sent },
                Ok(Attempt::Held(holder)) if *fail_if_locked => {
                    break Outcome::Failed(Error::not_acquired(name, holder));
                }
                Ok(Attempt::Busy) => {
                    busy += 1;
                    refused_by_another = true;
                    None
                }
                Ok(Attempt::Held(Some(holder)))
                    if holder.owner != self.owner || !refused_by_another =>
                {
                    // In line now (the attempt put us there), so a releaser cannot take the
                    // lease straight back.
                    busy = 0;
                    refused_by_another |= holder.owner != self.owner;
                    Some(holder)
                }
                Ok(Attempt::Held(Some(holder))) => {
                    // Ours, not held here, and another's earlier in this wait: handed to us by a
                    // release whose announcement we missed. Taken as the server has it; too
                    // close to its expiry, it is waited out instead.
                    if let Some(outcome) = self.adopt(name, holder.token).await {
                        break outcome;
                    }
                    busy = 0;
                    Some(holder)
                }
                Ok(Attempt::Held(None)) => {
                    // Free, and another waiter is first in line.
                    busy = 0;
                    refused_by_another = true;
                    None
                }
            };
            if wrote_place {
                placed = Some(Placed {
                    nonce,
                    sent,
                    orphan_checks,
                });
            }
            // Back to the pool while we wait.
            drop(conn);
            // Wake on a release, at the holder's expiry, or on the polling fallback; a row
            // locked by another transaction is asked again after a short, growing pause.
            let nap = if busy > 0 && in_line && busy <= 4 {
                // The next grant is ours and another attempt holds the row for a moment (every
                // waiter tries when a release is announced): ask again at once.
                Duration::from_micros(250 * u64::from(busy))
            } else if busy > 0 {
                // Usually another attempt or a renewal holds the row for a moment: ask again
                // within a few milliseconds, then less and less often (a fencing guard can last).
                pgcoord::db::backoff(busy - 1).min(self.poll)
            } else {
                holder
                    .as_ref()
                    .map_or(self.poll, |h| h.remaining + Duration::from_millis(1))
                    .min(self.poll)
            };
            debug!(%name, ?nap, ?holder, busy, "waiting for the lease");
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(nap) => {}
                _ = caller_gone(reply) => break Outcome::Cancelled,
                _ = until_deadline(deadline) => break Outcome::Failed(Error::not_acquired(name, holder)),
            }
        };
        if in_line && !matches!(outcome, Outcome::Granted { .. }) {
            // Leave the line so the next waiter need not wait for our place to lapse. Safe to
            // run twice: it removes only our own place.
            let statements = self.pool.idempotent(None);
            if let Err(e) = self.table.dequeue(&statements, name, &self.owner).await {
                debug!(%name, error = %e, "cannot leave the line; our place lapses on its own");
            }
        }
        outcome
    }

    /// Whether the manager holds `name` now (a local caller ahead in the queue got it).
    fn holds(&self, name: &str) -> bool {
        self.holding.lock().expect("holding").contains(name)
    }

    /// Who holds `name`, as far as a bounded read can tell; `None` when it cannot.
    async fn holder(&self, name: &str) -> Option<pgcoord::Holder> {
        let statements = self.pool.idempotent(None);
        self.table.holder(&statements, name).await.ok().flatten()
    }
}

/// The end of one attempt: the caller's deadline, or the statement timeout from now.
pub(crate) fn bound_from_now(deadline: Option<Instant>, statement_timeout: Duration) -> Instant {
    let bound = Instant::now() + statement_timeout;
    deadline.map_or(bound, |d| d.min(bound))
}
