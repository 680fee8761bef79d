//! [`Schedule`]: a tick of a schedule runs once across the fleet, on the server's clock.
//!
//! Every process that runs the schedule wakes at each tick and tries its lease,
//! `"schedules/{name}"`, without waiting. The one that gets it reads the runs table and the
//! server's time ([`pgcoord::schedule::plan`] says what is due), claims the tick under its
//! lease's token (a row unique per tick), runs the handler with a [`Tick`], records the outcome,
//! and releases the lease. The others find it taken and look again when its holder's lease
//! would run out, so a process that dies mid-run has its tick started again by another within
//! about a lease. A [`Tick::complete`] in the handler's own transaction (fenced by the lease
//! and the tick's row) marks the tick done with its effects: they commit once, or not at all.
//!
//! Nothing is decided on the process's own clock: ticks are due by the server's `now()`, and
//! the process only sleeps (on its monotonic clock) until the server time it computed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use pgcoord::schedule::{CatchUp, Policy, ScheduleTable, Timing};
use pgcoord::{Error, ErrorKind, Pool, Result};
use tokio::sync::Notify;

use crate::GetStats;
use crate::leases::{Lease, LockManager};

mod run;

/// What a schedule's handler returns: `Ok` to mark the tick done, `Err` (why) to have it
/// started again after the policy's backoff, while attempts are left.
pub type TickResult = std::result::Result<(), String>;

/// A schedule's handler: one tick at a time.
pub type TickHandler =
    Arc<dyn Fn(Tick) -> Pin<Box<dyn Future<Output = TickResult> + Send>> + Send + Sync>;

/// A schedule: built with [`Schedule::new`], started with
/// [`Coordinator::schedule`](crate::Coordinator::schedule) in every process that may run it.
pub struct Schedule {
    pub(crate) name: String,
    pub(crate) timing: Timing,
    pub(crate) policy: Policy,
    pub(crate) jitter: Duration,
    pub(crate) history: u32,
    pub(crate) run_within: Option<Duration>,
    pub(crate) handler: TickHandler,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("timing", &self.timing.to_string())
            .field("policy", &self.policy)
            .field("jitter", &self.jitter)
            .field("history", &self.history)
            .field("run_within", &self.run_within)
            .finish_non_exhaustive()
    }
}

impl Schedule {
    /// The schedule `name` (1 to 245 bytes), ticking at `timing`, running `handler` once per
    /// tick across the fleet. Missed ticks fold into one ([`CatchUp::Latest`]); a tick is
    /// started up to 3 times, retried after 1 s, then 2 s; no jitter; the newest 100 ticks
    /// are kept in the runs table. A run is not bounded: see [`Schedule::run_within`].
    pub fn new<F, Fut>(name: impl Into<String>, timing: Timing, handler: F) -> Schedule
    where
        F: Fn(Tick) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TickResult> + Send + 'static,
    {
        Schedule {
            name: name.into(),
            timing,
            policy: Policy::default(),
            jitter: Duration::ZERO,
            history: 100,
            run_within: None,
            handler: Arc::new(move |tick| Box::pin(handler(tick))),
        }
    }

