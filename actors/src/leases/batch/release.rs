//! Releases, batched when a burst is under way (`LeaseTable::release_many`): a worker pool
//! letting go of its keys, a manager stopping with thousands of leases. At most
//! [`MAX_NAMES_PER_STATEMENT`](pgcoord::lease::MAX_NAMES_PER_STATEMENT) a statement: the
//! statement's plan joins its requests to their rows by a nested loop, whose work grows with the
//! square of the names (1,000 a statement made a manager holding 10,000 leases take 2 s to shut
//! down; 32, a quarter of a second).
//!
//! A release the batch did not do (lost, or its row locked by a renewal or a fencing guard) is
//! done alone, which tells its caller `LockLost` or waits for the row. An unknown outcome goes to
//! every caller: a release that may have run is not repeated (a second would say `LockLost`).

use std::sync::Arc;

use pgcoord::lease::ReleaseRequest;
use pgcoord::{LeaseTable, Pool, Result};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::super::counters::Counters;
use super::super::held::OnRelease;
use super::super::under_way::UnderWay;
use crate::batch::{Batcher, RunBatch, shared_error, to_share};

/// One release waiting for its batch; answered `None` when its caller should release alone.
pub(crate) struct ReleaseItem {
    name: Arc<str>,
    token: i64,
    on_release: OnRelease,
    reply: oneshot::Sender<Option<Result<()>>>,
}

/// Sends a manager's releases, alone or in batches. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Releaser {
    batcher: Batcher<ReleaseItem>,
    runner: Arc<ReleaseRunner>,
    /// Each release counts as under way until it is done: a shutdown waits for it.
    under_way: UnderWay,
}

/// What a release needs to run.
pub(crate) struct ReleaseRunner {
    pool: Pool,
    table: Arc<LeaseTable>,
    /// The manager's owner identity: a release matches it as well as the token.
    owner: Arc<str>,
    counters: Arc<Counters>,
}

impl Releaser {
    /// Starts the batching task on the current tokio runtime.
    pub(crate) fn start(
        pool: Pool,
        table: Arc<LeaseTable>,
        owner: Arc<str>,
        counters: Arc<Counters>,
        under_way: UnderWay,
    ) -> Releaser {
        let runner = Arc::new(ReleaseRunner {
            pool,
            table,
            owner,
            counters,
        });
        Releaser {
            batcher: Batcher::start(
                runner.clone(),
                crate::batch::WRITES_BATCH_FROM,
                pgcoord::lease::MAX_NAMES_PER_STATEMENT,
            ),
            runner,
            under_way,
        }
    }

    /// Releases `name` if `token` still holds it (see `LeaseTable::release`): through the
    /// batching task, which shares a statement among the releases under way at once and hands a
    /// batch of one back to be sent alone. Bounded by the statement timeout.
    pub(crate) async fn release(
        &self,
        name: Arc<str>,
        token: i64,
        on_release: OnRelease,
    ) -> Result<()> {
        let _ticket = self.under_way.enter();
        let (_under_way, alone) = self.batcher.enter();
        if !alone {
            let (reply, answer) = oneshot::channel();
            let item = ReleaseItem {
                name: name.clone(),
                token,
                on_release,
                reply,
            };
            if self.batcher.submit(item).is_ok()
                && let Ok(Some(result)) = answer.await
            {
                return result;
            }
        }
        self.runner.release_alone(&name, token, on_release).await
    }
}

impl Releaser {
    /// Releases `name` on a task of its own, for a tenure nobody holds any more (a grant nobody
    /// recorded, a lease past its deadline, a manager stopping): `what` says which in the log
    /// when it fails; gone already is no failure.
    pub(crate) fn release_in_background(
        &self,
        name: Arc<str>,
        token: i64,
        on_release: OnRelease,
        what: &'static str,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(lease.name = %name, what, "no runtime to release it on; it expires on its own");
            return;
        };
        let (releaser, ticket) = (self.clone(), self.under_way.enter());
        runtime.spawn(async move {
            // Counted from now, not from when the task first runs: a shutdown waiting for
            // releases under way cannot miss this one.
            let _ticket = ticket;
            match releaser.release(name.clone(), token, on_release).await {
                Ok(()) => debug!(lease.name = %name, what, "released"),
                Err(e) if e.is_lock_lost() => debug!(lease.name = %name, what, "released already"),
                Err(e) => {
                    warn!(lease.name = %name, what, error = %e, "cannot release it; it expires on its own")
                }
            }
        });
    }
}

impl ReleaseRunner {
    async fn release_alone(&self, name: &str, token: i64, on_release: OnRelease) -> Result<()> {
        Counters::add(&self.counters.release_statements);
        let statements = self.pool.statements(None);
        let request = ReleaseRequest {
            name,
            token,
            keep: on_release.keep,
            announce_always: on_release.announce_always,
        };
        self.owner().release(&statements, &request).await
    }

    fn owner(&self) -> pgcoord::lease::LeaseOwner<'_> {
        self.table.owner(&self.owner).expect("a configured owner")
    }
}

impl RunBatch<ReleaseItem> for ReleaseRunner {
    async fn run(&self, batch: Vec<ReleaseItem>) {
        let Some(batch) = to_share(
            batch,
            |i| &i.name,
            |i| {
                let _ = i.reply.send(None);
            },
        ) else {
            return;
        };
        let requests: Vec<ReleaseRequest<'_>> = batch
            .iter()
            .map(|i| ReleaseRequest {
                name: &i.name,
                token: i.token,
                keep: i.on_release.keep,
                announce_always: i.on_release.announce_always,
            })
            .collect();
        let statements = self.pool.statements(None);
        let owner = self.owner();
        let released = pgcoord::__private::retry(|| {
            Counters::add(&self.counters.release_statements);
            owner.release_many(&statements, &requests)
        })
        .await;
        debug!(size = batch.len(), ok = released.is_ok(), "release batch");
        match released {
            Ok(released) => {
                for item in batch {
                    let done = released.contains(&*item.name);
                    let _ = item.reply.send(done.then_some(Ok(())));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for item in batch {
                    let _ = item.reply.send(Some(Err(shared_error(&error))));
                }
            }
        }
    }
}
