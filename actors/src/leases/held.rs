//! The leases a `LockManager` holds: their book (tokens, monotonic deadlines: `book`), their
//! loss signals, and the names held, shared with the waits under way (a wait refuses a name
//! held meanwhile).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::book::{Answer, Book, Renewal, Verdict};
use crate::losses::{Tenure, TenureSender, TenureWatch, tenure};

/// What a lease's release does besides ending the tenure.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OnRelease {
    /// Keep the row and its data, free.
    pub(crate) keep: bool,
    /// Announce the release even when nobody is in line: a semaphore's permit (its waiters do
    /// not line up) or an election's term (its observers neither).
    pub(crate) announce_always: bool,
}

/// What the holder of a lease keeps beside its entry in the book: how to release it, and its
/// handle's loss signal.
pub(crate) struct Held {
    pub(crate) on_release: OnRelease,
    tenure: TenureSender,
}

impl Held {
    /// A lease just granted; the receiver is its handle's.
    pub(crate) fn new(on_release: OnRelease) -> (Held, TenureWatch) {
        let (tenure, receiver) = tenure();
        (Held { on_release, tenure }, receiver)
    }

    /// Tells the handle how the tenure ended.
    pub(crate) fn end(self, how: Tenure) {
        self.tenure.send(how);
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

    fn insert(&self, name: Arc<str>) {
        self.0.lock().expect("held names").insert(name);
    }

    fn remove<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut held = self.0.lock().expect("held names");
        for name in names {
            held.remove(name);
        }
    }
}

/// Every lease held: the book (tokens, deadlines, renewals), and the names held as waits see
/// them, kept in step with it.
#[derive(Default)]
pub(crate) struct Holdings {
    book: Book<Held>,
    names: HeldNames,
}

impl Holdings {
    /// The names held, as waits see them.
    pub(crate) fn names(&self) -> HeldNames {
        self.names.clone()
    }

    /// Records `name` as held with `token`, granted for `lease` by a statement sent at `sent`;
    /// returns what was held under that name, which the turns of names rule out (see
    /// `queues`).
    pub(crate) fn insert(
        &mut self,
        name: Arc<str>,
        token: i64,
        (sent, lease): (Instant, Duration),
        held: Held,
    ) -> Option<(i64, Held)> {
        self.names.insert(name.clone());
        self.book.hold(name, token, lease, sent, held)
    }

    /// Forgets `name` when it is held with `token`, returning what was held.
    pub(crate) fn remove(&mut self, name: &str, token: i64) -> Option<Held> {
        let held = self.book.remove(name, token)?;
        self.names.remove([name]);
        Some(held)
    }

    /// Whether `name` is held with `token`.
    pub(crate) fn holds(&self, name: &str, token: i64) -> bool {
        self.book.holds(name, token)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.book.contains(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.book.len()
    }

    /// The book's renewal to send at `now` (see [`Book::plan`]).
    pub(crate) fn plan(
        &mut self,
        now: Instant,
        timeout: Duration,
        lease: Duration,
    ) -> Option<Renewal> {
        self.book.plan(now, timeout, lease)
    }

    /// The book's verdicts on a renewal's answer (see [`Book::answered`]).
    pub(crate) fn answered(
        &mut self,
        renewal: Renewal,
        sent: Instant,
        answer: Answer,
    ) -> Vec<(Arc<str>, i64, Verdict<Held>)> {
        let verdicts = self.book.answered(renewal, sent, answer);
        let lost = verdicts
            .iter()
            .filter(|(_, _, v)| matches!(v, Verdict::Lost(..)));
        self.names.remove(lost.map(|(name, _, _)| &**name));
        verdicts
    }

    /// Gives up every lease whose deadline is `now` or earlier, returning them.
    pub(crate) fn sweep(&mut self, now: Instant) -> Vec<(Arc<str>, i64, Held)> {
        let past = self.book.sweep(now);
        self.names.remove(past.iter().map(|(name, _, _)| &**name));
        past
    }

    /// Forgets every lease, returning them.
    pub(crate) fn drain(&mut self) -> Vec<(Arc<str>, i64, Held)> {
        self.names.0.lock().expect("held names").clear();
        self.book.drain()
    }
}

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
