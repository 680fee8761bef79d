//! [`TopicRetention`]: a topic's retention on a timer — every tick, the events its
//! [`Retention`] no longer keeps are deleted in batches (`TopicTable::trim`), at most
//! [`MAX_BATCHES_PER_TICK`] of a thousand, so one tick's work is bounded. Several processes may
//! run it for one topic: trims only delete, and the mark only moves forward.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::topic::{Retention, TopicTable};
use pgcoord::{Pool, Result};
use tracing::{debug, warn};

/// Events deleted per statement.
const BATCH: u32 = 1_000;
/// Statements per tick at most: a backlog of old events is worked off over several ticks.
pub(crate) const MAX_BATCHES_PER_TICK: u32 = 100;

/// Keeps one topic to its retention; started by
/// [`Coordinator::retain`](crate::Coordinator::retain).
pub struct TopicRetention {
    trimmer: Arc<Trimmer>,
    every: Duration,
    /// A tick's trim is under way: the next tick does not start another.
    busy: bool,
}

struct Trimmer {
    table: TopicTable,
    pool: Pool,
    topic: String,
    retention: Retention,
}

impl Trimmer {
    /// Up to [`MAX_BATCHES_PER_TICK`] statements, until one deletes less than a batch.
    async fn trim(&self) -> Result<u64> {
        let mut deleted = 0;
        for _ in 0..MAX_BATCHES_PER_TICK {
            // Each statement bounded on its own: a tick may outlast the statement timeout.
            let statements = self.pool.statements(None);
            let n = (self.table)
                .trim(&statements, &self.topic, self.retention, BATCH)
                .await?;
            deleted += n;
            if n < u64::from(BATCH) {
                break;
            }
        }
        Ok(deleted)
    }
}

impl TopicRetention {
    pub(crate) fn new(
        table: TopicTable,
        pool: Pool,
        topic: String,
        retention: Retention,
        every: Duration,
    ) -> TopicRetention {
        TopicRetention {
            trimmer: Arc::new(Trimmer {
                table,
                pool,
                topic,
                retention,
            }),
            every,
            busy: false,
        }
    }
}

impl Actor for TopicRetention {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |act, ctx| {
            if act.busy {
                return;
            }
            act.busy = true;
            let trimmer = act.trimmer.clone();
            let trim = async move { trimmer.trim().await };
            ctx.spawn(trim.into_actor(act).map(|result, act, _| {
                act.busy = false;
                let topic = &act.trimmer.topic;
                match result {
                    Ok(n) => debug!(%topic, deleted = n, "topic trimmed"),
                    Err(e) => warn!(%topic, error = %e, "cannot trim the topic; next tick"),
                }
            }));
        });
    }
}

impl Handler<crate::RunNow> for TopicRetention {
    type Result = ResponseFuture<Result<u64>>;

    fn handle(&mut self, _: crate::RunNow, _: &mut Context<Self>) -> Self::Result {
        let trimmer = self.trimmer.clone();
        Box::pin(async move { trimmer.trim().await })
    }
}

impl Handler<crate::losses::Shutdown> for TopicRetention {
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
