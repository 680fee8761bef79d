//! Stored limits: semaphores whose number of permits is kept in the database and can be changed
//! while they are in use ("at most N jobs at once for tenant 42", N changed at run time).
//!
//! A limited semaphore's permits are the leases of its slots, `"{name}#{i}"` for `i` below the
//! stored limit, as a plain semaphore's ([`slot_names`](super::slot_names)): each with its own
//! token, renewal and loss. What the stored limit adds:
//!
//! - [`LeaseTable::set_limit`] writes the limit and, in the same statement, makes the slots' rows
//!   (free, kept) and deletes every slot at or above the new limit, held or not. Its holders lose
//!   their permit: their renewal finds it gone and their fenced writes fail at once. The delete
//!   waits for their fenced transactions, so once `set_limit` returns no more than the new limit
//!   can write under a permit.
//! - [`LeaseOwner::try_acquire_limited`] grants a free slot below the limit it reads, with the
//!   limit's row locked `FOR SHARE`: a change waits for grants under way, and a grant that comes
//!   after a change waits for it and reads the new limit. A grant only updates a slot's row,
//!   never inserts one: a change deletes rows that exist in its snapshot, so a row inserted after
//!   it by a grant under the old limit could escape it.
//! - A change is made from the limit's version as its snapshot saw it; when another change came
//!   in between (its slots' rows might be invisible to this one), nothing is written and the
//!   statement is asked again.

use tokio_postgres::types::Type;
use tracing::instrument;

use super::sql::{TIMELINE_BASE, announce, grant_lock};
use super::{Grant, LeaseOwner, LeaseTable, check_name, millis, slot_names};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::statement::Statements;

use super::semaphore::MAX_PERMITS;

/// How often [`LeaseTable::set_limit`] asks again when other changes keep coming in between.
const CHANGE_ATTEMPTS: u32 = 16;

/// The most stored limits [`LeaseTable::limits`] lists.
pub const MAX_LIMITS_LISTED: usize = 1_000;

/// The statements of stored limits, rendered once per configured table.
#[derive(Debug, Clone)]
pub(super) struct LimitStatements {
    set: String,
    take_back: String,
    get: String,
    list: String,
    acquire: String,
}

impl LimitStatements {
    /// The SQL text of `limit_set`, `limit_take_back` or `limit_acquire` (see
    /// `LeaseTable::sql_text`).
    pub(super) fn sql_text(&self, name: &str) -> Option<&str> {
        Some(match name {
            "limit_set" => &self.set,
            "limit_take_back" => &self.take_back,
            "limit_acquire" => &self.acquire,
            _ => return None,
        })
    }

