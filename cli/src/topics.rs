//! `topics`: durable topics for operators — what is there and how old, each consumer's lag,
//! the last events, and moving a consumer's cursor by hand.

use std::time::{Duration, SystemTime};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord::{Config, Error, ErrorKind, Result};
use tokio_postgres::Client;

use crate::inspect::preview;

/// `topics`: every topic with its events' count and age, and what holds readers back.
pub async fn list(config: &Config, client: &Client) -> Result<()> {
    let table = TopicTable::new(config);
    let topics = table.topics(client).await?;
    println!(
        "{:<40} {:>10} {:>12} {:>12}",
        "TOPIC", "EVENTS", "OLDEST", "NEWEST"
    );
    for topic in &topics {
        println!(
            "{:<40} {:>10} {:>12} {:>12}",
            topic.topic,
            topic.events,
            age(Some(topic.oldest)),
            age(Some(topic.newest))
        );
    }
    println!("{} topic(s)", topics.len());
    held_back(&table, client).await
}

/// `topics consumers TOPIC`: each consumer's cursor and lag.
pub async fn consumers(config: &Config, client: &Client, topic: &str) -> Result<()> {
    let table = TopicTable::new(config);
    let consumers = table.consumers(client, topic).await?;
    println!(
        "{:<32} {:>24} {:>10} {:>12} {:>12}",
        "CONSUMER", "CURSOR", "LAG", "LAG AGE", "ACKED"
    );
    for c in &consumers {
        println!(
            "{:<32} {:>24} {:>10} {:>12} {:>12}",
            c.consumer,
            c.cursor.to_string(),
            c.lag_events,
            age(c.oldest_unacked),
            age(Some(c.acked_at))
        );
    }
    println!("{} consumer(s) of {topic:?}", consumers.len());
    if let Some(trimmed) = table.trimmed(client, topic).await? {
        println!("retention deleted through {trimmed}");
    }
    held_back(&table, client).await
}

/// `topics tail TOPIC --count N`: the last N events that can be read, oldest first.
pub async fn tail(config: &Config, client: &Client, topic: &str, count: u32) -> Result<()> {
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
    println!("{:<24} {:>12}  BODY", "CURSOR", "AGE");
    for row in &rows {
        let cursor = Cursor {
            xid: row.try_get(0)?,
            position: row.try_get(1)?,
        };
        let body: Vec<u8> = row.try_get(3)?;
        println!(
            "{:<24} {:>12}  {}",
            cursor.to_string(),
            age(Some(row.try_get(2)?)),
            preview(Some(&body))
        );
    }
    println!("{} event(s)", rows.len());
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
    let table = TopicTable::new(config);
    let cursor = match to {
        "oldest" => table.trimmed(client, topic).await?.unwrap_or(Cursor::START),
        "now" => {
            // After every event whose transaction has ended; read from what retention kept.
            let kept = table.trimmed(client, topic).await?.unwrap_or(Cursor::START);
            let horizon = table.read(client, topic, kept, 1).await?.horizon;
            Cursor {
                xid: horizon,
                position: 0,
            }
        }
        cursor => cursor.parse()?,
    };
    let before = table.cursor(client, topic, consumer).await?;
    table
        .reset_consumer(client, topic, consumer, cursor)
        .await?;
    println!("consumer {consumer:?} of {topic:?}: cursor {before} -> {cursor}");
    Ok(())
}

/// The oldest transaction on the server, when one holds readers back.
async fn held_back(table: &TopicTable, client: &Client) -> Result<()> {
    if let Some(held) = table.held_back(client).await? {
        println!(
            "readers wait for transactions from {:.1}s ago on: pid {} ({})",
            held.age.as_secs_f64(),
            held.pid,
            held.database.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// How long ago, on this machine's clock.
fn age(at: Option<SystemTime>) -> String {
    match at.map(|t| {
        SystemTime::now()
            .duration_since(t)
            .unwrap_or(Duration::ZERO)
    }) {
        None => "-".into(),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}
