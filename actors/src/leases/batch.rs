//! Group commit for acquires: the first attempts a `LockManager` has in flight at the same moment
//! go to the server as one statement (`LeaseTable::try_acquire_many`), as renewals already do.
//!
//! A job hands its first attempt to the [`Batcher`] and waits for its own answer. The batcher
//! takes whatever has queued while earlier batches were in flight (at most [`MAX_BATCH`], and at
//! most [`IN_FLIGHT`] batches at once), so an idle manager sends a lone attempt at once and a busy
//! one sends fewer, larger statements: one round trip and one commit for many callers. While
//! fewer than [`BATCH_FROM`] first attempts are under way, each goes alone, without the batcher:
//! batching pays for bursts, not for a few concurrent callers. Only the
//! first attempt is batched. A name the batch did not grant (held, reserved, its row locked) is
//! asked again alone, which tells the job Busy or Held exactly as before, so waiting, fairness,
//! deadlines and cancellation keep the single-attempt path's guarantees. A lone attempt is not
//! batched at all: the job asks alone at once.
//!
//! Every batch is bounded by the earliest bound among its jobs. When its outcome is unknown (a
//! timeout or a connection failure after sending), each job gets the error and frees any grant
//! it may have got, as after a single attempt. A grant whose job has gone (its caller gave up,
//! its manager stopped) is released here, so no lease is left that nobody holds.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{Error, LeaseTable, Pool, Result};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::{debug, warn};

/// The most first attempts in one statement.
pub(crate) const MAX_BATCH: usize = 1000;

/// How many first attempts must be under way at once before they are batched. Below it each goes
/// alone, on its own pooled connection: measured on a 2-core machine with `fsync=off`, a few
/// concurrent callers (8 clients in a loop) ran about a third slower batched than alone, since
/// their statements already run side by side; a burst (a worker pool claiming its keys) gains
/// by orders of magnitude (docs/BENCHMARKS.md).
pub(crate) const BATCH_FROM: usize = 16;

/// The most batches in flight at once: enough to keep a connection busy while the next batch
/// fills, few enough that batches do form.
pub(crate) const IN_FLIGHT: usize = 2;

/// The answer to a first attempt: the attempt's result and when its statement was sent, or
/// `None` when the job should ask alone.
pub(crate) type FirstAttempt = Option<(Result<Attempt>, Instant)>;

/// One first attempt waiting for its batch.
struct Item {
    name: String,
    data: Option<Bytes>,
    replace_data: bool,
    bound: Instant,
    reply: oneshot::Sender<FirstAttempt>,
}

/// Sends first attempts in batches. Cheap to clone; the batching task ends when every clone is
/// dropped (with the manager) and the batches in flight are answered.
#[derive(Clone)]
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Item>,
    /// First attempts under way, batched or alone.
    under_way: Arc<AtomicUsize>,
}

/// Marks a first attempt as under way while it lives.
pub(crate) struct UnderWay(Arc<AtomicUsize>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a batch needs to run.
struct Runner {
    pool: Pool,
    table: Arc<LeaseTable>,
    owner: String,
    lease: std::time::Duration,
    statements_sent: Arc<AtomicU64>,
}

impl Batcher {
    /// Starts the batching task on the current tokio runtime.
    pub(crate) fn start(
        pool: Pool,
        table: Arc<LeaseTable>,
        owner: String,
        lease: std::time::Duration,
        statements_sent: Arc<AtomicU64>,
    ) -> Batcher {
        let (queue, items) = mpsc::unbounded_channel();
        let runner = Arc::new(Runner {
            pool,
            table,
            owner,
            lease,
            statements_sent,
        });
        tokio::spawn(collect(items, runner));
        Batcher {
            queue,
            under_way: Arc::default(),
        }
    }

    /// Marks a first attempt as under way; true when fewer than [`BATCH_FROM`] are, so it goes
    /// alone at once instead of through a batch.
    pub(crate) fn enter(&self) -> (UnderWay, bool) {
        let before = self.under_way.fetch_add(1, Ordering::Relaxed);
        (UnderWay(self.under_way.clone()), before + 1 < BATCH_FROM)
    }

    /// The first attempt at `name`, in a batch with others under way (the caller holds its
    /// [`enter`](Self::enter) guard meanwhile). `None`: ask alone.
    pub(crate) async fn first_attempt(
        &self,
        name: &str,
        data: Option<Bytes>,
        replace_data: bool,
        bound: Instant,
    ) -> FirstAttempt {
        let (reply, answer) = oneshot::channel();
        let item = Item {
            name: name.to_owned(),
            data,
            replace_data,
            bound,
            reply,
        };
        if self.queue.send(item).is_err() {
            return None;
        }
        answer.await.ok().flatten()
    }
}

/// Takes what has queued, up to a batch, whenever a batch may start.
async fn collect(mut items: mpsc::UnboundedReceiver<Item>, runner: Arc<Runner>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = items.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match items.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let runner = runner.clone();
        tokio::spawn(async move {
            runner.run(batch).await;
            drop(permit);
        });
    }
}

impl Runner {
    async fn run(&self, mut batch: Vec<Item>) {
        if batch.len() == 1 {
            // Alone: the single statement tells Busy and Held apart; nothing to share.
            let _ = batch.pop().expect("one").reply.send(None);
            return;
        }
        // A name twice (never from one manager's jobs, which take turns per name) would make the
        // statement touch a row twice: the repeats ask alone.
        let mut seen = HashSet::new();
        let (batch, repeats): (Vec<Item>, Vec<Item>) =
            batch.into_iter().partition(|i| seen.insert(i.name.clone()));
        for repeat in repeats {
            let _ = repeat.reply.send(None);
        }
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
                    let own =
                        Error::new(error.kind(), error.to_string()).with_source(error.clone());
                    let _ = item.reply.send(Some((Err(own), sent)));
                }
            }
        }
    }

    /// Releases a grant whose job is gone.
    fn release_unclaimed(&self, name: String, token: i64) {
        let (pool, table) = (self.pool.clone(), self.table.clone());
        tokio::spawn(async move {
            let statements = pool.statements(None);
            match table.release(&statements, &name, token, false).await {
                Ok(()) => debug!(lease = %name, "grant nobody waited for released"),
                Err(e) => {
                    warn!(lease = %name, error = %e, "cannot release a grant nobody waited for; it expires on its own")
                }
            }
        });
    }
}
