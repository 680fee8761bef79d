//! A routed pool's member side: answering its channel and handing each routed message to its
//! key's worker — only while the key's lease is held here (otherwise "not here": nothing was
//! delivered, and the router looks again). See [`route`](super::route) for the sender's side.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::watch;
use tracing::warn;

use super::route::Routed;
use super::wire::{self, Reply, Wait};
use super::{Shutdown, WorkerPool};
use crate::backend::Signalling;
use crate::signals::{ListenerActor, Serve};

/// How a routed pool answers its channel: the listener, and the request handler made where
/// the worker's `Handler<Routed>` is known.
pub(super) struct Routing<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    signals: Arc<dyn Signalling>,
    /// The listener, for the routers' doorbell; none on a backend without one (a pool there
    /// looks at its ticks).
    listener: Option<Addr<ListenerActor>>,
    channel: String,
    serve: Option<MakeServe<W>>,
    /// The messages delivered here lately, by id.
    delivered: Delivered,
}

/// Makes the pool's [`Serve`] once its address exists.
type MakeServe<W> = Box<dyn FnOnce(Addr<WorkerPool<W>>) -> Serve>;

impl<W> Routing<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// The listener, when the backend has one: the routers' doorbell rings through it.
    pub(super) fn listener(&self) -> Option<&Addr<ListenerActor>> {
        self.listener.as_ref()
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Routed>,
{
    /// Delivers messages from [`KeyRouter`](super::KeyRouter)s to this pool's workers (which handle [`Routed`]),
    /// answering on this member's channel through `listener`. Every process's pool of the name
    /// should be routed, or messages to the keys of one that is not time out.
    pub fn routed(self, listener: Addr<ListenerActor>) -> WorkerPool<W> {
        self.routed_through(Arc::new(listener.clone()), Some(listener))
    }

    /// Routed: answering on this member's channel through `signals`, hearing the routers'
    /// doorbell through `listener` when there is one.
    pub(crate) fn routed_through(
        mut self,
        signals: Arc<dyn Signalling>,
        listener: Option<Addr<ListenerActor>>,
    ) -> WorkerPool<W> {
        let channel = wire::channel(&self.lock_table, &self.name, &self.owner);
        let served = channel.clone();
        let serve = move |pool: Addr<WorkerPool<W>>| {
            Serve::new(served, move |request: Vec<u8>| {
                let pool = pool.clone();
                async move {
                    let wire::Request {
                        id,
                        key,
                        payload,
                        wait,
                        within,
                    } = wire::decode_request(request)?;
                    let routed = Routed { key, payload };
                    // A pool that stopped holds no key.
                    let delivered = pool.send(Deliver(routed, wait, within, id));
                    let reply = delivered.await.unwrap_or(Reply::NotHere);
                    Ok(reply.encode())
                }
            })
        };
        self.routing = Some(Routing {
            signals,
            listener,
            channel,
            serve: Some(Box::new(serve)),
            delivered: Delivered::default(),
        });
        self
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// Serves the member's channel, when the pool is routed: listened to from here on, also
    /// across the listener's reconnects.
    pub(super) fn start_routing(&mut self, ctx: &mut Context<Self>) {
        if let Some(routing) = self.routing.as_mut()
            && let Some(serve) = routing.serve.take()
        {
            let served = routing.signals.serve(serve(ctx.address()));
            ctx.spawn(served.into_actor(self).map(|served, act, _| {
                if served.is_err() {
                    warn!(pool.name = %act.name, "cannot serve routed messages; senders' calls time out");
                }
            }));
        }
    }

    /// The pool stopped: its channel is served until `released` (its keys' releases) are
    /// over and a tick more. A router that read this process as a key's holder is told "not
    /// here" (the pool is gone) and looks again, instead of waiting out its deadline for an
    /// answer nobody would send.
    pub(super) fn stop_routing(&mut self, released: Vec<tokio::task::JoinHandle<()>>) {
        if let Some(routing) = self.routing.take() {
            let tick = self.tick;
            actix::spawn(async move {
                futures_util::future::join_all(released).await;
                tokio::time::sleep(tick).await;
                let _ = routing.signals.stop_serving(&routing.channel).await;
            });
        }
    }
}

/// The most messages a member remembers having delivered. Past it (a flood of routed messages
/// with long deadlines) a message sent again after a forged "not here" may be delivered again:
/// warned about.
const REMEMBERED_AT_MOST: usize = 100_000;

/// How often what is remembered is swept of the messages whose senders stopped waiting.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What became of a delivered message: `None` while its worker has it.
type Outcome = watch::Receiver<Option<Reply>>;

/// The routed messages this member delivered, by id, each kept while its sender waits: a
/// router sends a message again after "not here", which anyone can forge, and the member that
/// has it answers with its outcome instead of delivering it twice.
#[derive(Default)]
pub(super) struct Delivered {
    by_id: HashMap<u64, (Instant, Outcome)>,
    swept: Option<Instant>,
    /// Messages not remembered for want of room, ever.
    forgotten: u64,
}

impl Delivered {
    /// What became of message `id`, when it was delivered here and its sender still waits.
    fn get(&mut self, id: u64) -> Option<Outcome> {
        let now = Instant::now();
        if self
            .swept
            .is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY)
        {
            self.by_id.retain(|_, (until, _)| *until > now);
            self.swept = Some(now);
        }
        let (until, outcome) = self.by_id.get(&id)?;
        (*until > now).then(|| outcome.clone())
    }

    /// Remembers message `id`, delivered now, for `within` (its sender's wait).
    fn remember(&mut self, id: u64, within: Duration) -> watch::Sender<Option<Reply>> {
        let (outcome, receiver) = watch::channel(None);
        if self.by_id.len() >= REMEMBERED_AT_MOST {
            self.forgotten += 1;
            if pgcoord::__private::warn_due(self.forgotten) {
                warn!(
                    forgotten = self.forgotten,
                    "too many routed messages in flight to remember each: one sent again may be delivered twice"
                );
            }
            return outcome;
        }
        self.by_id.insert(id, (Instant::now() + within, receiver));
        outcome
    }
}

/// What a member does with a routed message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict<F, W> {
    /// Delivered here already: answered with what became of it (`F`), not delivered again.
    Repeat(F),
    /// Handed to the key's worker, `W`.
    Deliver(W),
    /// Not delivered: the key's lease is not held here (any more, or yet), or its worker is
    /// not up; the router looks again.
    NotHere,
}

