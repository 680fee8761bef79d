//! The one I/O loop of every wait, an `Acquire`'s and an `AcquirePermit`'s: its turn, attempts,
//! naps, deadline, cancellation, and the clean-up after its answer. What the answers mean is
//! `one_wait`'s; the statements are [`Attempts`]'.
//!
//! The caller's deadline is hard: every await ends by it. What is left then (freeing a grant
//! nobody received, leaving the line) goes on after the answer, still holding the name's turn.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::OneshotSender;
use pgcoord::__private::{Until, until};
use pgcoord::db::{Backoff, Bounded};
use pgcoord::lease::Grant;
use pgcoord::{Error, ErrorKind, Pool, Result};
use tokio::sync::OwnedMutexGuard;
use tracing::{debug, warn};

use super::context::WaitContext;
use super::lease::Lease;
use super::one_wait::{Answer, Ask, Next, OneWait};
use super::queues::NameQueue;
use crate::reply::{caller_gone, deadline_passes};
use crate::signals::doorbell::{Bell, Reader};

/// A granted attempt: the grant, when its statement was sent (the start of the holder's
/// deadline), and the slot's name for a permit.
#[derive(Debug)]
pub(crate) struct Won {
    pub(crate) grant: Grant,
    pub(crate) sent: Instant,
    pub(crate) slot: Option<String>,
}

/// How a wait ended.
pub(crate) enum Outcome {
    Granted(Won),
    Failed(Error),
    /// The caller went away before a grant.
    Cancelled,
}

pub(crate) type Reply = OneshotSender<Result<Lease>>;

