//! The database's sessions as an operator sees them: who is connected, for what, and since when.
//!
//! pgcoord names its own sessions by their `application_name`: the pool's connections carry the
//! configured name (`pgcoord` unless set), a dedicated one `"<name> <role>"` (the listener's
//! is `pgcoord listener`, an advisory lock's session `pgcoord advisory`).

use std::time::Duration;

use crate::error::Result;
use crate::statement::Statements;

/// The most sessions [`list`] lists.
pub const MAX_SESSIONS_LISTED: usize = 500;

/// A session of the current database, from `pg_stat_activity`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// Its `application_name`.
    pub application: String,
    /// Its backend pid.
    pub pid: i32,
    /// Its state (`idle`, `active`, `idle in transaction` …); `None` where the role may not see
    /// it (another role's session, without `pg_read_all_stats`).
    pub state: Option<String>,
    /// How long it has been connected, on the server's clock.
    pub connected: Duration,
    /// How long it has been in its state; `None` where the role may not see it.
    pub in_state: Option<Duration>,
}

/// Every session of the current database that has an `application_name`, by name and age:
/// at most [`MAX_SESSIONS_LISTED`].
pub async fn list(client: &(impl Statements + ?Sized)) -> Result<Vec<SessionInfo>> {
    let sql = format!(
        "SELECT application_name::text, pid, state,
                (extract(epoch FROM clock_timestamp() - backend_start) * 1000)::int8,
                (extract(epoch FROM clock_timestamp() - state_change) * 1000)::int8
         FROM pg_stat_activity
         WHERE datname = current_database() AND application_name <> ''
         ORDER BY application_name, backend_start
         LIMIT {MAX_SESSIONS_LISTED}"
    );
    let rows = client.run(&sql, &[]).await?;
    let ms = |ms: i64| Duration::from_millis(ms.max(0) as u64);
    (rows.iter())
        .map(|row| {
            Ok(SessionInfo {
                application: row.try_get(0)?,
                pid: row.try_get(1)?,
                state: row.try_get(2)?,
                connected: ms(row.try_get::<_, Option<i64>>(3)?.unwrap_or(0)),
                in_state: row.try_get::<_, Option<i64>>(4)?.map(ms),
            })
        })
        .collect()
}
