//! A pool's durable mail: messages to a key's worker that survive crashes and moves, at least
//! once and in order.
//!
//! A message to key `k` of pool `p` is an event of the durable topic [`mail_topic`]`(p, k)`,
//! appended in the sender's own transaction ([`TopicTable::append`]: it exists if and only if
//! that commits) or through the runtime's batching [`Append`](crate::Append). The member that
//! holds `k` reads its keys' topics from the pool's cursor in each (the consumer named after the
//! pool) — one statement for all its idle keys, at every tick and at each append's doorbell —
//! and hands the events to `k`'s worker one at a time, in order, as [`Mail`]. When the worker
//! answers `Ok` the member acks (the cursor moves past it); on `Err`, a stopped worker or a lost
//! lease it stops there, and the event comes again, to this member or the key's next holder.
//! For effects applied exactly once, the worker acks in its own transaction with [`Mail::ack`],
//! fenced by the key's lease. A doorbell only wakes the reader; a lost one costs a tick.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;
use pgcoord::Result;
use pgcoord::topic::{Cursor, Event, Pending, Start, TopicTable};
use tracing::{debug, warn};

use super::{Mail, StopWorker, WorkerPool, mail_topic};
use crate::signals::{
    ConnState, DOORBELL_GAP, ListenerActor, RawNotification, SubscribeConnState, SubscribeRaw,
};
use crate::topics::{Acker, Delivery, Tenure};

/// The most events of one key read at once.
const WINDOW: u32 = 100;
/// The most keys one read statement takes.
const KEYS_PER_READ: usize = 1_000;

/// Hands one [`Mail`] to a worker: made where the worker's `Handler<Mail>` is known.
type SendMail<W> =
    Rc<dyn Fn(&Addr<W>, Mail) -> LocalBoxFuture<'static, std::result::Result<(), String>>>;

/// A durable pool's mail reading: see the module docs.
pub(super) struct Mailing<W: Actor> {
    table: Arc<TopicTable>,
    db: pgcoord::Pool,
    listener: Addr<ListenerActor>,
    send: SendMail<W>,
    /// Keys read or delivered now: a read skips them, so a worker never gets a message twice at
    /// once, and a key's messages go one at a time, in order.
    busy: HashSet<String>,
    /// Busy keys asked for again meanwhile (a doorbell rang during their read, whose snapshot
    /// may have missed its mail): read again once idle, not a tick later.
    rang: HashSet<String>,
    /// Keys whose next read a doorbell asked for.
    ringing: HashSet<String>,
    /// Keys a doorbell's read found nothing for, and when: anyone can NOTIFY, so a doorbell for
    /// one within [`DOORBELL_GAP`] is put off to the gap's end, and a flood costs a read per
    /// gap. A doorbell that brought mail lets the next one read at once.
    quiet: HashMap<String, Instant>,
    /// Keys whose put-off read is scheduled.
    put_off: HashSet<String>,
    /// Read statements so far.
    pub(super) reads: u64,
    /// Keys whose cursor row this process made sure of (an ack needs it).
    opened: HashSet<String>,
    /// Keys warned of as behind retention (once each).
    compacted: HashSet<String>,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker> + Handler<Mail>,
{
    /// Delivers each key's durable mail ([`mail_topic`]) to its worker, at least once and in
    /// order, through `coordinator`'s pool and listener (see [`Mail`]). Every process's pool of
    /// the name should be durable, or the mail of the keys one holds waits until another does.
    pub fn durable(mut self, coordinator: &crate::Coordinator) -> WorkerPool<W> {
        let send: SendMail<W> = Rc::new(|worker: &Addr<W>, mail: Mail| {
            let handled = worker.send(mail);
            Box::pin(async move {
                match handled.await {
                    Ok(result) => result,
                    Err(_) => Err("the worker stopped before answering".to_owned()),
                }
            })
        });
        self.mailing = Some(Mailing {
            table: Arc::new(TopicTable::new(coordinator.config())),
            db: coordinator.pool().clone(),
            listener: coordinator.signals.clone(),
            send,
            busy: HashSet::new(),
            rang: HashSet::new(),
            ringing: HashSet::new(),
            quiet: HashMap::new(),
            put_off: HashSet::new(),
            reads: 0,
            opened: HashSet::new(),
            compacted: HashSet::new(),
        });
        self
    }
}

/// How one key's delivery ended.
enum Delivered {
    /// Every event handed over was handled (and acked): read on.
    Done,
    /// The worker answered `Err`, or stopped: the event comes again after a pause.
    Failed,
    /// Another process stored the key's cursor first: read again from it.
    Moved,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    /// Listens for the mail's doorbell (and the listener's reconnects, after which doorbells may
    /// have been missed).
    pub(super) fn start_mail(&mut self, ctx: &mut Context<Self>) {
        if let Some(mailing) = &self.mailing {
            mailing.listener.do_send(SubscribeRaw {
                channel: mailing.table.channel().to_owned(),
                recipient: ctx.address().recipient(),
            });
            (mailing.listener).do_send(SubscribeConnState(ctx.address().recipient()));
        }
    }