/// The statements of one kind of wait.
pub(crate) trait Attempts: Send + Sync + 'static {
    /// Refuses the wait once it has its turn (a lease held meanwhile by a caller ahead).
    fn refuse(&self) -> Option<Error>;

    /// The attempt `ask` sent with others under way in one statement; `None`: send it alone.
    fn batched(&self, ask: Ask) -> impl Future<Output = Option<Answer<Won>>> + Send;

    /// The attempt `ask`, alone, on `statements`.
    fn attempt(&self, ask: Ask, statements: &Until<'_>)
    -> impl Future<Output = Answer<Won>> + Send;

    /// Frees whatever an attempt of unknown outcome may have granted: one try. True when
    /// nothing is left held.
    fn release_orphans(
        &self,
        statements: &Bounded<'_>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Takes the caller out of the line, after a wait in line that ended without a grant.
    fn leave_line(&self, statements: &Bounded<'_>) -> impl Future<Output = Result<()>> + Send;

    /// Whether an attempt could be granted anything, as far as this manager knows without a
    /// statement. When not, the attempt answers busy without a connection: asked again shortly.
    fn may_ask(&self) -> bool {
        true
    }

    /// What the wait is for, for errors and logs.
    fn name(&self) -> &str;

    /// How long its grant lasts unrenewed.
    fn lease(&self) -> Duration;
}

/// One wait: its statements, its place among local waiters, its line, and what is left to do
/// after its answer.
pub(crate) struct Wait<A> {
    pub(crate) attempts: A,
    context: Arc<WaitContext>,
    queue: Arc<NameQueue>,
    line: OneWait,
    /// The name's turn once had, kept until the clean-up is done.
    turn: Option<OwnedMutexGuard<()>>,
    /// Until when a grant nobody received may be held: the clean-up frees it.
    orphans_until: Option<Instant>,
}

impl<A: Attempts> Wait<A> {
    /// A wait for `key` with `attempts`, until `timeout` (forever without one); a single
    /// attempt with `once`. It joins `key`'s local queue now, in message order.
    pub(crate) fn new(
        context: &Arc<WaitContext>,
        attempts: A,
        key: &str,
        timeout: Option<Duration>,
        once: bool,
    ) -> Wait<A> {
        let deadline = timeout.map(|t| Instant::now() + t);
        Wait {
            attempts,
            context: context.clone(),
            queue: context.queues.join(key),
            line: OneWait::new(deadline, context.poll, once).in_line_first(context.contended(key)),
            turn: None,
            orphans_until: None,
        }
    }

    /// What every wait of the manager shares.
    pub(crate) fn context(&self) -> Arc<WaitContext> {
        self.context.clone()
    }

    /// Waits for the turn, then for the grant; the answer comes within the deadline.
    pub(crate) async fn run(&mut self, reply: &mut Option<Reply>) -> Outcome {
        match self.take_turn(reply).await {
            Ok(turn) => self.turn = Some(turn),
            Err(outcome) => return outcome,
        }
        match self.attempts.refuse() {
            Some(error) => Outcome::Failed(error),
            None => self.attempt_until_done(reply).await,
        }
    }

    /// The name's turn among local waiters, first come first served. Without waiting when the
    /// wait is one attempt: local callers waiting for the name means it is not free.
    async fn take_turn(&self, reply: &mut Option<Reply>) -> Result<OwnedMutexGuard<()>, Outcome> {
        let turn = self.queue.turn.clone();
        if self.line.once() {
            let Ok(turn) = turn.try_lock_owned() else {
                // Who holds it, as far as one read within the deadline tells.
                let (context, name) = (&self.context, self.attempts.name());
                let statements = context.pool.idempotent(self.line.deadline());
                let holder = context.table.holder(&statements, name).await.ok().flatten();
                return Err(Outcome::Failed(Error::not_acquired(name, holder)));
            };
            return Ok(turn);
        }
        tokio::select! {
            turn = turn.lock_owned() => Ok(turn),
            _ = caller_gone(reply) => Err(Outcome::Cancelled),
            _ = deadline_passes(self.line.deadline()) => {
                Err(Outcome::Failed(Error::not_acquired(self.attempts.name(), None)))
            }
        }
    }

    /// Attempts until granted, refused for good, past the deadline, or the caller left.
    async fn attempt_until_done(&mut self, reply: &mut Option<Reply>) -> Outcome {
        let (attempts, line, wake) = (&self.attempts, &mut self.line, &self.queue.wake);
        let pool = &self.context.pool;
        // When a grant is sure to have expired on the server, counted from its attempt's
        // sending: the lease, plus a margin for the clocks' rates.
        let expires_after = attempts.lease() + attempts.lease() / 10;
        let name = attempts.name();
        // Anyone can NOTIFY: after a doorbell's attempt was refused, the next doorbell is put
        // off to the gap's end, so a flood costs an attempt per gap, not one each.
        let mut reader = Reader::default();
        loop {
            if line.passed(Instant::now()) {
                return Outcome::Failed(Error::not_acquired(name, line.holder()));
            }
            if self.context.under_way.closing() {
                return Outcome::Failed(super::under_way::closing_error());
            }
            let ask = line.ask();
            reader.reading(wake);
            let sent = Instant::now();
            let answer = match attempt(attempts, pool, ask, line.deadline(), reply).await {
                Attempted::Answer(answer) => answer,
                Attempted::Left {
                    outcome,
                    maybe_sent,
                } => {
                    if maybe_sent {
                        self.orphans_until = Some(sent + expires_after);
                    }
                    return outcome;
                }
            };
            // Whatever it answered: only a grant ends the wait, and it returns below.
            reader.read(false);
            let next = match line.after(answer, Instant::now()) {
                Next::CheckOrphans(error) => {
                    let until =
                        (line.deadline()).unwrap_or_else(|| bound(None, pool.statement_timeout()));
                    // Boxed, as an attempt alone: rare, and large.
                    let cleaned = Box::pin(release_orphans(attempts, pool, until)).await;
                    if !cleaned {
                        self.orphans_until = Some(sent + expires_after);
                    }
                    line.after_check(cleaned, error, Instant::now())
                }
                next => next,
            };
            let nap = match next {
                Next::Granted(won) => {
                    // Whether the next wait for it here gets in line at once (see `OneWait`):
                    // kept under the key it is read by (a semaphore's is not a lease name).
                    self.context
                        .note_contention(self.queue.key(), line.refused());
                    return Outcome::Granted(won);
                }
                Next::NotAcquired(holder) => {
                    return Outcome::Failed(Error::not_acquired(name, holder));
                }
                Next::Fail(error) => return Outcome::Failed(error),
                Next::Again => continue,
                Next::Nap(nap) => nap,
                Next::CheckOrphans(_) => unreachable!("checked above"),
            };
            debug!(lease.name = %name, ?nap, holder = ?line.holder(), "waiting");
            // Boxed, as an attempt alone: only a wait that was refused naps.
            match Box::pin(sleep(wake, &mut reader, nap, reply, line.deadline())).await {
                Woken::Rung | Woken::Up => {}
                Woken::CallerGone => return Outcome::Cancelled,
                Woken::DeadlinePassed => {
                    return Outcome::Failed(Error::not_acquired(name, line.holder()));
                }
            }
        }
    }

    /// Does what is left after the answer `granted` or not, then gives the turn back: at once
    /// when nothing is, else on a task of its own, so the manager stopping does not abandon it.
    pub(crate) fn finish(self, granted: bool) {
        let leave_line = self.line.in_line() && !granted;
        if !leave_line && self.orphans_until.is_none() {
            self.context.queues.give_back(self.queue, self.turn);
            return;
        }
        tokio::spawn(async move {
            let (name, pool) = (self.attempts.name(), &self.context.pool);
            if let Some(until) = self.orphans_until
                && !release_orphans(&self.attempts, pool, until).await
            {
                warn!(lease.name = %name, "an attempt's answer was lost and its grant could not be checked; if it was granted, it has expired since");
            }
            // Safe to run twice: it removes only our own place.
            if leave_line && let Err(e) = self.attempts.leave_line(&pool.idempotent(None)).await {
                debug!(lease.name = %name, error = %e, "cannot leave the line; our place lapses on its own");
            }
            self.context.queues.give_back(self.queue, self.turn);
        });
    }
}

/// What one attempt came to.
enum Attempted {
    Answer(Answer<Won>),
    /// The wait was left before the answer: the caller went away, or the deadline passed.
    Left {
        outcome: Outcome,
        /// Whether a batch may have sent it: what it granted is then freed after the answer.
        maybe_sent: bool,
    },
}

/// One attempt, batched with others under way or alone.
async fn attempt<A: Attempts>(
    attempts: &A,
    pool: &Pool,
    ask: Ask,
    deadline: Option<Instant>,
    reply: &mut Option<Reply>,
) -> Attempted {
    if !attempts.may_ask() {
        return Attempted::Answer(Answer::Busy);
    }
    // A batch, bounded by the statement timeout, is left at the caller's deadline or departure
    // (the batcher also releases a grant whose wait has gone). Biased: an attempt that is not
    // batched answers None at once, so leaving here means a batch may have sent it.
    let batched = tokio::select! {
        biased;
        batched = attempts.batched(ask) => batched,
        _ = caller_gone(reply) => {
            let outcome = Outcome::Cancelled;
            return Attempted::Left { outcome, maybe_sent: true };
        }
        _ = deadline_passes(deadline) => {
            let error = Error::new(ErrorKind::Unavailable, "the database did not answer in time");
            let outcome = Outcome::Failed(error);
            return Attempted::Left { outcome, maybe_sent: true };
        }
    };
    if let Some(answer) = batched {
        return Attempted::Answer(answer);
    }
    // Boxed: a wait parked in a batch then carries no room for a statement of its own (a wait
    // took 2.5 KB, and a claim of 10,000 names has them all at once; docs/BENCHMARKS.md).
    Box::pin(alone(attempts, pool, ask, deadline, reply)).await
}

/// One attempt alone, on a connection of its own.
async fn alone<A: Attempts>(
    attempts: &A,
    pool: &Pool,
    ask: Ask,
    deadline: Option<Instant>,
    reply: &mut Option<Reply>,
) -> Attempted {
    // Nothing is sent while waiting for a connection: safe to abandon.
    let bound = bound(deadline, pool.statement_timeout());
    let conn = tokio::select! {
        conn = pool.checkout(deadline.unwrap_or(bound)) => conn,
        _ = caller_gone(reply) => {
            return Attempted::Left { outcome: Outcome::Cancelled, maybe_sent: false };
        }
    };
    Attempted::Answer(match conn {
        // A statement in flight is never abandoned: it ends by its bound.
        Ok(conn) => attempts.attempt(ask, &until(&*conn, bound)).await,
        Err(e) => Answer::Failed(e),
    })
}

/// How a nap ended.
enum Woken {
    /// A doorbell: ask again.
    Rung,
    /// The nap's end: ask again.
    Up,
    CallerGone,
    DeadlinePassed,
}

/// Naps for `nap` at most, woken early by `wake` (at the end of `reader`'s gap), the caller
/// leaving or the deadline.
async fn sleep(
    wake: &Bell,
    reader: &mut Reader,
    nap: Duration,
    reply: &mut Option<Reply>,
    deadline: Option<Instant>,
) -> Woken {
    tokio::select! {
        _ = reader.rung(wake) => Woken::Rung,
        _ = tokio::time::sleep(nap) => Woken::Up,
        _ = caller_gone(reply) => Woken::CallerGone,
        _ = deadline_passes(deadline) => Woken::DeadlinePassed,
    }
}

/// The end of one attempt: the caller's deadline, or the statement timeout from now.
pub(crate) fn bound(deadline: Option<Instant>, statement_timeout: Duration) -> Instant {
    let bound = Instant::now() + statement_timeout;
    deadline.map_or(bound, |d| d.min(bound))
}

/// Frees what an attempt of unknown outcome may have granted, asked again after a backoff
/// until `until`: a connection that stopped answering is found only when its statement's bound
/// passes, and a network that black-holed one pooled connection usually black-holed the idle
/// others too. True when it is known that nothing is left.
async fn release_orphans<A: Attempts>(attempts: &A, pool: &Pool, until: Instant) -> bool {
    for attempt in 0.. {
        match attempts
            .release_orphans(&pool.idempotent(Some(until)))
            .await
        {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                debug!(name = attempts.name(), error = %e, "checking an attempt of unknown outcome failed")
            }
        }
        let pause = Backoff::DEFAULT.delay(attempt);
        if Instant::now() + pause >= until {
            return false;
        }
        tokio::time::sleep(pause).await;
    }
    unreachable!("the loop returns")
}
