//! Leases in memory: one holder per name, tokens from one counter, waiters served in arrival
//! order, losses reported once — the lock table's semantics without the table.
//!
//! Nothing expires: a holder in the same process never misses a heartbeat. What expiry would
//! do to a holder (someone else takes the lease over) a test forces with `force_loss`.

use pgcoord::__private as made;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::{Error, ErrorKind, Holder, LeaseInfo, Result};
use tokio::sync::Notify;

use super::Shared;
use crate::leases::Acquire;
use crate::losses::{LockKey, LockLost, LossReason, Tenure as Standing, TenureSender, TenureWatch};

/// Every lease of one in-memory backend.
#[derive(Default)]
pub(super) struct LeaseState {
    last_token: i64,
    rows: HashMap<String, Row>,
    /// Waiters per name (id, priority, wake-up), by priority then arrival; the front one is
    /// served first.
    queues: HashMap<String, VecDeque<(u64, i32, Arc<Notify>)>>,
    next_waiter: u64,
}

/// A lock's row: a holder while held; kept without one after a keep-on-release.
#[derive(Default)]
struct Row {
    tenure: Option<HeldBy>,
    data: Option<Vec<u8>>,
}

struct HeldBy {
    owner: String,
    coordinator: u64,
    token: i64,
    keep_on_release: bool,
    lost: TenureSender,
}

/// What one attempt found.
pub(super) enum Attempt {
    /// Granted: the token, the data, and the loss signal's receiver.
    Granted(i64, Option<Vec<u8>>, TenureWatch),
    /// Held by someone else (`None`: free, but another waiter came first).
    Held(Option<Holder>),
}

impl LeaseState {
    /// One attempt by `coordinator` (owner `owner`), who is waiter `waiter` when queued.
    pub(super) fn attempt(
        &mut self,
        request: &Acquire,
        coordinator: u64,
        owner: &str,
        waiter: Option<u64>,
        lease: Duration,
    ) -> Result<Attempt> {
        let name = &request.name;
        if let Some(tenure) = self.rows.get(name).and_then(|row| row.tenure.as_ref()) {
            if tenure.coordinator == coordinator {
                return Err(crate::leases::acquire::already_held(name));
            }
            return Ok(Attempt::Held(Some(made::holder(
                tenure.owner.clone(),
                tenure.token,
                lease,
            ))));
        }
        let front = self
            .queues
            .get(name)
            .and_then(|q| q.front())
            .map(|(id, _, _)| *id);
        if front.is_some() && front != waiter {
            return Ok(Attempt::Held(None));
        }
        if let Some(id) = waiter {
            self.dequeue(name, id);
        }
        self.last_token += 1;
        let token = self.last_token;
        let (lost, lost_rx) = crate::losses::tenure();
        let row = self.rows.entry(name.clone()).or_default();
        if row.data.is_none() || request.replace_data {
            row.data = request.data.as_ref().map(|d| d.to_vec());
        }
        row.tenure = Some(HeldBy {
            owner: owner.to_owned(),
            coordinator,
            token,
            keep_on_release: request.on_release.keep,
            lost,
        });
        Ok(Attempt::Granted(token, row.data.clone(), lost_rx))
    }

    /// Queues a waiter for `name` with `priority` (behind every waiter of its priority or
    /// higher), woken through `notify` when it may try again.
    pub(super) fn enqueue(&mut self, name: &str, priority: i32, notify: Arc<Notify>) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        let queue = self.queues.entry(name.to_owned()).or_default();
        let at = (queue.iter())
            .position(|(_, other, _)| *other < priority)
            .unwrap_or(queue.len());
        queue.insert(at, (id, priority, notify));
        // First now, of a free lease (one with a lower priority was woken and will be refused):
        // it tries at once.
        self.wake(name);
        id
    }

    /// Takes waiter `id` out of `name`'s queue; when it was first and the lease is free, the
    /// next one may try.
    pub(super) fn dequeue(&mut self, name: &str, id: u64) {
        let Some(queue) = self.queues.get_mut(name) else {
            return;
        };
        let was_first = queue.front().is_some_and(|(first, _, _)| *first == id);
        queue.retain(|(waiter, _, _)| *waiter != id);
        if queue.is_empty() {
            self.queues.remove(name);
        } else if was_first {
            self.wake(name);
        }
    }

    /// Wakes the first waiter for `name`, if the lease is free.
    fn wake(&self, name: &str) {
        let free = self.rows.get(name).is_none_or(|row| row.tenure.is_none());
        if let (true, Some((_, _, notify))) = (free, self.queues.get(name).and_then(|q| q.front()))
        {
            notify.notify_one();
        }
    }

    /// Whether `name` is held now.
    pub(super) fn is_held(&self, name: &str) -> bool {
        self.rows.get(name).is_some_and(|row| row.tenure.is_some())
    }

    /// Ends the tenure `token` of `name`. [`ErrorKind::LockLost`] when it is not the current one.
    pub(super) fn release(&mut self, name: &str, token: i64) -> Result<()> {
        let row = self.rows.get_mut(name);
        let Some(row) = row.filter(|r| r.tenure.as_ref().is_some_and(|t| t.token == token)) else {
            return Err(lost(name));
        };
        let tenure = row.tenure.take().expect("checked above");
        tenure.lost.send(Standing::Released);
        if !tenure.keep_on_release {
            self.rows.remove(name);
        }
        self.wake(name);
        Ok(())
    }

    /// Whether `token` is `name`'s current tenure.
    pub(super) fn check(&self, name: &str, token: i64) -> Result<()> {
        let held = self.rows.get(name).and_then(|r| r.tenure.as_ref());
        match held {
            Some(tenure) if tenure.token == token => Ok(()),
            _ => Err(lost(name)),
        }
    }

    /// Takes `name` from its holder as a takeover would: the row is deleted, the holder told
    /// (once), the next waiter woken. The holder's coordinator and the loss, when it was held.
    pub(super) fn force_loss(&mut self, name: &str) -> Option<(u64, LockLost)> {
        let tenure = self.rows.get_mut(name)?.tenure.take()?;
        self.rows.remove(name);
        tenure.lost.send(Standing::Lost(LossReason::TakenOver));
        self.wake(name);
        let loss = LockLost {
            key: LockKey::Lease(name.to_owned()),
            token: Some(tenure.token),
            reason: LossReason::TakenOver,
        };
        Some((tenure.coordinator, loss))
    }

    /// Every row whose name starts with `prefix`, by name, as `get` reports one.
    pub(super) fn list_prefix(&self, prefix: &str, lease: Duration) -> Vec<LeaseInfo> {
        let mut names: Vec<&String> = (self.rows.keys())
            .filter(|name| name.starts_with(prefix))
            .collect();
        names.sort();
        (names.into_iter())
            .filter_map(|name| self.get(name, lease).ok())
            .collect()
    }

    /// A free, kept row for `name` when it has none: true when recorded now.
    pub(super) fn keep_free(&mut self, name: &str) -> bool {
        if self.rows.contains_key(name) {
            return false;
        }
        self.rows.insert(name.to_owned(), Row::default());
        true
    }

    pub(super) fn get(&self, name: &str, lease: Duration) -> Result<LeaseInfo> {
        let row = self
            .rows
            .get(name)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no lock named {name:?}")))?;
        let tenure = row.tenure.as_ref();
        Ok(made::lease_info(
            name.to_owned(),
            tenure.map(|t| t.owner.clone()),
            tenure.map(|t| t.token),
            row.data.clone(),
            tenure.map(|_| lease),
        ))
    }
}

