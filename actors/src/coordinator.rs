//! [`Coordinator`]: starts the three actors in the current actix System.

use actix::prelude::*;
use pgcoord::payload::PayloadTable;
use pgcoord::{Config, Pool};

use crate::advisory::AdvisoryLocks;
use crate::election::Election;
use crate::leases::LockManager;
use crate::losses::{LockLost, SubscribeLockLost};
use crate::payloads::PayloadStoreActor;
use crate::signals::{ConnState, ListenerActor, SubscribeConnState};
use futures_util::Stream;
use pgcoord::Result;

/// A pool to drain at shutdown, if it still runs.
type Drained = Box<dyn Fn() -> Option<Recipient<crate::Drain>> + Send>;

/// The addresses of a process's pgcoord actors, which share one connection pool.
#[derive(Clone)]
pub struct Coordinator {
    /// Leases.
    pub locks: Addr<LockManager>,
    /// Advisory locks, each on a session of its own (not from the pool).
    pub advisory: Addr<AdvisoryLocks>,
    /// Publish/subscribe and request/reply (supervised).
    pub signals: Addr<ListenerActor>,
    /// The payload store: large payloads put and fetched (fetches bounded to half the pool),
    /// expired rows deleted on a timer.
    pub payloads: Addr<PayloadStoreActor>,
    /// Appends to durable topics, batched ([`Append`](crate::Append)).
    pub topics: Addr<crate::TopicAppender>,
    /// What the actors were started with.
    config: Config,
    /// The pool they share.
    pool: Pool,
    /// The thread they run on: the actors this handle starts later (consumers, retention,
    /// schedules, observers) start there too, so a handle works from any thread (a tokio
    /// service's, through [`Runtime`](crate::Runtime)).
    arbiter: ArbiterHandle,
    /// Worker pools drained by [`shutdown`](Self::shutdown) before anything is released.
    drained: std::sync::Arc<std::sync::Mutex<Vec<Drained>>>,
}

impl Coordinator {
    /// The pool the actors share.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Checks the server, then starts the actors as [`start`](Self::start) does: the start that
    /// can fail. [`pgcoord::ErrorKind::Unavailable`] (with the cause) when the database cannot
    /// be reached within the connect timeout, [`pgcoord::ErrorKind::ReadOnly`] on a standby,
    /// [`pgcoord::ErrorKind::NotFound`] when the tables do not exist (`pgcoord::schema::migrate`),
    /// [`pgcoord::ErrorKind::Unsupported`] outside an actix System (from any tokio runtime, use
    /// [`Runtime`](crate::Runtime)).
    pub async fn connect(config: Config) -> pgcoord::Result<Coordinator> {
        in_actix_system()?;
        pgcoord::__private::check_server(&config).await?;
        Ok(Coordinator::start(config))
    }

    /// Starts a supervised `ListenerActor` with the payload table as its store, a `LockManager`
    /// that hears lease releases through it (so the process has one LISTEN connection), an
    /// `AdvisoryLocks`, a `PayloadStoreActor` (through which the listener puts and fetches large
    /// payloads) and a `TopicAppender`, all over one pool of at most
    /// `config.pool_size()` connections (plus the LISTEN connection, the heartbeat's, and one per
    /// held advisory lock). Must run inside an actix System; the tables must exist
    /// (`pgcoord::schema::migrate`). Nothing is checked: with the database down, everything
    /// starts and becomes usable when it is back. Prefer [`connect`](Self::connect) to learn of a
    /// wrong DSN or missing tables at once.
    pub fn start(config: Config) -> Coordinator {
        let pool = pgcoord::Pool::new(&config);
        Coordinator::start_with_pool(config, pool)
    }

    /// Checks the server, then starts the actors on `pool` as
    /// [`start_with_pool`](Self::start_with_pool) does.
    pub async fn connect_with_pool(config: Config, pool: Pool) -> pgcoord::Result<Coordinator> {
        in_actix_system()?;
        pgcoord::__private::check_server(&config).await?;
        Ok(Coordinator::start_with_pool(config, pool))
    }

