//! In-order delivery: a message whose payload travelled through the store is fetched on a task
//! of its own (the reader must not wait for a query), yet its subscribers get it in the order it
//! was published, before the messages that followed it on the channel.
//!
//! Each channel keeps a backlog while a fetch is under way: later messages, inline ones
//! included, queue behind it and are handed out as soon as every earlier one is settled
//! (delivered, or announced as `ConnState::MessageLost` when it cannot be fetched). Fetches are
//! bounded by the statement timeout, so a backlog cannot grow stuck; how many run at once is
//! the store's to bound (the `PayloadStoreActor`: half the pool). The fetch reports back by
//! message, not as a future of the actor: a supervised restart drops an actor's futures, and a
//! message received before a reconnect must still be delivered after it.

use std::collections::VecDeque;

use actix::prelude::*;
use pgcoord::Result;
use pgcoord::signal::{self, Envelope};

use super::ListenerActor;

/// A message of a channel's backlog: its order, and its payload once fetched.
pub(crate) struct Slot {
    seq: u64,
    outcome: Option<Result<(u64, Vec<u8>)>>,
}

/// Messages waiting for an earlier one's payload.
pub(crate) type Backlog = VecDeque<Slot>;

/// A stored payload fetched (or not) for the message numbered `seq` on `channel`.
#[derive(Message)]
#[rtype(result = "()")]
struct Fetched {
    channel: String,
    seq: u64,
    outcome: Result<(u64, Vec<u8>)>,
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
        entry.backlog.push_back(Slot {
            seq,
            outcome: Some(Ok((id, payload))),
        });
    }

    /// Fetches a stored payload on a task of its own; the message keeps its place.
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
        entry.backlog.push_back(Slot { seq, outcome: None });
        let (store, me, channel) = (self.store.clone(), ctx.address(), channel.to_owned());
        tokio::spawn(async move {
            let outcome = signal::open(&envelope, store.as_deref())
                .await
                .map(|payload| (envelope.id, payload));
            me.do_send(Fetched {
                channel,
                seq,
                outcome,
            });
        });
    }

    fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

impl Handler<Fetched> for ListenerActor {
    type Result = ();

    fn handle(&mut self, fetched: Fetched, ctx: &mut Context<Self>) {
        let channel = fetched.channel;
        let Some(entry) = self.channels.get_mut(&channel) else {
            // Nobody listens any more.
            return;
        };
        if let Some(slot) = entry.backlog.iter_mut().find(|s| s.seq == fetched.seq) {
            slot.outcome = Some(fetched.outcome);
        }
        // Hand out every settled message at the head; stop at the first still being fetched.
        loop {
            let Some(entry) = self.channels.get_mut(&channel) else {
                return;
            };
            if entry.backlog.front().is_none_or(|s| s.outcome.is_none()) {
                return;
            }
            let slot = entry.backlog.pop_front().expect("checked above");
            match slot.outcome.expect("checked above") {
                Ok((id, payload)) => self.deliver(&channel, id, payload, ctx),
                Err(e) => self.undeliverable(&channel, &e),
            }
        }
    }
}
