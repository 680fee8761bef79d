//! [`LockManager`]: owns every lease this process holds, their heartbeat, and their waiters.
//!
//! - `messages` — every message the manager answers, and [`ManagerStats`].
//! - `lease` — [`Lease`], the handle of a held lease, and its `Keeper` (the backend that ends
//!   its tenure and guards writes with it); `with_lock`.
//! - `book` — the holding side's decisions (pure): the leases held with their monotonic
//!   deadlines, what a renewal asks for, what its answer means, which deadlines passed.
//! - `held` — the leases held: the book, loss signals, the names held as waits see them.
//! - `heartbeat` — the book's I/O: one renew statement per tick for all of them, the deadline
//!   sweep, loss reports.
//! - `one_wait` — one wait's decisions (pure): which statement next, what an answer means, the nap.
//! - `wait` — one wait's I/O loop, shared by leases (`acquire`) and permits (`permit`).
//! - `queues` — the local FIFO turn per name, and wake-ups.
//! - `announced` — what the lease channel says: a doorbell that wakes the waiter in line.
//! - `release`, `claim`, `listing` — the other handlers; `batch` — group commit.
//! - `context` — what every wait shares; the counters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, LeaseTable, Pool, Result};
use tracing::warn;

use crate::losses::{LossReason, LossSubscribers, Shutdown, SubscribeLockLost};
use crate::signals::{ListenerActor, SubscribeConnState, SubscribeRaw};
use crate::stats::GetStats;
use context::WaitContext;
use counters::Counters;
use heartbeat::Heartbeat;
use held::{Held, Holdings, OnRelease};

// The in-memory backend's leases refuse and check as these do (`already_held`, `checked_lease`),
// and are kept by a `lease::Keeper` of their own.
pub(crate) mod acquire;
mod announced;
mod batch;
pub(crate) mod book;
mod claim;
mod context;
mod counters;
mod heartbeat;
pub(crate) mod held;
pub(crate) mod lease;
mod listing;
mod messages;
pub(crate) mod one_wait;
mod permit;
mod queues;
mod release;
mod settle;
mod stopping;
mod under_way;
mod wait;
mod with_lock;

// A router reaches holders through its manager's notices (`crate::workers::reach`).
pub(crate) use batch::notify::HolderNotices;
pub use held::MAX_LEASE;
pub use lease::Lease;
pub use messages::{Acquire, AcquirePermit, Claim, ManagerStats, Release, SetLimit};
pub(crate) use messages::{Get, GetLimit, ListPrefix, ReleaseAll};
pub use with_lock::with_lock;

/// The actor that holds leases: acquires them (waiting FIFO, woken by NOTIFY), renews all of
/// them in one statement per heartbeat, watches each one's monotonic deadline, releases them,
/// and broadcasts [`LockLost`](crate::LockLost) exactly once per lost lease. Start it with
/// [`LockManager::connect`], which checks the server first (or inside a `Coordinator`).
pub struct LockManager {
    config: Config,
    pool: Pool,
    table: Arc<LeaseTable>,
    /// The owner identity, shared by every lease handle (their fencing guards match it).
    owner: Arc<str>,
    holdings: Holdings,
    heartbeat: Heartbeat,
    subscribers: LossSubscribers,
    /// What every wait shares; made when the actor starts (its batcher needs the runtime).
    context: Option<Arc<WaitContext>>,
    counters: Arc<Counters>,
    /// The `ListenerActor` that hears lease releases: the process's, or this manager's own.
    listener: Option<Addr<ListenerActor>>,
    /// Whether the listener was started by this manager (and is stopped with it).
    own_listener: bool,
    /// Handles of the metrics recorder, registered when the actor starts.
    pub(crate) metrics: Option<crate::metrics::LeaseMetrics>,
    /// Sends to leases' holders (for routers); made on first use.
    notices: Option<HolderNotices>,
    /// The keeper every lease handle shares while any is held: one address of the manager for
    /// all of them (each address costs 72 bytes, the keeper 64 more, a lease).
    keeper: std::sync::Weak<lease::ManagerKeeper>,
}

