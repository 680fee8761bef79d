//! The commands that read (and, for `lock release --force`, free) what is in the database.

use std::time::Duration;

use pgcoord::{Config, Error, ErrorKind, LeaseTable, Result};
use serde_json::Value;
use tokio_postgres::Client;

use crate::output::{self, Listing, seconds, text};

/// `locks`: every lease, one line each, with how many wait in line for it.
pub async fn locks(config: &Config, client: &Client, json: bool) -> Result<()> {
    let table = LeaseTable::new(config);
    let leases = table.list(client).await?;
    let waiting = waiters(config, client).await?;
    let mut listing = Listing::new(
        &["NAME", "OWNER", "TOKEN", "LEFT", "WAITERS", "DATA"],
        "lease(s)",
    );
    for lease in &leases {
        let waiters = waiting.iter().filter(|(name, _, _)| *name == lease.name);
        listing.push(vec![
            lease.name.clone().into(),
            lease.owner.clone().map_or("(free)".into(), Value::from),
            lease.token.into(),
            left(lease.remaining),
            waiters.count().into(),
            output::data(lease.data.as_deref()),
        ]);
    }
    listing.print(json);
    Ok(())
}

/// `lock show NAME`: the lease and its line of waiters, first first.
pub async fn show(config: &Config, client: &Client, name: &str, json: bool) -> Result<()> {
    let lease = LeaseTable::new(config).get(client, name).await?;
    let line: Vec<Value> = (waiters(config, client).await?.into_iter())
        .filter(|(waited, _, _)| waited == name)
        .map(|(_, waiter, left)| serde_json::json!({ "waiter": waiter, "left": seconds(left) }))
        .collect();
    if json {
        let shown = serde_json::json!({
            "name": lease.name,
            "owner": lease.owner,
            "token": lease.token,
            "left": left(lease.remaining),
            "held": lease.is_held(),
            "data": output::data(lease.data.as_deref()),
            "waiters": line,
        });
        println!("{shown}");
        return Ok(());
    }
    println!("name:    {}", lease.name);
    println!("owner:   {}", lease.owner.as_deref().unwrap_or("(free)"));
    println!(
        "token:   {}",
        lease.token.map_or("-".into(), |t| t.to_string())
    );
    println!("left:    {}", text(&left(lease.remaining)));
    println!("held:    {}", lease.is_held());
    println!("data:    {}", text(&output::data(lease.data.as_deref())));
    println!("waiters: {}", line.len());
    for waiter in &line {
        println!(
            "  {} ({}s left in line)",
            waiter["waiter"].as_str().unwrap_or("?"),
            waiter["left"]
        );
    }
    Ok(())
}

/// Every live place in the waiters' line: (name, waiter, time left in line), in line order.
async fn waiters(config: &Config, client: &Client) -> Result<Vec<(String, String, Duration)>> {
    let line = LeaseTable::new(config).line(client).await?;
    Ok(line
        .into_iter()
        .map(|p| (p.name, p.waiter, p.left))
        .collect())
}

/// Asks the leader of election `name` to step down.
pub async fn resign(config: &Config, client: &Client, name: &str) -> Result<()> {
    let table = LeaseTable::new(config);
    match table.request_resign(client, name, config.owner()).await? {
        Some(token) => {
            println!("asked the leader of {name:?} (term {token}) to step down");
            Ok(())
        }
        None => Err(Error::new(
            ErrorKind::NotFound,
            format!("no one leads {name:?}"),
        )),
    }
}

/// `limit NAME [PERMITS]`: shows the stored limit of semaphore `name`, or sets it.
pub async fn limit(
    config: &Config,
    client: &Client,
    name: &str,
    permits: Option<u32>,
) -> Result<()> {
    let table = LeaseTable::new(config);
    let Some(permits) = permits else {
        return match table.limit(client, name).await? {
            Some(permits) => {
                println!("{permits}");
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("semaphore {name:?} has no stored limit"),
            )),
        };
    };
    let change = table.set_limit(client, name, permits).await?;
    match change.previous {
        Some(previous) => println!("limit of {name:?}: {previous} -> {permits}"),
        None => println!("limit of {name:?}: {permits}"),
    }
    if change.revoked > 0 {
        println!(
            "{} permit(s) taken back; their holders learn at their next renewal",
            change.revoked
        );
    }
    Ok(())
}