    /// Reads the mail of `keys` that are held here (not lost) and idle, and delivers what came.
    pub(super) fn read_mail(&mut self, ctx: &mut Context<Self>, keys: Vec<String>) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        let running = &self.running;
        let (keys, busy): (Vec<String>, Vec<String>) = (keys.into_iter())
            .filter(|k| running.get(k).is_some_and(|r| r.lease.loss().is_none()))
            .partition(|k| !mailing.busy.contains(k));
        mailing.rang.extend(busy);
        mailing.busy.extend(keys.iter().cloned());
        let (table, db) = (mailing.table.clone(), mailing.db.clone());
        mailing.reads += keys.len().div_ceil(KEYS_PER_READ) as u64;
        for keys in keys.chunks(KEYS_PER_READ) {
            let keys = keys.to_vec();
            let topics: Vec<String> = keys.iter().map(|k| mail_topic(&self.name, k)).collect();
            let (table, db, pool) = (table.clone(), db.clone(), self.name.clone());
            let read = async move {
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                (table.read_pending(&db.idempotent(None), &pool, &topics, WINDOW)).await
            };
            ctx.spawn(read.into_actor(self).map(move |found, pool, ctx| {
                pool.mail_read(ctx, keys, found);
            }));
        }
    }

    fn mail_read(
        &mut self,
        ctx: &mut Context<Self>,
        keys: Vec<String>,
        found: Result<Vec<Pending>>,
    ) {
        let prefix = mail_topic(&self.name, "");
        let mut delivering = HashSet::new();
        match found {
            Err(e) => {
                warn!(pool.name = %self.name, error = %e, "cannot read the keys' mail; trying again at the next tick")
            }
            Ok(found) => {
                for pending in found {
                    let Some(key) = pending.topic.strip_prefix(&prefix).map(str::to_owned) else {
                        continue;
                    };
                    match pending.events {
                        Ok(events) if !events.is_empty() => {
                            if self.deliver_mail(ctx, &key, pending.from, events) {
                                delivering.insert(key);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            let mailing = self.mailing.as_mut().expect("reading mail");
                            if mailing.compacted.insert(key.clone()) {
                                warn!(pool.name = %self.name, worker.key = %key, error = %e, "the key's mail is behind retention: none is delivered until its cursor is reset");
                            }
                        }
                    }
                }
            }
        }
        if let Some(mailing) = self.mailing.as_mut() {
            let now = Instant::now();
            mailing.quiet.retain(|_, at| now - *at < DOORBELL_GAP);
            for key in &keys {
                if delivering.contains(key) {
                    mailing.quiet.remove(key);
                } else if mailing.ringing.remove(key) {
                    mailing.quiet.insert(key.clone(), now);
                }
            }
        }
        let idle: Vec<String> = (keys.into_iter())
            .filter(|k| !delivering.contains(k))
            .collect();
        self.idle_mail(ctx, idle);
    }

    /// A doorbell for `key`'s mail: read it now, or at the gap's end after one that found
    /// nothing (see `Mailing::quiet`).
    fn ring_mail(&mut self, ctx: &mut Context<Self>, key: String) {
        // Only keys held here are read: nothing is kept for the others, whatever is rung.
        let (Some(mailing), true) = (self.mailing.as_mut(), self.running.contains_key(&key)) else {
            return;
        };
        let wait = (mailing.quiet.get(&key)).map_or(Duration::ZERO, |at| {
            DOORBELL_GAP.saturating_sub(at.elapsed())
        });
        if wait.is_zero() {
            mailing.ringing.insert(key.clone());
            return self.read_mail(ctx, vec![key]);
        }
        if mailing.put_off.insert(key.clone()) {
            ctx.run_later(wait, move |pool, ctx| {
                if let Some(mailing) = pool.mailing.as_mut() {
                    mailing.put_off.remove(&key);
                    mailing.quiet.remove(&key);
                }
                pool.ring_mail(ctx, key);
            });
        }
    }

    /// `keys` are read and delivered for now; those asked for meanwhile are read again.
    fn idle_mail(&mut self, ctx: &mut Context<Self>, keys: Vec<String>) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        let mut again = Vec::new();
        for key in keys {
            mailing.busy.remove(&key);
            if mailing.rang.remove(&key) {
                again.push(key);
            }
        }
        // Rung during their read: read again as a doorbell says (put off after a read that
        // found nothing).
        for key in again {
            self.ring_mail(ctx, key);
        }
    }