    /// Starts the actors as [`start`](Self::start) does, with their statements on `pool`: the
    /// application's own bb8-postgres pool through [`Pool::from_bb8`], so the process keeps one
    /// pool. The dedicated sessions (the LISTEN connection, the heartbeat, advisory locks) still
    /// connect with `config`'s DSN: they hold session state no pool may hand on. The pool may
    /// use any TLS connector; `config.tls()` is the one pgcoord would use (the DSN's `sslmode`).
    ///
    /// ```no_run
    /// # async fn example(config: pgcoord::Config) -> pgcoord::Result<()> {
    /// use pgcoord::bb8;
    /// use pgcoord::bb8_postgres::PostgresConnectionManager;
    /// use pgcoord_actors::Coordinator;
    ///
    /// let manager = PostgresConnectionManager::new(config.pg_config().clone(), config.tls().clone());
    /// let app_pool = bb8::Pool::builder().max_size(8).build(manager).await?;
    /// let pool = pgcoord::Pool::from_bb8(&config, app_pool.clone());
    /// let coordinator = Coordinator::connect_with_pool(config, pool).await?;
    /// # Ok(()) }
    /// ```
    pub fn start_with_pool(config: Config, pool: Pool) -> Coordinator {
        let table = PayloadTable::new(&config, pool.clone());
        let payloads = PayloadStoreActor::for_table(table, &config).start();
        let signals = ListenerActor::with_pool(
            config.clone(),
            pool.clone(),
            Some(PayloadStoreActor::store(payloads.clone())),
        )
        .start_supervised();
        Coordinator {
            // One LISTEN connection per process: lease wake-ups come through the listener.
            locks: LockManager::with_pool(config.clone(), pool.clone(), Some(signals.clone()))
                .start(),
            advisory: AdvisoryLocks::new(config.clone()).start(),
            payloads,
            topics: crate::TopicAppender::new(pgcoord::TopicTable::new(&config), pool.clone())
                .start(),
            signals,
            config,
            pool,
            arbiter: Arbiter::current(),
            drained: Default::default(),
        }
    }

    /// Starts a [`TopicRetention`](crate::TopicRetention) for `topic` in this process: every
    /// `every` (at least 10 ms), the events `retention` no longer keeps are deleted in bounded
    /// batches. Any number of processes may run one for a topic. Until
    /// [`Shutdown`](crate::Shutdown) or the System stops. Typed errors for a bad name, an
    /// interval under 10 ms, or a retention that keeps everything.
    pub fn retain(
        &self,
        topic: impl Into<String>,
        retention: pgcoord::topic::Retention,
        every: std::time::Duration,
    ) -> pgcoord::Result<Addr<crate::TopicRetention>> {
        let topic = pgcoord::config::validate_name("topic", topic.into())?;
        if every < std::time::Duration::from_millis(10) {
            return Err(pgcoord::Error::new(
                pgcoord::ErrorKind::DurationTooSmall,
                format!("a retention's interval {every:?} is shorter than 10 ms"),
            ));
        }
        if retention.max_age.is_none() && retention.max_events.is_none() {
            return Err(pgcoord::Error::new(
                pgcoord::ErrorKind::InvalidConfig,
                "a retention that keeps everything trims nothing: set max_age or max_events",
            ));
        }
        let table = pgcoord::TopicTable::new(&self.config);
        let retention =
            crate::TopicRetention::new(table, self.pool.clone(), topic, retention, every);
        Ok(Actor::start_in_arbiter(&self.arbiter, |_| retention))
    }

    /// Starts a [`TopicConsumer`](crate::TopicConsumer) of durable topic events in this
    /// process, on the actors' pool: it delivers while it holds the consumer's lease, and waits
    /// for it otherwise. Typed errors for a bad name, window or poll, before anything starts.
    /// It runs until it is sent [`Shutdown`](crate::Shutdown) or the System stops
    /// (dropping the address does not stop it: the listener holds it for the doorbell).
    pub fn consume(&self, consume: crate::Consume) -> pgcoord::Result<Addr<crate::TopicConsumer>> {
        consume.check()?;
        let consumer = crate::TopicConsumer::new(
            consume,
            pgcoord::TopicTable::new(&self.config),
            self.pool.clone(),
            self.locks.clone(),
            self.signals.clone(),
        );
        Ok(Actor::start_in_arbiter(&self.arbiter, |_| consumer))
    }

