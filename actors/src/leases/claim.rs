//! [`Claim`]: take at once whichever of many leases are free, without waiting — what a worker
//! pool does with its share of keys — in batched statements.

use std::time::Instant;

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::lease::{AcquireRequest, Grant, MAX_NAMES_PER_STATEMENT};
use pgcoord::{Error, ErrorKind, Result};

use super::context::WaitContext;
use super::counters::Counters;
use super::held::OnRelease;
use super::messages::Claim;
use super::settle::Unrecorded;
use super::{Lease, LockManager};

impl Handler<Claim> for LockManager {
    type Result = ResponseActFuture<Self, Result<Vec<Lease>>>;

    fn handle(&mut self, request: Claim, _: &mut Context<Self>) -> Self::Result {
        let (mut names, keep) = (request.names, request.keep_on_release);
        // Names held here are not asked again (leases never stack).
        names.retain(|n| !self.holdings.contains(n));
        names.sort();
        names.dedup();
        // The turn of each name, without waiting: a name a wait, release or check of this
        // manager is busy with is left alone.
        let context = self.context();
        if context.under_way.closing() {
            return Box::pin(actix::fut::ready(Err(super::under_way::closing_error())));
        }
        // Under way until its grants are recorded or freed.
        let ticket = context.under_way.enter();
        let mut turns = Vec::with_capacity(names.len());
        names.retain(|name| match context.queues.try_turn(name) {
            Some(turn) => {
                turns.push(turn);
                true
            }
            None => false,
        });
        // On a task of its own, so its statements finish whatever the manager does; grants it
        // cannot hand over (the manager stopped) are released when dropped.
        let lease = context.lease;
        let on_release = OnRelease {
            keep,
            ..OnRelease::default()
        };
        let claim = tokio::spawn(claim(context, names, on_release));
        let claim = async move {
            claim.await.unwrap_or_else(|e| {
                Err(Error::new(
                    ErrorKind::Other,
                    format!("claim task failed: {e}"),
                ))
            })
        };
        Box::pin(claim.into_actor(self).map(move |result, act, ctx| {
            let _ticket = ticket;
            // Shutting down: the grants are freed (dropped unrecorded), not held.
            let result = match result {
                Ok(_) if act.context().under_way.closing() => {
                    Err(super::under_way::closing_error())
                }
                result => result,
            };
            let leases = result.map(|granted| {
                (granted.into_iter())
                    .map(|(grant, won, sent)| {
                        act.lease_for(grant.record(), on_release, won, (sent, lease), ctx)
                    })
                    .collect()
            });
            let queues = &act.context().queues;
            for (queue, turn) in turns {
                queues.give_back(queue, Some(turn));
            }
            leases
        }))
    }
}

/// Takes each of `names` that is free, [`MAX_NAMES_PER_STATEMENT`] per statement; what one
/// statement granted is held by `Unrecorded` before the next is sent, released as `on_release`
/// says if nobody records it.
async fn claim(
    context: Arc<WaitContext>,
    names: Vec<String>,
    on_release: OnRelease,
) -> Result<Vec<(Unrecorded, Grant, Instant)>> {
    let mut granted = Vec::new();
    let owner = context.statements();
    for chunk in names.chunks(MAX_NAMES_PER_STATEMENT) {
        let requests: Vec<AcquireRequest<'_>> =
            chunk.iter().map(|name| AcquireRequest::new(name)).collect();
        // Planned for the table as it grows: see `Bounded::planned`.
        let statements = context.pool.statements(None).planned();
        let sent = Instant::now();
        let grants = pgcoord::__private::retry(|| {
            Counters::add(&context.counters.acquire_statements);
            owner.try_acquire_many(&statements, &requests, context.lease)
        })
        .await?;
        for (name, grant) in grants {
            let name = name.into();
            let unrecorded = Unrecorded::new(&context, name, grant.token, on_release);
            granted.push((unrecorded, grant, sent));
        }
    }
    Ok(granted)
}
