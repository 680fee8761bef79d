//! The in-memory backend (feature `memory`), for unit tests of an application's own code:
//! [`MemoryBackend`] stands for the database, and each of its
//! [`coordinator`](MemoryBackend::coordinator)s for one process's runtime on it — a
//! [`Coordinator`], answering as one on PostgreSQL does.
//!
//! **It is no substitute for testing against PostgreSQL.** Nothing here can fail the way a
//! network, a server or a clock does; nothing expires (there are no heartbeats to miss); a
//! lease's `remaining` is always the full lease; the fencing guard checks the token but guards
//! no transaction. What a test needs to see its code handle, it forces:
//! [`MemoryBackend::force_loss`] (a lease taken over, as after an expiry) and
//! [`MemoryBackend::reconnect`] (the listener's `Disconnected` then `Reconnected`: resync).
//!
//! Rate limits too ([`Coordinator::rate_limiter`]: the backend's buckets, on its monotonic
//! clock), and semaphores, limited ones too. Schedules, elections, advisory locks and durable
//! mail need PostgreSQL ([`pgcoord::ErrorKind::Unsupported`] here): their guarantee is a row
//! written in the application's own transaction, or a server's session.
//!
//! Worker pools run on it as well: [`Coordinator::worker_pool`] (members are coordinators; a
//! tick every 100 ms), routed with [`WorkerPool::routed_by`](crate::WorkerPool::routed_by) and
//! reached by [`Coordinator::key_router`]; keys can come to life
//! (`activate_keys`, taken at the next tick).
//!
//! ```
//! use pgcoord_actors::backend::memory::MemoryBackend;
//! use pgcoord_actors::Acquire;
//!
//! # actix_rt::System::new().block_on(async {
//! let backend = MemoryBackend::new();
//! let (alice, bob) = (backend.coordinator("alice"), backend.coordinator("bob"));
//! let lease = alice.acquire(Acquire::new("job")).await?;
//! let refused = bob.acquire(Acquire::new("job").fail_if_locked()).await.unwrap_err();
//! assert_eq!(refused.holder().unwrap().owner, "alice");
//! assert!(backend.force_loss("job"));
//! assert_eq!(lease.lost().await, Some(pgcoord_actors::LossReason::TakenOver));
//! # Ok::<_, pgcoord::Error>(()) }).unwrap();
//! ```

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::ident::Ident;
use pgcoord::{LeaseInfo, Result};

use super::{BoxFuture, Door, Locking, Signalling, Topics};
use crate::Coordinator;
use crate::leases::{Acquire, AcquirePermit, Claim, Lease, SetLimit};
use crate::losses::LockLost;
use crate::signals::{Ask, ConnState, Publish, Serve, Signal};
use crate::topics::TopicConsumer;
use pgcoord::lease::LimitChange;

mod leases;
mod permits;
mod rates;
mod signals;
mod topics;
mod workers;

/// The in-memory "database" several [`coordinator`](Self::coordinator)s share, as processes
/// share one PostgreSQL. Cheap to clone; clones are the same backend. It is also what a test
/// passes where a database client is asked for: [`Lease::fence(&backend)`](crate::Lease::fence)
/// and [`Delivery::ack(&backend)`](crate::Delivery::ack) check the lease's token (there is no
/// transaction to guard); any statement run on it fails with [`pgcoord::ErrorKind::Other`].
#[derive(Clone)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

/// What a backend's coordinators share.
struct Shared {
    state: Mutex<State>,
    /// What `LeaseInfo::remaining` and a holder's `remaining` report.
    lease: Duration,
    /// Rung after every append: consumers waiting for events look again.
    appended: tokio::sync::Notify,
    /// Rung after every release, loss and change of a limit: permit waiters look again.
    released: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    leases: leases::LeaseState,
    permits: permits::PermitState,
    rates: rates::RateState,
    signals: signals::SignalState,
    topics: topics::TopicState,
    lock_lost: Vec<(u64, Recipient<LockLost>)>,
    next_coordinator: u64,
}

