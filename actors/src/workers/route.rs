//! Routing: a message to a key's worker in whichever process of the fleet holds the key now.
//!
//! A routed pool's member answers requests on a channel of its own (`pgcoord.route.` and a hash
//! of the pool's name and the member's owner). A [`KeyRouter`] reads who holds the key's lease — the
//! lease table's row, by the server's clock, never a notification's word — and asks that
//! member. The member hands the message to the key's worker only while it holds the key's
//! lease, and otherwise answers "not here": the router reads the table again (the key is
//! moving) and asks the new holder, until its deadline. So while a key moves, its messages wait
//! in their senders, bounded by each call's timeout.
//!
//! At most once: a message is handled by the key's worker once or not at all. When no answer
//! came in time the router cannot know which, and says so ([`ErrorKind::Timeout`]); it never
//! sends a message again after it may have been delivered. Anyone who can connect to the
//! database can NOTIFY a member's channel: a worker takes routed messages as a signal's
//! subscriber takes signals, from the database's users, not from an authenticated peer.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, instrument};

use crate::Call;
use crate::leases::{Get, LockManager, LockTableName};
use crate::signals::{Ask, ListenerActor};

/// A message routed to a key's worker by a [`KeyRouter`]: a worker of a routed pool handles
/// it, and its answer (bytes, or an error the sender gets as [`ErrorKind::Remote`]) goes back
/// to the sender.
#[derive(Debug, Clone)]
pub struct Routed {
    pub(super) key: String,
    pub(super) payload: Vec<u8>,
}

impl Message for Routed {
    type Result = std::result::Result<Vec<u8>, String>;
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

/// The channel the member `owner` of pool `pool` on lock table `table` answers routed requests
/// on: a hash, so any names fit NOTIFY's 63 bytes. The table is in it so that two deployments
/// sharing a database (each its own lock table) never answer each other's requests, whatever
/// their pools and owners are called.
pub(super) fn channel(table: &str, pool: &str, owner: &str) -> String {
    let hash = pgcoord::advisory::key_for_name(&format!("{table}\0{pool}\0{owner}"));
    format!("pgcoord.route.{:016x}", hash as u64)
}

/// A request on the wire: the key's length (4 bytes, big-endian), the key, how long the sender
/// waits for the answer (milliseconds, 4 bytes), the payload.
pub(super) fn encode_request(key: &str, within: Duration, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + key.len() + payload.len());
    bytes.extend_from_slice(&(key.len() as u32).to_be_bytes());
    bytes.extend_from_slice(key.as_bytes());
    let millis = u32::try_from(within.as_millis()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&millis.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// The message of a request and how long its sender waits; an error for bytes no router sent.
pub(super) fn decode_request(
    mut bytes: Vec<u8>,
) -> std::result::Result<(Routed, Duration), String> {
    let bad = || "not a routed request".to_owned();
    let number = |bytes: &[u8], at: usize| -> std::result::Result<u32, String> {
        let four = bytes.get(at..at + 4).ok_or_else(bad)?;
        Ok(u32::from_be_bytes(four.try_into().map_err(|_| bad())?))
    };
    let len = number(&bytes, 0)? as usize;
    let within = Duration::from_millis(u64::from(number(&bytes, 4 + len)?));
    let key = bytes.get(4..4 + len).ok_or_else(bad)?;
    let key = std::str::from_utf8(key).map_err(|_| bad())?.to_owned();
    let payload = bytes.split_off(8 + len);
    Ok((Routed { key, payload }, within))
}

/// A member's answer to a routed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// The worker's answer.
    Handled(Vec<u8>),
    /// The worker's error.
    Failed(String),
    /// This member does not hold the key (any more, or yet): nothing was delivered.
    NotHere,
    /// The worker had the message and did not answer: it stopped first (its key moved, or it
    /// panicked), or it took longer than the sender waits. It may or may not have been handled.
    Unknown,
}

impl Reply {
    /// A tag byte, then the answer's bytes.
    pub(super) fn encode(self) -> Vec<u8> {
        let (tag, mut rest) = match self {
            Reply::Handled(bytes) => (0, bytes),
            Reply::Failed(why) => (1, why.into_bytes()),
            Reply::NotHere => (2, Vec::new()),
            Reply::Unknown => (3, Vec::new()),
        };
        rest.insert(0, tag);
        rest
    }

