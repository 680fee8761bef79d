//! Leases the table says this process holds that no handle here has: handed to it by a
//! release (taken by the waiter whose turn it is, taken from the table when the announcement
//! was missed, given back when nobody here waits any more), or granted by an attempt whose
//! answer was lost (released).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pgcoord::db::Backoff;
use pgcoord::lease::Grant;
use pgcoord::{ErrorKind, LeaseTable, Pool};
use tracing::{debug, warn};

use super::LockManager;
use super::acquire::{AcquireJob, Outcome, Placed};
use super::wake::{Handed, NameQueue};

/// How many granted tokens a manager remembers (see [`RecentGrants`]).
const RECENT_GRANTS: usize = 4096;

/// The tokens of the leases this manager was granted lately, however (an attempt, a handover,
/// a claim). A handover's announcement can arrive after its lease was taken — from the table,
/// at an attempt that found it ours — and even after the lease left `held` for its release,
/// with the release statement still under way: the row still says ours, and giving it "back"
/// would race the holder's own release, which then reported a lease it released as lost
/// (seen once in a smoke run of the benchmark). A token we were granted is never unclaimed.
#[derive(Debug, Default)]
pub(crate) struct RecentGrants {
    order: VecDeque<i64>,
    tokens: HashSet<i64>,
}

impl RecentGrants {
    /// Remembers `token`, forgetting the oldest beyond [`RECENT_GRANTS`].
    pub(crate) fn remember(&mut self, token: i64) {
        if self.tokens.insert(token) {
            self.order.push_back(token);
        }
        if self.order.len() > RECENT_GRANTS
            && let Some(oldest) = self.order.pop_front()
        {
            self.tokens.remove(&oldest);
        }
    }

    /// Whether this manager was granted `token` lately.
    pub(crate) fn contains(&self, token: i64) -> bool {
        self.tokens.contains(&token)
    }
}

impl LockManager {
    /// A release announced it handed `name` to this process. The waiter whose turn it is takes
    /// it (see `AcquireJob::take_handed`); when nobody here waits for it any
    /// more (the waiter gave up as it was handed over) it is released at once, if the row says
    /// it is ours, so the next in line need not wait for it to expire. Already ours (taken from
    /// the table, its announcement late; held still, or released since, or being released):
    /// nothing to do (see [`RecentGrants`]).
    pub(crate) fn handed_over(&mut self, name: &str, handed: Handed) {
        let token = handed.token;
        // Ours already (taken from the table, its announcement late): held — however long ago
        // it was granted — or granted lately and being released.
        let held = self.held.get(name).is_some_and(|held| held.token == token);
        if held || self.recent_grants.contains(token) {
            return;
        }
        if self.queues.hand_over(name, handed) {
            return;
        }
        let (table, pool, name) = (self.table.clone(), self.pool.clone(), name.to_owned());
        let owner = self.config.owner().to_owned();
        // Not on the actor's context: the release must finish even if the manager stops.
        tokio::spawn(async move { release_unclaimed(&table, &pool, &name, token, &owner).await });
    }
}

/// Releases a lease a release handed to this process that no waiter here took (the waiter
/// gave up as it was handed over), so the next in line gets it now rather than at its expiry —
/// when the table says it is ours with that token. An announcement is not proof: it may be late
/// (released already) or not a release's at all (anyone may NOTIFY the channel, and tokens are
/// seen on it), and must never make this process release another's lease.
pub(crate) async fn release_unclaimed(
    table: &LeaseTable,
    pool: &Pool,
    name: &str,
    token: i64,
    owner: &str,
) {
    let statements = pool.idempotent(None);
    // Tokens name one grant each: if the row still has this one, it is the grant to `owner`,
    // and the release below (matching the token) can end nothing else.
    let ours = match table.get(&statements, name).await {
        Ok(info) => info.owner.as_deref() == Some(owner) && info.token == Some(token),
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => {
            warn!(%name, token, error = %e, "cannot check a lease handed over after its waiter left; if ours, it expires on its own");
            return;
        }
    };
    if !ours {
        debug!(%name, token, "a lease announced as handed to us is not ours (released already, or never)");
        return;
    }
    match table.release(&statements, name, owner, token, false).await {
        Ok(()) => debug!(%name, token, "released a lease handed over after its waiter left"),
        // Taken from the table and released already, its announcement late: nothing left.
        Err(e) if e.kind() == ErrorKind::LockLost => {
            debug!(%name, token, "a lease handed over was released already")
        }
        Err(e) => {
            warn!(%name, token, error = %e, "cannot release a lease handed over after its waiter left; it expires on its own")
        }
    }
}

/// How the leases handed to a manager were taken (see `ManagerStats`).
#[derive(Debug, Default)]
pub(crate) struct HandoverCounts {
    /// Held from the announcement alone, its nonce the waiter's.
    pub(crate) from_announcement: AtomicU64,
    /// Held after reading the row.
    pub(crate) from_row: AtomicU64,
}

impl AcquireJob {
    /// [`release_unclaimed`] on this job's pool: a token handed over that its wait left behind.
    pub(crate) async fn give_back(&self, name: &str, token: i64) {
        release_unclaimed(&self.table, &self.pool, name, token, &self.owner).await;
    }

