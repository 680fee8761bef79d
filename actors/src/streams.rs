//! The tokio door's streams: what the actors tell their recipients (losses, connection states,
//! leaders, members, a channel's messages), as a `Stream` for a task that is not an actor.
//!
//! A small forwarding actor on the coordinator's thread is the recipient; it hands each message
//! to an unbounded channel the stream reads. Unbounded as an actor's mailbox is: a loss or a gap
//! is never dropped because the reader is slow. Dropping the stream stops the forwarder at once,
//! so the broadcaster forgets it (every broadcaster keeps only connected recipients).

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use actix::prelude::*;
use futures_util::Stream;
use pgcoord::{Error, ErrorKind, Result};

use tokio::sync::mpsc;

use crate::signals::{ConnState, Signal};

/// Ends a subscription, on whichever backend holds it.
pub(crate) type Unsubscribe = Box<dyn FnOnce() + Send + Sync>;

/// Whether an item goes on to the stream.
pub(crate) type Keep<T> = Box<dyn Fn(&T) -> bool + Send>;

/// Hands what it is told to its stream, as `T`; stops when the stream is dropped.
pub(crate) struct Forward<T: Send + 'static> {
    sender: mpsc::UnboundedSender<T>,
    /// What to pass on; everything without one.
    filter: Option<Keep<T>>,
}

impl<T: Send + 'static> Forward<T> {
    /// Passes `item` on, unless the filter keeps it back.
    pub(crate) fn pass(&mut self, item: T, ctx: &mut Context<Self>) {
        if self.filter.as_ref().is_some_and(|keep| !keep(&item)) {
            return;
        }
        if self.sender.send(item).is_err() {
            ctx.stop();
        }
    }
}

impl<T: Send + 'static> Actor for Forward<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The stream dropped: stop now, not at the next message, so that broadcasters see a
        // disconnected recipient and forget it.
        let sender = self.sender.clone();
        ctx.spawn(
            async move { sender.closed().await }
                .into_actor(self)
                .map(|(), _, ctx| ctx.stop()),
        );
    }
}

impl<T> Handler<T> for Forward<T>
where
    T: Message<Result = ()> + Send + 'static,
{
    type Result = ();

    fn handle(&mut self, item: T, ctx: &mut Context<Self>) {
        self.pass(item, ctx);
    }
}

/// The stream of one forwarder.
pub(crate) struct Feed<T> {
    receiver: mpsc::UnboundedReceiver<T>,
}

impl<T> Stream for Feed<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<T>> {
        self.receiver.poll_recv(cx)
    }
}

/// A forwarder started on `arbiter` (the coordinator's thread), keeping back what `keep`
/// refuses, and the stream it feeds.
pub(crate) fn forward<T: Send + 'static>(
    arbiter: &ArbiterHandle,
    keep: Option<Keep<T>>,
) -> (Addr<Forward<T>>, Feed<T>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    // Its stream is unbounded, so its mailbox is too (capacity 0), from before its address is
    // handed out: a broadcaster's `try_send` never finds it full, as a burst dropped for it would
    // be a loss (`start_in_arbiter` would set the capacity only once the forwarder runs).
    let (mailbox, received) = actix::dev::channel::channel(0);
    arbiter.spawn_fn(move || {
        let forwarder = Forward {
            sender,
            filter: keep,
        };
        Context::with_receiver(received).run(forwarder);
    });
    let forwarder = Addr::new(mailbox);
    (forwarder, Feed { receiver })
}

/// What a [`Subscription`] yields: a message, or word that messages may have been missed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Heard {
    /// A message published on the channel.
    Signal(Signal),
    /// Messages of the channel may have been missed: the listener reconnected
    /// ([`ConnState::Reconnected`]: what was published while it was away was not delivered), or
    /// a message's stored payload could not be fetched ([`ConnState::MessageLost`] of this
    /// channel). Resync from the database whatever the messages drive, as after a start.
    Gap(ConnState),
}

/// Messages of one channel, with gaps marked ([`Heard::Gap`]): from
/// [`Coordinator::subscribe`](crate::Coordinator::subscribe) or [`Runtime::subscribe`](crate::Runtime::subscribe).
/// Unsubscribes when dropped.
pub struct Subscription {
    feed: Feed<Heard>,
    channel: String,
    /// Ends the subscription at once, whichever backend holds it.
    unsubscribe: Option<Unsubscribe>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The messages `feed` is told of, `channel`'s; `unsubscribe` ends it when dropped.
    pub(crate) fn new(
        feed: Feed<Heard>,
        channel: String,
        unsubscribe: Unsubscribe,
    ) -> Subscription {
        Subscription {
            feed,
            channel,
            unsubscribe: Some(unsubscribe),
        }
    }

    /// The next message or gap; `None` once the runtime stopped.
    pub async fn next(&mut self) -> Option<Heard> {
        self.feed.receiver.recv().await
    }
}

impl Stream for Subscription {
    type Item = Heard;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Heard>> {
        Pin::new(&mut self.feed).poll_next(cx)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(unsubscribe) = self.unsubscribe.take() {
            unsubscribe();
        }
    }
}

impl Handler<Signal> for Forward<Heard> {
    type Result = ();

    fn handle(&mut self, signal: Signal, ctx: &mut Context<Self>) {
        self.pass(Heard::Signal(signal), ctx);
    }
}

impl Handler<ConnState> for Forward<Heard> {
    type Result = ();

    fn handle(&mut self, state: ConnState, ctx: &mut Context<Self>) {
        self.pass(Heard::Gap(state), ctx);
    }
}

/// A registration's answer: the actor got it, or it stopped ([`ErrorKind::Unavailable`]).
pub(crate) async fn told<F>(sent: F) -> Result<()>
where
    F: std::future::Future<Output = std::result::Result<(), MailboxError>>,
{
    sent.await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("the actor stopped: {e}")))
}