    /// Hands `events` of `key`'s mail to its worker, one at a time; acks through the last one
    /// handled. False when there is no worker to hand them to now (the next read tries again).
    fn deliver_mail(
        &mut self,
        ctx: &mut Context<Self>,
        key: &str,
        from: Cursor,
        events: Vec<Event>,
    ) -> bool {
        let Some(worker) = self.awake_worker(key) else {
            return false;
        };
        let Some(lease) = self.running.get(key).map(|r| r.lease.clone()) else {
            return false;
        };
        let mailing = self.mailing.as_ref().expect("reading mail");
        let topic = mail_topic(&self.name, key);
        let (table, db, send) = (
            mailing.table.clone(),
            mailing.db.clone(),
            mailing.send.clone(),
        );
        let metrics = self.metrics.mail.clone();
        let open = !mailing.opened.contains(key);
        let tenure = Arc::new(Tenure {
            topic: topic.clone(),
            consumer: self.name.clone(),
            acker: Acker::Table(table.clone()),
            lease: lease.clone(),
        });
        let key = key.to_owned();
        let delivery = {
            let key = key.clone();
            async move {
                let pool = &tenure.consumer;
                if open {
                    // The cursor row first, where this read began: an ack moves only a row.
                    let at = (table.open_consumer(
                        &db.idempotent(None),
                        &topic,
                        pool,
                        Start::After(from),
                    ))
                    .await;
                    match at {
                        Ok(at) if at == from => {}
                        Ok(_) => return (Delivered::Moved, true),
                        Err(e) => {
                            debug!(error = %e, "opening a key's mail cursor");
                            return (Delivered::Failed, false);
                        }
                    }
                }
                let mut handled = None;
                let mut ended = Delivered::Done;
                for event in events {
                    if lease.loss().is_some() {
                        break;
                    }
                    let cursor = event.cursor;
                    if let Ok(lag) = std::time::SystemTime::now().duration_since(event.appended_at)
                    {
                        metrics.lag.record(lag.as_secs_f64());
                    }
                    let mail = Mail {
                        key: key.clone(),
                        delivery: Delivery {
                            event,
                            tenure: tenure.clone(),
                        },
                    };
                    match send(&worker, mail).await {
                        Ok(()) => {
                            metrics.handled.increment(1);
                            handled = Some(cursor);
                        }
                        Err(why) => {
                            metrics.failed.increment(1);
                            debug!(worker.key = %key, %cursor, error = %why, "mail not handled; it comes again");
                            ended = Delivered::Failed;
                            break;
                        }
                    }
                }
                if let Some(cursor) = handled {
                    // A failed ack only means the handled mail comes again.
                    let acked = table.ack(&db.idempotent(None), &topic, pool, cursor).await;
                    if let Err(e) = acked {
                        warn!(worker.key = %key, error = %e, "cannot ack the key's mail; it comes again");
                    }
                }
                (ended, true)
            }
        };
        ctx.spawn(
            delivery
                .into_actor(self)
                .map(move |(ended, opened), pool, ctx| {
                    let Some(mailing) = pool.mailing.as_mut() else {
                        return;
                    };
                    mailing.busy.remove(&key);
                    // Read again now or after the pause below: a doorbell meanwhile is covered.
                    mailing.rang.remove(&key);
                    if opened {
                        mailing.opened.insert(key.clone());
                    }
                    match ended {
                        Delivered::Done | Delivered::Moved => pool.read_mail(ctx, vec![key]),
                        Delivered::Failed => {
                            // Again after a pause, not in a tight loop on a failing worker.
                            ctx.run_later(FAILED_PAUSE, move |pool, ctx| {
                                pool.read_mail(ctx, vec![key])
                            });
                        }
                    }
                }),
        );
        true
    }
}

/// How long a key whose worker failed a message waits before it is handed over again.
const FAILED_PAUSE: Duration = Duration::from_millis(200);

impl<W> Handler<RawNotification> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ();

    fn handle(&mut self, notification: RawNotification, ctx: &mut Context<Self>) {
        if self.is_doorbell(&notification.channel) {
            return self.rung(ctx);
        }
        // The payload is the topic's name: only this pool's mail topics concern it.
        let prefix = mail_topic(&self.name, "");
        if let Some(key) = notification.payload.strip_prefix(&prefix) {
            self.ring_mail(ctx, key.to_owned());
        }
    }
}

impl<W> Handler<ConnState> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    type Result = ();

    fn handle(&mut self, state: ConnState, ctx: &mut Context<Self>) {
        if matches!(state, ConnState::Reconnected) {
            let keys = self.running.keys().cloned().collect();
            self.read_mail(ctx, keys);
        }
    }
}
