//! A pool's tick: losses first, idle workers passivated, stopped workers started again, then
//! the round on the server — membership, the members and keys read — and the moves `plan`
//! makes of them: release above the fair share, claim up to it.

use std::pin::Pin;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::Stream;
use pgcoord::LeaseInfo;
use tracing::{debug, info, warn};

use super::plan::{self, Round};
use super::{Shutdown, WorkerPool, members};
use crate::leases::{Acquire, Claim, Lease};

/// Every this many rounds a member looks for a drain asked of it through the database: within
/// a lease of the request (a round is a quarter lease), for a statement every fourth round.
const DRAIN_LOOKED_FOR_EVERY: u64 = 4;

/// The key sets a pool follows, each replacing the last.
type KeyStream = Pin<Box<dyn Stream<Item = Vec<String>>>>;

/// A pool's rounds: one at a time, counted, their moves bounded.
pub(super) struct Rounds {
    /// A round is under way.
    ticking: bool,
    ticks: u64,
    /// At most this many keys released, and this many claimed, per tick.
    max_moves: usize,
    /// Key sets to follow (see [`WorkerPool::follow`]), until the pool starts.
    key_stream: Option<KeyStream>,
}

impl Default for Rounds {
    fn default() -> Rounds {
        Rounds {
            ticking: false,
            ticks: 0,
            max_moves: usize::MAX,
            key_stream: None,
        }
    }
}

impl Rounds {
    /// Moves at most `keys` keys (at least 1) each way per tick.
    pub(super) fn limit_moves(&mut self, keys: usize) {
        self.max_moves = keys.max(1);
    }

    pub(super) fn max_moves(&self) -> usize {
        self.max_moves
    }

    /// Follows `keys` once the pool starts.
    pub(super) fn follow(&mut self, keys: KeyStream) {
        self.key_stream = Some(keys);
    }

    /// The key sets to follow, taken as the pool starts.
    pub(super) fn take_followed(&mut self) -> Option<KeyStream> {
        self.key_stream.take()
    }

