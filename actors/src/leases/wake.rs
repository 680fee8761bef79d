//! Wake-ups for waiters: a FIFO turn per lock name, woken by the releases the listener hears.
//!
//! Only the first local waiter for a name talks to the database; the others wait their turn in
//! the FIFO of a `tokio::sync::Mutex`, so a process sends one attempt per wake-up however many
//! of its tasks wait. Releases are announced with NOTIFY on the lease channel; the
//! `ListenerActor` hears them and the manager wakes the waiting name. Notifications can be missed (while reconnecting, say), so waiters
//! also wake at the holder's expiry and on a polling fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The local queue of one lock name.
#[derive(Default)]
pub(crate) struct NameQueue {
    /// Held by the one waiter whose turn it is.
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Signalled when the lease may have become free.
    pub(crate) wake: Notify,
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

    /// Forgets `name`'s queue once nobody else waits in it.
    pub(crate) fn leave(&self, name: &str, queue: Arc<NameQueue>) {
        let mut names = self.names.lock().expect("queues lock");
        // One reference in the map, one in `queue`: nobody else.
        if Arc::strong_count(&queue) == 2 {
            names.remove(name);
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
