//! The `Acquire` handler: a request becomes a wait (`AcquireJob`) run on the manager's
//! context, watching its caller, whose grant the manager records and hands over.

use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::Result;
use tracing::{debug, info_span};

use super::LockManager;
use super::acquire::{AcquireJob, Outcome, Reply, already_held};
use super::lease::Lease;
use super::messages::Acquire;

/// The reply to [`Acquire`]: runs the wait inside the manager, watching the reply channel so a
/// caller that gives up cancels it.
pub struct AcquireResponse(Result<AcquireJob>);

impl MessageResponse<LockManager, Acquire> for AcquireResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        let job = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        // Only what the grant needs: the request's data stays with the job.
        let (name, keep_on_release) = (job.request.name.clone(), job.request.keep_on_release);
        let span = info_span!("acquire", lease = %name);
        let wait = async move {
            let mut reply = reply;
            let outcome = job.run(&mut reply).await;
            ((outcome, name), reply)
        };
        spawn_wait(ctx, span, keep_on_release, wait);
    }
}

/// Runs a wait (an acquire's, a permit's) on the manager's context; `wait` owns the reply
/// channel, watching it so a caller that gives up cancels the wait, and ends with the outcome and
/// the name of the lease it is about. The outcome is counted, and a grant recorded and handed
/// over (or released at once when its caller has gone).
pub(crate) fn spawn_wait(
    ctx: &mut Context<LockManager>,
    span: tracing::Span,
    keep_on_release: bool,
    wait: impl Future<Output = ((Outcome, String), Option<Reply>)> + 'static,
) {
    let arrived = Instant::now();
    let wait = tracing::Instrument::instrument(wait, span);
    ctx.spawn(actix::fut::wrap_future::<_, LockManager>(wait).map(
        move |((outcome, name), reply), act, ctx| {
            act.count_acquire(&outcome, arrived);
            match outcome {
                Outcome::Granted { grant, sent } => {
                    act.granted(name, keep_on_release, grant, sent, reply, ctx)
                }
                Outcome::Failed(error) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(error));
                    }
                }
                Outcome::Cancelled => debug!(lease = %name, "wait cancelled by its caller"),
            }
        },
    ));
}

impl Handler<Acquire> for LockManager {
    type Result = AcquireResponse;

    fn handle(&mut self, request: Acquire, _: &mut Context<Self>) -> AcquireResponse {
        // Borrowed check (validate_name takes ownership to hand the string back).
        if let Err(e) = pgcoord::lease::check_name(&request.name) {
            return AcquireResponse(Err(e));
        }
        if self.held.contains_key(request.name.as_str()) {
            return AcquireResponse(Err(already_held(&request.name)));
        }
        AcquireResponse(Ok(self.job_for(request)))
    }
}

impl LockManager {
    /// What the wait of `request` needs, cloned out of the manager.
    pub(crate) fn job_for(&self, request: Acquire) -> AcquireJob {
        AcquireJob {
            request,
            pool: self.pool.clone(),
            table: self.table.clone(),
            queues: self.queues.clone(),
            holding: self.holding.clone(),
            owner: self.config.owner().to_owned(),
            lease: self.config.lease(),
            poll: (self.config.lease() / 4).max(Duration::from_millis(10)),
            batcher: self.batcher.clone(),
            statements_sent: self.acquire_statements.clone(),
            handovers: self.handovers.clone(),
        }
    }
}
