//! Signals: the envelope every notification carries, its text encoding, and NOTIFY.
//!
//! NOTIFY carries text of fewer than 8,000 bytes, and anyone can NOTIFY any channel, so every
//! message is an [`Envelope`]: versioned, with an id, a kind (event, request, reply), the reply
//! channel of a request, the payload inline or as a payload-store key, and an error for failed
//! replies. The envelope is MessagePack (`rmp_serde::to_vec_named`, so fields travel by name) and
//! then mapped to text byte by byte: bytes 0x01–0x7f stay as they are, 0x00 and 0x80–0xff become
//! the characters U+0100 and U+0080–U+00FF (two UTF-8 bytes each). That is exact in both
//! directions and costs nothing for the ASCII that dominates typical MessagePack, where base64
//! would add a third. [`Envelope::encode`] measures the result in bytes against
//! [`NOTIFY_LIMIT`]. Anything on a channel that does not decode is garbage, reported as an error
//! for the listener to log and skip.

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tracing::instrument;

use crate::error::{Error, ErrorKind, Result};
use crate::ident::Ident;

/// PostgreSQL's limit: a notification payload must be shorter than this many bytes.
pub const NOTIFY_LIMIT: usize = 8000;

/// The envelope version this crate writes and reads.
pub const ENVELOPE_VERSION: u8 = 1;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Kind {
    /// Published to every subscriber; no reply.
    Event,
    /// Answered by one handler with a reply on the envelope's `reply_to` channel.
    Request,
    /// The answer to a request, correlated by `id`.
    Reply,
}

/// Where the payload is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Body {
    /// In the envelope itself.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// In the payload store, under this key.
    Stored(String),
}

/// One message on a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Envelope {
    /// The format version, [`ENVELOPE_VERSION`].
    pub v: u8,
    /// Random id; a reply carries its request's id.
    pub id: u64,
    /// Event, request or reply.
    pub kind: Kind,
    /// For requests: the channel the reply goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The payload, inline or by key.
    pub body: Body,
    /// For replies: the handler's error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Envelope {
    /// An envelope of `kind` with an inline payload and a fresh random id.
    pub fn new(kind: Kind, payload: Vec<u8>) -> Envelope {
        Envelope {
            v: ENVELOPE_VERSION,
            id: new_id(),
            kind,
            reply_to: None,
            body: Body::Inline(payload),
            error: None,
        }
    }

    /// The notification text, or [`ErrorKind::PayloadTooLarge`] when it would reach
    /// [`NOTIFY_LIMIT`] bytes.
    pub fn encode(&self) -> Result<String> {
        let text = to_text(&self.to_bytes()?);
        if text.len() >= NOTIFY_LIMIT {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "encoded envelope is {} bytes; notifications must be under {NOTIFY_LIMIT}",
                    text.len()
                ),
            ));
        }
        Ok(text)
    }

    /// The length of [`encode`](Self::encode)'s text in bytes, whatever its size.
    pub fn encoded_len(&self) -> Result<usize> {
        Ok(self
            .to_bytes()?
            .iter()
            .map(|&b| if b == 0 || b >= 0x80 { 2 } else { 1 })
            .sum())
    }

    fn to_bytes(&self) -> Result<Vec<u8>> {
        rmp_serde::to_vec_named(self).map_err(|e| {
            Error::new(ErrorKind::Other, format!("cannot encode envelope: {e}")).with_source(e)
        })
    }

    /// Parses notification text; an error for anything that is not a valid envelope of a known
    /// version.
    pub fn decode(text: &str) -> Result<Envelope> {
        let garbage =
            |why: String| Error::new(ErrorKind::Other, format!("not a pgcoord envelope: {why}"));
        let bytes = from_text(text).ok_or_else(|| garbage("unexpected character".into()))?;
        let envelope: Envelope =
            rmp_serde::from_slice(&bytes).map_err(|e| garbage(e.to_string()))?;
        if envelope.v != ENVELOPE_VERSION {
            return Err(garbage(format!("unknown version {}", envelope.v)));
        }
        Ok(envelope)
    }
}

/// A random message id whose eight bytes are all in 0x01..=0x7f: MessagePack always writes it
/// as a 9-byte uint64 and the text mapping keeps each byte at one character, so every envelope's
/// encoded size depends on its payload alone. 56 random bits.
pub fn new_id() -> u64 {
    (crate::backoff::random_u64() & 0x7f7f_7f7f_7f7f_7f7f) | 0x0101_0101_0101_0101
}

fn to_text(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            0 => '\u{100}',
            b => char::from(b),
        })
        .collect()
}

fn from_text(text: &str) -> Option<Vec<u8>> {
    text.chars()
        .map(|c| match c as u32 {
            0x100 => Some(0),
            n @ 1..=0xff => Some(n as u8),
            _ => None,
        })
        .collect()
}

