//! Batched first acquire attempts (`LeaseTable::try_acquire_many`).
//!
//! Only the first attempt of an `Acquire` is batched. A name a batch of several did not grant
//! is answered as refused, and its wait asks again alone, in line; a batch of one is handed
//! back to be sent alone. A batch is bounded by the statement timeout, not by its waits'
//! deadlines: a wait whose deadline comes first leaves it. An unknown outcome goes to every
//! wait, which frees what it may have been granted. A wait that left is not sent, and a grant
//! whose wait has gone is released here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{LeaseTable, Pool, Result};
use tokio::sync::oneshot;
use tracing::debug;

use super::super::counters::Counters;
use super::super::held::OnRelease;
use crate::batch::{Batcher, RunBatch, shared_error, to_share};
use crate::leases::Acquire;

/// The answer to a first attempt: when its statement was sent and its result, or `None` when
/// the wait should ask alone.
pub(crate) type FirstAttempt = Option<(Instant, Result<Attempt>)>;

/// One first attempt waiting for its batch.
pub(crate) struct AcquireItem {
    name: String,
    data: Option<Bytes>,
    replace_data: bool,
    /// Whether a grant nobody takes is released keeping its row, as its holder would have.
    on_release: OnRelease,
    reply: oneshot::Sender<FirstAttempt>,
}

/// The batcher of a manager's first attempts.
pub(crate) type AcquireBatcher = Batcher<AcquireItem>;

/// What a batch of first attempts needs to run.
pub(crate) struct AcquireRunner {
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Duration,
    pub(crate) counters: Arc<Counters>,
    /// Releases a grant whose wait has gone.
    pub(crate) releaser: super::release::Releaser,
}

impl AcquireBatcher {
    /// The first attempt of `request`, in a batch with others under way, bounded by the
    /// statement timeout. `None`: ask alone.
    pub(crate) async fn first_attempt(&self, request: &Acquire) -> FirstAttempt {
        let _under_way = self.enter();
        let (reply, answer) = oneshot::channel();
        let item = AcquireItem {
            name: request.name.clone(),
            data: request.data.clone(),
            replace_data: request.replace_data,
            on_release: request.on_release,
            reply,
        };
        self.submit(item).ok()?;
        answer.await.ok().flatten()
    }
}

impl RunBatch<AcquireItem> for AcquireRunner {
    async fn run(&self, batch: Vec<AcquireItem>) {
        // Waits that left meanwhile are not asked for.
        let batch: Vec<AcquireItem> = batch.into_iter().filter(|i| !i.reply.is_closed()).collect();
        if batch.is_empty() {
            return;
        }
        // Alone, the single statement tells Busy and Held apart.
        let Some(batch) = to_share(
            batch,
            |i| &i.name,
            |i| {
                let _ = i.reply.send(None);
            },
        ) else {
            return;
        };
        let requests: Vec<AcquireRequest<'_>> = batch
            .iter()
            .map(|i| AcquireRequest {
                name: &i.name,
                data: i.data.as_deref(),
                replace_data: i.replace_data,
                // A batch takes no place in line.
                priority: 0,
            })
            .collect();
        let statements = self.pool.statements(None);
        let owner = self.table.owner(&self.owner).expect("a configured owner");
        let sent = Instant::now();
        let granted = pgcoord::__private::retry(|| {
            Counters::add(&self.counters.acquire_statements);
            owner.try_acquire_many(&statements, &requests, self.lease)
        })
        .await;
        debug!(size = batch.len(), ok = granted.is_ok(), "acquire batch");
        match granted {
            Ok(mut granted) => {
                for item in batch {
                    let Some(grant) = granted.remove(&item.name) else {
                        let _ = item.reply.send(Some((sent, Ok(Attempt::Held(None)))));
                        continue;
                    };
                    let token = grant.token;
                    let answer = Some((sent, Ok(Attempt::Granted(grant))));
                    if item.reply.send(answer).is_err() {
                        let name = Arc::from(item.name.as_str());
                        let what = "a grant whose wait has gone";
                        (self.releaser).release_in_background(name, token, item.on_release, what);
                    }
                }
            }
            Err(error) => {
                // Every job learns the batch's fate; each frees what it may have been granted.
                let error = Arc::new(error);
                for item in batch {
                    let _ = item.reply.send(Some((sent, Err(shared_error(&error)))));
                }
            }
        }
    }
}
