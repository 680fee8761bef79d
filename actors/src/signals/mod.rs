//! [`ListenerActor`]: the one LISTEN connection of a process, its subscriptions, handlers and
//! pending requests, reconnected under a `Supervisor`.
//!
//! The connection is a dedicated tokio-postgres connection whose messages are read with
//! `Connection::poll_message` as the actor's stream (a pooled connection would drop them). When
//! it fails, closes, or leaves a ping unanswered for `ping_timeout`, the actor stops and its
//! supervisor restarts it: the state (subscriptions, handlers, pending requests) survives, a new
//! connection is opened after a backoff, every channel is LISTENed again, and only then is
//! `Reconnected` broadcast. Routing of what arrives is in `dispatch`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use futures_util::stream::poll_fn;
use pgcoord::ident::Ident;
use pgcoord::payload::PayloadStore;
use pgcoord::{Config, Error, ErrorKind, Pool, Result};
use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, Client};
use tracing::{info, warn};

mod dispatch;
mod messages;
mod round_trip;

pub use messages::*;
// Named, so it wins over the `Request` that actix's prelude glob brings into this module.
pub use messages::Request;
pub use round_trip::{RequestResponse, RoundTrip, TypedRequest, TypedResponse};

/// One channel this process listens on.
#[derive(Default)]
pub(crate) struct Channel {
    pub(crate) subscribers: Vec<Recipient<Signal>>,
    /// Receivers of the notification text as it is, without an envelope (the lease channel).
    pub(crate) raw: Vec<Recipient<RawNotification>>,
    pub(crate) waiters: Vec<oneshot::Sender<Signal>>,
    pub(crate) handler: Option<RequestHandler>,
}

/// The actor owning the process's LISTEN connection. Start it with
/// [`ListenerActor::start_supervised`].
pub struct ListenerActor {
    pub(crate) config: Config,
    pub(crate) pool: Pool,
    pub(crate) store: Option<Arc<dyn PayloadStore>>,
    pub(crate) reply_channel: Ident,
    client: Option<Arc<Client>>,
    ready: bool,
    ever_connected: bool,
    ready_waiters: Vec<oneshot::Sender<()>>,
    pub(crate) channels: HashMap<String, Channel>,
    /// Callers waiting until their channel is listened on, by channel. Kept across restarts:
    /// the next connection's LISTENs answer them.
    confirm_waiters: HashMap<String, Vec<oneshot::Sender<()>>>,
    /// Requests waiting for their reply, by id. Shared with the tasks that run the round trips
    /// (not futures of this actor, which a restart would drop); each task removes its own
    /// entry however it ends.
    pub(crate) pending: Pending,
    conn_subscribers: Vec<Recipient<ConnState>>,
    failures: u32,
    /// Set by [`Shutdown`]: the supervisor restarts a stopped actor while anyone holds its
    /// address, so a shut-down listener stays idle instead of connecting again.
    shut_down: bool,
    pub(crate) stats: ListenerStats,
}

/// The pending requests of a listener: reply senders by request id.
pub(crate) type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Vec<u8>>>>>>;

impl ListenerActor {
    /// A listener for `config`; payloads too large for a notification go to `store` (without
    /// one they are [`ErrorKind::PayloadTooLarge`]).
    pub fn new(config: Config, store: Option<Arc<dyn PayloadStore>>) -> ListenerActor {
        let pool = pgcoord::db::pool(&config);
        ListenerActor::with_pool(config, pool, store)
    }

    /// A listener whose statements (publishes, replies) run on `pool`, shared with other actors.
    pub fn with_pool(
        config: Config,
        pool: Pool,
        store: Option<Arc<dyn PayloadStore>>,
    ) -> ListenerActor {
        let reply_channel =
            Ident::new(&format!("pgcoord_reply_{:016x}", pgcoord::signal::new_id()))
                .expect("a valid generated identifier");
        ListenerActor {
            pool,
            config,
            store,
            reply_channel,
            client: None,
            ready: false,
            ever_connected: false,
            ready_waiters: Vec::new(),
            channels: HashMap::new(),
            confirm_waiters: HashMap::new(),
            pending: Pending::default(),
            conn_subscribers: Vec::new(),
            failures: 0,
            shut_down: false,
            stats: ListenerStats::default(),
        }
    }

    /// Starts the listener under a `Supervisor` in the current actix System.
    pub fn start_supervised(self) -> Addr<ListenerActor> {
        Supervisor::start(move |_| self)
    }

