//! The waiters' line: a waiter's lost attempt puts it in line, refreshing its place and storing
//! the grant a release may hand it; leaving the line announces the next waiter when the lease is
//! free; only the first in line may take a free lease (the condition lives in the attempt
//! statements, see `statements`).

use std::time::Duration;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Attempt, Grant, LeaseTable, holder_from, millis};
use crate::error::{Holder, Result};
use crate::statement::Statements;

impl LeaseTable {
    /// [`try_acquire`](Self::try_acquire) for a waiter: when the attempt grants nothing,
    /// `owner` is put in line for `name` (or keeps its place) for `wait_for`, as
    /// [`enqueue`](Self::enqueue) does, in the same statement, and the holder is reported
    /// (`Held(None)` when the lease is free but another waiter is first in line). The place
    /// stores the grant the attempt asked for (`data`, `replace_data`, `lease`), so a release
    /// can hand the lease to `owner` when it is first in line (see [`Released`](super::Released)),
    /// and `nonce`, which that release announces with the grant.
    ///
    /// Pass a new random `nonce` at every attempt (`rand::random()`). A handover announcing the
    /// nonce of an attempt that was refused (a holder other than `owner`, or `Held(None)`) was
    /// made after that attempt was sent, for this wait: a process may hold the lease from the
    /// announcement alone, its deadline counted from that attempt's sending. Any other handover
    /// announcement (no nonce, another one) is a hint to be checked against the row.
    #[instrument(skip(self, client, data), level = "debug")]
    #[allow(clippy::too_many_arguments)]
    pub async fn try_acquire_or_queue(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
        data: Option<&[u8]>,
        replace_data: bool,
        lease: Duration,
        wait_for: Duration,
        nonce: i64,
    ) -> Result<Attempt> {
        let sql = &self.acquire_or_queue;
        let attempt = self.attempt(
            client,
            sql,
            name,
            owner,
            data,
            replace_data,
            lease,
            Some((wait_for, nonce)),
        );
        let Some(rows) = attempt.await? else {
            return Ok(Attempt::Busy);
        };
        let row = rows.first();
        if let Some(token) = row
            .map(|r| r.try_get::<_, Option<i64>>(3))
            .transpose()?
            .flatten()
        {
            let data = row.map(|r| r.try_get(4)).transpose()?.flatten();
            return Ok(Attempt::Granted(Grant { token, data }));
        }
        Ok(Attempt::Held(holder_from(row)?))
    }

    /// Puts `owner` in line for `name` (keeping its place when it has one) for `hold_for`, and
    /// returns the current holder. The place stores no grant: a release announces it rather
    /// than hand it the lease. `Ok(None)` when the row is
    /// gone or free: try again at once.
    #[instrument(skip(self, client), level = "debug")]
    pub async fn enqueue(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
        hold_for: Duration,
    ) -> Result<Option<Holder>> {
        let rows = client
            .run(
                &self.enqueue,
                &[
                    (&name, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&millis(hold_for)?, Type::INT8),
                ],
            )
            .await?;
        holder_from(rows.first())
    }

    /// Gives up `owner`'s reservation of `name`, when it has one.
    pub async fn dequeue(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
    ) -> Result<()> {
        client
            .run(
                &self.dequeue,
                &[
                    (&name, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&self.channel, Type::TEXT),
                ],
            )
            .await?;
        // A row that only stayed for this reservation goes with it.
        self.cleanup(client, name).await
    }

    async fn cleanup(&self, client: &(impl Statements + ?Sized), name: &str) -> Result<()> {
        client.run(&self.cleanup, &[(&name, Type::TEXT)]).await?;
        Ok(())
    }
}
