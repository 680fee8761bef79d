//! What every lock-holding actor broadcasts when a lock is lost, and the subscriber list that
//! delivers it: [`LockLost`], [`LockKey`], [`LossReason`], [`SubscribeLockLost`], and the
//! [`Shutdown`] both lock actors answer.

use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::Notify;

/// Register for [`LockLost`] broadcasts.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SubscribeLockLost(pub Recipient<LockLost>);

/// Which lock was lost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKey {
    /// A lease, by name.
    Lease(String),
    /// An advisory lock, by key.
    Advisory(i64),
}

impl LockKey {
    /// The `kind` label of the losses metric.
    fn kind(&self) -> &'static str {
        match self {
            LockKey::Lease(_) => "lease",
            LockKey::Advisory(_) => "advisory",
        }
    }
}

/// Why a lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The server says the lease is no longer this tenure's: its row is gone or carries
    /// another token or owner (it expired and was taken over, or was deleted by hand), or it
    /// had already expired on the server when a renewal reached it (a renewal never revives an
    /// expired lease).
    TakenOver,
    /// No renewal was confirmed before the holder's own deadline (the database may be
    /// unreachable); the server may give the lease away from now on.
    DeadlinePassed,
    /// The session holding an advisory lock failed: the server released the lock.
    ConnectionLost,
    /// The manager stopped ([`Shutdown`] or its System ending) and released the lock.
    Shutdown,
    /// The session holding an advisory lock stopped answering pings. Its server session may
    /// still be alive, but the lock is given up: keeping a lock already lost is the worse bug.
    Stalled,
}

impl LossReason {
    /// The `reason` label of the losses metric.
    fn label(self) -> &'static str {
        match self {
            LossReason::TakenOver => "taken_over",
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::ConnectionLost => "connection_lost",
            LossReason::Shutdown => "shutdown",
            LossReason::Stalled => "stalled",
        }
    }
}

/// Broadcast to every subscriber, exactly once per lost lock.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub struct LockLost {
    /// The lock.
    pub key: LockKey,
    /// The fencing token of the lost tenure (leases only).
    pub token: Option<i64>,
    /// Why it was lost.
    pub reason: LossReason,
}

/// Stop an actor: a `LockManager` releases every held lease, an `AdvisoryLocks` closes every
/// session (releasing its locks), a `ListenerActor` closes its connection; every lock still held
/// is reported to subscribers as lost with [`LossReason::Shutdown`]. A `TopicConsumer` finishes
/// the event in hand and releases its lease; a `WorkerPool` stops its workers and releases its
/// keys; a `ScheduleRunner` finishes the tick in hand. Lock actors run until this is sent or their
/// System stops: their timers keep them alive.
///
/// A worker pool sends it to a worker whose key's lease is lost or handed to another process:
/// workers implement it as `ctx.stop()`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// The subscribers of [`LockLost`] of one actor; each loss is counted too (see `metrics`).
pub(crate) struct LossSubscribers {
    subscribers: Vec<Recipient<LockLost>>,
}

impl LossSubscribers {
    /// No subscribers yet.
    pub(crate) fn new() -> LossSubscribers {
        LossSubscribers {
            subscribers: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, recipient: Recipient<LockLost>) {
        self.subscribers.push(recipient);
    }

    /// Counts `lost` and sends it to every subscriber, forgetting those that are gone.
    /// `do_send` ignores the mailbox's capacity: a loss report must never be dropped because a
    /// subscriber is busy.
    pub(crate) fn broadcast(&mut self, lost: LockLost) {
        crate::metrics::loss(lost.key.kind(), lost.reason.label());
        self.subscribers.retain(|s| {
            s.do_send(lost.clone());
            s.connected()
        });
    }
}

/// Where a lock's tenure stands, as its handle sees it (`Lease::lost`, `AdvisoryGuard::lost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tenure {
    /// Held.
    Held,
    /// Lost, for this reason.
    Lost(LossReason),
    /// Released by its holder: no loss.
    Released,
}

