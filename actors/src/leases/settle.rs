//! How a wait's outcome reaches the manager. The wait runs on a task of its own, so its
//! statements finish whatever the manager does. Its outcome is then sent to the manager, which
//! records a grant and answers the caller. A grant travels as an [`Unrecorded`], released when
//! dropped unrecorded: a grant whose manager stopped is never left held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::debug;

use super::LockManager;
use super::context::WaitContext;
use super::held::OnRelease;
use super::wait::{Attempts, Outcome, Reply, Wait};

/// A grant the manager has not recorded yet: released when dropped so.
pub(crate) struct Unrecorded {
    /// Shared with the book and the lease's handle once recorded: the name's one copy.
    name: Arc<str>,
    token: i64,
    on_release: OnRelease,
    context: Arc<WaitContext>,
    armed: bool,
}

impl Unrecorded {
    pub(crate) fn new(
        context: &Arc<WaitContext>,
        name: Arc<str>,
        token: i64,
        on_release: OnRelease,
    ) -> Self {
        Unrecorded {
            name,
            token,
            on_release,
            context: context.clone(),
            armed: true,
        }
    }

    /// The grant's name, recorded by the caller: no longer released on drop.
    pub(crate) fn record(mut self) -> Arc<str> {
        self.armed = false;
        self.name.clone()
    }
}

impl Drop for Unrecorded {
    fn drop(&mut self) {
        if self.armed {
            let releaser = &self.context.releaser;
            releaser.release_in_background(
                self.name.clone(),
                self.token,
                self.on_release,
                "a grant nobody recorded",
            );
        }
    }
}

/// A wait's end, for the manager to record and answer.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Settled {
    outcome: Outcome,
    grant: Option<Unrecorded>,
    /// What the grant is for.
    lease: Duration,
    reply: Option<Reply>,
    arrived: Instant,
}

impl Handler<Settled> for LockManager {
    type Result = ();

    fn handle(&mut self, settled: Settled, ctx: &mut Context<Self>) {
        let Settled {
            outcome,
            grant,
            lease,
            reply,
            arrived,
        } = settled;
        self.count_acquire(&outcome, arrived);
        match (outcome, grant) {
            // Shutting down: what was won is freed (dropped unrecorded), not held.
            (Outcome::Granted(_), Some(grant)) if self.context().under_way.closing() => {
                drop(grant);
                crate::reply::refuse(reply, super::under_way::closing_error());
            }
            (Outcome::Granted(won), Some(grant)) => {
                let on_release = grant.on_release;
                let timing = (won.sent, lease);
                let lease = self.lease_for(grant.record(), on_release, won.grant, timing, ctx);
                // A caller that went away gets nothing: the handle's drop releases the lease.
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(lease));
                }
            }
            (Outcome::Failed(error), _) => crate::reply::refuse(reply, error),
            (Outcome::Cancelled | Outcome::Granted(_), _) => {}
        }
    }
}

/// Runs `wait` for a lease (or permit) on a task of its own, watching its caller;
/// its outcome goes to `manager`, which counts it and records a grant (released at once when
/// its caller has gone, or when the manager has stopped). Only then is the name's turn given
/// back, with the wait's clean-up.
pub(crate) fn spawn_wait<A: Attempts>(
    manager: Addr<LockManager>,
    span: tracing::Span,
    on_release: OnRelease,
    mut wait: Wait<A>,
    mut reply: Option<Reply>,
) {
    let arrived = Instant::now();
    let context = wait.context();
    let lease = wait.attempts.lease();
    // Under way until the manager has recorded or freed what it won.
    let ticket = context.under_way.enter();

    // The task holds a wait the whole time: 10,000 of them at once in a claim. Its captures are
    // used in place (moved into locals, they would take room twice), and the name is the wait's.
    let task = async move {
        let _ticket = ticket;
        let outcome = wait.run(&mut reply).await;
        let granted = matches!(outcome, Outcome::Granted(_));
        let name = wait.attempts.name();
        let grant = match &outcome {
            Outcome::Granted(won) => {
                let name = won.slot.as_deref().unwrap_or(name);
                Some(Unrecorded::new(
                    &context,
                    name.into(),
                    won.grant.token,
                    on_release,
                ))
            }
            Outcome::Cancelled => {
                debug!(lease.name = %name, "wait cancelled by its caller");
                None
            }
            Outcome::Failed(_) => None,
        };
        let settled = Settled {
            outcome,
            grant,
            lease,
            reply,
            arrived,
        };
        // Recorded, or (the manager stopped) dropped with the message, which releases it.
        let _ = manager.send(settled).await;
        wait.finish(granted);
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
}
