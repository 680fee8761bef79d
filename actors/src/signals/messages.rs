//! The messages `ListenerActor` answers, and what it sends to subscribers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use pgcoord::Result;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A message received on a channel. Cheap to clone: every subscriber of a channel gets the same
/// channel name and payload buffer, shared, not copied.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub struct Signal {
    /// The channel it arrived on.
    pub channel: Arc<str>,
    /// The sender's message id.
    pub id: u64,
    /// The payload bytes (fetched from the payload store when it travelled by key).
    pub payload: Bytes,
}

impl Signal {
    /// The payload decoded from MessagePack.
    pub fn value<T: DeserializeOwned>(&self) -> Result<T> {
        pgcoord::signal::from_payload(&self.payload)
    }
}

/// The state of the listening connection, broadcast to [`SubscribeConnState`] recipients.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub enum ConnState {
    /// First connection, every LISTEN confirmed.
    Connected,
    /// The connection failed or closed; a new one is on its way.
    Disconnected {
        /// What happened.
        error: String,
    },
    /// The connection stopped answering pings; it is being replaced.
    Stalled,
    /// The connection answers but does not deliver notifications: the listener's own probe, a
    /// NOTIFY on its reply channel, did not come back within the ping timeout (a
    /// transaction-mode pooler on the session DSN, say). It is being replaced; while it stays
    /// deaf, subscribers hear nothing and only polls go on.
    Deaf,
    /// Connected again and every LISTEN confirmed. Notifications sent during the gap were not
    /// delivered: resync whatever they drive.
    Reconnected,
    /// A message arrived on `channel` but subscribers did not get it: its payload, kept in the
    /// payload store, could not be fetched (expired, deleted, or the store failed), or a
    /// subscriber's mailbox was full (the error says which). Resync what that channel drives. Announced at once, then at most once a second for the
    /// channel, for all lost meanwhile (the error says how many): a reference to no row, which
    /// anyone who can NOTIFY can send, cannot be told from an expired one, so a flood of them
    /// is a few announcements.
    MessageLost {
        /// The channel the message arrived on.
        channel: String,
        /// Why its payload could not be fetched.
        error: String,
    },
}

impl ConnState {
    /// Whether messages of `channel` may have been missed, as this state says: the listener
    /// reconnected (what was sent while it was away was not delivered), or one of the
    /// channel's messages was lost. What every reader of a channel resyncs on — from the
    /// database, as after a start — and the one rule each of pgcoord's own readers follows.
    /// (`Connected`, the first connection, misses nothing a subscriber was told of: a
    /// subscription is answered once its LISTEN is confirmed.)
    pub fn may_have_missed(&self, channel: &str) -> bool {
        match self {
            ConnState::Reconnected => true,
            ConnState::MessageLost { channel: lost, .. } => lost == channel,
            _ => false,
        }
    }
}

/// Send `payload` to every subscriber of `channel`, in every process. Fire and forget.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<()>")]
pub struct Publish {
    pub(crate) channel: String,
    pub(crate) payload: Vec<u8>,
}

impl Publish {
    /// Raw bytes.
    pub fn new(channel: impl Into<String>, payload: impl Into<Vec<u8>>) -> Publish {
        Publish {
            channel: channel.into(),
            payload: payload.into(),
        }
    }

    /// A serde value, as MessagePack.
    pub fn value<T: Serialize + ?Sized>(channel: impl Into<String>, value: &T) -> Result<Publish> {
        Ok(Publish::new(channel, pgcoord::signal::to_payload(value)?))
    }
}