impl State {
    /// Takes `name` from its holder (see [`MemoryBackend::force_loss`]), telling its
    /// coordinator's [`LockLost`] subscribers. False when nobody held it.
    fn take_back(&mut self, name: &str) -> bool {
        let Some((holder, loss)) = self.leases.force_loss(name) else {
            return false;
        };
        self.lock_lost.retain(|(_, r)| r.connected());
        for (_, recipient) in self.lock_lost.iter().filter(|(c, _)| *c == holder) {
            recipient.do_send(loss.clone());
        }
        true
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// An empty backend: no leases, no subscriptions; tokens start at 1.
    pub fn new() -> MemoryBackend {
        MemoryBackend {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                lease: Duration::from_secs(20),
                appended: tokio::sync::Notify::new(),
                released: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The runtime of one process on this backend, whose leases are held as `owner`. Two
    /// coordinators contend for leases as two processes do; one coordinator's second acquire of
    /// a lease it holds is [`pgcoord::ErrorKind::AlreadyHeld`].
    ///
    /// Made inside an actix System, its streams ([`Coordinator::subscribe`],
    /// [`Coordinator::lock_losses`], …) run there; made outside one, they answer
    /// [`pgcoord::ErrorKind::Unsupported`].
    pub fn coordinator(&self, owner: impl Into<String>) -> Coordinator {
        let id = {
            let mut state = self.shared.lock();
            state.next_coordinator += 1;
            state.next_coordinator
        };
        let process = MemoryCoordinator {
            shared: self.shared.clone(),
            id,
            owner: owner.into(),
            arbiter: actix::System::try_current().map(|_| Arbiter::current()),
        };
        Coordinator {
            door: Door::Memory(process),
        }
    }

    /// Takes the lease `name` from whichever coordinator holds it, as a takeover after an
    /// expiry would: its handle's `lost()` resolves with
    /// [`LossReason::TakenOver`](crate::LossReason::TakenOver), that coordinator's
    /// [`LockLost`] subscribers are told once, and the next waiter gets the lease. False when
    /// nobody held it.
    pub fn force_loss(&self, name: &str) -> bool {
        let taken = self.shared.lock().take_back(name);
        self.shared.released.notify_waiters();
        taken
    }

    /// The stored cursor of the consumer `consumer` of `topic`: the last event it acked (what
    /// [`TopicTable::cursor`](pgcoord::topic::TopicTable::cursor) reads on PostgreSQL). `None`
    /// when that consumer never started.
    pub fn cursor(&self, topic: &str, consumer: &str) -> Option<pgcoord::topic::Cursor> {
        self.shared.lock().topics.cursor(topic, consumer)
    }

    /// What a listener reconnect looks like to `coordinator`'s [`ConnState`] subscribers:
    /// `Disconnected`, then `Reconnected` (notifications may have been missed: resync).
    /// Subscriptions stay, as they do across a real reconnect.
    /// [`pgcoord::ErrorKind::InvalidConfig`] for a coordinator of another backend.
    pub fn reconnect(&self, coordinator: &Coordinator) -> Result<()> {
        match &coordinator.door {
            Door::Memory(process) if Arc::ptr_eq(&process.shared, &self.shared) => {
                self.shared.lock().signals.reconnected(process.id);
                Ok(())
            }
            _ => Err(pgcoord::Error::new(
                pgcoord::ErrorKind::InvalidConfig,
                "reconnect: the coordinator is not one of this backend's",
            )),
        }
    }
}

/// One process's runtime on a [`MemoryBackend`], behind a [`Coordinator`]: the seams'
/// in-memory side. Cheap to clone; clones are the same process.
#[derive(Clone)]
pub(crate) struct MemoryCoordinator {
    shared: Arc<Shared>,
    id: u64,
    owner: String,
    /// The System it was made in, where its streams' forwarders run.
    arbiter: Option<ArbiterHandle>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("lease", &self.shared.lease)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for MemoryCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCoordinator")
            .field("owner", &self.owner)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl MemoryCoordinator {
    /// The owner identity its leases are held as.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// Where its streams' forwarders run.
    pub(crate) fn arbiter(&self) -> Result<ArbiterHandle> {
        self.arbiter.clone().ok_or_else(|| {
            pgcoord::Error::new(
                pgcoord::ErrorKind::Unsupported,
                "a stream of an in-memory coordinator made outside an actix System",
            )
        })
    }
}

impl Locking for MemoryCoordinator {
    fn acquire(&self, request: Acquire) -> BoxFuture<Result<Lease>> {
        let (shared, id, owner) = (self.shared.clone(), self.id, self.owner.clone());
        Box::pin(async move {
            let name = request.name.clone();
            let (token, data, tenure) = leases::acquire(shared.clone(), id, owner, request).await?;
            Ok(Lease {
                name: name.into(),
                token,
                data,
                holder: Arc::new(leases::MemoryHolder { shared }),
                tenure,
                released: false,
            })
        })
    }

    fn acquire_permit(&self, request: AcquirePermit) -> BoxFuture<Result<Lease>> {
        let (shared, id, owner) = (self.shared.clone(), self.id, self.owner.clone());
        Box::pin(async move {
            let (name, token, tenure) =
                permits::acquire(shared.clone(), id, owner, request).await?;
            Ok(Lease {
                name: name.into(),
                token,
                data: None,
                holder: Arc::new(leases::MemoryHolder { shared }),
                tenure,
                released: false,
            })
        })
    }

    fn set_limit(&self, request: SetLimit) -> BoxFuture<Result<LimitChange>> {
        Box::pin(std::future::ready(permits::set_limit(
            &self.shared,
            &request,
        )))
    }

    fn get(&self, name: &str) -> BoxFuture<Result<LeaseInfo>> {
        let info = self.shared.lock().leases.get(name, self.shared.lease);
        Box::pin(std::future::ready(info))
    }

    fn limit(&self, name: &str) -> BoxFuture<Result<Option<u32>>> {
        let limit = self.shared.lock().permits.limit(name);
        Box::pin(std::future::ready(Ok(limit)))
    }

    fn subscribe_lock_lost(&self, recipient: Recipient<LockLost>) -> BoxFuture<Result<()>> {
        let mut state = self.shared.lock();
        // Streams dropped since are forgotten here, as the lock manager forgets them.
        state.lock_lost.retain(|(_, r)| r.connected());
        state.lock_lost.push((self.id, recipient));
        drop(state);
        Box::pin(std::future::ready(Ok(())))
    }

    fn claim(&self, claim: Claim) -> BoxFuture<Result<Vec<Lease>>> {
        let coordinator = self.clone();
        Box::pin(async move {
            let mut leases = Vec::new();
            for name in claim.names {
                let request = Acquire::new(name).fail_if_locked();
                let request = if claim.keep_on_release {
                    request.keep_on_release()
                } else {
                    request
                };
                match coordinator.acquire(request).await {
                    Ok(lease) => leases.push(lease),
                    Err(e) if e.is_not_acquired() => {}
                    Err(e) if e.kind() == pgcoord::ErrorKind::AlreadyHeld => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(leases)
        })
    }

    fn list_prefix(&self, prefix: &str) -> BoxFuture<Result<Vec<LeaseInfo>>> {
        let state = self.shared.lock();
        let listed = state.leases.list_prefix(prefix, self.shared.lease);
        Box::pin(std::future::ready(Ok(listed)))
    }
}

impl Signalling for MemoryCoordinator {
    fn publish(&self, publish: Publish) -> BoxFuture<Result<()>> {
        let published = self.shared.lock().signals.publish(publish);
        Box::pin(std::future::ready(published))
    }

    fn subscribe(&self, channel: &str, recipient: Recipient<Signal>) -> BoxFuture<Result<()>> {
        let subscribed = Ident::channel(channel).map(|_| {
            let mut state = self.shared.lock();
            state.signals.subscribe(self.id, channel, recipient)
        });
        Box::pin(std::future::ready(subscribed))
    }

    fn unsubscribe(&self, channel: &str, recipient: Recipient<Signal>) {
        self.shared.lock().signals.unsubscribe(channel, &recipient);
    }

    fn serve(&self, serve: Serve) -> BoxFuture<Result<()>> {
        let served = Ident::channel(&serve.channel).map(|_| {
            let mut state = self.shared.lock();
            state.signals.serve(self.id, &serve.channel, serve.handler)
        });
        Box::pin(std::future::ready(served))
    }

    fn stop_serving(&self, channel: &str) -> BoxFuture<Result<()>> {
        self.shared.lock().signals.stop_serving(self.id, channel);
        Box::pin(std::future::ready(Ok(())))
    }

    fn ask(&self, ask: Ask) -> BoxFuture<Result<Vec<u8>>> {
        Box::pin(signals::ask(self.shared.clone(), ask))
    }

    fn subscribe_conn_state(&self, recipient: Recipient<ConnState>) -> BoxFuture<Result<()>> {
        let mut state = self.shared.lock();
        state.signals.subscribe_conn_state(self.id, recipient);
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Topics for MemoryCoordinator {
    fn append(&self, append: crate::topics::Append) -> BoxFuture<Result<pgcoord::topic::Cursor>> {
        let appended = self.shared.lock().topics.append(append);
        self.shared.appended.notify_waiters();
        Box::pin(std::future::ready(appended))
    }

    fn consume(&self, consume: crate::Consume) -> Result<TopicConsumer> {
        topics::consume(self, consume).map(|running| TopicConsumer::new(running))
    }
}

// The backend stands in for a database client where there is none (see its docs).
impl pgcoord::__private::Sealed for MemoryBackend {}

impl pgcoord::Statements for MemoryBackend {
    fn run<'a>(
        &'a self,
        sql: &'a str,
        _: &'a [pgcoord::__private::Param<'a>],
    ) -> pgcoord::BoxFuture<'a, Result<Vec<tokio_postgres::Row>>> {
        Box::pin(std::future::ready(Err(pgcoord::Error::new(
            pgcoord::ErrorKind::Other,
            format!("the in-memory backend has no database to run {sql:?} on"),
        ))))
    }
}
