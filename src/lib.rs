//! pgcoord: coordination for services that already run PostgreSQL — leases with fencing tokens,
//! advisory locks and signals — without Redis, etcd or ZooKeeper.
//!
//! This crate is the core: it says what is true in the database, as plain async functions on
//! `Send` futures usable from any tokio runtime. It has no timers and holds nothing; the actix
//! runtime that holds leases and decides when to renew them is the `pgcoord-actors` crate.
//!
//! One lease, by its statements (the runtime sends these for you, and renews in between):
//!
//! ```no_run
//! use std::time::Duration;
//! use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
//! use pgcoord::{Config, LeaseTable};
//!
//! # async fn once(config: &Config, client: &mut tokio_postgres::Client) -> pgcoord::Result<()> {
//! let table = LeaseTable::new(config);
//! let me = table.owner("worker-7")?; // every grant, renewal, release and fence is this owner's
//! let request = AcquireRequest::new("nightly");
//! if let Attempt::Granted(grant) = me.try_acquire(&*client, &request, Duration::from_secs(20)).await? {
//!     let tx = client.transaction().await?;
//!     me.fence(&tx, "nightly", grant.token).await?; // exclusive until this transaction ends
//!     // ... the writes the lease guards ...
//!     tx.commit().await?;
//!     let release = ReleaseRequest { name: "nightly", token: grant.token, keep: false, announce_always: false };
//!     me.release(&*client, &release).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Layout:
//! - [`config`] — [`Config`], built and validated once.
//! - `backoff` — [`db::Backoff`], the one jittered backoff (configurable), and its randomness.
//! - [`error`] — [`Error`] and its [`ErrorKind`]s, classified from SQLSTATE and connection state.
//! - [`ident`] — validation and quoting of table, schema and channel names.
//! - [`db`] — connections that fail: the [`Pool`] (dead connections replaced before use, prompt
//!   reconnects, the cause of every `Unavailable`), dedicated connections bounded by the connect
//!   timeout, bounded statements (cancelled on the server and discarded past their deadline),
//!   the fallible start's server check, retry of transient conflicts.
//! - `statement` — [`Statements`], what every statement function runs on (your client or
//!   transaction, or the pool's bounded statements): prepared once per pooled connection,
//!   typed elsewhere. Sealed: pgcoord's own statements are the only ones it runs.
//! - [`tls`] — `sslmode`, `sslrootcert`, `sslcert`, `sslkey` and `sslpassword` as libpq has them,
//!   and [`Tls`], the connector of every connection (rustls with the `tls` feature, on by
//!   default).
//! - [`schema`] — the migrations in `migrations/`, for default or custom names.
//! - [`sessions`] — the database's sessions by `application_name`: who is connected, since when.
//! - [`advisory`] — advisory lock statements for pinned sessions, key derivation, ping.
//! - [`lease`] — lease statements: acquire, renew in one batch, release, inspect, fence.
//! - [`election`] — leaders as lease holders: the proclamation stored and announced at once.
//! - [`signal`] — the notification envelope, its text encoding and measurement, NOTIFY.
//! - [`payload`] — [`payload::PayloadStore`] and the [`payload::PayloadTable`] behind it.
//! - [`rate`] — fleet-wide rate limits per key: [`rate::RateLimit`] and the one statement of
//!   [`RateTable`] that takes from a key's bucket on the server's clock.
//! - [`schedule`] — schedules: [`schedule::Timing`] (every period, or cron), the pure plan of
//!   which tick is due, the runs table whose row per tick makes a tick that is done stay done.
//! - [`topic`] — durable topics: append inside the caller's transaction, read in order without
//!   gaps, consumers' cursors acked with their effects, retention.
//! - `sqlx` (feature `sqlx`) — fence, append, ack and complete inside sqlx
//!   transactions.
#![deny(missing_docs)]

pub mod advisory;
mod backoff;
pub mod config;
pub mod db;
pub mod election;
pub mod error;
pub mod ident;
pub mod lease;
mod made;
pub mod payload;
pub mod rate;
pub mod schedule;
pub mod schema;
pub mod sessions;
pub mod signal;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod statement;
pub mod tls;
pub mod topic;

/// The versions of bb8, bb8-postgres and tokio-postgres pgcoord is built with, for building a
/// pool to share with it ([`Pool::from_bb8`]) without a version mismatch.
pub use {bb8, bb8_postgres, tokio_postgres};

/// The rustls pgcoord is built with, for [`ConfigBuilder::tls_client_config`].
#[cfg(feature = "tls")]
pub use rustls;

pub use config::{Config, ConfigBuilder};
pub use db::Pool;
pub use error::{Error, ErrorKind, Holder, Result};
pub use lease::{LeaseInfo, LeaseTable};
pub use rate::RateTable;
pub use statement::{BoxFuture, Statements};
pub use tls::{SslMode, Tls};
pub use topic::TopicTable;

/// Not part of the API: the plumbing `pgcoord-actors`, the `pgcoord` command and the tests share
/// with the core (sessions, bounded statements, startup checks, retries). It changes in any
/// release without notice; nothing here is covered by semver.
#[doc(hidden)]
pub mod __private {
    pub use crate::backoff::{Failures, warn_due};
    pub use crate::db::borrowed::Borrowed;
    pub use crate::db::bounded::{Until, run_until, until};
    pub use crate::db::check::{check_reachable, check_server};
    pub use crate::db::connect::{Dedicated, connect, connect_as, ping};
    pub use crate::db::fresh::{IDLE_CHECK_AFTER, answers};
    pub use crate::db::pool::{Manager, Pooled};
    pub use crate::db::retry::{RETRY_ATTEMPTS, backoff, retry};
    pub use crate::made::{event, holder, lease_info, limit_change};
    pub use crate::statement::{CachingClient, Param, Sealed, Session, cancel};
}
