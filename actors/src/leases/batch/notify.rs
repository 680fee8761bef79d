//! Notices to leases' holders: a message NOTIFYed to whoever holds a lease now, decided by the
//! lease table's row in the same statement ([`LeaseTable::notify_holder`]). What many callers
//! send at the same moment goes as one statement, one commit (group commit, see
//! `crate::batch`): NOTIFYing commits are serialised database-wide, so one each would make
//! many senders wait on one another. Used by the routers (`crate::workers::reach`).

use std::sync::Arc;

use pgcoord::{Error, ErrorKind, LeaseTable, Pool, Result};
use tokio::sync::oneshot;

use crate::batch::{Batcher, RunBatch, shared_error};

/// Sends to leases' holders through one manager's pool. Cheap to clone.
#[derive(Clone)]
pub(crate) struct HolderNotices {
    batcher: Batcher<Item>,
    runner: Arc<Runner>,
}

/// One message waiting for its batch.
struct Item {
    name: String,
    scope: String,
    text: String,
    reply: oneshot::Sender<Result<Option<String>>>,
}

struct Runner {
    pool: Pool,
    table: Arc<LeaseTable>,
}

impl HolderNotices {
    /// Notices through `pool` to the holders of `table`'s leases. Needs the runtime (its
    /// batching task).
    pub(crate) fn start(pool: Pool, table: Arc<LeaseTable>) -> HolderNotices {
        let runner = Arc::new(Runner { pool, table });
        HolderNotices {
            batcher: Batcher::start(
                runner.clone(),
                crate::batch::NOTIFY_BATCH_FROM,
                crate::batch::MAX_BATCH,
            ),
            runner,
        }
    }

    /// Sends `text` to the holder of lease `name` on its channel for `scope`: the holder's
    /// owner, or `None` when nobody holds it (nothing was sent). After an error the message
    /// may or may not have gone. Bounded by the statement timeout.
    pub(crate) async fn notify(
        &self,
        name: String,
        scope: String,
        text: String,
    ) -> Result<Option<String>> {
        let (_under_way, alone) = self.batcher.enter();
        if alone {
            return self.runner.alone(&name, &scope, &text).await;
        }
        let (reply, answer) = oneshot::channel();
        let item = Item {
            name,
            scope,
            text,
            reply,
        };
        match self.batcher.submit(item) {
            // Unanswered only when the batching task ended with the batch unsent.
            Ok(()) => answer.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Unavailable,
                    "the lock manager stopped",
                ))
            }),
            Err(item) => self.runner.alone(&item.name, &item.scope, &item.text).await,
        }
    }
}

impl HolderNotices {
    /// Records lease `name` as a free, kept row when it has none
    /// ([`LeaseTable::keep_free`]), then rings `channel` (an empty NOTIFY: a doorbell, it
    /// grants nothing) so whoever takes such names looks now. Idempotent; bounded by the
    /// statement timeout.
    pub(crate) async fn record_and_ring(&self, name: &str, channel: &str) -> Result<()> {
        let runner = &self.runner;
        runner
            .table
            .keep_free(&runner.pool.idempotent(None), name)
            .await?;
        let channel = pgcoord::ident::Ident::channel(channel)?;
        pgcoord::signal::notify(&runner.pool.statements(None), &channel, "").await
    }
}

impl Runner {
    async fn alone(&self, name: &str, scope: &str, text: &str) -> Result<Option<String>> {
        // Not retried: the NOTIFY may have been sent.
        (self.table)
            .notify_holder(&self.pool.statements(None), name, scope, text)
            .await
    }
}

impl RunBatch<Item> for Runner {
    async fn run(&self, mut batch: Vec<Item>) {
        if batch.len() == 1 {
            let item = batch.pop().expect("one");
            let sent = self.alone(&item.name, &item.scope, &item.text).await;
            let _ = item.reply.send(sent);
            return;
        }
        let items: Vec<(&str, &str, &str)> = batch
            .iter()
            .map(|i| (i.name.as_str(), i.scope.as_str(), i.text.as_str()))
            .collect();
        let sent = (self.table)
            .notify_holders(&self.pool.statements(None), &items)
            .await
            .map_err(Arc::new);
        match sent {
            Ok(holders) if holders.len() == batch.len() => {
                for (item, holder) in batch.into_iter().zip(holders) {
                    let _ = item.reply.send(Ok(holder));
                }
            }
            Ok(_) => {
                let wrong =
                    Error::new(ErrorKind::Other, "a batch of messages to holders lost rows");
                let wrong = Arc::new(wrong);
                for item in batch {
                    let _ = item.reply.send(Err(shared_error(&wrong)));
                }
            }
            Err(e) => {
                for item in batch {
                    let _ = item.reply.send(Err(shared_error(&e)));
                }
            }
        }
    }
}
