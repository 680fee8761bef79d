//! [`LockManager`]: owns every lease this process holds, their heartbeat, and their waiters.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::{Config, Error, ErrorKind, LeaseInfo, LeaseTable, Pool, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info_span, warn};

use crate::acquire::{AcquireJob, Outcome, Reply, already_held};
use crate::lease::Lease;
use crate::listener::ListenerActor;
use crate::messages::*;
use crate::signal_messages::{ConnState, RawNotification, SubscribeConnState, SubscribeRaw};
use crate::wake::{Queues, spawn_listener};

/// One lease this process holds.
pub(crate) struct Held {
    pub(crate) token: i64,
    pub(crate) keep_on_release: bool,
    /// Monotonic: when the last confirmed (re)grant was sent, plus the lease, minus a margin.
    /// Past it the server may give the lease away, so it is reported lost.
    pub(crate) deadline: Instant,
    pub(crate) lost: watch::Sender<Option<LossReason>>,
}

/// The actor that holds leases: acquires them (waiting FIFO, woken by NOTIFY), renews all of
/// them in one statement per heartbeat, watches each one's monotonic deadline, releases them,
/// and broadcasts [`LockLost`] exactly once per lost lease. Start it inside an actix System with
/// [`LockManager::new`] and `.start()`.
pub struct LockManager {
    pub(crate) config: Config,
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) queues: Arc<Queues>,
    pub(crate) held: HashMap<String, Held>,
    /// The names in `held`, shared with acquires under way (they refuse a name held meanwhile).
    pub(crate) holding: Arc<Mutex<HashSet<String>>>,
    pub(crate) subscribers: Vec<Recipient<LockLost>>,
    /// Our own LISTEN connection for lease wake-ups, when there is no shared listener.
    listener: Option<JoinHandle<()>>,
    /// The process's shared `ListenerActor`, when the manager uses it for wake-ups.
    shared_listener: Option<Addr<ListenerActor>>,
    pub(crate) sessions: HashMap<i64, crate::advisory::Session>,
    /// Advisory keys whose acquire is under way, so a concurrent second acquire is refused.
    pub(crate) pending_keys: std::collections::HashSet<i64>,
    /// Open sessions that hold no lock, kept for reuse.
    pub(crate) idle_sessions: Vec<crate::session::Pinned>,
    pub(crate) renewing: bool,
    /// The heartbeat's own connection: renewals never wait for the pool, so blocked acquires or
    /// a busy application cannot starve them. Reopened when it fails.
    pub(crate) heartbeat: Option<Arc<crate::session::Pinned>>,
    /// Renewals that failed in a row; retries come sooner than the next tick.
    pub(crate) renew_failures: u32,
    pub(crate) stats: ManagerStats,
}

impl LockManager {
    /// A manager for `config`'s lock table. Its tables must exist (see `pgcoord::schema`).
    pub fn new(config: Config) -> LockManager {
        LockManager {
            pool: pgcoord::db::pool(&config),
            table: Arc::new(LeaseTable::new(&config)),
            queues: Arc::default(),
            held: HashMap::new(),
            holding: Arc::default(),
            subscribers: Vec::new(),
            listener: None,
            shared_listener: None,
            sessions: HashMap::new(),
            pending_keys: Default::default(),
            idle_sessions: Vec::new(),
            renewing: false,
            heartbeat: None,
            renew_failures: 0,
            stats: ManagerStats::default(),
            config,
        }
    }

    /// A manager that hears lease releases through the process's `ListenerActor` instead of a
    /// LISTEN connection of its own, keeping one LISTEN connection per process.
    pub fn with_listener(config: Config, listener: Addr<ListenerActor>) -> LockManager {
        LockManager {
            shared_listener: Some(listener),
            ..LockManager::new(config)
        }
    }

    /// Checks the server first, then starts a manager in the current actix System: the start
    /// that can fail. [`ErrorKind::Unavailable`] (with the cause) when the database cannot be
    /// reached within the connect timeout, [`ErrorKind::ReadOnly`] on a standby,
    /// [`ErrorKind::NotFound`] when the tables do not exist (see `pgcoord::schema::migrate`).
    pub async fn connect(config: Config) -> Result<Addr<LockManager>> {
        pgcoord::db::check_server(&config).await?;
        Ok(LockManager::new(config).start())
    }

    /// Records `name` as held.
    pub(crate) fn hold_lease(&mut self, name: String, held: Held) {
        self.holding.lock().expect("holding").insert(name.clone());
        self.held.insert(name, held);
    }

    /// Forgets `name`, returning what was held.
    pub(crate) fn forget_lease(&mut self, name: &str) -> Option<Held> {
        self.holding.lock().expect("holding").remove(name);
        self.held.remove(name)
    }

