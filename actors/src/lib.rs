//! pgcoord-actors: the actix runtime of pgcoord. The core crate says what is true in the
//! database; the actors here decide when to ask, and own everything with a lifetime.
//!
//! ```no_run
//! use std::time::Duration;
//! use pgcoord_actors::{Acquire, Coordinator};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Inside an actix System (`#[actix::main]`).
//! let config = pgcoord::Config::builder().dsn("host=db user=app dbname=app").build()?;
//! let coordinator = Coordinator::connect(config).await?; // checks the server first
//! let lease = coordinator.acquire(Acquire::new("nightly").timeout(Duration::from_secs(5))).await?;
//! let lost = lease.lost(); // Some(reason) if it is lost before it is released
//! // ... fence the work's writes with `lease.fence(&tx)` ...
//! lease.release().await?;
//! assert_eq!(lost.await, None);
//! # Ok(()) }
//! ```
//!
//! Every capability, with its code, is in `docs/GUIDE.md`; the protocols and their safety
//! argument in `docs/DESIGN.md`; deployment in `docs/OPERATIONS.md`.
//!
//! Layout — one actor per concept, each in its folder, owning its state privately; every public
//! type is re-exported here, and only here:
//! - `leases` — [`LockManager`]: held leases, the heartbeat (one renew statement per tick, on
//!   a connection of its own), monotonic deadlines, waiters; [`Lease`], the handle of a held
//!   lease (token, data, fencing guard, loss signal; released when dropped); [`with_lock`].
//! - `advisory` — [`AdvisoryLocks`]: advisory locks on dedicated, pinged sessions;
//!   [`AdvisoryGuard`], released when dropped.
//! - `signals` — [`ListenerActor`]: the process's one LISTEN connection, supervised and
//!   reconnecting, with [`ConnState`] broadcasts; publish/subscribe, serving, request/reply.
//! - `payloads` — [`PayloadStoreActor`]: owns the store of payloads too large for a
//!   notification — puts, fetches (bounded at once), expiry.
//! - `election` — [`Election`]: leader election on leases — campaign, [`Leadership`] (token,
//!   value, proclaim, resign, loss), who leads now, and an observer told of every change ([`Election::observe`], [`Election::changes`]).
//! - `workers` — [`WorkerPool`]: one worker actor per key across the fleet, keys shared fairly
//!   by leases, each worker given its key's lease to fence with; [`KeyRouter`]: a message to a
//!   key's worker wherever it runs (at most once); [`Mail`]: a key's durable mail, appended in
//!   the sender's transaction, handed to its worker at least once and in order; [`TaskPool`],
//!   a pool whose workers are async closures, and [`Workers`], its handle.
//! - `topics` — [`TopicConsumer`]: a durable topic's named consumer, one active instance
//!   across the fleet (a lease), delivering at least once, in order; [`Delivery::ack`] in the
//!   handler's transaction applies each event once; `Coordinator::append`, appends batched
//!   (group commit). Appending in the caller's transaction is the core's
//!   (`pgcoord::topic::TopicTable::append`).
//! - `rates` — [`RateLimiter`]: fleet-wide rate limits per key, each take one statement on the
//!   server's clock, a wait for room bounded by the caller's timeout.
//! - `schedules` — [`Schedule`]: each tick runs once across the fleet on the server's clock,
//!   under the schedule's lease; [`Tick::complete`] marks it done in the run's transaction.
//! - `coordinator` — [`Coordinator`]: starts them all over one pool, and hands out their
//!   addresses (the actix door: `coordinator.locks()?.send(Acquire)`); [`Health`], what
//!   `coordinator.health(within)` finds for a readiness endpoint.
//! - [`Runtime`] — the same on a thread of its own, for a service that is not actix (axum,
//!   tonic under `#[tokio::main]`): the tokio door to the same house.
//! - `streams` — what the actors tell recipients, as a `Stream` on either door: a channel's
//!   [`Subscription`] (with [`Heard::Gap`] where messages may have been missed), losses,
//!   connection states, leaders ([`Election::changes`]), members ([`Workers::members`]).
//! - [`backend`] — the one front door: the [`Coordinator`]'s methods (`acquire`, `publish`,
//!   `subscribe`, `append`, `consume`, …), answered on PostgreSQL by the actors and in memory by
//!   `backend::memory` (feature `memory`), for unit tests of applications' code; one private
//!   seam per concern behind them.
//! - `losses` — what the lock actors broadcast: [`LockLost`], [`LockKey`], [`LossReason`];
//!   [`SubscribeLockLost`] and [`Shutdown`], which both answer.
//! - [`Call`] — `addr.call(message).await?`: one `?` where actix's `send` needs two.
//! - [`GetStats`] — one message for every actor's counters.
//! - [`metrics`] — the same counters, and gauges and latencies, through the `metrics` facade.
//! - `session` (private) — dedicated connections (advisory sessions, the heartbeat).
//! - `reply` (private) — noticing a caller that gave up, for replies that outlive handlers.
//! - `batch` (private) — group commit: requests of one actor under way at the same moment share
//!   a statement (acquires, releases, notifications).
#![deny(missing_docs)]

// The README's, the tour's and the operations guide's examples are doctests (`cargo test
// --doc`): they compile, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeExamples;

#[cfg(doctest)]
#[doc = include_str!("../../docs/GUIDE.md")]
struct GuideExamples;

#[cfg(doctest)]
#[doc = include_str!("../../docs/OPERATIONS.md")]
struct OperationsExamples;

mod advisory;
pub mod backend;
mod batch;
mod call;
mod coordinator;
mod election;
mod health;
mod leases;
mod losses;
pub mod metrics;
#[cfg(test)]
mod models;
mod payloads;
mod rates;
mod reply;
mod run_now;
mod schedules;
mod seam;
mod session;
mod signals;
mod stats;
mod streams;
mod threaded;
mod topics;
mod workers;

// What a user must name beside this crate's types, so that one dependency line suffices: the
// core crate itself (`pgcoord_actors::pgcoord::topic::TopicTable`), its configuration and errors,
// and the payload type of a `Signal`.
pub use bytes::Bytes;
pub use pgcoord::{self, Config, Error, ErrorKind, Result};

pub use advisory::{AdvisoryGuard, AdvisoryLock, AdvisoryLocks, AdvisoryStats};
pub use backend::door::Coordinator;
pub use call::Call;
pub use election::{Election, Leader, LeaderChanged, Leadership};
pub use health::Health;
pub use leases::{
    Acquire, AcquirePermit, Claim, Lease, LockManager, MAX_LEASE, ManagerStats, SetLimit, with_lock,
};
pub use losses::{LockKey, LockLost, LossReason, Shutdown, SubscribeLockLost};
pub use payloads::PayloadStoreActor;
pub use rates::RateLimiter;
pub use run_now::RunNow;
pub use schedules::{Schedule, ScheduleRunner, ScheduleStats, Tick, TickHandler, TickResult};
pub use signals::{
    Ask, ConnState, HandlerResult, ListenerActor, ListenerStats, ListeningChannels, Publish,
    RequestHandler, Serve, Signal, Subscribe, SubscribeConnState, Unsubscribe,
};
pub use stats::GetStats;
pub use streams::{Heard, Subscription};
pub use threaded::Runtime;
pub use topics::{
    Consume, ConsumeHandler, ConsumeResult, ConsumerStats, Delivery, TopicConsumer, TopicRetention,
};
pub use workers::{
    Assignment, Drain, KeyRouter, Mail, MembersChanged, Routed, TaskPool, WorkerKey, WorkerPool,
    Workers, mail_topic,
};
