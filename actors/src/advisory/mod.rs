//! [`AdvisoryLocks`]: PostgreSQL advisory locks, each on a dedicated session of its own, pinged
//! on a timer, and handed to callers as [`AdvisoryGuard`]s.
//!
//! Each lock gets its own connection, so a failing session loses exactly one lock and a blocked
//! wait never delays another lock's pings. The cost is one server connection per held key (see
//! docs/BENCHMARKS.md). A session whose connection ends is reported lost at once; one that
//! stays open but fails a ping, or leaves it unanswered for `ping_timeout`, is closed and
//! reported lost at the next `ping_interval`. Losses go to the lock's guard and to every
//! [`SubscribeLockLost`] subscriber.
//!
//! - `acquire` — taking a lock: the wait on its session, cancelled on the server when the
//!   caller gives up.
//! - `guard` — [`AdvisoryGuard`], released when dropped.
//! - `messages` — [`AdvisoryLock`]; `AdvisoryUnlock`, which only a guard sends.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::advisory::{self, Mode};
use pgcoord::{Error, ErrorKind, Result};
use tracing::warn;

use crate::losses::{
    LockKey, LockLost, LossReason, LossSubscribers, Shutdown, SubscribeLockLost, Tenure,
};
use crate::session::Pinned;
use crate::stats::GetStats;

mod acquire;
mod guard;
mod messages;

pub use guard::AdvisoryGuard;
use messages::AdvisoryUnlock;
pub use messages::{AdvisoryLock, AdvisoryStats};

/// The actor holding this process's advisory locks. Start it with [`AdvisoryLocks::connect`],
/// which checks the server first (a `Coordinator` starts one).
pub struct AdvisoryLocks {
    config: pgcoord::Config,
    sessions: std::collections::HashMap<i64, Session>,
    /// Keys whose acquire is under way, so a concurrent second acquire is refused.
    pending_keys: std::collections::HashSet<i64>,
    /// Open sessions that hold no lock, kept for reuse.
    idle_sessions: Vec<Pinned>,
    subscribers: LossSubscribers,
    stats: AdvisoryStats,
    /// Locks held, for the metrics recorder (set when the actor starts).
    held_gauge: Option<crate::metrics::Share>,
}

impl AdvisoryLocks {
    /// Advisory locks on sessions opened with `config` (its ping interval and timeout apply).
    pub fn new(config: pgcoord::Config) -> AdvisoryLocks {
        AdvisoryLocks {
            subscribers: LossSubscribers::new(),
            config,
            sessions: Default::default(),
            pending_keys: Default::default(),
            idle_sessions: Vec::new(),
            stats: AdvisoryStats::default(),
            held_gauge: None,
        }
    }

    /// Checks that the server can be reached (`pgcoord::__private::check_reachable`: advisory locks
    /// need no table), then starts the actor in the current actix System: the start that can
    /// fail, with [`pgcoord::ErrorKind::Unavailable`] or [`pgcoord::ErrorKind::Tls`] at once
    /// instead of at the first lock.
    pub async fn connect(config: pgcoord::Config) -> Result<Addr<AdvisoryLocks>> {
        pgcoord::__private::check_reachable(&config).await?;
        Ok(AdvisoryLocks::new(config).start())
    }

    /// Sets the held-locks gauge after `sessions` changed.
    fn count_held(&self) {
        if let Some(gauge) = &self.held_gauge {
            gauge.set(self.sessions.len() as f64);
        }
    }
}

impl Actor for AdvisoryLocks {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        self.held_gauge = Some(crate::metrics::advisory_held());
        ctx.run_interval(self.config.ping_interval(), |act, ctx| {
            act.ping_sessions(ctx)
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Closing a session releases its locks on the server.
        self.idle_sessions.clear();
        let keys: Vec<i64> = self.sessions.keys().copied().collect();
        for key in keys {
            if let Some(session) = self.sessions.remove(&key) {
                session.lost.send(Tenure::Lost(LossReason::Shutdown));
                self.stats.lost += 1;
            }
            self.subscribers.broadcast(LockLost {
                key: LockKey::Advisory(key),
                token: None,
                reason: LossReason::Shutdown,
            });
        }
        self.count_held();
    }
}

/// The session holding one advisory lock.
struct Session {
    pinned: Arc<Pinned>,
    mode: Mode,
    pinging: bool,
    /// The future reporting the loss the moment the connection ends; cancelled with the session.
    watch: Option<SpawnHandle>,
    /// Tells the lock's guard how its tenure ended.
    lost: crate::losses::TenureSender,
}

/// How many lock-free sessions are kept open for reuse.
const IDLE_SESSIONS: usize = 8;

impl AdvisoryLocks {
    /// Pings every session not already being pinged.
    pub(crate) fn ping_sessions(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.config.ping_timeout();
        let due: Vec<(i64, Arc<Pinned>)> = self
            .sessions
            .iter_mut()
            .filter(|(_, s)| !s.pinging)
            .map(|(&key, session)| {
                session.pinging = true;
                (key, session.pinned.clone())
            })
            .collect();
        for (key, client) in due {
            let ping = async move { pgcoord::__private::ping(&client.client, timeout).await };
            ctx.spawn(
                ping.into_actor(self)
                    .map(move |result, act: &mut AdvisoryLocks, ctx| {
                        if let Some(session) = act.sessions.get_mut(&key) {
                            session.pinging = false;
                        }
                        if let Err(e) = result {
                            let reason = if e.is_timeout() {
                                LossReason::Stalled
                            } else {
                                LossReason::ConnectionLost
                            };
                            act.lose(key, reason, &e, ctx);
                        }
                    }),
            );
        }
    }

