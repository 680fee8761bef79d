//! [`AcquirePermit`]: a permit of a counting semaphore, a lease on one of its slots
//! (`pgcoord::lease::slot_names`), with its own token, renewal and loss. Local callers queue
//! FIFO; the one whose turn it is asks for any free slot, in the wait an `Acquire` has, and is
//! woken by the release of any slot. Across processes, whoever asks first after a release.
//!
//! A limited semaphore's slots are those of its stored limit, which each attempt reads: the
//! slots asked among are named for the limit last seen (remembered per manager), and named again
//! when an attempt finds it raised. Its rows are kept free between tenures (see
//! `pgcoord::LeaseTable::set_limit`). [`SetLimit`] and [`GetLimit`] are answered here too.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::__private::Until;
use pgcoord::db::Bounded;
use pgcoord::lease::{LimitChange, LimitedAttempt, SlotAttempt, slot_names};
use pgcoord::{Error, Result};
use tokio::sync::OwnedMutexGuard;
use tracing::info_span;

use super::LockManager;
use super::context::WaitContext;
use super::counters::Counters;
use super::held::OnRelease;
use super::lease::Lease;
use super::messages::{AcquirePermit, GetLimit, SetLimit};
use super::one_wait::{Answer, Ask};
use super::queues::{NameQueue, queue_key};
use super::settle::spawn_wait;
use super::wait::{Attempts, Wait, Won};

/// How many limited semaphores' limits a manager remembers.
const LIMITS_REMEMBERED: usize = 4096;

/// The attempts of one `AcquirePermit`.
pub(crate) struct PermitAttempts {
    context: Arc<WaitContext>,
    /// The semaphore's name.
    name: String,
    /// The slots asked among.
    slots: Mutex<Vec<String>>,
    /// A limited semaphore's: the limit `slots` are named for.
    limited: Option<Mutex<u32>>,
    /// The request's lease, checked.
    lease: std::time::Duration,
    /// The slots the last attempt asked for, with their turns: kept until its answer is known
    /// and anything it may have granted is checked.
    asked: Mutex<Vec<(Arc<NameQueue>, OwnedMutexGuard<()>)>>,
}

impl PermitAttempts {
    /// Takes the turns of the slots an attempt may ask for (the slots this manager does not
    /// hold and whose turn is free: a slot-named lease a wait, release or claim here is busy
    /// with is left alone), giving back those of the last attempt; returns their names.
    fn take_free(&self) -> Vec<String> {
        let mut asked = self.asked.lock().expect("asked");
        self.give_back(&mut asked);
        let (held, queues) = (&self.context.held, &self.context.queues);
        let slots = self.slots.lock().expect("slots");
        let free = slots.iter().filter(|s| !held.contains(s));
        asked.extend(free.filter_map(|slot| queues.try_turn(slot)));
        asked
            .iter()
            .map(|(queue, _)| queue.key().to_owned())
            .collect()
    }

    /// One attempt at a limited semaphore: named again and asked again once when the limit was
    /// found raised.
    async fn attempt_limited(
        &self,
        known: &Mutex<u32>,
        statements: &Until<'_>,
    ) -> Result<SlotAttempt> {
        let (context, owner) = (&self.context, self.context.statements());
        for _ in 0..2 {
            let (free, limit) = (self.take_free(), *known.lock().expect("known"));
            let attempt = pgcoord::__private::retry(|| {
                Counters::add(&context.counters.acquire_statements);
                owner.try_acquire_limited(statements, &self.name, &free, limit, self.lease)
            })
            .await?;
            return Ok(match attempt {
                LimitedAttempt::Granted { slot, grant } => SlotAttempt::Granted { slot, grant },
                LimitedAttempt::Full => SlotAttempt::Full,
                LimitedAttempt::Resized(permits) => {
                    *self.slots.lock().expect("slots") = slot_names(&self.name, permits)?;
                    *known.lock().expect("known") = permits;
                    let mut limits = context.limits.lock().expect("limits");
                    // A cache, bounded: forgotten, a limit costs one attempt more.
                    if limits.len() >= LIMITS_REMEMBERED {
                        limits.clear();
                    }
                    limits.insert(self.name.clone(), permits);
                    continue;
                }
                _ => SlotAttempt::Busy,
            });
        }
        Ok(SlotAttempt::Busy)
    }

    fn give_back(&self, asked: &mut Vec<(Arc<NameQueue>, OwnedMutexGuard<()>)>) {
        for (queue, turn) in asked.drain(..) {
            self.context.queues.give_back(queue, Some(turn));
        }
    }
}

impl Drop for PermitAttempts {
    fn drop(&mut self) {
        let mut asked = std::mem::take(&mut *self.asked.lock().expect("asked"));
        self.give_back(&mut asked);
    }
}

impl Attempts for PermitAttempts {
    fn refuse(&self) -> Option<Error> {
        None
    }

    async fn batched(&self, _: Ask) -> Option<Answer<Won>> {
        None
    }

    fn may_ask(&self) -> bool {
        // Every slot held here: nothing to ask the database for (not even a connection, which
        // an outage would fail). A limited semaphore's statement also reads its limit, which
        // may have been raised.
        let held = &self.context.held;
        self.limited.is_some()
            || self
                .slots
                .lock()
                .expect("slots")
                .iter()
                .any(|s| !held.contains(s))
    }