    /// A [`RateLimiter`](crate::RateLimiter) at `rate`, on the actors' pool: fleet-wide rate
    /// limits per key, each take one statement on the server's clock.
    pub fn rate_limiter(&self, rate: pgcoord::rate::RateLimit) -> crate::RateLimiter {
        let table = pgcoord::RateTable::new(&self.config);
        crate::RateLimiter::new(table, self.pool.clone(), rate)
    }

    /// Starts a [`ScheduleRunner`](crate::ScheduleRunner) in this process: with the same
    /// schedule started in every process of the fleet, each tick runs in one of them, once
    /// (see [`Schedule`](crate::Schedule)). Typed errors for a bad name or policy, before
    /// anything starts. Runs until sent [`Shutdown`](crate::Shutdown) (after which it answers
    /// [`GetStats`](crate::GetStats) with its final statistics) or the System stops (dropping
    /// the address does not stop it).
    pub fn schedule(
        &self,
        schedule: crate::Schedule,
    ) -> pgcoord::Result<Addr<crate::ScheduleRunner>> {
        schedule.check()?;
        let runner = crate::ScheduleRunner::new(
            schedule,
            pgcoord::schedule::ScheduleTable::new(&self.config),
            self.pool.clone(),
            self.locks.clone(),
            self.config.owner().to_owned(),
        );
        Ok(Actor::start_in_arbiter(&self.arbiter, |_| runner))
    }

    /// The election `name` run by this process's actors (see [`Election`]).
    /// [`pgcoord::ErrorKind::InvalidName`] for a name a lease could not have.
    pub fn election(&self, name: impl Into<String>) -> pgcoord::Result<Election> {
        Election::new(&self.config, name, self.locks.clone(), self.signals.clone())
            .map(|election| election.on(self.arbiter.clone()))
    }

    /// The thread the actors run on: start an actor of your own there with
    /// `Actor::start_in_arbiter(&coordinator.arbiter(), ..)` (a [`WorkerPool`](crate::WorkerPool),
    /// say) from any thread.
    pub fn arbiter(&self) -> ArbiterHandle {
        self.arbiter.clone()
    }

    /// The configuration the actors were started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Has [`shutdown`](Self::shutdown) drain `pool` first (a
    /// [`WorkerPool`](crate::WorkerPool)'s address as `pool.recipient()`): each of its workers
    /// stopped before its key's lease is released, as [`Drain`](crate::Drain) does, before the
    /// rest of the process's leases go. Without it the shutdown releases the keys' leases with
    /// the others while their workers are being told to stop.
    pub fn drain_on_shutdown(&self, pool: Recipient<crate::Drain>) {
        self.drained
            .lock()
            .expect("pools lock")
            .push(Box::new(move || Some(pool.clone())));
    }

    /// Has [`shutdown`](Self::shutdown) drain `pool` first while it runs, without keeping it
    /// running (a [`Workers`](crate::Workers) handle's pool stops when the handle is dropped).
    pub(crate) fn drain_while_running(&self, pool: actix::WeakRecipient<crate::Drain>) {
        self.drained
            .lock()
            .expect("pools lock")
            .push(Box::new(move || pool.upgrade()));
    }

