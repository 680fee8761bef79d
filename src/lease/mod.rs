//! Lease statements: acquire, renew (batched), release, inspect, and the fencing guard.
//!
//! Each function is one statement, decided on the server's clock, and safe to call from any
//! number of processes at once. The runtime that holds leases and decides when to call these is
//! `LockManager` in `pgcoord-actors`. Statements are sent with `query_typed`, so each costs one
//! round trip and no prepare.
//!
//! Invariants the statements keep:
//! - a grant happens only where the row is free or expired on the server's clock, and is not
//!   reserved for another waiter;
//! - every grant draws a new fencing token from the table's `NO CYCLE` sequence; it stays the
//!   same for the whole tenure;
//! - renew and release touch a row only where name **and** token match; renew never inserts,
//!   never steals, and never revives an expired lease.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tracing::instrument;

use crate::config::validate_name;
use crate::error::{Error, ErrorKind, Holder, Result};
use crate::statement::Statements;

mod batch;
mod line;
mod release;
mod semaphore;
mod sql;
mod statements;

pub use batch::AcquireRequest;
pub use release::{ReleaseRequest, Released};
pub use semaphore::{MAX_PERMITS, SlotAttempt, slot_names};

/// A lease granted by [`LeaseTable::try_acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token of this tenure.
    pub token: i64,
    /// The lock's data after the grant (kept from an earlier holder unless replaced).
    pub data: Option<Vec<u8>>,
}

/// The outcome of one acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The lease is ours.
    Granted(Grant),
    /// Someone else holds it (or has reserved the next grant); the holder when known.
    Held(Option<Holder>),
    /// Another transaction has the lock's row locked — a holder's fencing guard, a concurrent
    /// attempt, a DBA's open transaction — so the attempt did not wait for it. Try again later.
    Busy,
}

/// What [`LeaseTable::get`] and [`LeaseTable::list`] report about a lock. Inspection only: it
/// grants nothing and may be stale by the time it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    enqueue: String,
    dequeue: String,
    owned_token: String,
    holder: String,
    renew: String,
    release: String,
    release_many: String,
    cleanup: String,
    get: String,
    list: String,
    list_prefix: String,
    fence: String,
    pub(crate) proclaim: String,
    /// The lock table's name, quoted (and qualified when configured so).
    table: String,
    sequence: String,
    channel: String,
    pub(crate) election_channel: String,
}

