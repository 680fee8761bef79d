//! A pool's checkouts: how many are under way (the pool's pending gauge), and the one observer
//! told how long each took (the runtime's wait histogram).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The checkouts of a pool and its clones: how many are under way, and the one observer of
/// their durations (the runtime's metrics).
#[derive(Default)]
pub(super) struct Checkouts {
    waiting: AtomicU32,
    observer: OnceLock<Observer>,
}

/// Told how long each checkout took.
pub(super) type Observer = Box<dyn Fn(Duration) + Send + Sync>;

/// One checkout under way: counted while it lasts, observed when it ends, whatever it ended with
/// (a connection, an error, or its caller giving up).
pub(super) struct Waiting<'a> {
    checkouts: &'a Checkouts,
    start: Instant,
}

impl Waiting<'_> {
    /// When the checkout began.
    pub(super) fn start(&self) -> Instant {
        self.start
    }
}

impl<'a> Waiting<'a> {
    fn new(checkouts: &'a Checkouts) -> Waiting<'a> {
        checkouts.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting {
            checkouts,
            start: Instant::now(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.checkouts.waiting.fetch_sub(1, Ordering::Relaxed);
        if let Some(observe) = self.checkouts.observer.get() {
            observe(self.start.elapsed());
        }
    }
}

impl Checkouts {
    /// One more checkout under way, until the returned guard drops.
    pub(super) fn enter(&self) -> Waiting<'_> {
        Waiting::new(self)
    }

    /// Checkouts under way now.
    pub(super) fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Sets the observer; false when one was set already (the first stays).
    pub(super) fn observe_with(&self, observer: Observer) -> bool {
        self.observer.set(observer).is_ok()
    }
}
