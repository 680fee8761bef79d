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
//! - [`listener`] — [`ListenerActor`]: the process's one LISTEN connection, supervised and
//!   reconnecting, with `ConnState` broadcasts; routing (private `dispatch`) to subscribers,
//!   handlers and pending requests.
//! - [`signal_messages`] — [`Publish`], [`Subscribe`], [`WaitNext`], [`Serve`], [`Request`],
//!   [`SubscribeConnState`], and what subscribers receive: [`Signal`], [`ConnState`].
//! - [`round_trip`] — request/reply: [`Request`] for bytes, [`TypedRequest`] for decoded
//!   replies.
//! - [`payload_actor`] — [`PayloadStoreActor`]: large payloads and their expiry.
//! - [`coordinator`] — [`Coordinator`]: starts all three actors.
//! - [`with_lock`](mod@with_lock) — run work under a lease, cancelled when the lease is lost.
//! - `heartbeat` (private) — renewing held leases on a connection of their own, bounded and
//!   retried promptly, their deadlines, and loss reports.
//! - `session` (private) — dedicated connections (advisory sessions, the heartbeat).
//! - `reply` (private) — noticing a caller that gave up, for replies that outlive handlers.
//! - `acquire`, `wake` (private) — the wait of one acquire, and the FIFO queues and LISTEN
//!   connection that wake waiters.
#![deny(missing_docs)]

mod acquire;
pub mod advisory;
pub mod coordinator;
mod dispatch;
mod heartbeat;
pub mod lease;
pub mod listener;
pub mod manager;
pub mod messages;
pub mod payload_actor;
mod reply;
pub mod round_trip;
mod session;
pub mod signal_messages;
mod wake;
pub mod with_lock;

pub use coordinator::Coordinator;
pub use lease::Lease;
pub use listener::ListenerActor;
pub use manager::LockManager;
pub use messages::*;
pub use payload_actor::{DeleteExpired, GetPayload, PayloadStoreActor, PutPayload};
pub use round_trip::{RequestResponse, RoundTrip, TypedRequest, TypedResponse};
pub use signal_messages::*;
pub use with_lock::with_lock;
