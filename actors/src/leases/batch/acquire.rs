//! Batched first acquire attempts (`LeaseTable::try_acquire_many`).
//!
//! Only the first attempt of an `Acquire` is batched. A name the batch did not grant (held,
//! another waiter first in line, its row locked) is asked again alone, which tells the job Busy or Held exactly as
//! before, so waiting, fairness, deadlines and cancellation keep the single-attempt path's
//! guarantees. Every batch is bounded by the earliest bound among its jobs. When its outcome is
//! unknown (a timeout or a connection failure after sending), each job gets the error and frees
//! any grant it may have got, as after a single attempt. A grant whose job has gone (its caller
//! gave up, its manager stopped) is released here, so no lease is left that nobody holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{LeaseTable, Pool, Result};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::batch::{Batcher, RunBatch, shared_error, to_share};

/// The answer to a first attempt: the attempt's result and when its statement was sent, or
/// `None` when the job should ask alone.
pub(crate) type FirstAttempt = Option<(Result<Attempt>, Instant)>;

/// One first attempt waiting for its batch.
pub(crate) struct AcquireItem {
    name: String,
    data: Option<Bytes>,
    replace_data: bool,
    bound: Instant,
    reply: oneshot::Sender<FirstAttempt>,
}

/// The batcher of a manager's first attempts.
pub(crate) type AcquireBatcher = Batcher<AcquireItem>;

/// What a batch of first attempts needs to run.
pub(crate) struct AcquireRunner {
    pub(crate) pool: Pool,
    pub(crate) table: Arc<LeaseTable>,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    /// The manager's count of acquire statements sent.
    pub(crate) statements_sent: Arc<AtomicU64>,
}

impl AcquireBatcher {
    /// The first attempt at `name`, in a batch with others under way (the caller holds its
    /// [`enter`](Batcher::enter) guard meanwhile). `None`: ask alone.
    pub(crate) async fn first_attempt(
        &self,
        name: &str,
        data: Option<Bytes>,
        replace_data: bool,
        bound: Instant,
    ) -> FirstAttempt {
        let (reply, answer) = oneshot::channel();
        let item = AcquireItem {
            name: name.to_owned(),
            data,
            replace_data,
            bound,
            reply,
        };
        self.submit(item).ok()?;
        answer.await.ok().flatten()
    }
}

impl RunBatch<AcquireItem> for AcquireRunner {
    async fn run(&self, batch: Vec<AcquireItem>) {
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
        let bound = batch.iter().map(|i| i.bound).min().expect("not empty");
        let requests: Vec<AcquireRequest<'_>> = batch
            .iter()
            .map(|i| AcquireRequest {
                name: &i.name,
                data: i.data.as_deref(),
                replace_data: i.replace_data,
            })
            .collect();
        let statements = self.pool.statements(Some(bound));
        let sent = Instant::now();
        let granted = pgcoord::db::retry(|| {
            self.statements_sent.fetch_add(1, Ordering::Relaxed);
            self.table
                .try_acquire_many(&statements, &requests, &self.owner, self.lease)
        })
        .await;
        debug!(size = batch.len(), ok = granted.is_ok(), "acquire batch");
        match granted {
            Ok(mut granted) => {
                for item in batch {
                    let Some(grant) = granted.remove(&item.name) else {
                        let _ = item.reply.send(None);
                        continue;
                    };
                    let token = grant.token;
                    let answer = Some((Ok(Attempt::Granted(grant)), sent));
                    if item.reply.send(answer).is_err() {
                        self.release_unclaimed(item.name, token);
                    }
                }
            }
            Err(error) => {
                // Every job learns the batch's fate; each frees what it may have been granted.
                let error = Arc::new(error);
                for item in batch {
                    let _ = item.reply.send(Some((Err(shared_error(&error)), sent)));
                }
            }
        }
    }
}

impl AcquireRunner {
    /// Releases a grant whose job is gone.
    fn release_unclaimed(&self, name: String, token: i64) {
        let (pool, table, owner) = (self.pool.clone(), self.table.clone(), self.owner.clone());
        tokio::spawn(async move {
            let statements = pool.statements(None);
            match table
                .release(&statements, &name, &owner, token, false)
                .await
            {
                Ok(()) => debug!(lease = %name, "grant nobody waited for released"),
                Err(e) => {
                    warn!(lease = %name, error = %e, "cannot release a grant nobody waited for; it expires on its own")
                }
            }
        });
    }
}
