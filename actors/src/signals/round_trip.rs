//! Request/reply in `ListenerActor`: an [`Ask`] goes out once the reply channel is listened
//! on, waits for the reply routed to it by id, and ends at the caller's deadline or when the
//! caller gives up (watched through actix's reply channel), whichever comes first.
//!
//! Each round trip runs on a task of its own, not on the listener's context: when the listening
//! connection fails and the supervisor restarts the actor, every future spawned on its context
//! is dropped, and with them the callers' reply channels. The task keeps going across the
//! restart — waiting for the reply channel to be listened on again if it must — and removes its
//! pending entry however it ends.

use std::time::Instant;

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::ident::Ident;
use pgcoord::signal::{Envelope, Kind, seal};
use pgcoord::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

use super::messages::Ask;
use super::{ListenerActor, Pending};

/// One request on its way: registered in the pending map, not yet sent.
pub struct RoundTrip {
    id: u64,
    pending: Pending,
    deadline: Option<Instant>,
    reply: oneshot::Receiver<Result<Vec<u8>>>,
    send: std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>>,
}

/// How a request goes out: NOTIFY on a channel (through the listener's batching notifier), or
/// a sender of the caller's.
enum Via {
    Channel(Ident),
    Through(SendThrough),
}

/// A sender of a sealed request's text: it NOTIFYs it where it must (a lease's holder, say).
/// Its error ends the round trip; whether anything was sent is the sender's to know.
pub(crate) type SendThrough = Box<dyn FnOnce(String) -> crate::seam::BoxFuture<Result<()>> + Send>;

/// An [`Ask`] sent by `send` instead of on a channel of the caller's naming; the reply comes
/// back to this listener as any reply does. Bounded by `timeout`.
#[derive(Message)]
#[rtype(result = "Result<Vec<u8>>")]
pub(crate) struct AskThrough {
    pub(crate) send: SendThrough,
    pub(crate) payload: Vec<u8>,
    pub(crate) timeout: std::time::Duration,
}

impl ListenerActor {
    fn start_round_trip(
        &mut self,
        via: Via,
        payload: Vec<u8>,
        timeout: Option<std::time::Duration>,
    ) -> Result<RoundTrip> {
        if self.config.poll_only() {
            return Err(super::poll_only_refusal("a request"));
        }
        let mut envelope = Envelope::new(Kind::Request, Vec::new());
        envelope.reply_to = Some(self.reply_channel.as_str().to_owned());
        let id = envelope.id;
        // Registered before anything is sent, so no reply can arrive unexpected.
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        let ready = self.replies_ready();
        let (notifier, store, limit) = (
            self.notifier(),
            self.store.clone(),
            self.config.inline_limit(),
        );
        let send = Box::pin(async move {
            ready.await;
            match via {
                Via::Channel(channel) => {
                    (notifier.send(store.as_deref(), channel, envelope, payload, limit)).await
                }
                Via::Through(send) => {
                    let text = seal(envelope, payload, store.as_deref(), limit).await?;
                    send(text).await
                }
            }
        });
        Ok(RoundTrip {
            id,
            pending: self.pending.clone(),
            deadline: timeout.map(|t| Instant::now() + t),
            reply: rx,
            send,
        })
    }
}

/// Removes a request's pending entry when its round trip ends, however it ends.
struct Forget(u64, Pending);

impl Drop for Forget {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.1.lock() {
            pending.remove(&self.0);
        }
    }
}

/// Runs `trip` on its own task and answers `reply` with the reply, `decode`d.
fn spawn<T: Send + 'static>(
    trip: Result<RoundTrip>,
    reply: Option<OneshotSender<Result<T>>>,
    decode: fn(Vec<u8>) -> Result<T>,
) {
    let RoundTrip {
        id,
        pending,
        deadline,
        reply: answer,
        send,
    } = match trip {
        Ok(trip) => trip,
        Err(error) => return crate::reply::refuse(reply, error),
    };
    let round_trip = async move {
        let _forget = Forget(id, pending);
        let mut reply = reply;
        let work = async {
            send.await?;
            let bytes = answer
                .await
                .map_err(|_| Error::new(ErrorKind::Unavailable, "listener stopped"))??;
            decode(bytes)
        };
        let deadline_passed = crate::reply::deadline_passes(deadline);
        let caller_gone = crate::reply::caller_gone(&mut reply);
        let outcome = tokio::select! {
            outcome = work => Some(outcome),
            _ = deadline_passed => Some(Err(Error::new(ErrorKind::Timeout, "no reply before the deadline"))),
            _ = caller_gone => None,
        };
        if let (Some(outcome), Some(reply)) = (outcome, reply) {
            let _ = reply.send(outcome);
        }
    };
    tokio::spawn(tracing::Instrument::instrument(
        round_trip,
        tracing::info_span!("request", id),
    ));
}

/// The reply to [`Ask`]: the reply's bytes.
pub struct RequestResponse(Result<RoundTrip>);

impl Handler<Ask> for ListenerActor {
    type Result = RequestResponse;

    fn handle(&mut self, request: Ask, _: &mut Context<Self>) -> RequestResponse {
        RequestResponse(Ident::channel(&request.channel).and_then(|channel| {
            self.start_round_trip(Via::Channel(channel), request.payload, request.timeout)
        }))
    }
}

impl Handler<AskThrough> for ListenerActor {
    type Result = RequestResponse;

    fn handle(&mut self, request: AskThrough, _: &mut Context<Self>) -> RequestResponse {
        RequestResponse(self.start_round_trip(
            Via::Through(request.send),
            request.payload,
            Some(request.timeout),
        ))
    }
}

impl<M: Message<Result = Result<Vec<u8>>>> MessageResponse<ListenerActor, M> for RequestResponse {
    fn handle(self, _: &mut Context<ListenerActor>, reply: Option<OneshotSender<Result<Vec<u8>>>>) {
        spawn(self.0, reply, Ok);
    }
}