    /// The rounds begun so far.
    pub(super) fn ticks(&self) -> u64 {
        self.ticks
    }
}

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<Shutdown>,
{
    /// One round: workers tended, membership, the members and keys read, the moves made.
    pub(super) fn rebalance(&mut self, ctx: &mut Context<Self>) {
        if self.round.ticking {
            return;
        }
        self.round.ticking = true;
        self.round.ticks += 1;
        self.crew.tend(&self.name);
        self.metrics.keys.set(self.crew.len() as f64);
        // Mail a doorbell did not announce (a lost one, or sent while no one held the key).
        let held: Vec<String> = self.crew.keys().cloned().collect();
        self.read_mail(ctx, held);
        let member_lease = format!("{}/members/{}", self.name, self.owner);
        let needs_membership = self.drain.is_none() && self.membership.needs_lease();
        // A drain asked from outside (a resign request on the member lease, as `pgcoord ui`
        // stores it): looked for every few rounds, by reading the table, never on a
        // notification's word.
        let drain_asked = (self.drain.is_none()
            && self.round.ticks.is_multiple_of(DRAIN_LOOKED_FOR_EVERY))
        .then(|| self.membership.token())
        .flatten()
        .map(|token| (member_lease.clone(), token));
        let (locks, prefix, key_prefix) = (
            self.locks.clone(),
            format!("{}/members/", self.name),
            format!("{}/keys/", self.name),
        );
        let first = self.round.ticks == 1;
        let weight = self.membership.weight();
        let round = async move {
            let membership = if needs_membership {
                let acquire = Acquire::new(member_lease)
                    .fail_if_locked()
                    .replace_data()
                    .value(&weight)?;
                Some(locks.acquire(acquire).await)
            } else {
                None
            };
            let members = locks.list_prefix(&prefix).await?;
            let keys = locks.list_prefix(&key_prefix).await?;
            let drain = match drain_asked {
                Some((lease, token)) => locks.resign_requested(&lease, token).await?,
                None => false,
            };
            Ok::<_, pgcoord::Error>((membership, members, keys, drain))
        };
        ctx.spawn(round.into_actor(self).map(move |result, act, ctx| {
            act.round.ticking = false;
            match result {
                Ok((membership, members, keys, drain)) => {
                    act.keep_membership(membership);
                    if drain {
                        info!(pool.name = %act.name, "asked to drain through the database");
                        act.begin_drain(ctx);
                    }
                    act.rebalanced(&members, &keys, first, ctx);
                }
                Err(e) => {
                    warn!(pool.name = %act.name, error = %e, "cannot rebalance; trying at the next tick");
                }
            }
        }));
    }

    /// Keeps the member lease just acquired, unless a drain began meanwhile (then it is
    /// dropped, so released).
    fn keep_membership(&mut self, membership: Option<pgcoord::Result<Lease>>) {
        match membership {
            Some(Ok(lease)) if self.drain.is_none() => self.membership.keep(lease),
            Some(Ok(_)) | None => {}
            Some(Err(e)) => debug!(pool.name = %self.name, error = %e, "not a member yet"),
        }
    }

    /// The round's reads: watchers told of the members, recorded keys noted, the moves made.
    fn rebalanced(
        &mut self,
        members: &[LeaseInfo],
        keys: &[LeaseInfo],
        first: bool,
        ctx: &mut Context<Self>,
    ) {
        let prefix = format!("{}/members/", self.name);
        self.membership.set(members::live(members, &prefix));
        let key_prefix = format!("{}/keys/", self.name);
        if self.activation.is_on() && self.drain.is_none() && !first {
            // Keys that came to life: recorded under the pool, held or not.
            self.activation.note(keys, &key_prefix, &self.keys);
        }
        let members = members::weighed(members, &prefix);
        let moves = plan::plan(&Round {
            me: &self.owner,
            weight: self.membership.weight(),
            members: &members,
            keys: (self.keys.iter().chain(self.activation.recorded()))
                .map(String::as_str)
                .collect(),
            running: self.crew.keys().map(String::as_str).collect(),
            taken: (keys.iter())
                .filter(|k| k.is_held())
                .filter_map(|k| k.name.strip_prefix(key_prefix.as_str()))
                .collect(),
            max_moves: self.round.max_moves,
            draining: self.drain.is_some(),
            first,
        });
        if self.drain.is_some() {
            self.drain_some(moves.release, ctx);
            return;
        }
        for key in &moves.release {
            self.stop_key(key);
        }
        if !moves.claim.is_empty() {
            self.claim_keys(&moves.claim, ctx);
        }
    }

    /// Claims `keys` in one statement and starts a worker for each one granted.
    fn claim_keys(&mut self, keys: &[String], ctx: &mut Context<Self>) {
        let claim = Claim::new(keys.iter().map(|k| self.key_lease(k)).collect());
        // A key that came to life stays recorded when its lease goes (a move).
        let claim = if self.activation.is_on() {
            claim.keep_on_release()
        } else {
            claim
        };
        let claim = self.locks.claim(claim);
        ctx.spawn(claim.into_actor(self).map(|result, act, ctx| match result {
            Ok(leases) => act.claimed(leases, ctx),
            Err(e) => warn!(pool.name = %act.name, error = %e, "cannot claim keys"),
        }));
    }

    /// Starts a worker for each key granted, still the pool's, and reads its waiting mail.
    fn claimed(&mut self, leases: Vec<Lease>, ctx: &mut Context<Self>) {
        let prefix = format!("{}/keys/", self.name);
        let mut claimed = Vec::new();
        for lease in leases {
            let key = lease.name()[prefix.len()..].to_owned();
            if !self.has_key(&key) {
                continue; // keys changed meanwhile: dropped, so released
            }
            let (token, lost) = (lease.token(), lease.lost());
            self.crew.start(key.clone(), Arc::new(lease));
            self.metrics.claimed.increment(1);
            self.metrics.keys.set(self.crew.len() as f64);
            claimed.push(key.clone());
            ctx.spawn(
                lost.into_actor(self)
                    .map(move |_, act, _| act.lost(&key, token)),
            );
        }
        // What waited for these keys while no one held them.
        self.read_mail(ctx, claimed);
    }
}
