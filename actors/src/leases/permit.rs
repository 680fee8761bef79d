//! [`AcquirePermit`]: one of `permits` permits of a counting semaphore, as a lease on one of its
//! slots (`pgcoord::lease::slot_names`), so every permit has its own fencing token, renewal and
//! loss detection, and is released like any lease.
//!
//! Local callers queue FIFO for the semaphore; the one whose turn it is asks for any free slot,
//! and waits when all are held — woken by the release of any slot (announced on the lease
//! channel), at the poll, at its deadline or when its caller gives up. It is the wait of an
//! `Acquire` (`wait`) with other statements. Across processes there is no line: whoever asks
//! first after a release gets the slot.

use std::sync::Arc;
use std::time::Instant;

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::db::{Bounded, Until};
use pgcoord::lease::{SlotAttempt, slot_names};
use pgcoord::{Error, Holder, Result};
use tracing::info_span;

use super::LockManager;
use super::acquire::spawn_wait;
use super::context::{Counters, WaitContext};
use super::lease::Lease;
use super::line::{Answer, Ask};
use super::messages::AcquirePermit;
use super::queues::Queues;
use super::wait::{Attempts, Wait, Won};

/// The local queue of semaphore `name`: a key no lease can have (lease names hold no NUL).
pub(crate) fn queue_key(semaphore: &str) -> String {
    format!("{semaphore}\0permits")
}

/// The semaphore whose slot `name` is, if it is one.
pub(crate) fn semaphore_of(name: &str) -> Option<&str> {
    let (semaphore, index) = name.rsplit_once('#')?;
    index.parse::<u32>().is_ok().then_some(semaphore)
}

/// Wakes whoever waits for `name`: its lease's waiters, and its semaphore's if it is a slot.
pub(crate) fn wake_released(queues: &Queues, name: &str) {
    queues.wake(name);
    if let Some(semaphore) = semaphore_of(name) {
        queues.wake(&queue_key(semaphore));
    }
}

/// The attempts of one `AcquirePermit`.
pub(crate) struct PermitAttempts {
    context: Arc<WaitContext>,
    /// The semaphore's name.
    name: String,
    slots: Vec<String>,
}

impl PermitAttempts {
    /// The slots this manager does not hold: the others are not free for it.
    fn free(&self) -> Vec<String> {
        let held = &self.context.held;
        (self.slots.iter())
            .filter(|s| !held.contains(s))
            .cloned()
            .collect()
    }
}

impl Attempts for PermitAttempts {
    fn refuse(&self) -> Option<Error> {
        None
    }

    async fn batched(&self, _: Ask, _: Option<Instant>) -> Option<Answer<Won>> {
        None
    }

    async fn attempt(&self, _: Ask, statements: &Until<'_>) -> Answer<Won> {
        let context = &self.context;
        let (owner, free) = (context.statements(), self.free());
        let sent = Instant::now();
        let attempt = pgcoord::db::retry(|| {
            Counters::add(&context.counters.acquire_statements);
            owner.try_acquire_any(statements, &free, context.lease)
        })
        .await;
        match attempt {
            Ok(SlotAttempt::Granted { slot, grant }) => Answer::Granted(Won {
                grant,
                sent,
                slot: Some(slot),
            }),
            Ok(SlotAttempt::Full) => Answer::Full,
            Ok(SlotAttempt::Busy) => Answer::Busy,
            Err(e) if e.is_unavailable() => Answer::Unknown(e),
            Err(e) => Answer::Failed(e),
        }
    }

    async fn release_orphans(&self, statements: &Bounded<'_>) -> Result<bool> {
        // This wait holds the semaphore's turn, so no slot this manager does not hold can be
        // granted to it legitimately meanwhile.
        let free = self.free();
        let free: Vec<&str> = free.iter().map(String::as_str).collect();
        (self.context.statements())
            .release_orphans(statements, &free, false)
            .await
    }

    async fn leave_line(&self, _: &Bounded<'_>) -> Result<()> {
        Ok(())
    }

    async fn holder(&self, _: Option<Instant>) -> Option<Holder> {
        None
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// The reply to [`AcquirePermit`]: runs the wait inside the manager, watching the reply channel
/// so a caller that gives up cancels it.
pub struct PermitResponse(Result<Wait<PermitAttempts>>);

impl MessageResponse<LockManager, AcquirePermit> for PermitResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        match self.0 {
            Ok(wait) => {
                let name = wait.attempts.name.clone();
                let span = info_span!("acquire_permit", semaphore = %name);
                spawn_wait(ctx, span, name, false, wait, reply);
            }
            Err(error) => crate::reply::refuse(reply, error),
        }
    }
}

impl Handler<AcquirePermit> for LockManager {
    type Result = PermitResponse;

    fn handle(&mut self, request: AcquirePermit, _: &mut Context<Self>) -> PermitResponse {
        let slots = match slot_names(&request.name, request.permits) {
            Ok(slots) => slots,
            Err(e) => return PermitResponse(Err(e)),
        };
        let context = self.context();
        let key = queue_key(&request.name);
        let attempts = PermitAttempts {
            context: context.clone(),
            name: request.name,
            slots,
        };
        PermitResponse(Ok(context.wait(attempts, &key, request.timeout, false)))
    }
}
