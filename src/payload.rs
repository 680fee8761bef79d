//! The payload store: where payloads too large for a notification travel by key.
//!
//! Every process listening on a channel receives the same notification and may need the same
//! payload, so rows are not deleted on read: they expire after a time-to-live (default 1 h) and
//! [`PayloadTable::delete_expired`] reclaims them. A key whose row is gone is
//! [`ErrorKind::NotFound`], never a hang.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::BoxFuture;
use crate::config::Config;
use crate::db::Pool;
use crate::error::{Error, ErrorKind, Result};
use crate::statement::Statements;

/// Somewhere every process that may receive a notification can put and get payloads.
pub trait PayloadStore: Send + Sync + 'static {
    /// Stores `payload` and returns its key.
    fn put(&self, payload: Vec<u8>) -> BoxFuture<'_, Result<String>>;
    /// The payload stored under `key`; [`ErrorKind::NotFound`] when there is none.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<u8>>>;

    /// [`get`](Self::get) for each of `keys`, in order. One at a time unless a store does
    /// better ([`PayloadTable`]: one statement for all): a listener fetches what arrived
    /// meanwhile this way, so a flood of references costs a statement per batch, not per key.
    fn get_many<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Vec<Result<Vec<u8>>>> {
        Box::pin(async move {
            let mut found = Vec::with_capacity(keys.len());
            for key in keys {
                found.push(self.get(key).await);
            }
            found
        })
    }
}

/// The [`PayloadStore`] in PostgreSQL: `bytea` rows with an expiry, in the configured payload
/// table (see `migrations/0002_payloads.sql`).
#[derive(Clone)]
pub struct PayloadTable {
    pool: Pool,
    insert: String,
    select: String,
    select_many: String,
    delete_expired: String,
    ttl: Duration,
}

impl PayloadTable {
    /// The payload table of `config`, using `pool`; rows live for `config.payload_ttl()`.
    pub fn new(config: &Config, pool: Pool) -> PayloadTable {
        let t = config.payload_table().quoted();
        PayloadTable {
            pool,
            insert: format!(
                "INSERT INTO {t} (data, expires_at) VALUES ($1, now() + $2 * interval '1 millisecond')
                 RETURNING key::text"
            ),
            select: format!("SELECT data FROM {t} WHERE key = $1::text::uuid AND expires_at > now()"),
            select_many: format!(
                "SELECT key::text, data FROM {t}
                 WHERE key = ANY($1::text[]::uuid[]) AND expires_at > now()"
            ),
            delete_expired: format!(
                "WITH deleted AS (DELETE FROM {t} WHERE expires_at <= now() RETURNING 1)
                 SELECT count(*) FROM deleted"
            ),
            ttl: config.payload_ttl(),
        }
    }

    /// Deletes expired rows; returns how many.
    #[tracing::instrument(skip_all, level = "debug")]
    pub async fn delete_expired(&self) -> Result<u64> {
        // Safe to run twice: it deletes what is expired, whenever it runs.
        let statements = self.pool.idempotent(None);
        let rows = statements.run(&self.delete_expired, &[]).await?;
        let deleted: i64 = rows.first().map_or(Ok(0), |r| r.try_get(0))?;
        Ok(deleted as u64)
    }
}

impl PayloadStore for PayloadTable {
    fn put(&self, payload: Vec<u8>) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            let ttl = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
            // Safe to run twice: a second run stores a second copy under a key nobody is told
            // of, which expires with the time-to-live.
            let statements = self.pool.idempotent(None);
            let rows = statements
                .run(&self.insert, &[(&payload, Type::BYTEA), (&ttl, Type::INT8)])
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| Error::new(ErrorKind::Other, "payload insert returned no key"))?;
            Ok(row.try_get(0)?)
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            // A key that is not even a UUID cannot be in the table.
            if !is_uuid(key) {
                return Err(not_found(key));
            }
            // A read: safe to run twice.
            let statements = self.pool.idempotent(None);
            let rows = statements.run(&self.select, &[(&key, Type::TEXT)]).await?;
            match rows.first() {
                Some(row) => Ok(row.try_get(0)?),
                None => Err(not_found(key)),
            }
        })
    }

    fn get_many<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Vec<Result<Vec<u8>>>> {
        Box::pin(async move {
            // Only UUIDs reach the statement: one that is not would fail the cast, and the
            // whole batch with it. Compared as the server writes them, in lower case.
            let asked: Vec<String> = (keys.iter())
                .filter(|k| is_uuid(k))
                .map(|k| k.to_ascii_lowercase())
                .collect();
            let mut found = std::collections::HashMap::new();
            if !asked.is_empty() {
                // A read: safe to run twice.
                let statements = self.pool.idempotent(None);
                let rows = statements
                    .run(&self.select_many, &[(&asked, Type::TEXT_ARRAY)])
                    .await;
                let read = rows.and_then(|rows| {
                    (rows.iter())
                        .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get(1)?)))
                        .collect::<Result<Vec<(String, Vec<u8>)>>>()
                });
                match read {
                    Ok(rows) => found.extend(rows),
                    // Each key gets the statement's error.
                    Err(e) => {
                        return (keys.iter())
                            .map(|_| Err(Error::new(e.kind(), e.to_string())))
                            .collect();
                    }
                }
            }
            (keys.iter())
                .map(|key| (found.remove(&key.to_ascii_lowercase())).ok_or_else(|| not_found(key)))
                .collect()
        })
    }
}

/// What a key without a row is.
fn not_found(key: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("payload {key:?} is not in the store (expired or deleted)"),
    )
}

/// Whether `key` is a UUID as the table's keys are written: 8-4-4-4-12 hex digits.
fn is_uuid(key: &str) -> bool {
    key.len() == 36
        && key.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}
