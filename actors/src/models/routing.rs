//! A routed ask across a worker pool's key handoff: the pool's own round (`workers::plan`)
//! decides which keys each member lets go and claims, and the member's own verdict
//! (`workers::deliver::verdict`) what it does with a routed message; the model plays the lease
//! table (a grant only of a free row; a lost lease's row expires only after its holder learnt
//! of the loss, which `models::holding` checks), the members' claims and releases on their way,
//! a member losing a lease, draining or joining, and one router's ask: one statement reads the
//! key's holder and notifies it, the request lost or late, the answer lost, a "not here" sent
//! again (same id) until the router's deadline.
//!
//! Properties: the ask is handled at most once; only where its key's lease is held; a key runs
//! on one member at a time; and once the faults stop, every key is held. Time passes in ticks,
//! each a round of every member, and only once every statement under way has been applied
//! (fairness); faults come in the first ticks. A member remembers the ids it delivered for as
//! long as their senders wait: here, to the end (a copy that arrives later is a replay, a
//! request anyone who can NOTIFY can send, out of the model). The mutants resend after no
//! answer, forget delivered ids, or deliver on the notification's word that the member holds
//! the key; each yields a counterexample. So do the limits route.rs states: a forged "not
//! here", or a replayed request, while the key moves.

use crate::workers::deliver::{Verdict, verdict};
use crate::workers::plan::{self, Member, Round};

const MEMBERS: [&str; 2] = ["a", "b"];
/// The pool's keys, in the order they are claimed; the ask goes to the first.
const KEYS: [&str; 2] = ["k", "j"];
const ASKED: usize = 0;
/// The router's sends (and looks that found no holder) before its deadline.
const SENDS: u8 = 3;
/// Faults come in the ticks before this one.
const FAULTS_BY: u8 = 2;
/// Ticks run until then: enough for the rounds to settle after the last fault.
const HORIZON: u8 = FAULTS_BY + 2;

/// What is changed in the code, to show the model finds the bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// The code as it is.
    None,
    /// The router sends again after no answer came (a timeout), not only after "not here".
    ResendOnTimeout,
    /// A member does not remember the ids it delivered.
    Forgetful,
    /// A member delivers while its key's worker is there, its lease's loss not looked at: on
    /// the notification's word that it holds the key.
    DeliverWithoutLease,
}

/// What the model's world may do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults {
    /// Leases members may lose (paused past the margin, or cut off from the database).
    pub(crate) losses: u8,
    /// Member `b` starts outside the pool and joins it.
    pub(crate) join: bool,
    /// Member `b` drains: leaves the membership and hands its keys over.
    pub(crate) drain: bool,
    /// Copies of a request the network may deliver (a replay: PostgreSQL sends each once).
    pub(crate) duplicates: u8,
    /// "Not here" answers an adversary may forge.
    pub(crate) forged: u8,
}

/// The fault-free world: requests and answers may still be lost or late.
const CALM: Faults = Faults {
    losses: 0,
    join: false,
    drain: false,
    duplicates: 0,
    forged: 0,
};

pub(crate) struct Routing {
    keys: usize,
    faults: Faults,
    mutant: Mutant,
}

/// One member's tenure of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Tenure {
    Free,
    /// The claim statement is on its way.
    Claiming,
    /// Granted on the server; the answer is on its way.
    Granted,
    /// The worker runs.
    Running,
    /// The loss is reported; the worker is there until the member tends its crew.
    Lost,
    /// The worker stopped; the release statement is on its way.
    Releasing,
}

/// The router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Router {
    /// About to look for the key's holder.
    Idle,
    /// Waiting for the answer to this send.
    Waiting(u8),
    /// Answered with the worker's answer.
    Answered,
    /// `Timeout`: may or may not have been handled.
    MaybeHandled,
    /// `Timeout`: not delivered.
    NotDelivered,
}

/// A member's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reply {
    Handled,
    NotHere,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    ticks: u8,
    /// The members that made this tick's round.
    rounded: [bool; 2],
    /// Members holding their member lease.
    live: [bool; 2],
    /// A member whose first round is next (one that joins: it claims nothing then).
    first: [bool; 2],
    draining: [bool; 2],
    /// The lease table: each key's holder, by the server's clock.
    holder: [Option<usize>; 2],
    tenure: [[Tenure; 2]; 2],
    losses: u8,
    router: Router,
    sends: u8,
    /// Requests on their way: to a member, of a send; sorted.
    requests: Vec<(usize, u8)>,
    /// Answers on their way to the router: of a send; sorted.
    replies: Vec<(u8, Reply)>,
    duplicated: u8,
    forged: u8,
    /// The members that delivered the ask (remember its id).
    remembered: [bool; 2],
    /// How many times the ask was handled.
    handled: u8,
    /// The ask was handled where its key's lease was not held.
    unleased: bool,
    /// The router heard "not here" (and looked again).
    not_here: bool,
    /// The members ever granted the asked key.
    held_by: [bool; 2],
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    Round(usize),
    Join(usize),
    Drain(usize),
    Lose(usize, usize),
    ClaimApplies(usize, usize),
    Start(usize, usize),
    ReleaseApplies(usize, usize),
    Expire(usize),
    Look,
    NoAnswer,
    Deadline,
    Arrive(usize),
    LoseRequest(usize),
    Duplicate(usize),
    Answer(usize),
    LoseAnswer(usize),
    Forge,
}

