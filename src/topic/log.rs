//! The log: appending inside the caller's transaction, reading in order without gaps, and what
//! holds readers back.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Cursor, Event, TopicTable, XID, check, cursor_at, xid_param};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// What one [`TopicTable::read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Batch {
    /// The events after the cursor, in order; at most the limit.
    pub events: Vec<Event>,
}

/// The oldest transaction still running with a transaction id: until it ends, no reader reads
/// past the events appended since it began. A session's, or a prepared transaction
/// (`PREPARE TRANSACTION`), which no session holds and which waits for `COMMIT PREPARED` or
/// `ROLLBACK PREPARED`, however long.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldBack {
    /// Its backend's process id (`pg_terminate_backend` ends it); 0 for a prepared transaction,
    /// which has none.
    pub pid: i32,
    /// A prepared transaction's global id (`ROLLBACK PREPARED 'gid'` ends it); `None` for a
    /// session's transaction.
    pub prepared: Option<String>,
    /// The database it runs in (the horizon is the whole cluster's).
    pub database: Option<String>,
    /// How long the transaction has been running; a prepared one's, since it was prepared.
    pub age: Duration,
}

/// A topic as [`TopicTable::topics`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicInfo {
    /// The topic's name.
    pub topic: String,
    /// Its committed events (retention deletes the old ones).
    pub events: i64,
    /// When its oldest event kept was appended.
    pub oldest: SystemTime,
    /// When its newest event was appended.
    pub newest: SystemTime,
}

/// Every topic with its events' count and age.
pub(super) fn topics_sql(t: &str) -> String {
    format!(
        "SELECT topic, count(*), min(appended_at), max(appended_at) FROM {t}
         GROUP BY topic ORDER BY topic"
    )
}

/// $1 topic, $2 body, $3 whether to ring. The event, and a doorbell rung at commit: the
/// migrations' function, which any driver calls too (one home for the rule).
pub(crate) fn append_sql(config: &crate::Config) -> String {
    let f = config.sql_function("pgcoord_topics_append").quoted();
    format!("SELECT xid, position FROM {f}($1, $2, $3)")
}

/// $1 topics, $2 bodies, $3 channel. Many events in one statement (one commit), in the order
/// given: positions are drawn as the ordered rows are inserted. The doorbell rings once per
/// topic (PostgreSQL folds equal notifications of one transaction).
pub(super) fn append_many_sql(t: &str, config: &crate::Config) -> String {
    format!(
        "WITH args AS MATERIALIZED (SELECT $1::text[] AS topics, $2::bytea[] AS bodies),
         appended AS (
             INSERT INTO {t} (topic, body)
             SELECT r.topic, r.body
             FROM args, unnest(args.topics, args.bodies) WITH ORDINALITY AS r(topic, body, n)
             ORDER BY r.n
             RETURNING topic, xid, position
         )
         SELECT xid{XID}, position, {notify} FROM appended ORDER BY position",
        notify = crate::signal::notify_sql(config, "$3", "topic"),
    )
}

/// $1 topic, $2 and $3 the cursor, $4 limit. The events after the cursor, unless retention's
/// mark is past it (then none: the caller asks the mark why). The body of the migrations'
/// `pgcoord_topics_read`, which any driver calls: one text for both.
///
/// Gap-free: an event is read only when its transaction is older than the read's snapshot's
/// xmin, the oldest transaction still running. Every such transaction has ended, so the events
/// below the horizon are all there, and none can be added below it later: a reader that moves
/// its cursor through them skips nothing. Trimming and the mark are one transaction, so a read
/// sees both or neither: no event is read past a cursor that retention left behind.
///
/// One plain scan, so a page costs what a keyset-paged SELECT does: the mark is a one-time
/// filter (`NOT (SELECT EXISTS …)` is evaluated once; a bare `NOT EXISTS` would be an anti-join
/// probing the mark for every row), and the horizon is not returned. Sent as the body, not as a
/// call of the function: a page's plan is made for its parameters (the plan kept for any
/// parameters looks dearer to the planner), and planning a call inlines the function afresh,
/// parsing its text, which made every page of a catch-up 5–10 % slower.
pub(super) fn read_sql(config: &crate::Config) -> String {
    crate::schema::function_body(config, "pgcoord_topics_read")
}

/// The horizon: the oldest transaction still running (with an xid), as an `int8`.
const HORIZON: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8";

