//! Fleet-wide rate limits: a [`RateLimiter`] takes from a key's bucket with the core's one
//! statement ([`RateTable`]), on the runtime's pool, and waits for room within a deadline.
//!
//! It is a handle, not an actor: nothing is held between takes (the bucket is the row), and its
//! futures are `Send`, for any tokio task. Waiting takes on one key share a statement per round
//! (`batch`): the one task it spawns per key ends when nobody waits. On the in-memory backend
//! (`Coordinator::rate_limiter` of a memory coordinator) the buckets are the backend's, computed
//! as the statement does.

mod batch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::Counter;
use pgcoord::rate::{RateLimit, Taken};
use pgcoord::{Error, ErrorKind, Pool, RateTable, Result};
use tracing::{Instrument, debug_span};

/// The limiter's metric handles.
#[derive(Clone)]
struct Counters {
    permits: Counter,
    granted: Counter,
    refused: Counter,
}

impl Counters {
    fn new() -> Counters {
        crate::metrics::describe();
        let takes = |o: &'static str| metrics::counter!(crate::metrics::RATE_TAKES, "outcome" => o);
        Counters {
            permits: metrics::counter!(crate::metrics::RATE_PERMITS),
            granted: takes("granted"),
            refused: takes("refused"),
        }
    }

    /// Counts one statement that granted `granted`.
    fn count(&self, granted: u32) {
        self.permits.increment(u64::from(granted));
        match granted {
            0 => self.refused.increment(1),
            _ => self.granted.increment(1),
        }
    }
}

/// Takes from keys' buckets at one [`RateLimit`], across every process that uses the same rate
/// for the same keys (the rate travels with each take: a process with another rate for a key
/// enforces its own on the same bucket). Made by
/// [`Coordinator::rate_limiter`](crate::Coordinator::rate_limiter), on either backend.
#[derive(Clone)]
pub struct RateLimiter {
    buckets: Arc<dyn Buckets>,
    rate: RateLimit,
    counters: Counters,
    lines: Arc<batch::Lines>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rate", &self.rate)
            .finish()
    }
}

/// Where a limiter's buckets are: the rate table ([`Table`]), or the in-memory backend's.
pub(crate) trait Buckets: Send + Sync {
    /// One take of `n` from `key` (all or none with `all`, else up to `n`).
    fn take<'a>(
        &'a self,
        key: &'a str,
        n: u32,
        rate: &'a RateLimit,
        all: bool,
    ) -> pgcoord::BoxFuture<'a, Result<Taken>>;
}

/// The rate table, on the runtime's pool.
struct Table {
    table: RateTable,
    pool: Pool,
}

impl Buckets for Table {
    fn take<'a>(
        &'a self,
        key: &'a str,
        n: u32,
        rate: &'a RateLimit,
        all: bool,
    ) -> pgcoord::BoxFuture<'a, Result<Taken>> {
        // Not retried on an unclear outcome: a take that may have happened is counted as
        // taken, so a retry would admit less than the limit, never more, but for nothing.
        Box::pin(async move {
            let statements = self.pool.statements(None);
            match all {
                true => self.table.try_take(&statements, key, n, rate).await,
                false => self.table.take_up_to(&statements, key, n, rate).await,
            }
        })
    }
}

impl RateLimiter {
    pub(crate) fn new(table: RateTable, pool: Pool, rate: RateLimit) -> RateLimiter {
        RateLimiter::on(Arc::new(Table { table, pool }), rate)
    }

    pub(crate) fn on(buckets: Arc<dyn Buckets>, rate: RateLimit) -> RateLimiter {
        RateLimiter {
            buckets,
            rate,
            counters: Counters::new(),
            lines: Arc::default(),
        }
    }

    /// The rate it takes at.
    pub fn rate(&self) -> RateLimit {
        self.rate
    }

    /// Takes `n` from `key` now if all fit, or none: one statement, bounded by the pool's
    /// statement timeout. [`Taken::retry_after`] says when they would fit.
    pub async fn try_take(&self, key: &str, n: u32) -> Result<Taken> {
        let taken = (self.buckets.take(key, n, &self.rate, true))
            .instrument(debug_span!("rate.try_take", rate.key = key, n))
            .await?;
        self.counters.count(taken.granted);
        Ok(taken)
    }

    /// Takes `n` from `key`, waiting for room until `timeout` has passed:
    /// [`ErrorKind::Timeout`] then. It answers within `timeout`, whatever the connections do.
    /// This process's waiters on one key wait in one line, in arrival order, and share a
    /// statement per round (a hot key costs a statement per round, not one per waiter).
    /// [`ErrorKind::InvalidConfig`] when `n` is zero or more than the burst.
    pub async fn take(&self, key: &str, n: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let span = debug_span!("rate.take", rate.key = key, n);
        if n == 0 || n > self.rate.burst_size() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("a take of {n}, with a burst of {}", self.rate.burst_size()),
            ));
        }
        pgcoord::config::validate_name("rate-limit key", key.to_owned())?;
        let (first, answer) = self.lines.join(key, n, deadline);
        if first {
            let round = debug_span!("rate.rounds", rate.key = key);
            tokio::spawn(batch::rounds(self.clone(), key.to_owned()).instrument(round));
        }
        // Granted the instant the deadline passed is lost: less admitted, never more.
        match tokio::time::timeout_at(deadline.into(), answer)
            .instrument(span)
            .await
        {
            Ok(Ok(answered)) => answered,
            Ok(Err(_)) => Err(Error::new(
                ErrorKind::Other,
                "the rate limiter's round for this key stopped without answering",
            )),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("{n} from {key:?} did not fit within {timeout:?}"),
            )),
        }
    }
}