    /// What happens to ticks nobody ran at their time.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Schedule {
        self.policy.catch_up = catch_up;
        self
    }

    /// How many times a tick is started before it is abandoned (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Schedule {
        self.policy.max_attempts = attempts;
        self
    }

    /// The wait before the first retry; doubled for each one after, up to 64 times.
    pub fn retry_backoff(mut self, backoff: Duration) -> Schedule {
        self.policy.retry_backoff = backoff;
        self
    }

    /// Each process waits a random part of `jitter` after a tick before it tries: the fleet's
    /// tries spread, and so does the run's start.
    pub fn jitter(mut self, jitter: Duration) -> Schedule {
        self.jitter = jitter;
        self
    }

    /// How many of the newest ticks the runs table keeps (at least 1).
    pub fn history(mut self, ticks: u32) -> Schedule {
        self.history = ticks;
        self
    }

    /// The longest a run may take. Past it the handler's future is dropped and the tick marked
    /// failed (retried per the policy), so a handler that hangs does not hold the schedule up
    /// for the whole fleet; a [`Tick::fence`] or [`Tick::complete`] that comes later fails and
    /// its transaction must not commit. Without it a run takes as long as its handler, and
    /// [`Shutdown`](crate::Shutdown) waits for it. Tasks the handler spawned are its own: dropping its
    /// future does not stop them, and a [`Tick`] they keep does not hold the schedule's lease:
    /// the runner releases it when its tenure ends (nothing more is due), and the Tick's fence
    /// fails from then on (before that, the tick's row already refuses it).
    pub fn run_within(mut self, bound: Duration) -> Schedule {
        self.run_within = Some(bound);
        self
    }

    /// The schedule's lease: `"schedules/{name}"`.
    pub fn lease_name(&self) -> String {
        format!("schedules/{}", self.name)
    }

    pub(crate) fn check(&self) -> Result<()> {
        pgcoord::config::validate_name("schedule", self.name.clone())?;
        pgcoord::config::validate_name("schedule lease", self.lease_name())?;
        let invalid = |what: String| Err(Error::new(ErrorKind::InvalidConfig, what));
        if self.policy.max_attempts == 0 {
            return invalid("a schedule's max_attempts is at least 1".into());
        }
        if self.history == 0 {
            return invalid("a schedule's history keeps at least 1 tick".into());
        }
        if self.run_within == Some(Duration::ZERO) {
            return invalid("a schedule's run_within is more than zero".into());
        }
        if let CatchUp::Each { max: 0 } = self.policy.catch_up {
            return invalid("CatchUp::Each runs at least 1 missed tick".into());
        }
        Ok(())
    }
}

/// One tick handed to a schedule's handler, for one attempt. Its lease is the schedule's:
/// while its fence holds ([`Tick::fence`]), no other run of this tick counts.
pub struct Tick {
    schedule: Arc<str>,
    at: SystemTime,
    attempt: u32,
    lease: Arc<Lease>,
    table: Arc<ScheduleTable>,
    next: Option<SystemTime>,
}

impl std::fmt::Debug for Tick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tick")
            .field("schedule", &self.schedule)
            .field("at", &self.at)
            .field("attempt", &self.attempt)
            .field("token", &self.lease.token())
            .finish()
    }
}

impl Tick {
    /// The schedule's name.
    pub fn schedule(&self) -> &str {
        &self.schedule
    }
    /// The tick's instant, on the server's clock: the same for every attempt.
    pub fn at(&self) -> SystemTime {
        self.at
    }
    /// Which start of this tick this is: 1, then 2 for its first retry, …
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// The schedule lease's fencing token this attempt runs under.
    pub fn token(&self) -> i64 {
        self.lease.token()
    }
    /// The schedule's lease, for [`Lease::lost`] and the like.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
    /// The fencing guard of this run, inside `tx`: fails unless this attempt still holds the
    /// schedule's lease and is the tick's current, unfinished run, and keeps both so until `tx`
    /// ends; a second transaction of the same run waits for the first. Keep such transactions
    /// short: the runner's finish and release wait for them. [`pgcoord::ErrorKind::LockLost`]
    /// when the lease was lost or released, or the tick was taken over, started again, or this
    /// run ended without being done (it failed, or passed its [`Schedule::run_within`]);
    /// [`pgcoord::ErrorKind::AlreadyAcknowledged`] when the tick is done already (a
    /// transaction that completed it committed, or the handler returned `Ok`: complete before
    /// the handler returns). On any error `tx` must not commit.
    pub async fn fence(&self, tx: &(impl pgcoord::Statements + ?Sized)) -> Result<()> {
        // The run first: a done run says so even after the lease is gone (its effects did
        // commit), and the lease's fence, when it fails, aborts `tx`.
        self.table
            .fence(tx, &self.schedule, self.at, self.token(), self.attempt)
            .await?;
        self.lease.fence(tx).await
    }
    /// Fences `tx` (see [`Tick::fence`]) and marks the tick done in it: the tick is done if
    /// and only if `tx` commits, so its effects in `tx` are applied once. On an error `tx` must
    /// not commit.
    pub async fn complete(&self, tx: &(impl pgcoord::Statements + ?Sized)) -> Result<()> {
        // The run's fence and its mark, in one call of the migrations' function (which other
        // drivers call too); then the lease's fence. Either one's failure aborts `tx`.
        self.table
            .complete(
                tx,
                &self.schedule,
                self.at,
                self.token(),
                self.attempt,
                self.next,
            )
            .await?;
        self.lease.fence(tx).await
    }
}

