//! [`LockManager`]: owns every lease this process holds, their heartbeat, and their waiters.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, LeaseTable, Pool, Result};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::losses::{LockKey, LockLost, LossReason, LossSubscribers, Shutdown, SubscribeLockLost};
use crate::signals::{ListenerActor, SubscribeConnState, SubscribeRaw};
use crate::stats::GetStats;
use acquire::Reply;
pub(crate) use wake::Queues;

mod acquire;
mod announced;
mod batch;
mod claim;
mod heartbeat;
mod lease;
mod listing;
mod messages;
mod release;
mod semaphore;
mod unclaimed;
mod wait;
mod wake;
mod with_lock;

#[cfg(feature = "memory")]
pub(crate) use acquire::already_held;
#[cfg(feature = "memory")]
pub(crate) use lease::{LeaseHolder, LeaseKeeper};

pub use claim::Claim;
pub use lease::Lease;
pub use listing::ListPrefix;
pub use messages::*;
pub use semaphore::{AcquirePermit, PermitResponse};
pub use wait::AcquireResponse;
pub use with_lock::with_lock;

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
    /// Keyed by shared names, so that a heartbeat tick copies no name.
    pub(crate) held: HashMap<Arc<str>, Held>,
    /// The names in `held`, shared with acquires under way (they refuse a name held meanwhile).
    pub(crate) holding: Arc<Mutex<HashSet<Arc<str>>>>,
    pub(crate) subscribers: LossSubscribers,
    /// Whether the listener was started by this manager (and is stopped with it).
    own_listener: bool,
    /// The `ListenerActor` that hears lease releases: the process's, or this manager's own.
    shared_listener: Option<Addr<ListenerActor>>,
    pub(crate) renewing: bool,
    /// The heartbeat's own connection: renewals never wait for the pool, so blocked acquires or
    /// a busy application cannot starve them. Reopened when it fails.
    pub(crate) heartbeat: Option<Arc<crate::session::Pinned>>,
    /// Renewals that failed in a row; retries come sooner than the next tick.
    pub(crate) renew_failures: u32,
    pub(crate) stats: ManagerStats,
    /// Sends concurrent first attempts as one statement; started with the actor.
    pub(crate) batcher: Option<batch::acquire::AcquireBatcher>,
    /// Sends releases, concurrent ones as one statement; started with the actor.
    releaser: Option<batch::release::Releaser>,
    /// Acquire statements sent (by jobs and the batcher, outside the actor).
    pub(crate) acquire_statements: Arc<AtomicU64>,
    /// Release statements sent (outside the actor).
    release_statements: Arc<AtomicU64>,
    /// How the leases handed to this process were taken (by jobs, outside the actor).
    pub(crate) handovers: Arc<unclaimed::HandoverCounts>,
    /// Tokens granted here lately: a late handover announcement of one is not given back.
    recent_grants: unclaimed::RecentGrants,
    /// The owner identity, shared by every lease handle (their fencing guards match it).
    owner: Arc<str>,
    /// Handles of the metrics recorder, registered when the actor starts.
    pub(crate) metrics: Option<crate::metrics::LeaseMetrics>,
    /// The lock table's oid, looked up when the actor starts (and again when the listener
    /// connects, until known): handovers name it. Unknown, a handover to this owner only wakes
    /// the waiter, which finds the lease its own and takes it from the table. (A table dropped
    /// and created again under a running manager has a new oid: its handovers are then taken
    /// at the waiter's next poll, the same way.)
    table_oid: Option<u32>,
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
            subscribers: LossSubscribers::new(config.owner()),
            own_listener: true,
            shared_listener: None,
            renewing: false,
            heartbeat: None,
            renew_failures: 0,
            stats: ManagerStats::default(),
            batcher: None,
            releaser: None,
            acquire_statements: Arc::default(),
            release_statements: Arc::default(),
            handovers: Arc::default(),
            recent_grants: Default::default(),
            owner: config.owner().into(),
            metrics: None,
            table_oid: None,
            config,
        }
    }

    /// A manager that hears lease releases through the process's `ListenerActor` instead of a
    /// LISTEN connection of its own, keeping one LISTEN connection per process.
    pub fn with_listener(config: Config, listener: Addr<ListenerActor>) -> LockManager {
        LockManager {
            shared_listener: Some(listener),
            own_listener: false,
            ..LockManager::new(config)
        }
    }

    /// A manager over `pool` (shared with other actors), hearing lease releases through
    /// `listener` when given.
    pub fn with_pool(
        config: Config,
        pool: Pool,
        listener: Option<Addr<ListenerActor>>,
    ) -> LockManager {
        LockManager {
            pool,
            own_listener: listener.is_none(),
            shared_listener: listener,
            ..LockManager::new(config)
        }
    }

    /// Checks the server first, then starts a manager in the current actix System: the start
    /// that can fail. [`ErrorKind::Unavailable`](pgcoord::ErrorKind::Unavailable) (with the cause) when the database cannot be
    /// reached within the connect timeout, [`ErrorKind::ReadOnly`](pgcoord::ErrorKind::ReadOnly) on a standby,
    /// [`ErrorKind::NotFound`](pgcoord::ErrorKind::NotFound) when the tables do not exist (see `pgcoord::schema::migrate`).
    pub async fn connect(config: Config) -> Result<Addr<LockManager>> {
        pgcoord::db::check_server(&config).await?;
        Ok(LockManager::new(config).start())
    }

    /// Records `name` as held.
    pub(crate) fn hold_lease(&mut self, name: Arc<str>, held: Held) {
        self.recent_grants.remember(held.token);
        self.holding.lock().expect("holding").insert(name.clone());
        self.held.insert(name, held);
        self.count_held();
    }

    /// Forgets `name`, returning what was held.
    pub(crate) fn forget_lease(&mut self, name: &str) -> Option<Held> {
        self.holding.lock().expect("holding").remove(name);
        let held = self.held.remove(name);
        self.count_held();
        held
    }

    fn count_held(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.held.set(self.held.len() as f64);
        }
    }

    /// Counts how an acquire (or a permit's) ended, `arrived` being when its message did.
    pub(crate) fn count_acquire(&self, outcome: &acquire::Outcome, arrived: Instant) {
        let Some(metrics) = &self.metrics else { return };
        match outcome {
            acquire::Outcome::Granted { .. } => metrics.granted(arrived.elapsed()),
            acquire::Outcome::Failed(error) => metrics.failed(error),
            acquire::Outcome::Cancelled => metrics.cancelled(),
        }
    }

    /// How much earlier than the server the holder gives a lease up: a tenth of the lease, to
    /// absorb clock-rate differences and the sweep's granularity.
    pub(crate) fn margin(&self) -> Duration {
        (self.config.lease() / 10).max(Duration::from_millis(1))
    }

    /// Records a granted lease and hands its handle to the caller; a caller that went away
    /// gets nothing, and the handle's drop releases the lease at once.
    pub(crate) fn granted(
        &mut self,
        name: String,
        keep_on_release: bool,
        grant: pgcoord::lease::Grant,
        sent: Instant,
        reply: Option<Reply>,
        ctx: &mut Context<Self>,
    ) {
        let lease = self.lease_for(name, keep_on_release, grant, sent, ctx);
        if let Some(reply) = reply
            && let Err(Ok(lease)) = reply.send(Ok(lease))
        {
            debug!(lease = lease.name(), "caller gave up; releasing");
            drop(lease);
        }
    }

    /// Records a granted lease and returns its handle.
    pub(crate) fn lease_for(
        &mut self,
        name: String,
        keep_on_release: bool,
        grant: pgcoord::lease::Grant,
        sent: Instant,
        ctx: &mut Context<Self>,
    ) -> Lease {
        let (lost_tx, lost_rx) = watch::channel(None);
        self.stats.granted += 1;
        self.hold_lease(
            Arc::from(name.as_str()),
            Held {
                token: grant.token,
                keep_on_release,
                deadline: sent + self.config.lease() - self.margin(),
                lost: lost_tx,
            },
        );
        Lease {
            name,
            token: grant.token,
            data: grant.data,
            holder: lease::LeaseHolder::Postgres {
                manager: ctx.address(),
                table: self.table.clone(),
                owner: self.owner.clone(),
            },
            lost: lost_rx,
            released: false,
        }
    }
}

