//! [`TopicAppender`]: appends through the runtime, in transactions of their own, batched: what
//! the process appends at the same moment goes to the server as one statement and one commit
//! (group commit, as for leases). Every append goes through the batching task, which sends a
//! lone one as the single statement.
//!
//! Appending inside your own transaction (the outbox) is the core's
//! [`TopicTable::append`](pgcoord::topic::TopicTable::append); this is for events that need no
//! transaction of yours. An append whose answer was lost (the connection failed after sending)
//! reports the error, and may have been made: asking again may append it twice.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::topic::{Cursor, MAX_EVENTS_PER_STATEMENT, TopicTable};
use pgcoord::{Pool, Result};
use tokio::sync::oneshot;

use crate::batch::{Batcher, RunBatch, WRITES_BATCH_FROM, shared_error};

/// Append `body` to `topic`; answers the event's cursor (`Coordinator::append`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Cursor>")]
pub(crate) struct Append {
    pub(crate) topic: String,
    pub(crate) body: Vec<u8>,
}

impl Append {
    /// `body`, as it is, to `topic`.
    pub(crate) fn new(topic: impl Into<String>, body: impl Into<Vec<u8>>) -> Append {
        Append {
            topic: topic.into(),
            body: body.into(),
        }
    }

    /// The topic's name and the body's size checked: typed errors.
    pub(crate) fn check(&self) -> Result<()> {
        pgcoord::config::validate_name("topic", self.topic.clone())?;
        if self.body.len() > pgcoord::topic::MAX_BODY_BYTES {
            return Err(pgcoord::Error::new(
                pgcoord::ErrorKind::PayloadTooLarge,
                format!(
                    "an event's body is at most {} bytes",
                    pgcoord::topic::MAX_BODY_BYTES
                ),
            ));
        }
        Ok(())
    }
}

/// One append waiting for its batch.
struct AppendItem {
    append: Append,
    reply: oneshot::Sender<Result<Cursor>>,
}

/// What a batch needs to run.
struct AppendRunner {
    table: Arc<TopicTable>,
    pool: Pool,
}

impl RunBatch<AppendItem> for AppendRunner {
    async fn run(&self, batch: Vec<AppendItem>) {
        // A caller that left before its batch was sent gets nothing appended.
        let batch: Vec<AppendItem> = batch.into_iter().filter(|i| !i.reply.is_closed()).collect();
        let events: Vec<(&str, &[u8])> = (batch.iter())
            .map(|i| (i.append.topic.as_str(), i.append.body.as_slice()))
            .collect();
        let statements = self.pool.statements(None);
        let appended = match events[..] {
            [] => return,
            [(topic, body)] => (self.table.append(&statements, topic, body).await).map(|c| vec![c]),
            _ => self.table.append_many(&statements, &events).await,
        };
        match appended {
            Ok(cursors) => {
                for (item, cursor) in batch.into_iter().zip(cursors) {
                    let _ = item.reply.send(Ok(cursor));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for item in batch {
                    let _ = item.reply.send(Err(shared_error(&error)));
                }
            }
        }
    }
}

/// Appends to durable topics in batches; what [`Coordinator::append`](crate::Coordinator::append) sends to.
pub(crate) struct TopicAppender {
    runner: Arc<AppendRunner>,
    batcher: Option<Batcher<AppendItem>>,
    metrics: Arc<crate::metrics::AppendMetrics>,
}

impl TopicAppender {
    pub(crate) fn new(table: TopicTable, pool: Pool) -> TopicAppender {
        TopicAppender {
            runner: Arc::new(AppendRunner {
                table: Arc::new(table),
                pool,
            }),
            batcher: None,
            metrics: Arc::new(crate::metrics::AppendMetrics::new()),
        }
    }
}

impl Actor for TopicAppender {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Bursts of appends arrive faster than actix's default mailbox of 16.
        ctx.set_mailbox_capacity(4096);
        let max = MAX_EVENTS_PER_STATEMENT;
        self.batcher = Some(Batcher::start(self.runner.clone(), WRITES_BATCH_FROM, max));
    }
}

impl Handler<Append> for TopicAppender {
    type Result = ResponseFuture<Result<Cursor>>;

    fn handle(&mut self, append: Append, _: &mut Context<Self>) -> Self::Result {
        let (runner, batcher) = (self.runner.clone(), self.batcher.clone());
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let appended = appended(runner, batcher, append).await;
            match &appended {
                Ok(_) => metrics.appended.increment(1),
                Err(_) => metrics.failed.increment(1),
            }
            appended
        })
    }
}

/// One append, in the next batch.
async fn appended(
    runner: Arc<AppendRunner>,
    batcher: Option<Batcher<AppendItem>>,
    append: Append,
) -> Result<Cursor> {
    // A bad event is its caller's error, before it can fail a batch of others.
    append.check()?;
    let batcher = batcher.expect("started");
    // Never alone (`WRITES_BATCH_FROM`): a lone append is the batch of one.
    let (_under_way, _) = batcher.enter();
    let (reply, answer) = oneshot::channel();
    if let Err(item) = batcher.submit(AppendItem { append, reply }) {
        let statements = runner.pool.statements(None);
        let append = item.append;
        return runner
            .table
            .append(&statements, &append.topic, &append.body)
            .await;
    }
    answer.await.unwrap_or_else(|_| {
        Err(pgcoord::Error::new(
            pgcoord::ErrorKind::Other,
            "the append batch ended without an answer",
        ))
    })
}

impl Handler<crate::losses::Shutdown> for TopicAppender {
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
