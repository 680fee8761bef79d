//! What every wait of one `LockManager` shares, made once when it starts: its pool, table and
//! owner, the local queues, the names held, the batcher of first attempts, and the counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgcoord::lease::LeaseOwner;
use pgcoord::{LeaseTable, Pool};

use super::batch::acquire::AcquireBatcher;
use super::held::HeldNames;
use super::line::Line;
use super::queues::Queues;
use super::wait::{Attempts, Wait};

/// The manager's counters that its waits, batchers and release tasks add to (see
/// `ManagerStats`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquire_statements: AtomicU64,
    pub(crate) release_statements: AtomicU64,
    pub(crate) renew_statements: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) lost: AtomicU64,
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

/// What every wait of one manager shares.
pub(crate) struct WaitContext {
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Duration,
    /// The longest a waiter sleeps without a wake-up.
    pub(crate) poll: Duration,
    pub(crate) queues: Arc<Queues>,
    pub(crate) held: HeldNames,
    /// Where first attempts go, to share a statement with concurrent ones.
    pub(crate) batcher: AcquireBatcher,
    pub(crate) counters: Arc<Counters>,
}

impl WaitContext {
    /// The owner's lease statements. The owner was checked with the configuration.
    pub(crate) fn statements(&self) -> LeaseOwner<'_> {
        self.table.owner(&self.owner).expect("a configured owner")
    }

    /// A wait for `key` with `attempts`, until `timeout` (forever without one); a single
    /// attempt with `once`.
    pub(crate) fn wait<A: Attempts>(
        self: &Arc<Self>,
        attempts: A,
        key: &str,
        timeout: Option<Duration>,
        once: bool,
    ) -> Wait<A> {
        let deadline = timeout.map(|t| Instant::now() + t);
        Wait {
            attempts,
            context: self.clone(),
            queue: self.queues.join(key),
            line: Line::new(deadline, self.poll, once),
        }
    }
}
