//! A pool's membership: its member lease, its weight, and the live members (by owner) and their
//! changes as its callers see them.

use actix::prelude::*;
use pgcoord::LeaseInfo;

use super::plan::Member;
use crate::leases::Lease;

/// This process's membership of a pool, and the members it last read.
pub(super) struct Membership {
    /// The member lease (`{pool}/members/{owner}`), once acquired.
    lease: Option<Lease>,
    /// The live members at the last tick, by owner (this one included once registered).
    members: Vec<String>,
    watchers: Vec<Recipient<MembersChanged>>,
    /// This member's weight: its share is its part of the members' total weight.
    weight: u32,
}

impl Default for Membership {
    fn default() -> Membership {
        Membership {
            lease: None,
            members: Vec::new(),
            watchers: Vec::new(),
            weight: 1,
        }
    }
}

impl Membership {
    /// Weighs `weight` (at least 1).
    pub(super) fn weigh(&mut self, weight: u32) {
        self.weight = weight.max(1);
    }

    pub(super) fn weight(&self) -> u32 {
        self.weight
    }

    /// Whether the member lease is to be acquired: none yet, or lost.
    pub(super) fn needs_lease(&self) -> bool {
        (self.lease.as_ref()).is_none_or(|m| m.loss().is_some())
    }

    /// The member lease's token while it is held.
    pub(super) fn token(&self) -> Option<i64> {
        (self.lease.as_ref())
            .filter(|m| m.loss().is_none())
            .map(Lease::token)
    }

    /// Keeps the member lease just acquired.
    pub(super) fn keep(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// Lets the member lease go: the other members' shares grow to cover this one's keys.
    pub(super) fn leave(&mut self) {
        if let Some(membership) = self.lease.take() {
            actix::spawn(async move {
                let _ = membership.release().await;
            });
        }
    }

    /// The members read at this tick: watchers are told of a change.
    pub(super) fn set(&mut self, now: Vec<String>) {
        if let Some(change) = change(&self.members, &now) {
            // A watcher that stopped is dropped.
            self.watchers.retain(|w| w.try_send(change.clone()).is_ok());
        }
        self.members = now;
    }

    /// How many members there are, this one at least.
    pub(super) fn count(&self) -> usize {
        self.members.len().max(1)
    }

    /// Tells `watcher` of the members now, when there are any yet, and of their changes.
    pub(super) fn subscribe(&mut self, watcher: Recipient<MembersChanged>) {
        if let Some(now) = change(&[], &self.members)
            && watcher.try_send(now).is_err()
        {
            return;
        }
        self.watchers.push(watcher);
    }
}

/// Tell `0` the pool's live members now, and again whenever they change: what
/// [`Workers::members`](super::Workers::members) sends to a running pool
/// ([`WorkerPool::members_to`](super::WorkerPool::members_to) before it starts).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct SubscribeMembers(pub(crate) Recipient<MembersChanged>);

/// The live members of a pool, by owner, sorted, and how they changed since the last time.
/// The first one a subscriber gets lists every member as joined.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub struct MembersChanged {
    /// Every live member now.
    pub members: Vec<String>,
    /// Members that were not live before.
    pub joined: Vec<String>,
    /// Members that are live no more.
    pub left: Vec<String>,
}

/// The owners whose member lease (`{prefix}{owner}`) is held, sorted.
pub(super) fn live(infos: &[LeaseInfo], prefix: &str) -> Vec<String> {
    let mut owners: Vec<String> = (infos.iter())
        .filter(|info| info.is_held())
        .filter_map(|info| info.name.strip_prefix(prefix).map(str::to_owned))
        .collect();
    owners.sort();
    owners
}

/// The members whose member lease (`{prefix}{owner}`) is held, with their weights. A member
/// lease without a weight (an older version's) weighs 1.
pub(super) fn weighed(infos: &[LeaseInfo], prefix: &str) -> Vec<Member> {
    (infos.iter())
        .filter(|info| info.is_held())
        .filter_map(|info| {
            let owner = info.name.strip_prefix(prefix)?.to_owned();
            let weight = info.value::<u32>().ok().flatten().unwrap_or(1).max(1);
            Some(Member { owner, weight })
        })
        .collect()
}

/// The change from `before` to `now` (both sorted); `None` when there is none.
pub(super) fn change(before: &[String], now: &[String]) -> Option<MembersChanged> {
    let joined: Vec<String> = now
        .iter()
        .filter(|m| !before.contains(m))
        .cloned()
        .collect();
    let left: Vec<String> = before
        .iter()
        .filter(|m| !now.contains(m))
        .cloned()
        .collect();
    (!joined.is_empty() || !left.is_empty()).then(|| MembersChanged {
        members: now.to_vec(),
        joined,
        left,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::plan::share;

    const P: &str = "p/members/";

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn member(owner: &str, weight: Option<u32>, held: bool) -> LeaseInfo {
        pgcoord::__private::lease_info(
            format!("p/members/{owner}"),
            Some(owner.into()),
            Some(1),
            weight.map(|w| pgcoord::signal::to_payload(&w).unwrap()),
            Some(std::time::Duration::from_secs(u64::from(held))),
        )
    }

    #[test]
    fn shares_follow_the_weights_and_cover_every_key() {
        let infos = [member("a", Some(1), true), member("b", Some(3), true)];
        assert_eq!(share(&weighed(&infos, P), "a", 1, 40), 10);
        assert_eq!(share(&weighed(&infos, P), "b", 3, 40), 30);
        // Rounded up: 41 keys, shares 11 and 31.
        assert_eq!(share(&weighed(&infos, P), "a", 1, 41), 11);
        // No weight stored (an older member): 1. An expired member: not counted.
        let infos = [member("a", None, true), member("b", Some(2), false)];
        assert_eq!(share(&weighed(&infos, P), "a", 1, 10), 10);
        // Not yet registered: counted with its own weight.
        assert_eq!(share(&weighed(&infos, P), "c", 1, 10), 5);
    }

    #[test]
    fn changes_name_who_joined_and_who_left() {
        assert_eq!(change(&names(&["a", "b"]), &names(&["a", "b"])), None);
        assert_eq!(
            change(&names(&["a", "b"]), &names(&["b", "c"])),
            Some(MembersChanged {
                members: names(&["b", "c"]),
                joined: names(&["c"]),
                left: names(&["a"]),
            })
        );
        let first = change(&[], &names(&["a"])).unwrap();
        assert_eq!((first.joined, first.left), (names(&["a"]), vec![]));
    }
}
