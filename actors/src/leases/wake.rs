//! Wake-ups for waiters: a FIFO turn per lock name, woken by the releases the listener hears,
//! and the leases releases hand to this process, waiting to be taken.
//!
//! Only the first local waiter for a name talks to the database; the others wait their turn in
//! the FIFO of a `tokio::sync::Mutex`, so a process sends one attempt per wake-up however many
//! of its tasks wait. Releases are announced with NOTIFY on the lease channel; the
//! `ListenerActor` hears them and the manager wakes the waiting name. Notifications can be missed (while reconnecting, say), so waiters
//! also wake at the holder's expiry and on a polling fallback.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The local queue of one lock name.
#[derive(Default)]
pub(crate) struct NameQueue {
    /// Held by the one waiter whose turn it is.
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Signalled when the lease may have become free, or was handed to us.
    pub(crate) wake: Notify,
    /// A lease a release handed to this process, announced and not yet taken by the waiter
    /// whose turn it is (see [`Queues::hand_over`]). Announced only: the waiter takes it when
    /// the announcement names the nonce of its last refused attempt, or once the row says it is
    /// ours with that token.
    handed: Mutex<Option<Handed>>,
    /// How many times an orphan check (which releases any lease of the name this owner holds)
    /// began for this name: a handover announced before one may have been released by it, so
    /// it is no longer taken on its nonce (see `AcquireJob::take_handed`).
    orphan_checks: AtomicU64,
}

/// A handover to this process as its announcement tells it (see `pgcoord::lease::Released`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handed {
    /// The token the lease was handed over with.
    pub(crate) token: i64,
    /// The nonce of the attempt that last wrote the place it was handed to, when it had one.
    pub(crate) nonce: Option<i64>,
}

impl NameQueue {
    /// Takes the lease handed to this process, if one is waiting to be taken.
    pub(crate) fn take_handed(&self) -> Option<Handed> {
        self.handed.lock().expect("handed").take()
    }

    /// How many orphan checks of this name have begun (see `orphan_checks`).
    pub(crate) fn orphan_checks(&self) -> u64 {
        self.orphan_checks.load(Ordering::SeqCst)
    }
}

/// Every name with local waiters.
#[derive(Default)]
pub(crate) struct Queues {
    names: Mutex<HashMap<String, Arc<NameQueue>>>,
}

impl Queues {
    /// The queue of `name`, created on first use.
    pub(crate) fn join(&self, name: &str) -> Arc<NameQueue> {
        let mut names = self.names.lock().expect("queues lock");
        names.entry(name.to_owned()).or_default().clone()
    }

    /// Forgets `name`'s queue once nobody else waits in it. Returns a lease handed to this
    /// process that nobody took, when the queue goes with one: the caller releases it (under the
    /// map's lock, so a handover is either seen here or finds no queue).
    pub(crate) fn leave(&self, name: &str, queue: Arc<NameQueue>) -> Option<Handed> {
        let mut names = self.names.lock().expect("queues lock");
        // One reference in the map, one in `queue`: nobody else.
        if Arc::strong_count(&queue) == 2 {
            names.remove(name);
            return queue.take_handed();
        }
        None
    }

    /// A release handed `name` to this process: the waiter whose turn it is takes it. False
    /// when nobody here waits for `name` any more; the caller releases it.
    pub(crate) fn hand_over(&self, name: &str, handed: Handed) -> bool {
        let names = self.names.lock().expect("queues lock");
        let Some(queue) = names.get(name) else {
            return false;
        };
        *queue.handed.lock().expect("handed") = Some(handed);
        queue.wake.notify_one();
        true
    }

    /// An orphan check of `name` begins: a handover to a waiter here heard before it is no
    /// longer taken on its nonce.
    pub(crate) fn orphan_check(&self, name: &str) {
        if let Some(queue) = self.names.lock().expect("queues lock").get(name) {
            queue.orphan_checks.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes the waiter whose turn it is for `name`, if any.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(queue) = self.names.lock().expect("queues lock").get(name) {
            queue.wake.notify_one();
        }
    }

    /// Wakes every name's waiter: notifications may have been missed.
    pub(crate) fn wake_all(&self) {
        for queue in self.names.lock().expect("queues lock").values() {
            queue.wake.notify_one();
        }
    }
}