    async fn attempt(&self, _: Ask, statements: &Until<'_>) -> Answer<Won> {
        let context = &self.context;
        let sent = Instant::now();
        let attempt = match &self.limited {
            Some(known) => self.attempt_limited(known, statements).await,
            None => {
                let (owner, free) = (context.statements(), self.take_free());
                if free.is_empty() {
                    // A wait or release here is busy with every slot not held here (a release
                    // whose announcement came before its answer; see also `may_ask`): no
                    // statement could be granted anything. Asked again shortly, as a busy row
                    // is, so that a doorbell's attempt refused here does not wait out the gap.
                    return Answer::Busy;
                }
                pgcoord::__private::retry(|| {
                    Counters::add(&context.counters.acquire_statements);
                    owner.try_acquire_any(statements, &free, self.lease)
                })
                .await
            }
        };
        let answer = match attempt {
            // The slots' turns stay until the grant is recorded (or the unknown attempt is
            // checked): they go with the wait.
            Ok(SlotAttempt::Granted { slot, grant }) => {
                let slot = Some(slot);
                return Answer::Granted(Won { grant, sent, slot });
            }
            Err(e) if e.is_unavailable() => return Answer::Unknown(e),
            Ok(SlotAttempt::Full) => Answer::Full,
            Ok(SlotAttempt::Busy) => Answer::Busy,
            Err(e) => Answer::Failed(e),
        };
        // Nothing granted: the slots' turns are not needed until the next attempt.
        let mut asked = self.asked.lock().expect("asked");
        self.give_back(&mut asked);
        answer
    }

    async fn release_orphans(&self, statements: &Bounded<'_>) -> Result<bool> {
        // The slots the unknown attempt asked for, whose turns it still holds: none of them can
        // be granted to this manager otherwise meanwhile.
        let asked: Vec<String> = (self.asked.lock().expect("asked").iter())
            .map(|(queue, _)| queue.key().to_owned())
            .collect();
        let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
        (self.context.statements())
            .release_orphans(statements, &asked, self.limited.is_some())
            .await
    }

    async fn leave_line(&self, _: &Bounded<'_>) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn lease(&self) -> std::time::Duration {
        self.lease
    }
}

/// The reply to [`AcquirePermit`]: runs the wait inside the manager, watching the reply channel
/// so a caller that gives up cancels it.
pub struct PermitResponse(Result<Wait<PermitAttempts>>);

impl MessageResponse<LockManager, AcquirePermit> for PermitResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        match self.0 {
            Ok(wait) => {
                let span = info_span!("acquire_permit", lease.name = %wait.attempts.name);
                // A permit's release is always announced: its waiters do not line up. A limited
                // semaphore's slot keeps its row: only a change of the limit makes or deletes one.
                let on_release = OnRelease {
                    keep: wait.attempts.limited.is_some(),
                    announce_always: true,
                };
                spawn_wait(ctx.address(), span, on_release, wait, reply);
            }
            Err(error) => crate::reply::refuse(reply, error),
        }
    }
}

impl Handler<AcquirePermit> for LockManager {
    type Result = PermitResponse;

    fn handle(&mut self, request: AcquirePermit, _: &mut Context<Self>) -> PermitResponse {
        let context = self.context();
        if context.under_way.closing() {
            return PermitResponse(Err(super::under_way::closing_error()));
        }
        let (slots, limited) = match request.permits {
            Some(permits) => (slot_names(&request.name, permits), None),
            None => {
                let known = (context.limits.lock().expect("limits"))
                    .get(&request.name)
                    .copied()
                    .unwrap_or(0);
                let slots = match known {
                    0 => pgcoord::lease::check_name(&request.name).map(|()| Vec::new()),
                    known => slot_names(&request.name, known),
                };
                (slots, Some(Mutex::new(known)))
            }
        };
        let lease = super::held::checked_lease(request.lease, context.lease);
        let (slots, lease) = match (slots, lease) {
            (Ok(slots), Ok(lease)) => (slots, lease),
            (Err(e), _) | (_, Err(e)) => return PermitResponse(Err(e)),
        };
        let key = queue_key(&request.name);
        let attempts = PermitAttempts {
            context: context.clone(),
            name: request.name,
            slots: Mutex::new(slots),
            limited,
            lease,
            asked: Mutex::default(),
        };
        PermitResponse(Ok(Wait::new(
            &context,
            attempts,
            &key,
            request.timeout,
            false,
        )))
    }
}

impl Handler<SetLimit> for LockManager {
    type Result = ResponseFuture<Result<LimitChange>>;

    fn handle(&mut self, request: SetLimit, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // Safe to run twice: a second run of the same change changes nothing more.
        Box::pin(async move {
            (table.set_limit(&pool.idempotent(None), &request.name, request.permits)).await
        })
    }
}

impl Handler<GetLimit> for LockManager {
    type Result = ResponseFuture<Result<Option<u32>>>;

    fn handle(&mut self, GetLimit(name): GetLimit, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        Box::pin(async move { table.limit(&pool.idempotent(None), &name).await })
    }
}
