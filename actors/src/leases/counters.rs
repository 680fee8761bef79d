//! The counters a `LockManager` and its waits, batchers and release tasks add to (see
//! `ManagerStats`).

use std::sync::atomic::{AtomicU64, Ordering};

/// What a manager counts.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquire_statements: AtomicU64,
    pub(crate) release_statements: AtomicU64,
    pub(crate) read_statements: AtomicU64,
    pub(crate) renew_statements: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) woken_all: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
