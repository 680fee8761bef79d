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

/// Where the caller's answer goes; `None` when it sent without wanting one.
type Reply = Option<OneshotSender<Result<AdvisoryGuard>>>;

/// An attempt's end: the session holding the lock, or the error and the session when it holds
/// nothing and may be parked for reuse.
type Attempted = std::result::Result<Session, (Error, Option<Pinned>)>;

impl MessageResponse<AdvisoryLocks, AdvisoryLock> for AdvisoryResponse {
    fn handle(self, ctx: &mut Context<AdvisoryLocks>, reply: Reply) {
        let job = match self.0 {
            Ok(job) => job,
            Err(error) => return crate::reply::refuse(reply, error),
        };
        let key = job.request.key;
        let deadline = job.request.timeout.map(|t| Instant::now() + t);
        let attempt = tracing::Instrument::instrument(
            job.attempt(deadline, reply),
            tracing::info_span!("advisory_lock", advisory.key = key),
        );
        ctx.spawn(
            actix::fut::wrap_future::<_, AdvisoryLocks>(attempt)
                .map(move |(session, reply), act, ctx| act.attempted(key, session, reply, ctx)),
        );
    }
}

impl AdvisoryJob {
    /// Takes the lock on a session of its own, by `deadline` when there is one; hands the
    /// reply back for the manager to answer.
    async fn attempt(self, deadline: Option<Instant>, mut reply: Reply) -> (Attempted, Reply) {
        let AdvisoryJob {
            request,
            config,
            idle,
        } = self;
        let AdvisoryLock { key, mode, .. } = request;
        let pinned = match session(idle, &config, deadline, &mut reply).await {
            Ok(pinned) => pinned,
            Err(e) => return (Err((e, None)), reply),
        };
        let (bound, wait) = bounds(deadline, Instant::now(), config.statement_timeout());
        let (result, clean) = lock(&pinned, &config, key, mode, bound, wait, &mut reply).await;
        let session = match result {
            Ok(()) => Ok(Session {
                pinned: Arc::new(pinned),
                mode,
                pinging: false,
                watch: None,
                lost: crate::losses::tenure().0,
            }),
            Err(e) => Err((e, clean.then_some(pinned))),
        };
        (session, reply)
    }
}

/// A session for the lock: a parked one when its connection is still open, else a new one
/// opened within the deadline.
async fn session(
    idle: Option<Pinned>,
    config: &pgcoord::Config,
    deadline: Option<Instant>,
    reply: &mut Reply,
) -> Result<Pinned> {
    if let Some(pinned) = idle.filter(|p| !p.is_broken()) {
        return Ok(pinned);
    }
    // Connecting holds nothing yet: a caller that leaves meanwhile just stops it.
    tokio::select! {
        opened = Pinned::open(config, "advisory") => opened,
        _ = crate::reply::caller_gone(reply) => {
            Err(Error::new(ErrorKind::Timeout, "caller gave up"))
        }
        () = deadline_passes(deadline) => Err(Error::new(
            ErrorKind::Unavailable,
            "no session for the advisory lock within its timeout",
        )),
    }
}

/// When the statements on the session must be answered by, and how long the server may wait
/// for the lock (`None`: one try). A try is bounded by the statement timeout; a wait by the
/// caller's deadline, the server's lock_timeout ending it a share earlier so that its answer
/// (and the session's reset) is back in time.
fn bounds(
    deadline: Option<Instant>,
    now: Instant,
    statement_timeout: Duration,
) -> (Instant, Option<Duration>) {
    match deadline {
        None => (now + statement_timeout, None),
        Some(deadline) => {
            let left = deadline.saturating_duration_since(now);
            let answer = (left / 4).min(Duration::from_millis(250));
            (deadline, Some(left - answer))
        }
    }
}

/// Tries or waits for the lock on `pinned`, cancelling the wait on the server if the caller
/// leaves; also answers whether the session is left clean (holding nothing, still open).
async fn lock(
    pinned: &Pinned,
    config: &pgcoord::Config,
    key: i64,
    mode: advisory::Mode,
    bound: Instant,
    wait: Option<Duration>,
    reply: &mut Reply,
) -> (Result<()>, bool) {
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
    tokio::select! {
        // A refused try or an expired lock_timeout leaves the session holding nothing.
        result = locking => {
            let clean = matches!(&result, Err(e) if e.is_not_acquired()) && !pinned.is_broken();
            (result, clean)
        }
        _ = crate::reply::caller_gone(reply) => {
            // Dropping the wait does not stop it on the server: cancel it there (the cancel
            // request opens a connection of its own, so it is bounded too), then close the
            // session so nothing it might still get is kept.
            let cancelled = cancel.cancel_query(config.session_tls().clone());
            let _ = tokio::time::timeout(config.connect_timeout(), cancelled).await;
            (Err(Error::new(ErrorKind::Timeout, "caller gave up")), false)
        }
    }
}

impl AdvisoryLocks {
    /// Ends an attempt: holds the lock and hands the caller its guard, or parks a clean
    /// session and answers the error.
    fn attempted(&mut self, key: i64, session: Attempted, reply: Reply, ctx: &mut Context<Self>) {
        self.pending_keys.remove(&key);
        match (session, reply) {
            (Ok(session), Some(reply)) if !reply.is_closed() => {
                let lost = self.hold(key, session, ctx);
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
                    self.park(pinned);
                }
                if let Some(reply) = reply {
                    let _ = reply.send(Err(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_leaves_a_share_of_the_deadline_for_the_answer() {
        let now = Instant::now();
        let five = Duration::from_secs(5);
        // One try: bounded by the statement timeout.
        assert_eq!(bounds(None, now, five), (now + five, None));
        // A short wait leaves a quarter for the answer; a long one 250 ms.
        let ms = Duration::from_millis;
        assert_eq!(
            bounds(Some(now + ms(400)), now, five),
            (now + ms(400), Some(ms(300)))
        );
        assert_eq!(
            bounds(Some(now + ms(10_000)), now, five),
            (now + ms(10_000), Some(ms(9_750)))
        );
        // A deadline already passed: no wait at all, not a panic.
        let past = now.checked_sub(ms(1)).unwrap_or(now);
        assert_eq!(bounds(Some(past), now, five), (past, Some(Duration::ZERO)));
    }
}
