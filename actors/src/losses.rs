//! What every lock-holding actor broadcasts when a lock is lost, and the subscriber list that
//! delivers it: [`LockLost`], [`LockKey`], [`LossReason`], [`SubscribeLockLost`], and the
//! [`Shutdown`] both lock actors answer.

use actix::prelude::*;

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

/// Resolves when `tenure` ends: `Some(reason)` for a loss, `None` for a release. A sender
/// dropped without a word (its actor gone) is a loss for `otherwise`.
pub(crate) fn when_ended(
    tenure: &tokio::sync::watch::Receiver<Tenure>,
    otherwise: LossReason,
) -> impl Future<Output = Option<LossReason>> + Send + 'static {
    let mut tenure = tenure.clone();
    async move {
        match tenure.wait_for(|t| *t != Tenure::Held).await {
            Ok(ended) => match *ended {
                Tenure::Lost(reason) => Some(reason),
                Tenure::Held | Tenure::Released => None,
            },
            Err(_) => Some(otherwise),
        }
    }
}

/// The loss of `tenure`, once lost.
pub(crate) fn loss_of(tenure: &tokio::sync::watch::Receiver<Tenure>) -> Option<LossReason> {
    match *tenure.borrow() {
        Tenure::Lost(reason) => Some(reason),
        Tenure::Held | Tenure::Released => None,
    }
}
