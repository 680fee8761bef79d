//! Lease statements: acquire, renew (batched), release, inspect, and the fencing guard.
//!
//! Each function is one statement, decided on the server's clock, and safe to call from any
//! number of processes at once. The runtime that holds leases and decides when to call these is
//! `LockManager` in `pgcoord-actors`.
//!
//! - [`LeaseTable`] — the statements of one configured table, rendered once; inspection
//!   ([`get`](LeaseTable::get), [`list`](LeaseTable::list), [`holder`](LeaseTable::holder));
//!   reaching a lease's holder ([`notify_holder`](LeaseTable::notify_holder), [`holder_channel`]).
//! - [`LeaseOwner`] — the table bound to one owner ([`LeaseTable::owner`]): everything that
//!   grants, renews, releases or fences.
//! - [`AcquireRequest`], [`ReleaseRequest`] — one lease's request, alone or in a batch.
//! - [`Released`] — what a release announces on the lease channel: a doorbell, never a grant.
//! - semaphores — [`slot_names`], [`LeaseOwner::try_acquire_any`]; with a stored, changeable
//!   limit: [`LeaseTable::set_limit`], [`LeaseOwner::try_acquire_limited`].
//!
//! Invariants the statements keep:
//! - a grant happens only where the row is free or expired on the server's clock, and only to
//!   the waiter first in line when someone waits;
//! - every grant draws a new fencing token from the table's `NO CYCLE` sequence, while it holds
//!   the name's grant lock (grants of one name never overlap in time), so a later tenure's token is
//!   greater; it stays the same for the whole tenure;
//! - renew, release and the fence touch a row only where name, token **and** owner match (the
//!   fence's SQL function may be called without the owner, from other drivers: a token names one
//!   tenure);
//!   renew never inserts, never steals, and never revives an expired lease;
//! - a takeover never keeps the previous holder's data; only a kept row's data is kept.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::config::validate_name;
use crate::error::{Error, ErrorKind, Holder, Result};
use crate::statement::Statements;

mod batch;
mod holder_channel;
mod limit;
mod look;
mod owner;
mod release;
mod semaphore;
mod sql;
mod statements;

pub use batch::{AcquireRequest, MAX_NAMES_PER_STATEMENT};
use holder_channel::HOLDER_CHANNEL_PREFIX;
pub use holder_channel::holder_channel;
pub use limit::{LimitChange, LimitedAttempt, MAX_LIMITS_LISTED};
pub use owner::LeaseOwner;
pub use release::{ReleaseRequest, Released};
pub use semaphore::{MAX_PERMITS, SlotAttempt, slot_names};

/// A lease granted by an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of this tenure.
    pub token: i64,
    /// The lock's data after the grant: a kept row's unless replaced, else the request's.
    pub data: Option<Vec<u8>>,
}

/// The outcome of one acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The lease is ours.
    Granted(Grant),
    /// Someone else holds it; `None` when it is free but another waiter is first in line.
    Held(Option<Holder>),
    /// Another transaction has the lock's row locked — a holder's fencing guard, a concurrent
    /// attempt, a DBA's open transaction — or another grant statement of the name is running,
    /// so the attempt did not wait for it. Try again later.
    Busy,
}

/// What [`LeaseTable::get`] and [`LeaseTable::list`] report about a lock. Inspection only: it
/// grants nothing and may be stale by the time it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The lock's name.
    pub name: String,
    /// The holder's owner identity; `None` while the lock is free (a kept row).
    pub owner: Option<String>,
    /// The holder's fencing token; `None` while free.
    pub token: Option<i64>,
    /// The lock's data.
    pub data: Option<Vec<u8>>,
    /// Time left on the holder's lease by the server's clock; `None` while free, zero once
    /// expired.
    pub remaining: Option<Duration>,
}

impl LeaseInfo {
    /// The lock's data decoded from MessagePack (as written by a typed acquire); `None` when
    /// there is none.
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>> {
        self.data
            .as_deref()
            .map(crate::signal::from_payload)
            .transpose()
    }

