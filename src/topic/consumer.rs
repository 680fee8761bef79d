//! Consumers' cursors: one row per (topic, consumer), opened from a [`Start`], moved forward by
//! acks in the consumer's own transaction, reset by hand.
//!
//! Delivery is at least once: a consumer reads after its cursor and acks what it handled. An
//! ack in the same transaction as the handler's effects, after the fence of the lease that makes
//! it the one active instance, commits effects and cursor together or not at all: each event's
//! effects are applied exactly once.

use std::time::SystemTime;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Cursor, Start, TopicTable, XID, check, cursor_at, xid_param};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// A consumer's cursor and how far behind its topic it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerInfo {
    /// The topic it reads.
    pub topic: String,
    /// The consumer's name.
    pub consumer: String,
    /// What it has acknowledged through.
    pub cursor: Cursor,
    /// When its cursor last moved (or was opened or reset), on the server's clock.
    pub acked_at: SystemTime,
    /// Committed events after its cursor.
    pub lag_events: i64,
    /// When the first event after its cursor was appended: its lag in time. `None` when it is
    /// caught up.
    pub oldest_unacked: Option<SystemTime>,
}

/// $1 topic, $2 consumer, $3 start ('oldest', 'now', 'after', 'time'), $4 and $5 a cursor,
/// $6 a time. Inserts the consumer at its start unless it exists; returns its cursor and
/// whether it was opened now.
pub(super) fn open_sql(t: &str, c: &str, m: &str) -> String {
    format!(
        "WITH horizon AS MATERIALIZED (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),
         mark AS (SELECT xid, position FROM {m} WHERE topic = $1),
         first_at AS (
             SELECT e.xid, e.position FROM {t} AS e
             WHERE e.topic = $1 AND $3 = 'time' AND e.appended_at >= $6
             ORDER BY e.xid, e.position LIMIT 1
         ), at_time AS (
             -- Just before the first event appended at or after the time; when that event's
             -- transaction is not older than the horizon, from the horizon (earlier ones may
             -- still commit): more events rather than fewer.
             SELECT coalesce(f.xid, h.xmin) AS xid, coalesce(f.position - 1, 0) AS position
             FROM horizon AS h LEFT JOIN first_at AS f ON f.xid < h.xmin
         ), start AS (
             SELECT CASE $3 WHEN 'oldest' THEN coalesce((SELECT xid FROM mark), '0'::xid8)
                            WHEN 'now' THEN (SELECT xmin FROM horizon)
                            WHEN 'after' THEN {x}
                            ELSE (SELECT xid FROM at_time) END AS xid,
                    CASE $3 WHEN 'oldest' THEN coalesce((SELECT position FROM mark), 0)
                            WHEN 'now' THEN 0
                            WHEN 'after' THEN $5
                            ELSE (SELECT position FROM at_time) END AS position
         ), opened AS (
             INSERT INTO {c} (topic, consumer, xid, position)
             SELECT $1, $2, xid, position FROM start
             ON CONFLICT (topic, consumer) DO NOTHING
             RETURNING xid, position
         )
         SELECT xid{XID}, position, true FROM opened
         UNION ALL
         SELECT xid{XID}, position, false FROM {c}
         WHERE topic = $1 AND consumer = $2 AND NOT EXISTS (SELECT 1 FROM opened)",
        x = xid_param(4),
    )
}

/// $1 topic, $2 consumer.
pub(super) fn cursor_sql(c: &str) -> String {
    format!("SELECT xid{XID}, position FROM {c} WHERE topic = $1 AND consumer = $2")
}

/// $1 topic, $2 consumer, $3 and $4 the cursor. Whether it moved.
pub(crate) fn ack_sql(config: &crate::Config) -> String {
    // The migrations' function, which any driver calls too: forward only; PC002
    // (`ErrorKind::NotFound`) when the consumer was never opened.
    let f = config.sql_function("pgcoord_topics_ack").quoted();
    format!("SELECT {f}($1, $2, $3, $4)")
}

/// $1 topic, $2 consumer, $3 and $4 the cursor. Anywhere, backwards too.
pub(super) fn reset_sql(c: &str) -> String {
    format!(
        "UPDATE {c} SET xid = {x}, position = $4, acked_at = clock_timestamp()
         WHERE topic = $1 AND consumer = $2 RETURNING 1",
        x = xid_param(3),
    )
}

/// $1 topic. Every consumer with its lag.
pub(super) fn consumers_sql(t: &str, c: &str) -> String {
    format!(
        "SELECT c.consumer, c.xid{XID}, c.position, c.acked_at,
             (SELECT count(*) FROM {t} AS e
              WHERE e.topic = c.topic AND (e.xid, e.position) > (c.xid, c.position)),
             (SELECT e.appended_at FROM {t} AS e
              WHERE e.topic = c.topic AND (e.xid, e.position) > (c.xid, c.position)
              ORDER BY e.xid, e.position LIMIT 1),
             c.topic::text
         FROM {c} AS c WHERE $1::text IS NULL OR c.topic = $1 ORDER BY c.topic, c.consumer"
    )
}

