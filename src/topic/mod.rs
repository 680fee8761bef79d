//! Durable topics: an append-only log per topic in one table, read in one order with no gaps,
//! and named consumers whose cursors are rows of their own.
//!
//! - [`TopicTable`] — the statements of the configured tables, rendered once.
//! - `log` — [`append`](TopicTable::append) inside the caller's transaction (the event exists
//!   if and only if that transaction commits), [`append_many`](TopicTable::append_many), [`read`](TopicTable::read) in order,
//!   [`horizon`](TopicTable::horizon) and [`held_back`](TopicTable::held_back): where readers stop and
//!   what holds them there; [`topics`](TopicTable::topics).
//! - `consumer` — a consumer's cursor: [`open`](TopicTable::open_consumer) from a [`Start`],
//!   [`ack`](TopicTable::ack) forward only (in the consumer's own transaction, next to its
//!   effects and its lease's fence), [`reset`](TopicTable::reset_consumer), lag.
//! - `retention` — [`trim`](TopicTable::trim) by age and count in bounded batches; a cursor
//!   behind what was trimmed is [`ErrorKind::Compacted`](crate::ErrorKind::Compacted).
//! - `pending` — [`read_pending`](TopicTable::read_pending): many topics for one consumer at once,
//!   each from its stored cursor (a worker pool reads its keys' mail so).
//!
//! The order is [`Cursor`]'s: the appending transaction's id, then the number its event drew. A
//! read returns only events of transactions older than every transaction still running, so an
//! event that commits late can never land before what a reader has read: nothing is skipped.
//! Of two events, one appended after the other committed comes later. A transaction that stays
//! open holds every reader back until it ends, a prepared one too; [`held_back`](TopicTable::held_back)
//! names it.
//! The argument is in docs/DESIGN.md, "Durable topics".

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;

use crate::config::{Config, validate_name};
use crate::error::Result;

pub(crate) mod consumer;
pub(crate) mod log;
mod pending;
mod retention;

pub use consumer::ConsumerInfo;
pub use log::{Batch, HeldBack, MAX_BODY_BYTES, MAX_EVENTS_PER_STATEMENT, TopicInfo};
pub use pending::Pending;

/// A place in a topic's order: the appending transaction's id and the event's position. A
/// cursor stands *after* the event it names; [`Cursor::START`] is before every event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cursor {
    /// The appending transaction's id (`xid8`).
    pub xid: i64,
    /// The event's number, drawn when it was appended.
    pub position: i64,
}

impl Cursor {
    /// Before every event.
    pub const START: Cursor = Cursor {
        xid: 0,
        position: 0,
    };
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.xid, self.position)
    }
}

impl std::str::FromStr for Cursor {
    type Err = crate::Error;

    /// `xid/position`, as [`Display`](std::fmt::Display) writes it.
    fn from_str(text: &str) -> Result<Cursor> {
        let parsed = text.split_once('/').and_then(|(xid, position)| {
            Some(Cursor {
                xid: xid.parse().ok().filter(|x: &i64| *x >= 0)?,
                position: position.parse().ok().filter(|p: &i64| *p >= 0)?,
            })
        });
        parsed.ok_or_else(|| {
            crate::Error::new(
                crate::ErrorKind::InvalidConfig,
                format!("a cursor is XID/POSITION, two whole numbers, not {text:?}"),
            )
        })
    }
}

/// One event read from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Where the event is in its topic's order; ack it to move past it.
    pub cursor: Cursor,
    /// When it was appended, on the server's clock (not when it committed).
    pub appended_at: SystemTime,
    /// Its bytes, as appended.
    pub body: Vec<u8>,
}

impl Event {
    /// The body decoded from MessagePack (as [`TopicTable::append_value`] encodes).
    pub fn value<T: DeserializeOwned>(&self) -> Result<T> {
        crate::signal::from_payload(&self.body)
    }
}

