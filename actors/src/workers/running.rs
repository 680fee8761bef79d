//! The workers running here: one per key held, each with its key's lease; started again when
//! one stops (a panic) while its key is held, stopped for idleness when the pool passivates.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::warn;

use super::messages::WorkerKey;
use crate::leases::Lease;
use crate::losses::Shutdown;

struct Running<W: Actor> {
    /// Shared with the worker's [`WorkerKey`]: released once both are done with it.
    lease: Arc<Lease>,
    worker: Addr<W>,
    /// Told to stop for idleness ([`passivate_after`](super::WorkerPool::passivate_after)):
    /// the key stays held, and the next routed message starts a worker again once this one
    /// has stopped.
    passive: bool,
    /// The worker's start or its last routed message.
    used: Instant,
    /// Told messages ([`KeyRouter::tell`](super::KeyRouter::tell)) handed to the worker and
    /// not yet handled.
    told: Arc<AtomicUsize>,
}

/// The workers of the keys held here, by key, and what starts them.
pub(super) struct Crew<W: Actor> {
    factory: Box<dyn Fn(WorkerKey) -> W>,
    running: HashMap<String, Running<W>>,
    /// Workers started again after they stopped while their key was held.
    restarts: u64,
    /// Idle workers stop after this long; their keys stay held.
    passivate_after: Option<Duration>,
}

impl<W> Crew<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// No worker yet; `factory` makes the worker of one key.
    pub(super) fn new(factory: impl Fn(WorkerKey) -> W + 'static) -> Crew<W> {
        Crew {
            factory: Box::new(factory),
            running: HashMap::new(),
            restarts: 0,
            passivate_after: None,
        }
    }

    /// Idle workers stop after `idle`.
    pub(super) fn passivate_after(&mut self, idle: Duration) {
        self.passivate_after = Some(idle);
    }

    fn start_worker(&self, key: &str, lease: &Arc<Lease>) -> Addr<W> {
        (self.factory)(WorkerKey {
            key: key.to_owned(),
            token: lease.token(),
            lease: lease.clone(),
        })
        .start()
    }

    /// Starts the worker of `key`, granted with `lease`.
    pub(super) fn start(&mut self, key: String, lease: Arc<Lease>) {
        let worker = self.start_worker(&key, &lease);
        let running = Running {
            lease,
            worker,
            passive: false,
            used: Instant::now(),
            told: Arc::default(),
        };
        self.running.insert(key, running);
    }

    /// The worker of `key` to hand a message to, when this process holds the key (not lost):
    /// started again if it was passivated and has stopped. None while a passivated worker is
    /// still stopping (nothing is delivered; the caller tries again), or when not held here.
    pub(super) fn awake(&mut self, key: &str) -> Option<Addr<W>> {
        let running = self.running.get(key)?;
        if running.lease.loss().is_some() {
            return None;
        }
        if running.passive {
            if running.worker.connected() {
                return None;
            }
            let worker = self.start_worker(key, &running.lease.clone());
            let running = self.running.get_mut(key)?;
            running.worker = worker;
            running.passive = false;
        }
        let running = self.running.get_mut(key)?;
        if !running.worker.connected() {
            return None;
        }
        running.used = Instant::now();
        Some(running.worker.clone())
    }

    /// Takes `key`'s worker and lease out, the worker told to stop.
    pub(super) fn stop(&mut self, key: &str) -> Option<(Arc<Lease>, Addr<W>)> {
        let Running { lease, worker, .. } = self.running.remove(key)?;
        worker.do_send(Shutdown);
        Some((lease, worker))
    }

    /// Stops `key`'s worker when its lease (with `token`) is the one lost: whether it did.
    pub(super) fn lost(&mut self, key: &str, token: i64) -> bool {
        let lost = (self.running.get(key)).is_some_and(|r| r.lease.token() == token);
        if lost {
            self.stop(key);
        }
        lost
    }

    /// Looks after the workers of pool `pool`: those whose lease is lost stop now, idle ones
    /// are passivated, and those that stopped (a panic) while their lease is held start again.
    pub(super) fn tend(&mut self, pool: &str) {
        let lost: Vec<String> = (self.running.iter())
            .filter(|(_, r)| r.lease.loss().is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in lost {
            warn!(pool.name = %pool, worker.key = %key, "key's lease lost; its worker stops");
            self.stop(&key);
        }
        if let Some(idle) = self.passivate_after {
            for running in self.running.values_mut() {
                if !running.passive && running.used.elapsed() >= idle {
                    running.worker.do_send(Shutdown);
                    running.passive = true;
                }
            }
        }
        let dead: Vec<(String, Arc<Lease>)> = (self.running.iter())
            .filter(|(_, r)| !r.passive && !r.worker.connected())
            .map(|(k, r)| (k.clone(), r.lease.clone()))
            .collect();
        for (key, lease) in dead {
            self.restarts += 1;
            warn!(pool.name = %pool, worker.key = %key, "worker stopped while its key is held; starting it again");
            let worker = self.start_worker(&key, &lease);
            if let Some(running) = self.running.get_mut(&key) {
                running.worker = worker;
            }
        }
    }
}

impl<W: Actor> Crew<W> {
    /// The keys with a worker here (lost or not).
    pub(super) fn keys(&self) -> impl Iterator<Item = &String> {
        self.running.keys()
    }

    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.running.contains_key(key)
    }

    /// Whether `key` is held here and not lost.
    pub(super) fn holds(&self, key: &str) -> bool {
        (self.running.get(key)).is_some_and(|r| r.lease.loss().is_none())
    }

    /// The lease of `key`, when it has a worker here.
    pub(super) fn lease(&self, key: &str) -> Option<Arc<Lease>> {
        self.running.get(key).map(|r| r.lease.clone())
    }

    /// The count of told messages `key`'s worker has not handled yet.
    pub(super) fn told(&self, key: &str) -> Option<Arc<AtomicUsize>> {
        self.running.get(key).map(|r| r.told.clone())
    }

    /// The keys held here and not lost, with their tokens.
    pub(super) fn assigned(&self) -> BTreeMap<String, i64> {
        (self.running.iter())
            .filter(|(_, r)| r.lease.loss().is_none())
            .map(|(key, r)| (key.clone(), r.lease.token()))
            .collect()
    }

    /// Keys held here whose idle worker was stopped.
    pub(super) fn passive(&self) -> usize {
        self.running.values().filter(|r| r.passive).count()
    }

    pub(super) fn restarts(&self) -> u64 {
        self.restarts
    }
}