    /// True while an owner holds an unexpired lease.
    pub fn is_held(&self) -> bool {
        self.remaining.is_some_and(|r| !r.is_zero())
    }
}

/// The lease statements for one configured table, rendered once.
#[derive(Debug, Clone)]
pub struct LeaseTable {
    acquire: String,
    acquire_or_queue: String,
    acquire_many: String,
    acquire_any: String,
    count_held: String,
    leave_line: String,
    owned: String,
    holder: String,
    renew: String,
    release: String,
    release_many: String,
    get: String,
    list: String,
    list_prefix: String,
    line: String,
    list_and_line: String,
    notify_holder: String,
    notify_holders: String,
    keep_free: String,
    reap_places: String,
    fence: String,
    limits: limit::LimitStatements,
    pub(crate) proclaim: String,
    pub(crate) request_resign: String,
    pub(crate) resign_requested: String,
    sequence: String,
    channel: String,
    /// Poll-only mode: nothing notifies, so nothing can reach a holder.
    poll_only: bool,
    pub(crate) election_channel: String,
}

impl LeaseTable {
    /// The channel on which releases are announced; its payloads are read by [`Released::parse`].
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The SQL text of the statement `name`: `acquire`, `renew`, `release`, `fence`, and the
    /// stored limits' `limit_set`, `limit_take_back`, `limit_acquire`. Not part of the API: the
    /// isolation tests run the statements themselves, in the interleavings they choose.
    #[doc(hidden)]
    pub fn sql_text(&self, name: &str) -> Option<&str> {
        Some(match name {
            "acquire" => &self.acquire,
            "acquire_or_queue" => &self.acquire_or_queue,
            "acquire_many" => &self.acquire_many,
            "acquire_any" => &self.acquire_any,
            "renew" => &self.renew,
            "release" => &self.release,
            "release_many" => &self.release_many,
            "fence" => &self.fence,
            _ => return self.limits.sql_text(name),
        })
    }

    /// The statements of `owner` (1 to 255 bytes, no NUL): every grant, renewal, release and
    /// fence made through it matches that owner.
    pub fn owner<'t>(&'t self, owner: &'t str) -> Result<LeaseOwner<'t>> {
        check_name(owner)?;
        Ok(LeaseOwner { table: self, owner })
    }

    /// The current holder of `name`, if any.
    pub async fn holder(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
    ) -> Result<Option<Holder>> {
        let rows = client.run(&self.holder, &[(&name, Type::TEXT)]).await?;
        holder_from(rows.first())
    }

    /// Records `name` as a free, kept row (as a release with keep leaves one) when it has no row;
    /// nothing when it is held or has a row already. True when recorded now. Grants nothing: a
    /// name to be found by [`list_prefix`](Self::list_prefix) — a worker pool's key that came to
    /// life on a message, say.
    pub async fn keep_free(&self, client: &(impl Statements + ?Sized), name: &str) -> Result<bool> {
        check_name(name)?;
        let rows = client.run(&self.keep_free, &[(&name, Type::TEXT)]).await?;
        Ok(!rows.is_empty())
    }

