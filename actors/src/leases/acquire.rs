//! [`Acquire`]: a request becomes a wait (`wait::Wait`) whose attempts are the lease's own
//! statements, run on the manager's context, watching its caller; the manager records the grant
//! and hands it over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::__private::Until;
use pgcoord::db::Bounded;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{Error, ErrorKind, Result};
use tracing::info_span;

use super::LockManager;
use super::context::WaitContext;
use super::counters::Counters;
use super::lease::Lease;
use super::messages::Acquire;
use super::one_wait::{Answer, Ask};
use super::settle::spawn_wait;
use super::wait::{Attempts, Wait, Won};

/// The error for a lease this manager holds already: leases never stack.
pub(crate) fn already_held(name: &str) -> Error {
    let permit = match super::queues::semaphore_of(name) {
        Some(semaphore) => format!(" (or a permit of semaphore {semaphore:?}, whose slot it is)"),
        None => String::new(),
    };
    Error::new(
        ErrorKind::AlreadyHeld,
        format!("lease {name:?} is already held by this manager{permit}"),
    )
}

/// The attempts of one `Acquire`.
pub(crate) struct LeaseAttempts {
    context: Arc<WaitContext>,
    request: Acquire,
    /// The request's lease, checked.
    lease: Duration,
}

impl LeaseAttempts {
    fn request(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            name: &self.request.name,
            data: self.request.data.as_deref(),
            replace_data: self.request.replace_data,
            priority: self.request.priority,
        }
    }
}

impl Attempts for LeaseAttempts {
    fn refuse(&self) -> Option<Error> {
        // A local caller ahead in the queue got it meanwhile.
        let name = &self.request.name;
        self.context.held.contains(name).then(|| already_held(name))
    }

    async fn batched(&self, ask: Ask) -> Option<Answer<Won>> {
        // A batch grants every name for the manager's lease.
        if ask != Ask::First || self.lease != self.context.lease {
            return None;
        }
        let batcher = &self.context.batcher;
        let (sent, attempt) = batcher.first_attempt(&self.request).await?;
        Some(match attempt {
            Ok(Attempt::Granted(grant)) => Answer::Granted(Won {
                grant,
                sent,
                slot: None,
            }),
            // Refused in a batch (held, or another waiter first, or its row busy): asked again
            // alone and in line, which tells which.
            Ok(_) => Answer::Held(None),
            Err(e) if e.is_unavailable() => Answer::Unknown(e),
            Err(e) => Answer::Failed(e),
        })
    }

    async fn attempt(&self, ask: Ask, statements: &Until<'_>) -> Answer<Won> {
        let context = &self.context;
        let (owner, request, lease) = (context.statements(), self.request(), self.lease);
        let sent = Instant::now();
        let attempt = pgcoord::__private::retry(|| {
            Counters::add(&context.counters.acquire_statements);
            async {
                match ask {
                    Ask::Once | Ask::First => owner.try_acquire(statements, &request, lease).await,
                    // A live waiter refreshes its place at least every poll (a quarter of the
                    // manager's lease); one that died lapses after that lease, whatever the
                    // lease it asked for (a long one must not hold the line as long).
                    Ask::InLine => {
                        let place = context.lease;
                        (owner.try_acquire_or_queue(statements, &request, lease, place)).await
                    }
                }
            }
        })
        .await;
        match attempt {
            Ok(Attempt::Granted(grant)) => Answer::Granted(Won {
                grant,
                sent,
                slot: None,
            }),
            // Refused once: name the holder.
            Ok(Attempt::Held(_) | Attempt::Busy) if ask == Ask::Once => {
                let holder = context.table.holder(statements, request.name).await;
                Answer::Held(holder.ok().flatten())
            }
            Ok(Attempt::Held(holder)) => Answer::Held(holder),
            Ok(Attempt::Busy) => Answer::Busy,
            Err(e) if e.is_unavailable() => Answer::Unknown(e),
            Err(e) => Answer::Failed(e),
        }
    }

    async fn release_orphans(&self, statements: &Bounded<'_>) -> Result<bool> {
        let owner = self.context.statements();
        let names = [self.request.name.as_str()];
        let keep = self.request.on_release.keep;
        owner.release_orphans(statements, &names, keep).await
    }

    async fn leave_line(&self, statements: &Bounded<'_>) -> Result<()> {
        (self.context.statements())
            .leave_line(statements, &self.request.name)
            .await
    }

    fn name(&self) -> &str {
        &self.request.name
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}

/// The reply to [`Acquire`]: runs the wait inside the manager, watching the reply channel so a
/// caller that gives up cancels it.
pub struct AcquireResponse(Result<Wait<LeaseAttempts>>);

impl MessageResponse<LockManager, Acquire> for AcquireResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        match self.0 {
            Ok(wait) => {
                let on_release = wait.attempts.request.on_release;
                let span = info_span!("acquire", lease.name = %wait.attempts.request.name);
                spawn_wait(ctx.address(), span, on_release, wait, reply);
            }
            Err(error) => crate::reply::refuse(reply, error),
        }
    }
}

impl Handler<Acquire> for LockManager {
    type Result = AcquireResponse;

    fn handle(&mut self, request: Acquire, _: &mut Context<Self>) -> AcquireResponse {
        if let Err(e) = pgcoord::lease::check_name(&request.name) {
            return AcquireResponse(Err(e));
        }
        if self.holdings.contains(&request.name) {
            return AcquireResponse(Err(already_held(&request.name)));
        }
        let context = self.context();
        if context.under_way.closing() {
            return AcquireResponse(Err(super::under_way::closing_error()));
        }
        let lease = match super::held::checked_lease(request.lease, context.lease) {
            Ok(lease) => lease,
            Err(e) => return AcquireResponse(Err(e)),
        };
        let (timeout, once) = (request.timeout, request.fail_if_locked);
        let key = request.name.clone();
        let attempts = LeaseAttempts {
            context: context.clone(),
            request,
            lease,
        };
        AcquireResponse(Ok(Wait::new(&context, attempts, &key, timeout, once)))
    }
}
