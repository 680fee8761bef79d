//! What `ListenerActor` does with a notification: routing it to subscribers, handlers and
//! pending requests, and announcing what some subscribers did not get (`ConnState::MessageLost`).

use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use pgcoord::__private::warn_due;
use pgcoord::ident::Ident;
use pgcoord::signal::{self, Body, Envelope, Kind};
use pgcoord::{Error, ErrorKind};
use tracing::{debug, warn};

use super::messages::*;
use super::{LOSS_REPORT_GAP, ListenerActor};

impl ListenerActor {
    /// Routes one notification. Never waits: stored payloads (see `ordered`) and handlers run on
    /// their own.
    pub(crate) fn dispatch(&mut self, channel: &str, text: &str, ctx: &mut Context<Self>) {
        if channel == self.reply_channel.as_str()
            && let Some(probe) = super::connection::probe_number(text)
        {
            // Heard back: this connection delivers. Only a probe under way counts, by its exact
            // random value: anyone can NOTIFY this channel, and a number they made up, or one
            // they heard earlier, proves nothing about this connection.
            match self.probes.remove(&probe) {
                Some(heard) => {
                    self.heard_back = true;
                    let _ = heard.send(());
                }
                None => debug!("a probe that is not under way, ignored"),
            }
            return;
        }
        if let Some(entry) = self.channels.get_mut(channel)
            && !entry.raw.is_empty()
        {
            let raw = RawNotification {
                channel: channel.to_owned(),
                payload: text.to_owned(),
            };
            entry
                .raw
                .retain(|r| !matches!(r.try_send(raw.clone()), Err(SendError::Closed(_))));
            // A raw channel carries no envelopes unless someone also subscribed to it as one.
            if entry.subscribers.is_empty() && entry.handler.is_none() {
                return;
            }
        }
        let mut envelope = match Envelope::decode(text) {
            Ok(envelope) => envelope,
            Err(e) => return self.garbage(channel, &e),
        };
        if channel == self.reply_channel.as_str() {
            return match envelope.kind {
                Kind::Reply => self.on_reply(envelope),
                _ => self.garbage(channel, &"not a reply on the reply channel"),
            };
        }
        match envelope.kind {
            Kind::Event => match envelope.body {
                // Decoded once into its own buffer: moved, then shared by every subscriber.
                Body::Inline(payload) => self.deliver_in_order(channel, envelope.id, payload, ctx),
                stored @ Body::Stored(_) => {
                    envelope.body = stored;
                    self.fetch_in_order(channel, envelope, ctx);
                }
            },
            Kind::Request => {
                if let Some(handler) = self.channels.get(channel).and_then(|c| c.handler.clone()) {
                    self.answer(envelope, handler);
                }
            }
            _ => self.garbage(channel, &"a reply on a non-reply channel"),
        }
    }

    fn garbage(&mut self, channel: &str, why: &dyn std::fmt::Display) {
        self.stats.garbage += 1;
        self.count(|m| m.garbage.increment(1));
        // Anyone can NOTIFY any channel: a flood must not become a flood of log lines. The
        // first, then every power of two; the stat counts them all.
        if warn_due(self.stats.garbage) {
            warn!(%channel, error = %why, skipped = self.stats.garbage, "skipping notifications that are not pgcoord messages");
        }
    }

    /// A message whose stored payload cannot be fetched (expired, deleted, store unreachable,
    /// or a reference to no row that anyone could NOTIFY, which cannot be told from an expired
    /// one): counted, and announced to `ConnState` subscribers, since its subscribers miss it.
    /// As garbage is, warned about at the first and every power of two; announced at once,
    /// then at most once per [`LOSS_REPORT_GAP`] for the channel with every loss since in one
    /// announcement, so a flood is a few announcements and never a silent loss.
    pub(crate) fn undeliverable(&mut self, channel: &str, error: &Error, ctx: &mut Context<Self>) {
        self.stats.undeliverable += 1;
        self.count(|m| m.undeliverable.increment(1));
        if warn_due(self.stats.undeliverable) {
            warn!(%channel, error = %error, undeliverable = self.stats.undeliverable, "cannot fetch a stored payload; message not delivered");
        }
        self.lost(channel, error.to_string(), ctx);
    }

    /// Messages of `channel` some subscribers did not get: announced at once, or counted into
    /// the announcement due at the end of the channel's [`LOSS_REPORT_GAP`].
    fn lost(&mut self, channel: &str, error: String, ctx: &mut Context<Self>) {
        if let Some((since, last)) = self.losses.get_mut(channel) {
            *since += 1;
            *last = error;
            return;
        }
        self.announce_loss(channel.to_owned(), error, ctx);
    }

    /// Announces a loss on `channel`, and those to come within [`LOSS_REPORT_GAP`] after it.
    fn announce_loss(&mut self, channel: String, error: String, ctx: &mut Context<Self>) {
        self.losses.insert(channel.clone(), (0, String::new()));
        self.broadcast(ConnState::MessageLost {
            channel: channel.clone(),
            error,
        });
        ctx.run_later(LOSS_REPORT_GAP, move |act, ctx| {
            match act.losses.remove(&channel) {
                Some((0, _)) | None => {}
                Some((n, last)) => {
                    let error =
                        format!("{n} more lost since the last announcement; the last: {last}");
                    act.announce_loss(channel, error, ctx);
                }
            }
        });
    }

