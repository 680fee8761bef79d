//! Signals in memory: subscribers per channel, one handler per served channel, request and
//! reply through it — with the listener's rules for what a subscriber whose mailbox is full,
//! a failing handler and a panicking one get.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use futures_util::FutureExt;
use pgcoord::ident::Ident;
use pgcoord::{Error, ErrorKind, Result};
use tracing::warn;

use super::Shared;
use crate::signals::{Ask, ConnState, Publish, RequestHandler, Signal};

/// Every subscription and handler of one in-memory backend.
#[derive(Default)]
pub(super) struct SignalState {
    next_id: u64,
    subscribers: HashMap<String, Vec<(u64, Recipient<Signal>)>>,
    /// Per channel, the handler and the coordinator that serves it.
    handlers: HashMap<String, Vec<(u64, RequestHandler)>>,
    conn_states: Vec<(u64, Recipient<ConnState>)>,
}

impl SignalState {
    /// Delivers `publish` to every subscriber of its channel, in every coordinator. A
    /// subscriber whose mailbox is full misses it, as with the listener (warned about).
    pub(super) fn publish(&mut self, publish: Publish) -> Result<()> {
        Ident::channel(&publish.channel)?;
        self.next_id += 1;
        let signal = Signal {
            channel: Arc::from(publish.channel.as_str()),
            id: self.next_id,
            payload: Bytes::from(publish.payload),
        };
        if let Some(subscribers) = self.subscribers.get_mut(&publish.channel) {
            subscribers.retain(|(_, recipient)| recipient.connected());
            for (_, recipient) in subscribers.iter() {
                if recipient.try_send(signal.clone()).is_err() {
                    warn!(channel = %signal.channel, "a subscriber's mailbox is full; message dropped for it");
                }
            }
        }
        Ok(())
    }

    pub(super) fn subscribe(&mut self, coordinator: u64, name: &str, recipient: Recipient<Signal>) {
        self.subscribers
            .entry(name.to_owned())
            .or_default()
            .push((coordinator, recipient));
    }

    pub(super) fn unsubscribe(&mut self, name: &str, recipient: &Recipient<Signal>) {
        if let Some(subscribers) = self.subscribers.get_mut(name) {
            subscribers.retain(|(_, r)| r != recipient);
        }
    }

    /// `coordinator` answers requests on `name` with `handler`, replacing its earlier one.
    pub(super) fn serve(&mut self, coordinator: u64, name: &str, handler: RequestHandler) {
        let handlers = self.handlers.entry(name.to_owned()).or_default();
        handlers.retain(|(c, _)| *c != coordinator);
        handlers.push((coordinator, handler));
    }

    pub(super) fn stop_serving(&mut self, coordinator: u64, name: &str) {
        if let Some(handlers) = self.handlers.get_mut(name) {
            handlers.retain(|(c, _)| *c != coordinator);
        }
    }

    /// The handler that answers a request on `name` now: the first to serve it.
    fn handler(&self, name: &str) -> Option<RequestHandler> {
        let handlers = self.handlers.get(name)?;
        handlers.first().map(|(_, handler)| handler.clone())
    }

    pub(super) fn subscribe_conn_state(
        &mut self,
        coordinator: u64,
        recipient: Recipient<ConnState>,
    ) {
        // Streams dropped since are forgotten here, as the listener forgets them.
        self.conn_states.retain(|(_, r)| r.connected());
        self.conn_states.push((coordinator, recipient));
    }

    /// What `coordinator`'s listener would tell its subscribers across a reconnect.
    pub(super) fn reconnected(&self, coordinator: u64) {
        for (_, recipient) in self.conn_states.iter().filter(|(c, _)| *c == coordinator) {
            recipient.do_send(ConnState::Disconnected {
                error: "forced by MemoryBackend::reconnect".into(),
            });
            recipient.do_send(ConnState::Reconnected);
        }
    }
}

/// A request and its reply: the handler's answer, [`ErrorKind::Remote`] for its error or
/// panic, [`ErrorKind::Timeout`] past the request's timeout (also when nobody serves the
/// channel, as a request nobody answers on PostgreSQL).
pub(super) async fn ask(shared: Arc<Shared>, ask: Ask) -> Result<Vec<u8>> {
    Ident::channel(&ask.channel)?;
    let handler = shared.lock().signals.handler(&ask.channel);
    let reply = async move {
        let Some(handler) = handler else {
            return std::future::pending().await;
        };
        match std::panic::AssertUnwindSafe(handler(ask.payload))
            .catch_unwind()
            .await
        {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(message)) => Err(Error::new(ErrorKind::Remote, message)),
            Err(_) => Err(Error::new(
                ErrorKind::Remote,
                "the request handler panicked",
            )),
        }
    };
    match ask.timeout {
        Some(timeout) => tokio::time::timeout(timeout, reply).await.map_err(|_| {
            Error::new(
                ErrorKind::Timeout,
                format!("no reply on {:?} within {timeout:?}", ask.channel),
            )
        })?,
        None => reply.await,
    }
}
