//! [`ListenerActor`]: the one LISTEN connection of a process, its subscriptions, handlers and
//! pending requests, reconnected under a `Supervisor`.
//!
//! The connection is a dedicated tokio-postgres connection whose messages are read with
//! `Connection::poll_message` as the actor's stream (a pooled connection would drop them). When
//! it fails, closes, or leaves a ping unanswered for `ping_timeout`, the actor stops and its
//! supervisor restarts it: the state (subscriptions, handlers, pending requests) survives, a new
//! connection is opened after a backoff, every channel is LISTENed again, and only then is
//! `Reconnected` broadcast. Routing of what arrives is in `dispatch`; what callers ask of
//! channels (publish, subscribe, serve, wait), in `subscriptions`; keeping the order of
//! messages whose payloads are fetched from the store, in `ordered`; the rule every reader of a
//! doorbell (a notification that only says "look") follows, in `doorbell`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use actix::prelude::*;

use pgcoord::ident::Ident;
use pgcoord::payload::PayloadStore;
use pgcoord::{Config, Error, ErrorKind, Pool, Result};
use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, Client};

use crate::stats::GetStats;

mod connection;
mod dispatch;
pub(crate) mod doorbell;
mod messages;
mod notify;
mod ordered;
mod round_trip;
mod subscriptions;

pub use messages::*;
pub(crate) use round_trip::AskThrough;

/// How long a connection that ended without an error waits for the request under way to
/// report the server's last words before it reports the end itself.
const CLOSED_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Messages lost on a channel are announced at once, then at most once in this long, all those
/// lost meanwhile in one [`ConnState::MessageLost`].
pub(crate) const LOSS_REPORT_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// One channel this process listens on.
#[derive(Default)]
pub(crate) struct Channel {
    pub(crate) subscribers: Vec<Recipient<Signal>>,
    /// Receivers of the notification text as it is, without an envelope (the lease channel).
    pub(crate) raw: Vec<Recipient<RawNotification>>,
    pub(crate) handler: Option<RequestHandler>,
    /// Messages waiting for an earlier one's stored payload (see `ordered`).
    pub(crate) backlog: ordered::Backlog,
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
    /// The connection's state as last broadcast, told to each new subscriber at once.
    pub(crate) conn_state: Option<ConnState>,
    failures: pgcoord::__private::Failures,
    /// Set by [`Shutdown`]: the supervisor restarts a stopped actor while anyone holds its
    /// address, so a shut-down listener stays idle instead of connecting again.
    shut_down: bool,
    pub(crate) stats: ListenerStats,
    /// Numbers the messages of channel backlogs.
    next_seq: u64,
    /// Fetches of stored payloads under way (see `ordered`).
    fetching: usize,
    /// Channels whose lost messages were announced within the last [`LOSS_REPORT_GAP`]: how
    /// many were lost since, and the last one's error (see `dispatch`).
    losses: HashMap<String, (u64, String)>,
    /// Sends events, requests and replies; started on first use (inside the runtime) and kept
    /// across restarts.
    notifier: Option<notify::Notifier>,
    notify_statements: Arc<AtomicU64>,
    /// Messages read from the listening connection, ever: a ping waits for its answer as long
    /// as this moves (see `connection`).
    pub(crate) heard: Arc<AtomicU64>,
    /// The probes sent on this connection and not heard back yet, by their random value: each
    /// is answered only by its own value (see `connection::ping`), and all are forgotten when the
    /// connection is replaced.
    pub(crate) probes: HashMap<u64, oneshot::Sender<()>>,
    /// Whether a probe was heard back on this connection: until then it is not known to hear.
    pub(crate) heard_back: bool,
    /// Handles of the metrics recorder, registered when the actor first starts.
    metrics: Option<crate::metrics::ListenerMetrics>,
}

/// The pending requests of a listener: reply senders by request id.
pub(crate) type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Vec<u8>>>>>>;