    /// Takes a lease a release handed to this wait, as its announcement tells it.
    ///
    /// An announcement naming the nonce of our last refused attempt (`placed`) is proof: the
    /// nonce is random, new per attempt, and seen only by the server until the handover spends
    /// it, so the grant is this wait's, made after that attempt was sent, with our data. It is
    /// held without a statement, its deadline counted from that attempt — unless that is a third
    /// of the lease ago or more: then less than the heartbeat (at most half the lease) plus the
    /// margin could be left by our clock, and the row is read for the server's time left. Nor
    /// when an orphan check of the name began since that attempt (after an attempt of unknown
    /// outcome, ours or a semaphore permit's whose slot has this name): it releases any lease
    /// of the name this owner holds, the handed one too, so the row decides.
    ///
    /// Any other announcement is not taken on its word: it may be late (a grant of an earlier
    /// wait, taken from the table and let go before its announcement was heard, which once made
    /// an election term of a stale token), from a place of an older version (no nonce), or not a
    /// release's at all (anyone may NOTIFY the channel). One read of the row makes it exact
    /// (`adopt`).
    pub(crate) async fn take_handed(
        &self,
        queue: &NameQueue,
        handed: Handed,
        placed: Option<Placed>,
    ) -> Option<Outcome> {
        let name = &self.request.name;
        if let Some(Placed {
            nonce,
            sent,
            orphan_checks,
        }) = placed
            && handed.nonce == Some(nonce)
            && sent.elapsed() < self.lease / 3
            && queue.orphan_checks() == orphan_checks
        {
            let grant = Grant {
                token: handed.token,
                data: self.request.data.as_ref().map(|d| d.to_vec()),
            };
            debug!(%name, token = handed.token, "took a lease handed to us");
            (self.handovers.from_announcement).fetch_add(1, Ordering::Relaxed);
            return Some(Outcome::Granted { grant, sent });
        }
        self.adopt(name, handed.token).await
    }

    /// Takes a lease the table says this owner holds with `token` while the manager does not:
    /// safe because this job holds the name's turn (as for `release_orphan`). Its data and
    /// remaining time are read from the row; `None` when the row says otherwise now, or leaves
    /// less than two thirds of the lease (it is waited out then).
    pub(crate) async fn adopt(&self, name: &str, token: i64) -> Option<Outcome> {
        let statements = self.pool.idempotent(None);
        let sent = Instant::now();
        let info = match self.table.get(&statements, name).await {
            Ok(info) => info,
            Err(e) => {
                debug!(%name, error = %e, "cannot read a lease handed to us; asking again later");
                return None;
            }
        };
        // Two thirds of the lease left at least, so the heartbeat (at most half the lease)
        // renews it before the deadline (less the margin, a tenth) passes.
        let remaining = info.remaining.filter(|r| *r > self.lease * 2 / 3)?;
        if info.owner.as_deref() != Some(self.owner.as_str()) || info.token != Some(token) {
            return None;
        }
        // The tenure's deadline is `sent + lease`, less the margin: start it as far back as
        // the server's remaining time says.
        let sent = sent.checked_sub(self.lease.saturating_sub(remaining))?;
        let grant = Grant {
            token,
            data: info.data,
        };
        debug!(%name, token, ?remaining, "took a lease handed to us, as its row says");
        self.handovers.from_row.fetch_add(1, Ordering::Relaxed);
        Some(Outcome::Granted { grant, sent })
    }

    /// After an acquire whose outcome is unknown: frees a grant of `name` to this owner, if the
    /// statement made one. Safe here because this job holds the name's turn and the manager
    /// does not hold the name, so no tenure of ours can be legitimate. True when it is known
    /// that nothing is left.
    ///
    /// Asked again, after a backoff, while the caller's `deadline` allows: a connection that
    /// stopped answering is found only when its statement's bound passes (and is then
    /// discarded), and a network that black-holed one pooled connection usually black-holed the
    /// idle others too, so the first check may land on one of them.
    pub(crate) async fn release_orphan(&self, name: &str, deadline: Option<Instant>) -> bool {
        self.queues.orphan_check(name);
        for attempt in 0.. {
            let statements = self.pool.idempotent(None);
            let e = match (self.table)
                .release_orphan(&statements, name, &self.owner)
                .await
            {
                Ok(()) => return true,
                Err(e) => e,
            };
            let pause = Backoff::DEFAULT.delay(attempt);
            if e.is_unavailable() && deadline.is_some_and(|d| Instant::now() + pause < d) {
                debug!(%name, error = %e, "checking an acquire of unknown outcome failed; asking again");
                tokio::time::sleep(pause).await;
                continue;
            }
            warn!(%name, error = %e, "an acquire's outcome is unknown and its lease could not be checked; if it was granted, it expires on its own");
            break;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{RECENT_GRANTS, RecentGrants};

    #[test]
    fn recent_grants_forget_the_oldest_beyond_their_capacity_and_only_it() {
        let mut grants = RecentGrants::default();
        for token in 1..=RECENT_GRANTS as i64 {
            grants.remember(token);
        }
        assert!(grants.contains(1) && grants.contains(RECENT_GRANTS as i64));
        // Remembered twice, a token takes one place: nothing is forgotten for it.
        grants.remember(7);
        assert!(grants.contains(1));
        grants.remember(RECENT_GRANTS as i64 + 1);
        assert!(!grants.contains(1), "the oldest is forgotten");
        assert!(grants.contains(2) && grants.contains(7));
        assert!(grants.contains(RECENT_GRANTS as i64 + 1));
        assert!(!grants.contains(0));
        assert_eq!(grants.order.len(), RECENT_GRANTS);
        assert_eq!(grants.tokens.len(), RECENT_GRANTS);
    }
}