    /// Holds `session` for `key`, watching its connection so that its end is reported at once;
    /// returns what tells the lock's guard of a loss.
    fn hold(
        &mut self,
        key: i64,
        mut session: Session,
        ctx: &mut Context<Self>,
    ) -> crate::losses::TenureWatch {
        let (lost_tx, lost_rx) = crate::losses::tenure();
        session.lost = lost_tx;
        let mut ended = session.pinned.ended.clone();
        let watched = Arc::downgrade(&session.pinned);
        let watch = async move {
            // Ok: the connection ended; Err: the driver was aborted (the session was dropped).
            ended.wait_for(|ended| *ended).await.is_ok()
        };
        session.watch = Some(
            ctx.spawn(watch.into_actor(self).map(move |ended, act, ctx| {
                let same = act
                    .sessions
                    .get(&key)
                    .is_some_and(|s| std::ptr::eq(Arc::as_ptr(&s.pinned), watched.as_ptr()));
                if ended && same {
                    act.lose(
                        key,
                        LossReason::ConnectionLost,
                        &"the connection ended",
                        ctx,
                    );
                }
            })),
        );
        self.sessions.insert(key, session);
        self.count_held();
        self.stats.granted += 1;
        lost_rx
    }

    /// Keeps a session that holds no lock for the next acquire, up to [`IDLE_SESSIONS`].
    fn park(&mut self, pinned: Pinned) {
        if self.idle_sessions.len() < IDLE_SESSIONS && !pinned.is_broken() {
            self.idle_sessions.push(pinned);
        }
    }

    fn lose(
        &mut self,
        key: i64,
        reason: LossReason,
        error: &dyn std::fmt::Display,
        ctx: &mut Context<Self>,
    ) {
        let Some(session) = self.sessions.remove(&key) else {
            return;
        };
        self.count_held();
        if let Some(watch) = session.watch {
            ctx.cancel_future(watch);
        }
        self.stats.lost += 1;
        warn!(advisory.key = key, ?reason, error = %error, "advisory lock lost; its session is closed");
        session.lost.send(Tenure::Lost(reason));
        self.subscribers.broadcast(LockLost {
            key: LockKey::Advisory(key),
            token: None,
            reason,
        });
    }
}

impl Handler<AdvisoryUnlock> for AdvisoryLocks {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(
        &mut self,
        AdvisoryUnlock { key, tenure }: AdvisoryUnlock,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        // Only the tenure the guard watched: a later one of the key is someone else's.
        let ours = (self.sessions.get(&key)).is_some_and(|session| session.lost.tells(&tenure));
        let session = if ours {
            self.sessions.remove(&key)
        } else {
            None
        };
        let Some(session) = session else {
            let error = Error::new(
                ErrorKind::LockLost,
                format!("advisory lock {key} is not held (lost or released)"),
            );
            return Box::pin(actix::fut::ready(Err(error)));
        };
        self.count_held();
        let Session {
            pinned,
            mode,
            watch,
            lost: tenure,
            ..
        } = session;
        if let Some(watch) = watch {
            ctx.cancel_future(watch);
        }
        let bound = std::time::Instant::now() + self.config.statement_timeout();
        let unlock = async move {
            let client = pgcoord::__private::until(&pinned.client, bound);
            let result = advisory::unlock(&client, key, mode).await;
            // Unlocked, the session holds nothing and can serve the next lock.
            let reusable = result
                .is_ok()
                .then(|| Arc::try_unwrap(pinned).ok())
                .flatten();
            (result, reusable)
        };
        Box::pin(
            unlock
                .into_actor(self)
                .map(move |(result, reusable), act, _| {
                    if let Some(pinned) = reusable {
                        act.park(pinned);
                    }
                    if result.is_ok() {
                        act.stats.released += 1;
                    }
                    // Released, or its session failed (which released it on the server): the
                    // holder asked for it either way. Lost only when it was not held.
                    if !result.as_ref().is_err_and(|e| e.is_lock_lost()) {
                        tenure.send(Tenure::Released);
                    }
                    if let Err(e) = &result
                        && e.is_lock_lost()
                    {
                        act.stats.lost += 1;
                        tenure.send(Tenure::Lost(LossReason::ConnectionLost));
                        // The session no longer held it: that is a loss nobody was told about.
                        act.subscribers.broadcast(LockLost {
                            key: LockKey::Advisory(key),
                            token: None,
                            reason: LossReason::ConnectionLost,
                        });
                    }
                    result
                }),
        )
    }
}

impl Handler<SubscribeLockLost> for AdvisoryLocks {
    type Result = ();

    fn handle(&mut self, SubscribeLockLost(recipient): SubscribeLockLost, _: &mut Context<Self>) {
        self.subscribers.add(recipient);
    }
}

impl Handler<GetStats<AdvisoryStats>> for AdvisoryLocks {
    type Result = AdvisoryStats;

    fn handle(&mut self, _: GetStats<AdvisoryStats>, _: &mut Context<Self>) -> AdvisoryStats {
        AdvisoryStats {
            held: self.sessions.len(),
            idle_sessions: self.idle_sessions.len(),
            ..self.stats.clone()
        }
    }
}

impl Handler<Shutdown> for AdvisoryLocks {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
