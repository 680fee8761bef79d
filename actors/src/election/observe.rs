//! `LeaderObserver`: tells a recipient of each change of an election's leader it reads, in term order.
//!
//! Every report is the leader as read from the lock table, never a notification's word (anyone
//! who can connect can NOTIFY). What makes it read: a proclamation on the election channel (a new
//! term or a new value of this election); a release on the lease channel (a resignation); the
//! current leader's expiry on the server's clock (a leader that stopped renewing is gone then);
//! the listener's `Reconnected`, or its `MessageLost` on the election channel (announcements may
//! have been missed: reported as a resync); and a poll every quarter lease as a fallback. One
//! read at a time, through the doorbell's `Gate` (asked while one is under way, it reads again
//! when that ends; a doorbell after a doorbell's read that found no new leader waits out the
//! gap), so results apply in the order of their snapshots and a flood of doorbells costs a read
//! per gap. A change is
//! reported once, except that a resync reports what it reads even when nothing changed (the
//! same leader again, `resync` set); never is one older than a change already reported: terms
//! are ordered by their tokens. A term shorter than a read may go unreported.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::election::Proclamation;
use pgcoord::lease::Released;
use tracing::{debug, warn};

use super::{Election, Leader, term_of};
use crate::leases::LockManager;
use crate::signals::doorbell::{Gate, Go};
use crate::signals::{
    ConnState, ListenerActor, RawNotification, Signal, Subscribe, SubscribeConnState, SubscribeRaw,
};

/// A change of leader, told to an observer's recipient.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub struct LeaderChanged {
    /// The election.
    pub election: String,
    /// The leader now; `None` between terms.
    pub leader: Option<Leader>,
    /// True for the first report, after the listener reconnected, and after it could not
    /// deliver a message of the election channel ([`ConnState::MessageLost`], which anyone who
    /// can NOTIFY can cause, coalesced by the listener): announcements may have been missed,
    /// and this is the current state as read from the database — possibly the same leader as
    /// the last report.
    pub resync: bool,
}

/// Watches one election; started by [`Election::observe`]. Stops when its recipient is gone.
pub(crate) struct LeaderObserver {
    election: String,
    locks: Addr<LockManager>,
    signals: Addr<ListenerActor>,
    election_channel: String,
    lease_channel: String,
    poll: Duration,
    recipient: Recipient<LeaderChanged>,
    /// What was last reported; `None` before the first report.
    reported: Option<Option<Leader>>,
    /// The greatest token reported: nothing older is reported after it.
    highest: i64,
    /// Reads one at a time, so results apply in the order of their snapshots, and a flood of
    /// doorbells costs a read per doorbell gap, not one each.
    gate: Gate,
    /// A resync was asked for (the first report, a reconnect): the next read started carries it.
    resync: bool,
    /// The read scheduled at the current leader's expiry.
    expiry: Option<SpawnHandle>,
    /// Nothing to hear: the poll alone.
    poll_only: bool,
}

impl LeaderObserver {
    pub(crate) fn new(election: &Election, recipient: Recipient<LeaderChanged>) -> LeaderObserver {
        LeaderObserver {
            election: election.name.clone(),
            locks: election.locks.clone(),
            signals: election.signals.clone(),
            election_channel: election.config.election_channel().as_str().to_owned(),
            lease_channel: election.config.lease_channel().as_str().to_owned(),
            poll: crate::leases::poll_interval(&election.config),
            poll_only: election.config.poll_only(),
            recipient,
            reported: None,
            highest: i64::MIN,
            gate: Gate::default(),
            resync: true,
            expiry: None,
        }
    }

    /// Reads the leader, for a cause other than a doorbell (a poll, the expiry, a reconnect), and
    /// applies what it finds — or, while a read is under way, reads again once it ends.
    fn read(&mut self, resync: bool, ctx: &mut Context<Self>) {
        self.resync |= resync;
        let go = self.gate.ask();
        self.go(go, ctx);
    }

    /// A doorbell: the leader may have changed. Read now, or at the end of the doorbell's gap.
    fn rung(&mut self, ctx: &mut Context<Self>) {
        let go = self.gate.ring(Instant::now());
        self.go(go, ctx);
    }

    /// Does what the gate says. A leader found is read again at its lease's expiry, when one
    /// that stopped renewing is gone.
    fn go(&mut self, go: Go, ctx: &mut Context<Self>) {
        match go {
            Go::Covered => {}
            Go::At(at) => {
                ctx.run_later(at.saturating_duration_since(Instant::now()), |act, ctx| {
                    let go = act.gate.due(Instant::now());
                    act.go(go, ctx);
                });
            }
            Go::Now => {
                let resync = std::mem::take(&mut self.resync);
                let (locks, name) = (self.locks.clone(), self.election.clone());
                let read = async move { term_of(&locks, &name).await };
                ctx.spawn(read.into_actor(self).map(move |result, act, ctx| {
                    let changed = act.apply(result, resync, ctx);
                    let go = act.gate.finished(changed, Instant::now());
                    act.go(go, ctx);
                }));
            }
        }
    }

