//! The lock-set workload's history and its checker, after Jepsen's lock-set test.
//!
//! Each critical section runs in one transaction of the holder's own connection:
//! 1. `Lease::fence` — the section is *accepted* only while the lease is held with its token,
//!    and a takeover waits until the transaction ends;
//! 2. the server's `clock_timestamp()` is read: the section's entry;
//! 3. the one resource row is updated to carry the section's token and a new write number,
//!    returning the token it carried before;
//! 4. the holder works for a while (the hold time);
//! 5. the section is recorded — process, token, previous token, write number, entry, and
//!    `clock_timestamp()` again as its exit — and the transaction commits. A commit the holder
//!    saw succeed is an acknowledged write.
//!
//! One clock (the server's) orders every process's sections. If the lease ever let two holders
//! in at once, both would pass their fence, read their entry, and one would wait for the other's
//! row lock: their intervals overlap. If a stale holder's write got through after a newer
//! tenure's, the resource would go back to an older token. The checker counts both, and the
//! acknowledged writes that are not in the history.

use std::time::Duration;

use pgcoord::ident::Ident;
use pgcoord_actors::Lease;
use tokio_postgres::Client;

/// A write a holder saw committed: its token and write number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ack {
    /// The fencing token of the section.
    pub token: i64,
    /// The resource's write number after this section's write.
    pub write: i64,
}

/// What the checker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted (committed) critical sections.
    pub sections: i64,
    /// Sections whose interval overlaps an earlier one's.
    pub overlaps: i64,
    /// Sections whose token is smaller than the one the resource carried before them.
    pub regressions: i64,
    /// Acknowledged writes that are not in the history.
    pub missing: Vec<Ack>,
    /// Distinct tokens (tenures) among the sections.
    pub tenures: i64,
}

impl Verdict {
    /// True when mutual exclusion held and nothing acknowledged was lost.
    pub fn is_safe(&self) -> bool {
        self.overlaps == 0 && self.regressions == 0 && self.missing.is_empty()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} sections in {} tenures: {} overlapping, {} token regressions, {} acknowledged writes missing",
            self.sections,
            self.tenures,
            self.overlaps,
            self.regressions,
            self.missing.len()
        )
    }
}

/// The history and resource tables of one workload, named from a prefix.
#[derive(Debug, Clone)]
pub struct History {
    history: String,
    resource: String,
}

/// The error of a critical section: the fence rejected the token, or the database failed.
pub type SectionError = pgcoord::Error;

impl History {
    /// The tables `<prefix>_history` and `<prefix>_resource`; `prefix` must be an identifier.
    pub fn new(prefix: &str) -> pgcoord::Result<History> {
        Ok(History {
            history: Ident::new(&format!("{prefix}_history"))?.quoted(),
            resource: Ident::new(&format!("{prefix}_resource"))?.quoted(),
        })
    }

    /// Creates both tables (empty history, one resource row with token 0 and value 0).
    pub async fn create(&self, client: &Client) -> pgcoord::Result<()> {
        let (h, r) = (&self.history, &self.resource);
        client
            .batch_execute(&format!(
                "CREATE TABLE {h} (id bigserial PRIMARY KEY, process text NOT NULL,
                     token bigint NOT NULL, previous_token bigint NOT NULL, write_no bigint NOT NULL,
                     entered timestamptz NOT NULL, exited timestamptz NOT NULL);
                 CREATE TABLE {r} (id int PRIMARY KEY, token bigint NOT NULL, writes bigint NOT NULL,
                     value bigint NOT NULL);
                 INSERT INTO {r} VALUES (1, 0, 0, 0);"
            ))
            .await?;
        Ok(())
    }

    /// One critical section under `lease`, as the module describes; the acknowledged write, or
    /// [`pgcoord::ErrorKind::LockLost`] when the fence rejected the token (nothing was written).
    pub async fn section(
        &self,
        client: &mut Client,
        lease: &Lease,
        process: &str,
        hold: Duration,
    ) -> Result<Ack, SectionError> {
        self.section_setting(client, lease, process, None, hold)
            .await
    }

    /// [`section`](Self::section) that also sets the resource's `value` (the register of
    /// [`crate::linear`]) when `value` is given.
    pub async fn section_setting(
        &self,
        client: &mut Client,
        lease: &Lease,
        process: &str,
        value: Option<i64>,
        hold: Duration,
    ) -> Result<Ack, SectionError> {
        let tx = client.transaction().await?;
        lease.fence(&tx).await?;
        let entered: std::time::SystemTime =
            tx.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
        let token = lease.token();
        let row = tx
            .query_one(
                &format!(
                    "WITH old AS (SELECT token FROM {r} WHERE id = 1 FOR UPDATE)
                     UPDATE {r} AS cur SET token = $1, writes = cur.writes + 1,
                         value = coalesce($2::int8, cur.value)
                     FROM old WHERE cur.id = 1 RETURNING old.token, cur.writes",
                    r = self.resource
                ),
                &[&token, &value],
            )
            .await?;
        let (previous, write): (i64, i64) = (row.get(0), row.get(1));
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        tx.execute(
            &format!(
                "INSERT INTO {} (process, token, previous_token, write_no, entered, exited)
                 VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
                self.history
            ),
            &[&process, &token, &previous, &write, &entered],
        )
        .await?;
        tx.commit().await?;
        Ok(Ack { token, write })
    }

    /// The resource's `value`, in a statement of its own.
    pub async fn read(&self, client: &Client) -> pgcoord::Result<i64> {
        let sql = format!("SELECT value FROM {} WHERE id = 1", self.resource);
        Ok(client.query_one(&sql, &[]).await?.get(0))
    }

    /// Checks the history against the acknowledged writes.
    pub async fn check(&self, client: &Client, acks: &[Ack]) -> pgcoord::Result<Verdict> {
        let h = &self.history;
        let counts = client
            .query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT token),
                         count(*) FILTER (WHERE previous_token > token)
                     FROM {h}"
                ),
                &[],
            )
            .await?;
        // An interval overlaps an earlier one when it starts before the latest exit of all
        // sections that started before it.
        let overlaps: i64 = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM (
                         SELECT entered, max(exited) OVER (ORDER BY entered, id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS latest_exit
                         FROM {h}) AS sections
                     WHERE entered < latest_exit"
                ),
                &[],
            )
            .await?
            .get(0);
        let (tokens, writes): (Vec<i64>, Vec<i64>) =
            acks.iter().map(|a| (a.token, a.write)).unzip();
        let missing = client
            .query(
                &format!(
                    "SELECT t, w FROM unnest($1::int8[], $2::int8[]) AS acked(t, w)
                     EXCEPT SELECT token, write_no FROM {h} ORDER BY 2"
                ),
                &[&tokens, &writes],
            )
            .await?
            .iter()
            .map(|row| Ack {
                token: row.get(0),
                write: row.get(1),
            })
            .collect();
        Ok(Verdict {
            sections: counts.get(0),
            tenures: counts.get(1),
            regressions: counts.get(2),
            overlaps,
            missing,
        })
    }
}