impl TopicTable {
    /// Opens `consumer` of `topic`: creates its cursor at `start` unless it exists, and returns
    /// the cursor it has (a stored cursor wins over `start`). Safe to repeat and to race.
    #[instrument(skip_all, fields(topic, consumer), level = "debug")]
    pub async fn open_consumer(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        consumer: &str,
        start: Start,
    ) -> Result<Cursor> {
        check("topic", topic)?;
        check("consumer", consumer)?;
        let (kind, after, time) = match start {
            Start::Oldest => ("oldest", Cursor::START, SystemTime::UNIX_EPOCH),
            Start::Now => ("now", Cursor::START, SystemTime::UNIX_EPOCH),
            Start::After(cursor) => ("after", cursor, SystemTime::UNIX_EPOCH),
            Start::Time(time) => ("time", Cursor::START, time),
        };
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&consumer, Type::TEXT),
            (&kind, Type::TEXT),
            (&after.xid, Type::INT8),
            (&after.position, Type::INT8),
            (&time, Type::TIMESTAMPTZ),
        ];
        let rows = client.run(&self.open, params).await?;
        let row = rows.first().ok_or_else(|| {
            Error::new(
                ErrorKind::Other,
                format!("consumer {consumer:?} was not opened"),
            )
        })?;
        cursor_at(row, 0)
    }

    /// The cursor of `consumer` of `topic`; [`ErrorKind::NotFound`] when it was never opened.
    pub async fn cursor(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        consumer: &str,
    ) -> Result<Cursor> {
        check("topic", topic)?;
        check("consumer", consumer)?;
        let params: &[Param<'_>] = &[(&topic, Type::TEXT), (&consumer, Type::TEXT)];
        let rows = client.run(&self.cursor, params).await?;
        let row = rows.first().ok_or_else(|| not_opened(topic, consumer))?;
        cursor_at(row, 0)
    }

    /// Moves the cursor of `consumer` of `topic` forward to `cursor`: the consumer has handled
    /// every event through it. Run it in the transaction of the handler's effects, after the
    /// fence of the consumer's lease, so effects and cursor commit together. False when the
    /// cursor was already there or past it (nothing changed); [`ErrorKind::NotFound`] when the
    /// consumer was never opened.
    #[instrument(skip_all, fields(topic, consumer, cursor = %cursor), level = "debug")]
    pub async fn ack(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        consumer: &str,
        cursor: Cursor,
    ) -> Result<bool> {
        check("topic", topic)?;
        check("consumer", consumer)?;
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&consumer, Type::TEXT),
            (&cursor.xid, Type::INT8),
            (&cursor.position, Type::INT8),
        ];
        let rows = client.run(&self.ack, params).await?;
        let row = rows.first().ok_or_else(|| not_opened(topic, consumer))?;
        Ok(row.try_get(0)?)
    }

    /// Puts the cursor of `consumer` of `topic` at `cursor`, backwards too: the consumer gets
    /// every event after it again. [`ErrorKind::NotFound`] when it was never opened.
    pub async fn reset_consumer(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        consumer: &str,
        cursor: Cursor,
    ) -> Result<()> {
        check("topic", topic)?;
        check("consumer", consumer)?;
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&consumer, Type::TEXT),
            (&cursor.xid, Type::INT8),
            (&cursor.position, Type::INT8),
        ];
        if client.run(&self.reset, params).await?.is_empty() {
            return Err(not_opened(topic, consumer));
        }
        Ok(())
    }

    /// [`reset_consumer`](Self::reset_consumer) to a place named as operators name it:
    /// `oldest` (the first event retention kept: everything is handed over again), `now` (past
    /// every event whose transaction has ended: the backlog skipped) or `XID/POSITION`. The
    /// cursor before and after.
    pub async fn reset_consumer_to(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        consumer: &str,
        to: &str,
    ) -> Result<(Cursor, Cursor)> {
        let cursor = match to {
            "oldest" => self.trimmed(client, topic).await?.unwrap_or(Cursor::START),
            "now" => self.horizon(client).await?,
            cursor => cursor.parse()?,
        };
        let before = self.cursor(client, topic, consumer).await?;
        self.reset_consumer(client, topic, consumer, cursor).await?;
        Ok((before, cursor))
    }

    /// Every consumer of `topic`, by name, with its cursor and lag. The lag counts events, so it
    /// reads the index of every event behind each consumer: for dashboards, not hot paths.
    pub async fn consumers(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
    ) -> Result<Vec<ConsumerInfo>> {
        check("topic", topic)?;
        self.consumers_of(client, Some(topic)).await
    }

    /// Every consumer of every topic, by topic and name, with its cursor and lag: one
    /// statement, for dashboards (as [`consumers`](Self::consumers)).
    pub async fn all_consumers(
        &self,
        client: &(impl Statements + ?Sized),
    ) -> Result<Vec<ConsumerInfo>> {
        self.consumers_of(client, None).await
    }

    async fn consumers_of(
        &self,
        client: &(impl Statements + ?Sized),
        topic: Option<&str>,
    ) -> Result<Vec<ConsumerInfo>> {
        let rows = client.run(&self.consumers, &[(&topic, Type::TEXT)]).await?;
        rows.iter()
            .map(|row| {
                Ok(ConsumerInfo {
                    topic: row.try_get(6)?,
                    consumer: row.try_get(0)?,
                    cursor: cursor_at(row, 1)?,
                    acked_at: row.try_get(3)?,
                    lag_events: row.try_get(4)?,
                    oldest_unacked: row.try_get(5)?,
                })
            })
            .collect()
    }
}

fn not_opened(topic: &str, consumer: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("consumer {consumer:?} of topic {topic:?} was never opened"),
    )
}
