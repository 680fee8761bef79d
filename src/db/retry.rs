//! The retry of transient conflicts: serialization failures and deadlocks.

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use crate::backoff::Backoff;
use crate::error::{Error, ErrorKind, Result};

/// How many times [`retry`] runs an operation that keeps hitting serialization failures or
/// deadlocks.
pub const RETRY_ATTEMPTS: u32 = 5;

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
