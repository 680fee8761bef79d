//! A pool's tick: losses first, idle workers passivated, stopped workers started again, then
//! the round on the server — membership, the members and keys read — and the moves `plan`
//! makes of them: release above the fair share, claim up to it.

use std::sync::Arc;

use actix::prelude::*;
use pgcoord::LeaseInfo;
use tracing::{debug, warn};

use super::plan::{self, Round};
use super::{Running, StopWorker, WorkerPool, members};
use crate::leases::{Acquire, Claim, Lease};

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    /// One round: workers tended, membership, the members and keys read, the moves made.
    pub(super) fn rebalance(&mut self, ctx: &mut Context<Self>) {
        if self.ticking {
            return;
        }
        self.ticking = true;
        self.ticks += 1;
        self.tend();
        // Mail a doorbell did not announce (a lost one, or sent while no one held the key).
        let held: Vec<String> = self.running.keys().cloned().collect();
        self.read_mail(ctx, held);
        let member_lease = format!("{}/members/{}", self.name, self.owner);
        let needs_membership =
            self.drain.is_none() && (self.membership.as_ref()).is_none_or(|m| m.loss().is_some());
        let (locks, prefix, key_prefix) = (
            self.locks.clone(),
            format!("{}/members/", self.name),
            format!("{}/keys/", self.name),
        );
        let first = self.ticks == 1;
        let weight = self.weight;
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
            Ok::<_, pgcoord::Error>((membership, members, keys))
        };
        ctx.spawn(round.into_actor(self).map(move |result, act, ctx| {
            act.ticking = false;
            match result {
                Ok((membership, members, keys)) => {
                    act.keep_membership(membership);
                    act.rebalanced(&members, &keys, first, ctx);
                }
                Err(e) => {
                    warn!(pool.name = %act.name, error = %e, "cannot rebalance; trying at the next tick");
                }
            }
        }));
    }

    /// Looks after the workers: those whose lease is lost stop now, idle ones are passivated,
    /// and those that stopped (a panic) while their lease is held start again.
    fn tend(&mut self) {
        let lost: Vec<String> = (self.running.iter())
            .filter(|(_, r)| r.lease.loss().is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in lost {
            warn!(pool.name = %self.name, worker.key = %key, "key's lease lost; its worker stops");
            if let Some(running) = self.running.remove(&key) {
                running.worker.do_send(StopWorker);
            }
        }
        self.metrics.keys.set(self.running.len() as f64);
        if let Some(idle) = self.passivate_after {
            for running in self.running.values_mut() {
                if !running.passive && running.used.elapsed() >= idle {
                    running.worker.do_send(StopWorker);
                    running.passive = true;
                }
            }
        }
        let dead: Vec<(String, Arc<Lease>)> = (self.running.iter())
            .filter(|(_, r)| !r.passive && !r.worker.connected())
            .map(|(k, r)| (k.clone(), r.lease.clone()))
            .collect();
        for (key, lease) in dead {
            self.restarts += 1;
            warn!(pool.name = %self.name, worker.key = %key, "worker stopped while its key is held; starting it again");
            let worker = self.start_worker(&key, &lease);
            if let Some(running) = self.running.get_mut(&key) {
                running.worker = worker;
            }
        }
    }

    /// Keeps the member lease just acquired, unless a drain began meanwhile (then it is
    /// dropped, so released).
    fn keep_membership(&mut self, membership: Option<pgcoord::Result<Lease>>) {
        match membership {
            Some(Ok(lease)) if self.drain.is_none() => self.membership = Some(lease),
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
        self.set_members(members::live(members, &prefix));
        let key_prefix = format!("{}/keys/", self.name);
        if self.activate_keys && self.drain.is_none() && !first {
            // Keys that came to life: recorded under the pool, held or not.
            self.recorded = (keys.iter())
                .filter_map(|k| k.name.strip_prefix(key_prefix.as_str()))
                .filter(|k| !self.keys.iter().any(|own| own == k))
                .map(str::to_owned)
                .collect();
        }
        let members = members::weighed(members, &prefix);
        let moves = plan::plan(&Round {
            me: &self.owner,
            weight: self.weight,
            members: &members,
            keys: (self.keys.iter().chain(&self.recorded))
                .map(String::as_str)
                .collect(),
            running: self.running.keys().map(String::as_str).collect(),
            taken: (keys.iter())
                .filter(|k| k.is_held())
                .filter_map(|k| k.name.strip_prefix(key_prefix.as_str()))
                .collect(),
            max_moves: self.max_moves,
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
        let claim = if self.activate_keys {
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
            let lease = Arc::new(lease);
            let worker = self.start_worker(&key, &lease);
            let used = std::time::Instant::now();
            let passive = false;
            let told = Arc::default();
            let running = Running {
                lease,
                worker,
                passive,
                used,
                told,
            };
            self.running.insert(key.clone(), running);
            self.metrics.claimed.increment(1);
            self.metrics.keys.set(self.running.len() as f64);
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