    /// Applies what a read found; true when it is another leader than the last reported.
    fn apply(
        &mut self,
        result: pgcoord::Result<Option<(Leader, Duration)>>,
        resync: bool,
        ctx: &mut Context<Self>,
    ) -> bool {
        let term = match result {
            Ok(term) => term,
            Err(e) => {
                // Asked again by the next doorbell, expiry or poll.
                self.resync |= resync;
                debug!(election.name = %self.election, error = %e, "cannot read the leader; polling");
                return false;
            }
        };
        if let Some(handle) = self.expiry.take() {
            ctx.cancel_future(handle);
        }
        let leader = term.map(|(leader, remaining)| {
            let at = remaining + Duration::from_millis(5);
            self.expiry = Some(ctx.run_later(at, |act, ctx| act.read(false, ctx)));
            leader
        });
        let changed = self.reported.as_ref() != Some(&leader);
        self.report(leader, resync, ctx);
        changed
    }

    /// Reports `leader` if it is a change, and never an older term than one reported.
    fn report(&mut self, leader: Option<Leader>, resync: bool, ctx: &mut Context<Self>) {
        if let Some(l) = &leader
            && l.token < self.highest
        {
            return;
        }
        if !resync && self.reported.as_ref() == Some(&leader) {
            return;
        }
        if let Some(l) = &leader {
            self.highest = l.token;
        }
        self.reported = Some(leader.clone());
        let change = LeaderChanged {
            election: self.election.clone(),
            leader,
            resync,
        };
        if self.recipient.try_send(change.clone()).is_err() {
            if !self.recipient.connected() {
                debug!(election.name = %self.election, "observer's recipient gone; stopping");
                ctx.stop();
                return;
            }
            // A full mailbox must not lose a change: deliver it regardless of capacity.
            self.recipient.do_send(change);
        }
    }
}

impl Actor for LeaderObserver {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The listener hands messages over with `try_send`: room for bursts of terms.
        ctx.set_mailbox_capacity(4096);
        ctx.run_interval(self.poll, |act, ctx| act.read(false, ctx));
        if self.poll_only {
            self.read(true, ctx);
            return;
        }
        // Subscribed before the first read, so nothing falls between them.
        let me = ctx.address();
        self.signals
            .do_send(SubscribeConnState(me.clone().recipient()));
        let subscribed = (
            self.signals.send(Subscribe::new(
                self.election_channel.clone(),
                me.clone().recipient(),
            )),
            self.signals.send(SubscribeRaw {
                channel: self.lease_channel.clone(),
                recipient: me.recipient(),
            }),
        );
        let subscribed = async move { (subscribed.0.await, subscribed.1.await) };
        ctx.spawn(subscribed.into_actor(self).map(|(a, b), act, ctx| {
            for result in [a, b] {
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(election.name = %act.election, error = %e, "cannot listen for leader changes; polling"),
                    Err(e) => warn!(election.name = %act.election, error = %e, "listener gone; polling"),
                }
            }
            // The first report is a resync (set at the start), whichever read makes it.
            act.read(false, ctx);
        }));
    }
}

impl Handler<Signal> for LeaderObserver {
    type Result = ();

    fn handle(&mut self, signal: Signal, ctx: &mut Context<Self>) {
        let Ok(proclamation) = Proclamation::from_payload(&signal.payload) else {
            debug!(election.name = %self.election, "not a proclamation on the election channel");
            return;
        };
        // Only a doorbell: what it says is read from the table.
        if proclamation.election == self.election {
            self.rung(ctx);
        }
    }
}

impl Handler<RawNotification> for LeaderObserver {
    type Result = ();

    fn handle(&mut self, notification: RawNotification, ctx: &mut Context<Self>) {
        // A term ended (or the first waiter left the line): who leads now is read, since the
        // announcement does not say which term it was.
        if Released::parse(&notification.payload).is_some_and(|r| r.name == self.election) {
            self.rung(ctx);
        }
    }
}

impl Handler<ConnState> for LeaderObserver {
    type Result = ();

    fn handle(&mut self, state: ConnState, ctx: &mut Context<Self>) {
        // A message lost on another channel says nothing about this election; the lease
        // channel carries no stored payloads, so only a reconnect misses its doorbells.
        if state.may_have_missed(&self.election_channel) {
            self.read(true, ctx);
        }
    }
}