fn lost(name: &str) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!("lease {name:?} was lost or already released"),
    )
}

/// Takes a waiter out of its queue if its wait ends without a grant (a timeout, a caller that
/// gave up), so the next waiter is not kept behind it.
struct QueuePlace {
    shared: Arc<Shared>,
    name: String,
    id: u64,
    /// Set once granted: `attempt` took the waiter out of the queue itself.
    served: bool,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if !self.served {
            self.shared.lock().leases.dequeue(&self.name, self.id);
        }
    }
}

/// Acquires `request` for `coordinator`: the lease's token, data and loss signal.
pub(super) async fn acquire(
    shared: Arc<Shared>,
    coordinator: u64,
    owner: String,
    request: Acquire,
) -> Result<(i64, Option<Vec<u8>>, TenureWatch)> {
    pgcoord::config::validate_name("lease name", request.name.clone())?;
    // As on PostgreSQL, though nothing expires here.
    crate::leases::held::checked_lease(request.lease, shared.lease)?;
    let deadline = request.timeout.map(|t| Instant::now() + t);
    let notify = Arc::new(Notify::new());
    let mut place: Option<QueuePlace> = None;
    loop {
        {
            let mut state = shared.lock();
            let lease = shared.lease;
            let waiter = place.as_ref().map(|p| p.id);
            match state
                .leases
                .attempt(&request, coordinator, &owner, waiter, lease)?
            {
                Attempt::Granted(token, data, lost) => {
                    if let Some(place) = &mut place {
                        place.served = true;
                    }
                    return Ok((token, data, lost));
                }
                Attempt::Held(holder) if request.fail_if_locked => {
                    return Err(Error::not_acquired(&request.name, holder));
                }
                Attempt::Held(_) if place.is_none() => {
                    let id = state
                        .leases
                        .enqueue(&request.name, request.priority, notify.clone());
                    place = Some(QueuePlace {
                        shared: shared.clone(),
                        name: request.name.clone(),
                        id,
                        served: false,
                    });
                }
                Attempt::Held(_) => {}
            }
        }
        match deadline {
            Some(deadline) => {
                if tokio::time::timeout_at(deadline.into(), notify.notified())
                    .await
                    .is_err()
                {
                    let holder = shared.lock().leases.get(&request.name, shared.lease).ok();
                    let holder = holder.and_then(|info| {
                        Some(made::holder(info.owner?, info.token?, info.remaining?))
                    });
                    return Err(Error::not_acquired(&request.name, holder));
                }
            }
            None => notify.notified().await,
        }
    }
}

/// What a [`Lease`] of the in-memory backend releases into.
pub(super) struct MemoryHolder {
    pub(super) shared: Arc<Shared>,
}

impl crate::leases::lease::Keeper for MemoryHolder {
    fn release(&self, name: String, token: i64) -> super::BoxFuture<Result<()>> {
        Box::pin(std::future::ready(self.release_now(&name, token)))
    }

    fn release_later(&self, name: String, token: i64) {
        let _ = self.release_now(&name, token);
    }

    fn fence<'a>(
        &'a self,
        _: &'a dyn pgcoord::Statements,
        name: &'a str,
        token: i64,
    ) -> pgcoord::BoxFuture<'a, Result<()>> {
        // No transaction to guard: the token is checked.
        Box::pin(std::future::ready(
            self.shared.lock().leases.check(name, token),
        ))
    }
}

impl MemoryHolder {
    fn release_now(&self, name: &str, token: i64) -> Result<()> {
        let released = self.shared.lock().leases.release(name, token);
        self.shared.released.notify_waiters();
        released
    }
}