impl LockManager {
    /// A manager for `config`'s lock table, with a pool and a LISTEN connection of its own.
    /// Its tables must exist (see `pgcoord::schema`). Start it inside an actix System; prefer
    /// [`connect`](Self::connect), which reports a wrong DSN or missing tables at once.
    pub fn new(config: Config) -> LockManager {
        LockManager {
            pool: pgcoord::Pool::new(&config),
            table: Arc::new(LeaseTable::new(&config)),
            owner: config.owner().into(),
            holdings: Holdings::default(),
            heartbeat: Heartbeat::default(),
            subscribers: LossSubscribers::new(),
            context: None,
            counters: Arc::default(),
            listener: None,
            own_listener: true,
            metrics: None,
            notices: None,
            keeper: std::sync::Weak::new(),
            config,
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
            listener,
            ..LockManager::new(config)
        }
    }

    /// Checks the server first, then starts a manager in the current actix System: the start
    /// that can fail. [`ErrorKind::Unavailable`](pgcoord::ErrorKind::Unavailable) (with the
    /// cause) when the database cannot be reached within the connect timeout,
    /// [`ErrorKind::Tls`](pgcoord::ErrorKind::Tls) for a certificate it cannot trust,
    /// [`ErrorKind::ReadOnly`](pgcoord::ErrorKind::ReadOnly) on a standby,
    /// [`ErrorKind::NotFound`](pgcoord::ErrorKind::NotFound) when the tables do not exist (see
    /// `pgcoord::schema::migrate`).
    pub async fn connect(config: Config) -> Result<Addr<LockManager>> {
        pgcoord::__private::check_server(&config).await?;
        Ok(LockManager::new(config).start())
    }

    /// Whether `name` is held here with `token`.
    pub(crate) fn holds(&self, name: &str, token: i64) -> bool {
        self.holdings.holds(name, token)
    }

    /// The manager's sender to leases' holders, shared by every router of it (their notices
    /// batch together). Made on first use: its batching task needs the runtime.
    pub(crate) fn holder_notices(&mut self) -> HolderNotices {
        let (pool, table) = (&self.pool, &self.table);
        (self
            .notices
            .get_or_insert_with(|| HolderNotices::start(pool.clone(), table.clone())))
        .clone()
    }

    /// The manager's config.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// What every wait shares: the pool, the table and the owner among it.
    pub(crate) fn context(&self) -> Arc<WaitContext> {
        self.context.clone().expect("made when the actor started")
    }

    fn count_held(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.held.set(self.holdings.len() as f64);
        }
    }

    /// Counts how a wait ended, `arrived` being when its message did.
    fn count_acquire(&self, outcome: &wait::Outcome, arrived: Instant) {
        let Some(metrics) = &self.metrics else { return };
        match outcome {
            wait::Outcome::Granted(_) => metrics.granted(arrived.elapsed()),
            wait::Outcome::Failed(error) => metrics.failed(error),
            wait::Outcome::Cancelled => metrics.cancelled(),
        }
    }

    /// Records a lease granted for `lease`, its deadline counted from `sent`, and returns its
    /// handle.
    fn lease_for(
        &mut self,
        name: Arc<str>,
        on_release: OnRelease,
        grant: pgcoord::lease::Grant,
        (sent, lease): (Instant, Duration),
        ctx: &mut Context<Self>,
    ) -> Lease {
        let (held, tenure) = Held::new(on_release);
        Counters::add(&self.counters.granted);
        if let Some((token, replaced)) =
            self.holdings
                .insert(name.clone(), grant.token, (sent, lease), held)
        {
            // Never, by the turns of names; said if it were, never silent.
            self.announce_loss(&name, token, replaced, LossReason::TakenOver);
        }
        self.count_held();
        let keeper = self.keeper.upgrade().unwrap_or_else(|| {
            let keeper = Arc::new(lease::ManagerKeeper {
                manager: ctx.address(),
                table: self.table.clone(),
                owner: self.owner.clone(),
            });
            self.keeper = Arc::downgrade(&keeper);
            keeper
        });
        Lease {
            name,
            token: grant.token,
            data: grant.data,
            holder: keeper,
            tenure,
            released: false,
        }
    }
}

