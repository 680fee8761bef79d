//! pgcoord inside sqlx transactions: fence, append, ack and complete where your writes are, with
//! pgcoord's typed errors. Behind the `sqlx` feature, off by default:
//!
//! ```toml
//! pgcoord = { version = "0.1", features = ["sqlx"] }
//! ```
//!
//! Built with sqlx 0.8 (0.8.6 or later within 0.8; sqlx 0.9 is another crate to Cargo, whose
//! executors these functions do not take). pgcoord asks for sqlx's `postgres` and
//! `runtime-tokio` features only: no macros, no TLS; enable sqlx's own TLS feature as you
//! would without pgcoord.
//!
//! Each function calls one of the SQL functions the migrations install (docs/OPERATIONS.md,
//! "Coordination in SQL"), as the Rust core does, named for `config`'s tables; every value is
//! a bound parameter. Any [`PgExecutor`] will do: `&mut *tx` of a `sqlx::Transaction` (the
//! point: the call commits or rolls back with your writes), a `&mut PgConnection`, a `&PgPool`
//! (a transaction of its own). A failure aborts the transaction it ran in. `sqlx::Error`
//! converts into [`Error`], so `?` works on sqlx's own calls too.
//!
//! ```no_run
//! # async fn job(pool: &sqlx::PgPool, config: &pgcoord::Config, token: i64) -> pgcoord::Result<()> {
//! let mut tx = pool.begin().await?;
//! // Exclusive while the lease "billing" is held with `token`, until the transaction ends:
//! // `ErrorKind::LockLost` otherwise, and nothing below commits.
//! pgcoord::sqlx::fence(&mut *tx, config, "billing", token).await?;
//! sqlx::query("UPDATE invoices SET sent = true WHERE id = $1")
//!     .bind(7_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! // The event exists if and only if the transaction commits.
//! pgcoord::sqlx::append(&mut *tx, config, "invoices", b"invoice 7 sent").await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::PgExecutor;
use sqlx::postgres::types::PgInterval;
use sqlx::{Error as SqlxError, Row};

use crate::Config;
use crate::error::{Error, ErrorKind, Result, classify_sqlstate, server_message};
use crate::topic::Cursor;

/// The fencing guard, as [`LeaseOwner::fence`](crate::lease::LeaseOwner::fence): succeeds only
/// while the lease `name` is held with `token`, and keeps it so until the executor's
/// transaction ends, so the writes made in it are exclusive. [`ErrorKind::LockLost`] otherwise
/// (SQLSTATE `PC001`). The token alone names one tenure of one holder (tokens are never
/// reused): the lease's owner is not asked, so a grant of any owner can be fenced.
pub async fn fence<'e>(
    executor: impl PgExecutor<'e>,
    config: &Config,
    name: &str,
    token: i64,
) -> Result<()> {
    crate::lease::check_name(name)?;
    let f = config.sql_function("pgcoord_locks_fence").quoted();
    // `void` cast to text: a type every driver decodes.
    (sqlx::query(&format!("SELECT {f}($1, $2)::text")).bind(name))
        .bind(token)
        .execute(executor)
        .await?;
    Ok(())
}

/// Appends `body` to `topic`, as [`TopicTable::append`](crate::TopicTable::append): the event
/// exists if and only if the executor's transaction commits; its cursor. The commit rings the
/// topic's doorbell unless `config` is [poll-only](Config::poll_only).
pub async fn append<'e>(
    executor: impl PgExecutor<'e>,
    config: &Config,
    topic: &str,
    body: &[u8],
) -> Result<Cursor> {
    crate::topic::check("topic", topic)?;
    crate::topic::log::check_body(body)?;
    let sql = crate::topic::log::append_sql(config);
    let row = (sqlx::query(&sql).bind(topic).bind(body))
        .bind(!config.poll_only())
        .fetch_one(executor)
        .await?;
    Ok(Cursor {
        xid: row.try_get(0)?,
        position: row.try_get(1)?,
    })
}

