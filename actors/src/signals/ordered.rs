//! In-order delivery: a message whose payload travelled through the store is fetched on a task
//! of its own (the reader must not wait for a query), yet its subscribers get it in the order it
//! was published, before the messages that followed it on the channel.
//!
//! Each channel keeps a backlog while a fetch is under way: later messages, inline ones
//! included, queue behind it and are handed out as soon as every earlier one is settled
//! (delivered, or announced as `ConnState::MessageLost` when it cannot be fetched). Anyone can
//! NOTIFY a reference to no row, so what a flood of them costs is bounded: the keys waiting
//! are fetched in batches ([`PayloadStore::get_many`](pgcoord::payload::PayloadStore::get_many),
//! one statement for the payload table), at most [`BATCHES_AT_ONCE`] at a time for the
//! listener; a backlog holds at most [`BACKLOG_AT_MOST`] messages, and one beyond is lost at
//! once (announced); losses are warned about and announced at a bounded rate (see
//! `dispatch`). Fetches are bounded by the statement timeout, so a backlog cannot grow stuck;
//! how many statements run at once is the store's to bound too (the `PayloadStoreActor`: half
//! the pool). A fetch reports back by message, not as a future of the actor: a supervised
//! restart drops an actor's futures, and a message received before a reconnect must still be
//! delivered after it.

use std::collections::VecDeque;

use actix::prelude::*;
use pgcoord::signal::{Body, Envelope};
use pgcoord::{Error, ErrorKind, Result};

use super::ListenerActor;

/// The most keys one fetch asks for.
pub(crate) const BATCH: usize = 100;
/// The most fetches a listener runs at once, all channels together.
pub(crate) const BATCHES_AT_ONCE: usize = 4;
/// The most messages a channel's backlog holds.
pub(crate) const BACKLOG_AT_MOST: usize = 10_000;

/// A message's id and payload, or why it cannot be delivered.
type Outcome = Result<(u64, Vec<u8>)>;

/// A message of a channel's backlog: its order, its id and key while its payload is not asked
/// for yet, and its payload once fetched.
pub(crate) struct Slot {
    seq: u64,
    waiting: Option<(u64, String)>,
    outcome: Option<Outcome>,
}

/// Messages waiting for an earlier one's payload.
pub(crate) type Backlog = VecDeque<Slot>;

/// Stored payloads fetched (or not) for messages of `channel`, by their order.
#[derive(Message)]
#[rtype(result = "()")]
struct Fetched {
    channel: String,
    outcomes: Vec<(u64, Outcome)>,
}

impl ListenerActor {
    /// Delivers a message now, or after the messages whose payloads are still being fetched.
    pub(crate) fn deliver_in_order(
        &mut self,
        channel: &str,
        id: u64,
        payload: Vec<u8>,
        ctx: &mut Context<Self>,
    ) {
        let seq = self.next_seq();
        let Some(entry) = self.channels.get_mut(channel) else {
            return;
        };
        if entry.backlog.is_empty() {
            return self.deliver(channel, id, payload, ctx);
        }
        if entry.backlog.len() >= BACKLOG_AT_MOST {
            return self.undeliverable(channel, &full(), ctx);
        }
        entry.backlog.push_back(Slot {
            seq,
            waiting: None,
            outcome: Some(Ok((id, payload))),
        });
    }

    /// Queues a stored payload's fetch; the message keeps its place.
    pub(crate) fn fetch_in_order(
        &mut self,
        channel: &str,
        envelope: Envelope,
        ctx: &mut Context<Self>,
    ) {
        let seq = self.next_seq();
        let Some(entry) = self.channels.get_mut(channel) else {
            return;
        };
        let Body::Stored(key) = envelope.body else {
            unreachable!("only stored payloads are fetched")
        };
        if self.store.is_none() {
            let error = Error::new(
                ErrorKind::NotFound,
                format!("payload {key:?} is in a payload store, and none is configured"),
            );
            entry.backlog.push_back(Slot {
                seq,
                waiting: None,
                outcome: Some(Err(error)),
            });
            return self.settle(channel, ctx);
        }
        if entry.backlog.len() >= BACKLOG_AT_MOST {
            return self.undeliverable(channel, &full(), ctx);
        }
        entry.backlog.push_back(Slot {
            seq,
            waiting: Some((envelope.id, key)),
            outcome: None,
        });
        self.fetch_more(ctx);
    }

    /// Starts fetches of waiting keys while fewer than [`BATCHES_AT_ONCE`] run, each of at
    /// most [`BATCH`] keys of one channel, in their order.
    fn fetch_more(&mut self, ctx: &mut Context<Self>) {
        while self.fetching < BATCHES_AT_ONCE {
            let Some(store) = self.store.clone() else {
                return;
            };
            let found = (self.channels.iter_mut())
                .find(|(_, entry)| entry.backlog.iter().any(|s| s.waiting.is_some()));
            let Some((channel, entry)) = found else {
                return;
            };
            let batch: Vec<(u64, u64, String)> = (entry.backlog.iter_mut())
                .filter_map(|s| s.waiting.take().map(|(id, key)| (s.seq, id, key)))
                .take(BATCH)
                .collect();
            self.fetching += 1;
            let (me, channel) = (ctx.address(), channel.clone());
            tokio::spawn(async move {
                let keys: Vec<String> = batch.iter().map(|(_, _, key)| key.clone()).collect();
                let mut found = store.get_many(&keys).await.into_iter();
                let outcomes = (batch.into_iter())
                    .map(|(seq, id, _)| {
                        let outcome = found.next().unwrap_or_else(|| {
                            Err(Error::new(
                                ErrorKind::Other,
                                "the store answered fewer keys",
                            ))
                        });
                        (seq, outcome.map(|payload| (id, payload)))
                    })
                    .collect();
                me.do_send(Fetched { channel, outcomes });
            });
        }
    }

    /// Hands out every settled message at the head of `channel`'s backlog; stops at the first
    /// still being fetched.
    fn settle(&mut self, channel: &str, ctx: &mut Context<Self>) {
        loop {
            let Some(entry) = self.channels.get_mut(channel) else {
                return;
            };
            if entry.backlog.front().is_none_or(|s| s.outcome.is_none()) {
                return;
            }
            let slot = entry.backlog.pop_front().expect("checked above");
            match slot.outcome.expect("checked above") {
                Ok((id, payload)) => self.deliver(channel, id, payload, ctx),
                Err(e) => self.undeliverable(channel, &e, ctx),
            }
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

/// Why a message beyond a full backlog is lost.
fn full() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{BACKLOG_AT_MOST} messages of the channel wait for stored payloads already"),
    )
}

impl Handler<Fetched> for ListenerActor {
    type Result = ();

    fn handle(&mut self, Fetched { channel, outcomes }: Fetched, ctx: &mut Context<Self>) {
        self.fetching -= 1;
        // Nobody listens any more, or else: each outcome to its slot, both in order.
        if let Some(entry) = self.channels.get_mut(&channel) {
            let mut outcomes = outcomes.into_iter().peekable();
            for slot in entry.backlog.iter_mut() {
                // Outcomes of slots that are gone (the channel was dropped and made again).
                while outcomes.next_if(|(seq, _)| *seq < slot.seq).is_some() {}
                match outcomes.next_if(|(seq, _)| *seq == slot.seq) {
                    Some((_, outcome)) => slot.outcome = Some(outcome),
                    None if outcomes.peek().is_none() => break,
                    None => {}
                }
            }
            self.settle(&channel, ctx);
        }
        self.fetch_more(ctx);
    }
}