/// $1 topic, $2 and $3 the cursor, $4 the most to count. The events a read after the cursor
/// could read now (below the horizon, as `read_sql`), counted on the index only.
pub(super) fn lag_sql(t: &str) -> String {
    let (x, p) = (xid_param(2), "$3");
    format!(
        "SELECT count(*) FROM (
             SELECT 1 FROM {t} AS e
             WHERE e.topic = $1 AND (e.xid, e.position) > ({x}, {p})
               AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
             LIMIT $4
         ) AS behind"
    )
}

/// The oldest running transaction that has a transaction id, cluster-wide: a session's, or a
/// prepared one (in `pg_prepared_xacts`, not `pg_stat_activity`: no backend holds it).
pub(super) const HELD_BACK: &str = "SELECT pid, gid, database,
        greatest(0, extract(epoch FROM clock_timestamp() - since) * 1000)::int8
    FROM (
        SELECT pid, NULL::text AS gid, datname::text AS database, xact_start AS since, backend_xid AS xid
        FROM pg_stat_activity
        WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
        UNION ALL
        SELECT 0, gid, database::text, prepared, transaction FROM pg_prepared_xacts
    ) AS running
    ORDER BY age(xid) DESC LIMIT 1";

/// The largest body [`TopicTable::append`] takes: what a `bytea` holds, less room for the row.
pub const MAX_BODY_BYTES: usize = 1 << 29;

/// The most events one [`TopicTable::append_many`] statement takes.
pub const MAX_EVENTS_PER_STATEMENT: usize = 1_000;

pub(crate) fn check_body(body: &[u8]) -> Result<()> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Error::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "an event's body is at most {MAX_BODY_BYTES} bytes, not {}",
                body.len()
            ),
        ));
    }
    Ok(())
}

