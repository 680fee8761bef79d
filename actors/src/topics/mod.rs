//! [`ConsumerActor`]: a durable topic's named consumer, run by one process of the fleet at a
//! time, delivering every event at least once, in order.
//!
//! The consumer `c` of topic `t` is the lease `"t/consumers/c"`: the process holding it delivers,
//! every other one waits in line for it and takes over, from the stored cursor, when it is
//! released or lost. While it holds the lease, the consumer reads up to a window of events after
//! its cursor, hands them to the handler one at a time (a panic is caught: it
//! is an error), and acks the last one it handled (forward only); after a full window it reads
//! the next one while the handler works. A handler that returns `Err`
//! gets the same event again after a backoff, read again from the stored cursor; one that acks
//! in its own transaction ([`Delivery::ack`], fenced by the lease's token) applies each event
//! exactly once. When it has read everything, it waits for the topic's doorbell
//! (the NOTIFY of an append's commit, through the process's listener), the listener's
//! `Reconnected`, or its poll: a doorbell only wakes it, and a missed one costs a poll.
//! A cursor behind retention stops it with [`pgcoord::ErrorKind::Compacted`].
//!
//! Appends that need no transaction of the caller's go through the `TopicAppender`
//! (`Coordinator::append`), batched; [`TopicRetention`] trims a topic on a timer.
//!
//! The loop itself is plain async code on a task of its own (`run`), which the actor owns: it
//! stops with the actor, releasing the lease. The actor hears the doorbell and answers
//! [`GetStats`] and [`Shutdown`](crate::Shutdown).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::topic::{Cursor, Start, TopicTable};
use pgcoord::{Error, ErrorKind, Pool, Result};
use tokio::sync::Notify;

use crate::GetStats;
use crate::leases::LockManager;
use crate::signals::doorbell::Bell;
use crate::signals::{ConnState, ListenerActor, RawNotification, SubscribeConnState, SubscribeRaw};

mod append;
mod behind;
pub(crate) mod consumer;
pub(crate) mod delivery;
// The in-memory backend's consumer hands over (`handover::handle`) and backs off
// (`run::backoff`) as this one does.
pub(crate) mod handover;
mod retention;
pub(crate) mod run;

pub(crate) use append::{Append, TopicAppender};
pub use consumer::TopicConsumer;
pub use delivery::Delivery;
pub(crate) use delivery::DeliveryContext;
pub use retention::TopicRetention;

/// What the loop shares with its actor.
pub(super) struct Run {
    pub(super) consume: Consume,
    pub(super) lease_name: String,
    pub(super) table: Arc<TopicTable>,
    pub(super) pool: Pool,
    pub(super) locks: Addr<LockManager>,
    pub(super) doorbell: Bell,
    pub(super) stats: Mutex<ConsumerStats>,
    pub(super) metrics: crate::metrics::TopicMetrics,
    pub(super) stopping: Notify,
    /// Set with `stopping`: checked between events.
    pub(super) stop_requested: AtomicBool,
    /// The furthest event this process handed over: one at or before it again is a
    /// redelivery.
    pub(super) handed_through: Mutex<Cursor>,
}

pub(super) fn stats(run: &Run, f: impl FnOnce(&mut ConsumerStats)) {
    f(&mut run.stats.lock().expect("stats lock"));
}

/// What a consumer's handler returns: `Ok` to move on, `Err` (why) to be handed the same event
/// again after a backoff.
pub type ConsumeResult = std::result::Result<(), String>;

/// A consumer's handler: one event at a time, in order.
pub type ConsumeHandler =
    Arc<dyn Fn(Delivery) -> Pin<Box<dyn Future<Output = ConsumeResult> + Send>> + Send + Sync>;

/// What to consume, and how: built with [`Consume::new`], started with
/// [`Coordinator::consume`](crate::Coordinator::consume).
pub struct Consume {
    pub(crate) topic: String,
    pub(crate) consumer: String,
    pub(crate) start: Start,
    pub(crate) window: u32,
    pub(crate) poll: Duration,
    pub(crate) held_back_warning: Duration,
    pub(crate) handler: ConsumeHandler,
}

