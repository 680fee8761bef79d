//! [`LeaseOwner`]: the lease statements of one owner — attempts, the waiters' line, renewal,
//! the fencing guard, and freeing grants an attempt of unknown outcome may have made.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tracing::instrument;

use super::{AcquireRequest, Attempt, Grant, LeaseTable, ReleaseRequest, check_name};
use super::{holder_from, millis};
use crate::error::Result;
use crate::statement::{Param, Statements};

/// The lease statements of one owner, made by [`LeaseTable::owner`]. Every statement that
/// grants, renews, releases or fences matches this owner: a process that came to believe it
/// holds another's token can renew, release or fence nothing of the holder's.
#[derive(Debug, Clone, Copy)]
pub struct LeaseOwner<'t> {
    pub(crate) table: &'t LeaseTable,
    pub(crate) owner: &'t str,
}

impl LeaseOwner<'_> {
    /// The owner identity these statements match.
    pub fn owner(&self) -> &str {
        self.owner
    }

    /// One attempt to take `request.name` for `lease`. Refused while someone holds it, or while
    /// another waiter is first in line for it.
    #[instrument(skip_all, fields(lease.name = request.name), level = "debug")]
    pub async fn try_acquire(
        &self,
        client: &(impl Statements + ?Sized),
        request: &AcquireRequest<'_>,
        lease: Duration,
    ) -> Result<Attempt> {
        let Some(rows) = self.attempt(client, request, lease, None).await? else {
            return Ok(Attempt::Busy);
        };
        let Some(row) = rows.first() else {
            return Ok(Attempt::Held(None));
        };
        Ok(match row.try_get::<_, Option<i64>>(0)? {
            Some(token) => Attempt::Granted(Grant {
                token,
                data: row.try_get(1)?,
            }),
            None => Attempt::Busy,
        })
    }

    /// [`try_acquire`](Self::try_acquire) for a waiter: when the attempt grants nothing, the
    /// owner is put in line for the name (or keeps its place) for `wait_for`, in the same
    /// statement, and the holder is reported. Only the waiter first in line may take a free
    /// lease; a waiter refreshes its place at every attempt it loses, and leaves the line with
    /// [`leave_line`](Self::leave_line).
    #[instrument(skip_all, fields(lease.name = request.name), level = "debug")]
    pub async fn try_acquire_or_queue(
        &self,
        client: &(impl Statements + ?Sized),
        request: &AcquireRequest<'_>,
        lease: Duration,
        wait_for: Duration,
    ) -> Result<Attempt> {
        let wait_for = millis(wait_for)?;
        let Some(rows) = self.attempt(client, request, lease, Some(wait_for)).await? else {
            return Ok(Attempt::Busy);
        };
        let row = rows.first();
        if row.map(|r| r.try_get::<_, bool>(5)).transpose()? == Some(true) {
            return Ok(Attempt::Busy);
        }
        let granted = row.map(|r| r.try_get::<_, Option<i64>>(3)).transpose()?;
        if let Some(token) = granted.flatten() {
            let data = row.map(|r| r.try_get(4)).transpose()?.flatten();
            return Ok(Attempt::Granted(Grant { token, data }));
        }
        Ok(Attempt::Held(holder_from(row)?))
    }

    /// Runs one attempt's statement: `acquire`, or with `wait_for` (ms) `acquire_or_queue`.
    /// `None` when the lock's row is locked by another transaction (not waited for); the rows
    /// say when another grant statement of the name held its grant lock.
    async fn attempt(
        &self,
        client: &(impl Statements + ?Sized),
        request: &AcquireRequest<'_>,
        lease: Duration,
        wait_for: Option<i64>,
    ) -> Result<Option<Vec<tokio_postgres::Row>>> {
        check_name(request.name)?;
        let lease = millis(lease)?;
        let table = self.table;
        let mut params: Vec<Param<'_>> = vec![
            (&request.name, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&request.data, Type::BYTEA),
            (&lease, Type::INT8),
            (&request.replace_data, Type::BOOL),
            (&table.sequence, Type::TEXT),
        ];
        let sql = match &wait_for {
            Some(ms) => {
                params.push((ms, Type::INT8));
                params.push((&request.priority, Type::INT4));
                &table.acquire_or_queue
            }
            None => &table.acquire,
        };
        match client.run(sql, &params).await {
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
            rows => rows.map(Some),
        }
    }

    /// Takes the owner out of the line for `name`, when it is in it. When it was first and the
    /// lease is free, the next waiter is announced. Safe to repeat.
    pub async fn leave_line(&self, client: &(impl Statements + ?Sized), name: &str) -> Result<()> {
        let params: &[Param<'_>] = &[
            (&name, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.table.channel, Type::TEXT),
        ];
        client.run(&self.table.leave_line, params).await?;
        Ok(())
    }

    /// Renews every `(name, token)` lease the owner holds for another `lease`, in one
    /// statement. Returns the tokens of the leases renewed (a token names one lease: tokens are
    /// unique); any other was lost (row gone, token changed, already expired, or not this
    /// owner's). Names may be any string type, so a heartbeat can pass the names it holds
    /// without copying them.
    pub async fn renew<N: AsRef<str>>(
        &self,
        client: &(impl Statements + ?Sized),
        held: &[(N, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>> {
        let held: Vec<(&str, i64, Duration)> =
            held.iter().map(|(n, t)| (n.as_ref(), *t, lease)).collect();
        self.renew_each(client, &held).await
    }

    /// [`renew`](Self::renew), each `(name, token, lease)` for its own lease.
    #[instrument(skip_all, fields(leases = held.len()), level = "debug")]
    pub async fn renew_each<N: AsRef<str>>(
        &self,
        client: &(impl Statements + ?Sized),
        held: &[(N, i64, Duration)],
    ) -> Result<Vec<i64>> {
        let mut names = Vec::with_capacity(held.len());
        let (mut tokens, mut leases) = (Vec::with_capacity(held.len()), Vec::new());
        for (name, token, lease) in held {
            names.push(name.as_ref());
            tokens.push(*token);
            leases.push(millis(*lease)?);
        }
        let params: &[Param<'_>] = &[
            (&names, Type::TEXT_ARRAY),
            (&tokens, Type::INT8_ARRAY),
            (&leases, Type::INT8_ARRAY),
            (&self.owner, Type::TEXT),
        ];
        let rows = client.run(&self.table.renew, params).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// The fencing guard: succeeds only while the owner holds `name` with `token`, and — run
    /// inside the caller's transaction — keeps the lease from being taken over or released
    /// until that transaction ends, so writes made in it are exclusive. [`ErrorKind::LockLost`](crate::ErrorKind::LockLost)
    /// otherwise, and the transaction is aborted (SQLSTATE `PC001`): nothing written in it can
    /// commit. Keep guarded transactions short: a contender waits for them. Other drivers and
    /// languages call the same SQL function (docs/OPERATIONS.md, "Coordination in SQL").
    #[instrument(skip(self, client), level = "debug")]
    pub async fn fence(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        token: i64,
    ) -> Result<()> {
        let params: &[Param<'_>] = &[
            (&name, Type::TEXT),
            (&token, Type::INT8),
            (&self.owner, Type::TEXT),
        ];
        // The function raises PC001 (`ErrorKind::LockLost`) unless the lease is held so.
        client.run(&self.table.fence, params).await?;
        Ok(())
    }

    /// Releases every lease among `names` the owner holds, whatever its token (kept free with
    /// `keep`, as its release would have), after an attempt whose answer was lost: a grant nobody
    /// received does not stay held until it expires. True when none is left held; false when
    /// one was locked by another transaction (ask again). Call it only where the owner holds
    /// none of `names` legitimately (the runtime: under the names' turns).
    pub async fn release_orphans(
        &self,
        client: &(impl Statements + ?Sized),
        names: &[&str],
        keep: bool,
    ) -> Result<bool> {
        let params: &[Param<'_>] = &[(&names, Type::TEXT_ARRAY), (&self.owner, Type::TEXT)];
        let rows = client.run(&self.table.owned, params).await?;
        let owned: Vec<(String, i64)> = (rows.iter())
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_>>()?;
        if owned.is_empty() {
            return Ok(true);
        }
        let requests: Vec<ReleaseRequest<'_>> = (owned.iter())
            .map(|(name, token)| ReleaseRequest {
                name,
                token: *token,
                keep,
                // Whatever it was (a permit, an election's term), its listeners hear of it.
                announce_always: true,
            })
            .collect();
        let released = self.release_many(client, &requests).await?;
        Ok(released.len() == owned.len())
    }
}
