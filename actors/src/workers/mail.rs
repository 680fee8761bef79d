//! A pool's durable mail: messages to a key's worker that survive crashes and moves, at least
//! once and in order.
//!
//! A message to key `k` of pool `p` is an event of the durable topic [`mail_topic`]`(p, k)`,
//! appended in the sender's own transaction ([`TopicTable::append`]: it exists if and only if
//! that commits) or through the runtime's batching `Coordinator::append`. The member that
//! holds `k` reads its keys' topics from the pool's cursor in each (the consumer named after the
//! pool) — one statement for all its idle keys, at every tick and at each append's doorbell —
//! and hands the events to `k`'s worker one at a time, in order, as [`Mail`]. When the worker
//! answers `Ok` the member acks (the cursor moves past it); on `Err`, a stopped worker or a lost
//! lease it stops there, and the event comes again, to this member or the key's next holder.
//! For effects applied exactly once, the worker acks in its own transaction with [`Mail::ack`],
//! fenced by the key's lease. A doorbell only wakes the reader; a lost one costs a tick. Each
//! key's reads go through a doorbell `Gate`: one at a time (a key's mail is read or delivered,
//! never both at once), and a flood of doorbells for a key costs a read per gap.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::topic::{Cursor, Event, Pending, TopicTable};
use tracing::warn;

use super::hand_over::{Delivered, Handing, SendMail, hand_over};
use super::{Mail, Shutdown, WorkerPool, mail_topic};
use crate::signals::doorbell::{Gate, Go};
use crate::signals::{ConnState, ListenerActor, RawNotification, SubscribeConnState, SubscribeRaw};
use crate::topics::DeliveryContext;

/// The most events of one key read at once.
const WINDOW: u32 = 100;
/// The most keys one read statement takes.
const KEYS_PER_READ: usize = 1_000;

/// A durable pool's mail reading: see the module docs.
pub(super) struct Mailing<W: Actor> {
    table: Arc<TopicTable>,
    db: pgcoord::Pool,
    listener: Addr<ListenerActor>,
    send: SendMail<W>,
    /// Each key's reads (a key's read runs until its delivery ends): one at a time, so a worker
    /// never gets a message twice at once and a key's messages go in order; asked for during
    /// one, read again after it; a doorbell after a doorbell's read that found nothing put off.
    /// Forgotten once at rest.
    gates: HashMap<String, Gate>,
    /// Read statements so far.
    reads: u64,
    /// Keys whose cursor row this process made sure of (an ack needs it).
    opened: HashSet<String>,
    /// Keys warned of as behind retention (once each).
    compacted: HashSet<String>,
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown> + Handler<Mail>,
{
    /// Delivers each key's durable mail ([`mail_topic`]) to its worker, at least once and in
    /// order, through `coordinator`'s pool and listener (see [`Mail`]). Every process's pool of
    /// the name should be durable, or the mail of the keys one holds waits until another does.
    /// [`pgcoord::ErrorKind::Unsupported`] on an in-memory coordinator: durable mail is a row
    /// written in the sender's transaction.
    pub fn durable(mut self, coordinator: &crate::Coordinator) -> pgcoord::Result<WorkerPool<W>> {
        let actors = coordinator.actors("durable mail")?;
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
            table: Arc::new(TopicTable::new(&actors.config)),
            db: actors.pool.clone(),
            listener: actors.signals.clone(),
            send,
            gates: HashMap::new(),
            reads: 0,
            opened: HashSet::new(),
            compacted: HashSet::new(),
        });
        Ok(self)
    }
}

impl<W: Actor> Mailing<W> {
    /// Read statements so far.
    pub(super) fn reads(&self) -> u64 {
        self.reads
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
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

    /// Reads the mail of `keys` that are held here (not lost), now or, for those read or
    /// delivered now, once that ends.
    pub(super) fn read_mail(&mut self, ctx: &mut Context<Self>, keys: Vec<String>) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        let keys = (keys.into_iter())
            .filter(|k| self.crew.holds(k))
            .filter(|k| mailing.gates.entry(k.clone()).or_default().ask() == Go::Now)
            .collect();
        self.fetch_mail(ctx, keys);
    }

    /// A doorbell for `key`'s mail: read it now, or at the end of the doorbell's gap.
    fn ring_mail(&mut self, ctx: &mut Context<Self>, key: String) {
        // Only keys held here are read: nothing is kept for the others, whatever is rung.
        let (Some(mailing), true) = (self.mailing.as_mut(), self.crew.contains(&key)) else {
            return;
        };
        let go = mailing
            .gates
            .entry(key.clone())
            .or_default()
            .ring(Instant::now());
        self.mail_go(ctx, key, go);
    }

