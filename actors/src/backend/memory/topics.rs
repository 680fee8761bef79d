//! Durable topics in memory: a log per topic, a cursor per consumer, and a consumer loop with the
//! runtime's rules — one active instance per consumer name (its lease, `"t/consumers/c"`, in
//! this backend), events handed over one at a time in order, the same event again after a
//! handler's `Err` or panic (after a backoff), acks forward only, and `Delivery::ack` fenced by
//! the lease. Every append is final at once (there are no transactions to wait for) and nothing
//! is trimmed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pgcoord::topic::{Cursor, Event, Start};
use pgcoord::{ErrorKind, Result};
use tokio::sync::Notify;

use super::{MemoryCoordinator, Shared};
use crate::backend::{BoxFuture, Locking};
use crate::leases::{Acquire, Lease};
use crate::topics::delivery::Acker;
use crate::topics::{Append, Consume, ConsumerStats, Delivery, DeliveryContext};

/// Every topic's log and every consumer's cursor of one in-memory backend.
#[derive(Default)]
pub(super) struct TopicState {
    logs: HashMap<String, Vec<Event>>,
    cursors: HashMap<(String, String), Cursor>,
    appended: i64,
}

impl TopicState {
    /// Appends the event; its cursor (both halves the append's number, from 1).
    pub(super) fn append(&mut self, append: Append) -> Result<Cursor> {
        append.check()?;
        self.appended += 1;
        let cursor = Cursor {
            xid: self.appended,
            position: self.appended,
        };
        let event = pgcoord::__private::event(cursor, SystemTime::now(), append.body);
        self.logs.entry(append.topic).or_default().push(event);
        Ok(cursor)
    }

    /// Up to `limit` events of `topic` after `after`.
    fn read(&self, topic: &str, after: Cursor, limit: usize) -> Vec<Event> {
        let Some(log) = self.logs.get(topic) else {
            return Vec::new();
        };
        let from = log.partition_point(|e| e.cursor <= after);
        log[from..].iter().take(limit).cloned().collect()
    }

    /// The stored cursor, or where `start` says the consumer starts (then stored).
    fn open(&mut self, topic: &str, consumer: &str, start: Start) -> Cursor {
        let key = (topic.to_owned(), consumer.to_owned());
        if let Some(cursor) = self.cursors.get(&key) {
            return *cursor;
        }
        let log = self.logs.get(topic).map_or(&[][..], Vec::as_slice);
        let cursor = match start {
            Start::Oldest => Cursor::START,
            Start::Now => log.last().map_or(Cursor::START, |e| e.cursor),
            Start::After(cursor) => cursor,
            Start::Time(at) => {
                let first = log.partition_point(|e| e.appended_at < at);
                first
                    .checked_sub(1)
                    .map_or(Cursor::START, |i| log[i].cursor)
            }
            // A start this backend does not know yet: from the oldest, as nothing is trimmed.
            _ => Cursor::START,
        };
        self.cursors.insert(key, cursor);
        cursor
    }

    /// The stored cursor of `consumer` of `topic`; `None` when it was never opened.
    pub(super) fn cursor(&self, topic: &str, consumer: &str) -> Option<Cursor> {
        let key = (topic.to_owned(), consumer.to_owned());
        self.cursors.get(&key).copied()
    }

    /// Moves the cursor forward to `cursor`; false when it was there or past it already.
    fn ack(&mut self, topic: &str, consumer: &str, cursor: Cursor) -> bool {
        let stored = (self.cursors)
            .entry((topic.to_owned(), consumer.to_owned()))
            .or_insert(Cursor::START);
        if cursor <= *stored {
            return false;
        }
        *stored = cursor;
        true
    }
}

/// A consumer running on the in-memory backend.
pub(super) struct Running {
    stats: Mutex<ConsumerStats>,
    stopping: Notify,
    stop_requested: AtomicBool,
    /// Set once the run has ended: its event finished and acked, its lease released.
    ended: tokio::sync::watch::Sender<bool>,
}

impl crate::topics::consumer::Consumer for Running {
    fn stats(&self) -> BoxFuture<Result<ConsumerStats>> {
        let stats = self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(std::future::ready(Ok(stats)))
    }

    fn stop(&self) -> BoxFuture<()> {
        self.stop_requested.store(true, Ordering::SeqCst);
        self.stopping.notify_one();
        let mut ended = self.ended.subscribe();
        Box::pin(async move {
            // As on PostgreSQL: a handler that takes longer than 30 s is not waited for.
            let ended = ended.wait_for(|ended| *ended);
            let _ = tokio::time::timeout(Duration::from_secs(30), ended).await;
        })
    }
}

