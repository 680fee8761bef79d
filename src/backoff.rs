//! [`Backoff`]: the one jittered backoff of pgcoord, and the randomness behind it.

use std::time::Duration;

/// Full-jitter exponential backoff: a random time up to `initial` × 2^attempt, capped at
/// `max`, never below a millisecond. The one backoff of pgcoord: the listener's reconnects and
/// the heartbeat's renewal retries use the configured one
/// ([`Config::backoff`](crate::Config::backoff)); conflicts and busy rows use
/// [`Backoff::DEFAULT`].
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

/// Failures in a row: the one failure counter of pgcoord. Each is warned of at a bounded rate
/// (the first, then every power of two: an outage of a thousand failures writes ten lines, see
/// [`warn_due`]), and the next try waits a [`Backoff`] delay that grows with them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    in_a_row: u32,
}

impl Failures {
    /// Counts a failure; true when it is to be warned of.
    pub fn failed(&mut self) -> bool {
        self.in_a_row = self.in_a_row.saturating_add(1);
        warn_due(u64::from(self.in_a_row))
    }

    /// A success: the next failure is the first again.
    pub fn succeeded(&mut self) {
        self.in_a_row = 0;
    }

    /// Failures in a row now.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// How long to wait before trying again: nothing after none, nor after the first `at_once`
    /// (a connection dropped once is usually back at once), then `backoff`'s growing delay.
    pub fn delay(&self, backoff: Backoff, at_once: u32) -> Duration {
        match self.in_a_row.checked_sub(at_once + 1) {
            None => Duration::ZERO,
            Some(attempt) => backoff.delay(attempt),
        }
    }
}

/// Whether the `count`-th occurrence of something worth a warning is warned of: the first, then
/// every power of two. The rate every warning of a repeated failure keeps.
pub fn warn_due(count: u64) -> bool {
    count.is_power_of_two()
}

/// A random number from std's per-instance hash keys; enough for suffixes and jitter.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_warned_of_at_powers_of_two_and_back_off_after_those_at_once() {
        let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(500));
        let mut failures = Failures::default();
        assert_eq!(failures.delay(backoff, 0), Duration::ZERO);
        let warned: Vec<u32> = (1..=20).filter(|_| failures.failed()).collect();
        assert_eq!(warned, [1, 2, 4, 8, 16]);
        assert!(failures.delay(backoff, 0) <= Duration::from_millis(500));
        failures.succeeded();
        assert!(failures.failed(), "the first again");
        assert_eq!(failures.delay(backoff, 1), Duration::ZERO);
        assert!(failures.delay(backoff, 0) <= Duration::from_millis(5));
        failures.failed();
        assert!(failures.delay(backoff, 1) <= Duration::from_millis(5));
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