/// What a schedule has done in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct ScheduleStats {
    /// Ticks this process started (retries included).
    pub started: u64,
    /// Of those, runs that left the tick done.
    pub done: u64,
    /// Runs whose handler returned `Err`, panicked or passed its [`Schedule::run_within`].
    pub failed: u64,
    /// Ticks this process marked abandoned.
    pub abandoned: u64,
    /// Runs that no longer counted when they finished: another process had taken the tick
    /// over.
    pub taken_over: u64,
    /// Tries that found another process holding the schedule's lease.
    pub busy: u64,
}

/// What the loop shares with its actor.
pub(crate) struct Shared {
    pub(crate) schedule: Schedule,
    pub(crate) table: Arc<ScheduleTable>,
    pub(crate) pool: Pool,
    pub(crate) locks: Addr<LockManager>,
    pub(crate) owner: String,
    pub(crate) stats: Mutex<ScheduleStats>,
    pub(crate) metrics: crate::metrics::ScheduleMetrics,
    // Set by a stop; the loop reads it between ticks (a schedule that is behind never sleeps)
    // and `stopping` wakes it from its sleep.
    pub(crate) stop_asked: AtomicBool,
    pub(crate) stopping: Notify,
}

impl Shared {
    fn stop(&self) {
        self.stop_asked.store(true, Ordering::Relaxed);
        self.stopping.notify_one();
    }

    pub(crate) fn stop_asked(&self) -> bool {
        self.stop_asked.load(Ordering::Relaxed)
    }
}

/// A schedule in this process; see the module docs. Start it with
/// [`Coordinator::schedule`](crate::Coordinator::schedule).
pub struct ScheduleRunner {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
    // Its own address, so dropping the caller's does not stop the schedule: only
    // `Shutdown` (or the System's end) does.
    me: Option<Addr<ScheduleRunner>>,
}

impl ScheduleRunner {
    pub(crate) fn new(
        schedule: Schedule,
        table: ScheduleTable,
        pool: Pool,
        locks: Addr<LockManager>,
        owner: String,
    ) -> ScheduleRunner {
        let metrics = crate::metrics::ScheduleMetrics::new(&schedule.name);
        ScheduleRunner {
            shared: Arc::new(Shared {
                metrics,
                schedule,
                table: Arc::new(table),
                pool,
                locks,
                owner,
                stats: Mutex::default(),
                stop_asked: AtomicBool::new(false),
                stopping: Notify::new(),
            }),
            task: None,
            me: None,
        }
    }
}

impl Actor for ScheduleRunner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.me = Some(ctx.address());
        self.task = Some(tokio::spawn(run::run(self.shared.clone())));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // The loop finishes the run in hand and releases the lease as it ends.
        self.shared.stop();
        self.task.take();
    }
}

impl Handler<GetStats<ScheduleStats>> for ScheduleRunner {
    type Result = ScheduleStats;

    fn handle(&mut self, _: GetStats<ScheduleStats>, _: &mut Context<Self>) -> ScheduleStats {
        self.shared.stats.lock().expect("stats lock").clone()
    }
}

/// Stops the schedule: a run under way is finished (within the schedule's
/// [`Schedule::run_within`], when it has one) and the lease released before it answers. The
/// runner then answers [`GetStats`] with its final statistics until its last address is dropped.
impl Handler<crate::losses::Shutdown> for ScheduleRunner {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: crate::losses::Shutdown, _: &mut Context<Self>) -> Self::Result {
        // Without its own address the runner stops once nobody else holds one.
        self.me = None;
        self.shared.stop();
        let task = self.task.take();
        Box::pin(async move {
            if let Some(task) = task {
                let _ = task.await;
            }
        })
    }
}
