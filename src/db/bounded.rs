//! Bounded statements: every statement pgcoord runs has a deadline, and what happens when it
//! passes is decided here, once.
//!
//! A statement past its deadline is cancelled on the server with the connection's cancel token
//! (dropping a tokio-postgres future does not stop the query there) and its connection is
//! discarded, never returned to a pool: whatever it was doing, nobody else should inherit it.
//! The caller gets [`ErrorKind::Unavailable`]: the database did not answer in time.
//!
//! Retries after a connection failure:
//! - A connection found closed before a statement was sent is replaced and the statement sent on
//!   another; that is always safe ([`Pool::checkout`] does it).
//! - A connection that fails while a statement is in flight leaves its outcome unknown. Only
//!   statements that are safe to run twice are retried then ([`Pool::idempotent`]); the call
//!   sites say why each one is.

use std::time::Instant;

use tokio_postgres::Row;
use tracing::debug;

use crate::db::Pool;
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{BoxFuture, Param, Session, Statements};

/// Statements on pooled connections, each bounded by one deadline. Made by
/// [`Pool::statements`] and [`Pool::idempotent`]; implements [`Statements`], so every lease,
/// signal and payload statement can run on it.
pub struct Bounded<'p> {
    pool: &'p Pool,
    deadline: Instant,
    idempotent: bool,
    /// Each statement planned for the tables as they are (see [`Bounded::planned`]).
    planned: bool,
}

impl<'p> Bounded<'p> {
    pub(crate) fn new(pool: &'p Pool, deadline: Option<Instant>, idempotent: bool) -> Bounded<'p> {
        let bound = Instant::now() + pool.statement_timeout;
        Bounded {
            pool,
            deadline: deadline.map_or(bound, |d| d.min(bound)),
            idempotent,
            planned: false,
        }
    }

    /// These statements planned for their parameters and the tables as they are, never with a
    /// plan a connection kept from earlier runs (sent unnamed): for a burst that grows a table
    /// (a claim of many names). A kept plan was made at the statement's sixth run on its
    /// connection, perhaps while the table was small, and stays until the table's next
    /// `ANALYZE`; made for a small table, the batch acquire's reads the table whole, twice per
    /// batch (10,000 leases claimed on a new table: 2.8–3.3 s on such a plan, 1.1–1.4 s planned
    /// each time, docs/BENCHMARKS.md). Planning costs about 1 ms a batch of 32 names (that claim
    /// on a table whose kept plan was good: 0.64–0.70 s, against 0.34 s): under steady load, on
    /// a table that does not grow, the kept plans are the cheaper.
    pub fn planned(self) -> Self {
        Bounded {
            planned: true,
            ..self
        }
    }

    /// When these statements give up.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl crate::statement::Sealed for Bounded<'_> {}

impl Statements for Bounded<'_> {
    fn run<'a>(&'a self, sql: &'a str, params: &'a [Param<'a>]) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(self.run_bounded(sql, params, self.planned))
    }

    fn run_planned<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(self.run_bounded(sql, params, true))
    }
}

impl Bounded<'_> {
    /// A statement on a pooled connection by the deadline, retried on another connection when
    /// idempotent; `planned`: see [`Statements::run_planned`].
    async fn run_bounded(
        &self,
        sql: &str,
        params: &[Param<'_>],
        planned: bool,
    ) -> Result<Vec<Row>> {
        loop {
            let conn = self.pool.checkout(self.deadline).await?;
            match bounded(&*conn, sql, params, self.deadline, planned).await {
                Err(e)
                    if self.idempotent
                        && e.is_connection_failure()
                        && Instant::now() < self.deadline =>
                {
                    // Safe to run again (the caller said so); this connection is gone.
                    conn.discard();
                    debug!(error = %e, "connection failed mid-statement; retrying");
                }
                result => return result,
            }
        }
    }
}

/// Runs one statement on `client`, bounded by `deadline`. Past it, the statement is cancelled on
/// the server and the client marked broken; a connection failure marks it broken too.
pub async fn run_until<S: Session + ?Sized>(
    client: &S,
    sql: &str,
    params: &[Param<'_>],
    deadline: Instant,
) -> Result<Vec<Row>> {
    bounded(client, sql, params, deadline, false).await
}

/// [`run_until`], with the statement planned for its parameters when `planned`.
async fn bounded<S: Session + ?Sized>(
    client: &S,
    sql: &str,
    params: &[Param<'_>],
    deadline: Instant,
    planned: bool,
) -> Result<Vec<Row>> {
    let run = match planned {
        true => client.run_planned(sql, params),
        false => client.run(sql, params),
    };
    match tokio::time::timeout_at(deadline.into(), run).await {
        Ok(Err(e)) if e.is_connection_failure() => {
            client.discard();
            Err(e)
        }
        Ok(result) => result,
        Err(_) => {
            client.discard();
            client.cancel();
            Err(Error::new(
                ErrorKind::Unavailable,
                "the database did not answer in time; the statement was cancelled and its \
                 connection closed",
            ))
        }
    }
}

/// Statements on one given connection, each bounded by one deadline: for dedicated connections
/// (the heartbeat's) and for a pooled connection a caller checked out itself. Made by [`until`].
pub struct Until<'c> {
    client: &'c dyn Session,
    deadline: Instant,
}

/// Statements on `client` bounded by `deadline` (see [`run_until`]).
pub fn until(client: &dyn Session, deadline: Instant) -> Until<'_> {
    Until { client, deadline }
}

impl crate::statement::Sealed for Until<'_> {}

impl Statements for Until<'_> {
    fn run<'a>(&'a self, sql: &'a str, params: &'a [Param<'a>]) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(run_until(self.client, sql, params, self.deadline))
    }
}
