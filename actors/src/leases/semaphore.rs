//! [`AcquirePermit`]: one of `permits` permits of a counting semaphore, as a lease on one of its
//! slots (`pgcoord::lease::slot_names`), so every permit has its own fencing token, renewal and
//! loss detection, and is released like any lease.
//!
//! Local callers queue FIFO for the semaphore; the one whose turn it is asks for any free slot,
//! and waits when all are held — woken by the release of any slot (announced on the lease
//! channel), at the polling fallback, at its deadline or when its caller gives up. Across
//! processes there is no reservation: whoever asks first after a release gets the slot.

use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::db::until;
use pgcoord::lease::{SlotAttempt, slot_names};
use pgcoord::{Error, Result};
use tracing::{debug, info_span};

use super::acquire::{AcquireJob, Outcome, bound_from_now, until_deadline};
use super::lease::Lease;
use super::wait::spawn_wait;
use super::wake::NameQueue;
use super::{LockManager, Queues};
use crate::reply::caller_gone;

/// Acquire a permit of the semaphore `name` with `permits` permits (every process must use the
/// same count). The [`Lease`] answered is the slot's: its token, `lost()`, fencing guard and
/// release are a lease's. Waits until a permit is free unless given a
/// [`timeout`](AcquirePermit::timeout) (then [`pgcoord::ErrorKind::NotAcquired`]); dropping the
/// request cancels the wait, and a permit granted after the caller left is released at once.
#[derive(Debug, Clone)]
pub struct AcquirePermit {
    pub(crate) name: String,
    pub(crate) permits: u32,
    pub(crate) timeout: Option<Duration>,
}

impl AcquirePermit {
    /// A permit of `name`, one of `permits` (1 to `pgcoord::lease::MAX_PERMITS`).
    pub fn new(name: impl Into<String>, permits: u32) -> AcquirePermit {
        AcquirePermit {
            name: name.into(),
            permits,
            timeout: None,
        }
    }

    /// Give up after `timeout` with [`pgcoord::ErrorKind::NotAcquired`].
    pub fn timeout(mut self, timeout: Duration) -> AcquirePermit {
        self.timeout = Some(timeout);
        self
    }
}

impl Message for AcquirePermit {
    type Result = Result<Lease>;
}

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

/// The wait of one `AcquirePermit`.
pub(crate) struct PermitJob {
    /// The semaphore's name.
    name: String,
    slots: Vec<String>,
    /// Its local queue's key (see [`queue_key`]).
    key: String,
    timeout: Option<Duration>,
    job: AcquireJob,
}

impl PermitJob {
    async fn run(self, reply: &mut Option<OneshotSender<Result<Lease>>>) -> (Outcome, String) {
        let queue = self.job.queues.join(&self.key);
        let outcome = self.wait(&queue, reply).await;
        // A permit's queue key holds a NUL, which no lease name can: nothing is handed to it.
        let _ = self.job.queues.leave(&self.key, queue);
        outcome
    }

    async fn wait(
        &self,
        queue: &NameQueue,
        reply: &mut Option<OneshotSender<Result<Lease>>>,
    ) -> (Outcome, String) {
        let job = &self.job;
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let name = self.name.as_str();
        let not_acquired = || Error::not_acquired(name, None);
        let _turn = tokio::select! {
            turn = queue.turn.lock() => turn,
            _ = caller_gone(reply) => return (Outcome::Cancelled, String::new()),
            _ = until_deadline(deadline) => return (Outcome::Failed(not_acquired()), String::new()),
        };
        let mut busy = 0u32;
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break (Outcome::Failed(not_acquired()), String::new());
            }
            // Slots this manager holds are not free for it; the rest are asked in one statement.
            let free: Vec<String> = {
                let holding = job.holding.lock().expect("holding");
                self.slots
                    .iter()
                    .filter(|s| !holding.contains(s.as_str()))
                    .cloned()
                    .collect()
            };
            let bound = bound_from_now(deadline, job.pool.statement_timeout());
            let conn = tokio::select! {
                conn = job.pool.checkout(deadline.unwrap_or(bound)) => match conn {
                    Ok(conn) => conn,
                    Err(e) => break (Outcome::Failed(e), String::new()),
                },
                _ = caller_gone(reply) => break (Outcome::Cancelled, String::new()),
            };
            let statements = until(&*conn, bound);
            let sent = Instant::now();
            let attempt = pgcoord::db::retry(|| {
                job.table
                    .try_acquire_any(&statements, &free, &job.owner, job.lease)
            })
            .await;
            drop(conn);
            let nap = match attempt {
                Ok(SlotAttempt::Granted { slot, grant }) => {
                    break (Outcome::Granted { grant, sent }, slot);
                }
                Err(e) if e.is_unavailable() => {
                    // A slot may have been granted that nobody received: free any such. Once
                    // that is known the attempt left nothing behind, so a caller with time left
                    // asks again (on another connection: the cut-off one was discarded), as for
                    // a lease.
                    let mut cleaned = true;
                    for slot in &free {
                        cleaned &= job.release_orphan(slot, deadline).await;
                    }
                    if cleaned && deadline.is_some_and(|d| Instant::now() < d) {
                        debug!(semaphore = name, error = %e, "permit attempt failed on its connection; trying again");
                        continue;
                    }
                    break (Outcome::Failed(e), String::new());
                }
                Err(e) => break (Outcome::Failed(e), String::new()),
                Ok(SlotAttempt::Busy) => {
                    busy += 1;
                    pgcoord::db::backoff(busy - 1).min(job.poll)
                }
                Ok(SlotAttempt::Full) => {
                    busy = 0;
                    job.poll
                }
            };
            debug!(semaphore = name, ?nap, busy, "waiting for a permit");
            tokio::select! {
                _ = queue.wake.notified() => {}
                _ = tokio::time::sleep(nap) => {}
                _ = caller_gone(reply) => break (Outcome::Cancelled, String::new()),
                _ = until_deadline(deadline) => break (Outcome::Failed(not_acquired()), String::new()),
            }
        }
    }
}

/// The reply to [`AcquirePermit`]: runs the wait inside the manager, watching the reply channel
/// so a caller that gives up cancels it.
pub struct PermitResponse(Result<PermitJob>);

impl MessageResponse<LockManager, AcquirePermit> for PermitResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        let job = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        let span = info_span!("acquire_permit", semaphore = %job.name);
        let wait = async move {
            let mut reply = reply;
            let outcome = job.run(&mut reply).await;
            (outcome, reply)
        };
        spawn_wait(ctx, span, false, wait);
    }
}

impl Handler<AcquirePermit> for LockManager {
    type Result = PermitResponse;

    fn handle(&mut self, request: AcquirePermit, _: &mut Context<Self>) -> PermitResponse {
        let slots = match slot_names(&request.name, request.permits) {
            Ok(slots) => slots,
            Err(e) => return PermitResponse(Err(e)),
        };
        PermitResponse(Ok(PermitJob {
            slots,
            key: queue_key(&request.name),
            name: request.name.clone(),
            timeout: request.timeout,
            job: self.job_for(super::Acquire::new(request.name)),
        }))
    }
}
