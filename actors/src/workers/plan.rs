//! A pool's round, apart from I/O: from the members and keys read on the server and the keys
//! held here, which keys to let go and which to claim. `rebalance` runs it.
//!
//! Each member takes its fair share, its weight's part of the keys rounded up, so the shares
//! cover every key. Above it a member lets keys go; below it, it claims keys nobody holds. At
//! most `max_moves` keys go each way per round, and a round either lets go or claims, never
//! both: a key let go is claimed by another member at its next round.

use std::collections::HashSet;

/// A live member of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Member {
    pub(crate) owner: String,
    /// Its part of the keys: at least 1.
    pub(crate) weight: u32,
}

/// What a round decides from.
#[derive(Debug, Clone)]
pub(crate) struct Round<'a> {
    /// This member's owner and weight.
    pub(crate) me: &'a str,
    pub(crate) weight: u32,
    /// The live members read this round (this one once its member lease is in the table).
    pub(crate) members: &'a [Member],
    /// The pool's keys, in the order they are claimed: its own, then those recorded under it.
    pub(crate) keys: Vec<&'a str>,
    /// The keys held here, in the order they are let go.
    pub(crate) running: Vec<&'a str>,
    /// The keys whose lease anyone holds, as read this round.
    pub(crate) taken: HashSet<&'a str>,
    /// The most keys let go, and claimed, in one round.
    pub(crate) max_moves: usize,
    /// The member hands every key over.
    pub(crate) draining: bool,
    /// The member's first round: processes starting together register before anyone claims.
    pub(crate) first: bool,
}

/// What a round does.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Moves {
    /// Keys held here to let go (each worker stopped first).
    pub(crate) release: Vec<String>,
    /// Free keys to claim.
    pub(crate) claim: Vec<String>,
}

/// The moves of `round`.
pub(crate) fn plan(round: &Round<'_>) -> Moves {
    if round.draining {
        let release = drain(round.running.iter().copied(), round.max_moves);
        return Moves {
            release,
            claim: Vec::new(),
        };
    }
    if round.first {
        return Moves::default();
    }
    let share = share(round.members, round.me, round.weight, round.keys.len());
    let held = round.running.len();
    if held > share {
        let release = (round.running.iter())
            .take((held - share).min(round.max_moves))
            .map(|k| k.to_string())
            .collect();
        return Moves {
            release,
            claim: Vec::new(),
        };
    }
    let running: HashSet<&str> = round.running.iter().copied().collect();
    let claim = (round.keys.iter())
        .filter(|k| !running.contains(*k) && !round.taken.contains(*k))
        .take((share - held).min(round.max_moves))
        .map(|k| k.to_string())
        .collect();
    Moves {
        release: Vec::new(),
        claim,
    }
}

/// A draining member's keys to let go this round: `max_moves` of those it holds.
pub(crate) fn drain<'a>(
    running: impl IntoIterator<Item = &'a str>,
    max_moves: usize,
) -> Vec<String> {
    running
        .into_iter()
        .take(max_moves)
        .map(str::to_owned)
        .collect()
}

