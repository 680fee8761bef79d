//! [`Pool`]: pooled connections that are checked before use, replaced promptly after an outage,
//! and never handed out dead.
//!
//! bb8 keeps the connections. What it does not do is what a coordination library needs when the
//! database fails: it hands out connections that died while idle, retries a failed connect in the
//! background with a backoff that grows to half its timeout, and reports a timeout without the
//! cause. So pgcoord turns bb8's own retries off (`retry_connection(false)`: one connect attempt per
//! request for a connection) and asks again in short slices until the caller's deadline: the first
//! request after the server is back gets a connection within one slice plus one connect, even
//! while connects started during a partition still hang. Every failed connect is kept (bb8's
//! error sink) and becomes the cause of an `Unavailable` error. A connection left idle for over
//! a second answers a check before it is trusted (`db::fresh`): one that died unseen across a
//! partition costs a share of the caller's time, not all of it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::debug;

use super::borrowed::{Borrowed, Loan};
use super::checkouts::Checkouts;
pub use super::manager::Manager;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::statement::BoxFuture;
use crate::statement::{CachingClient, Session};
use crate::tls::Tls;
use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

/// How long one request for a pooled connection waits before it asks again. Each request makes
/// at most one connect attempt, so this is also the pace of reconnect attempts during an outage.
const CHECKOUT_SLICE: Duration = Duration::from_millis(50);

/// What one request for a pooled connection came to.
// Moved once per checkout, as `Pooled` itself is.
#[allow(clippy::large_enum_variant)]
enum Got<'a> {
    Conn(Pooled<'a>),
    /// A connect failed for a reason connecting again will not change.
    Failed(Error),
    /// Nothing yet: ask again.
    Again,
}

/// The first of `requests` to finish, removed from them.
async fn first<'a>(requests: &mut VecDeque<BoxFuture<'a, Got<'a>>>) -> Got<'a> {
    std::future::poll_fn(|cx| {
        for (i, request) in requests.iter_mut().enumerate() {
            if let Poll::Ready(got) = request.as_mut().poll(cx) {
                requests.remove(i);
                return Poll::Ready(got);
            }
        }
        Poll::Pending
    })
    .await
}

/// The connection pool pgcoord's statements run on. Cheap to clone; clones share connections.
///
/// Either pgcoord's own ([`Pool::new`]: statements stay prepared on each connection) or the
/// application's bb8-postgres pool ([`Pool::from_bb8`]: one pool for the whole process).
#[derive(Clone)]
pub struct Pool {
    source: Source,
    last_failure: LastFailure,
    /// When an idle connection last failed its check: every connection the server has not
    /// answered on since then is likely as dead (a partition takes them all), and is discarded
    /// unchecked, so a pool of dead connections costs one check, not one each.
    check_failed: Arc<Mutex<Option<Instant>>>,
    pub(crate) statement_timeout: Duration,
    /// The longest one wait for a connection lasts.
    pool_timeout: Duration,
    /// For cancel requests on the pool's connections.
    tls: Tls,
    /// How many requests for a connection one checkout keeps under way at most: one more than
    /// the pool has connections, so connects hung since a partition cannot hold them all.
    requests_kept: usize,
    /// Checkouts under way, and who is told how long each took (see [`Pool::waiting`]).
    checkouts: Arc<Checkouts>,
}

#[derive(Clone)]
enum Source {
    Own(bb8::Pool<Manager>),
    Application(Arc<dyn ApplicationPool>),
}

/// The application's bb8-postgres pool, whatever its TLS connector.
trait ApplicationPool: Send + Sync {
    fn get(&self)
    -> BoxFuture<'_, std::result::Result<Loan, bb8::RunError<tokio_postgres::Error>>>;
    fn state(&self) -> bb8::State;
    fn max_size(&self) -> u32;
}

