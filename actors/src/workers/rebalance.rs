//! A pool's tick: losses first, idle workers passivated, stopped workers started again, then
//! the round on the server — membership, the fair share, release above it, claim up to it.

use std::sync::Arc;

use actix::prelude::*;
use tracing::{debug, warn};

use super::{Running, StopWorker, WorkerPool, members};
use crate::leases::{Acquire, Claim, Lease};

impl<W> WorkerPool<W>
where
    W: Actor<Context = Context<W>> + Handler<StopWorker>,
{
    /// One round: membership, share, release above it, claim up to it, revive workers.
    pub(super) fn rebalance(&mut self, ctx: &mut Context<Self>) {
        if self.ticking {
            return;
        }
        self.ticking = true;
        self.ticks += 1;
        // Losses first: a worker whose lease is gone stops now.
        let lost: Vec<String> = self
            .running
            .iter()
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
        // Workers that stopped (a panic) while their lease is held start again.
        let dead: Vec<(String, Arc<Lease>)> = self
            .running
            .iter()
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
        let first_tick = self.ticks == 1;
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
            let members = locks.list_prefix(prefix).await?;
            let keys = locks.list_prefix(key_prefix).await?;
            Ok::<_, pgcoord::Error>((membership, members, keys))
        };
        ctx.spawn(round.into_actor(self).map(move |result, act, ctx| {
            act.ticking = false;
            let (membership, members, keys) = match result {
                Ok(found) => found,
                Err(e) => {
                    warn!(pool.name = %act.name, error = %e, "cannot rebalance; trying at the next tick");
                    return;
                }
            };
            match membership {
                // A drain began meanwhile: the lease is dropped, so released.
                Some(Ok(lease)) if act.drain.is_none() => act.membership = Some(lease),
                Some(Ok(_)) => {}
                Some(Err(e)) => debug!(pool.name = %act.name, error = %e, "not a member yet"),
                None => {}
            }
            let prefix = format!("{}/members/", act.name);
            act.set_members(members::live(&members, &prefix));
            if act.drain.is_some() {
                act.drain_some(ctx);
                return;
            }
            // Processes starting together register before anyone claims.
            if first_tick {
                return;
            }
            if act.activate_keys {
                // Keys that came to life: recorded under the pool, held or not.
                let key_prefix = format!("{}/keys/", act.name);
                act.recorded = (keys.iter())
                    .filter_map(|k| k.name.strip_prefix(key_prefix.as_str()))
                    .filter(|k| !act.keys.iter().any(|own| own == k))
                    .map(str::to_owned)
                    .collect();
            }
            let all = act.keys.len() + act.recorded.len();
            let share = members::share(&members, &prefix, &act.owner, act.weight, all);
            if act.running.len() > share {
                let extra: Vec<String> = act
                    .running
                    .keys()
                    .take((act.running.len() - share).min(act.max_moves))
                    .cloned()
                    .collect();
                for key in extra {
                    act.stop_key(&key);
                }
                return;
            }
            let want = (share - act.running.len()).min(act.max_moves);
            if want == 0 {
                return;
            }
            let taken: std::collections::HashSet<&str> = keys
                .iter()
                .filter(|k| k.is_held())
                .map(|k| k.name.as_str())
                .collect();
            let free: Vec<String> = (act.keys.iter())
                .chain(act.recorded.iter())
                .filter(|k| !act.running.contains_key(k.as_str()))
                .map(|k| act.key_lease(k))
                .filter(|lease| !taken.contains(lease.as_str()))
                .take(want)
                .collect();
            if free.is_empty() {
                return;
            }
            let claim = Claim::new(free);
            // A key that came to life stays recorded when its lease goes (a move).
            let claim = if act.activate_keys { claim.keep_on_release() } else { claim };
            let claim = act.locks.claim(claim);
            ctx.spawn(claim.into_actor(act).map(|result, act, ctx| match result {
                Ok(leases) => {
                    let prefix = format!("{}/keys/", act.name);
                    let mut claimed = Vec::new();
                    for lease in leases {
                        let key = lease.name()[prefix.len()..].to_owned();
                        if !act.has_key(&key) {
                            continue; // keys changed meanwhile: dropped, so released
                        }
                        let (token, lost) = (lease.token(), lease.lost());
                        let lease = Arc::new(lease);
                        let worker = act.start_worker(&key, &lease);
                        let used = std::time::Instant::now();
                        let passive = false;
                        act.running.insert(key.clone(), Running { lease, worker, passive, used, told: Arc::default() });
                        act.metrics.claimed.increment(1);
                        act.metrics.keys.set(act.running.len() as f64);
                        claimed.push(key.clone());
                        ctx.spawn(lost.into_actor(act).map(move |_, act, _| act.lost(&key, token)));
                    }
                    // What waited for these keys while no one held them.
                    act.read_mail(ctx, claimed);
                }
                Err(e) => warn!(pool.name = %act.name, error = %e, "cannot claim keys"),
            }));
        }));
    }
}
