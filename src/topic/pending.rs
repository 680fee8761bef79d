//! Reading many topics for one consumer at once, each from the consumer's stored cursor: what a
//! worker pool's member reads for the keys it holds (a topic per key) in one statement.

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Cursor, Event, TopicTable, XID, check, cursor_at};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// What [`TopicTable::read_pending`] found in one topic.
#[derive(Debug)]
#[non_exhaustive]
pub struct Pending {
    /// The topic.
    pub topic: String,
    /// Where the read began: the consumer's stored cursor, or, when it has none yet, the oldest
    /// event kept. Open the consumer there ([`Start::After`](super::Start::After)) before acking.
    pub from: Cursor,
    /// The events after `from`, in order; or [`ErrorKind::Compacted`] when retention deleted
    /// events after the stored cursor (never a silent jump).
    pub events: Result<Vec<Event>>,
}

/// $1 consumer, $2 topics, $3 limit per topic. For each topic: where its consumer's cursor is
/// (or the retention mark, or the start), and whether the mark is past it; the events after it
/// below the horizon (as `read_sql`), unless the mark is past it. Only topics with events or
/// behind their mark come back.
pub(super) fn pending_sql(t: &str, c: &str, m: &str) -> String {
    format!(
        "SELECT k.topic, at.xid{XID}, at.position, at.behind, m.xid{XID}, m.position,
                e.xid{XID}, e.position, e.appended_at, e.body
         FROM unnest($2::text[]) AS k(topic)
         LEFT JOIN {m} AS m ON m.topic = k.topic
         LEFT JOIN {c} AS c ON c.topic = k.topic AND c.consumer = $1
         CROSS JOIN LATERAL (
             SELECT coalesce(c.xid, m.xid, '0'::xid8) AS xid,
                    coalesce(c.position, m.position, 0) AS position,
                    coalesce((m.xid, m.position) > (c.xid, c.position), false) AS behind
         ) AS at
         LEFT JOIN LATERAL (
             SELECT e.xid, e.position, e.appended_at, e.body FROM {t} AS e
             WHERE e.topic = k.topic AND (e.xid, e.position) > (at.xid, at.position)
               AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
             ORDER BY e.xid, e.position
             LIMIT $3
         ) AS e ON NOT at.behind
         WHERE at.behind OR e.xid IS NOT NULL
         ORDER BY k.topic, e.xid, e.position"
    )
}

impl TopicTable {
    /// Up to `limit` events of each of `topics` after `consumer`'s stored cursor in it (from the
    /// oldest event kept where it has none), in one statement: the topics that have events, or
    /// whose cursor retention left behind ([`ErrorKind::Compacted`] for that topic alone).
    /// At most 10,000 topics; a topic listed twice is read once.
    #[instrument(skip_all, fields(consumer, topics = topics.len()), level = "debug")]
    pub async fn read_pending(
        &self,
        client: &(impl Statements + ?Sized),
        consumer: &str,
        topics: &[&str],
        limit: u32,
    ) -> Result<Vec<Pending>> {
        check("consumer", consumer)?;
        for topic in topics {
            check("topic", topic)?;
        }
        if limit == 0 || topics.len() > 10_000 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "a read of pending events asks for at least one event of at most 10000 topics",
            ));
        }
        let mut unique = topics.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let limit = i64::from(limit);
        let params: &[Param<'_>] = &[
            (&consumer, Type::TEXT),
            (&unique, Type::TEXT_ARRAY),
            (&limit, Type::INT8),
        ];
        let rows = client.run(&self.pending, params).await?;
        let mut found: Vec<Pending> = Vec::new();
        for row in &rows {
            let topic: &str = row.try_get(0)?;
            if found.last().is_none_or(|p| p.topic != topic) {
                let from = cursor_at(row, 1)?;
                let events = if row.try_get::<_, bool>(3)? {
                    let mark = cursor_at(row, 4)?;
                    Err(Error::new(
                        ErrorKind::Compacted,
                        format!(
                            "topic {topic:?} was trimmed through {mark} (retention), past \
                             consumer {consumer:?}'s cursor {from}: resume from {mark} or later"
                        ),
                    ))
                } else {
                    Ok(Vec::new())
                };
                found.push(Pending {
                    topic: topic.to_owned(),
                    from,
                    events,
                });
            }
            if let (Some(Ok(events)), Some(xid)) =
                (found.last_mut().map(|p| &mut p.events), row.try_get(6)?)
            {
                events.push(Event {
                    cursor: Cursor {
                        xid,
                        position: row.try_get(7)?,
                    },
                    appended_at: row.try_get(8)?,
                    body: row.try_get(9)?,
                });
            }
        }
        Ok(found)
    }
}