impl<T> ApplicationPool for bb8::Pool<PostgresConnectionManager<T>>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn get(
        &self,
    ) -> BoxFuture<'_, std::result::Result<Loan, bb8::RunError<tokio_postgres::Error>>> {
        Box::pin(async move { Ok(Box::new(self.get_owned().await?) as Loan) })
    }

    fn state(&self) -> bb8::State {
        bb8::Pool::state(self)
    }

    fn max_size(&self) -> u32 {
        bb8::Pool::config(self).max_size
    }
}

/// A connection from a [`Pool`], returned to it when dropped unless it was discarded.
// Lives on the stack for one statement; boxing the common variant would allocate per checkout.
#[allow(clippy::large_enum_variant)]
pub enum Pooled<'a> {
    /// From pgcoord's own pool.
    Own(bb8::PooledConnection<'a, Manager>),
    /// From the application's pool.
    Application(Borrowed),
}

impl std::ops::Deref for Pooled<'_> {
    type Target = dyn Session;
    fn deref(&self) -> &(dyn Session + 'static) {
        match self {
            Pooled::Own(conn) => &**conn,
            Pooled::Application(conn) => conn,
        }
    }
}

/// The most recent failed connect, for the error of whoever waited for a connection.
#[derive(Clone, Default, Debug)]
struct LastFailure(Arc<Mutex<Option<Failure>>>);

/// When a connect failed, and why.
type Failure = (Instant, Arc<Error>);

impl bb8::ErrorSink<Error> for LastFailure {
    fn sink(&self, error: Error) {
        self.record(error);
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<Error>> {
        Box::new(self.clone())
    }
}

impl LastFailure {
    fn record(&self, error: Error) {
        debug!(error = %error, "pooled connect failed");
        *self.0.lock().expect("last failure") = Some((Instant::now(), Arc::new(error)));
    }

    fn since(&self, start: Instant) -> Option<Arc<Error>> {
        let last = self.0.lock().expect("last failure");
        last.as_ref()
            .filter(|(at, _)| *at >= start)
            .map(|(_, e)| e.clone())
    }
}

impl Pool {
    /// A pool for `config`. Connections are opened on first use, each within the configured
    /// connect timeout.
    pub fn new(config: &Config) -> Pool {
        let last_failure = LastFailure::default();
        let mut manager = Manager::new(
            config.pg.clone(),
            config.tls.clone(),
            config.connect_timeout,
        )
        .ignored_passfile(config.ignored_passfile.clone());
        if !config.prepared_statements {
            manager = manager.unprepared();
        }
        let inner = bb8::Pool::builder()
            .max_size(config.pool_size)
            // None kept open at rest: one kept idle for long is the likeliest to have died
            // unseen (connections are not tested on checkout), and the listener and the
            // heartbeat have their own.
            .idle_timeout(Some(config.pool_idle_timeout))
            // The connection used last is lent first: it answered moments ago, so it is lent
            // without the idle check's round trip (see `fresh`), and the others go idle and
            // are closed. Lent in turn, every connection would be idle for a second under a
            // steady load of a statement a second, and each checkout would pay the check.
            .queue_strategy(bb8::QueueStrategy::Lifo)
            .reaper_rate(config.pool_idle_timeout.min(Duration::from_secs(30)))
            // Bounded by the caller's deadline and the pool timeout instead (see `checkout`).
            .connection_timeout(config.pool_timeout)
            .test_on_check_out(false)
            .retry_connection(false)
            .error_sink(Box::new(last_failure.clone()))
            .build_unchecked(manager);
        Pool {
            source: Source::Own(inner),
            last_failure,
            check_failed: Arc::default(),
            statement_timeout: config.statement_timeout,
            pool_timeout: config.pool_timeout,
            tls: config.tls.clone(),
            requests_kept: config.pool_size as usize + 1,
            checkouts: Arc::default(),
        }
    }