/// `lock release NAME --force`: ends the current tenure as its holder's release would (the
/// waiter first in line woken), matched on the owner and token just read. A limited
/// semaphore's slot keeps its row, free (its slots' rows are made only by a change of limit).
pub async fn release(config: &Config, client: &Client, name: &str, force: bool) -> Result<()> {
    if !force {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "refusing without --force: the holder believes it holds the lease until its next \
             renewal, and may be writing under it now (its fenced writes stop at once)",
        ));
    }
    let (owner, token) = LeaseTable::new(config)
        .force_release(client, name, None)
        .await?;
    println!(
        "released {name:?} (token {token}, owner {owner}); the holder learns at its next renewal"
    );
    Ok(())
}

/// `advisory`: advisory locks held or awaited, by key, with their sessions. A lock taken with
/// one `bigint` key shows it; one taken with two `int` keys shows `K1,K2`.
pub async fn advisory(client: &Client, json: bool) -> Result<()> {
    let locks = pgcoord::advisory::list(client).await?;
    let mut listing = Listing::new(
        &["KEY", "MODE", "STATE", "PID", "APPLICATION"],
        "advisory lock(s)",
    );
    for lock in locks {
        listing.push(vec![
            lock.key.into(),
            lock.mode.into(),
            if lock.granted { "held" } else { "waiting" }.into(),
            lock.pid.into(),
            lock.application.into(),
        ]);
    }
    listing.print(json);
    Ok(())
}

/// `status`: sessions by application_name (pgcoord names its sessions `<app> <role>`), leases
/// held and free, the payload table's size and expired rows.
pub async fn status(config: &Config, client: &Client, json: bool) -> Result<()> {
    let sessions = client
        .query(
            "SELECT application_name, count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name <> ''
             GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?;
    let leases = client
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE owner IS NOT NULL AND expires_at > clock_timestamp()),
                        count(*)
                 FROM {}",
                config.lock_table().quoted()
            ),
            &[],
        )
        .await?;
    let payloads = client
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE expires_at < now()),
                        pg_total_relation_size(to_regclass($1::text))
                 FROM {}",
                config.payload_table().quoted()
            ),
            &[&config.payload_table().quoted()],
        )
        .await?;
    let sessions: Vec<(String, i64)> = (sessions.iter())
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_>>()?;
    let (held, rows): (i64, i64) = (leases.try_get(0)?, leases.try_get(1)?);
    let (stored, expired, bytes): (i64, i64, i64) = (
        payloads.try_get(0)?,
        payloads.try_get(1)?,
        payloads.try_get(2)?,
    );
    if json {
        let by_name: serde_json::Map<String, Value> = (sessions.into_iter())
            .map(|(name, n)| (name, n.into()))
            .collect();
        let shown = serde_json::json!({
            "sessions": by_name,
            "leases": { "held": held, "rows": rows },
            "payloads": { "rows": stored, "expired": expired, "bytes": bytes },
        });
        println!("{shown}");
        return Ok(());
    }
    println!("sessions by application_name:");
    let width = sessions
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    for (name, count) in &sessions {
        println!("  {name:<width$}  {count}");
    }
    println!("leases: {held} held, {rows} rows");
    println!("payloads: {stored} rows, {expired} expired, {bytes} bytes on disk");
    Ok(())
}

/// Time left on the server's clock: seconds, `expired`, or null for a free lease.
fn left(remaining: Option<Duration>) -> Value {
    match remaining {
        None => Value::Null,
        Some(d) if d.is_zero() => "expired".into(),
        Some(d) => seconds(d),
    }
}