impl Actor for LockManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Room for bursts (a thousand acquires, wake-ups from the listener) beyond actix's 16.
        ctx.set_mailbox_capacity(4096);
        self.metrics = Some(crate::metrics::LeaseMetrics::new(self.config.owner()));
        self.batcher = Some(crate::batch::Batcher::start(
            Arc::new(batch::acquire::AcquireRunner {
                pool: self.pool.clone(),
                table: self.table.clone(),
                owner: self.config.owner().to_owned(),
                lease: self.config.lease(),
                statements_sent: self.acquire_statements.clone(),
            }),
            crate::batch::LEASES_BATCH_FROM,
        ));
        self.releaser = Some(batch::release::Releaser::start(
            self.pool.clone(),
            self.table.clone(),
            self.config.owner().to_owned(),
            self.release_statements.clone(),
        ));
        // Releases are announced on the lease channel. Heard through the process's listener
        // when there is one; otherwise through a listener of this manager's own — the same
        // supervised actor, so there is one way to LISTEN. Waiters poll besides, in case.
        let listener = self.shared_listener.get_or_insert_with(|| {
            ListenerActor::with_pool(self.config.clone(), self.pool.clone(), None)
                .start_supervised()
        });
        let channel = self.config.lease_channel().as_str().to_owned();
        listener.do_send(SubscribeConnState(ctx.address().recipient()));
        let subscribe = listener.send(SubscribeRaw {
            channel,
            recipient: ctx.address().recipient(),
        });
        ctx.spawn(subscribe.into_actor(self).map(|result, _, _| match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot listen for lease releases; waiters poll"),
            Err(e) => warn!(error = %e, "listener gone; waiters poll"),
        }));
        self.look_up_table_oid(ctx);
        if let Some(heartbeat) = self.config.heartbeat() {
            ctx.run_interval(heartbeat, |act, ctx| act.renew_all(ctx));
        }
        let sweep = (self.margin() / 2).max(Duration::from_millis(1));
        ctx.run_interval(sweep, |act, _| act.sweep_deadlines());
        // The pool's gauges, once a second.
        ctx.run_interval(Duration::from_secs(1), |act, _| {
            if let Some(metrics) = &act.metrics {
                metrics.pool(act.pool.connections());
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let (true, Some(listener)) = (self.own_listener, self.shared_listener.take()) {
            listener.do_send(Shutdown);
        }
        self.heartbeat = None;
        // Release what is still held. The runtime may be shutting down with the System, in
        // which case the leases simply expire on the server.
        let runtime = tokio::runtime::Handle::try_current();
        let names: Vec<Arc<str>> = self.held.keys().cloned().collect();
        for name in names {
            let held = self.forget_lease(&name).expect("listed above");
            let _ = held.lost.send(Some(LossReason::Shutdown));
            self.subscribers.broadcast(LockLost {
                key: LockKey::Lease(name.to_string()),
                token: Some(held.token),
                reason: LossReason::Shutdown,
            });
            let Ok(runtime) = &runtime else {
                warn!(lease = %name, "lock manager stopped outside a runtime; the lease expires on its own");
                continue;
            };
            let Some(releaser) = self.releaser.clone() else {
                continue;
            };
            // One task per lease, so that thousands of them go out batched.
            runtime.spawn(async move {
                if let Err(e) = releaser
                    .release(name.clone(), held.token, held.keep_on_release)
                    .await
                {
                    warn!(lease = %name, error = %e, "release at shutdown failed; the lease expires on its own");
                }
            });
        }
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
        self.subscribers.add(recipient);
    }
}

impl Handler<GetStats<ManagerStats>> for LockManager {
    type Result = ManagerStats;

    fn handle(&mut self, _: GetStats<ManagerStats>, _: &mut Context<Self>) -> ManagerStats {
        ManagerStats {
            held: self.held.len(),
            acquire_statements: self.acquire_statements.load(Ordering::Relaxed),
            release_statements: self.release_statements.load(Ordering::Relaxed),
            handovers_from_announcement: (self.handovers.from_announcement).load(Ordering::Relaxed),
            handovers_from_row: self.handovers.from_row.load(Ordering::Relaxed),
            ..self.stats.clone()
        }
    }
}

impl Handler<Shutdown> for LockManager {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
