//! Sending messages (events, requests, replies): seal the payload — through the store when it is
//! large — and NOTIFY, alone or in one statement with the other notifications the listener has
//! under way at the same moment (group commit, see `crate::batch`): a burst of publishes costs a
//! few round trips, not one each.
//!
//! A notification is not repeated once it may have run: a second NOTIFY would deliver the message
//! twice. When a batch's outcome is unknown (its connection failed after sending), every sender
//! in it gets the error, as a single NOTIFY's sender would (at most once).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pgcoord::ident::Ident;
use pgcoord::payload::PayloadStore;
use pgcoord::signal::{self, Envelope};
use pgcoord::{Pool, Result};
use tokio::sync::oneshot;
use tracing::debug;

use crate::batch::{Batcher, RunBatch, shared_error};

/// One notification waiting for its batch.
pub(crate) struct Notification {
    channel: Ident,
    text: String,
    reply: oneshot::Sender<Result<()>>,
}

/// Sends a listener's notifications, alone or in batches. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Notifier {
    batcher: Batcher<Notification>,
    runner: Arc<NotifyRunner>,
}

pub(crate) struct NotifyRunner {
    pool: Pool,
    /// The listener's count of NOTIFY statements sent.
    statements_sent: Arc<AtomicU64>,
}

impl Notifier {
    /// Starts the batching task on the current tokio runtime.
    pub(crate) fn start(pool: Pool, statements_sent: Arc<AtomicU64>) -> Notifier {
        let runner = Arc::new(NotifyRunner {
            pool,
            statements_sent,
        });
        Notifier {
            batcher: Batcher::start(
                runner.clone(),
                crate::batch::NOTIFY_BATCH_FROM,
                crate::batch::MAX_BATCH,
            ),
            runner,
        }
    }

    /// Sends `text` on `channel`. Bounded by the statement timeout.
    async fn notify(&self, channel: Ident, text: String) -> Result<()> {
        let (_under_way, alone) = self.batcher.enter();
        if alone {
            return self.runner.alone(&channel, &text).await;
        }
        let (reply, answer) = oneshot::channel();
        let item = Notification {
            channel,
            text,
            reply,
        };
        match self.batcher.submit(item) {
            // Unanswered only when the batching task ended with the batch unsent.
            Ok(()) => answer.await.unwrap_or_else(|_| {
                Err(pgcoord::Error::new(
                    pgcoord::ErrorKind::Unavailable,
                    "the listener's notifier stopped",
                ))
            }),
            Err(item) => self.runner.alone(&item.channel, &item.text).await,
        }
    }

    /// Seals `payload` into `envelope` (through `store` when large) and sends it on `channel`.
    pub(crate) async fn send(
        &self,
        store: Option<&dyn PayloadStore>,
        channel: Ident,
        envelope: Envelope,
        payload: Vec<u8>,
        inline_limit: usize,
    ) -> Result<()> {
        let text = signal::seal(envelope, payload, store, inline_limit).await?;
        self.notify(channel, text).await
    }
}

impl NotifyRunner {
    async fn alone(&self, channel: &Ident, text: &str) -> Result<()> {
        self.statements_sent.fetch_add(1, Ordering::Relaxed);
        // A connection found dead before sending is replaced (see `Pool::checkout`).
        signal::notify(&self.pool.statements(None), channel, text).await
    }
}

impl RunBatch<Notification> for NotifyRunner {
    async fn run(&self, mut batch: Vec<Notification>) {
        if batch.len() == 1 {
            let item = batch.pop().expect("one");
            let _ = item.reply.send(self.alone(&item.channel, &item.text).await);
            return;
        }
        let messages: Vec<(&Ident, &str)> = batch
            .iter()
            .map(|n| (&n.channel, n.text.as_str()))
            .collect();
        self.statements_sent.fetch_add(1, Ordering::Relaxed);
        let sent = signal::notify_many(&self.pool.statements(None), &messages).await;
        debug!(size = batch.len(), ok = sent.is_ok(), "notify batch");
        let sent = sent.map_err(Arc::new);
        for item in batch {
            let _ = item
                .reply
                .send(sent.as_ref().map(|_| ()).map_err(shared_error));
        }
    }
}
