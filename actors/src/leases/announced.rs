//! What the lease channel says, heard through the listener: a release (wake the waiter whose
//! turn it may be), or a listener (re)connected (everyone asks again: announcements may have
//! been missed).
//!
//! An announcement is a doorbell, never a grant: it only rings the bell of the name it names (a
//! hint of which waiter asks), ending that waiter's nap early (see `signals::doorbell`), and the
//! waiter's own attempt decides. Anyone who can NOTIFY the channel can ring it; a forged or late
//! announcement costs at most one attempt statement, a flood one per doorbell gap. One this
//! drops (another process's waiter first in line) is as good as lost: the waiter's poll covers it.

use actix::prelude::*;
use pgcoord::lease::Released;

use super::LockManager;
use crate::signals::{ConnState, RawNotification};

impl Handler<RawNotification> for LockManager {
    type Result = ();

    fn handle(&mut self, notification: RawNotification, _: &mut Context<Self>) {
        let queues = &self.context().queues;
        match Released::parse(&notification.payload) {
            // Free for us, or for anyone: the waiter whose turn it is asks.
            Some(released) if released.may_grant(&self.owner) => {
                queues.wake_released(released.name)
            }
            // Another process's waiter is first in line: an attempt here could only be
            // refused. Its grant, or its place lapsing, is announced or polled for later.
            Some(_) => {}
            // Not an announcement (written by hand, say): wake whoever waits for that name.
            None => queues.wake(&notification.payload),
        }
    }
}

impl Handler<ConnState> for LockManager {
    type Result = ();

    fn handle(&mut self, state: ConnState, _: &mut Context<Self>) {
        // Releases announced while the listener was away were missed, and waiters that began
        // before its first connection napped without a doorbell: everyone asks again.
        let channel = self.config().lease_channel().as_str();
        if state == ConnState::Connected || state.may_have_missed(channel) {
            self.context().queues.wake_all();
            super::counters::Counters::add(&self.counters.woken_all);
        }
    }
}
