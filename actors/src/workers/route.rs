//! Routing: a message to a key's worker in whichever process of the fleet holds the key now.
//!
//! A routed pool's member answers requests on a channel of its own, the lease wing's
//! [`holder_channel`](pgcoord::lease::holder_channel) for the pool (scoped to its lock table)
//! and the member's owner. A [`KeyRouter`] sends a request in one statement that reads who
//! holds the key's lease — the lease table's row, by the server's clock, never a
//! notification's word — and NOTIFYs that holder's channel
//! ([`notify_holder`](pgcoord::LeaseTable::notify_holder)): a routed ask costs the round trip a
//! plain request/reply does. The member hands the message to the key's worker only while it
//! holds the key's lease, and otherwise answers "not here": the router sends again (the key is
//! moving), until its deadline. So while a key moves, its messages wait in their senders,
//! bounded by each call's timeout.
//!
//! At most once: a message is handled by the key's worker once or not at all. When no answer
//! came in time the router cannot know which, and says so ([`ErrorKind::Timeout`]); it never
//! sends a message again after it may have been delivered, except after a "not here" — which
//! anyone can forge. So every send of one message carries the same id, and a member remembers
//! the ids it delivered for as long as their senders wait: a message sent again to the member
//! that has it is not delivered again, and gets the first delivery's answer. (A forged "not
//! here", or a replayed request, while the key moves to another process can still have the
//! message handled by both: the model `models::routing` finds both.) [`KeyRouter::tell`] is
//! answered as soon as the message is in the worker's mailbox, [`KeyRouter::ask`] once the
//! worker has handled it. Anyone who can connect to the database can NOTIFY a member's channel: a worker
//! takes routed messages as a signal's subscriber takes signals, from the database's users,
//! not from an authenticated peer.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, instrument};

use crate::backend::Locking;
use crate::leases::LockManager;
use crate::signals::ListenerActor;

use super::reach::{Holders, Reach};
use super::wire::{Reply, Wait, encode_request};

/// A message routed to a key's worker by a [`KeyRouter`]: a worker of a routed pool handles
/// it, and its answer (bytes, or an error the sender gets as [`ErrorKind::Remote`]) goes back
/// to the sender.
#[derive(Debug, Clone, Message)]
#[rtype(result = "std::result::Result<Vec<u8>, String>")]
pub struct Routed {
    pub(super) key: String,
    pub(super) payload: Vec<u8>,
}

impl Routed {
    /// The key the message was sent to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The message as sent.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The message decoded from MessagePack (as [`KeyRouter::ask_value`] sends it).
    pub fn value<T: DeserializeOwned>(&self) -> Result<T> {
        pgcoord::signal::from_payload(&self.payload)
    }
}

/// Sends messages to the workers of a routed [`WorkerPool`](super::WorkerPool)'s keys,
/// wherever they run. Any process of the fleet can make one, a member of the pool or not; it
/// needs the lock manager (for its lock table and pool) and the listener (to hear answers).
/// Clones share the two addresses and what they were asked once.
#[derive(Clone)]
pub struct KeyRouter {
    pool: String,
    /// The leases: the pool's members are listed from them.
    locks: Arc<dyn Locking>,
    holders: Arc<dyn Holders>,
    /// Set by [`KeyRouter::activate_keys`].
    activate_keys: bool,
}

impl std::fmt::Debug for KeyRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRouter")
            .field("pool", &self.pool)
            .finish()
    }
}

/// [`ErrorKind::Timeout`] for a message that reached, or may have reached, the key's worker
/// without an answer: it may or may not have been handled.
fn maybe_handled(key: &str, what: &str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("the worker of key {key:?} {what}: the message may or may not have been handled"),
    )
}

/// How long the router waits before sending again while a key has no holder or is moving: a
/// few milliseconds at first (a move is usually over in one tick), at most this.
const LOOK_AGAIN_AT_MOST: Duration = Duration::from_millis(200);

impl KeyRouter {
    /// A router to the workers of pool `pool` (the name its [`WorkerPool`](super::WorkerPool)s
    /// were made with), reaching holders through `locks`'s table and hearing answers through
    /// `listener`.
    pub fn new(
        pool: impl Into<String>,
        locks: Addr<LockManager>,
        listener: Addr<ListenerActor>,
    ) -> KeyRouter {
        let reach = Reach::new(locks.clone(), listener);
        KeyRouter::through(pool.into(), Arc::new(locks), Arc::new(reach))
    }

    /// A router to the workers of pool `pool`, listing members from `locks` and reaching
    /// holders through `holders`.
    pub(crate) fn through(
        pool: String,
        locks: Arc<dyn Locking>,
        holders: Arc<dyn Holders>,
    ) -> KeyRouter {
        KeyRouter {
            pool,
            locks,
            holders,
            activate_keys: false,
        }
    }

    /// Keys come to life on a message: a message to a key nobody holds records the key under
    /// the pool (a free, kept row of the key's lease) and rings the pool's doorbell, and a
    /// member of a pool made [`WorkerPool::activate_keys`](super::WorkerPool::activate_keys)
    /// takes it under its fair share and starts its worker; the message waits in its sender
    /// meanwhile, as during a move, and is delivered once the worker runs. Without it, a
    /// message to a key that is not one of the pool's waits for a holder until its deadline.
    pub fn activate_keys(mut self) -> KeyRouter {
        self.activate_keys = true;
        self
    }

