//! What `ListenerActor` is asked to do with channels: `Publish`, `Subscribe`, `Unsubscribe`,
//! `SubscribeRaw`, `Serve` — each LISTEN confirmed before it answers.

use actix::prelude::*;
use pgcoord::ident::Ident;
use pgcoord::signal::{Envelope, Kind};
use pgcoord::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

use super::messages::*;
use super::{Channel, ListenerActor};

impl Handler<Publish> for ListenerActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(
        &mut self,
        Publish { channel, payload }: Publish,
        _: &mut Context<Self>,
    ) -> Self::Result {
        if self.config.poll_only() {
            return Box::pin(std::future::ready(Err(super::poll_only_refusal(
                "a publish",
            ))));
        }
        let (notifier, store, limit) = (
            self.notifier(),
            self.store.clone(),
            self.config.inline_limit(),
        );
        Box::pin(async move {
            let channel = Ident::channel(&channel)?;
            let envelope = Envelope::new(Kind::Event, Vec::new());
            notifier
                .send(store.as_deref(), channel, envelope, payload, limit)
                .await
        })
    }
}

impl ListenerActor {
    /// Validates `channel`, records what `register` adds to it, and makes sure it is listened
    /// on: what `Subscribe`, `SubscribeRaw` and `Serve` have in common. The returned
    /// future is not the actor's: it survives a restart of the listener, and resolves once the
    /// channel is listened on, on this connection or the next. An invalid channel registers
    /// nothing.
    fn registered(
        &mut self,
        channel: &str,
        register: impl FnOnce(&mut Channel),
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<()>> {
        let channel = match Ident::channel(channel) {
            Ok(channel) => channel,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        register(
            self.channels
                .entry(channel.as_str().to_owned())
                .or_default(),
        );
        // Poll-only: a doorbell (`SubscribeRaw`) that never rings; the others refused first.
        if self.config.poll_only() {
            return Box::pin(once_listening(None));
        }
        let confirmed = self.confirm(channel, ctx);
        Box::pin(once_listening(Some(confirmed)))
    }
}

/// Resolves once `confirmed` does (a LISTEN confirmed), at once without one (poll-only).
async fn once_listening(confirmed: Option<oneshot::Receiver<()>>) -> Result<()> {
    match confirmed {
        Some(confirmed) => (confirmed.await)
            .map_err(|_| Error::new(ErrorKind::Unavailable, "the listener stopped")),
        None => Ok(()),
    }
}

impl Handler<Subscribe> for ListenerActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(
        &mut self,
        Subscribe { channel, recipient }: Subscribe,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        if self.config.poll_only() {
            return Box::pin(std::future::ready(Err(super::poll_only_refusal(
                "a subscription",
            ))));
        }
        self.registered(&channel, |entry| entry.subscribers.push(recipient), ctx)
    }
}

impl Handler<Unsubscribe> for ListenerActor {
    type Result = ();

    fn handle(&mut self, Unsubscribe { channel, recipient }: Unsubscribe, ctx: &mut Context<Self>) {
        if let Some(entry) = self.channels.get_mut(&channel) {
            match recipient {
                Some(recipient) => entry.subscribers.retain(|s| *s != recipient),
                None => entry.handler = None,
            }
        }
        self.unlisten_if_unused(&channel, ctx);
    }
}

impl Handler<SubscribeRaw> for ListenerActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(
        &mut self,
        SubscribeRaw { channel, recipient }: SubscribeRaw,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        self.registered(&channel, |entry| entry.raw.push(recipient), ctx)
    }
}

impl Handler<Serve> for ListenerActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(
        &mut self,
        Serve { channel, handler }: Serve,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        if self.config.poll_only() {
            return Box::pin(std::future::ready(Err(super::poll_only_refusal(
                "serving requests",
            ))));
        }
        self.registered(&channel, |entry| entry.handler = Some(handler), ctx)
    }
}