/// A member's decision on a routed message (the model `models::routing` runs it): what the
/// first delivery became when its id is remembered here (`first`), whoever holds the key now;
/// else the key's worker when `awake` finds it, which it does only while this member holds the
/// key's lease unlost; else "not here". `awake` is asked only for a message new here.
pub(crate) fn verdict<F, W>(first: Option<F>, awake: impl FnOnce() -> Option<W>) -> Verdict<F, W> {
    if let Some(first) = first {
        return Verdict::Repeat(first);
    }
    match awake() {
        Some(worker) => Verdict::Deliver(worker),
        None => Verdict::NotHere,
    }
}

/// At most this many told messages wait for a worker; a tell beyond is not delivered, and its
/// sender tries again until its deadline.
const TOLD_AT_MOST: usize = 16;

/// A routed message arrived for a key: to its worker, if this process holds the key, and
/// unless it was delivered here already (its id).
#[derive(Message)]
#[rtype(result = "Reply")]
struct Deliver(Routed, Wait, Duration, u64);

impl<W> Handler<Deliver> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Routed>,
{
    type Result = ResponseFuture<Reply>;

    fn handle(
        &mut self,
        Deliver(routed, wait, within, id): Deliver,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let answer = |reply: Reply| -> Self::Result { Box::pin(async move { reply }) };
        let Some(routing) = self.routing.as_mut() else {
            return answer(Reply::NotHere);
        };
        let crew = &mut self.crew;
        let worker = match verdict(routing.delivered.get(id), || crew.awake(&routed.key)) {
            // Sent again: its router heard "not here" from someone else. What the first
            // delivery became, not a second one.
            Verdict::Repeat(mut first) => {
                return Box::pin(async move {
                    match tokio::time::timeout(within, first.wait_for(Option::is_some)).await {
                        Ok(Ok(outcome)) => outcome.clone().unwrap_or(Reply::Unknown),
                        Ok(Err(_)) | Err(_) => Reply::Unknown,
                    }
                });
            }
            Verdict::NotHere => return answer(Reply::NotHere),
            Verdict::Deliver(worker) => worker,
        };
        if wait == Wait::Mailbox {
            // At most `TOLD_AT_MOST` waiting: past it, not delivered (the sender tries again).
            // An actix mailbox would not say no (each sender has a slot of its own).
            let Some(told) = self.crew.told(&routed.key) else {
                return answer(Reply::NotHere);
            };
            if told.fetch_add(1, Ordering::AcqRel) >= TOLD_AT_MOST {
                told.fetch_sub(1, Ordering::AcqRel);
                return answer(Reply::NotHere);
            }
            // In the mailbox now; its answer goes nowhere.
            let handled = worker.send(routed);
            let remembered = self.remember(id, within);
            let _ = remembered.send(Some(Reply::Accepted));
            let waiting = self.metrics.told.clone();
            waiting.increment(1.0);
            actix::spawn(async move {
                let _ = handled.await;
                told.fetch_sub(1, Ordering::AcqRel);
                waiting.decrement(1.0);
            });
            return answer(Reply::Accepted);
        }
        let handled = worker.send(routed);
        let remembered = self.remember(id, within);
        Box::pin(async move {
            // Bounded by the sender's own wait: past it nobody listens for the answer.
            let reply = match tokio::time::timeout(within, handled).await {
                Ok(Ok(Ok(answer))) => Reply::Handled(answer),
                Ok(Ok(Err(why))) => Reply::Failed(why),
                // It was in the worker's mailbox (it may still be handled, once): no one can say.
                Ok(Err(_)) | Err(_) => Reply::Unknown,
            };
            let _ = remembered.send(Some(reply.clone()));
            reply
        })
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// Remembers message `id` as delivered now (see [`Delivered`]).
    fn remember(&mut self, id: u64, within: Duration) -> watch::Sender<Option<Reply>> {
        match self.routing.as_mut() {
            Some(routing) => routing.delivered.remember(id, within),
            None => watch::channel(None).0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_message_is_answered_from_memory_and_a_new_one_delivered_only_to_a_worker() {
        let asked = std::cell::Cell::new(false);
        let awake = |worker: Option<u8>| {
            let asked = &asked;
            move || {
                asked.set(true);
                worker
            }
        };
        // Remembered: the first delivery's outcome, whoever holds the key; its worker not asked.
        assert_eq!(
            verdict(Some("first"), awake(Some(1))),
            Verdict::Repeat("first")
        );
        assert_eq!(
            verdict(Some("first"), awake(None)),
            Verdict::Repeat("first")
        );
        assert!(!asked.get(), "a remembered message wakes no worker");
        assert_eq!(verdict(None::<&str>, awake(Some(1))), Verdict::Deliver(1));
        assert!(asked.get());
        assert_eq!(verdict(None::<&str>, awake(None)), Verdict::NotHere);
    }
}
