//! Helpers for tests and examples: which server to use, and names nobody else uses.

use super::TempPostgres;
use pgcoord::error::{Error, ErrorKind, Result};

/// Connection settings for tests: `DATABASE_URL` when it is set, else the [shared](TempPostgres::shared)
/// throwaway cluster of this process.
pub fn test_pg_config() -> Result<tokio_postgres::Config> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url.parse().map_err(|e| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("invalid DATABASE_URL: {e}"),
            )
        }),
        _ => Ok(TempPostgres::shared()?.pg_config()),
    }
}

/// A name no other test, process or run is using: `prefix` plus process id and a counter, to
/// give each test its own tables, channels and keys so tests run in parallel.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        // Random per call: two runs started in the same instant still differ.
        pgcoord::signal::new_id() % 10_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Connection settings for examples: `DATABASE_URL` when it is set, else a new throwaway cluster,
/// returned too so the caller keeps it alive (it is removed when dropped).
pub fn from_env_or_start() -> Result<(Option<TempPostgres>, tokio_postgres::Config)> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            let pg = url.parse().map_err(|e| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    format!("invalid DATABASE_URL: {e}"),
                )
            })?;
            Ok((None, pg))
        }
        _ => {
            let server = TempPostgres::start()?;
            let pg = server.pg_config();
            Ok((Some(server), pg))
        }
    }
}

/// Waits until `done` answers true, checking every 20 ms; panics naming `what` after `within`.
/// For tests of things that happen eventually (a rebalance, a takeover).
pub async fn eventually(
    within: std::time::Duration,
    what: &str,
    mut done: impl AsyncFnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    while !done().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `server`'s user, database and password, pointed at `127.0.0.1:port` instead: a proxy or a
/// pooler standing in front of it. A fresh config, since `tokio_postgres::Config::host` adds a
/// host rather than replacing it.
pub(crate) fn pointed_at(server: &tokio_postgres::Config, port: u16) -> tokio_postgres::Config {
    let mut via = tokio_postgres::Config::new();
    via.host("127.0.0.1").port(port);
    via.user(server.get_user().unwrap_or("postgres"));
    via.dbname(server.get_dbname().unwrap_or("postgres"));
    if let Some(password) = server.get_password() {
        via.password(password);
    }
    via
}