    pub(super) fn new(config: &Config) -> LimitStatements {
        let t = config.lock_table.quoted();
        let q = config.lock_queue.quoted();
        let m = config.limit_table().quoted();
        let free = "(l.owner IS NULL OR l.expires_at <= clock_timestamp())";
        LimitStatements {
            // $1 name, $2 permits, $3 channel. `seen` is the limit as this statement's snapshot
            // has it; the upsert writes only when the row's newest version is that one (the
            // version inserted is seen's plus one). Then, reading the upsert's row (so after
            // it holds the row, and so after every grant under way has committed): the slots
            // below the limit are made, and those from it up to the most ever made are deleted
            // where no transaction holds them (`SKIP LOCKED`): waiting here would hold the rows
            // already locked, and with them every renewal of their holders' processes. The
            // names skipped (a holder's fenced transaction, a renewal under way) are answered,
            // for `take_back` one by one. Raised: the first slot is announced, so waiters look
            // again. Columns: the limit before, permits taken back, the NOTIFY, the new version,
            // the slots left to take back.
            set: format!(
                "WITH seen AS (SELECT permits, version FROM {m} WHERE name = $1),
                 lim AS (
                     INSERT INTO {m} AS m (name, permits, version, slots)
                     SELECT $1, $2, coalesce((SELECT version FROM seen), 0) + 1, $2
                     ON CONFLICT (name) DO UPDATE SET permits = EXCLUDED.permits,
                         version = EXCLUDED.version, slots = greatest(m.slots, EXCLUDED.slots),
                         set_at = clock_timestamp()
                     WHERE m.version + 1 = EXCLUDED.version
                     RETURNING m.permits, m.version, m.slots
                 ), made AS (
                     INSERT INTO {t} (name, kept)
                     SELECT $1 || '#' || i, true FROM lim, generate_series(0, lim.permits - 1) AS i
                     ON CONFLICT (name) DO NOTHING
                 ), above AS MATERIALIZED (
                     SELECT l.name FROM {t} AS l, lim
                     WHERE l.name = ANY(ARRAY(
                         SELECT $1 || '#' || i FROM generate_series(lim.permits, lim.slots - 1) AS i))
                 ), unlocked AS MATERIALIZED (
                     SELECT l.name FROM {t} AS l
                     WHERE l.name = ANY(ARRAY(SELECT name FROM above))
                     FOR UPDATE OF l SKIP LOCKED
                 ), revoked AS (
                     DELETE FROM {t} AS l USING unlocked WHERE l.name = unlocked.name
                     RETURNING l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS held
                 )
                 SELECT (SELECT permits FROM seen),
                        (SELECT count(*) FROM revoked WHERE held),
                        CASE WHEN lim.permits > coalesce((SELECT permits FROM seen), 0)
                             THEN {notify} END,
                        lim.version,
                        ARRAY(SELECT name FROM above EXCEPT SELECT name FROM unlocked)
                 FROM lim",
                notify = crate::signal::notify_sql(config, "$3", &announce(&q, "($1 || '#0')", None)),
            ),
            // $1 name, $2 slot, $3 version. One slot left above a lowered limit, deleted once the
            // transaction holding it ends (waiting holds this one row only), unless another
            // change came since (it takes over). The limit's row is read `FOR SHARE` first, so
            // no change commits meanwhile.
            take_back: format!(
                "WITH lim AS MATERIALIZED (SELECT version FROM {m} WHERE name = $1 FOR SHARE)
                 DELETE FROM {t} AS l USING lim WHERE l.name = $2 AND lim.version = $3
                 RETURNING l.owner IS NOT NULL AND l.expires_at > clock_timestamp()"
            ),
            get: format!("SELECT permits FROM {m} WHERE name = $1"),
            list: format!(
                "SELECT name::text, permits FROM {m} ORDER BY name LIMIT {MAX_LIMITS_LISTED}"
            ),
            // $1 name, $2 owner, $3 lease ms, $4 sequence, $5 candidate slots, $6 the limit the
            // candidates were named for. A free candidate below the limit, locked without
            // waiting (a fenced transaction of a previous holder skips it), granted. Columns:
            // the limit, the slot and token granted, (when none was) how many slots below the
            // limit are free, and whether a limit is stored. The limit's row is read without
            // waiting too, and without an error: a change under way locks it, the row is
            // skipped, and the attempt is busy (no `could not obtain lock` line in the server's
            // log per attempt, as `NOWAIT` wrote).
            acquire: format!(
                "WITH lim AS MATERIALIZED (SELECT permits FROM {m} WHERE name = $1 FOR SHARE SKIP LOCKED),
                 allowed AS MATERIALIZED (
                     SELECT $1 || '#' || i AS name FROM lim, generate_series(0, lim.permits - 1) AS i
                 ), pick AS (
                     SELECT l.name FROM {t} AS l, lim
                     WHERE lim.permits <= $6 AND l.name = ANY($5::text[])
                       AND l.name = ANY(ARRAY(SELECT name FROM allowed)) AND {free}
                     ORDER BY random() LIMIT 1
                     FOR UPDATE OF l SKIP LOCKED
                 ), granted AS (
                     UPDATE {t} AS l SET owner = $2, token = {TIMELINE_BASE} + nextval($4::regclass),
                         data = NULL, acquired_at = now(),
                         expires_at = now() + $3 * interval '1 millisecond', kept = false
                     FROM pick
                     WHERE l.name = pick.name AND {free} AND {grant_lock}
                     RETURNING l.name, l.token
                 )
                 SELECT lim.permits, g.name, g.token,
                        CASE WHEN g.name IS NULL THEN (
                            SELECT count(*) FROM {t} AS l
                            WHERE l.name = ANY(ARRAY(SELECT name FROM allowed)) AND {free}) END,
                        EXISTS (SELECT 1 FROM {m} WHERE name = $1)
                 FROM (SELECT 1) AS one LEFT JOIN lim ON true LEFT JOIN granted AS g ON true",
                grant_lock = grant_lock("pick.name", "$4"),
            ),
        }
    }
}

/// What [`LeaseTable::set_limit`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitChange {
    /// The limit before; `None` when none was stored.
    pub previous: Option<u32>,
    /// The permits taken back from their holders (slots at or above a lowered limit).
    pub revoked: u64,
}

/// The outcome of one attempt at a permit of a limited semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitedAttempt {
    /// A slot is ours: its lease's name and grant.
    Granted {
        /// The slot's lease name.
        slot: String,
        /// The grant.
        grant: Grant,
    },
    /// Every slot below the limit is held: wait for a release or a raised limit.
    Full,
    /// Some slot is free, but none could be taken now: try again shortly.
    Busy,
    /// The stored limit is more than the candidates were named for: name the slots of this
    /// many permits and ask again.
    Resized(u32),
}

fn check_permits(permits: u32) -> Result<i32> {
    if permits > MAX_PERMITS {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            format!("a limit is 0 to {MAX_PERMITS} permits, not {permits}"),
        ));
    }
    Ok(permits as i32)
}

