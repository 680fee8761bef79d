//! The commands that read (and, for `lock release --force`, free) what is in the database.

use std::time::Duration;

use pgcoord::lease::ReleaseRequest;
use pgcoord::{Config, Error, ErrorKind, LeaseInfo, LeaseTable, Result};
use tokio_postgres::Client;

/// `locks`: every lease, one line each.
pub async fn locks(config: &Config, client: &Client) -> Result<()> {
    let table = LeaseTable::new(config);
    let leases = table.list(client).await?;
    println!(
        "{:<32} {:<32} {:>12} {:>10}  DATA",
        "NAME", "OWNER", "TOKEN", "LEFT"
    );
    for lease in &leases {
        println!(
            "{:<32} {:<32} {:>12} {:>10}  {}",
            lease.name,
            lease.owner.as_deref().unwrap_or("(free)"),
            lease.token.map_or("-".into(), |t| t.to_string()),
            left(lease.remaining),
            preview(lease.data.as_deref()),
        );
    }
    println!("{} lease(s)", leases.len());
    Ok(())
}

/// `lock show NAME`.
pub async fn show(config: &Config, client: &Client, name: &str) -> Result<()> {
    let lease = LeaseTable::new(config).get(client, name).await?;
    print_lease(&lease);
    Ok(())
}

fn print_lease(lease: &LeaseInfo) {
    println!("name:   {}", lease.name);
    println!("owner:  {}", lease.owner.as_deref().unwrap_or("(free)"));
    println!(
        "token:  {}",
        lease.token.map_or("-".into(), |t| t.to_string())
    );
    println!("left:   {}", left(lease.remaining));
    println!("held:   {}", lease.is_held());
    println!("data:   {}", preview(lease.data.as_deref()));
}

/// `lock release NAME --force`: ends the current tenure as its holder's release would (the
/// waiter first in line woken), matched on the owner and token just read.
pub async fn release(config: &Config, client: &Client, name: &str, force: bool) -> Result<()> {
    if !force {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "refusing without --force: the holder believes it holds the lease until its next \
             renewal, and may be writing under it now (its fenced writes stop at once)",
        ));
    }
    let table = LeaseTable::new(config);
    let lease = table.get(client, name).await?;
    let (Some(token), Some(owner)) = (lease.token, lease.owner.as_deref()) else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("lease {name:?} is not held"),
        ));
    };
    // As its holder: a release matches owner and token.
    // Announced always: it may be a semaphore's permit or an election's term, whose listeners
    // do not line up.
    let request = ReleaseRequest {
        name,
        token,
        keep: false,
        announce_always: true,
    };
    match table.owner(owner)?.release(client, &request).await {
        Ok(()) => {
            println!(
                "released {name:?} (token {token}, owner {owner}); the holder learns at its next renewal"
            );
            Ok(())
        }
        Err(e) if e.is_lock_lost() => Err(Error::new(
            ErrorKind::FailedPrecondition,
            format!("lease {name:?} changed hands meanwhile; look again"),
        )),
        Err(e) => Err(e),
    }
}

/// `advisory`: advisory locks held or awaited, by key, with their sessions.
pub async fn advisory(client: &Client) -> Result<()> {
    let rows = client
        .query(
            "SELECT ((l.classid::bigint << 32) | l.objid::bigint) AS key, l.mode, l.granted,
                    l.pid, coalesce(a.application_name, '')
             FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.objsubid = 1
             ORDER BY key, l.granted DESC, l.pid",
            &[],
        )
        .await?;
    println!(
        "{:>20} {:<14} {:<8} {:>8}  APPLICATION",
        "KEY", "MODE", "STATE", "PID"
    );
    for row in &rows {
        let granted: bool = row.try_get(2)?;
        println!(
            "{:>20} {:<14} {:<8} {:>8}  {}",
            row.try_get::<_, i64>(0)?,
            row.try_get::<_, String>(1)?,
            if granted { "held" } else { "waiting" },
            row.try_get::<_, i32>(3)?,
            row.try_get::<_, String>(4)?,
        );
    }
    println!("{} advisory lock(s)", rows.len());
    Ok(())
}

/// `status`: sessions by application_name (pgcoord names its sessions `<app> <role>`), leases
/// held and free, the payload table's size and expired rows.
pub async fn status(config: &Config, client: &Client) -> Result<()> {
    let sessions = client
        .query(
            "SELECT application_name, count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name <> ''
             GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?;
    println!("sessions by application_name:");
    for row in &sessions {
        println!(
            "  {:<40} {}",
            row.try_get::<_, String>(0)?,
            row.try_get::<_, i64>(1)?
        );
    }
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
    println!(
        "leases: {} held, {} rows",
        leases.try_get::<_, i64>(0)?,
        leases.try_get::<_, i64>(1)?
    );
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
    println!(
        "payloads: {} rows, {} expired, {} bytes on disk",
        payloads.try_get::<_, i64>(0)?,
        payloads.try_get::<_, i64>(1)?,
        payloads.try_get::<_, i64>(2)?
    );
    Ok(())
}

fn left(remaining: Option<Duration>) -> String {
    match remaining {
        None => "-".into(),
        Some(d) if d.is_zero() => "expired".into(),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

/// Data as text when it is short printable UTF-8, else its size and first bytes in hex.
pub(crate) fn preview(data: Option<&[u8]>) -> String {
    let Some(data) = data else {
        return "-".into();
    };
    match std::str::from_utf8(data) {
        Ok(text) if text.len() <= 60 && !text.chars().any(char::is_control) => {
            format!("{text:?}")
        }
        _ => {
            let head: String = data.iter().take(16).map(|b| format!("{b:02x}")).collect();
            format!("{} bytes: {head}…", data.len())
        }
    }
}