impl TopicTable {
    /// Appends `body` to `topic`, in the caller's transaction when `client` is one: the event
    /// exists if and only if that transaction commits. Its cursor (the transaction's id and the
    /// event's position) is returned. The commit rings the topic's doorbell (a NOTIFY on
    /// [`channel`](Self::channel)); readers read the table, never the notification. A
    /// transaction that notifies takes a database-wide lock at commit, so committing appenders
    /// queue there one by one.
    #[instrument(skip_all, fields(topic, bytes = body.len()), level = "debug")]
    pub async fn append(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        body: &[u8],
    ) -> Result<Cursor> {
        check("topic", topic)?;
        check_body(body)?;
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&body, Type::BYTEA),
            (&self.doorbell, Type::BOOL),
        ];
        let rows = client.run(&self.append, params).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Other, "the append returned no row".to_owned()))?;
        cursor_at(row, 0)
    }

    /// Appends every `(topic, body)` of `events`, in that order, in one statement: one
    /// transaction of their own (or the caller's, when `client` is one), one commit for all.
    /// Their cursors, in the same order. Checked before any SQL: names, body sizes, at most
    /// [`MAX_EVENTS_PER_STATEMENT`] events.
    #[instrument(skip_all, fields(events = events.len()), level = "debug")]
    pub async fn append_many(
        &self,
        client: &(impl Statements + ?Sized),
        events: &[(&str, &[u8])],
    ) -> Result<Vec<Cursor>> {
        if events.len() > MAX_EVENTS_PER_STATEMENT {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a batch appends at most {MAX_EVENTS_PER_STATEMENT} events, not {}",
                    events.len()
                ),
            ));
        }
        let (mut topics, mut bodies) = (Vec::new(), Vec::new());
        for (topic, body) in events {
            check("topic", topic)?;
            check_body(body)?;
            topics.push(*topic);
            bodies.push(*body);
        }
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let params: &[Param<'_>] = &[
            (&topics, Type::TEXT_ARRAY),
            (&bodies, Type::BYTEA_ARRAY),
            (&self.channel, Type::TEXT),
        ];
        let rows = client.run(&self.append_many, params).await?;
        if rows.len() != events.len() {
            return Err(Error::new(
                ErrorKind::Other,
                format!("{} of {} events appended", rows.len(), events.len()),
            ));
        }
        (rows.iter()).map(|row| cursor_at(row, 0)).collect()
    }

    /// [`append`](Self::append) of `value` encoded as MessagePack with named fields; read it
    /// back with [`Event::value`].
    pub async fn append_value<T: Serialize + ?Sized>(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        value: &T,
    ) -> Result<Cursor> {
        let body = crate::signal::to_payload(value)?;
        self.append(client, topic, &body).await
    }

    /// Up to `limit` events of `topic` after `after`, in order, of transactions that have all
    /// ended; reading on from the last one's cursor skips nothing.
    /// [`ErrorKind::Compacted`] when retention deleted events after `after` (the message names
    /// the oldest cursor left to resume from); [`ErrorKind::InvalidConfig`] for a zero limit.
    #[instrument(skip_all, fields(topic, after = %after), level = "debug")]
    pub async fn read(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        after: Cursor,
        limit: u32,
    ) -> Result<Batch> {
        check("topic", topic)?;
        if limit == 0 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "a read asks for at least one event",
            ));
        }
        let limit = i64::from(limit);
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&after.xid, Type::INT8),
            (&after.position, Type::INT8),
            (&limit, Type::INT8),
        ];
        let rows = client.run(&self.read, params).await?;
        if rows.is_empty() {
            // Nothing after the cursor yet, or retention's mark past it (the read's guard):
            // the mark tells which. Marks only move forward, so one past the cursor now was
            // past it at the read too, or trimmed events the cursor never read since.
            if let Some(mark) = self.trimmed(client, topic).await?
                && mark > after
            {
                return Err(Error::new(
                    ErrorKind::Compacted,
                    format!(
                        "topic {topic:?} was trimmed through {mark} (retention), past cursor \
                         {after}: events after the cursor are gone; resume from {mark} or later"
                    ),
                ));
            }
        }
        let events = (rows.iter())
            .map(|row| {
                Ok(Event {
                    cursor: cursor_at(row, 0)?,
                    appended_at: row.try_get(2)?,
                    body: row.try_get(3)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Batch { events })
    }

    /// A cursor at the horizon, the oldest transaction still running: after every event of
    /// transactions that have ended, before any that may still commit. Where a consumer opened
    /// [`Start::Now`](super::Start::Now) begins.
    pub async fn horizon(&self, client: &(impl Statements + ?Sized)) -> Result<Cursor> {
        let rows = client.run(HORIZON, &[]).await?;
        let row = (rows.first())
            .ok_or_else(|| Error::new(ErrorKind::Other, "the horizon returned no row"))?;
        Ok(Cursor {
            xid: row.try_get(0)?,
            position: 0,
        })
    }

    /// How many events of `topic` after `after` a read could read now (of transactions that
    /// have all ended), counted up to `at_most`: a consumer's lag in events, when `after` is its
    /// cursor. It reads that many index entries (≈ 0.1 s for a million).
    pub async fn lag(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        after: Cursor,
        at_most: u32,
    ) -> Result<u64> {
        check("topic", topic)?;
        let at_most = i64::from(at_most);
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&after.xid, Type::INT8),
            (&after.position, Type::INT8),
            (&at_most, Type::INT8),
        ];
        let rows = client.run(&self.lag, params).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Other, "the count returned no row".to_owned()))?;
        Ok(row.try_get::<_, i64>(0)?.max(0) as u64)
    }

    /// Every topic that has events, by name. Counts every event: for operators, not hot paths.
    pub async fn topics(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<TopicInfo>> {
        let rows = client.run(&self.topics, &[]).await?;
        (rows.iter())
            .map(|row| {
                Ok(TopicInfo {
                    topic: row.try_get(0)?,
                    events: row.try_get(1)?,
                    oldest: row.try_get(2)?,
                    newest: row.try_get(3)?,
                })
            })
            .collect()
    }

    /// The oldest running transaction with a transaction id, anywhere on the server, when
    /// there is one: until it ends, readers of every topic read no event appended after it
    /// began. A transaction left open (a stuck migration, an idle session in a transaction)
    /// stops every consumer; `idle_in_transaction_session_timeout` bounds the idle kind. So does
    /// a prepared transaction (`PREPARE TRANSACTION`, named by its [`prepared`](HeldBack::prepared)
    /// gid), which no timeout ends: only `COMMIT PREPARED` or `ROLLBACK PREPARED`. A transaction
    /// that appended cannot itself be prepared (SQLSTATE 0A000: the append's doorbell is a
    /// `NOTIFY`).
    pub async fn held_back(&self, client: &(impl Statements + ?Sized)) -> Result<Option<HeldBack>> {
        let rows = client.run(HELD_BACK, &[]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let ms: i64 = row.try_get(3)?;
        Ok(Some(HeldBack {
            pid: row.try_get(0)?,
            prepared: row.try_get(1)?,
            database: row.try_get(2)?,
            age: Duration::from_millis(ms.max(0) as u64),
        }))
    }
}