/// Where a new consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Start {
    /// From the oldest event retention kept.
    Oldest,
    /// After every event whose transaction had ended when the consumer was opened: it gets what
    /// commits from then on (and what was still being appended then).
    Now,
    /// After this cursor.
    After(Cursor),
    /// From the first event, in the topic's order, appended at or after this time.
    Time(SystemTime),
}

/// How much of a topic [`TopicTable::trim`] keeps: events older than `max_age`, and events
/// beyond the newest `max_events`, are deleted. `None` keeps everything on that count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// The oldest an event may be, by the time it was appended.
    pub max_age: Option<Duration>,
    /// How many of the newest events to keep.
    pub max_events: Option<u64>,
}

/// The statements of the durable topics' tables of one configuration.
#[derive(Debug, Clone)]
pub struct TopicTable {
    append: String,
    append_many: String,
    read: String,
    lag: String,
    topics: String,
    open: String,
    cursor: String,
    ack: String,
    reset: String,
    consumers: String,
    pending: String,
    trim: String,
    trimmed: String,
    channel: String,
    /// Whether appends ring (not in a poll-only deployment, where nobody listens).
    doorbell: bool,
}

impl TopicTable {
    /// Renders the statements for `config`'s topic tables.
    pub fn new(config: &Config) -> TopicTable {
        let t = config.topic_table.quoted();
        let c = config.topic_cursors().quoted();
        let m = config.topic_trimmed().quoted();
        TopicTable {
            append: log::append_sql(config),
            append_many: log::append_many_sql(&t, config),
            read: log::read_sql(config),
            lag: log::lag_sql(&t),
            topics: log::topics_sql(&t),
            open: consumer::open_sql(&t, &c, &m),
            cursor: consumer::cursor_sql(&c),
            ack: consumer::ack_sql(config),
            reset: consumer::reset_sql(&c),
            consumers: consumer::consumers_sql(&t, &c),
            pending: pending::pending_sql(&t, &c, &m),
            trim: retention::trim_sql(&t, &m),
            trimmed: retention::trimmed_sql(&m),
            channel: config.topic_table.name().as_str().to_owned(),
            doorbell: !config.poll_only(),
        }
    }

    /// The channel on which appends ring (the topic table's unqualified name): the payload is
    /// the topic's name. A doorbell: readers read the table, never the notification.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The SQL text of the statement `name` (`append` or `read`). Not part of the API: the
    /// isolation tests run the statements themselves, in the interleavings they choose.
    #[doc(hidden)]
    pub fn sql_text(&self, name: &str) -> Option<&str> {
        match name {
            "append" => Some(&self.append),
            "read" => Some(&self.read),
            _ => None,
        }
    }
}

/// A topic or consumer name: 1 to 255 bytes, no NUL.
pub(crate) fn check(what: &str, name: &str) -> Result<()> {
    validate_name(what, name.to_owned()).map(drop)
}

/// The cursor in columns `first` (the xid, as `int8`) and `first + 1` of `row`.
fn cursor_at(row: &tokio_postgres::Row, first: usize) -> Result<Cursor> {
    Ok(Cursor {
        xid: row.try_get(first)?,
        position: row.try_get(first + 1)?,
    })
}

/// `xid8` travels as text: tokio-postgres has no type for it.
const XID: &str = "::text::int8";
/// A parameter `$n` (an `int8`) as `xid8`.
fn xid_param(n: usize) -> String {
    format!("${n}::int8::text::xid8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_order_by_transaction_then_position_and_read_back_as_written() {
        let (a, b) = (
            Cursor {
                xid: 7,
                position: 90,
            },
            Cursor {
                xid: 8,
                position: 1,
            },
        );
        assert!(Cursor::START < a && a < b, "the transaction first");
        assert_eq!(a.to_string().parse::<Cursor>().unwrap(), a);
        for bad in ["", "7", "7/", "/1", "x/1", "7/-1", "-7/1", "7/1/2"] {
            let err = bad.parse::<Cursor>().unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{bad:?}");
        }
    }
}
