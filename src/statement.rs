//! Running pgcoord's statements: prepared once per pooled connection, or typed on any client.
//!
//! Every lease statement is sent many times on the same few pooled connections, so the pool's
//! connections, like advisory sessions, are [`CachingClient`]s that keep each statement prepared
//! after its first use: later calls
//! cost one round trip and no parse or plan (pgbench on the development machine: 810 → 1,340
//! acquire+release pairs/s, extended against prepared mode). On a caller's own client or transaction
//! (the fencing guard runs in the caller's transaction) statements go out with `query_typed`:
//! one round trip, no prepare.

use std::collections::HashMap;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Socket, Statement, Transaction};
use tracing::{debug, warn};

use crate::error::Result;
use crate::tls::Tls;

/// A boxed `Send` future: what [`PayloadStore`](crate::payload::PayloadStore) and the
/// runtime's backend traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A statement parameter with its type, as `query_typed` takes them.
pub type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Something pgcoord's statements can run on: your `tokio_postgres::Client` or `Transaction`
/// (statements go out typed, one round trip, nothing prepared), or the [`Pool`](crate::Pool)'s
/// [`Bounded`](crate::db::Bounded) statements.
///
/// Sealed: only pgcoord's own statement functions run through it, so a type outside this
/// workspace cannot implement it. From a pool that derefs to a client (deadpool, bb8), pass the
/// client: `&*conn`.
///
/// ```compile_fail,E0277
/// // Not implementable outside: the seal is missing.
/// struct Mine;
/// impl pgcoord::Statements for Mine {
///     fn run<'a>(
///         &'a self,
///         _: &'a str,
///         _: &'a [pgcoord::__private::Param<'a>],
///     ) -> pgcoord::BoxFuture<'a, pgcoord::Result<Vec<tokio_postgres::Row>>> {
///         unimplemented!()
///     }
/// }
/// ```
pub trait Statements: Sealed + Sync {
    /// Runs `sql` with `params` and returns its rows.
    #[doc(hidden)]
    fn run<'a>(&'a self, sql: &'a str, params: &'a [Param<'a>]) -> BoxFuture<'a, Result<Vec<Row>>>;

    /// Runs `sql` planned for these `params` and the tables as they are now, never with a plan
    /// kept from earlier runs: for a statement whose best plan depends on its size (a batch of
    /// many names). Where nothing is kept prepared, the same as `run`.
    #[doc(hidden)]
    fn run_planned<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Row>>> {
        self.run(sql, params)
    }
}

/// What seals [`Statements`]: public only to the workspace's crates, through `__private`.
pub trait Sealed {}

/// A connection pgcoord's bounded statements run on (see `run_until`): it runs
/// statements, can be asked to cancel what it runs, and can be marked as not to be used again.
pub trait Session: Statements + Send {
    /// The underlying client (its cancel token, whether it closed).
    fn client(&self) -> &Client;
    /// Asks the server to cancel whatever runs on this connection, on a task of its own,
    /// bounded ([`cancel`], with the TLS settings the connection was opened with).
    fn cancel(&self);
    /// Marks the connection as not to be used again: a pool closes it (or, for an
    /// application's pool, keeps it aside until it answers again) instead of reusing it.
    fn discard(&self);
}

/// Callers' own clients and transactions: `query_typed`, one round trip, nothing prepared.
macro_rules! typed_statements {
    ($($client:ty),*) => {$(
        impl Sealed for $client {}

        impl Statements for $client {
            fn run<'a>(
                &'a self,
                sql: &'a str,
                params: &'a [Param<'a>],
            ) -> BoxFuture<'a, Result<Vec<Row>>> {
                Box::pin(async move { Ok(self.query_typed(sql, params).await?) })
            }
        }
    )*};
}

typed_statements!(Client, Transaction<'_>);

/// A client that keeps the statements it ran prepared: the pool's connections, and the dedicated
/// sessions of advisory locks.
pub struct CachingClient {
    client: Client,
    /// False on a connection through a pooler that does not keep prepared statements: then
    /// every statement goes out unnamed (`query_typed`).
    prepare: bool,
    prepared: Mutex<HashMap<String, Statement>>,
    /// The TLS of the connection's cancel requests (which open a connection of their own).
    tls: Tls,
    /// Set when the connection must not be used again (a statement timed out on it, or it
    /// failed); a pool then closes it instead of taking it back.
    broken: AtomicBool,
    /// When the server last answered on it: one idle for long is checked before it is trusted
    /// (see `db::fresh`).
    answered: Mutex<Instant>,
}

impl Deref for CachingClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Sealed for CachingClient {}

impl Statements for CachingClient {
    fn run<'a>(&'a self, sql: &'a str, params: &'a [Param<'a>]) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(async move { Ok(self.run_raw(sql, params, self.prepare).await?) })
    }

    fn run_planned<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(async move { Ok(self.run_raw(sql, params, false).await?) })
    }
}