    /// The channel this process's replies arrive on.
    pub fn reply_channel(&self) -> &Ident {
        &self.reply_channel
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        let config = self.config.clone();
        let connect = async move { pgcoord::db::connect_as(&config, "listener").await };
        ctx.spawn(
            connect
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok((client, mut connection)) => {
                        act.stats.connections += 1;
                        ctx.add_stream(poll_fn(move |cx| connection.poll_message(cx)));
                        act.client = Some(Arc::new(client));
                        act.listen_all(ctx);
                    }
                    Err(e) => act.fail(
                        ctx,
                        ConnState::Disconnected {
                            error: e.to_string(),
                        },
                    ),
                }),
        );
    }

    /// LISTENs on every channel in one batch, then announces the connection.
    fn listen_all(&mut self, ctx: &mut Context<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        // The channels registered now; one registered while this batch is on its way is
        // LISTENed on its own once the batch is confirmed.
        let listed: Vec<String> = self.channels.keys().cloned().collect();
        let batch: String = std::iter::once(self.reply_channel.quoted())
            .chain(
                listed
                    .iter()
                    .map(|c| Ident::new(c).expect("validated on entry").quoted()),
            )
            .map(|c| format!("LISTEN {c};"))
            .collect();
        let bound = self.config.statement_timeout();
        let listen = async move { listen_on(&client, &batch, bound).await };
        ctx.spawn(
            listen
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(()) => {
                        act.ready = true;
                        act.failures = 0;
                        let state = if act.ever_connected {
                            ConnState::Reconnected
                        } else {
                            ConnState::Connected
                        };
                        act.ever_connected = true;
                        info!(channels = act.channels.len(), ?state, "listener ready");
                        act.broadcast(state);
                        for waiter in act.ready_waiters.drain(..) {
                            let _ = waiter.send(());
                        }
                        for channel in &listed {
                            act.confirmed(channel);
                        }
                        let late: Vec<String> = act.confirm_waiters.keys().cloned().collect();
                        for channel in late {
                            act.listen_channel(Ident::new(&channel).expect("validated"), ctx);
                        }
                    }
                    Err(error) => act.fail(ctx, ConnState::Disconnected { error }),
                }),
        );
    }

    fn ping(&mut self, ctx: &mut Context<Self>) {
        let (Some(client), true) = (self.client.clone(), self.ready) else {
            return;
        };
        let timeout = self.config.ping_timeout();
        let ping = async move { tokio::time::timeout(timeout, client.simple_query("")).await };
        ctx.spawn(ping.into_actor(self).map(|result, act, ctx| match result {
            Err(_) => act.fail(ctx, ConnState::Stalled),
            Ok(Err(e)) => act.fail(
                ctx,
                ConnState::Disconnected {
                    error: e.to_string(),
                },
            ),
            Ok(Ok(_)) => {}
        }));
    }

    /// Reports `state` and stops, so the supervisor restarts the actor on a new connection.
    /// During an outage only the first failure is broadcast and warned about, then every power
    /// of two: a listener retrying every half second must not flood its subscribers or the log.
    fn fail(&mut self, ctx: &mut Context<Self>, state: ConnState) {
        if ctx.state() != ActorState::Running {
            return;
        }
        let first = self.ready || self.failures == 0;
        self.failures += 1;
        if first || self.failures.is_power_of_two() {
            warn!(
                ?state,
                failures = self.failures,
                "listener connection lost; reconnecting"
            );
        }
        if first {
            self.broadcast(state);
        }
        ctx.stop();
    }

    pub(crate) fn broadcast(&mut self, state: ConnState) {
        // Rare and important ("Reconnected" means resync): never dropped for a full mailbox.
        self.conn_subscribers.retain(|s| {
            s.do_send(state.clone());
            s.connected()
        });
    }

    /// Resolves once every LISTEN of the current connection is confirmed.
    fn when_ready(&mut self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        if self.ready {
            let _ = tx.send(());
        } else {
            self.ready_waiters.push(tx);
        }
        rx
    }

    /// Makes sure `channel` is listened on: at once on the current connection, or by the next
    /// connection's LISTENs when there is none (the channel is registered already). The
    /// receiver resolves once a LISTEN on `channel` is confirmed; it fails only when the
    /// listener stopped for good.
    pub(crate) fn confirm(
        &mut self,
        channel: Ident,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.confirm_waiters
            .entry(channel.as_str().to_owned())
            .or_default()
            .push(tx);
        if self.ready {
            self.listen_channel(channel, ctx);
        }
        rx
    }

    /// LISTENs on `channel` on the current connection, then answers its waiters.
    fn listen_channel(&mut self, channel: Ident, ctx: &mut Context<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let bound = self.config.statement_timeout();
        let listen = async move {
            listen_on(&client, &format!("LISTEN {};", channel.quoted()), bound)
                .await
                .map(|()| channel)
        };
        ctx.spawn(
            listen
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok(channel) => act.confirmed(channel.as_str()),
                    // The connection failed: the next one LISTENs on every registered channel and
                    // answers the waiters then.
                    Err(error) => act.fail(ctx, ConnState::Disconnected { error }),
                }),
        );
    }

    /// Answers everyone waiting for `channel` to be listened on.
    fn confirmed(&mut self, channel: &str) {
        for waiter in self.confirm_waiters.remove(channel).into_iter().flatten() {
            let _ = waiter.send(());
        }
    }

    /// Waits until the reply channel is listened on; requests must not go out before.
    pub(crate) fn replies_ready(&mut self) -> impl Future<Output = ()> + 'static {
        let ready = self.when_ready();
        async move {
            let _ = ready.await;
        }
    }
}

