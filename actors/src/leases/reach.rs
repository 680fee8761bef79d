//! Reaching a lease's holder: a message NOTIFYed to whoever holds a lease now, decided by the
//! lease table's row in the same statement ([`LeaseTable::notify_holder`]). What many callers
//! send at the same moment goes as one statement, one commit (group commit, see
//! `crate::batch`): NOTIFYing commits are serialised database-wide, so one each would make
//! many senders wait on one another. Used by `KeyRouter`.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::{Error, ErrorKind, LeaseTable, Pool, Result};
use tokio::sync::oneshot;

use super::LockManager;
use crate::batch::{Batcher, RunBatch, shared_error};

/// Asks a lock manager for its [`HolderReach`]: its lock table's name, and a sender sharing
/// the manager's pool and statements.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "HolderReach")]
pub(crate) struct GetHolderReach;

/// Sends to leases' holders through one manager's pool. Cheap to clone.
#[derive(Clone)]
pub(crate) struct HolderReach {
    /// The lock table's name, quoted and qualified as the statements use it: what scopes a
    /// routed pool's channels to the deployment whose leases they serve.
    pub(crate) lock_table: String,
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

impl HolderReach {
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

impl HolderReach {
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

impl Handler<GetHolderReach> for LockManager {
    type Result = MessageResult<GetHolderReach>;

    fn handle(&mut self, _: GetHolderReach, _: &mut Context<Self>) -> Self::Result {
        // Made on first use: its batching task needs the runtime, which the handler runs on.
        let reach = self.reach.get_or_insert_with(|| {
            let runner = Arc::new(Runner {
                pool: self.pool.clone(),
                table: self.table.clone(),
            });
            HolderReach {
                lock_table: self.config.lock_table().quoted(),
                batcher: Batcher::start(
                    runner.clone(),
                    crate::batch::NOTIFY_BATCH_FROM,
                    crate::batch::MAX_BATCH,
                ),
                runner,
            }
        });
        MessageResult(reach.clone())
    }
}