impl Actor for LockManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Room for bursts (a thousand acquires, wake-ups from the listener) beyond actix's 16.
        ctx.set_mailbox_capacity(4096);
        self.metrics = Some(crate::metrics::LeaseMetrics::new(&self.pool));
        let under_way = under_way::UnderWay::default();
        let releaser = batch::release::Releaser::start(
            self.pool.clone(),
            self.table.clone(),
            self.owner.clone(),
            self.counters.clone(),
            under_way.clone(),
        );
        let batcher = crate::batch::Batcher::start(
            Arc::new(batch::acquire::AcquireRunner {
                pool: self.pool.clone(),
                table: self.table.clone(),
                owner: self.owner.clone(),
                lease: self.config.lease(),
                counters: self.counters.clone(),
                releaser: releaser.clone(),
            }),
            crate::batch::WRITES_BATCH_FROM,
            pgcoord::lease::MAX_NAMES_PER_STATEMENT,
        );
        self.context = Some(Arc::new(WaitContext {
            pool: self.pool.clone(),
            table: self.table.clone(),
            owner: self.owner.clone(),
            lease: self.config.lease(),
            poll: poll_interval(&self.config),
            queues: Arc::default(),
            held: self.holdings.names(),
            batcher,
            releaser,
            counters: self.counters.clone(),
            limits: Default::default(),
            under_way,
            contended: Default::default(),
        }));
        // Poll-only: no doorbell; waiters look again at their poll.
        if !self.config.poll_only() {
            self.listen(ctx);
        }
        if let Some(heartbeat) = self.config.heartbeat() {
            ctx.run_interval(heartbeat, |act, ctx| act.renew_all(ctx));
        }
        // Every lease is at least the manager's (see `Acquire::lease`): its margin at least this.
        let sweep = book::sweep_every(self.config.lease());
        ctx.run_interval(sweep, |act, _| act.sweep_deadlines(Instant::now()));
        // Places in line whose waiter is gone, once a lease: reaped within a lease of lapsing.
        ctx.run_interval(self.config.lease(), |act, _| act.reap_lapsed_places());
        // The pool's gauges, once a second.
        ctx.run_interval(Duration::from_secs(1), |act, _| {
            if let Some(metrics) = &act.metrics {
                metrics.pool(&act.pool);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let (true, Some(listener)) = (self.own_listener, self.listener.take()) {
            listener.do_send(Shutdown);
        }
        self.heartbeat = Heartbeat::default();
        self.release_left_in_background();
    }
}

impl Handler<crate::RunNow> for LockManager {
    type Result = Result<u64>;

    fn handle(&mut self, _: crate::RunNow, ctx: &mut Context<Self>) -> Result<u64> {
        self.renew_all(ctx);
        Ok(self.holdings.len() as u64)
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
        let counters = &self.counters;
        ManagerStats {
            held: self.holdings.len(),
            renew_statements: Counters::get(&counters.renew_statements),
            renew_failures: Counters::get(&counters.renew_failures),
            granted: Counters::get(&counters.granted),
            acquire_statements: Counters::get(&counters.acquire_statements),
            release_statements: Counters::get(&counters.release_statements),
            read_statements: Counters::get(&counters.read_statements),
            lost: Counters::get(&counters.lost),
            renewals_failing: self.heartbeat.failures(),
            woken_all: Counters::get(&counters.woken_all),
        }
    }
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("owner", &self.owner)
            .field("held", &self.holdings.len())
            .finish_non_exhaustive()
    }
}

/// How often a waiter looks again without a doorbell: a quarter lease, at most a second in
/// poll-only mode (where nothing else wakes it).
pub(crate) fn poll_interval(config: &pgcoord::Config) -> Duration {
    let poll = (config.lease() / 4).max(Duration::from_millis(10));
    match config.poll_only() {
        true => poll.min(Duration::from_secs(1)),
        false => poll,
    }
}

/// Subscribes the manager to the lease channel and the listener's state.
impl LockManager {
    fn listen(&mut self, ctx: &mut Context<Self>) {
        // Heard through the process's listener when there is one; otherwise through a listener
        // of this manager's own — the same supervised actor, so there is one way to LISTEN.
        // Waiters poll besides, in case.
        let listener = self.listener.get_or_insert_with(|| {
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
    }
}