    /// How much earlier than the server the holder gives a lease up: a tenth of the lease, to
    /// absorb clock-rate differences and the sweep's granularity.
    pub(crate) fn margin(&self) -> Duration {
        (self.config.lease() / 10).max(Duration::from_millis(1))
    }

    /// Records a granted lease and hands its handle to the caller; a caller that went away
    /// gets nothing, and the handle's drop releases the lease at once.
    fn granted(
        &mut self,
        request: &Acquire,
        grant: pgcoord::lease::Grant,
        sent: Instant,
        reply: Option<Reply>,
        ctx: &mut Context<Self>,
    ) {
        let (lost_tx, lost_rx) = watch::channel(None);
        self.stats.granted += 1;
        self.hold_lease(
            request.name.clone(),
            Held {
                token: grant.token,
                keep_on_release: request.keep_on_release,
                deadline: sent + self.config.lease() - self.margin(),
                lost: lost_tx,
            },
        );
        let lease = Lease {
            name: request.name.clone(),
            token: grant.token,
            data: grant.data,
            manager: ctx.address(),
            table: self.table.clone(),
            lost: lost_rx,
            released: false,
        };
        if let Some(reply) = reply
            && let Err(Ok(lease)) = reply.send(Ok(lease))
        {
            debug!(lease = lease.name(), "caller gave up; releasing");
            drop(lease);
        }
    }
}

impl Actor for LockManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Room for bursts (a thousand acquires, wake-ups from the listener) beyond actix's 16.
        ctx.set_mailbox_capacity(4096);
        match &self.shared_listener {
            Some(listener) => {
                let channel = self.config.lease_channel().as_str().to_owned();
                listener.do_send(SubscribeConnState(ctx.address().recipient()));
                let subscribe = listener.send(SubscribeRaw {
                    channel,
                    recipient: ctx.address().recipient(),
                });
                ctx.spawn(subscribe.into_actor(self).map(|result, _, _| match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        warn!(error = %e, "cannot listen for lease releases; waiters poll")
                    }
                    Err(e) => warn!(error = %e, "listener gone; waiters poll"),
                }));
            }
            None => {
                self.listener = Some(spawn_listener(
                    self.config.clone(),
                    self.config.lease_channel().clone(),
                    self.queues.clone(),
                ))
            }
        }
        if let Some(heartbeat) = self.config.heartbeat() {
            ctx.run_interval(heartbeat, |act, ctx| act.renew_all(ctx));
        }
        ctx.run_interval(self.config.ping_interval(), |act, ctx| {
            act.ping_sessions(ctx)
        });
        let sweep = (self.margin() / 2).max(Duration::from_millis(1));
        ctx.run_interval(sweep, |act, _| act.sweep_deadlines());
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(listener) = self.listener.take() {
            listener.abort();
        }
        // Closing an advisory session releases its locks on the server.
        let keys: Vec<i64> = self.sessions.keys().copied().collect();
        self.sessions.clear();
        self.idle_sessions.clear();
        self.heartbeat = None;
        for key in keys {
            self.broadcast(LockLost {
                key: LockKey::Advisory(key),
                token: None,
                reason: LossReason::Shutdown,
            });
        }
        // Release what is still held. The runtime may be shutting down with the System, in
        // which case the leases simply expire on the server.
        let runtime = tokio::runtime::Handle::try_current();
        let names: Vec<String> = self.held.keys().cloned().collect();
        for name in names {
            let held = self.forget_lease(&name).expect("listed above");
            let _ = held.lost.send(Some(LossReason::Shutdown));
            self.broadcast(LockLost {
                key: LockKey::Lease(name.clone()),
                token: Some(held.token),
                reason: LossReason::Shutdown,
            });
            let Ok(runtime) = &runtime else {
                warn!(lease = %name, "lock manager stopped outside a runtime; the lease expires on its own");
                continue;
            };
            let (pool, table) = (self.pool.clone(), self.table.clone());
            runtime.spawn(async move {
                let statements = pool.statements(None);
                if let Err(e) = table
                    .release(&statements, &name, held.token, held.keep_on_release)
                    .await
                {
                    warn!(lease = %name, error = %e, "release at shutdown failed; the lease expires on its own");
                }
            });
        }
    }
}

/// The reply to [`Acquire`]: runs the wait inside the manager, watching the reply channel so a
/// caller that gives up cancels it.
pub struct AcquireResponse(Result<AcquireJob>);

impl MessageResponse<LockManager, Acquire> for AcquireResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<Lease>>>) {
        let job = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        let request = job.request.clone();
        let span = info_span!("acquire", lease = %request.name);
        let wait = async move {
            let mut reply = reply;
            let outcome = job.run(&mut reply).await;
            (outcome, reply)
        };
        let wait = tracing::Instrument::instrument(wait, span);
        ctx.spawn(actix::fut::wrap_future::<_, LockManager>(wait).map(
            move |(outcome, reply), act, ctx| match outcome {
                Outcome::Granted { grant, sent } => act.granted(&request, grant, sent, reply, ctx),
                Outcome::Failed(error) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(error));
                    }
                }
                Outcome::Cancelled => {
                    debug!(lease = %request.name, "acquire cancelled by its caller")
                }
            },
        ));
    }
}

