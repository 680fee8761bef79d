//! The leases a `LockManager` holds: their tokens, monotonic deadlines and loss signals, and the
//! names held, shared with the waits under way (a wait refuses a name held meanwhile).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::losses::Tenure;

/// What a lease's release does besides ending the tenure.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OnRelease {
    /// Keep the row and its data, free.
    pub(crate) keep: bool,
    /// Announce the release even when nobody is in line: a semaphore's permit (its waiters do
    /// not line up) or an election's term (its observers neither).
    pub(crate) announce_always: bool,
}

/// One lease this process holds.
pub(crate) struct Held {
    pub(crate) token: i64,
    pub(crate) on_release: OnRelease,
    /// How long each (re)grant lasts: the manager's lease, or the acquire's own.
    pub(crate) lease: Duration,
    /// Monotonic: when the last confirmed (re)grant was sent, plus the lease, minus a margin.
    /// Past it the server may give the lease away, so it is reported lost.
    pub(crate) deadline: Instant,
    tenure: watch::Sender<Tenure>,
}

impl Held {
    /// A lease granted with `token` for `lease`, held until `deadline` unless renewed; the
    /// receiver is its handle's.
    pub(crate) fn new(
        token: i64,
        on_release: OnRelease,
        lease: Duration,
        deadline: Instant,
    ) -> (Held, watch::Receiver<Tenure>) {
        let (tenure, receiver) = watch::channel(Tenure::Held);
        let held = Held {
            token,
            on_release,
            lease,
            deadline,
            tenure,
        };
        (held, receiver)
    }

    /// Tells the handle how the tenure ended.
    pub(crate) fn end(self, how: Tenure) {
        let _ = self.tenure.send(how);
    }
}

/// The names held, shared with waits under way. Only [`Holdings`] changes it.
#[derive(Clone, Default)]
pub(crate) struct HeldNames(Arc<Mutex<HashSet<Arc<str>>>>);

impl HeldNames {
    /// Whether `name` is held now.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.lock().expect("held names").contains(name)
    }
}

/// Every lease held, by name. The names are shared (`Arc<str>`), so a heartbeat tick copies
/// none.
#[derive(Default)]
pub(crate) struct Holdings {
    leases: HashMap<Arc<str>, Held>,
    names: HeldNames,
}

impl Holdings {
    /// The names held, as waits see them.
    pub(crate) fn names(&self) -> HeldNames {
        self.names.clone()
    }

    /// Records `name` as held; returns what was held under that name, which the turns of
    /// names rule out (see `queues`).
    pub(crate) fn insert(&mut self, name: Arc<str>, held: Held) -> Option<Held> {
        self.names
            .0
            .lock()
            .expect("held names")
            .insert(name.clone());
        self.leases.insert(name, held)
    }

    /// Forgets `name` when it is held with `token`, returning what was held.
    pub(crate) fn remove(&mut self, name: &str, token: i64) -> Option<Held> {
        if !self.holds(name, token) {
            return None;
        }
        self.names.0.lock().expect("held names").remove(name);
        self.leases.remove(name)
    }

    /// Whether `name` is held with `token`.
    pub(crate) fn holds(&self, name: &str, token: i64) -> bool {
        self.leases.get(name).is_some_and(|h| h.token == token)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.leases.contains_key(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.leases.len()
    }

    /// The earliest deadline of all.
    pub(crate) fn earliest_deadline(&self) -> Option<Instant> {
        self.leases.values().map(|h| h.deadline).min()
    }

    /// Every lease by name, token and lease: what a renewal sends.
    pub(crate) fn tenures(&self) -> Vec<(Arc<str>, i64, Duration)> {
        (self.leases.iter())
            .map(|(name, h)| (name.clone(), h.token, h.lease))
            .collect()
    }

    /// Moves the deadline of `name` when it is still held with `token`: its lease from `sent`,
    /// less the margin.
    pub(crate) fn extend(&mut self, name: &str, token: i64, sent: Instant) {
        if let Some(held) = self.leases.get_mut(name).filter(|h| h.token == token) {
            held.deadline = sent + held.lease - margin(held.lease);
        }
    }

    /// The leases whose deadline is `now` or earlier.
    pub(crate) fn past_deadline(&self, now: Instant) -> Vec<(Arc<str>, i64)> {
        (self.leases.iter())
            .filter(|(_, h)| h.deadline <= now)
            .map(|(name, h)| (name.clone(), h.token))
            .collect()
    }

    /// Forgets every lease, returning them.
    pub(crate) fn drain(&mut self) -> Vec<(Arc<str>, Held)> {
        self.names.0.lock().expect("held names").clear();
        self.leases.drain().collect()
    }
}

pub(crate) use pgcoord::lease::margin;

/// The longest lease one acquire may ask for ([`Acquire::lease`](crate::Acquire::lease)): a
/// year.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The lease a request asks for, checked against the manager's `default`: `None` for the
/// manager's own.
pub(crate) fn checked_lease(
    asked: Option<Duration>,
    default: Duration,
) -> pgcoord::Result<Duration> {
    match asked {
        None => Ok(default),
        Some(lease) if lease < default => Err(pgcoord::Error::new(
            pgcoord::ErrorKind::InvalidConfig,
            format!(
                "a lease of {lease:?} is shorter than the manager's ({default:?}), whose heartbeat \
                 could not keep it: use a manager configured with it"
            ),
        )),
        Some(lease) if lease > MAX_LEASE => Err(pgcoord::Error::new(
            pgcoord::ErrorKind::InvalidConfig,
            format!("a lease of {lease:?} is longer than the most, {MAX_LEASE:?}"),
        )),
        Some(lease) => Ok(lease),
    }
}