impl Running {
    fn update(&self, f: impl FnOnce(&mut ConsumerStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Starts `consume` on `coordinator`'s task.
pub(super) fn consume(coordinator: &MemoryCoordinator, consume: Consume) -> Result<Arc<Running>> {
    consume.check()?;
    let running = Arc::new(Running {
        stats: Mutex::default(),
        stopping: Notify::new(),
        stop_requested: AtomicBool::new(false),
        ended: tokio::sync::watch::Sender::new(false),
    });
    let (coordinator, ours) = (coordinator.clone(), running.clone());
    tokio::spawn(async move {
        run(coordinator, consume, ours.clone()).await;
        ours.ended.send_replace(true);
    });
    Ok(running)
}

async fn run(coordinator: MemoryCoordinator, consume: Consume, running: Arc<Running>) {
    loop {
        let acquire = coordinator.acquire(Acquire::new(consume.lease_name()));
        let lease = tokio::select! {
            lease = acquire => lease,
            () = running.stopping.notified() => return,
        };
        let lease = match lease {
            Ok(lease) => Arc::new(lease),
            // Another consumer of the name in this coordinator holds it: wait, then ask again.
            Err(e) if e.kind() == ErrorKind::AlreadyHeld => {
                tokio::select! {
                    () = tokio::time::sleep(consume.poll) => continue,
                    () = running.stopping.notified() => return,
                }
            }
            Err(e) => {
                running.update(|s| s.failed = Some(e.to_string()));
                return;
            }
        };
        running.update(|s| {
            s.tenures += 1;
            s.active = true;
        });
        let stopped = tenure(&coordinator.shared, &consume, &running, &lease).await;
        running.update(|s| s.active = false);
        if stopped {
            return;
        }
    }
}

/// Delivers while the lease is held; true when the consumer stops.
async fn tenure(
    shared: &Arc<Shared>,
    consume: &Consume,
    running: &Running,
    lease: &Arc<Lease>,
) -> bool {
    let (topic, consumer) = (&consume.topic, &consume.consumer);
    let mut cursor = shared.lock().topics.open(topic, consumer, consume.start);
    let acker = Arc::new(Cursors(shared.clone()));
    let tenure = Arc::new(DeliveryContext {
        topic: topic.clone(),
        consumer: consumer.clone(),
        acker,
        lease: lease.clone(),
    });
    let mut errors = pgcoord::__private::Failures::default();
    loop {
        // Registered before the read, so an append after it wakes the wait below.
        let appended = shared.appended.notified();
        tokio::pin!(appended);
        appended.as_mut().enable();
        let events = shared
            .lock()
            .topics
            .read(topic, cursor, consume.window as usize);
        if events.is_empty() {
            tokio::select! {
                () = &mut appended => continue,
                _ = lease.lost() => return false,
                () = running.stopping.notified() => return true,
            }
        }
        for event in events {
            if lease.loss().is_some() {
                return false;
            }
            if running.stop_requested.load(Ordering::SeqCst) {
                return true;
            }
            let at = event.cursor;
            let delivery = Delivery {
                event,
                tenure: tenure.clone(),
            };
            let again = errors.in_a_row() > 0;
            running.update(|s| {
                s.delivered += 1;
                s.redelivered += u64::from(again);
            });
            if crate::topics::handover::handle(&consume.handler, delivery)
                .await
                .is_err()
            {
                errors.failed();
                running.update(|s| s.handler_errors += 1);
                tokio::select! {
                    () = tokio::time::sleep(crate::topics::run::backoff(&errors, consume.poll)) => {}
                    () = running.stopping.notified() => return true,
                }
                // A handler that acked in its own "transaction" has its event behind already.
                let stored = shared.lock().topics.open(topic, consumer, consume.start);
                cursor = cursor.max(stored);
                break;
            }
            errors.succeeded();
            cursor = at;
            if shared.lock().topics.ack(topic, consumer, cursor) {
                running.update(|s| s.acks += 1);
            }
        }
    }
}

/// The backend's cursors, as a [`Delivery`]'s ack moves them (no transaction: at once).
struct Cursors(Arc<Shared>);

impl Acker for Cursors {
    fn ack<'a>(
        &'a self,
        _: &'a dyn pgcoord::Statements,
        topic: &'a str,
        consumer: &'a str,
        cursor: Cursor,
    ) -> pgcoord::BoxFuture<'a, Result<bool>> {
        let moved = self.0.lock().topics.ack(topic, consumer, cursor);
        Box::pin(std::future::ready(Ok(moved)))
    }
}
