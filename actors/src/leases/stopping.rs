//! How a `LockManager` stops: [`ReleaseAll`], what `Coordinator::shutdown` sends first (nothing
//! more is granted, every held lease is released, and what was under way is waited for), then
//! [`Shutdown`]; and what its `stopped` leaves to release in the background.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::LockManager;
use super::held::OnRelease;
use super::messages::ReleaseAll;
use crate::losses::{LockKey, LockLost, LossReason, Shutdown, Tenure};

impl LockManager {
    /// Forgets every held lease, telling its holder and the [`LockLost`] subscribers it ended
    /// with [`LossReason::Shutdown`]; what is left to release on the server.
    fn end_all(&mut self) -> Vec<(Arc<str>, i64, OnRelease)> {
        let mut ended = Vec::new();
        for (name, token, held) in self.holdings.drain() {
            let on_release = held.on_release;
            held.end(Tenure::Lost(LossReason::Shutdown));
            self.subscribers.broadcast(LockLost {
                key: LockKey::Lease(name.to_string()),
                token: Some(token),
                reason: LossReason::Shutdown,
            });
            ended.push((name, token, on_release));
        }
        self.count_held();
        ended
    }
}

impl Handler<ReleaseAll> for LockManager {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, _: ReleaseAll, _: &mut Context<Self>) -> Self::Result {
        let context = self.context();
        // Nothing more is granted; waits end at their next step (woken now), and a grant won
        // meanwhile is freed, not held.
        context.under_way.close();
        context.queues.wake_all();
        let (releaser, under_way) = (context.releaser.clone(), context.under_way.clone());
        // Tasks of their own, batched with each other: they finish even if the caller gives up.
        let releases: Vec<_> = (self.end_all().into_iter())
            .map(|(name, token, on_release)| {
                let releaser = releaser.clone();
                tokio::spawn(async move { releaser.release(name, token, on_release).await })
            })
            .collect();
        Box::pin(async move {
            let done = futures_util::future::join_all(releases).await;
            // And what was under way before: releases of dropped handles, grants nobody
            // received, waits ending. Each is bounded by the statement timeout.
            while !under_way.settled() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            done.iter().filter(|r| matches!(r, Ok(Ok(())))).count()
        })
    }
}

impl LockManager {
    /// Releases what is still held when the manager stopped, one task per lease so that
    /// thousands of them go out batched. The runtime may be shutting down with the System: then
    /// the leases expire.
    pub(super) fn release_left_in_background(&mut self) {
        for (name, token, on_release) in self.end_all() {
            if let Some(context) = &self.context {
                (context.releaser).release_in_background(name, token, on_release, "at shutdown");
            }
        }
    }
}

impl Handler<Shutdown> for LockManager {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