/// Deliver every message on `channel` to `recipient`, through its mailbox without waiting: when
/// the mailbox is full the message is dropped for that recipient, counted and warned about.
/// actix mailboxes hold 16 messages by default; a subscriber expecting bursts raises its own
/// with `ctx.set_mailbox_capacity` in `started`.
///
/// Resolves once the channel is being listened on. While the listener has no connection (the
/// database is down, it is reconnecting) the subscription is accepted and the reply waits for
/// the next connection's LISTENs, however long that takes: bound it with `send(..).timeout(..)`
/// if you must; the subscription stays registered either way. An invalid channel
/// ([`pgcoord::ErrorKind::InvalidIdentifier`]) registers nothing.
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
#[non_exhaustive]
pub struct Subscribe {
    /// The channel.
    pub channel: String,
    /// Who receives.
    pub recipient: Recipient<Signal>,
}

impl Subscribe {
    /// `recipient` receives what is published on `channel`.
    pub fn new(channel: impl Into<String>, recipient: Recipient<Signal>) -> Subscribe {
        Subscribe {
            channel: channel.into(),
            recipient,
        }
    }
}

/// Stop hearing a channel: as one of its subscribers ([`new`](Self::new): the recipient given
/// to [`Subscribe`] gets nothing more from it), or as its server ([`serving`](Self::serving): the
/// handler given to [`Serve`] is dropped). When nobody subscribes or serves on the channel any
/// more, it is UNLISTENed. A subscriber that is gone (its actor stopped) is forgotten the same
/// way at the next message, without this.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Unsubscribe {
    pub(crate) channel: String,
    /// `None`: the channel's server.
    pub(crate) recipient: Option<Recipient<Signal>>,
}

impl Unsubscribe {
    /// `recipient` receives nothing more from `channel`.
    pub fn new(channel: impl Into<String>, recipient: Recipient<Signal>) -> Unsubscribe {
        Unsubscribe {
            channel: channel.into(),
            recipient: Some(recipient),
        }
    }

    /// Requests on `channel` are answered here no more.
    pub fn serving(channel: impl Into<String>) -> Unsubscribe {
        Unsubscribe {
            channel: channel.into(),
            recipient: None,
        }
    }
}

/// A notification as PostgreSQL delivered it, for channels that do not carry pgcoord envelopes.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct RawNotification {
    /// The channel.
    pub channel: String,
    /// The notification text.
    pub payload: String,
}

/// Deliver every notification on `channel` to `recipient` as it is, without decoding an
/// envelope (the lease channel announces released names this way). Same delivery rules as
/// [`Subscribe`].
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct SubscribeRaw {
    /// The channel.
    pub channel: String,
    /// Who receives.
    pub recipient: Recipient<RawNotification>,
}

/// What a request handler returns: the reply payload, or an error message for the caller.
pub type HandlerResult = std::result::Result<Vec<u8>, String>;

/// A request handler: the request payload in, the reply out. It runs on its own task, so a slow
/// or panicking handler never stalls or kills the listener; a panic becomes an error reply.
pub type RequestHandler =
    Arc<dyn Fn(Vec<u8>) -> Pin<Box<dyn Future<Output = HandlerResult> + Send>> + Send + Sync>;

/// Answer requests on `channel` with `handler` (replacing an earlier one), until
/// [`Unsubscribe::serving`]. Resolves once the channel is being listened on (as [`Subscribe`]
/// does, also across reconnects).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Serve {
    pub(crate) channel: String,
    pub(crate) handler: RequestHandler,
}

impl std::fmt::Debug for Serve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Serve {
    /// Serve raw bytes.
    pub fn new<F, Fut>(channel: impl Into<String>, handler: F) -> Serve
    where
        F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        Serve {
            channel: channel.into(),
            handler: Arc::new(move |payload| Box::pin(handler(payload))),
        }
    }

    /// Serve typed requests: MessagePack in, MessagePack out; a handler's `Err` is the caller's
    /// [`pgcoord::ErrorKind::Remote`] error.
    pub fn typed<Req, Rep, E, F, Fut>(channel: impl Into<String>, handler: F) -> Serve
    where
        Req: DeserializeOwned + Send + 'static,
        Rep: Serialize + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Rep, E>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        Serve::new(channel, move |payload: Vec<u8>| {
            let handler = handler.clone();
            async move {
                let request: Req =
                    pgcoord::signal::from_payload(&payload).map_err(|e| e.to_string())?;
                let reply = handler(request).await.map_err(|e| e.to_string())?;
                pgcoord::signal::to_payload(&reply).map_err(|e| e.to_string())
            }
        })
    }
}