impl Session for CachingClient {
    fn client(&self) -> &Client {
        &self.client
    }

    fn cancel(&self) {
        cancel(&self.client, self.tls.clone());
    }

    fn discard(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }
}

impl CachingClient {
    /// Runs `sql`, from its prepared statement when `prepared`, else unnamed (planned for these
    /// parameters).
    async fn run_raw(
        &self,
        sql: &str,
        params: &[Param<'_>],
        prepared: bool,
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let result = match prepared {
            true => self.run_prepared(sql, params).await,
            false => self.client.query_typed(sql, params).await,
        };
        // A server error is an answer too: the connection is alive.
        if result
            .as_ref()
            .map_or_else(|e| e.as_db_error().is_some(), |_| true)
        {
            self.answered_now();
        }
        result
    }

    async fn run_prepared(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        let statement = self.prepared(sql, params).await?;
        match self.client.query(&statement, &values).await {
            // A table dropped and created again with another shape invalidates what was
            // prepared against it: prepare afresh, once.
            Err(e) if is_stale(&e) => {
                self.prepared.lock().expect("statement cache").remove(sql);
                let statement = self.prepared(sql, params).await?;
                self.client.query(&statement, &values).await
            }
            result => result,
        }
    }

    /// Wraps a client opened with `tls` (its cancel requests use it too); nothing is prepared
    /// until a statement first runs.
    pub fn new(client: Client, tls: Tls) -> CachingClient {
        CachingClient {
            client,
            prepare: true,
            prepared: Mutex::new(HashMap::new()),
            tls,
            broken: AtomicBool::new(false),
            answered: Mutex::new(Instant::now()),
        }
    }

    /// When the server last answered on this connection (or when it was opened).
    pub fn answered_at(&self) -> Instant {
        *self.answered.lock().expect("answered")
    }

    /// Notes that the server answered just now.
    pub(crate) fn answered_now(&self) {
        *self.answered.lock().expect("answered") = Instant::now();
    }

    /// Wraps a client that prepares nothing: every statement is sent unnamed, for a connection
    /// through a pooler in transaction mode (see `ConfigBuilder::prepared_statements`).
    pub fn unprepared(client: Client, tls: Tls) -> CachingClient {
        CachingClient {
            prepare: false,
            ..CachingClient::new(client, tls)
        }
    }

    /// The client itself, mutably (bb8-postgres's validity check takes one).
    pub(crate) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// True once [`discard`](Session::discard)ed or closed.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed) || self.client.is_closed()
    }

    /// The prepared statement for `sql`, preparing it on first use.
    async fn prepared(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> std::result::Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.prepared.lock().expect("statement cache").get(sql) {
            return Ok(statement.clone());
        }
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = self.client.prepare_typed(sql, &types).await?;
        self.prepared
            .lock()
            .expect("statement cache")
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

fn is_stale(error: &tokio_postgres::Error) -> bool {
    matches!(error.code(), Some(c) if *c == SqlState::FEATURE_NOT_SUPPORTED
        || *c == SqlState::UNDEFINED_TABLE
        || *c == SqlState::UNDEFINED_COLUMN)
}

/// How long a cancel request may take; it opens a connection of its own.
const CANCEL_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks the server to cancel whatever `client` is running, on a task of its own, bounded. The
/// request opens a connection of its own, with `tls` (the connection's own TLS settings: a
/// server that requires TLS refuses a plain one).
pub fn cancel<T>(client: &tokio_postgres::Client, tls: T)
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let token = client.cancel_token();
    tokio::spawn(async move {
        match tokio::time::timeout(CANCEL_BOUND, token.cancel_query(tls)).await {
            Ok(Ok(())) => debug!("statement cancelled on the server"),
            Ok(Err(e)) => warn!(error = %e, "cannot cancel a statement on the server"),
            Err(_) => warn!(
                "cancel request unanswered; the server ends the statement when it notices the closed connection"
            ),
        }
    });
}
