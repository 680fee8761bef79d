//! A routed pool's wire: the channels (scoped to the lock table and the pool), a request as
//! NOTIFYed (what the sender waits for, the key, its time left, the payload) and a member's
//! answer. Pure: no I/O.

use std::time::Duration;

use pgcoord::{Error, ErrorKind, Result};

/// What scopes a routed pool's channels: the lock table and the pool, each after its length,
/// so that two deployments sharing a database (each its own lock table) never answer each
/// other's requests, whatever their pools and owners are called.
pub(super) fn scope(table: &str, pool: &str) -> String {
    format!("route {}:{table} {}:{pool} ", table.len(), pool.len())
}

/// The channel the member `owner` of pool `pool` on lock table `table` answers routed requests
/// on.
pub(crate) fn channel(table: &str, pool: &str, owner: &str) -> String {
    pgcoord::lease::holder_channel(&scope(table, pool), owner)
}

/// The doorbell of pool `pool` on lock table `table`, rung when a message records a key that
/// came to life: the holder channel of an empty owner, which no member has (owners are 1 to
/// 255 bytes).
pub(super) fn pool_channel(table: &str, pool: &str) -> String {
    pgcoord::lease::holder_channel(&scope(table, pool), "")
}

/// What the sender waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// The worker's answer ([`KeyRouter::ask`]).
    Answer,
    /// The message in the worker's mailbox ([`KeyRouter::tell`]).
    Mailbox,
}

/// A request on the wire: the message's id (8 bytes, big-endian: the same each time one call
/// sends it, so a member that delivered it already does not deliver it again), what the sender
/// waits for (1 byte: 0 the answer, 1 the mailbox), the key's length (4 bytes, big-endian), the
/// key, how long the sender waits (milliseconds, 4 bytes), the payload.
pub(super) fn encode_request(
    id: u64,
    key: &str,
    wait: Wait,
    within: Duration,
    payload: &[u8],
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(17 + key.len() + payload.len());
    bytes.extend_from_slice(&id.to_be_bytes());
    bytes.push(match wait {
        Wait::Answer => 0,
        Wait::Mailbox => 1,
    });
    bytes.extend_from_slice(&(key.len() as u32).to_be_bytes());
    bytes.extend_from_slice(key.as_bytes());
    let millis = u32::try_from(within.as_millis()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&millis.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A request as a member reads it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) id: u64,
    pub(super) key: String,
    pub(super) payload: Vec<u8>,
    pub(super) wait: Wait,
    pub(super) within: Duration,
}

/// The message of a request, what its sender waits for and how long; an error for bytes no
/// router sent.
pub(super) fn decode_request(mut bytes: Vec<u8>) -> std::result::Result<Request, String> {
    let bad = || "not a routed request".to_owned();
    let number = |bytes: &[u8], at: usize| -> std::result::Result<u32, String> {
        let four = bytes.get(at..at + 4).ok_or_else(bad)?;
        Ok(u32::from_be_bytes(four.try_into().map_err(|_| bad())?))
    };
    let id = bytes.get(..8).ok_or_else(bad)?;
    let id = u64::from_be_bytes(id.try_into().map_err(|_| bad())?);
    let wait = match bytes.get(8) {
        Some(0) => Wait::Answer,
        Some(1) => Wait::Mailbox,
        _ => return Err(bad()),
    };
    let len = number(&bytes, 9)? as usize;
    let within = Duration::from_millis(u64::from(number(&bytes, 13 + len)?));
    let key = bytes.get(13..13 + len).ok_or_else(bad)?;
    let key = std::str::from_utf8(key).map_err(|_| bad())?.to_owned();
    let payload = bytes.split_off(17 + len);
    Ok(Request {
        id,
        key,
        payload,
        wait,
        within,
    })
}

/// A member's answer to a routed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// The worker's answer.
    Handled(Vec<u8>),
    /// The worker's error.
    Failed(String),
    /// This member does not hold the key (any more, or yet), or its worker's mailbox is full:
    /// nothing was delivered.
    NotHere,
    /// The worker had the message and did not answer: it stopped first (its key moved, or it
    /// panicked), or it took longer than the sender waits. It may or may not have been handled.
    Unknown,
    /// The message is in the worker's mailbox (to a [`KeyRouter::tell`]).
    Accepted,
}

impl Reply {
    /// A tag byte, then the answer's bytes.
    pub(super) fn encode(self) -> Vec<u8> {
        let (tag, mut rest) = match self {
            Reply::Handled(bytes) => (0, bytes),
            Reply::Failed(why) => (1, why.into_bytes()),
            Reply::NotHere => (2, Vec::new()),
            Reply::Unknown => (3, Vec::new()),
            Reply::Accepted => (4, Vec::new()),
        };
        rest.insert(0, tag);
        rest
    }

    pub(super) fn decode(mut bytes: Vec<u8>) -> Result<Reply> {
        let bad = || Error::new(ErrorKind::Other, "a routed request's answer is not one");
        let tag = *bytes.first().ok_or_else(bad)?;
        let rest = bytes.split_off(1);
        match tag {
            0 => Ok(Reply::Handled(rest)),
            1 => Ok(Reply::Failed(String::from_utf8_lossy(&rest).into_owned())),
            2 => Ok(Reply::NotHere),
            3 => Ok(Reply::Unknown),
            4 => Ok(Reply::Accepted),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let second = Duration::from_secs(1);
        let request = encode_request(7, "customer-7", Wait::Answer, second, b"hello");
        let read = decode_request(request).unwrap();
        assert_eq!(
            read,
            Request {
                id: 7,
                key: "customer-7".into(),
                payload: b"hello".to_vec(),
                wait: Wait::Answer,
                within: second,
            }
        );
        let request = encode_request(u64::MAX, "", Wait::Mailbox, Duration::ZERO, b"");
        let empty = decode_request(request).unwrap();
        assert_eq!((empty.key.as_str(), &empty.payload[..]), ("", &b""[..]));
        assert_eq!((empty.wait, empty.id), (Wait::Mailbox, u64::MAX));
        // More milliseconds than 4 bytes hold: as many as they do.
        let request = encode_request(1, "k", Wait::Answer, Duration::MAX, b"");
        let within = decode_request(request).unwrap().within;
        assert_eq!(within, Duration::from_millis(u64::from(u32::MAX)));
        for reply in [
            Reply::Handled(b"ok".to_vec()),
            Reply::Failed("no".into()),
            Reply::NotHere,
            Reply::Unknown,
            Reply::Accepted,
        ] {
            assert_eq!(Reply::decode(reply.clone().encode()).unwrap(), reply);
        }
    }

    #[test]
    fn bytes_no_router_sent_are_refused() {
        let id = |rest: &[u8]| [&[0u8; 8][..], rest].concat();
        assert!(decode_request(vec![]).is_err());
        assert!(decode_request(vec![0; 7]).is_err());
        assert!(decode_request(id(&[2, 0, 0, 0, 0, 0, 0, 0, 0])).is_err());
        assert!(decode_request(id(&[0, 0, 0])).is_err());
        assert!(decode_request(id(&[0, 0, 0, 0, 9, b'a'])).is_err());
        assert!(decode_request(id(&[0, 0, 0, 0, 1, 0xff, 0, 0, 0, 1])).is_err());
        assert!(decode_request(id(&[1, 0, 0, 0, 1, b'k', 0, 0])).is_err());
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
