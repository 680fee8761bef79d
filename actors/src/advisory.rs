//! Advisory locks in `LockManager`: one dedicated session per held key, pinged on a timer.
//!
//! Each lock gets its own connection, so a failing session loses exactly one lock and a blocked
//! wait never delays another lock's pings. The cost is one server connection per held key (see
//! docs/BENCHMARKS.md). A session whose connection ends is reported lost at once; one that
//! stays open but fails a ping, or leaves it unanswered for `ping_timeout`, is closed and
//! reported lost at the next `ping_interval`.

use std::sync::Arc;

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::advisory::{self, Mode};
use pgcoord::{Error, ErrorKind, Result};
use tokio_postgres::NoTls;
use tracing::{debug, warn};

use crate::manager::LockManager;
use crate::messages::{AdvisoryLock, AdvisoryUnlock, LockKey, LockLost, LossReason};
use crate::session::Pinned;

/// The session holding one advisory lock.
pub(crate) struct Session {
    pinned: Arc<Pinned>,
    mode: Mode,
    pinging: bool,
    /// The future reporting the loss the moment the connection ends; cancelled with the session.
    watch: Option<SpawnHandle>,
}

/// How many lock-free sessions a manager keeps open for reuse.
const IDLE_SESSIONS: usize = 8;

impl LockManager {
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
            let ping = async move { advisory::ping(&client.client, timeout).await };
            ctx.spawn(
                ping.into_actor(self)
                    .map(move |result, act: &mut LockManager, ctx| {
                        if let Some(session) = act.sessions.get_mut(&key) {
                            session.pinging = false;
                        }
                        if let Err(e) = result {
                            let reason = if e.is_timeout() {
                                LossReason::Stalled
                            } else {
                                LossReason::ConnectionLost
                            };
                            act.lose_advisory(key, reason, &e, ctx);
                        }
                    }),
            );
        }
    }

    /// Holds `session` for `key`, watching its connection so that its end is reported at once.
    fn hold(&mut self, key: i64, mut session: Session, ctx: &mut Context<Self>) {
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
                    act.lose_advisory(
                        key,
                        LossReason::ConnectionLost,
                        &"the connection ended",
                        ctx,
                    );
                }
            })),
        );
        self.sessions.insert(key, session);
    }

    /// Keeps a session that holds no lock for the next acquire, up to [`IDLE_SESSIONS`].
    fn park(&mut self, pinned: Pinned) {
        if self.idle_sessions.len() < IDLE_SESSIONS && !pinned.is_broken() {
            self.idle_sessions.push(pinned);
        }
    }

    fn lose_advisory(
        &mut self,
        key: i64,
        reason: LossReason,
        error: &dyn std::fmt::Display,
        ctx: &mut Context<Self>,
    ) {
        let Some(session) = self.sessions.remove(&key) else {
            return;
        };
        if let Some(watch) = session.watch {
            ctx.cancel_future(watch);
        }
        warn!(key, ?reason, error = %error, "advisory lock lost; its session is closed");
        self.broadcast(LockLost {
            key: LockKey::Advisory(key),
            token: None,
            reason,
        });
    }
}

/// The reply to [`AdvisoryLock`]: waits on the lock's own session, cancelling the wait on the
/// server when the caller gives up.
pub struct AdvisoryResponse(Result<AdvisoryJob>);

/// What one advisory acquire needs, taken out of the manager.
pub struct AdvisoryJob {
    request: AdvisoryLock,
    config: pgcoord::Config,
    idle: Option<Pinned>,
}

impl Handler<AdvisoryLock> for LockManager {
    type Result = AdvisoryResponse;

    fn handle(&mut self, request: AdvisoryLock, _: &mut Context<Self>) -> AdvisoryResponse {
        if self.sessions.contains_key(&request.key) || !self.pending_keys.insert(request.key) {
            let error = Error::new(
                ErrorKind::AlreadyHeld,
                format!(
                    "advisory lock {} is already held, or being acquired, by this manager",
                    request.key
                ),
            );
            return AdvisoryResponse(Err(error));
        }
        let idle = self.idle_sessions.pop();
        AdvisoryResponse(Ok(AdvisoryJob {
            request,
            config: self.config.clone(),
            idle,
        }))
    }
}