impl ListenerActor {
    /// A listener for `config`; payloads too large for a notification go to `store` (without
    /// one they are [`ErrorKind::PayloadTooLarge`]).
    pub fn new(config: Config, store: Option<Arc<dyn PayloadStore>>) -> ListenerActor {
        let pool = pgcoord::Pool::new(&config);
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
            conn_state: None,
            failures: Default::default(),
            shut_down: false,
            stats: ListenerStats::default(),
            next_seq: 0,
            fetching: 0,
            losses: HashMap::new(),
            notifier: None,
            notify_statements: Arc::default(),
            heard: Arc::default(),
            probes: HashMap::new(),
            heard_back: false,
            metrics: None,
        }
    }

    /// Updates the metrics, once the actor has registered them.
    pub(crate) fn count(&self, update: impl FnOnce(&crate::metrics::ListenerMetrics)) {
        if let Some(metrics) = &self.metrics {
            update(metrics);
        }
    }

    /// The sender of this listener's notifications.
    pub(crate) fn notifier(&mut self) -> notify::Notifier {
        let (pool, sent) = (&self.pool, &self.notify_statements);
        self.notifier
            .get_or_insert_with(|| notify::Notifier::start(pool.clone(), sent.clone()))
            .clone()
    }

    /// Starts the listener under a `Supervisor` in the current actix System. Prefer
    /// [`connect`](Self::connect), which reports a wrong DSN or a standby at once.
    pub fn start_supervised(self) -> Addr<ListenerActor> {
        Supervisor::start(move |_| self)
    }

    /// Checks the server first (reachable, writable, migrated: see
    /// `pgcoord::__private::check_server`), then starts a supervised listener for `config` in the
    /// current actix System: the start that can fail.
    pub async fn connect(
        config: Config,
        store: Option<Arc<dyn PayloadStore>>,
    ) -> Result<Addr<ListenerActor>> {
        pgcoord::__private::check_server(&config).await?;
        Ok(ListenerActor::new(config, store).start_supervised())
    }

    /// The channel this process's replies arrive on.
    pub fn reply_channel(&self) -> &Ident {
        &self.reply_channel
    }
}

impl Actor for ListenerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.shut_down {
            return;
        }
        if self.metrics.is_none() {
            self.metrics = Some(crate::metrics::ListenerMetrics::new());
        }
        // Poll-only: nothing to hear, so no connection. Doorbells registered never ring, and
        // what needs LISTEN is refused (`poll_only_refusal`).
        if self.config.poll_only() {
            return;
        }
        // The first reconnect at once (a connection dropped once is usually back), then the
        // configured backoff: at most 500 ms by default, back within half a second of the server.
        let delay = self.failures.delay(self.config.backoff(), 1);
        if delay.is_zero() {
            self.open(ctx);
        } else {
            ctx.run_later(delay, |act, ctx| act.open(ctx));
        }
        ctx.run_interval(self.config.ping_interval(), |act, ctx| act.ping(ctx));
    }
}

impl Supervised for ListenerActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.client = None;
        self.ready = false;
        self.probes.clear();
        self.heard_back = false;
        // Their timers went with the context; the `Reconnected` to come covers what they would
        // have announced.
        self.losses.clear();
    }
}

impl StreamHandler<std::result::Result<AsyncMessage, tokio_postgres::Error>> for ListenerActor {
    fn handle(
        &mut self,
        message: std::result::Result<AsyncMessage, tokio_postgres::Error>,
        ctx: &mut Context<Self>,
    ) {
        self.heard
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match message {
            Ok(AsyncMessage::Notification(n)) => self.dispatch(n.channel(), n.payload(), ctx),
            Ok(_) => {}
            Err(e) => self.fail(
                ctx,
                ConnState::Disconnected {
                    error: pgcoord::Error::from(e).to_string(),
                },
            ),
        }
    }

    /// The connection ended without an error of its own. When a request was under way (a
    /// ping, a LISTEN) the server's last words ("terminating connection …") went to that
    /// request, whose answer reports them a moment later; this reports only if none did.
    fn finished(&mut self, ctx: &mut Context<Self>) {
        ctx.run_later(CLOSED_GRACE, |act, ctx| {
            act.fail(
                ctx,
                ConnState::Disconnected {
                    error: "connection closed by the server".into(),
                },
            )
        });
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
        // What it would have heard last: connected, or the failure it is recovering from.
        if let Some(state) = &self.conn_state {
            let now = match state {
                ConnState::Reconnected => ConnState::Connected,
                state => state.clone(),
            };
            recipient.do_send(now);
        }
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

impl Handler<GetStats<ListenerStats>> for ListenerActor {
    type Result = ListenerStats;

    fn handle(&mut self, _: GetStats<ListenerStats>, _: &mut Context<Self>) -> ListenerStats {
        ListenerStats {
            pending_requests: self.pending.lock().expect("pending").len(),
            notify_statements: self.notify_statements.load(Ordering::Relaxed),
            listening: self.heard_back
                && matches!(
                    self.conn_state,
                    Some(crate::ConnState::Connected | crate::ConnState::Reconnected)
                ),
            ..self.stats.clone()
        }
    }
}

/// What a poll-only listener answers to what needs LISTEN or NOTIFY.
pub(crate) fn poll_only_refusal(what: &str) -> Error {
    Error::new(
        pgcoord::ErrorKind::Unsupported,
        format!(
            "{what} needs LISTEN/NOTIFY, which poll-only mode (ConfigBuilder::poll_only) turns off"
        ),
    )
}