    /// Hands a message to every subscriber of `channel` without blocking.
    pub(crate) fn deliver(
        &mut self,
        channel: &str,
        id: u64,
        payload: Vec<u8>,
        ctx: &mut Context<Self>,
    ) {
        let Some(entry) = self.channels.get_mut(channel) else {
            return;
        };
        let signal = Signal {
            channel: Arc::from(channel),
            id,
            payload: Bytes::from(payload),
        };
        let stats = &mut self.stats;
        let (delivered, overflowed) = (stats.delivered, stats.overflowed);
        entry.subscribers.retain(|subscriber| match subscriber.try_send(signal.clone()) {
            Ok(()) => {
                stats.delivered += 1;
                true
            }
            Err(SendError::Full(_)) => {
                stats.overflowed += 1;
                if warn_due(stats.overflowed) {
                    warn!(%channel, overflowed = stats.overflowed, "a subscriber's mailbox is full; messages dropped for it");
                }
                true
            }
            Err(SendError::Closed(_)) => false,
        });
        let (delivered, overflowed) = (
            self.stats.delivered - delivered,
            self.stats.overflowed - overflowed,
        );
        self.count(|m| {
            m.delivered.increment(delivered);
            m.overflowed.increment(overflowed);
        });
        // A subscriber missed it: never a silent loss. Whoever watches the connection's states
        // learns of it as of a payload that could not be fetched, and resyncs.
        if overflowed > 0 {
            let error = format!("{overflowed} subscriber(s) had a full mailbox; dropped for them");
            self.lost(channel, error, ctx);
        }
        // Subscribers that are gone may leave nobody listening.
        self.unlisten_if_unused(channel, ctx);
    }

    /// Forgets `channel` and UNLISTENs it when nobody subscribes or serves on it any
    /// more: subscriptions end.
    pub(crate) fn unlisten_if_unused(&mut self, channel: &str, ctx: &mut Context<Self>) {
        let unused = self.channels.get(channel).is_some_and(|entry| {
            entry.subscribers.is_empty() && entry.raw.is_empty() && entry.handler.is_none()
        });
        if !unused {
            return;
        }
        self.channels.remove(channel);
        self.confirm_waiters.remove(channel);
        let (Some(client), true) = (self.client.clone(), self.ready) else {
            // Not connected: the next connection does not LISTEN on it.
            return;
        };
        let (bound, channel) = (self.config.statement_timeout(), channel.to_owned());
        let unlisten = async move {
            let sql = format!("UNLISTEN {}", Ident::channel(&channel)?.quoted());
            tokio::time::timeout(bound, client.batch_execute(&sql))
                .await
                .map_err(|_| {
                    Error::new(ErrorKind::Unavailable, "UNLISTEN not confirmed in time")
                })??;
            Ok::<_, Error>(())
        };
        ctx.spawn(unlisten.into_actor(self).map(|result, _, _| {
            if let Err(e) = result {
                // The connection is failing; the next one will not LISTEN on the channel.
                debug!(error = %e, "UNLISTEN failed");
            }
        }));
    }

    fn on_reply(&mut self, envelope: Envelope) {
        let waiting = self.pending.lock().expect("pending").remove(&envelope.id);
        let Some(waiting) = waiting else {
            self.stats.unmatched_replies += 1;
            self.count(|m| m.unmatched_reply.increment(1));
            debug!(id = envelope.id, "reply for no pending request dropped");
            return;
        };
        match (&envelope.error, &envelope.body) {
            (Some(error), _) => {
                let _ = waiting.send(Err(Error::new(ErrorKind::Remote, error.clone())));
            }
            (None, Body::Inline(payload)) => {
                let _ = waiting.send(Ok(payload.clone()));
            }
            // Only a stored reply needs a query; it must not hold up the reader.
            (None, Body::Stored(_)) => {
                let store = self.store.clone();
                tokio::spawn(async move {
                    let _ = waiting.send(signal::open(&envelope, store.as_deref()).await);
                });
            }
        }
    }

    /// Runs `handler` on its own task and sends what it returns (or its panic) as the reply.
    fn answer(&mut self, request: Envelope, handler: RequestHandler) {
        let Some(reply_to) = request
            .reply_to
            .as_deref()
            .and_then(|c| Ident::channel(c).ok())
        else {
            return self.garbage("?", &"a request without a valid reply channel");
        };
        let (notifier, store, limit) = (
            self.notifier(),
            self.store.clone(),
            self.config.inline_limit(),
        );
        tokio::spawn(async move {
            let outcome = match signal::open(&request, store.as_deref()).await {
                Ok(payload) => match tokio::spawn(handler(payload)).await {
                    Ok(outcome) => outcome,
                    Err(e) if e.is_panic() => Err("the request handler panicked".to_owned()),
                    Err(_) => Err("the request handler was cancelled".to_owned()),
                },
                Err(e) => Err(format!("cannot read the request payload: {e}")),
            };
            let mut reply = Envelope::new(Kind::Reply, Vec::new());
            reply.id = request.id;
            let payload = match outcome {
                Ok(payload) => payload,
                Err(error) => {
                    reply.error = Some(error);
                    Vec::new()
                }
            };
            let sent = notifier
                .send(store.as_deref(), reply_to.clone(), reply, payload, limit)
                .await;
            if let Err(e) = sent {
                warn!(channel = %reply_to, error = %e, "cannot send a reply");
            }
        });
    }
}