impl MessageResponse<LockManager, AdvisoryLock> for AdvisoryResponse {
    fn handle(self, ctx: &mut Context<LockManager>, reply: Option<OneshotSender<Result<()>>>) {
        let AdvisoryJob {
            request,
            config,
            idle,
        } = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        let AdvisoryLock { key, mode, wait } = request;
        let attempt = async move {
            let mut reply = reply;
            // A parked session is reused when its connection is still open.
            let pinned = match idle.filter(|p| !p.is_broken()) {
                Some(pinned) => pinned,
                // Connecting holds nothing yet: a caller that leaves meanwhile just stops it.
                None => {
                    let opened = tokio::select! {
                        opened = Pinned::open(&config, "advisory") => opened,
                        _ = crate::reply::caller_gone(&mut reply) => {
                            Err(Error::new(ErrorKind::Timeout, "caller gave up"))
                        }
                    };
                    match opened {
                        Ok(pinned) => pinned,
                        Err(e) => return (Err((e, None)), reply),
                    }
                }
            };
            // Bounded like every statement: a wait by its own timeout plus the statement
            // timeout, a try by the statement timeout.
            let bound =
                std::time::Instant::now() + wait.unwrap_or_default() + config.statement_timeout();
            let client = &pgcoord::db::until(&pinned.client, bound);
            let cancel = pinned.client.cancel_token();
            let locking = async {
                match wait {
                    None if advisory::try_lock(client, key, mode).await? => Ok(()),
                    None => Err(Error::new(
                        ErrorKind::NotAcquired,
                        format!("advisory lock {key} is held elsewhere"),
                    )),
                    Some(timeout) => advisory::lock(client, key, mode, timeout).await,
                }
            };
            let gone = crate::reply::caller_gone(&mut reply);
            let (result, clean) = tokio::select! {
                // A refused try or an expired lock_timeout leaves the session holding nothing.
                result = locking => {
                    let clean = matches!(&result, Err(e) if e.is_not_acquired())
                && !pinned.is_broken();
                    (result, clean)
                }
                _ = gone => {
                    // Dropping the wait does not stop it on the server: cancel it there, then
                    // close the session so nothing it might still get is kept.
                    let _ = cancel.cancel_query(NoTls).await;
                    (Err(Error::new(ErrorKind::Timeout, "caller gave up")), false)
                }
            };
            let session = match result {
                Ok(()) => Ok(Session {
                    pinned: Arc::new(pinned),
                    mode,
                    pinging: false,
                    watch: None,
                }),
                Err(e) => Err((e, clean.then_some(pinned))),
            };
            (session, reply)
        };
        let attempt =
            tracing::Instrument::instrument(attempt, tracing::info_span!("advisory_lock", key));
        ctx.spawn(actix::fut::wrap_future::<_, LockManager>(attempt).map(
            move |(session, reply), act, ctx| {
                act.pending_keys.remove(&key);
                match (session, reply) {
                    (Ok(session), Some(reply)) if !reply.is_closed() => {
                        act.hold(key, session, ctx);
                        let _ = reply.send(Ok(()));
                    }
                    // Nobody to hand it to: dropping the session releases it.
                    (Ok(_), _) => {
                        debug!(key, "advisory lock granted after its caller left; released")
                    }
                    (Err((e, clean)), reply) => {
                        if let Some(pinned) = clean {
                            act.park(pinned);
                        }
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            },
        ));
    }
}

impl Handler<AdvisoryUnlock> for LockManager {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(
        &mut self,
        AdvisoryUnlock(key): AdvisoryUnlock,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        let Some(mut session) = self.sessions.remove(&key) else {
            let error = Error::new(
                ErrorKind::LockLost,
                format!("advisory lock {key} is not held (lost or released)"),
            );
            return Box::pin(actix::fut::ready(Err(error)));
        };
        if let Some(watch) = session.watch.take() {
            ctx.cancel_future(watch);
        }
        let bound = std::time::Instant::now() + self.config.statement_timeout();
        let unlock = async move {
            let client = pgcoord::db::until(&session.pinned.client, bound);
            let result = advisory::unlock(&client, key, session.mode).await;
            // Unlocked, the session holds nothing and can serve the next lock.
            let reusable = result
                .is_ok()
                .then(|| Arc::try_unwrap(session.pinned).ok())
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
                    if let Err(e) = &result
                        && e.is_lock_lost()
                    {
                        // The session no longer held it: that is a loss nobody was told about.
                        act.broadcast(LockLost {
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
