//! `listen` and `notify`: pgcoord's envelopes on the command line, as JSON.

use futures_util::future::poll_fn;
use pgcoord::ident::Ident;
use pgcoord::payload::PayloadTable;
use pgcoord::signal::{self, Envelope, Kind};
use pgcoord::{Config, Error, ErrorKind, Result};
use serde_json::json;
use tokio_postgres::{AsyncMessage, Client};

/// The payload as JSON: decoded from MessagePack when it is, else as hex.
fn payload_json(bytes: &[u8]) -> serde_json::Value {
    match rmp_serde::from_slice::<serde_json::Value>(bytes) {
        Ok(value) => value,
        Err(_) => json!({ "hex": bytes.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    }
}

/// A LISTEN under way: the session, and the messages its connection hears.
pub struct Listening {
    _client: Client,
    channel: Ident,
    messages: Messages,
    driver: tokio::task::JoinHandle<()>,
}

type Messages = tokio::sync::mpsc::UnboundedReceiver<
    std::result::Result<(String, String), tokio_postgres::Error>,
>;

/// Connects and LISTENs on `channel` (the part of `listen` bounded by `--timeout`).
pub async fn start_listening(config: &Config, channel: &str) -> Result<Listening> {
    let channel = Ident::new(channel)?;
    let (client, mut connection) = pgcoord::db::connect_as(config, "listen").await?;
    let (tx, messages) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(Ok((n.channel().to_owned(), n.payload().to_owned())));
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", channel.quoted()))
        .await?;
    Ok(Listening {
        _client: client,
        channel,
        messages,
        driver,
    })
}

/// `listen CHANNEL`: one JSON line per message, until `count` messages or the connection ends.
pub async fn listen(config: &Config, listening: Listening, count: Option<usize>) -> Result<()> {
    let Listening {
        _client,
        channel,
        mut messages,
        driver,
    } = listening;
    let store = PayloadTable::new(config, pgcoord::db::pool(config));
    eprintln!("listening on {channel}");
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let (on, text) = match messages.recv().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(Error::new(ErrorKind::Unavailable, "the connection ended"));
            }
        };
        let line = match Envelope::decode(&text) {
            Ok(envelope) => match signal::open(&envelope, Some(&store)).await {
                Ok(payload) => json!({
                    "channel": on,
                    "id": envelope.id,
                    "kind": format!("{:?}", envelope.kind).to_lowercase(),
                    "bytes": payload.len(),
                    "payload": payload_json(&payload),
                }),
                Err(e) => json!({ "channel": on, "id": envelope.id, "error": e.to_string() }),
            },
            Err(_) => json!({ "channel": on, "not_an_envelope": text }),
        };
        println!("{line}");
        seen += 1;
    }
    driver.abort();
    Ok(())
}

/// `notify CHANNEL JSON`: the JSON as MessagePack in an event envelope (through the payload
/// store when large), so pgcoord's subscribers decode it like any event.
pub async fn notify(config: &Config, client: &Client, channel: &str, json: &str) -> Result<()> {
    let channel = Ident::new(channel)?;
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!("the message is not JSON: {e}"),
        )
    })?;
    let payload = signal::to_payload(&value)?;
    let store = PayloadTable::new(config, pgcoord::db::pool(config));
    let envelope = Envelope::new(Kind::Event, Vec::new());
    let id = envelope.id;
    let text = signal::seal(envelope, payload, Some(&store), config.inline_limit()).await?;
    signal::notify(client, &channel, &text).await?;
    println!("sent message {id} on {channel}");
    Ok(())
}
