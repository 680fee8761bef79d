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

impl Drop for Listening {
    fn drop(&mut self) {
        // The connection's reader ends with it, at once.
        self.driver.abort();
    }
}

/// Connects and LISTENs on `channel` (the part of `listen` bounded by `--timeout`).
pub async fn start_listening(config: &Config, channel: &str) -> Result<Listening> {
    let channel = Ident::channel(channel)?;
    let (client, mut connection) = pgcoord::__private::connect_as(config, "listen").await?;
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

/// `listen CHANNEL`: one JSON line per message, until `count` messages. A connection that
/// breaks, or stops answering the ping, is replaced; what was sent while it was gone is
/// missed, and a `{"channel": …, "gap": …}` line says so where it happened.
pub async fn listen(config: &Config, listening: Listening, count: Option<usize>) -> Result<()> {
    let mut listening = listening;
    let store = PayloadTable::new(config, pgcoord::Pool::new(config));
    eprintln!("listening on {}", listening.channel);
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let received = tokio::select! {
            received = listening.messages.recv() => received,
            _ = ping.tick() => {
                let answered = tokio::time::timeout(
                    config.statement_timeout(),
                    listening._client.simple_query("SELECT 1"),
                );
                match answered.await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => Some(Err(e)),
                    Err(_) => None,
                }
            }
        };
        let (on, text) = match received {
            Some(Ok(message)) => message,
            lost => {
                let why = match lost {
                    Some(Err(e)) => e.to_string(),
                    _ => "the connection stopped answering".to_owned(),
                };
                listening = reconnect(config, &listening.channel, &why).await;
                let gap = json!({
                    "channel": listening.channel.as_str(),
                    "gap": format!("reconnected after {why}: messages sent meanwhile were missed"),
                });
                println!("{gap}");
                continue;
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
    Ok(())
}

/// How often the listening connection is pinged: a black-holed one raises no error.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// LISTENs again on a new connection, trying until it succeeds (each try bounded by the
/// connect and statement timeouts, waits growing to 5 s between them).
async fn reconnect(config: &Config, channel: &Ident, why: &str) -> Listening {
    eprintln!("listen: connection lost ({why}); reconnecting");
    let mut wait = std::time::Duration::from_millis(100);
    loop {
        let within = config.connect_timeout() + config.statement_timeout();
        match tokio::time::timeout(within, start_listening(config, channel.as_str())).await {
            Ok(Ok(listening)) => {
                eprintln!("listen: listening again on {channel}");
                return listening;
            }
            Ok(Err(e)) => eprintln!("listen: reconnect failed: {e}"),
            Err(_) => eprintln!("listen: reconnect took longer than {within:?}"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_secs(5));
    }
}

/// `notify CHANNEL JSON`: the JSON as MessagePack in an event envelope (through the payload
/// store when large), so pgcoord's subscribers decode it like any event.
pub async fn notify(config: &Config, client: &Client, channel: &str, json: &str) -> Result<()> {
    let channel = Ident::channel(channel)?;
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!("the message is not JSON: {e}"),
        )
    })?;
    let payload = signal::to_payload(&value)?;
    let store = PayloadTable::new(config, pgcoord::Pool::new(config));
    let envelope = Envelope::new(Kind::Event, Vec::new());
    let id = envelope.id;
    let text = signal::seal(envelope, payload, Some(&store), config.inline_limit()).await?;
    signal::notify(client, &channel, &text).await?;
    println!("sent message {id} on {channel}");
    Ok(())
}