    /// pgcoord's statements on the application's own bb8-postgres pool, so that one process
    /// has one pool. `config` gives the statement timeout and deadlines; the pool's own
    /// settings (size, timeouts, DSN) stay the application's. The differences from
    /// [`Pool::new`]: statements are not kept prepared (each is sent with its types in one round
    /// trip, so the server parses it each time), and a connection on which a statement passed
    /// its deadline is not closed (bb8 offers no way to) but kept out of the pool until it
    /// answers again within the statement timeout (or closes), so no borrower inherits a
    /// backend that hung. Advisory locks, LISTEN and the heartbeat never use the pool.
    ///
    /// The pool may have any TLS connector (`NoTls`, [`Config::tls`], one of the application's);
    /// cancel requests for its connections use `config`'s TLS settings.
    pub fn from_bb8<T>(config: &Config, pool: bb8::Pool<PostgresConnectionManager<T>>) -> Pool
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Pool {
            source: Source::Application(Arc::new(pool)),
            last_failure: LastFailure::default(),
            check_failed: Arc::default(),
            statement_timeout: config.statement_timeout,
            pool_timeout: config.pool_timeout,
            tls: config.tls.clone(),
            // bb8 does not tell its size: the configured one stands in.
            requests_kept: config.pool_size as usize + 1,
            checkouts: Arc::default(),
        }
    }