/// Sends `text` on `channel` with `pg_notify` (channel and text bound as parameters).
#[instrument(skip(client, text), fields(bytes = text.len()), level = "debug")]
pub async fn notify(
    client: &impl crate::statement::Statements,
    channel: &Ident,
    text: &str,
) -> Result<()> {
    client
        .run(
            "SELECT pg_notify($1, $2)::text",
            &[(&channel.as_str(), Type::TEXT), (&text, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// Sends each `(channel, text)` with `pg_notify`, in order, in one statement (one transaction):
/// listeners receive them in this order, after the commit. PostgreSQL delivers identical
/// `(channel, text)` pairs of one transaction once; envelopes carry random ids, so theirs differ.
#[instrument(skip_all, fields(messages = messages.len()), level = "debug")]
pub async fn notify_many(
    client: &impl crate::statement::Statements,
    messages: &[(&Ident, &str)],
) -> Result<()> {
    let channels: Vec<&str> = messages.iter().map(|(c, _)| c.as_str()).collect();
    let texts: Vec<&str> = messages.iter().map(|(_, t)| *t).collect();
    // The notifications are sent after the sort (a volatile function in the select list is
    // evaluated after ORDER BY), so in the order given.
    client
        .run(
            "SELECT pg_notify(n.channel, n.text)::text
             FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS n(channel, text, position)
             ORDER BY n.position",
            &[(&channels, Type::TEXT_ARRAY), (&texts, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(())
}

/// Encodes a serde value as MessagePack with named fields.
pub fn to_payload<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    rmp_serde::to_vec_named(value).map_err(|e| {
        Error::new(ErrorKind::Other, format!("cannot encode payload: {e}")).with_source(e)
    })
}

/// Decodes a MessagePack payload.
pub fn from_payload<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        Error::new(ErrorKind::Other, format!("cannot decode payload: {e}")).with_source(e)
    })
}

/// Wraps `payload` in `envelope` and encodes it, moving the payload to `store` when it is larger
/// than `inline_limit` or the encoded envelope would reach [`NOTIFY_LIMIT`]. Without a store, an
/// oversize payload is [`ErrorKind::PayloadTooLarge`] and nothing is sent.
#[instrument(skip_all, fields(bytes = payload.len()), level = "debug")]
pub async fn seal(
    envelope: Envelope,
    payload: Vec<u8>,
    store: Option<&dyn crate::payload::PayloadStore>,
    inline_limit: usize,
) -> Result<String> {
    if payload.len() > inline_limit {
        return store_and_encode(envelope, payload, store).await;
    }
    let inline = Envelope {
        body: Body::Inline(payload),
        ..envelope
    };
    match inline.encode() {
        Err(e) if e.kind() == ErrorKind::PayloadTooLarge => {
            let Body::Inline(payload) = inline.body else {
                unreachable!("built inline above")
            };
            store_and_encode(
                Envelope {
                    body: Body::Stored(String::new()),
                    ..inline
                },
                payload,
                store,
            )
            .await
        }
        encoded => encoded,
    }
}

async fn store_and_encode(
    mut envelope: Envelope,
    payload: Vec<u8>,
    store: Option<&dyn crate::payload::PayloadStore>,
) -> Result<String> {
    let size = payload.len();
    let Some(store) = store else {
        return Err(Error::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "payload of {size} bytes does not fit in a notification and no payload store is configured"
            ),
        ));
    };
    envelope.body = Body::Stored(store.put(payload).await?);
    envelope.encode()
}

/// The payload of `envelope`, fetched from `store` when it travelled by key.
pub async fn open(
    envelope: &Envelope,
    store: Option<&dyn crate::payload::PayloadStore>,
) -> Result<Vec<u8>> {
    match (&envelope.body, store) {
        (Body::Inline(payload), _) => Ok(payload.clone()),
        (Body::Stored(key), Some(store)) => store.get(key).await,
        (Body::Stored(key), None) => Err(Error::new(
            ErrorKind::NotFound,
            format!("payload {key:?} is in a payload store, and none is configured"),
        )),
    }
}

/// `pg_notify(channel, payload)` as text, for a statement's SQL (both are SQL expressions), or
/// `NULL` in poll-only mode ([`Config::poll_only`](crate::Config::poll_only)), where no statement
/// notifies: the statement is the same otherwise, and its channel parameter goes unused (typed
/// when prepared).
pub(crate) fn notify_sql(config: &crate::Config, channel: &str, payload: &str) -> String {
    match config.poll_only() {
        true => "NULL::text".to_owned(),
        false => format!("pg_notify({channel}, {payload})::text"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_mapping_round_trips_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = to_text(&bytes);
        assert!(!text.contains('\0'));
        assert_eq!(from_text(&text).unwrap(), bytes);
        assert_eq!(text.len(), 127 + 129 * 2);
    }

    #[test]
    fn envelopes_round_trip_and_are_measured_in_bytes() {
        let mut e = Envelope::new(Kind::Request, "héllo ✓".as_bytes().to_vec());
        e.reply_to = Some("replies".into());
        let text = e.encode().unwrap();
        assert_eq!(text.len(), e.encoded_len().unwrap());
        assert_eq!(Envelope::decode(&text).unwrap(), e);
    }

    #[test]
    fn encoded_size_does_not_depend_on_the_id() {
        let sizes: std::collections::HashSet<usize> = (0..200)
            .map(|_| {
                Envelope::new(Kind::Event, vec![0xff; 10])
                    .encoded_len()
                    .unwrap()
            })
            .collect();
        assert_eq!(sizes.len(), 1);
    }

    #[test]
    fn garbage_is_an_error() {
        for garbage in ["", "hello", "{\"v\":1}", "✓✓✓"] {
            assert!(Envelope::decode(garbage).is_err(), "{garbage:?}");
        }
        let mut e = Envelope::new(Kind::Event, vec![1, 2, 3]);
        e.v = 99;
        assert!(Envelope::decode(&e.encode().unwrap()).is_err());
    }

    #[test]
    fn oversize_envelopes_are_refused() {
        let e = Envelope::new(Kind::Event, vec![b'x'; NOTIFY_LIMIT]);
        assert_eq!(e.encode().unwrap_err().kind(), ErrorKind::PayloadTooLarge);
    }
}
