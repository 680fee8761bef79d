//! `topics`: durable topics for operators — what is there and how old, each consumer's lag,
//! the last events, and moving a consumer's cursor by hand.

use std::time::{Duration, SystemTime};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord::{Config, Error, ErrorKind, Result};
use tokio_postgres::Client;

use serde_json::Value;

use crate::output::{self, Listing, seconds};

/// `topics`: every topic with its events' count and age, and what holds readers back.
pub async fn list(config: &Config, client: &Client, json: bool) -> Result<()> {
    let table = TopicTable::new(config);
    let topics = table.topics(client).await?;
    let mut listing = Listing::new(&["TOPIC", "EVENTS", "OLDEST", "NEWEST"], "topic(s)");
    for topic in &topics {
        listing.push(vec![
            topic.topic.clone().into(),
            topic.events.into(),
            age(Some(topic.oldest)),
            age(Some(topic.newest)),
        ]);
    }
    listing.print(json);
    held_back(&table, client).await
}

/// `topics consumers TOPIC`: each consumer's cursor and lag.
pub async fn consumers(config: &Config, client: &Client, topic: &str, json: bool) -> Result<()> {
    let table = TopicTable::new(config);
    let consumers = table.consumers(client, topic).await?;
    let mut listing = Listing::new(
        &["CONSUMER", "CURSOR", "LAG", "LAG AGE", "ACKED"],
        "consumer(s)",
    );
    for c in &consumers {
        listing.push(vec![
            c.consumer.clone().into(),
            c.cursor.to_string().into(),
            c.lag_events.into(),
            age(c.oldest_unacked),
            age(Some(c.acked_at)),
        ]);
    }
    listing.print(json);
    if let Some(trimmed) = table.trimmed(client, topic).await? {
        eprintln!("retention deleted through {trimmed}");
    }
    held_back(&table, client).await
}

/// `topics tail TOPIC --count N`: the last N events that can be read, oldest first.
pub async fn tail(
    config: &Config,
    client: &Client,
    topic: &str,
    count: u32,
    json: bool,
) -> Result<()> {
    pgcoord::config::validate_name("topic", topic.to_owned())?;
    let sql = format!(
        "SELECT * FROM (
             SELECT e.xid::text::int8, e.position, e.appended_at, e.body FROM {} AS e
             WHERE e.topic = $1 AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
             ORDER BY e.xid DESC, e.position DESC LIMIT $2) AS last
         ORDER BY 1, 2",
        config.topic_table().quoted()
    );
    let rows = client.query(&sql, &[&topic, &i64::from(count)]).await?;
    let mut listing = Listing::new(&["CURSOR", "AGE", "BODY"], "event(s)");
    for row in &rows {
        let cursor = Cursor {
            xid: row.try_get(0)?,
            position: row.try_get(1)?,
        };
        let body: Vec<u8> = row.try_get(3)?;
        listing.push(vec![
            cursor.to_string().into(),
            age(Some(row.try_get(2)?)),
            output::data(Some(&body)),
        ]);
    }
    listing.print(json);
    Ok(())
}

/// `topics reset TOPIC CONSUMER --to oldest|now|XID/POSITION --force`.
pub async fn reset(
    config: &Config,
    client: &Client,
    topic: &str,
    consumer: &str,
    to: &str,
    force: bool,
) -> Result<()> {
    if !force {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "refusing without --force: a running consumer may ack past the new cursor at once, \
             and moving it forward skips events for good",
        ));
    }
    let (before, cursor) = TopicTable::new(config)
        .reset_consumer_to(client, topic, consumer, to)
        .await?;
    println!("consumer {consumer:?} of {topic:?}: cursor {before} -> {cursor}");
    Ok(())
}

/// The oldest transaction on the server, when one holds readers back.
async fn held_back(table: &TopicTable, client: &Client) -> Result<()> {
    if let Some(held) = table.held_back(client).await? {
        // A prepared transaction has no backend: its gid is what ends it.
        let which = match &held.prepared {
            Some(gid) => format!("the prepared transaction {gid:?}"),
            None => format!("pid {}", held.pid),
        };
        eprintln!(
            "readers wait for transactions from {:.1}s ago on: {which} ({})",
            held.age.as_secs_f64(),
            held.database.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// How long ago, on this machine's clock, in seconds; null when never.
fn age(at: Option<SystemTime>) -> Value {
    at.map_or(Value::Null, |t| {
        seconds(
            SystemTime::now()
                .duration_since(t)
                .unwrap_or(Duration::ZERO),
        )
    })
}
