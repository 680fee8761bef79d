//! Connections: the shared pool, dedicated sessions, bounded statements, and the retry of
//! transient conflicts.
//!
//! Two kinds of connection exist on purpose. Statements that need no session state (acquire,
//! release, inspect, notify) borrow from the [`Pool`]. Anything that lives in a session — an
//! advisory lock, a LISTEN, the heartbeat — gets a dedicated connection that nobody else
//! borrows: a pooled session would hand its locks to the next borrower, bb8 drops notifications,
//! and a heartbeat must not wait for a pool that blocked acquires have exhausted.
//!
//! Connections fail, and every function here assumes so: connecting is bounded by the connect
//! timeout as a whole (tokio-postgres bounds only the TCP connect), a statement by a deadline
//! ([`Bounded`], [`run_until`]), and any failure to reach the server is
//! [`ErrorKind::Unavailable`] with the cause as its source.

mod borrowed;
mod bounded;
mod check;
mod connect;
mod pool;

pub use crate::backoff::Backoff;
pub use crate::statement::cancel;
pub use borrowed::Borrowed;
pub use bounded::{Bounded, Until, run_until, until};
pub use check::{check_reachable, check_server};
pub use connect::{Dedicated, connect, connect_as, connect_spawned, ping};
pub use pool::{Manager, Pool, Pooled};

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};

/// How many times [`retry`] runs an operation that keeps hitting serialization failures or
/// deadlocks.
pub const RETRY_ATTEMPTS: u32 = 5;

/// Builds the pool from the configuration. Connections are opened lazily, on first use.
pub fn pool(config: &Config) -> Pool {
    Pool::new(config)
}

/// Runs `operation` until it succeeds or fails with something other than a serialization failure
/// (40001) or deadlock (40P01), sleeping a bounded, jittered backoff between attempts. After
/// [`RETRY_ATTEMPTS`] conflicts the last one is returned as [`ErrorKind::FailedPrecondition`].
pub async fn retry<T, F, Fut>(mut operation: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match operation().await {
            Err(e) if e.is_retryable() => {
                attempt += 1;
                if attempt >= RETRY_ATTEMPTS {
                    warn!(attempts = attempt, error = %e, "giving up after repeated conflicts");
                    return Err(Error::new(
                        ErrorKind::FailedPrecondition,
                        format!("still conflicting after {attempt} attempts: {e}"),
                    )
                    .with_source(e));
                }
                tokio::time::sleep(backoff(attempt)).await;
            }
            other => return other,
        }
    }
}

/// [`Backoff::DEFAULT`]'s delay before attempt `attempt`.
pub fn backoff(attempt: u32) -> Duration {
    Backoff::DEFAULT.delay(attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(500));
        }
    }
}
