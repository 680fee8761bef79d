//! The check a runtime's fallible start makes before anything else: reachable, writable,
//! migrated.

use crate::config::Config;
use crate::db::connect::connect_as;
use crate::db::connect::{connect_with, describe};
use crate::error::{Error, ErrorKind, Result};

/// Checks, on a connection of its own, that the server is reachable, is a writable primary, and
/// has pgcoord's tables: what a runtime's fallible start asks before anything else.
/// [`ErrorKind::Unavailable`] (with the cause) when it cannot connect within the connect
/// timeout, [`ErrorKind::ReadOnly`] on a hot standby or a read-only database,
/// [`ErrorKind::NotFound`] naming the missing table and how to create it.
///
/// With session-bound connections set apart ([`Config::session_pg_config`]), both servers are
/// checked: the one the pool reaches (a pooler, say) and the one sessions reach.
pub async fn check_server(config: &Config) -> Result<()> {
    let session = connect_as(config, "check").await?;
    check_on(config, session, &config.session_pg).await?;
    if config.session_pg != config.pg {
        let passfile = config.ignored_passfile.as_deref();
        let pooled =
            connect_with(&config.pg, &config.tls, config.connect_timeout, passfile).await?;
        check_on(config, pooled, &config.pg).await?;
    }
    Ok(())
}

/// Checks, on a session connection of its own, that the server the sessions reach answers
/// within the statement timeout: what advisory locks need, which use no table.
/// [`ErrorKind::Unavailable`] (with the cause) when it cannot connect within the connect
/// timeout, [`ErrorKind::Tls`] for a certificate it cannot trust, the server's own error (a
/// wrong password, say) otherwise.
pub async fn check_reachable(config: &Config) -> Result<()> {
    let (client, connection) = connect_as(config, "check").await?;
    let driver = tokio::spawn(connection);
    let answered = crate::db::ping(&client, config.statement_timeout).await;
    drop(client);
    driver.abort();
    answered.map_err(|e| match e.kind() {
        ErrorKind::Timeout => Error::new(ErrorKind::Unavailable, e.to_string()).with_source(e),
        _ => e,
    })
}

/// The oldest server version pgcoord supports, as `server_version_num` has it: `xid8` and
/// `pg_current_snapshot`, which durable topics read by, are PostgreSQL 13's.
const OLDEST_SUPPORTED: i32 = 13_00_00;

/// [`ErrorKind::Unsupported`] for a server older than [`OLDEST_SUPPORTED`].
fn supported(version_num: i32, target: &tokio_postgres::Config) -> Result<()> {
    if version_num >= OLDEST_SUPPORTED {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        format!(
            "the server at {} runs PostgreSQL {}.{}: pgcoord needs 13 or newer",
            describe(target),
            version_num / 10_000,
            version_num % 10_000
        ),
    ))
}

/// The check, on one connection to `target`.
async fn check_on(
    config: &Config,
    (client, connection): crate::db::connect::Dedicated,
    target: &tokio_postgres::Config,
) -> Result<()> {
    let driver = tokio::spawn(connection);
    let deadline = std::time::Instant::now() + config.statement_timeout;
    let check = async {
        let row = tokio::time::timeout_at(
            deadline.into(),
            client.query_one(
                "SELECT current_setting('transaction_read_only'), pg_is_in_recovery(),
                        to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL,
                        to_regclass($3) IS NOT NULL, to_regclass($4) IS NOT NULL,
                        current_setting('server_version_num')::int",
                &[
                    &config.lock_table.quoted(),
                    &config.lock_sequence.quoted(),
                    &config.payload_table.quoted(),
                    &config.lock_queue.quoted(),
                ],
            ),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the database did not answer within {:?}",
                    config.statement_timeout
                ),
            )
        })??;
        supported(row.try_get(6)?, target)?;
        let read_only: String = row.try_get(0)?;
        let in_recovery: bool = row.try_get(1)?;
        if in_recovery || read_only == "on" {
            let what = if in_recovery {
                "a hot standby (in recovery)"
            } else {
                "read-only (transaction_read_only is on)"
            };
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "the server at {} is {what}: pgcoord needs a writable primary \
                     (with several hosts, add target_session_attrs=read-write)",
                    describe(target)
                ),
            ));
        }
        for (index, what, name) in [
            (2, "lock table", &config.lock_table),
            (3, "token sequence", &config.lock_sequence),
            (4, "payload table", &config.payload_table),
            (5, "waiters' table", &config.lock_queue),
        ] {
            if !row.try_get::<_, bool>(index)? {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "pgcoord's {what} {} does not exist: create the tables with \
                         pgcoord::schema::migrate (or apply the SQL files in migrations/)",
                        name.quoted()
                    ),
                ));
            }
        }
        Ok(())
    };
    let result = check.await;
    drop(client);
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_older_than_thirteen_are_refused_by_name() {
        let target = "host=db".parse().unwrap();
        supported(13_00_00, &target).unwrap();
        supported(18_00_04, &target).unwrap();
        let error = supported(12_00_22, &target).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unsupported);
        assert!(error.to_string().contains("PostgreSQL 12.22"), "{error}");
    }
}
