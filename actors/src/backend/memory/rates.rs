//! Rate limits in memory: each key's bucket is its theoretical arrival time, as the rate table's
//! row is, taken from with the statement's computation (`RateLimit::take_at`) on the backend's
//! monotonic clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use pgcoord::rate::{RateLimit, Taken};
use pgcoord::{Error, ErrorKind, Result};

use super::MemoryBackend;
use crate::RateLimiter;
use crate::rates::Buckets;

/// Every key's bucket, and the instant the backend's clock counts from.
pub(super) struct RateState {
    started: Instant,
    buckets: HashMap<String, i64>,
}

impl Default for RateState {
    fn default() -> RateState {
        RateState {
            started: Instant::now(),
            buckets: HashMap::new(),
        }
    }
}

impl super::MemoryCoordinator {
    /// A limiter whose buckets are the backend's: every limiter made on one backend takes from
    /// the same buckets, as the processes of a fleet do from one table.
    pub(crate) fn rate_limiter(&self, rate: RateLimit) -> RateLimiter {
        let backend = MemoryBackend {
            shared: self.shared.clone(),
        };
        RateLimiter::on(Arc::new(backend), rate)
    }
}

impl Buckets for MemoryBackend {
    fn take<'a>(
        &'a self,
        key: &'a str,
        n: u32,
        rate: &'a RateLimit,
        all: bool,
    ) -> pgcoord::BoxFuture<'a, Result<Taken>> {
        Box::pin(std::future::ready(self.take_now(key, n, rate, all)))
    }
}

impl MemoryBackend {
    /// One take of `n` from `key`'s bucket at `rate`: all or none with `all`, else up to `n`.
    fn take_now(&self, key: &str, n: u32, rate: &RateLimit, all: bool) -> Result<Taken> {
        pgcoord::config::validate_name("rate-limit key", key.to_owned())?;
        if n == 0 || (all && n > rate.burst_size()) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("a take of {n}, with a burst of {}", rate.burst_size()),
            ));
        }
        let mut state = self.shared.lock();
        let rates = &mut state.rates;
        let now = rates.started.elapsed().as_micros() as i64;
        let (tat, taken) = rate.take_at(rates.buckets.get(key).copied(), now, n, all);
        rates.buckets.insert(key.to_owned(), tat);
        Ok(taken)
    }
}
