//! [`TopicConsumer`]: the handle of a consumer started in this process, on either backend.

use actix::prelude::*;
use pgcoord::Result;

use super::{ConsumerActor, ConsumerStats};
use crate::losses::Shutdown;
use crate::seam::BoxFuture;

/// A durable topic's consumer running in this process, from
/// [`Coordinator::consume`](crate::Coordinator::consume), on either backend: it delivers while
/// it holds the consumer's lease, and waits for it otherwise. Dropping the handle does not stop
/// it ([`stop`](Self::stop) does, or the System's end).
#[derive(Clone)]
pub struct TopicConsumer {
    running: std::sync::Arc<dyn Consumer>,
}

/// What a started consumer answers, on each backend: the consumer actor on PostgreSQL.
pub(crate) trait Consumer: Send + Sync {
    /// What it has done so far.
    fn stats(&self) -> BoxFuture<Result<ConsumerStats>>;
    /// Stops it; done when the future is.
    fn stop(&self) -> BoxFuture<()>;
}

impl Consumer for Addr<ConsumerActor> {
    fn stats(&self) -> BoxFuture<Result<ConsumerStats>> {
        let stats = self.send(crate::GetStats::new());
        Box::pin(async move {
            stats.await.map_err(|e| {
                pgcoord::Error::new(
                    pgcoord::ErrorKind::Unavailable,
                    format!("the consumer stopped: {e}"),
                )
            })
        })
    }

    fn stop(&self) -> BoxFuture<()> {
        let stopped = self.send(Shutdown);
        Box::pin(async move {
            let _ = stopped.await;
        })
    }
}

impl TopicConsumer {
    pub(crate) fn new(running: std::sync::Arc<dyn Consumer>) -> TopicConsumer {
        TopicConsumer { running }
    }

    /// What the consumer has done so far.
    pub async fn stats(&self) -> Result<ConsumerStats> {
        self.running.stats().await
    }

    /// Stops the consumer, and returns once it has stopped: the event in hand finished and
    /// acked, the lease released (a handler still running after 30 s is cut off, its event
    /// handed over again later). Stopping a stopped consumer returns at once.
    pub async fn stop(&self) {
        self.running.stop().await;
    }
}

impl std::fmt::Debug for TopicConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicConsumer").finish_non_exhaustive()
    }
}
