//! Retention: deleting a topic's old events in bounded batches, and the mark that makes a
//! cursor behind them an error.
//!
//! Only events below the horizon are deleted (their transactions have ended, so the order
//! there is final), and the mark is the last deleted event's cursor, moved in the same
//! statement. A cursor at or past the mark has read every deleted event; a cursor before it
//! may have missed some, and reading after it is [`ErrorKind::Compacted`].

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Cursor, Retention, TopicTable, XID, check, cursor_at};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// $1 topic, $2 max age ms or NULL, $3 max events or NULL, $4 batch. Deletes up to $4 events
/// due, oldest first, and moves the mark; the number deleted.
pub(super) fn trim_sql(t: &str, m: &str) -> String {
    format!(
        "WITH horizon AS MATERIALIZED (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),
         keep_from AS (
             SELECT e.xid, e.position FROM {t} AS e
             WHERE e.topic = $1 AND $3::int8 > 0
             ORDER BY e.xid DESC, e.position DESC OFFSET $3::int8 - 1 LIMIT 1
         ), doomed AS (
             SELECT e.xid, e.position FROM {t} AS e
             WHERE e.topic = $1 AND e.xid < (SELECT xmin FROM horizon)
               AND ((e.appended_at < clock_timestamp() - $2::int8 * interval '1 millisecond')
                    OR $3::int8 = 0
                    OR (e.xid, e.position) < (SELECT k.xid, k.position FROM keep_from AS k))
             ORDER BY e.xid, e.position
             LIMIT $4
         ), gone AS (
             DELETE FROM {t} AS e USING doomed AS d
             WHERE e.topic = $1 AND e.xid = d.xid AND e.position = d.position
             RETURNING e.xid, e.position
         ), last AS (
             SELECT xid, position FROM gone ORDER BY xid DESC, position DESC LIMIT 1
         ), marked AS (
             INSERT INTO {m} AS m (topic, xid, position) SELECT $1, xid, position FROM last
             ON CONFLICT (topic) DO UPDATE SET xid = EXCLUDED.xid, position = EXCLUDED.position
             WHERE (m.xid, m.position) < (EXCLUDED.xid, EXCLUDED.position)
         )
         SELECT count(*) FROM gone"
    )
}

/// $1 topic.
pub(super) fn trimmed_sql(m: &str) -> String {
    format!("SELECT xid{XID}, position FROM {m} WHERE topic = $1")
}

impl TopicTable {
    /// Deletes up to `batch` events of `topic` that `retention` no longer keeps, oldest first,
    /// in one statement; returns how many. Call it again while it returns `batch`. Events of
    /// transactions still running, or ordered after one, are kept whatever their age.
    /// [`ErrorKind::InvalidConfig`] for a zero batch.
    #[instrument(skip_all, fields(topic, batch), level = "debug")]
    pub async fn trim(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
        retention: Retention,
        batch: u32,
    ) -> Result<u64> {
        check("topic", topic)?;
        if batch == 0 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "a trim deletes at least one event per statement",
            ));
        }
        let max_age: Option<i64> = retention.max_age.map(crate::lease::millis).transpose()?;
        let max_events: Option<i64> =
            (retention.max_events).map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let batch = i64::from(batch);
        let params: &[Param<'_>] = &[
            (&topic, Type::TEXT),
            (&max_age, Type::INT8),
            (&max_events, Type::INT8),
            (&batch, Type::INT8),
        ];
        let rows = client.run(&self.trim, params).await?;
        let deleted: i64 = rows.first().map_or(Ok(0), |r| r.try_get(0))?;
        Ok(deleted as u64)
    }

    /// The cursor through which retention deleted `topic`'s events: a consumer resumes from it
    /// or later. `None` when nothing was deleted.
    pub async fn trimmed(
        &self,
        client: &(impl Statements + ?Sized),
        topic: &str,
    ) -> Result<Option<Cursor>> {
        check("topic", topic)?;
        let rows = client.run(&self.trimmed, &[(&topic, Type::TEXT)]).await?;
        rows.first().map(|row| cursor_at(row, 0)).transpose()
    }
}
