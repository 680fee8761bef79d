//! pgcoord-actors: the actix runtime of pgcoord. The core crate says what is true in the
//! database; the actors here decide when to ask, and own everything with a lifetime.
//!
//! Layout:
//! - [`manager`] — [`LockManager`]: held leases and advisory sessions, the heartbeat (one renew statement per tick for
//!   all of them), monotonic deadlines, waiters, `LockLost` broadcasts.
//! - [`messages`] — the typed messages: [`Acquire`], [`Release`], [`Get`], [`List`],
//!   [`RenewNow`], [`SubscribeLockLost`], [`GetStats`], and the [`LockLost`] broadcast.
//! - [`advisory`] — advisory locks on dedicated, pinged sessions ([`AdvisoryLock`], [`AdvisoryUnlock`]).
//! - [`lease`] — [`Lease`], the handle of a held lease: token, data, fencing guard, loss signal;
//!   released when dropped.
//! - [`with_lock`] — run work under a lease, cancelled when the lease is lost.
//! - `acquire`, `wake` (private) — the wait of one acquire, and the FIFO queues and LISTEN
//!   connection that wake waiters.
#![deny(missing_docs)]

mod acquire;
pub mod advisory;
pub mod lease;
pub mod manager;
pub mod messages;
mod wake;
pub mod with_lock;

pub use lease::Lease;
pub use manager::LockManager;
pub use messages::*;
pub use with_lock::with_lock;
