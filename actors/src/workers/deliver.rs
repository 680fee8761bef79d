//! A routed pool's member side: answering its channel and handing each routed message to its
//! key's worker — only while the key's lease is held here (otherwise "not here": nothing was
//! delivered, and the router looks again). See [`route`](super::route) for the sender's side.

use actix::prelude::*;

use super::route::{self, Reply, Routed};
use super::{StopWorker, WorkerPool};
use crate::signals::{ListenerActor, Serve};

/// How a routed pool answers its channel: the listener, and the request handler made where
/// the worker's `Handler<Routed>` is known.
pub(super) struct Routing<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    pub(super) listener: Addr<ListenerActor>,
    pub(super) channel: String,
    pub(super) serve: Option<MakeServe<W>>,
}

/// Makes the pool's [`Serve`] once its address exists.
pub(super) type MakeServe<W> = Box<dyn FnOnce(Addr<WorkerPool<W>>) -> Serve>;

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker> + Handler<Routed>,
{
    /// Delivers messages from [`KeyRouter`](super::KeyRouter)s to this pool's workers (which handle [`Routed`]),
    /// answering on this member's channel through `listener`. Every process's pool of the name
    /// should be routed, or messages to the keys of one that is not time out.
    pub fn routed(mut self, listener: Addr<ListenerActor>) -> WorkerPool<W> {
        let channel = route::channel(&self.lock_table, &self.name, &self.owner);
        let served = channel.clone();
        let serve = move |pool: Addr<WorkerPool<W>>| {
            Serve::new(served, move |request: Vec<u8>| {
                let pool = pool.clone();
                async move {
                    let (routed, within) = route::decode_request(request)?;
                    // A pool that stopped holds no key.
                    let delivered = pool.send(Deliver(routed, within));
                    let reply = delivered.await.unwrap_or(Reply::NotHere);
                    Ok(reply.encode())
                }
            })
        };
        self.routing = Some(Routing {
            listener,
            channel,
            serve: Some(Box::new(serve)),
        });
        self
    }
}

/// A routed message arrived for a key: to its worker, if this process holds the key.
#[derive(Message)]
#[rtype(result = "Reply")]
struct Deliver(Routed, std::time::Duration);

impl<W> Handler<Deliver> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker> + Handler<Routed>,
{
    type Result = ResponseFuture<Reply>;

    fn handle(&mut self, Deliver(routed, within): Deliver, _: &mut Context<Self>) -> Self::Result {
        let not_here = || -> Self::Result { Box::pin(async { Reply::NotHere }) };
        let Some(worker) = self.awake_worker(&routed.key) else {
            return not_here();
        };
        let handled = worker.send(routed);
        Box::pin(async move {
            // Bounded by the sender's own wait: past it nobody listens for the answer.
            match tokio::time::timeout(within, handled).await {
                Ok(Ok(Ok(answer))) => Reply::Handled(answer),
                Ok(Ok(Err(why))) => Reply::Failed(why),
                // It was in the worker's mailbox (it may still be handled, once): no one can say.
                Ok(Err(_)) | Err(_) => Reply::Unknown,
            }
        })
    }
}
