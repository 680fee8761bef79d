//! A pool's membership as its callers see it: the live members (by owner) and their changes.

use actix::prelude::*;
use pgcoord::LeaseInfo;

/// Tell `0` the pool's live members now, and again whenever they change (read at each tick,
/// so a join or leave is told within about a quarter lease of the table showing it).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SubscribeMembers(pub Recipient<MembersChanged>);

/// The live members of a pool, by owner, sorted, and how they changed since the last time.
/// The first one a subscriber gets lists every member as joined.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
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

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
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