    /// Sends `payload` to the worker of `key` and answers its reply, within `timeout` whatever
    /// the connections do. While the key moves between processes or has no holder yet, the
    /// router sends again until the deadline. Errors: the worker's own as
    /// [`ErrorKind::Remote`]; [`ErrorKind::Timeout`] when no answer came — in time, or at all
    /// (the worker stopped before it answered): the message may or may not have been handled
    /// (at most once: it is never sent twice), and the error says which; or, when no process
    /// held the key in time, that it was not delivered. One call after another keeps their
    /// order for a key.
    #[instrument(skip_all, fields(pool.name = %self.pool, worker.key = %key), level = "debug")]
    pub async fn ask(
        &self,
        key: &str,
        payload: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        self.send(key, Wait::Answer, payload.into(), timeout).await
    }

    /// Sends `payload` to the worker of `key` without waiting for it to be handled: answers
    /// `Ok` once the message is in the worker's mailbox — it is handled then, unless the worker
    /// stops first (its key lost or moved, its process killed) — within `timeout` whatever the
    /// connections do. The worker's answer goes nowhere. While the key moves, or its worker's
    /// mailbox is full, the router sends again until the deadline. Errors as [`ask`](Self::ask)'s:
    /// [`ErrorKind::Timeout`] says whether the message may have reached the mailbox. One call
    /// after another keeps their order for a key, also mixed with `ask`s.
    #[instrument(skip_all, fields(pool.name = %self.pool, worker.key = %key), level = "debug")]
    pub async fn tell(
        &self,
        key: &str,
        payload: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<()> {
        self.send(key, Wait::Mailbox, payload.into(), timeout)
            .await
            .map(drop)
    }

    /// [`ask`](Self::ask) with MessagePack: `request` encoded, the answer decoded.
    pub async fn ask_value<Req, Rep>(
        &self,
        key: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Rep>
    where
        Req: Serialize + ?Sized,
        Rep: DeserializeOwned,
    {
        let payload = pgcoord::signal::to_payload(request)?;
        let answer = self.ask(key, payload, timeout).await?;
        pgcoord::signal::from_payload(&answer)
    }

    /// [`tell`](Self::tell) with MessagePack: `message` encoded ([`Routed::value`] decodes it).
    pub async fn tell_value<T: Serialize + ?Sized>(
        &self,
        key: &str,
        message: &T,
        timeout: Duration,
    ) -> Result<()> {
        self.tell(key, pgcoord::signal::to_payload(message)?, timeout)
            .await
    }

    /// The pool's live members now, by owner, sorted: every process whose pool of this name
    /// holds its member lease (read from the table; [`WorkerPool::members_to`](super::WorkerPool::members_to)
    /// tells a pool's own process of changes).
    pub async fn members(&self) -> Result<Vec<String>> {
        let prefix = format!("{}/members/", self.pool);
        let infos = self.locks.list_prefix(&prefix).await?;
        Ok(super::members::live(&infos, &prefix))
    }

    /// [`ask`](Self::ask) or [`tell`](Self::tell): sends until answered or the deadline, and
    /// says what the sender can know.
    async fn send(
        &self,
        key: &str,
        wait: Wait,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sent = false;
        let sending = self.send_until(key, wait, payload, deadline, &mut sent);
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout_at(deadline, sending).await;
        let outcome = match (&answer, wait) {
            (Ok(Ok(_)), Wait::Answer) => "handled",
            (Ok(Ok(_)), Wait::Mailbox) => "accepted",
            (Ok(Err(e)), _) if e.kind() != ErrorKind::Timeout => "failed",
            _ if sent => "timeout",
            _ => "not_delivered",
        };
        crate::metrics::routed(&self.pool, outcome, started.elapsed());
        match answer {
            Ok(Err(e)) if e.kind() != ErrorKind::Timeout => Err(e),
            Ok(Ok(answer)) => Ok(answer),
            // The deadline, here or in the listener's round trip.
            _ if sent => Err(maybe_handled(
                key,
                &format!("did not answer within {timeout:?}"),
            )),
            _ => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "no process held key {key:?} of pool {:?} within {timeout:?}: the message \
                     was not delivered",
                    self.pool
                ),
            )),
        }
    }

    /// Sends to the key's holder, again while the key has none or has moved. `sent` is set
    /// once a request went out that a worker may have handled.
    async fn send_until(
        &self,
        key: &str,
        wait: Wait,
        payload: Vec<u8>,
        deadline: tokio::time::Instant,
        sent: &mut bool,
    ) -> Result<Vec<u8>> {
        let lease = format!("{}/keys/{key}", self.pool);
        // One id for every send of this message: a member that has it already answers with
        // what became of it rather than deliver it again.
        let id = pgcoord::signal::new_id();
        let mut looks = 0u32;
        loop {
            looks += 1;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // The member waits for its worker no longer than this sender waits.
            let request = encode_request(id, key, wait, left, &payload);
            let answer = (self.holders)
                .send_once(&self.pool, &lease, request, left, self.activate_keys, sent)
                .await?;
            match answer.map(Reply::decode).transpose()? {
                Some(Reply::Handled(bytes)) => return Ok(bytes),
                Some(Reply::Accepted) => return Ok(Vec::new()),
                Some(Reply::Failed(why)) => return Err(Error::new(ErrorKind::Remote, why)),
                Some(Reply::Unknown) => {
                    return Err(maybe_handled(
                        key,
                        "did not answer (it stopped, or in time)",
                    ));
                }
                // Not delivered: the key moved on (or not yet in), so sending again is still at
                // most once. Or a forged answer (anyone can NOTIFY it) while the worker has the
                // message: sent again with the same id, the member answers with the first
                // delivery's outcome.
                Some(Reply::NotHere) => {
                    *sent = false;
                    debug!("the key is not at its holder's; looking again");
                }
                None => debug!("nobody holds the key; looking again"),
            }
            let pause = Duration::from_millis(5 << looks.min(6)).min(LOOK_AGAIN_AT_MOST);
            tokio::time::sleep(pause).await;
        }
    }
}