/// A channel that tells a lock's handle how its tenure ended: `tokio::sync::watch` cut to
/// what a handle needs. Every held lease has one, and a watch channel takes 344 bytes (its
/// eight wakers' lists), this one 64: 2.8 MiB less for 10,000 held leases (docs/BENCHMARKS.md).
pub(crate) fn tenure() -> (TenureSender, TenureWatch) {
    let cell = Arc::new(TenureCell {
        state: Mutex::new((Tenure::Held, false)),
        changed: Notify::new(),
    });
    (TenureSender(cell.clone()), TenureWatch(cell))
}

struct TenureCell {
    /// The tenure, and whether its sender is gone.
    state: Mutex<(Tenure, bool)>,
    changed: Notify,
}

/// Tells the handles how the tenure ended; dropped without a word, they take it as lost.
pub(crate) struct TenureSender(Arc<TenureCell>);

/// What a handle sees of its tenure. Cheap to clone.
#[derive(Clone)]
pub(crate) struct TenureWatch(Arc<TenureCell>);

impl TenureSender {
    pub(crate) fn send(&self, tenure: Tenure) {
        self.0.state.lock().expect("tenure").0 = tenure;
        self.0.changed.notify_waiters();
    }

    /// Whether `watch` watches this very tenure (not an earlier or a later one of its lock).
    pub(crate) fn tells(&self, watch: &TenureWatch) -> bool {
        Arc::ptr_eq(&self.0, &watch.0)
    }
}

impl Drop for TenureSender {
    fn drop(&mut self) {
        self.0.state.lock().expect("tenure").1 = true;
        self.0.changed.notify_waiters();
    }
}

impl TenureWatch {
    /// The tenure as last told, and whether its sender is gone.
    fn state(&self) -> (Tenure, bool) {
        *self.0.state.lock().expect("tenure")
    }

    /// Whether the tenure ended, as told or by its sender going away.
    pub(crate) fn ended(&self) -> bool {
        self.state() != (Tenure::Held, false)
    }
}

/// Resolves when `tenure` ends: `Some(reason)` for a loss, `None` for a release. A sender
/// dropped without a word (its actor gone) is a loss for `otherwise`.
pub(crate) fn when_ended(
    tenure: &TenureWatch,
    otherwise: LossReason,
) -> impl Future<Output = Option<LossReason>> + Send + 'static {
    let tenure = tenure.clone();
    async move {
        loop {
            // Registered before the state is read: a change in between still wakes it.
            let changed = tenure.0.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            match tenure.state() {
                (Tenure::Lost(reason), _) => return Some(reason),
                (Tenure::Released, _) => return None,
                (Tenure::Held, true) => return Some(otherwise),
                (Tenure::Held, false) => changed.await,
            }
        }
    }
}

/// The loss of `tenure`, once lost.
pub(crate) fn loss_of(tenure: &TenureWatch) -> Option<LossReason> {
    match tenure.state().0 {
        Tenure::Lost(reason) => Some(reason),
        Tenure::Held | Tenure::Released => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenure_ends_as_told_or_as_lost_when_its_sender_goes_without_a_word() {
        let (sender, watch) = tenure();
        let ended = when_ended(&watch, LossReason::Shutdown);
        assert!(!watch.ended() && loss_of(&watch).is_none());
        sender.send(Tenure::Lost(LossReason::TakenOver));
        drop(sender);
        assert_eq!(ended.await, Some(LossReason::TakenOver));
        assert_eq!(loss_of(&watch), Some(LossReason::TakenOver));

        let (sender, watch) = tenure();
        let ended = tokio::spawn(when_ended(&watch, LossReason::Shutdown));
        tokio::task::yield_now().await;
        sender.send(Tenure::Released);
        assert_eq!(ended.await.unwrap(), None);
        assert!(watch.ended() && loss_of(&watch).is_none());

        // Gone without a word: a loss for the reason given, though `loss` says nothing.
        let (sender, watch) = tenure();
        let ended = tokio::spawn(when_ended(&watch, LossReason::DeadlinePassed));
        tokio::task::yield_now().await;
        drop(sender);
        assert_eq!(ended.await.unwrap(), Some(LossReason::DeadlinePassed));
        assert!(watch.ended() && loss_of(&watch).is_none());
        assert!(
            std::mem::size_of::<TenureCell>() + 16 <= 64,
            "the point of it"
        );
    }
}
