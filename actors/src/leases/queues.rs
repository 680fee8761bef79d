//! The local waiters of each name: a FIFO turn, and the wake-up of the waiter whose turn it is.
//!
//! The turns of names are also what makes a manager's statements on one name take turns:
//! every statement that may grant or end a tenure of a name here — a wait's attempts and its
//! check of an attempt of unknown outcome, a release, a claim, a permit's attempt (for each slot
//! it may be granted) — runs while holding that name's turn. So a check that frees whatever
//! this owner holds of a name can never free a tenure of it the manager holds, is granted or
//! is releasing.
//!
//! Only the waiter whose turn it is talks to the database; the others wait in the FIFO of a
//! `tokio::sync::Mutex`, so a process sends one attempt per wake-up however many of its tasks
//! wait. Releases are announced with NOTIFY on the lease channel; the manager hears them through
//! the `ListenerActor` and wakes the waiting name. A wake-up only ends a nap early: notifications
//! can be missed, late or forged, so waiters also wake at the holder's expiry and on a poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::signals::doorbell::Bell;

/// The local waiters of one name (a lease's, or a semaphore's queue key).
pub(crate) struct NameQueue {
    key: String,
    /// Held by the one waiter whose turn it is, and by its clean-up after its answer.
    pub(crate) turn: Arc<tokio::sync::Mutex<()>>,
    /// Rung when the lease may have become free (a doorbell: the waiter's attempt decides).
    pub(crate) wake: Bell,
}

impl NameQueue {
    /// The name (or semaphore's queue key) this queue is for.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

/// The local queue of semaphore `name`: a key no lease can have (lease names hold no NUL).
pub(crate) fn queue_key(semaphore: &str) -> String {
    format!("{semaphore}\0permits")
}

/// The semaphore whose slot `name` is, if it is one.
pub(crate) fn semaphore_of(name: &str) -> Option<&str> {
    let (semaphore, index) = name.rsplit_once('#')?;
    index.parse::<u32>().is_ok().then_some(semaphore)
}

/// Every name with local waiters.
#[derive(Default)]
pub(crate) struct Queues {
    names: Mutex<HashMap<String, Arc<NameQueue>>>,
}

impl Queues {
    /// The queue of `key`, created on first use.
    pub(crate) fn join(&self, key: &str) -> Arc<NameQueue> {
        let mut names = self.names.lock().expect("queues");
        let queue = names.entry(key.to_owned()).or_insert_with(|| {
            Arc::new(NameQueue {
                key: key.to_owned(),
                turn: Arc::default(),
                wake: Bell::default(),
            })
        });
        queue.clone()
    }

    /// The turn of `key` when nobody has it, without waiting; else `None`, the queue left.
    pub(crate) fn try_turn(&self, key: &str) -> Option<(Arc<NameQueue>, OwnedMutexGuard<()>)> {
        let queue = self.join(key);
        let Ok(turn) = queue.turn.clone().try_lock_owned() else {
            self.leave(queue);
            return None;
        };
        Some((queue, turn))
    }

    /// Gives `turn` back (when had), then leaves `queue`. In that order: a queue forgotten
    /// while its turn is still taken would let the next waiter of the name make a new queue
    /// and take its turn at once, two turns of one name at the same time.
    pub(crate) fn give_back(&self, queue: Arc<NameQueue>, turn: Option<OwnedMutexGuard<()>>) {
        drop(turn);
        self.leave(queue);
    }

    /// Forgets `queue` once nobody else waits in it.
    fn leave(&self, queue: Arc<NameQueue>) {
        let mut names = self.names.lock().expect("queues");
        // One reference in the map, one in `queue`: nobody else.
        if Arc::strong_count(&queue) == 2 {
            names.remove(&queue.key);
            // A burst of waits grew the map (10,000 at once: 540 KB), which keeps its room
            // when emptied: given back once three quarters are free, at a cost of one rehash
            // per halving, so amortized constant.
            let left = names.len();
            if names.capacity() > 64 && left < names.capacity() / 4 {
                names.shrink_to(left * 2);
            }
        }
    }

    /// Wakes the waiter whose turn it is for `key`, if any.
    pub(crate) fn wake(&self, key: &str) {
        if let Some(queue) = self.names.lock().expect("queues").get(key) {
            queue.wake.ring();
        }
    }

    /// Lease `name` was released: wakes its waiters, and its semaphore's if it is a slot.
    pub(crate) fn wake_released(&self, name: &str) {
        self.wake(name);
        if let Some(semaphore) = semaphore_of(name) {
            self.wake(&queue_key(semaphore));
        }
    }

    /// Wakes every name's waiter: notifications may have been missed.
    pub(crate) fn wake_all(&self) {
        for queue in self.names.lock().expect("queues").values() {
            queue.wake.ring();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_names_gives_its_room_back_once_they_leave() {
        let queues = Queues::default();
        let joined: Vec<_> = (0..10_000).map(|i| queues.join(&format!("n{i}"))).collect();
        let grown = queues.names.lock().unwrap().capacity();
        assert!(grown >= 10_000, "{grown}");
        for queue in joined {
            queues.leave(queue);
        }
        let names = queues.names.lock().unwrap();
        assert!(names.is_empty());
        assert!(names.capacity() <= 64, "{} kept", names.capacity());
    }

    #[test]
    fn a_names_turn_is_one_callers_until_given_back() {
        let queues = Queues::default();
        let (queue, turn) = queues.try_turn("n").expect("free");
        // Refused twice: the refusals' leaving keeps the queue whose turn is taken.
        assert!(queues.try_turn("n").is_none());
        assert!(queues.try_turn("n").is_none());
        let (other, its_turn) = queues
            .try_turn("other")
            .expect("another name's turn is its own");
        queues.give_back(other, Some(its_turn));
        queues.give_back(queue, Some(turn));
        assert!(
            queues.names.lock().unwrap().is_empty(),
            "forgotten once given back"
        );
        assert!(queues.try_turn("n").is_some());
    }
}