impl Routing {
    pub(crate) fn new(keys: usize, faults: Faults, mutant: Mutant) -> Routing {
        Routing {
            keys,
            faults,
            mutant,
        }
    }

    fn members(&self) -> std::ops::Range<usize> {
        0..MEMBERS.len()
    }

    fn keys(&self) -> std::ops::Range<usize> {
        0..self.keys
    }

    /// Whether member `m` makes rounds: a member, or draining with keys still its own.
    fn active(&self, s: &State, m: usize) -> bool {
        s.live[m] || (s.draining[m] && self.keys().any(|k| s.tenure[m][k] != Tenure::Free))
    }

    /// Every statement under way applied, every lost lease expired: time may pass.
    fn settled(&self, s: &State) -> bool {
        let under_way = (self.members()).any(|m| {
            (self.keys()).any(|k| {
                matches!(
                    s.tenure[m][k],
                    Tenure::Claiming | Tenure::Granted | Tenure::Releasing
                )
            })
        });
        let expiring =
            (self.keys()).any(|k| s.holder[k].is_some_and(|m| s.tenure[m][k] != Tenure::Running));
        !under_way && !expiring
    }

    /// Member `m`'s round: its lost workers tended away, then the plan's moves.
    /// A member drains: out of the membership first; the first keys go at once (the `Drain`
    /// handler).
    fn drain(&self, s: &mut State, m: usize) {
        s.live[m] = false;
        s.draining[m] = true;
        let running: Vec<&str> = (self.keys())
            .filter(|&k| s.tenure[m][k] == Tenure::Running)
            .map(|k| KEYS[k])
            .collect();
        let going = plan::drain(running, usize::MAX);
        self.release(s, m, &going);
    }

    /// Request `i` reaches its member, which decides with the code's own verdict.
    fn arrive(&self, s: &mut State, i: usize) {
        let (m, send) = s.requests.remove(i);
        let first = s.remembered[m].then_some(Reply::Handled);
        let reply = match verdict(first, || self.awake(s, m)) {
            Verdict::Repeat(first) => first,
            Verdict::Deliver(()) => {
                s.handled += 1;
                s.unleased |= s.holder[ASKED] != Some(m);
                if self.mutant != Mutant::Forgetful {
                    s.remembered[m] = true;
                }
                Reply::Handled
            }
            Verdict::NotHere => Reply::NotHere,
        };
        insert(&mut s.replies, (send, reply));
    }

    fn round(&self, s: &mut State, m: usize) {
        for k in self.keys() {
            if s.tenure[m][k] == Tenure::Lost {
                s.tenure[m][k] = Tenure::Free;
            }
        }
        let members: Vec<Member> = (self.members())
            .filter(|&i| s.live[i])
            .map(|i| Member {
                owner: MEMBERS[i].to_owned(),
                weight: 1,
            })
            .collect();
        let moves = plan::plan(&Round {
            me: MEMBERS[m],
            weight: 1,
            members: &members,
            keys: KEYS[..self.keys].to_vec(),
            running: (self.keys())
                .filter(|&k| s.tenure[m][k] == Tenure::Running)
                .map(|k| KEYS[k])
                .collect(),
            taken: (self.keys())
                .filter(|&k| s.holder[k].is_some())
                .map(|k| KEYS[k])
                .collect(),
            max_moves: usize::MAX,
            draining: s.draining[m],
            first: s.first[m],
        });
        s.first[m] = false;
        self.release(s, m, &moves.release);
        for key in &moves.claim {
            let k = key_index(key);
            assert_eq!(s.tenure[m][k], Tenure::Free, "claims only a free key");
            s.tenure[m][k] = Tenure::Claiming;
        }
    }

    /// Stops the workers of `keys` and sends their releases.
    fn release(&self, s: &mut State, m: usize, keys: &[String]) {
        for key in keys {
            let k = key_index(key);
            assert_eq!(
                s.tenure[m][k],
                Tenure::Running,
                "lets go only a key it runs"
            );
            s.tenure[m][k] = Tenure::Releasing;
        }
    }

    /// Whether member `m` finds the asked key's worker awake.
    fn awake(&self, s: &State, m: usize) -> Option<()> {
        let tenure = s.tenure[m][ASKED];
        let awake = match self.mutant {
            Mutant::DeliverWithoutLease => matches!(tenure, Tenure::Running | Tenure::Lost),
            _ => tenure == Tenure::Running,
        };
        awake.then_some(())
    }

    fn faulty(&self, s: &State) -> bool {
        s.ticks < FAULTS_BY
    }
}

fn key_index(key: &str) -> usize {
    KEYS.iter()
        .position(|k| *k == key)
        .expect("a key of the pool")
}

fn insert<T: Ord>(items: &mut Vec<T>, item: T) {
    let at = items.partition_point(|i| *i < item);
    items.insert(at, item);
}

mod model;
#[cfg(test)]
mod tests;