    fn decode(mut bytes: Vec<u8>) -> Result<Reply> {
        let bad = || Error::new(ErrorKind::Other, "a routed request's answer is not one");
        let tag = *bytes.first().ok_or_else(bad)?;
        let rest = bytes.split_off(1);
        match tag {
            0 => Ok(Reply::Handled(rest)),
            1 => Ok(Reply::Failed(String::from_utf8_lossy(&rest).into_owned())),
            2 => Ok(Reply::NotHere),
            3 => Ok(Reply::Unknown),
            _ => Err(bad()),
        }
    }
}

/// Sends messages to the workers of a routed [`WorkerPool`](super::WorkerPool)'s keys,
/// wherever they run. Any process of the fleet can make one, a member of the pool or not; it
/// needs the lock manager (to read who holds a key, on its lock table) and the listener (to
/// ask). Clones share the two addresses and the lock table's name.
#[derive(Clone)]
pub struct KeyRouter {
    pool: String,
    locks: Addr<LockManager>,
    listener: Addr<ListenerActor>,
    /// The lock table's name, asked of `locks` once.
    table: Arc<tokio::sync::OnceCell<String>>,
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

/// How long the router waits before reading the table again while a key has no holder or is
/// moving: a few milliseconds at first (a move is usually over in one tick), at most this.
const LOOK_AGAIN_AT_MOST: Duration = Duration::from_millis(200);

impl KeyRouter {
    /// A router to the workers of pool `pool` (the name its [`WorkerPool`](super::WorkerPool)s
    /// were made with), reading leases through `locks` and asking through `listener`.
    pub fn new(
        pool: impl Into<String>,
        locks: Addr<LockManager>,
        listener: Addr<ListenerActor>,
    ) -> KeyRouter {
        KeyRouter {
            pool: pool.into(),
            locks,
            listener,
            table: Arc::default(),
        }
    }