    /// Deletes up to 1,000 places in the waiters' line that lapsed — their waiter stopped asking,
    /// its process gone without leaving the line — as an attempt of the same name would prune
    /// them; answers how many. A lapsed place is already ignored by every grant: this only keeps
    /// the line's table from keeping what nobody will prune. Safe to repeat.
    pub async fn reap_lapsed_places(&self, client: &(impl Statements + ?Sized)) -> Result<u64> {
        let rows = client.run(&self.reap_places, &[]).await?;
        let reaped: i64 = rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0);
        Ok(reaped as u64)
    }

    /// The lock `name`, held or kept; [`ErrorKind::NotFound`] when there is no row.
    pub async fn get(&self, client: &(impl Statements + ?Sized), name: &str) -> Result<LeaseInfo> {
        check_name(name)?;
        let rows = client.run(&self.get, &[(&name, Type::TEXT)]).await?;
        match rows.first() {
            Some(row) => info_at(row, 0),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("lock {name:?} not found"),
            )),
        }
    }

    /// Every lock in the table, by name.
    pub async fn list(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<LeaseInfo>> {
        let rows = client.run(&self.list, &[]).await?;
        rows.iter().map(|row| info_at(row, 0)).collect()
    }

    /// The live places in the waiters' line, name by name, each name's first to be served first:
    /// at most
    /// [`MAX_PLACES_LISTED`].
    pub async fn line(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<Place>> {
        let rows = client.run(&self.line, &[]).await?;
        (rows.iter())
            .map(|row| look::place_from(row, [0, 1, 2, 3, 4]))
            .collect()
    }

    /// Every lock whose name starts with `prefix` (taken literally), by name: the members and
    /// keys of a worker pool, say.
    pub async fn list_prefix(
        &self,
        client: &(impl Statements + ?Sized),
        prefix: &str,
    ) -> Result<Vec<LeaseInfo>> {
        let rows = client
            .run(&self.list_prefix, &[(&prefix, Type::TEXT)])
            .await?;
        rows.iter().map(|row| info_at(row, 0)).collect()
    }
}

/// How many places in line [`LeaseTable::line`] lists at most.
pub const MAX_PLACES_LISTED: usize = 1000;

/// A place in a lease's line of waiters, as [`LeaseTable::line`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Place {
    /// The lease waited for.
    pub name: String,
    /// Who waits (the waiting manager's owner identity).
    pub waiter: String,
    /// Its priority: a higher one is served first, arrival order among equals.
    pub priority: i32,
    /// How long it has been in line (on the server's clock).
    pub waited: Duration,
    /// How long the place lasts unless its waiter comes back (a waiter refreshes it while it
    /// waits: a place that lapses is a waiter gone).
    pub left: Duration,
}

/// How much earlier than the server a holder gives up a lease of `lease`: a tenth of it, to
/// absorb clock-rate differences and a deadline sweep's granularity. The runtime and the
/// `pgcoord lock run` command keep the same margin.
pub fn margin(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_millis(1))
}

/// Checks a lock name or owner without taking it: 1 to 255 bytes, no NUL.
pub fn check_name(name: &str) -> Result<()> {
    // validate_name takes ownership to hand the string back; names here are borrowed.
    if name.is_empty() || name.len() > crate::config::MAX_NAME_BYTES || name.contains('\0') {
        validate_name("lock name or owner", name.to_owned())?;
    }
    Ok(())
}

pub(crate) fn millis(d: Duration) -> Result<i64> {
    let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    if ms < 1 {
        return Err(Error::new(
            ErrorKind::DurationTooSmall,
            format!("duration {d:?} is shorter than 1 ms"),
        ));
    }
    Ok(ms)
}

fn holder_from(row: Option<&tokio_postgres::Row>) -> Result<Option<Holder>> {
    let Some(row) = row else { return Ok(None) };
    let owner: Option<String> = row.try_get(0)?;
    let token: Option<i64> = row.try_get(1)?;
    let remaining: Option<i64> = row.try_get(2)?;
    Ok(match (owner, token, remaining) {
        (Some(owner), Some(token), Some(ms)) if ms > 0 => Some(Holder {
            owner,
            token,
            remaining: Duration::from_millis(ms as u64),
        }),
        _ => None,
    })
}

/// A lock from `row`'s columns `first..first + 5`: name, owner, token, data, ms left.
fn info_at(row: &tokio_postgres::Row, first: usize) -> Result<LeaseInfo> {
    let remaining: Option<i64> = row.try_get(first + 4)?;
    Ok(LeaseInfo {
        name: row.try_get(first)?,
        owner: row.try_get(first + 1)?,
        token: row.try_get(first + 2)?,
        data: row.try_get(first + 3)?,
        remaining: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
    })
}