    /// Does what `key`'s gate says.
    fn mail_go(&mut self, ctx: &mut Context<Self>, key: String, go: Go) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        match go {
            Go::Covered => {}
            Go::At(at) => {
                ctx.run_later(
                    at.saturating_duration_since(Instant::now()),
                    move |pool, ctx| {
                        let gate = (pool.mailing.as_mut()).and_then(|m| m.gates.get_mut(&key));
                        if let Some(go) = gate.map(|gate| gate.due(Instant::now())) {
                            pool.mail_go(ctx, key, go);
                        }
                    },
                );
            }
            Go::Now if self.crew.holds(&key) => self.fetch_mail(ctx, vec![key]),
            // No longer held here: the read is over before it began.
            Go::Now => {
                if let Some(gate) = mailing.gates.get_mut(&key) {
                    let go = gate.finished(false, Instant::now());
                    self.mail_go(ctx, key, go);
                }
            }
        }
    }

    /// Reads `keys`' mail (their gates let them), and delivers what came.
    fn fetch_mail(&mut self, ctx: &mut Context<Self>, keys: Vec<String>) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
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
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        // The keys delivering are read on when their delivery ends; the others' reads are over.
        let now = Instant::now();
        mailing.gates.retain(|_, gate| !gate.at_rest(now));
        let mut next = Vec::new();
        for key in keys.into_iter().filter(|k| !delivering.contains(k)) {
            if let Some(gate) = mailing.gates.get_mut(&key) {
                next.push((gate.finished(false, now), key));
            }
        }
        for (go, key) in next {
            self.mail_go(ctx, key, go);
        }
    }

    /// Hands `events` of `key`'s mail to its worker, one at a time, on a future of the pool's;
    /// acks through the last one handled. False when there is no worker to hand them to now
    /// (the next read tries again).
    fn deliver_mail(
        &mut self,
        ctx: &mut Context<Self>,
        key: &str,
        from: Cursor,
        events: Vec<Event>,
    ) -> bool {
        let Some(worker) = self.crew.awake(key) else {
            return false;
        };
        let Some(lease) = self.crew.lease(key) else {
            return false;
        };
        let mailing = self.mailing.as_ref().expect("reading mail");
        let topic = mail_topic(&self.name, key);
        let handing = Handing {
            open: (!mailing.opened.contains(key)).then_some(from),
            db: mailing.db.clone(),
            send: mailing.send.clone(),
            worker,
            metrics: self.metrics.mail.clone(),
            key: key.to_owned(),
            tenure: Arc::new(DeliveryContext {
                topic,
                consumer: self.name.clone(),
                acker: mailing.table.clone(),
                lease,
            }),
            table: mailing.table.clone(),
        };
        let key = key.to_owned();
        ctx.spawn(
            (hand_over(handing, events).into_actor(self))
                .map(move |(ended, opened), pool, ctx| pool.delivered(ctx, key, ended, opened)),
        );
        true
    }

    /// `key`'s delivery ended: its mail is read on, now or after a pause.
    fn delivered(&mut self, ctx: &mut Context<Self>, key: String, ended: Delivered, opened: bool) {
        let Some(mailing) = self.mailing.as_mut() else {
            return;
        };
        if opened {
            mailing.opened.insert(key.clone());
        }
        // The read goes on, a read of its own: doorbells rung meanwhile are covered.
        if let Some(gate) = mailing.gates.get_mut(&key) {
            gate.read_on();
        }
        match ended {
            Delivered::Done | Delivered::Moved => self.mail_go(ctx, key, Go::Now),
            // Again after a pause, not in a tight loop on a failing worker.
            Delivered::Failed => {
                ctx.run_later(FAILED_PAUSE, move |pool, ctx| {
                    pool.mail_go(ctx, key, Go::Now)
                });
            }
        }
    }
}

/// How long a key whose worker failed a message waits before it is handed over again.
const FAILED_PAUSE: Duration = Duration::from_millis(200);

impl<W> Handler<RawNotification> for WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
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
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    type Result = ();

    fn handle(&mut self, state: ConnState, ctx: &mut Context<Self>) {
        let channel = self.mailing.as_ref().map(|m| m.table.channel().to_owned());
        if channel.is_some_and(|channel| state.may_have_missed(&channel)) {
            let keys = self.crew.keys().cloned().collect();
            self.read_mail(ctx, keys);
        }
    }
}
