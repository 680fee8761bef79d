//! The batching path of [`RateLimiter::take`](super::RateLimiter::take): a process's waiters on
//! one key share a statement per round instead of each polling the server.
//!
//! The first waiter on a key spawns the key's round task; later ones join its line. A round asks
//! the server for the whole line's sum with `take_up_to` and hands what it got out in line order,
//! whole requests only; then, while anyone waits, it sleeps until the first in line would fit and
//! goes again. A hot key with a thousand waiters costs one statement per round, not a thousand
//! at every wake. What a round got but could not hand out (fewer than the first in line asked
//! for) is not kept: the process admits less, never more (at most `n − 1` per round, none for
//! takes of one). The task ends when the line is empty; a waiter whose deadline passed or who
//! went away is dropped from the line at the next round.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgcoord::Result;
use tokio::sync::oneshot;

use super::RateLimiter;

/// One waiter: what it asks for, until when, and where its answer goes.
struct Waiter {
    n: u32,
    deadline: Instant,
    answer: oneshot::Sender<Result<()>>,
}

/// Every key's line in one limiter. A key has a line exactly while a round task owns it: the
/// task removes the line, under the lock joiners take, when it leaves it empty.
#[derive(Default)]
pub(super) struct Lines(Mutex<HashMap<String, VecDeque<Waiter>>>);

impl Lines {
    /// Puts a waiter in `key`'s line; true when it is the first, and must start the round task.
    pub(super) fn join(
        &self,
        key: &str,
        n: u32,
        deadline: Instant,
    ) -> (bool, oneshot::Receiver<Result<()>>) {
        let (answer, receiver) = oneshot::channel();
        let mut lines = self.0.lock().expect("rate lines");
        let first = !lines.contains_key(key);
        let line = lines.entry(key.to_owned()).or_default();
        line.push_back(Waiter {
            n,
            deadline,
            answer,
        });
        (first, receiver)
    }

    /// The sum the line asks for, after dropping who left; `None` (and the line removed, under
    /// the same lock a joiner takes) when nobody is left, so a later joiner starts a new task.
    fn asked(&self, key: &str) -> Option<u64> {
        let mut lines = self.0.lock().expect("rate lines");
        let line = lines.get_mut(key)?;
        let now = Instant::now();
        line.retain(|w| !w.answer.is_closed() && w.deadline > now);
        if line.is_empty() {
            lines.remove(key);
            return None;
        }
        Some(line.iter().map(|w| u64::from(w.n)).sum())
    }

    /// Hands `granted` out in line order, whole requests only: what the first one left asks
    /// for and the latest deadline in line, or `None` when the line is served (and removed).
    fn hand_out(&self, key: &str, mut granted: u64) -> Option<(u32, Instant)> {
        let mut lines = self.0.lock().expect("rate lines");
        let line = lines.get_mut(key)?;
        while let Some(first) = line.front() {
            if u64::from(first.n) > granted {
                let latest = line.iter().map(|w| w.deadline).max().expect("a first");
                return Some((first.n, latest));
            }
            granted -= u64::from(first.n);
            let waiter = line.pop_front().expect("a first");
            // One who went away meanwhile lost its share: less admitted, never more.
            let _ = waiter.answer.send(Ok(()));
        }
        lines.remove(key);
        None
    }

    /// Tells everyone in `key`'s line of `error`, and empties it.
    fn fail(&self, key: &str, error: &pgcoord::Error) {
        let line = self.0.lock().expect("rate lines").remove(key);
        for waiter in line.into_iter().flatten() {
            let _ = (waiter.answer).send(Err(pgcoord::Error::new(error.kind(), error.to_string())));
        }
    }
}

/// Rounds for `key` until its line is empty: the task the first waiter on a key spawns, with a
/// clone of its limiter.
pub(super) async fn rounds(limiter: RateLimiter, key: String) {
    let RateLimiter {
        buckets,
        rate,
        counters,
        lines,
    } = limiter;
    while let Some(asked) = lines.asked(&key) {
        // Asked is at most the line's sum of u32s; the statement takes a u32.
        let asked = u32::try_from(asked).unwrap_or(u32::MAX);
        let taken = match buckets.take(&key, asked, &rate, false).await {
            Ok(taken) => taken,
            Err(e) => {
                lines.fail(&key, &e);
                return;
            }
        };
        counters.count(taken.granted);
        let Some((next, latest)) = lines.hand_out(&key, u64::from(taken.granted)) else {
            return;
        };
        // The bucket is empty now: the next in line fits once it refilled by its `n`. No later
        // than the last deadline in line, so a slow rate's task does not outlive its waiters.
        let wait = taken.retry_after + rate.interval() * next.saturating_sub(1);
        let wake = (Instant::now() + wait.max(Duration::from_micros(1))).min(latest);
        tokio::time::sleep_until(wake.into()).await;
    }
}