impl Handler<Acquire> for LockManager {
    type Result = AcquireResponse;

    fn handle(&mut self, request: Acquire, _: &mut Context<Self>) -> AcquireResponse {
        if let Err(e) = pgcoord::config::validate_name("lock name", request.name.clone()) {
            return AcquireResponse(Err(e));
        }
        if self.held.contains_key(&request.name) {
            return AcquireResponse(Err(already_held(&request.name)));
        }
        AcquireResponse(Ok(AcquireJob {
            request,
            pool: self.pool.clone(),
            table: self.table.clone(),
            queues: self.queues.clone(),
            holding: self.holding.clone(),
            owner: self.config.owner().to_owned(),
            lease: self.config.lease(),
            poll: (self.config.lease() / 4).max(Duration::from_millis(10)),
        }))
    }
}

impl Handler<Release> for LockManager {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, Release { name, token }: Release, _: &mut Context<Self>) -> Self::Result {
        // Forget it before the statement runs, so a heartbeat in flight that no longer finds
        // the row does not report a loss.
        if self.held.get(&name).is_none_or(|h| h.token != token) {
            let error = Error::new(
                ErrorKind::LockLost,
                format!("lease {name:?} (token {token}) was already released or lost"),
            );
            return Box::pin(actix::fut::ready(Err(error)));
        }
        let held = self.forget_lease(&name).expect("checked above");
        let (pool, table, keep) = (self.pool.clone(), self.table.clone(), held.keep_on_release);
        let statement_name = name.clone();
        // On its own task, so a manager stopping (Shutdown) does not abandon a release it has
        // already taken out of `held`. Bounded by the statement timeout; retried on another
        // connection only when its own was found dead before it was sent (a release that may
        // have run is not repeated: a second run would report the lease lost).
        let release = tokio::spawn(async move {
            let statements = pool.statements(None);
            table
                .release(&statements, &statement_name, token, keep)
                .await
        });
        let release = async move {
            release.await.unwrap_or_else(|e| {
                Err(Error::new(
                    ErrorKind::Other,
                    format!("release task failed: {e}"),
                ))
            })
        };
        Box::pin(release.into_actor(self).map(move |result, act, _| {
            match &result {
                // Gone on the server before we released it: that is a loss, reported once.
                Err(e) if e.is_lock_lost() => act.announce_loss(&name, held, LossReason::TakenOver),
                Err(e) => {
                    warn!(lease = %name, error = %e, "release failed; the lease expires on its own")
                }
                Ok(()) => {}
            }
            act.queues.wake(&name);
            result
        }))
    }
}

impl Handler<Get> for LockManager {
    type Result = ResponseFuture<Result<LeaseInfo>>;

    fn handle(&mut self, Get(name): Get, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // A read: safe to retry on another connection whatever happened to the first.
        Box::pin(async move { table.get(&pool.idempotent(None), &name).await })
    }
}

impl Handler<List> for LockManager {
    type Result = ResponseFuture<Result<Vec<LeaseInfo>>>;

    fn handle(&mut self, _: List, _: &mut Context<Self>) -> Self::Result {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        // A read: safe to retry on another connection whatever happened to the first.
        Box::pin(async move { table.list(&pool.idempotent(None)).await })
    }
}

impl Handler<RenewNow> for LockManager {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, _: RenewNow, ctx: &mut Context<Self>) -> Self::Result {
        self.renew_all(ctx);
        Box::pin(actix::fut::ready(Ok(())))
    }
}

impl Handler<SubscribeLockLost> for LockManager {
    type Result = ();

    fn handle(&mut self, SubscribeLockLost(recipient): SubscribeLockLost, _: &mut Context<Self>) {
        self.subscribers.push(recipient);
    }
}

impl Handler<GetStats> for LockManager {
    type Result = ManagerStats;

    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> ManagerStats {
        ManagerStats {
            held: self.held.len(),
            ..self.stats.clone()
        }
    }
}

impl Handler<RawNotification> for LockManager {
    type Result = ();

    fn handle(&mut self, released: RawNotification, _: &mut Context<Self>) {
        self.queues.wake(&released.payload);
    }
}

impl Handler<ConnState> for LockManager {
    type Result = ();

    fn handle(&mut self, state: ConnState, _: &mut Context<Self>) {
        // Releases announced while the listener was away were missed: everyone retries.
        if matches!(state, ConnState::Connected | ConnState::Reconnected) {
            self.queues.wake_all();
        }
    }
}

impl Handler<Shutdown> for LockManager {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
