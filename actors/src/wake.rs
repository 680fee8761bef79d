//! Wake-ups for waiters: a FIFO turn per lock name, and the LISTEN connection that hears
//! releases from every process.
//!
//! Only the first local waiter for a name talks to the database; the others wait their turn in
//! the FIFO of a `tokio::sync::Mutex`, so a process sends one attempt per wake-up however many
//! of its tasks wait. Releases are announced with NOTIFY on the lease channel; the listener
//! wakes the waiting name. Notifications can be missed (while reconnecting, say), so waiters
//! also wake at the holder's expiry and on a polling fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::poll_fn;
use pgcoord::Config;
use pgcoord::ident::Ident;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;
use tracing::{debug, warn};

/// The local queue of one lock name.
#[derive(Default)]
pub(crate) struct NameQueue {
    /// Held by the one waiter whose turn it is.
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Signalled when the lease may have become free.
    pub(crate) wake: Notify,
}

/// Every name with local waiters.
#[derive(Default)]
pub(crate) struct Queues {
    names: Mutex<HashMap<String, Arc<NameQueue>>>,
}

impl Queues {
    /// The queue of `name`, created on first use.
    pub(crate) fn join(&self, name: &str) -> Arc<NameQueue> {
        let mut names = self.names.lock().expect("queues lock");
        names.entry(name.to_owned()).or_default().clone()
    }

    /// Forgets `name`'s queue once nobody else waits in it.
    pub(crate) fn leave(&self, name: &str, queue: Arc<NameQueue>) {
        let mut names = self.names.lock().expect("queues lock");
        // One reference in the map, one in `queue`: nobody else.
        if Arc::strong_count(&queue) == 2 {
            names.remove(name);
        }
    }

    /// Wakes the waiter whose turn it is for `name`, if any.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(queue) = self.names.lock().expect("queues lock").get(name) {
            queue.wake.notify_one();
        }
    }

    /// Wakes every name's waiter: notifications may have been missed.
    pub(crate) fn wake_all(&self) {
        for queue in self.names.lock().expect("queues lock").values() {
            queue.wake.notify_one();
        }
    }
}

/// Listens on `channel` on a dedicated connection, waking waiters for every released name,
/// and reconnects with backoff when the connection ends. Runs until aborted.
pub(crate) fn spawn_listener(
    config: Config,
    channel: Ident,
    queues: Arc<Queues>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let started = std::time::Instant::now();
            match listen(&config, &channel, &queues).await {
                Ok(()) => debug!(%channel, "lease listener connection closed"),
                Err(e) if failures.is_power_of_two() || failures == 0 => {
                    warn!(%channel, error = %e, "lease listener connection failed; waiters fall back to polling until it is back")
                }
                Err(_) => {}
            }
            // A connection that worked for a while starts the count again.
            failures = if started.elapsed() > Duration::from_secs(5) {
                1
            } else {
                failures + 1
            };
            tokio::time::sleep(pgcoord::db::backoff(failures)).await;
        }
    })
}

async fn listen(config: &Config, channel: &Ident, queues: &Queues) -> pgcoord::Result<()> {
    let (client, mut connection) = pgcoord::db::connect_as(config, "lease waker").await?;
    // The connection must be polled for LISTEN to complete, so drive it concurrently.
    let driver = async {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message? {
                AsyncMessage::Notification(n) => queues.wake(n.payload()),
                AsyncMessage::Notice(n) => debug!(notice = %n, "lease listener notice"),
                _ => {}
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    };
    let subscribe = async {
        let sql = format!("LISTEN {}", channel.quoted());
        let listen = client.batch_execute(&sql);
        tokio::time::timeout(config.statement_timeout(), listen)
            .await
            .map_err(|_| {
                pgcoord::Error::new(
                    pgcoord::ErrorKind::Unavailable,
                    "LISTEN not confirmed in time",
                )
            })??;
        // Releases announced while we were not listening were missed: everyone retries.
        queues.wake_all();
        std::future::pending::<pgcoord::Result<()>>().await
    };
    tokio::select! {
        ended = driver => Ok(ended?),
        failed = subscribe => failed,
    }
}
