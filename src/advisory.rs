//! Advisory lock statements on a pinned session, key derivation, and the ping.
//!
//! An advisory lock belongs to the session that took it and is released by the server the
//! instant that session ends. These functions therefore take the dedicated client of one session
//! (a client of its own: [`crate::db::connect_spawned`]); never call them on a pooled connection, whose session — and locks — the next
//! borrower would inherit.
//!
//! Keys are `i64`s. [`key_for_name`] derives one from a name with 64-bit FNV-1a over the name's
//! UTF-8 bytes, read as a two's-complement `i64`: offset basis `0xcbf29ce484222325`, prime
//! `0x100000001b3`, for each byte `hash ^= byte; hash *= prime` (wrapping). It is fixed and
//! documented here so other languages compute the same key; it never changes between releases.
//! [`key_like_sqlx`] derives the key sqlx's `PgAdvisoryLock::new(name)` locks, so a service
//! moving from sqlx keeps excluding the processes not moved yet.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::statement::Statements;
use tracing::instrument;

use crate::error::{Error, ErrorKind, Result};

/// Exclusive or shared, as PostgreSQL's `pg_advisory_lock` and `pg_advisory_lock_shared`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// One holder at a time.
    Exclusive,
    /// Any number of shared holders, excluding exclusive ones.
    Shared,
}

/// The advisory key of `name`: 64-bit FNV-1a of its UTF-8 bytes (see the module docs).
pub fn key_for_name(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

/// The advisory key sqlx's `PgAdvisoryLock::new(name)` locks: HKDF-SHA-256 (RFC 5869) of the
/// name's UTF-8 bytes, without salt, with sqlx's info string, 8 bytes read as a little-endian
/// `i64`.
pub fn key_like_sqlx(name: &str) -> i64 {
    let hkdf = hkdf::Hkdf::<sha2::Sha256>::new(None, name.as_bytes());
    let mut key = [0u8; 8];
    // HKDF refuses only outputs longer than 255 hashes; 8 bytes is always granted.
    hkdf.expand(b"SQLx (Rust) Postgres advisory lock", &mut key)
        .expect("8 bytes is a valid HKDF output length");
    i64::from_le_bytes(key)
}

/// Takes the lock if it is free, at once; `false` when someone else holds it.
#[instrument(skip(client), level = "debug")]
pub async fn try_lock(client: &(impl Statements + ?Sized), key: i64, mode: Mode) -> Result<bool> {
    let sql = match mode {
        Mode::Exclusive => "SELECT pg_try_advisory_lock($1)",
        Mode::Shared => "SELECT pg_try_advisory_lock_shared($1)",
    };
    let rows = client.run(sql, &[(&key, Type::INT8)]).await?;
    Ok(one_row(&rows)?.try_get(0)?)
}

/// Waits for the lock for at most `timeout`, enforced by the server with `lock_timeout` so the
/// wait ends there too; [`ErrorKind::NotAcquired`] when it expires. To give up earlier, cancel
/// with the client's `cancel_token()`: the wait then fails with [`ErrorKind::Timeout`].
#[instrument(skip(client), level = "debug")]
pub async fn lock(
    client: &(impl Statements + ?Sized),
    key: i64,
    mode: Mode,
    timeout: Duration,
) -> Result<()> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128).to_string();
    let sql = match mode {
        Mode::Exclusive => "SELECT pg_advisory_lock($1)::text",
        Mode::Shared => "SELECT pg_advisory_lock_shared($1)::text",
    };
    client
        .run(
            "SELECT set_config('lock_timeout', $1, false)",
            &[(&ms, Type::TEXT)],
        )
        .await?;
    let result = client.run(sql, &[(&key, Type::INT8)]).await;
    client.run("RESET lock_timeout", &[]).await?;
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
            Err(Error::new(
                ErrorKind::NotAcquired,
                format!("advisory lock {key} not acquired within {timeout:?}"),
            )
            .with_source(e))
        }
        Err(e) => Err(e),
    }
}