    /// Sends `payload` to the worker of `key` and answers its reply, within `timeout` whatever
    /// the connections do. While the key moves between processes or has no holder yet, the
    /// router looks again until the deadline. Errors: the worker's own as
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
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sent = false;
        let asked = self.ask_until(key, payload.into(), deadline, &mut sent);
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout_at(deadline, asked).await;
        let outcome = match &answer {
            Ok(Ok(_)) => "handled",
            Ok(Err(e)) if e.kind() != ErrorKind::Timeout => "failed",
            _ if sent => "timeout",
            _ => "not_delivered",
        };
        crate::metrics::routed(&self.pool, outcome, started.elapsed());
        match answer {
            Ok(Err(e)) if e.kind() != ErrorKind::Timeout => Err(e),
            Ok(Ok(answer)) => Ok(answer),
            // The deadline, here or in the listener's ask.
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

    /// The pool's live members now, by owner, sorted: every process whose pool of this name
    /// holds its member lease (read from the table; [`SubscribeMembers`](super::SubscribeMembers)
    /// tells a pool's own process of changes).
    pub async fn members(&self) -> Result<Vec<String>> {
        let prefix = format!("{}/members/", self.pool);
        let infos = self
            .locks
            .call(crate::leases::ListPrefix(prefix.clone()))
            .await?;
        Ok(super::members::live(&infos, &prefix))
    }

    /// Reads the key's holder and asks it, again while the key has none or has moved. `sent`
    /// is set once a request went out that a worker may have handled.
    async fn ask_until(
        &self,
        key: &str,
        payload: Vec<u8>,
        deadline: tokio::time::Instant,
        sent: &mut bool,
    ) -> Result<Vec<u8>> {
        let lease = format!("{}/keys/{key}", self.pool);
        let mut looks = 0u32;
        loop {
            looks += 1;
            match self.locks.call(Get(lease.clone())).await {
                Ok(info) if info.remaining.is_some_and(|left| !left.is_zero()) => {
                    let owner = info.owner.unwrap_or_default();
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    // The member waits for its worker no longer than this sender waits.
                    let request = encode_request(key, left, &payload);
                    let table = (self.table)
                        .get_or_try_init(|| self.locks.send(LockTableName))
                        .await
                        .map_err(|_| {
                            Error::new(ErrorKind::Unavailable, "the lock manager stopped")
                        })?;
                    let ask = Ask::new(channel(table, &self.pool, &owner), request).timeout(left);
                    // From here a worker may handle it: never sent again.
                    *sent = true;
                    let answer = self.listener.call(ask).await?;
                    match Reply::decode(answer)? {
                        Reply::Handled(bytes) => return Ok(bytes),
                        Reply::Failed(why) => return Err(Error::new(ErrorKind::Remote, why)),
                        Reply::Unknown => {
                            return Err(maybe_handled(
                                key,
                                "did not answer (it stopped, or in time)",
                            ));
                        }
                        // Not delivered: the key moved on (or not yet in), so sending again is
                        // still at most once.
                        Reply::NotHere => {
                            *sent = false;
                            debug!(%owner, "the key is not at its holder's; looking again");
                        }
                    }
                }
                Ok(_) => debug!("nobody holds the key; looking again"),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    debug!("nobody has held the key yet; looking again")
                }
                Err(e) => debug!(error = %e, "cannot read the key's holder; looking again"),
            }
            let pause = Duration::from_millis(5 << looks.min(6)).min(LOOK_AGAIN_AT_MOST);
            tokio::time::sleep(pause).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let second = Duration::from_secs(1);
        let request = encode_request("customer-7", second, b"hello");
        let (routed, within) = decode_request(request).unwrap();
        assert_eq!(
            (routed.key(), routed.payload()),
            ("customer-7", &b"hello"[..])
        );
        assert_eq!(within, second);
        let (empty, _) = decode_request(encode_request("", Duration::ZERO, b"")).unwrap();
        assert_eq!((empty.key(), empty.payload()), ("", &b""[..]));
        // More milliseconds than 4 bytes hold: as many as they do.
        let (_, within) = decode_request(encode_request("k", Duration::MAX, b"")).unwrap();
        assert_eq!(within, Duration::from_millis(u64::from(u32::MAX)));
        for reply in [
            Reply::Handled(b"ok".to_vec()),
            Reply::Failed("no".into()),
            Reply::NotHere,
            Reply::Unknown,
        ] {
            assert_eq!(Reply::decode(reply.clone().encode()).unwrap(), reply);
        }
    }

    #[test]
    fn bytes_no_router_sent_are_refused() {
        assert!(decode_request(vec![0, 0]).is_err());
        assert!(decode_request(vec![0, 0, 0, 9, b'a']).is_err());
        assert!(decode_request(vec![0, 0, 0, 1, 0xff, 0, 0, 0, 1]).is_err());
        assert!(decode_request(vec![0, 0, 0, 1, b'k', 0, 0]).is_err());
        assert!(Reply::decode(vec![]).is_err());
        assert!(Reply::decode(vec![7]).is_err());
    }

    #[test]
    fn channels_fit_notify_and_differ_by_pool_and_owner() {
        let long = "x".repeat(500);
        let a = channel("t", &long, "host-1");
        assert!(a.len() <= 63);
        assert_ne!(a, channel("t", &long, "host-2"));
        assert_ne!(channel("t", "a", "bc"), channel("t", "ab", "c"));
        assert_ne!(channel("t", "p", "o"), channel("u", "p", "o"));
        assert_eq!(channel("t", "p", "o"), channel("t", "p", "o"));
    }
}