impl std::fmt::Debug for Consume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consume")
            .field("topic", &self.topic)
            .field("consumer", &self.consumer)
            .field("start", &self.start)
            .field("window", &self.window)
            .field("poll", &self.poll)
            .field("held_back_warning", &self.held_back_warning)
            .finish_non_exhaustive()
    }
}

impl Consume {
    /// Consumer `consumer` of `topic`, handing each event to `handler`. Starts, the first
    /// time this consumer is opened, from the oldest event kept; 100 events per read; polls
    /// every second when no doorbell rings; warns of a transaction that held readers back for a
    /// minute.
    pub fn new<F, Fut>(topic: impl Into<String>, consumer: impl Into<String>, handler: F) -> Consume
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ConsumeResult> + Send + 'static,
    {
        Consume {
            topic: topic.into(),
            consumer: consumer.into(),
            start: Start::Oldest,
            window: 100,
            poll: Duration::from_secs(1),
            held_back_warning: Duration::from_secs(60),
            handler: Arc::new(move |delivery| Box::pin(handler(delivery))),
        }
    }

    /// Where the consumer starts when it is opened for the first time (a stored cursor wins).
    pub fn start(self, start: Start) -> Consume {
        Consume { start, ..self }
    }

    /// How many events one read takes, at most (1 to 10,000): the most held in memory.
    pub fn window(self, window: u32) -> Consume {
        Consume { window, ..self }
    }

    /// How often to look for events when no doorbell rings (at least 10 ms).
    pub fn poll(self, poll: Duration) -> Consume {
        Consume { poll, ..self }
    }

    /// How long a transaction may hold readers back before the caught-up consumer warns of it
    /// (naming its backend and age; at most one warning a minute). Until it ends, no reader
    /// reads past the events appended since it began. The gauge
    /// `pgcoord_topic_held_back_seconds` shows its age whatever this is. Default 60 s.
    pub fn held_back_warning(self, after: Duration) -> Consume {
        Consume {
            held_back_warning: after,
            ..self
        }
    }

    /// The consumer's lease: `"{topic}/consumers/{consumer}"`.
    pub fn lease_name(&self) -> String {
        format!("{}/consumers/{}", self.topic, self.consumer)
    }

    /// Every setting checked: typed errors before anything starts.
    pub(crate) fn check(&self) -> Result<()> {
        for (what, name) in [("topic", &self.topic), ("consumer", &self.consumer)] {
            pgcoord::config::validate_name(what, name.clone())?;
        }
        pgcoord::config::validate_name("consumer lease", self.lease_name())?;
        if !(1..=10_000).contains(&self.window) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a consumer's window is 1 to 10000 events, not {}",
                    self.window
                ),
            ));
        }
        if self.held_back_warning.is_zero() {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                "a consumer's held-back warning comes after a transaction's age above zero",
            ));
        }
        if self.poll < Duration::from_millis(10) {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                format!("a consumer's poll {:?} is shorter than 10 ms", self.poll),
            ));
        }
        Ok(())
    }
}

/// What a consumer has done.
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Events handed to the handler, redeliveries included.
    pub delivered: u64,
    /// Of those, events this process had handed over before (after a handler's `Err`, or after
    /// it lost the lease before their ack).
    pub redelivered: u64,
    /// Handler calls that returned `Err` (each event is handed over again).
    pub handler_errors: u64,
    /// Acks that moved the cursor.
    pub acks: u64,
    /// Pages read from the topic (statements): at the poll, at a doorbell — rings closer
    /// together than 50 ms make one read — and while pages come full.
    pub reads: u64,
    /// Tenures: times this process took the consumer's lease.
    pub tenures: u64,
    /// Whether this process holds the consumer's lease now.
    pub active: bool,
    /// Why the consumer stopped for good, when it did (a cursor behind retention).
    pub failed: Option<String>,
}

