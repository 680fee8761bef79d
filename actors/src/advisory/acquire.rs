//! Taking an advisory lock: the wait on the lock's own session, bounded, and cancelled on the
//! server when the caller gives up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use pgcoord::advisory;
use pgcoord::{Error, ErrorKind, Result};
use tracing::debug;

use super::{AdvisoryGuard, AdvisoryLock, AdvisoryLocks, Session};
use crate::reply::deadline_passes;
use crate::session::Pinned;

/// The reply to [`AdvisoryLock`]: waits on the lock's own session, cancelling the wait on the
/// server when the caller gives up.
pub struct AdvisoryResponse(Result<AdvisoryJob>);

/// What one advisory acquire needs, taken out of the manager.
pub struct AdvisoryJob {
    request: AdvisoryLock,
    config: pgcoord::Config,
    idle: Option<Pinned>,
}

impl Handler<AdvisoryLock> for AdvisoryLocks {
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

impl MessageResponse<AdvisoryLocks, AdvisoryLock> for AdvisoryResponse {
    fn handle(
        self,
        ctx: &mut Context<AdvisoryLocks>,
        reply: Option<OneshotSender<Result<AdvisoryGuard>>>,
    ) {
        let AdvisoryJob {
            request,
            config,
            idle,
        } = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        let AdvisoryLock { key, mode, timeout } = request;
        let deadline = timeout.map(|t| Instant::now() + t);
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
                        () = deadline_passes(deadline) => Err(Error::new(
                            ErrorKind::Unavailable,
                            "no session for the advisory lock within its timeout",
                        )),
                    };
                    match opened {
                        Ok(pinned) => pinned,
                        Err(e) => return (Err((e, None)), reply),
                    }
                }
            };
            // A try is bounded by the statement timeout; a wait by the caller's deadline, the
            // server's lock_timeout ending it a share earlier so that its answer (and the
            // session's reset) is back in time.
            let now = Instant::now();
            let (bound, wait) = match deadline {
                None => (now + config.statement_timeout(), None),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(now);
                    let answer = (left / 4).min(Duration::from_millis(250));
                    (deadline, Some(left - answer))
                }
            };
            let client = &pgcoord::__private::until(&pinned.client, bound);
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
                    // Dropping the wait does not stop it on the server: cancel it there (the
                    // cancel request opens a connection of its own, so it is bounded too), then
                    // close the session so nothing it might still get is kept.
                    let cancelled = cancel.cancel_query(config.session_tls().clone());
                    let _ = tokio::time::timeout(config.connect_timeout(), cancelled).await;
                    (Err(Error::new(ErrorKind::Timeout, "caller gave up")), false)
                }
            };
            let session = match result {
                Ok(()) => Ok(Session {
                    pinned: Arc::new(pinned),
                    mode,
                    pinging: false,
                    watch: None,
                    lost: tokio::sync::watch::channel(crate::losses::Tenure::Held).0,
                }),
                Err(e) => Err((e, clean.then_some(pinned))),
            };
            (session, reply)
        };
        let attempt = tracing::Instrument::instrument(
            attempt,
            tracing::info_span!("advisory_lock", advisory.key = key),
        );
        ctx.spawn(actix::fut::wrap_future::<_, AdvisoryLocks>(attempt).map(
            move |(session, reply), act, ctx| {
                act.pending_keys.remove(&key);
                match (session, reply) {
                    (Ok(session), Some(reply)) if !reply.is_closed() => {
                        let lost = act.hold(key, session, ctx);
                        let guard = AdvisoryGuard::new(key, ctx.address(), lost);
                        if let Err(Ok(guard)) = reply.send(Ok(guard)) {
                            // The caller left at this very moment: its guard's drop releases it.
                            drop(guard);
                        }
                    }
                    // Nobody to hand it to: dropping the session releases it.
                    (Ok(_), _) => {
                        debug!(
                            advisory.key = key,
                            "advisory lock granted after its caller left; released"
                        )
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