/// Releases the lock; [`ErrorKind::LockLost`] when this session did not hold it (PostgreSQL's
/// unlock returned false).
#[instrument(skip(client), level = "debug")]
pub async fn unlock(client: &(impl Statements + ?Sized), key: i64, mode: Mode) -> Result<()> {
    let sql = match mode {
        Mode::Exclusive => "SELECT pg_advisory_unlock($1)",
        Mode::Shared => "SELECT pg_advisory_unlock_shared($1)",
    };
    let rows = client.run(sql, &[(&key, Type::INT8)]).await?;
    if !one_row(&rows)?.try_get::<_, bool>(0)? {
        return Err(Error::new(
            ErrorKind::LockLost,
            format!("advisory lock {key} was not held by this session"),
        ));
    }
    Ok(())
}

fn one_row(rows: &[tokio_postgres::Row]) -> Result<&tokio_postgres::Row> {
    rows.first()
        .ok_or_else(|| Error::new(ErrorKind::Other, "advisory lock function returned no row"))
}

#[cfg(test)]
mod tests {
    use super::{key_for_name, key_like_sqlx};

    #[test]
    fn sqlx_keys_match_the_value_sqlx_publishes() {
        // The value sqlx's own documentation asserts for `PgAdvisoryLock::new`.
        assert_eq!(
            key_like_sqlx("my first Postgres advisory lock!"),
            -5560419505042474287
        );
        assert_ne!(key_like_sqlx("a"), key_for_name("a"));
    }

    #[test]
    fn fnv1a_keys_are_the_published_values() {
        // FNV-1a 64 reference values: "" and "a".
        assert_eq!(key_for_name("") as u64, 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_for_name("a") as u64, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(key_for_name("foobar") as u64, 0x8594_4171_f739_67e8);
    }
}

/// The most advisory locks [`list`] lists.
pub const MAX_ADVISORY_LISTED: usize = 1_000;

/// An advisory lock held or awaited on the server, as [`list`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdvisoryLockInfo {
    /// The key: one `bigint` key as it was given, or `K1,K2` for a lock on two `int` keys.
    pub key: String,
    /// PostgreSQL's mode: `ExclusiveLock` or `ShareLock`.
    pub mode: String,
    /// Held (`true`) or awaited.
    pub granted: bool,
    /// The session's backend pid.
    pub pid: i32,
    /// The session's `application_name` (pgcoord names its sessions `<app> <role>`).
    pub application: String,
}

/// Every advisory lock of every database of the server held or awaited now (from `pg_locks`),
/// by key, holders first: at most [`MAX_ADVISORY_LISTED`]. Any pooled client will do.
pub async fn list(client: &(impl Statements + ?Sized)) -> Result<Vec<AdvisoryLockInfo>> {
    // Two-key locks keep each int4 key in an oid column: read back as signed.
    let sql = format!(
        "SELECT CASE WHEN l.objsubid = 1
                     THEN ((l.classid::bigint << 32) | l.objid::bigint)::text
                     ELSE (l.classid::bigint - CASE WHEN l.classid::bigint >= 2147483648
                                                    THEN 4294967296 ELSE 0 END)::text
                          || ',' ||
                          (l.objid::bigint - CASE WHEN l.objid::bigint >= 2147483648
                                                  THEN 4294967296 ELSE 0 END)::text
                END AS key,
                l.mode, l.granted, l.pid, coalesce(a.application_name, '')
         FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.objsubid IN (1, 2)
         ORDER BY l.objsubid, key, l.granted DESC, l.pid
         LIMIT {MAX_ADVISORY_LISTED}"
    );
    let rows = client.run(&sql, &[]).await?;
    (rows.iter())
        .map(|row| {
            Ok(AdvisoryLockInfo {
                key: row.try_get(0)?,
                mode: row.try_get(1)?,
                granted: row.try_get(2)?,
                pid: row.try_get(3)?,
                application: row.try_get(4)?,
            })
        })
        .collect()
}