/// How long a stopping consumer's handler may take to finish its event.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// A durable topic's consumer in this process; see the module docs. Start it with
/// [`Coordinator::consume`](crate::Coordinator::consume).
pub(crate) struct ConsumerActor {
    run: Arc<Run>,
    signals: Addr<ListenerActor>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ConsumerActor {
    pub(crate) fn new(
        consume: Consume,
        table: TopicTable,
        pool: Pool,
        locks: Addr<LockManager>,
        signals: Addr<ListenerActor>,
    ) -> ConsumerActor {
        let metrics = crate::metrics::TopicMetrics::new(&consume.topic, &consume.consumer);
        ConsumerActor {
            run: Arc::new(Run {
                metrics,
                lease_name: consume.lease_name(),
                consume,
                table: Arc::new(table),
                pool,
                locks,
                doorbell: Bell::default(),
                stats: Mutex::default(),
                stopping: Notify::new(),
                stop_requested: AtomicBool::new(false),
                handed_through: Mutex::new(pgcoord::topic::Cursor::START),
            }),
            signals,
            task: None,
        }
    }
}

impl Actor for ConsumerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let me = ctx.address();
        self.signals.do_send(SubscribeRaw {
            channel: self.run.table.channel().to_owned(),
            recipient: me.clone().recipient(),
        });
        self.signals
            .do_send(SubscribeConnState(me.recipient::<ConnState>()));
        self.task = Some(tokio::spawn(run::run(self.run.clone())));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Stopped as the System ends (a `Runtime` shut down with the consumer running), the
        // tokio runtime is going away with its tasks: the run's task ends with it, and its
        // lease lapses or was released by the manager's own shutdown.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(task) = self.task.take() {
                task.abort();
            }
            return;
        };
        if let Some(finished) = self.finish() {
            runtime.spawn(finished);
        }
    }
}

impl ConsumerActor {
    /// Asks the run to stop: it finishes the event in hand, acks it and releases the lease as it
    /// ends; a handler that takes longer than 30 s is cut off (its event comes again). `None`
    /// when it was asked already.
    fn finish(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let task = self.task.take()?;
        self.run.stop_requested.store(true, Ordering::Relaxed);
        self.run.stopping.notify_one();
        let abort = task.abort_handle();
        Some(async move {
            if tokio::time::timeout(STOP_WITHIN, task).await.is_err() {
                tracing::warn!("a topic consumer's handler did not finish within 30 s");
                abort.abort();
            }
        })
    }
}

impl Handler<RawNotification> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, notification: RawNotification, _: &mut Context<Self>) {
        // The payload names the topic (the channel is the table's): only a hint of whose ring it
        // is. A forged one rings as a real one does; one dropped here is as good as lost.
        if notification.payload == self.run.consume.topic {
            self.run.doorbell.ring();
        }
    }
}

impl Handler<ConnState> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, state: ConnState, _: &mut Context<Self>) {
        // Doorbells may have been missed while the listener was away.
        if state.may_have_missed(self.run.table.channel()) {
            self.run.doorbell.ring();
        }
    }
}

impl Handler<GetStats<ConsumerStats>> for ConsumerActor {
    type Result = ConsumerStats;

    fn handle(&mut self, _: GetStats<ConsumerStats>, _: &mut Context<Self>) -> ConsumerStats {
        self.run.stats.lock().expect("stats lock").clone()
    }
}

/// Stops the consumer, answering once its run has ended: the event in hand finished and acked,
/// the lease released (or the handler cut off after 30 s).
impl Handler<crate::losses::Shutdown> for ConsumerActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: crate::losses::Shutdown, _: &mut Context<Self>) -> Self::Result {
        let finished = self.finish();
        let ended = async move {
            if let Some(finished) = finished {
                finished.await;
            }
        };
        Box::pin(ended.into_actor(self).map(|(), _, ctx| ctx.stop()))
    }
}
