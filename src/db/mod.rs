//! Connections: the shared pool, dedicated sessions, bounded statements, and the retry of
//! transient conflicts.
//!
//! Two kinds of connection exist on purpose. Statements that need no session state (acquire,
//! release, inspect, notify) borrow from the [`Pool`]. Anything that lives in a session — an
//! advisory lock, a LISTEN, the heartbeat — gets a dedicated connection that nobody else
//! borrows: a pooled session would hand its locks to the next borrower, bb8 drops notifications,
//! and a heartbeat must not wait for a pool that blocked acquires have exhausted.
//!
//! Connections fail, and every function here assumes so: connecting is bounded by the connect
//! timeout as a whole (tokio-postgres bounds only the TCP connect), a statement by a deadline
//! ([`Bounded`]), and any failure to reach the server is
//! [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) with the cause as its source.
//!
//! What is public here is what an application needs: the [`Pool`], its [`Bounded`] statements,
//! [`connect_spawned`] for a client of its own with the configuration's TLS and timeouts, and
//! the [`Backoff`]. The sessions, checks and retries the runtime builds on are its plumbing.

pub(crate) mod borrowed;
pub(crate) mod bounded;
pub(crate) mod check;
mod checkouts;
pub(crate) mod connect;
pub(crate) mod fresh;
pub(crate) mod manager;
pub(crate) mod pool;
pub(crate) mod retry;

pub use crate::backoff::Backoff;
pub use bounded::Bounded;
pub use connect::connect_spawned;
pub use pool::Pool;

pub(crate) use connect::ping;
