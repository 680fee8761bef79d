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

pub use borrowed::Borrowed;
pub use bounded::{Bounded, Until, cancel, run_until, until};
pub use check::check_server;
pub use connect::{Dedicated, connect, connect_as, connect_spawned, ping};
pub use pool::{Manager, Pool, Pooled};

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use crate::config::{Config, random_u64};
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

/// Full-jitter exponential backoff: a random time up to `initial` × 2^attempt, capped at
/// `max`, never below a millisecond. The one backoff of pgcoord: the listener's reconnects and
/// the heartbeat's renewal retries use the configured one ([`Config::backoff`]); conflicts and
/// busy rows use [`Backoff::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// 5 ms, doubling to at most 500 ms: a reconnect within half a second of the server's return.
    pub const DEFAULT: Backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(500),
    };

    /// A backoff starting at `initial` and growing to at most `max` (both at least 1 ms; `max`
    /// at least `initial`). [`ConfigBuilder::backoff`](crate::ConfigBuilder::backoff) checks them.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
        }
    }

    /// The first delay's upper bound.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay before attempt `attempt` (0 for the first retry): random, full jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let cap = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        let cap_us = cap.as_micros().max(1000) as u64;
        Duration::from_micros(1000 + random_u64() % (cap_us - 999))
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::DEFAULT
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

    #[test]
    fn a_configured_backoff_grows_from_initial_to_max() {
        let b = Backoff::new(Duration::from_millis(20), Duration::from_secs(2));
        for _ in 0..200 {
            assert!(b.delay(0) <= Duration::from_millis(20));
            assert!(b.delay(3) <= Duration::from_millis(160));
            assert!(b.delay(64) <= Duration::from_secs(2));
            assert!(b.delay(64) >= Duration::from_millis(1));
        }
        // Large attempts do reach past the first delays (jitter is random, so over many draws).
        assert!((0..200).any(|_| b.delay(64) > Duration::from_millis(500)));
        // Degenerate values are clamped, never panicking or zero.
        let tiny = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(
            (tiny.initial(), tiny.max()),
            (Duration::from_millis(1), Duration::from_millis(1))
        );
        assert_eq!(tiny.delay(7), Duration::from_millis(1));
    }
}