impl Actor for ListenerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.shut_down {
            return;
        }
        let delay = backoff(self.failures);
        if delay.is_zero() {
            self.connect(ctx);
        } else {
            ctx.run_later(delay, |act, ctx| act.connect(ctx));
        }
        ctx.run_interval(self.config.ping_interval(), |act, ctx| act.ping(ctx));
    }
}

impl Supervised for ListenerActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.client = None;
        self.ready = false;
    }
}

impl StreamHandler<std::result::Result<AsyncMessage, tokio_postgres::Error>> for ListenerActor {
    fn handle(
        &mut self,
        message: std::result::Result<AsyncMessage, tokio_postgres::Error>,
        ctx: &mut Context<Self>,
    ) {
        match message {
            Ok(AsyncMessage::Notification(n)) => self.dispatch(n.channel(), n.payload(), ctx),
            Ok(_) => {}
            Err(e) => self.fail(
                ctx,
                ConnState::Disconnected {
                    error: e.to_string(),
                },
            ),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.fail(
            ctx,
            ConnState::Disconnected {
                error: "connection closed".into(),
            },
        );
    }
}

impl Handler<crate::losses::Shutdown> for ListenerActor {
    type Result = ();

    /// Closes the connection for good: subscriptions, handlers and waiting callers are dropped
    /// (waiting callers get an error), and nothing reconnects.
    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        self.shut_down = true;
        self.client = None;
        self.ready = false;
        self.channels.clear();
        self.confirm_waiters.clear();
        self.ready_waiters.clear();
        self.pending.lock().expect("pending").clear();
        ctx.stop();
    }
}

impl Handler<SubscribeConnState> for ListenerActor {
    type Result = ();

    fn handle(&mut self, SubscribeConnState(recipient): SubscribeConnState, _: &mut Context<Self>) {
        self.conn_subscribers.push(recipient);
    }
}

impl Handler<ListeningChannels> for ListenerActor {
    type Result = ResponseFuture<Result<Vec<String>>>;

    fn handle(&mut self, _: ListeningChannels, _: &mut Context<Self>) -> Self::Result {
        let (client, bound) = (self.client.clone(), self.config.statement_timeout());
        Box::pin(async move {
            let client = client
                .ok_or_else(|| Error::new(ErrorKind::Unavailable, "listener is reconnecting"))?;
            let query = client.query("SELECT pg_listening_channels()::text ORDER BY 1", &[]);
            let rows = tokio::time::timeout(bound, query).await.map_err(|_| {
                Error::new(
                    ErrorKind::Unavailable,
                    "the listener's session did not answer in time",
                )
            })??;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }
}

impl Handler<GetListenerStats> for ListenerActor {
    type Result = ListenerStats;

    fn handle(&mut self, _: GetListenerStats, _: &mut Context<Self>) -> ListenerStats {
        ListenerStats {
            pending_requests: self.pending.lock().expect("pending").len(),
            ..self.stats.clone()
        }
    }
}

/// Runs LISTEN statements on the listening session, bounded: a session that does not confirm
/// them in time is replaced like one that fails (pings only start once it is ready).
async fn listen_on(
    client: &Client,
    batch: &str,
    bound: Duration,
) -> std::result::Result<(), String> {
    match tokio::time::timeout(bound, client.batch_execute(batch)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("LISTEN not confirmed within {bound:?}")),
    }
}

/// No delay for the first connection (or the first after a working one), then pgcoord's
/// jittered backoff, at most 500 ms: the listener is back within half a second of the server.
fn backoff(failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => pgcoord::db::backoff(n - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_starts_at_once_and_is_capped() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::ZERO);
        for failures in 2..40 {
            assert!(backoff(failures) <= Duration::from_millis(500));
        }
    }
}
