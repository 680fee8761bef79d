//! What a manager has under way that may still take or free a lease on the server: waits, grants
//! not recorded yet, releases. A graceful shutdown stops new ones and waits until none is left,
//! so a process that exits right after it leaves no lease behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The count of what is under way, and whether the manager is closing. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct UnderWay {
    count: Arc<AtomicUsize>,
    closing: Arc<AtomicBool>,
}

/// One thing under way, counted until dropped.
pub(crate) struct Ticket(Arc<AtomicUsize>);

impl UnderWay {
    /// Counts one more thing under way until the ticket is dropped.
    pub(crate) fn enter(&self) -> Ticket {
        self.count.fetch_add(1, Ordering::SeqCst);
        Ticket(self.count.clone())
    }

    /// Nothing under way.
    pub(crate) fn settled(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }

    /// From now on, no wait attempts again and no grant is recorded: the manager is stopping.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a wait or a request answers once its manager is closing.
pub(crate) fn closing_error() -> pgcoord::Error {
    pgcoord::Error::new(
        pgcoord::ErrorKind::Unavailable,
        "the lock manager is shutting down: nothing more is granted",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_under_way_until_its_ticket_drops() {
        let under_way = UnderWay::default();
        assert!(under_way.settled());
        let (a, b) = (under_way.enter(), under_way.clone().enter());
        drop(a);
        assert!(!under_way.settled());
        drop(b);
        assert!(under_way.settled());
        assert!(!under_way.closing());
        under_way.clone().close();
        assert!(under_way.closing());
    }
}