/// A request/reply round trip (the ask pattern): send `payload` on `channel` and wait for one
/// handler's reply. (Named `Ask`, not `Request`, so it does not clash with actix's prelude.) A handler's error
/// is [`pgcoord::ErrorKind::Remote`]; with a [`timeout`](Ask::timeout), no reply in time is
/// [`pgcoord::ErrorKind::Timeout`]. Dropping the request forgets it; a late reply is dropped.
/// A request in flight when the listener's connection fails goes on across the reconnect: it
/// ends with the reply (when the reply arrived after the reconnect) or its deadline, never a
/// closed mailbox. Without a timeout, a reply lost in the gap is waited for until the caller
/// gives up.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<u8>>")]
pub struct Ask {
    pub(crate) channel: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) timeout: Option<Duration>,
}

impl Ask {
    /// Raw bytes.
    pub fn new(channel: impl Into<String>, payload: impl Into<Vec<u8>>) -> Ask {
        Ask {
            channel: channel.into(),
            payload: payload.into(),
            timeout: None,
        }
    }

    /// A serde value, as MessagePack; decode the reply with `pgcoord::signal::from_payload`.
    pub fn value<T: Serialize + ?Sized>(channel: impl Into<String>, value: &T) -> Result<Ask> {
        Ok(Ask::new(channel, pgcoord::signal::to_payload(value)?))
    }

    /// Give up after `timeout`. Default: wait until the caller drops the request.
    pub fn timeout(mut self, timeout: Duration) -> Ask {
        self.timeout = Some(timeout);
        self
    }
}

/// Register for [`ConnState`] broadcasts.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SubscribeConnState(pub Recipient<ConnState>);

/// Counters of what the listener has done: what a `ListenerActor` answers to
/// [`GetStats`](crate::GetStats).
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct ListenerStats {
    /// Messages delivered to subscribers.
    pub delivered: u64,
    /// Messages dropped because a subscriber's mailbox was full; announced as
    /// [`ConnState::MessageLost`] (as `undeliverable` ones are).
    pub overflowed: u64,
    /// Notifications that were not valid envelopes, skipped (warned about at the first and then
    /// at every power of two).
    pub garbage: u64,
    /// Messages whose stored payload could not be fetched, or that found their channel's
    /// backlog full; announced as [`ConnState::MessageLost`] (several in one at times) and
    /// warned about at the first and then at every power of two.
    pub undeliverable: u64,
    /// Replies that arrived for no pending request (late, or a second handler's), dropped.
    pub unmatched_replies: u64,
    /// Requests waiting for a reply now.
    pub pending_requests: usize,
    /// Connections opened, the first included.
    pub connections: u64,
    /// NOTIFY statements sent for events, requests and replies: single ones, and batches of
    /// concurrent ones counted once each.
    pub notify_statements: u64,
    /// Whether the listener is connected with every LISTEN confirmed now (its last state was
    /// [`ConnState::Connected`] or [`ConnState::Reconnected`]) and has heard its own probe back
    /// on this connection: notifications reach it. A connection found deaf never says so, and
    /// neither does one whose first probe is still on its way.
    pub listening: bool,
}

/// The channels the listener's current session is listening on, from `pg_listening_channels()`
/// on that very session. A probe for tests of the listener itself, not part of the API: whether
/// the listener listens is [`ListenerStats::listening`] (or `Coordinator::health`).
#[doc(hidden)]
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<String>>")]
pub struct ListeningChannels;
