//! Starting a [`Coordinator`] on PostgreSQL (its actors, in the current actix System), and what
//! only the actors do: their addresses, elections, schedules, retention, the graceful shutdown.

use actix::prelude::*;
use pgcoord::payload::PayloadTable;
use pgcoord::{Config, Pool};

use crate::advisory::AdvisoryLocks;
use crate::backend::{Actors, Coordinator, Door};
use crate::election::Election;
use crate::leases::LockManager;
use crate::payloads::PayloadStoreActor;
use crate::signals::ListenerActor;
use pgcoord::Result;

impl Coordinator {
    /// The actors, or [`pgcoord::ErrorKind::Unsupported`] in memory, naming `what` needs them.
    pub(crate) fn actors(&self, what: &str) -> Result<&Actors> {
        self.door.postgres().ok_or_else(|| {
            pgcoord::Error::new(
                pgcoord::ErrorKind::Unsupported,
                format!("{what} needs PostgreSQL: the in-memory backend runs no actors"),
            )
        })
    }

    /// The lock manager's address, for actix code (`addr.send(Acquire)`, [`SubscribeLockLost`](crate::SubscribeLockLost)).
    /// [`pgcoord::ErrorKind::Unsupported`] on the in-memory backend, which runs no actors: code
    /// that runs on both uses the coordinator's own methods.
    pub fn locks(&self) -> Result<&Addr<LockManager>> {
        Ok(&self.actors("the lock manager's address")?.locks)
    }

    /// The advisory locks' actor ([`AdvisoryLock`](crate::AdvisoryLock)); PostgreSQL only, as
    /// [`locks`](Self::locks).
    pub fn advisory(&self) -> Result<&Addr<AdvisoryLocks>> {
        Ok(&self.actors("advisory locks")?.advisory)
    }

    /// The listener's address (publish/subscribe, serving, [`SubscribeConnState`](crate::SubscribeConnState)); PostgreSQL
    /// only, as [`locks`](Self::locks).
    pub fn signals(&self) -> Result<&Addr<ListenerActor>> {
        Ok(&self.actors("the listener's address")?.signals)
    }

    /// The payload store's address; PostgreSQL only, as [`locks`](Self::locks).
    pub fn payloads(&self) -> Result<&Addr<PayloadStoreActor>> {
        Ok(&self.actors("the payload store's address")?.payloads)
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
    /// payloads) and a topic appender, all over one pool of at most
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
        let actors = Actors {
            // One LISTEN connection per process: lease wake-ups come through the listener.
            locks: LockManager::with_pool(config.clone(), pool.clone(), Some(signals.clone()))
                .start(),
            advisory: AdvisoryLocks::new(config.clone()).start(),
            payloads,
            topics: crate::topics::TopicAppender::new(
                pgcoord::TopicTable::new(&config),
                pool.clone(),
            )
            .start(),
            signals,
            config,
            pool,
            arbiter: Arbiter::current(),
            drained: Default::default(),
        };
        Coordinator {
            door: Door::Postgres(std::sync::Arc::new(actors)),
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
        let actors = self.actors("topic retention")?;
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
        let table = pgcoord::TopicTable::new(&actors.config);
        let retention =
            crate::TopicRetention::new(table, actors.pool.clone(), topic, retention, every);
        Ok(Actor::start_in_arbiter(&actors.arbiter, |_| retention))
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
        let actors = self.actors("schedules")?;
        schedule.check()?;
        let runner = crate::ScheduleRunner::new(
            schedule,
            pgcoord::schedule::ScheduleTable::new(&actors.config),
            actors.pool.clone(),
            actors.locks.clone(),
            actors.config.owner().to_owned(),
        );
        Ok(Actor::start_in_arbiter(&actors.arbiter, |_| runner))
    }

    /// The election `name` run by this process's actors (see [`Election`]).
    /// [`pgcoord::ErrorKind::InvalidName`] for a name a lease could not have.
    pub fn election(&self, name: impl Into<String>) -> pgcoord::Result<Election> {
        let actors = self.actors("elections")?;
        Election::new(
            &actors.config,
            name,
            actors.locks.clone(),
            actors.signals.clone(),
        )
        .map(|election| election.on(actors.arbiter.clone()))
    }

    /// The thread the actors run on: start an actor of your own there with
    /// `Actor::start_in_arbiter(&coordinator.arbiter()?, ..)` (a [`WorkerPool`](crate::WorkerPool),
    /// say) from any thread. PostgreSQL only, as [`locks`](Self::locks).
    pub fn arbiter(&self) -> Result<ArbiterHandle> {
        Ok(self.actors("the actors' thread")?.arbiter.clone())
    }

    /// The configuration the actors were started with; PostgreSQL only, as
    /// [`locks`](Self::locks).
    pub fn config(&self) -> Result<&Config> {
        Ok(&self.actors("a configuration")?.config)
    }

    /// Has [`shutdown`](Self::shutdown) drain `pool` first (a
    /// [`WorkerPool`](crate::WorkerPool)'s address as `pool.recipient()`): each of its workers
    /// stopped before its key's lease is released, as [`Drain`](crate::Drain) does, before the
    /// rest of the process's leases go. Without it the shutdown releases the keys' leases with
    /// the others while their workers are being told to stop. PostgreSQL only, as
    /// [`shutdown`](Self::shutdown).
    pub fn drain_on_shutdown(&self, pool: Recipient<crate::Drain>) -> Result<()> {
        let actors = self.actors("a shutdown")?;
        let mut drained = actors.drained.lock().unwrap_or_else(|e| e.into_inner());
        drained.push(Box::new(move || Some(pool.clone())));
        Ok(())
    }

    /// Has [`shutdown`](Self::shutdown) drain `pool` first while it runs, without keeping it
    /// running (a [`Workers`](crate::Workers) handle's pool stops when the handle is dropped).
    pub(crate) fn drain_while_running(actors: &Actors, pool: actix::WeakRecipient<crate::Drain>) {
        actors
            .drained
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
        let actors = self.actors("a shutdown")?;
        let deadline = tokio::time::Instant::now() + within;
        let pools = std::mem::take(&mut *actors.drained.lock().unwrap_or_else(|e| e.into_inner()));
        let drains = (pools.iter().filter_map(|pool| pool())).map(|pool| pool.send(crate::Drain));
        // A pool that stopped already answers at once; one that cannot drain in time is
        // released with the rest below.
        let _ = tokio::time::timeout_at(deadline, futures_util::future::join_all(drains)).await;
        let released =
            tokio::time::timeout_at(deadline, actors.locks.send(crate::leases::ReleaseAll)).await;
        // Sessions closed by the actor: its locks go with them, at once.
        let _ = tokio::time::timeout_at(deadline, actors.advisory.send(crate::Shutdown)).await;
        actors.locks.do_send(crate::Shutdown);
        actors.topics.do_send(crate::Shutdown);
        actors.payloads.do_send(crate::Shutdown);
        actors.signals.do_send(crate::Shutdown);
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
