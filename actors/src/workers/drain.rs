//! [`Drain`]: a member hands every key over, then stops.

use actix::prelude::*;
use tracing::info;

use super::{Drain, Shutdown, WorkerPool, plan};

/// A pool handing its keys over before it stops.
#[derive(Default)]
pub(super) struct Draining {
    /// Who asked, told once every key is released.
    waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Releases under way.
    releasing: Vec<tokio::task::JoinHandle<()>>,
    /// Every key is let go: waiting for the releases, then stopping.
    finishing: bool,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// A draining pool's tick: the keys `going` let go (up to `max_moves`, as `plan::drain`
    /// picks them; each worker stopped before its lease goes); once none is left, the releases
    /// are awaited, the callers told, the pool stopped.
    pub(super) fn drain_some(&mut self, going: Vec<String>, ctx: &mut Context<Self>) {
        let released: Vec<_> = going.iter().filter_map(|key| self.stop_key(key)).collect();
        let Some(drain) = self.drain.as_mut() else {
            return;
        };
        drain.releasing.extend(released);
        if !self.crew.is_empty() || drain.finishing {
            return;
        }
        drain.finishing = true;
        let releasing = futures_util::future::join_all(std::mem::take(&mut drain.releasing));
        ctx.spawn(releasing.into_actor(self).map(|_, act, ctx| {
            for waiter in act.drain.take().map(|d| d.waiters).unwrap_or_default() {
                let _ = waiter.send(());
            }
            ctx.stop();
        }));
    }

    /// Begins handing every key over, unless that is under way: asked by [`Drain`], or from
    /// outside through the database (a resign request on the member lease, found at a round).
    pub(super) fn begin_drain(&mut self, ctx: &mut Context<Self>) {
        if self.drain.is_some() {
            return;
        }
        self.drain = Some(Draining::default());
        info!(pool.name = %self.name, keys = self.crew.len(), "draining: handing every key over");
        // Out of the membership first: the other members' shares grow to cover these keys.
        self.membership.leave();
        // The first keys go now, the rest at the next ticks (at most `max_moves` each).
        let going = plan::drain(self.crew.keys().map(String::as_str), self.round.max_moves());
        self.drain_some(going, ctx);
    }
}

impl<W> Handler<Drain> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, ctx: &mut Context<Self>) -> Self::Result {
        let (told, drained) = tokio::sync::oneshot::channel();
        self.begin_drain(ctx);
        if let Some(drain) = self.drain.as_mut() {
            drain.waiters.push(told);
        }
        // Resolves also when the pool stopped another way (its keys are then released too).
        Box::pin(async move {
            let _ = drained.await;
        })
    }
}
