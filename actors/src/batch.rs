//! Group commit: what one actor has in flight at the same moment goes to the server as one
//! statement, as renewals already do — a `LockManager`'s first acquire attempts and releases
//! (`leases::batch`), a `TopicAppender`'s appends (`topics::append`), a `ListenerActor`'s
//! notifications (`signals::notify`).
//!
//! A caller hands its item to a [`Batcher`] and waits for its own answer. The batcher takes
//! whatever has queued while earlier batches were in flight (at most [`MAX_BATCH`], and at most
//! [`IN_FLIGHT`] batches at once), so an idle manager sends a lone item at once and a busy one
//! sends fewer, larger statements: one round trip and one commit for many callers. A batch of
//! one goes as the single statement. A notification with nothing else under way skips the
//! batching task ([`NOTIFY_BATCH_FROM`]); lease requests and appends always take it
//! ([`WRITES_BATCH_FROM`]). An item the batch could not settle (a row another transaction holds,
//! say) is done alone by its caller, so every caller gets exactly the answer a single statement
//! would give.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pgcoord::Error;
use tokio::sync::{Semaphore, mpsc};

/// The most items in one statement (fewer for acquires and releases:
/// `pgcoord::lease::MAX_NAMES_PER_STATEMENT`).
pub(crate) const MAX_BATCH: usize = 1000;

/// How many items must be under way at once before they are batched, for lease requests and
/// topic appends: one, so every acquire attempt, release and append goes through the batching
/// task, which sends a batch of one as the single statement. Callers woken together by the answer to one batch then queue together
/// (see `collect`), so 8 closed-loop clients move in batches of 8 (measured, docs/BENCHMARKS.md:
/// 0.6–0.7× the time of the unbatched floor on 8 connections, where sending a request alone
/// whenever nothing else was under way made a third of them single statements and ran 1.2–1.5×
/// slower than the floor). Appends the same: 8 callers 2.5–3.0× the raw floor's rate, against
/// 1.9–2.4× when a lone append went alone. A lone caller pays one more task hop.
pub(crate) const WRITES_BATCH_FROM: usize = 1;

/// The same for notifications: two, so a lone publish (a request, a reply) goes at once on its
/// own connection, and only a burst is batched.
pub(crate) const NOTIFY_BATCH_FROM: usize = 2;

/// The most batches in flight at once: enough to keep a connection busy while the next batch
/// fills, few enough that batches do form.
pub(crate) const IN_FLIGHT: usize = 2;

/// Runs one batch and answers each of its items.
pub(crate) trait RunBatch<I>: Send + Sync + 'static {
    /// Sends `batch` (never empty) and answers every item in it.
    fn run(&self, batch: Vec<I>) -> impl Future<Output = ()> + Send;
}

/// Sends items in batches. Cheap to clone; the batching task ends when every clone is dropped
/// (with the manager) and the batches in flight are answered.
pub(crate) struct Batcher<I> {
    queue: mpsc::UnboundedSender<I>,
    /// Items under way, batched or alone.
    under_way: Arc<AtomicUsize>,
    /// Below this many items under way, an item goes alone without the batching task.
    batch_from: usize,
}

impl<I> Clone for Batcher<I> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
            under_way: self.under_way.clone(),
            batch_from: self.batch_from,
        }
    }
}

/// Marks an item as under way while it lives.
pub(crate) struct UnderWay(Arc<AtomicUsize>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<I: Send + 'static> Batcher<I> {
    /// Starts the batching task on the current tokio runtime; below `batch_from` items under
    /// way, items go alone ([`WRITES_BATCH_FROM`], [`NOTIFY_BATCH_FROM`]); at most `max` items
    /// (at most [`MAX_BATCH`]) go in one batch.
    pub(crate) fn start(
        runner: Arc<impl RunBatch<I>>,
        batch_from: usize,
        max: usize,
    ) -> Batcher<I> {
        let (queue, items) = mpsc::unbounded_channel();
        tokio::spawn(collect(items, runner, max.clamp(1, MAX_BATCH)));
        Batcher {
            queue,
            under_way: Arc::default(),
            batch_from,
        }
    }

    /// Marks an item as under way; true when fewer than the batcher's `batch_from` are, so it
    /// goes alone at once instead of through a batch.
    pub(crate) fn enter(&self) -> (UnderWay, bool) {
        let before = self.under_way.fetch_add(1, Ordering::Relaxed);
        (
            UnderWay(self.under_way.clone()),
            before + 1 < self.batch_from,
        )
    }

    /// Queues `item` for the next batch; gives it back when the batching task is gone.
    pub(crate) fn submit(&self, item: I) -> Result<(), I> {
        self.queue.send(item).map_err(|e| e.0)
    }
}

/// Takes what has queued, up to a batch, whenever a batch may start.
async fn collect<I: Send + 'static, R: RunBatch<I>>(
    mut items: mpsc::UnboundedReceiver<I>,
    runner: Arc<R>,
    max: usize,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = items.recv().await else {
            return;
        };
        // Callers woken together (by the answer to one batch) are ready to run on this thread
        // now: one pass of the scheduler lets them queue before the batch is taken.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < max {
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

/// The items of `batch` that share a statement: a lone item, and an item whose name came
/// earlier in the batch (a statement must not touch a row twice; one manager's callers take turns
/// per name, so that is a safeguard), are handed to `alone` instead. `None` when nothing is left
/// to share.
pub(crate) fn to_share<I>(
    batch: Vec<I>,
    name: impl Fn(&I) -> &str,
    mut alone: impl FnMut(I),
) -> Option<Vec<I>> {
    if batch.len() == 1 {
        batch.into_iter().for_each(alone);
        return None;
    }
    let mut seen = HashSet::new();
    let mut shared = Vec::with_capacity(batch.len());
    for item in batch {
        if seen.insert(name(&item).to_owned()) {
            shared.push(item);
        } else {
            alone(item);
        }
    }
    Some(shared)
}

/// One caller's copy of an error a whole batch got.
pub(crate) fn shared_error(error: &Arc<Error>) -> Error {
    Error::new(error.kind(), error.to_string()).with_source(error.clone())
}