impl LeaseTable {
    /// Stores `permits` (0 to [`MAX_PERMITS`]; 0 admits nobody) as the limit of semaphore
    /// `name`, creating it. Lowered: the permits of slots at or above the new limit are taken
    /// back from their holders — at once, or once the fenced transaction a holder is in ends —
    /// so that from its answer on at most `permits` holders can write under a permit. Should
    /// that wait fail (the statement timeout), the error says so: the limit is stored and no
    /// new permit is granted above it, and setting it again finishes taking them back. Raised:
    /// waiters are woken.
    #[instrument(skip(self, client), level = "debug")]
    pub async fn set_limit(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        permits: u32,
    ) -> Result<LimitChange> {
        let permits = check_permits(permits)?;
        // The slots' names must fit, as a plain semaphore's must.
        slot_names(name, (permits as u32).max(1))?;
        let params: &[crate::statement::Param<'_>] = &[
            (&name, Type::TEXT),
            (&permits, Type::INT4),
            (&self.channel, Type::TEXT),
        ];
        let mut attempts = 0;
        let (previous, mut revoked, version, left) = loop {
            // No row: another change came in after this statement's snapshot. Ask again.
            if let Some(row) = client.run(&self.limits.set, params).await?.first() {
                let previous: Option<i32> = row.try_get(0)?;
                let revoked: i64 = row.try_get(1)?;
                let version: i64 = row.try_get(3)?;
                let left: Vec<String> = row.try_get(4)?;
                break (previous, revoked as u64, version, left);
            }
            attempts += 1;
            if attempts >= CHANGE_ATTEMPTS {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "the limit of {name:?} kept changing under {attempts} attempts to set it"
                    ),
                ));
            }
        };
        // The limit is stored; the slots a transaction held are taken back one by one, each
        // once its transaction ends.
        for (done, slot) in left.iter().enumerate() {
            let params: &[crate::statement::Param<'_>] = &[
                (&name, Type::TEXT),
                (slot, Type::TEXT),
                (&version, Type::INT8),
            ];
            match client.run(&self.limits.take_back, params).await {
                Ok(rows) => {
                    let held = rows.first().map(|r| r.try_get::<_, bool>(0)).transpose()?;
                    revoked += u64::from(held == Some(true));
                }
                Err(e) => {
                    return Err(Error::new(
                        e.kind(),
                        format!(
                            "the limit of {name:?} is {permits} now, but {} permit(s) above it \
                             were not taken back yet (set it again to finish): {e}",
                            left.len() - done
                        ),
                    ));
                }
            }
        }
        Ok(LimitChange {
            previous: previous.map(|p| p as u32),
            revoked,
        })
    }

    /// Every stored limit, by semaphore name: at most [`MAX_LIMITS_LISTED`].
    pub async fn limits(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<(String, u32)>> {
        let rows = client.run(&self.limits.list, &[]).await?;
        (rows.iter())
            .map(|row| Ok((row.try_get(0)?, row.try_get::<_, i32>(1)? as u32)))
            .collect()
    }

    /// The stored limit of semaphore `name`; `None` when it has none.
    pub async fn limit(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
    ) -> Result<Option<u32>> {
        check_name(name)?;
        let rows = client.run(&self.limits.get, &[(&name, Type::TEXT)]).await?;
        rows.first()
            .map(|row| Ok(row.try_get::<_, i32>(0)? as u32))
            .transpose()
    }
}

impl LeaseOwner<'_> {
    /// One attempt at a permit of limited semaphore `name`, for `lease`: any free slot among
    /// `candidates` (from [`slot_names`]`(name, known)`, minus those the caller holds or is
    /// busy with) below the stored limit. [`ErrorKind::NotFound`] when no limit is stored.
    #[instrument(skip_all, fields(lease.name = name), level = "debug")]
    pub async fn try_acquire_limited(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        candidates: &[String],
        known: u32,
        lease: std::time::Duration,
    ) -> Result<LimitedAttempt> {
        check_name(name)?;
        let known = check_permits(known)?;
        let rows = client
            .run(
                &self.table.limits.acquire,
                &[
                    (&name, Type::TEXT),
                    (&self.owner, Type::TEXT),
                    (&millis(lease)?, Type::INT8),
                    (&self.table.sequence, Type::TEXT),
                    (&candidates, Type::TEXT_ARRAY),
                    (&known, Type::INT4),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Other, "the limited grant returned no row"))?;
        let Some(permits) = row.try_get::<_, Option<i32>>(0)? else {
            // Stored but skipped: a change of the limit under way holds its row.
            if row.try_get(4)? {
                return Ok(LimitedAttempt::Busy);
            }
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("semaphore {name:?} has no stored limit; set one first"),
            ));
        };
        if let (Some(slot), Some(token)) = (row.try_get(1)?, row.try_get(2)?) {
            return Ok(LimitedAttempt::Granted {
                slot,
                grant: Grant { token, data: None },
            });
        }
        if permits > known {
            return Ok(LimitedAttempt::Resized(permits as u32));
        }
        let free: i64 = row.try_get::<_, Option<i64>>(3)?.unwrap_or(0);
        Ok(if free == 0 {
            LimitedAttempt::Full
        } else {
            LimitedAttempt::Busy
        })
    }
}