    /// The bound of statements that have no caller's deadline (renewals, releases, publishes).
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    /// A live connection from the pool, waiting at most until `deadline` and at most the pool
    /// timeout. Connections found closed (the server restarted, the backend was terminated) are
    /// discarded and replaced without the caller seeing them. [`ErrorKind::Unavailable`] at the
    /// deadline, with the last connect error as its source when a connect failed meanwhile; a
    /// connect that failed for good (TLS, authentication) at once, with its own kind.
    #[doc(hidden)]
    pub async fn checkout(&self, deadline: Instant) -> Result<Pooled<'_>> {
        let waiting = self.checkouts.enter();
        let start = waiting.start();
        let deadline = deadline.min(start + self.pool_timeout);
        let mut discarded = 0u32;
        let mut requests = VecDeque::new();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(self.unavailable(start, discarded));
            }
            // A connect refused for a reason connecting again will not change (a certificate
            // it cannot trust, a wrong password): said at once, with its own kind.
            if let Some(cause) = (self.last_failure.since(start))
                .filter(|cause| cause.kind() != ErrorKind::Unavailable)
            {
                return Err(Error::new(cause.kind(), cause.to_string()).with_source(cause));
            }
            let slice = deadline.min(now + CHECKOUT_SLICE);
            // bb8 starts a connect only for a request that has none under way, so one connect
            // hung since a partition would hold every later request until its connect timeout.
            // Each slice adds a request (each makes at most one connect) and keeps those of the
            // last slices, so the one that connects first serves.
            requests.push_back(self.request());
            if requests.len() > self.requests_kept {
                requests.pop_front();
            }
            let conn = match tokio::time::timeout_at(slice.into(), first(&mut requests)).await {
                Ok(Got::Conn(conn)) => conn,
                Ok(Got::Failed(e)) => return Err(e),
                Ok(Got::Again) | Err(_) => continue,
            };
            if conn.client().is_closed() {
                // Died while idle: nothing was sent on it, so asking again is always safe.
                conn.discard();
                discarded += 1;
                continue;
            }
            // Nothing but the check was sent on it: asking again is always safe.
            if let Pooled::Own(own) = &conn
                && !self.answers(own, deadline).await
            {
                discarded += 1;
                continue;
            }
            return Ok(conn);
        }
    }

    /// Whether one of pgcoord's own connections can be trusted with a statement due by
    /// `deadline` (see `db::fresh`). The application's pool checks its connections as its own
    /// `test_on_check_out` says.
    async fn answers(&self, conn: &CachingClient, deadline: Instant) -> bool {
        let failed = *self.check_failed.lock().expect("check failed");
        if failed.is_some_and(|failed| conn.answered_at() < failed) {
            conn.discard();
            return false;
        }
        let checked = Instant::now();
        if super::fresh::answers(conn, deadline).await {
            return true;
        }
        let mut failed = self.check_failed.lock().expect("check failed");
        *failed = (*failed).max(Some(checked));
        false
    }

    /// One request for a connection from the pool.
    fn request(&self) -> BoxFuture<'_, Got<'_>> {
        match &self.source {
            Source::Own(pool) => Box::pin(async move {
                match pool.get().await {
                    Ok(conn) => Got::Conn(Pooled::Own(conn)),
                    Err(bb8::RunError::User(e)) => Got::Failed(e),
                    Err(bb8::RunError::TimedOut) => Got::Again,
                }
            }),
            Source::Application(pool) => Box::pin(async move {
                match pool.get().await {
                    Ok(conn) => Got::Conn(Pooled::Application(Borrowed::new(
                        conn,
                        self.statement_timeout,
                        self.tls.clone(),
                    ))),
                    Err(bb8::RunError::User(e)) => {
                        self.last_failure.record(Error::from(e));
                        Got::Again
                    }
                    Err(bb8::RunError::TimedOut) => Got::Again,
                }
            }),
        }
    }

    fn unavailable(&self, start: Instant, discarded: u32) -> Error {
        let waited = start.elapsed();
        match self.last_failure.since(start) {
            Some(cause) => Error::new(
                ErrorKind::Unavailable,
                format!("no database connection within {waited:?}: {cause}"),
            )
            .with_source(cause),
            None if discarded > 0 => Error::new(
                ErrorKind::Unavailable,
                format!("no live database connection within {waited:?} ({discarded} found closed)"),
            ),
            None => Error::new(
                ErrorKind::Unavailable,
                format!(
                    "every pooled connection stayed busy for {waited:?} (pool size {})",
                    match &self.source {
                        Source::Own(pool) => pool.state().connections,
                        Source::Application(pool) => pool.state().connections,
                    }
                ),
            ),
        }
    }

    /// The pool's connections now: (open, idle). For the application's pool, its own.
    pub fn connections(&self) -> (u32, u32) {
        let state = match &self.source {
            Source::Own(pool) => pool.state(),
            Source::Application(pool) => pool.state(),
        };
        (state.connections, state.idle_connections)
    }

    /// The most connections the pool opens (for the application's pool, its own setting).
    pub fn max_size(&self) -> u32 {
        match &self.source {
            Source::Own(pool) => pool.config().max_size,
            Source::Application(pool) => pool.max_size(),
        }
    }

    /// Checkouts under way now: statements waiting for a connection (most for less than a
    /// millisecond, when one is idle).
    pub fn waiting(&self) -> u32 {
        self.checkouts.waiting()
    }

    /// Tells `observe` how long each checkout took, from its start to its connection, its error
    /// or its caller giving up (a check of a connection left idle and a connect included).
    /// One observer per pool and its clones: the first stays, and `false` says one was there.
    #[doc(hidden)]
    pub fn observe_checkouts(&self, observe: impl Fn(Duration) + Send + Sync + 'static) -> bool {
        self.checkouts.observe_with(Box::new(observe))
    }

    /// bb8's counts since the pool was built: gets served at once, after a wait, or timed out
    /// (bb8's `connection_timeout`, the configured pool timeout), and the time spent waiting.
    pub fn statistics(&self) -> bb8::Statistics {
        match &self.source {
            Source::Own(pool) => pool.state().statistics,
            Source::Application(pool) => pool.state().statistics,
        }
    }

    /// Statements bounded by `deadline` (or, without one, by the statement timeout), each on a
    /// live pooled connection. See [`Bounded`](crate::db::Bounded).
    pub fn statements(&self, deadline: Option<Instant>) -> crate::db::Bounded<'_> {
        crate::db::Bounded::new(self, deadline, false)
    }

    /// Like [`statements`](Self::statements), for statements that are safe to run twice: they
    /// are also retried when their connection failed while they may have run.
    pub fn idempotent(&self, deadline: Option<Instant>) -> crate::db::Bounded<'_> {
        crate::db::Bounded::new(self, deadline, true)
    }
}
