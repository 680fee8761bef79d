//! What the lease channel says, heard through the listener: releases (wake the waiters whose
//! turn it may be), handovers to this process (the waiter whose turn it is takes the lease),
//! and a listener (re)connected (everyone retries: announcements may have been missed). A
//! handover names its lock table's oid, looked up here, so a handover in another table sharing
//! the channel is never taken.

use actix::prelude::*;
use pgcoord::lease::Released;
use tracing::warn;

use super::wake::Handed;
use super::{LockManager, semaphore};
use crate::signals::{ConnState, RawNotification};

impl LockManager {
    /// Looks the lock table's oid up, unless known (see `table_oid`).
    pub(super) fn look_up_table_oid(&mut self, ctx: &mut Context<Self>) {
        if self.table_oid.is_some() {
            return;
        }
        let (table, pool) = (self.table.clone(), self.pool.clone());
        let lookup = async move { table.table_oid(&pool.idempotent(None)).await };
        ctx.spawn(lookup.into_actor(self).map(|result, act, _| match result {
            Ok(oid) => act.table_oid = Some(oid),
            Err(e) => {
                warn!(error = %e, "cannot look the lock table's oid up; handovers are taken at the waiter's next attempt");
            }
        }));
    }
}

impl Handler<RawNotification> for LockManager {
    type Result = ();

    fn handle(&mut self, notification: RawNotification, _: &mut Context<Self>) {
        let owner = self.config.owner();
        match Released::parse(&notification.payload) {
            // A handover in another lock table sharing the channel: not about our leases.
            Some(released) if self.table_oid.is_some_and(|oid| !released.may_concern(oid)) => {}
            Some(released) => match self
                .table_oid
                .and_then(|oid| released.handed_to(owner, oid))
            {
                // Handed to us by the release itself: the waiter whose turn it is takes it when
                // the announcement names its last refused attempt's nonce, or once its row
                // says so (an announcement is not proof otherwise).
                Some(token) => {
                    let nonce = released.nonce;
                    self.handed_over(released.name, Handed { token, nonce })
                }
                // Free for us, or handed to us while the table's oid is unknown: the waiter
                // asks, and finds the lease its own (it takes it from the table) or free.
                None if released.may_grant(owner) => {
                    semaphore::wake_released(&self.queues, released.name)
                }
                // Another process's waiter is first in line (or was handed the lease): an
                // attempt here could only be refused. Its grant (or its place lapsing) is
                // announced or polled for later.
                None => {}
            },
            // Not an announcement (written by hand, say): wake whoever waits for that name.
            None => self.queues.wake(&notification.payload),
        }
    }
}

impl Handler<ConnState> for LockManager {
    type Result = ();

    fn handle(&mut self, state: ConnState, ctx: &mut Context<Self>) {
        // Releases announced while the listener was away were missed: everyone retries.
        if matches!(state, ConnState::Connected | ConnState::Reconnected) {
            self.queues.wake_all();
            self.look_up_table_oid(ctx);
        }
    }
}