impl LeaseTable {
    /// The channel on which releases are announced; its payloads are read by [`Released::parse`].
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The lock table's oid, its name resolved as the lease statements resolve it: what a
    /// handover announcement names ([`Released::table_oid`]), so that a process takes only the
    /// handovers of its own table when several share a channel. [`ErrorKind::NotFound`] when the
    /// table does not exist.
    pub async fn table_oid(&self, client: &(impl Statements + ?Sized)) -> Result<u32> {
        let rows = client
            .run("SELECT to_regclass($1)::oid", &[(&self.table, Type::TEXT)])
            .await?;
        let oid: Option<u32> = match rows.first() {
            Some(row) => row.try_get(0)?,
            None => None,
        };
        oid.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("lock table {} does not exist", self.table),
            )
        })
    }

    /// One attempt to take `name` for `owner` for `lease`. With `replace_data`, `data` replaces
    /// what a kept row holds; otherwise existing data is kept and `data` only fills an empty one.
    #[instrument(skip(self, client, data), level = "debug")]
    pub async fn try_acquire(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
        data: Option<&[u8]>,
        replace_data: bool,
        lease: Duration,
    ) -> Result<Attempt> {
        let rows = match self
            .attempt(
                client,
                &self.acquire,
                name,
                owner,
                data,
                replace_data,
                lease,
                None,
            )
            .await?
        {
            Some(rows) => rows,
            None => return Ok(Attempt::Busy),
        };
        Ok(match rows.first() {
            Some(row) => Attempt::Granted(Grant {
                token: row.try_get(0)?,
                data: row.try_get(1)?,
            }),
            None => Attempt::Held(None),
        })
    }

    /// Runs one attempt's statement, `sql` (`acquire` or, with `wait_for`, `acquire_or_queue`).
    /// `None` when the lock's row is locked by another transaction (not waited for).
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        client: &(impl Statements + ?Sized),
        sql: &str,
        name: &str,
        owner: &str,
        data: Option<&[u8]>,
        replace_data: bool,
        lease: Duration,
        place: Option<(Duration, i64)>,
    ) -> Result<Option<Vec<tokio_postgres::Row>>> {
        check_name(name)?;
        check_name(owner)?;
        let lease = millis(lease)?;
        let place = place
            .map(|(wait_for, nonce)| Ok::<_, crate::Error>((millis(wait_for)?, nonce)))
            .transpose()?;
        let mut params: Vec<crate::statement::Param<'_>> = vec![
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&data, Type::BYTEA),
            (&lease, Type::INT8),
            (&replace_data, Type::BOOL),
            (&self.sequence, Type::TEXT),
        ];
        if let Some((wait_for, nonce)) = &place {
            params.push((wait_for, Type::INT8));
            params.push((nonce, Type::INT8));
        }
        match client.run(sql, &params).await {
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
            rows => rows.map(Some),
        }
    }

    /// Releases `name` if `owner` holds it, whatever the token: for an acquire whose outcome is
    /// unknown (its connection failed or it timed out after it was sent), so that a grant
    /// nobody received does not stay held until it expires. Only call it where `owner` cannot
    /// hold `name` legitimately — the caller must know it holds no tenure of `name`.
    pub async fn release_orphan(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
    ) -> Result<()> {
        let rows = client
            .run(
                &self.owned_token,
                &[(&name, Type::TEXT), (&owner, Type::TEXT)],
            )
            .await?;
        if let Some(row) = rows.first() {
            let token: Option<i64> = row.try_get(0)?;
            if let Some(token) = token {
                match self.release(client, name, owner, token, false).await {
                    Err(e) if e.is_lock_lost() => {}
                    other => other?,
                }
            }
        }
        Ok(())
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

    /// Renews every `(name, token)` lease `owner` holds for another `lease`, in one statement.
    /// Returns the tokens of the leases renewed (a token names one lease: tokens are unique);
    /// any other was lost (row gone, token changed, already expired, or not `owner`'s). Names
    /// may be any string type, so a heartbeat can pass the names it holds without copying them.
    #[instrument(skip_all, fields(leases = held.len()), level = "debug")]
    pub async fn renew<N: AsRef<str>>(
        &self,
        client: &(impl Statements + ?Sized),
        owner: &str,
        held: &[(N, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>> {
        let (names, tokens): (Vec<&str>, Vec<i64>) =
            held.iter().map(|(n, t)| (n.as_ref(), *t)).unzip();
        let rows = client
            .run(
                &self.renew,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&millis(lease)?, Type::INT8),
                    (&owner, Type::TEXT),
                ],
            )
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// The lock `name`, held or kept; [`ErrorKind::NotFound`] when there is no row.
    pub async fn get(&self, client: &(impl Statements + ?Sized), name: &str) -> Result<LeaseInfo> {
        check_name(name)?;
        let rows = client.run(&self.get, &[(&name, Type::TEXT)]).await?;
        match rows.first() {
            Some(row) => info_from(row),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("lock {name:?} not found"),
            )),
        }
    }

    /// Every lock in the table, by name.
    pub async fn list(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<LeaseInfo>> {
        let rows = client.run(&self.list, &[]).await?;
        rows.iter().map(info_from).collect()
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
        rows.iter().map(info_from).collect()
    }

    /// The fencing guard: succeeds only while `owner` holds `name` with `token`, and — run
    /// inside the caller's transaction — keeps the lease from being taken over or released
    /// until that transaction ends, so writes made in it are exclusive. [`ErrorKind::LockLost`]
    /// otherwise. Keep guarded transactions short: a contender waits for them.
    #[instrument(skip(self, client), level = "debug")]
    pub async fn fence(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
        token: i64,
    ) -> Result<()> {
        let params: &[crate::statement::Param<'_>] = &[
            (&name, Type::TEXT),
            (&token, Type::INT8),
            (&owner, Type::TEXT),
        ];
        let rows = client.run(&self.fence, params).await?;
        if rows.is_empty() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("lock {name:?} is no longer held with token {token}"),
            ));
        }
        Ok(())
    }
}

/// Checks a lock name or owner without taking it: 1 to 255 bytes, no NUL.
pub fn check_name(name: &str) -> Result<()> {
    // validate_name takes ownership to hand the string back; names here are borrowed.
    if name.is_empty() || name.len() > crate::config::MAX_NAME_BYTES || name.contains('\0') {
        validate_name("lock name or owner", name.to_owned())?;
    }
    Ok(())
}

fn millis(d: Duration) -> Result<i64> {
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

fn info_from(row: &tokio_postgres::Row) -> Result<LeaseInfo> {
    let remaining: Option<i64> = row.try_get(4)?;
    Ok(LeaseInfo {
        name: row.try_get(0)?,
        owner: row.try_get(1)?,
        token: row.try_get(2)?,
        data: row.try_get(3)?,
        remaining: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
    })
}
