//! Fleet-wide rate limits: a [`RateLimiter`] takes from a key's bucket with the core's one
//! statement ([`RateTable`]), on the runtime's pool, and waits for room within a deadline.
//!
//! It is a handle, not an actor: nothing is held between takes (the bucket is the row), so there
//! is nothing to own or clean up, and its futures are `Send`, for any tokio task.

use std::time::{Duration, Instant};

use metrics::Counter;
use pgcoord::rate::{RateLimit, Taken};
use pgcoord::{Error, ErrorKind, Pool, RateTable, Result};
use tracing::{Instrument, debug_span};

/// Takes from keys' buckets at one [`RateLimit`], across every process that uses the same rate
/// for the same keys (the rate travels with each take: a process with another rate for a key
/// enforces its own on the same bucket). Made by
/// [`Coordinator::rate_limiter`](crate::Coordinator::rate_limiter).
#[derive(Clone)]
pub struct RateLimiter {
    table: RateTable,
    pool: Pool,
    rate: RateLimit,
    granted: Counter,
    refused: Counter,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rate", &self.rate)
            .finish()
    }
}

impl RateLimiter {
    pub(crate) fn new(table: RateTable, pool: Pool, rate: RateLimit) -> RateLimiter {
        crate::metrics::describe();
        let outcome =
            |o: &'static str| metrics::counter!(crate::metrics::RATE_TAKES, "outcome" => o);
        RateLimiter {
            table,
            pool,
            rate,
            granted: outcome("granted"),
            refused: outcome("refused"),
        }
    }

    /// The rate it takes at.
    pub fn rate(&self) -> RateLimit {
        self.rate
    }

    /// Takes `n` from `key` now if all fit, or none: one statement, bounded by the pool's
    /// statement timeout. [`Taken::retry_after`] says when they would fit.
    pub async fn try_take(&self, key: &str, n: u32) -> Result<Taken> {
        self.once(key, n, None)
            .instrument(debug_span!("rate.try_take", rate.key = key, n))
            .await
    }

    /// Takes `n` from `key`, waiting for room until `timeout` has passed:
    /// [`ErrorKind::Timeout`] then, with nothing taken. The wait is the bucket's own (a take
    /// again once the server says there is room), so it answers within `timeout`, whatever the
    /// connections do.
    pub async fn take(&self, key: &str, n: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        async {
            loop {
                let taken = self.once(key, n, Some(deadline)).await?;
                if taken.granted == n {
                    return Ok(());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if taken.retry_after >= left {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "{n} from {key:?} do not fit within {timeout:?} (room in {:?})",
                            taken.retry_after
                        ),
                    ));
                }
                tokio::time::sleep(taken.retry_after).await;
            }
        }
        .instrument(debug_span!("rate.take", rate.key = key, n))
        .await
    }

    async fn once(&self, key: &str, n: u32, deadline: Option<Instant>) -> Result<Taken> {
        // Not retried on an unclear outcome: a take that may have happened is counted as taken,
        // so a retry would admit less than the limit, never more, but for nothing.
        let statements = self.pool.statements(deadline);
        let taken = self.table.try_take(&statements, key, n, &self.rate).await?;
        if taken.granted > 0 {
            self.granted.increment(u64::from(taken.granted));
        } else {
            self.refused.increment(1);
        }
        Ok(taken)
    }
}
