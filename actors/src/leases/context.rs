//! What every wait of one `LockManager` shares, made once when it starts: its pool, table and
//! owner, the local queues, the names held, the batchers of first attempts and releases, and
//! the counters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgcoord::lease::LeaseOwner;
use pgcoord::{LeaseTable, Pool};

use super::batch::acquire::AcquireBatcher;
use super::batch::release::Releaser;
use super::counters::Counters;
use super::held::HeldNames;
use super::queues::Queues;
use super::under_way::UnderWay;

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
    /// Where every release goes, the same.
    pub(crate) releaser: Releaser,
    pub(crate) counters: Arc<Counters>,
    /// The stored limit each limited semaphore was last seen with, to name its slots at the
    /// first attempt (a stale one only costs a second attempt).
    pub(crate) limits: Mutex<HashMap<String, u32>>,
    /// Waits, unrecorded grants and releases under way; closed by a graceful shutdown.
    pub(crate) under_way: UnderWay,
    /// The names whose last wait here had to get in line, and until when that is worth
    /// knowing: a wait for one of them gets in line with its first attempt.
    pub(crate) contended: Mutex<HashMap<String, Instant>>,
}

/// How many contended names are remembered at most: past it, the ones whose time is up are
/// forgotten, and all of them if that is not enough (a hint lost costs a statement).
const CONTENDED_KEPT: usize = 1024;

impl WaitContext {
    /// The owner's lease statements. The owner was checked with the configuration.
    pub(crate) fn statements(&self) -> LeaseOwner<'_> {
        self.table.owner(&self.owner).expect("a configured owner")
    }

    /// Whether a wait for `name` had to get in line here within the last lease.
    pub(crate) fn contended(&self, name: &str) -> bool {
        let contended = self.contended.lock().expect("contended names");
        contended
            .get(name)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Remembers whether a wait for `name` was refused before it was granted (for a lease
    /// from now), or forgets it: a name no longer contended goes back to plain first attempts,
    /// which share statements.
    pub(crate) fn note_contention(&self, name: &str, refused: bool) {
        let now = Instant::now();
        let mut contended = self.contended.lock().expect("contended names");
        if !refused {
            contended.remove(name);
            return;
        }
        if contended.len() >= CONTENDED_KEPT && !contended.contains_key(name) {
            contended.retain(|_, until| *until > now);
            if contended.len() >= CONTENDED_KEPT {
                contended.clear();
            }
        }
        contended.insert(name.to_owned(), now + self.lease);
    }
}