    /// Stops this process's pgcoord gracefully, within `within`: the worker pools given to
    /// [`drain_on_shutdown`](Self::drain_on_shutdown) drain (their workers stopped, then their keys
    /// released), then every lease it holds is
    /// released on the server (each holder told [`LossReason::Shutdown`](crate::LossReason);
    /// an election this process leads sees its leader go, a consumer of a durable topic stops),
    /// every advisory lock's session is closed (its locks with it), then the lock manager, the
    /// listener, the payload store and the appender stop. From its start nothing more is granted:
    /// a wait under way ends with [`pgcoord::ErrorKind::Unavailable`], as does an acquire sent
    /// after it, and it waits for the releases already under way (of handles dropped just
    /// before, of grants nobody received), so a process that exits when it returns holds
    /// nothing. Answers how many leases were released.
    /// [`pgcoord::ErrorKind::Timeout`] when the releases did not finish within `within` (the
    /// others then expire with their lease). Call it on SIGTERM, before the System stops: a
    /// process that just exits leaves its leases to expire.
    pub async fn shutdown(&self, within: std::time::Duration) -> pgcoord::Result<usize> {
        let deadline = tokio::time::Instant::now() + within;
        let pools = std::mem::take(&mut *self.drained.lock().expect("pools lock"));
        let drains = (pools.iter().filter_map(|pool| pool())).map(|pool| pool.send(crate::Drain));
        // A pool that stopped already answers at once; one that cannot drain in time is
        // released with the rest below.
        let _ = tokio::time::timeout_at(deadline, futures_util::future::join_all(drains)).await;
        let released =
            tokio::time::timeout_at(deadline, self.locks.send(crate::leases::ReleaseAll)).await;
        // Sessions closed by the actor: its locks go with them, at once.
        let _ = tokio::time::timeout_at(deadline, self.advisory.send(crate::Shutdown)).await;
        self.locks.do_send(crate::Shutdown);
        self.topics.do_send(crate::Shutdown);
        self.payloads.do_send(crate::Shutdown);
        self.signals.do_send(crate::Shutdown);
        match released {
            Ok(Ok(released)) => Ok(released),
            Ok(Err(e)) => Err(pgcoord::Error::new(
                pgcoord::ErrorKind::Unavailable,
                format!("the lock manager stopped before the shutdown: {e}"),
            )),
            Err(_) => Err(pgcoord::Error::new(
                pgcoord::ErrorKind::Timeout,
                format!("the leases were not all released within {within:?}; the rest expire"),
            )),
        }
    }
}

/// The streams, for either door: an actix service reads them as a tokio one does.
impl Coordinator {
    /// Every message published on `channel` from now on, and a [`Heard::Gap`](crate::Heard::Gap) wherever some may
    /// have been missed, as a stream. Dropping it unsubscribes. Typed errors for a bad channel
    /// name.
    pub async fn subscribe(&self, channel: &str) -> Result<crate::Subscription> {
        crate::streams::subscription(&self.signals, &self.arbiter, channel).await
    }

    /// Every lock this process loses from now on — leases and advisory locks alike, each once
    /// ([`LockLost`]) — as a stream. Dropping it unsubscribes.
    pub async fn lock_losses(&self) -> Result<impl Stream<Item = LockLost> + Send + Unpin + use<>> {
        let (forwarder, feed) = crate::streams::forward(&self.arbiter(), None);
        crate::streams::told(
            self.locks
                .send(SubscribeLockLost(forwarder.clone().recipient())),
        )
        .await?;
        crate::streams::told(self.advisory.send(SubscribeLockLost(forwarder.recipient()))).await?;
        Ok(feed)
    }

    /// The listener's connection states from now on ([`ConnState`]; the current one first), as
    /// a stream: `Reconnected` and `MessageLost` are what a service resyncs on. Dropping it
    /// unsubscribes.
    pub async fn conn_states(
        &self,
    ) -> Result<impl Stream<Item = ConnState> + Send + Unpin + use<>> {
        let (forwarder, feed) = crate::streams::forward(&self.arbiter(), None);
        crate::streams::told(self.signals.send(SubscribeConnState(forwarder.recipient()))).await?;
        Ok(feed)
    }
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The configuration's own Debug never shows the password.
        f.debug_struct("Coordinator")
            .field("owner", &self.config.owner())
            .field("lock_table", &self.config.lock_table().to_string())
            .finish_non_exhaustive()
    }
}

/// [`ErrorKind::Unsupported`](pgcoord::ErrorKind::Unsupported) outside an actix System, where
/// starting an actor would panic (a plain `#[tokio::main]` has none): it names the door that
/// works there.
fn in_actix_system() -> pgcoord::Result<()> {
    if actix::System::try_current().is_some() {
        return Ok(());
    }
    Err(pgcoord::Error::new(
        pgcoord::ErrorKind::Unsupported,
        "Coordinator::connect runs its actors on the calling thread's actix System, and there is \
         none (a plain tokio runtime, #[tokio::main]): start one (#[actix::main], \
         actix::System::new), or use pgcoord_actors::Runtime::connect, which runs them on a \
         thread of its own and works from any tokio runtime",
    ))
}