/// Moves the cursor of `consumer` of `topic` forward to `cursor`, as
/// [`TopicTable::ack`](crate::TopicTable::ack): run it in the transaction of the handler's
/// effects, after the [`fence`] of the consumer's lease. False when the cursor was already
/// there or past it; [`ErrorKind::NotFound`] when the consumer was never opened (`PC002`).
pub async fn ack<'e>(
    executor: impl PgExecutor<'e>,
    config: &Config,
    topic: &str,
    consumer: &str,
    cursor: Cursor,
) -> Result<bool> {
    crate::topic::check("topic", topic)?;
    crate::topic::check("consumer", consumer)?;
    let sql = crate::topic::consumer::ack_sql(config);
    let row = (sqlx::query(&sql).bind(topic).bind(consumer))
        .bind(cursor.xid)
        .bind(cursor.position)
        .fetch_one(executor)
        .await?;
    Ok(row.try_get(0)?)
}

/// Fences `attempt` under `token` of the tick `tick` of `schedule` and marks it done (with
/// `next_tick` when given), as [`ScheduleTable::complete`](crate::schedule::ScheduleTable::complete):
/// done if and only if the executor's transaction commits. [`ErrorKind::LockLost`] when this
/// run no longer counts (`PC001`); [`ErrorKind::AlreadyAcknowledged`] when the tick is done
/// already (`PC003`: do not apply its effects again).
pub async fn complete<'e>(
    executor: impl PgExecutor<'e>,
    config: &Config,
    schedule: &str,
    tick: SystemTime,
    token: i64,
    attempt: u32,
    next_tick: Option<SystemTime>,
) -> Result<()> {
    crate::schedule::table::check(schedule)?;
    let f = config.sql_function("pgcoord_schedules_complete").quoted();
    // Times travel as intervals from PostgreSQL's epoch (sqlx has no timestamptz without its
    // chrono or time feature): integer microseconds, so the tick matches the row to the
    // microsecond, as tokio-postgres would have sent it.
    let at = |n: u8| format!("(timestamptz '2000-01-01 00:00:00+00' + ${n})");
    let sql = format!("SELECT {f}($1, {}, $3, $4, {})::text", at(2), at(5));
    (sqlx::query(&sql).bind(schedule).bind(since_pg_epoch(tick)))
        .bind(token)
        .bind(crate::schedule::table::attempt_param(attempt))
        .bind(next_tick.map(since_pg_epoch))
        .execute(executor)
        .await?;
    Ok(())
}

/// `time` as microseconds from 2000-01-01 UTC, truncated toward it: what tokio-postgres sends
/// for a `SystemTime` (PostgreSQL's own representation of a timestamptz).
fn since_pg_epoch(time: SystemTime) -> PgInterval {
    let epoch = UNIX_EPOCH + Duration::from_secs(946_684_800);
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    let microseconds = match time.duration_since(epoch) {
        Ok(after) => micros(after),
        Err(before) => -micros(before.duration()),
    };
    PgInterval {
        months: 0,
        days: 0,
        microseconds,
    }
}

impl From<SqlxError> for Error {
    /// The server's SQLSTATE classified as for tokio-postgres; a connection that broke or never
    /// came, [`ErrorKind::Unavailable`]. The message never shows a bound value.
    fn from(error: SqlxError) -> Error {
        let (kind, message) = match &error {
            SqlxError::Database(db) => match db.code() {
                Some(code) => (
                    classify_sqlstate(&code),
                    server_message(&code, db.message()),
                ),
                None => (
                    ErrorKind::Other,
                    format!("database error: {}", db.message()),
                ),
            },
            SqlxError::Io(_)
            | SqlxError::Tls(_)
            | SqlxError::Protocol(_)
            | SqlxError::PoolTimedOut
            | SqlxError::PoolClosed
            | SqlxError::WorkerCrashed => {
                (ErrorKind::Unavailable, format!("database error: {error}"))
            }
            _ => (ErrorKind::Other, format!("database error: {error}")),
        };
        Error::new(kind, message).with_source(error)
    }
}