/// This member's share of `keys`: its weight's part of the live members' total weight, rounded
/// up (so the shares cover every key). `mine` counts until this member is among `members`.
pub(crate) fn share(members: &[Member], me: &str, mine: u32, keys: usize) -> usize {
    let mut total: u64 = members.iter().map(|m| u64::from(m.weight)).sum();
    if !members.iter().any(|m| m.owner == me) {
        total += u64::from(mine);
    }
    (keys as u64 * u64::from(mine)).div_ceil(total.max(1)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn members(weights: &[(&str, u32)]) -> Vec<Member> {
        (weights.iter())
            .map(|(owner, weight)| Member {
                owner: owner.to_string(),
                weight: *weight,
            })
            .collect()
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("k{i:02}")).collect()
    }

    /// A fleet of members sharing `keys`, each holding a set of them; every round, each
    /// member in turn reads the server (who holds what) and makes its moves.
    struct Fleet {
        members: Vec<Member>,
        keys: Vec<String>,
        held: BTreeMap<String, Vec<String>>,
        max_moves: usize,
    }

    impl Fleet {
        fn new(weights: &[(&str, u32)], keys: usize, max_moves: usize) -> Fleet {
            Fleet {
                members: members(weights),
                keys: self::keys(keys),
                held: (weights.iter())
                    .map(|(owner, _)| (owner.to_string(), Vec::new()))
                    .collect(),
                max_moves,
            }
        }

        /// Member `me`'s round; its moves, applied.
        fn round(&mut self, me: &str) -> Moves {
            let weight = self.members.iter().find(|m| m.owner == me).unwrap().weight;
            let taken = self.held.values().flatten().map(String::as_str).collect();
            let moves = plan(&Round {
                me,
                weight,
                members: &self.members,
                keys: self.keys.iter().map(String::as_str).collect(),
                running: self.held[me].iter().map(String::as_str).collect(),
                taken,
                max_moves: self.max_moves,
                draining: false,
                first: false,
            });
            let held = self.held.get_mut(me).unwrap();
            held.retain(|k| !moves.release.contains(k));
            held.extend(moves.claim.iter().cloned());
            moves
        }

        /// A round of every member, no key ever held twice; whether any moved.
        fn rounds(&mut self) -> bool {
            let owners: Vec<String> = self.members.iter().map(|m| m.owner.clone()).collect();
            let mut moved = false;
            for owner in owners {
                let moves = self.round(&owner);
                self.check_exclusive();
                moved |= !moves.release.is_empty() || !moves.claim.is_empty();
            }
            moved
        }

        /// Rounds until none moves (at most a hundred); how many moved.
        fn settle(&mut self) -> usize {
            let moved = (0..100).take_while(|_| self.rounds()).count();
            assert!(moved < 100, "never settles: {:?}", self.held);
            moved
        }

        fn counts(&self) -> Vec<usize> {
            self.held.values().map(Vec::len).collect()
        }

        /// Every key is held by exactly one member.
        fn check_exclusive(&self) {
            let all: Vec<&String> = self.held.values().flatten().collect();
            let distinct: HashSet<&String> = all.iter().copied().collect();
            assert_eq!(
                all.len(),
                distinct.len(),
                "a key held twice: {:?}",
                self.held
            );
        }
    }

    #[test]
    fn the_fair_share_is_the_keys_over_the_members_rounded_up_and_follows_the_weights() {
        let two = members(&[("a", 1), ("b", 1)]);
        assert_eq!(share(&two, "a", 1, 10), 5);
        assert_eq!(
            share(&two, "a", 1, 11),
            6,
            "rounded up: the shares cover every key"
        );
        // Not yet among the members read: counted with its own weight.
        assert_eq!(share(&two, "c", 1, 9), 3);
        let weighed = members(&[("a", 1), ("b", 3)]);
        assert_eq!(share(&weighed, "a", 1, 40), 10);
        assert_eq!(share(&weighed, "b", 3, 40), 30);
        assert_eq!(share(&weighed, "a", 1, 41), 11);
        assert_eq!(share(&[], "a", 1, 0), 0);
        // Three members, by weight 1, 2, 3, over 60 keys: 10, 20, 30 once settled.
        let mut fleet = Fleet::new(&[("a", 1), ("b", 2), ("c", 3)], 60, usize::MAX);
        fleet.settle();
        assert_eq!(fleet.counts(), [10, 20, 30]);
        fleet.check_exclusive();
    }

    #[test]
    fn at_most_max_moves_keys_go_each_way_per_round() {
        let mut fleet = Fleet::new(&[("a", 1), ("b", 1)], 20, 3);
        let first = fleet.round("a");
        assert_eq!(first.claim.len(), 3, "{first:?}");
        let rounds = fleet.settle();
        fleet.check_exclusive();
        assert_eq!(fleet.counts(), [10, 10]);
        assert!(rounds >= 3, "ten keys each, three a round: {rounds} rounds");
        // b leaves: a takes its keys three a round.
        fleet.members.retain(|m| m.owner == "a");
        fleet.held.remove("b");
        let moves = fleet.round("a");
        assert_eq!(moves.claim.len(), 3, "{moves:?}");
        // Too many held (a new member, a weight): three let go a round.
        let round = Round {
            me: "a",
            weight: 1,
            members: &members(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]),
            keys: fleet.keys.iter().map(String::as_str).collect(),
            running: fleet.keys.iter().map(String::as_str).collect(),
            taken: HashSet::new(),
            max_moves: 3,
            draining: false,
            first: false,
        };
        assert_eq!(plan(&round).release.len(), 3);
        assert_eq!(
            plan(&Round {
                max_moves: 100,
                ..round
            })
            .release
            .len(),
            15
        );
    }

    #[test]
    fn a_member_that_joins_gets_its_share_within_two_rounds() {
        let mut fleet = Fleet::new(&[("a", 1)], 10, usize::MAX);
        assert!(fleet.rounds());
        assert_eq!(fleet.counts(), [10]);
        fleet.members.push(Member {
            owner: "b".into(),
            weight: 1,
        });
        fleet.held.insert("b".into(), Vec::new());
        // Round one: b finds every key held, a lets its extra keys go.
        fleet.round("b");
        fleet.round("a");
        // Round two: b claims them.
        fleet.round("b");
        assert_eq!(fleet.counts(), [5, 5]);
        fleet.check_exclusive();
        assert!(!fleet.rounds(), "settled");
    }

    #[test]
    fn a_draining_member_lets_every_key_go_max_moves_a_round_and_claims_none() {
        let all = keys(7);
        let mut running: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut rounds = 0;
        while !running.is_empty() && rounds < 10 {
            let moves = plan(&Round {
                me: "a",
                weight: 1,
                members: &members(&[("b", 1)]),
                keys: all.iter().map(String::as_str).collect(),
                running: running.clone(),
                taken: HashSet::new(),
                max_moves: 3,
                draining: true,
                first: false,
            });
            assert!(
                moves.claim.is_empty() && moves.release.len() <= 3,
                "{moves:?}"
            );
            running.retain(|k| !moves.release.iter().any(|r| r == k));
            rounds += 1;
        }
        assert_eq!(rounds, 3, "7 keys, 3 a round");
        // Drained on the first round too.
        let moves = plan(&Round {
            me: "a",
            weight: 1,
            members: &[],
            keys: Vec::new(),
            running: vec!["k00"],
            taken: HashSet::new(),
            max_moves: 3,
            draining: true,
            first: true,
        });
        assert_eq!(moves.release, ["k00"]);
    }

    #[test]
    fn a_round_never_lets_go_and_claims_the_same_key_nor_claims_a_held_one() {
        let all = keys(12);
        let three = members(&[("a", 1), ("b", 1), ("c", 1)]);
        // Every split of held keys between a (here), others, and free.
        for mask in 0..3u32.pow(6) {
            let (mut running, mut taken) = (Vec::new(), HashSet::new());
            let mut m = mask;
            for key in all.iter().take(6) {
                match m % 3 {
                    0 => {
                        running.push(key.as_str());
                        taken.insert(key.as_str());
                    }
                    1 => {
                        taken.insert(key.as_str());
                    }
                    _ => {}
                }
                m /= 3;
            }
            let moves = plan(&Round {
                me: "a",
                weight: 1,
                members: &three,
                keys: all.iter().map(String::as_str).collect(),
                running: running.clone(),
                taken: taken.clone(),
                max_moves: 2,
                draining: false,
                first: false,
            });
            assert!(
                moves.release.is_empty() || moves.claim.is_empty(),
                "{moves:?}"
            );
            assert!(moves.release.iter().all(|k| running.contains(&k.as_str())));
            assert!(moves.claim.iter().all(|k| !taken.contains(k.as_str())));
        }
    }

    #[test]
    fn a_balanced_pool_moves_nothing_and_a_first_round_claims_nothing() {
        let mut fleet = Fleet::new(&[("a", 1), ("b", 1), ("c", 1)], 10, usize::MAX);
        fleet.settle();
        let mut counts = fleet.counts();
        counts.sort();
        assert_eq!(counts, [2, 4, 4], "shares of 4 cover the 10 keys");
        for _ in 0..3 {
            assert!(!fleet.rounds(), "stable once balanced: {:?}", fleet.held);
        }
        let moves = plan(&Round {
            me: "a",
            weight: 1,
            members: &members(&[("a", 1)]),
            keys: vec!["k"],
            running: Vec::new(),
            taken: HashSet::new(),
            max_moves: 3,
            draining: false,
            first: true,
        });
        assert_eq!(moves, Moves::default());
    }
}
