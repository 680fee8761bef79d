//! One wait against a doorbell that lies: the wait's own code (`leases::one_wait`) decides each
//! next step; the model plays the server (a row held and renewed by another holder, released
//! at a moment of its choosing), the doorbell (the release's announcement, lost, late or
//! duplicated) and an adversary who rings it whenever it likes (anyone can NOTIFY).
//!
//! Properties: the waiter believes it holds the lease only when the server's row says so — only
//! an attempt's answer grants; and once the lease is released, the waiter is granted, even when
//! every announcement is lost (the wait's naps are bounded by its poll). Time passes only when
//! the waiter has nothing due (fairness). The mutants trust a ring, or nap without the poll's
//! bound, and each yields a counterexample.

use std::time::{Duration, Instant};

use stateright::{Model, Property};

use crate::leases::one_wait::{Answer, Next, OneWait};

/// One step of real time, in model milliseconds.
const STEP: u64 = 10;
/// The other holder's lease: renewed while it holds, so a waiter's nap to its expiry is long.
const LEASE: u64 = 1_000;
/// The wait's poll: its longest nap without a ring.
const POLL: u64 = 100;
/// The other holder releases by then.
const RELEASE_BY: u64 = 100;
/// How far time runs: enough for a poll after the latest release.
const HORIZON: u64 = RELEASE_BY + 2 * POLL;
/// Rings the adversary may forge, and duplicates the network may make.
const FORGED: u8 = 2;
const DUPLICATES: u8 = 1;

/// What is changed, to show the model finds the bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// The code as it is.
    None,
    /// A ring is taken for a grant: no attempt asked.
    TrustRing,
    /// Naps without the poll's bound (only the holder's expiry ends one).
    NoPoll,
}

pub(crate) struct Waiting {
    base: Instant,
    mutant: Mutant,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Stage {
    /// An attempt is due.
    Attempt,
    /// Napping until then, or a ring.
    Nap(u64),
    /// Granted: believes it holds.
    Granted,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    real: u64,
    wait: OneWait,
    stage: Stage,
    /// The row: held by the other holder, by the waiter, or free.
    other_holds: bool,
    waiter_holds: bool,
    token: i64,
    /// Rings on their way to the waiter.
    rings: u8,
    forged: u8,
    duplicated: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    Attempt,
    Ring,
    LoseRing,
    DuplicateRing,
    Forge,
    Release,
}

impl Waiting {
    pub(crate) fn new(mutant: Mutant) -> Waiting {
        Waiting {
            base: Instant::now(),
            mutant,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// The server's answer to an attempt at `real`: a grant of a free row, else its holder.
    fn answer(&self, state: &mut State) -> Answer<i64> {
        if state.other_holds {
            return Answer::Held(Some(pgcoord::__private::holder(
                "other".into(),
                state.token,
                // Renewed while held: a whole lease left.
                Duration::from_millis(LEASE),
            )));
        }
        state.token += 1;
        state.waiter_holds = true;
        Answer::Granted(state.token)
    }

    /// A nap's end, rounded up to a step.
    fn nap_until(&self, real: u64, nap: Duration) -> u64 {
        let nap = match self.mutant {
            // Without the poll's bound, the nap is the holder's expiry.
            Mutant::NoPoll => Duration::from_millis(LEASE),
            _ => nap,
        };
        let ms = nap.as_millis() as u64;
        real + ms.div_ceil(STEP) * STEP
    }
}

impl Model for Waiting {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // A first attempt plain, or in line (the name was contended here lately).
        [false, true]
            .map(|contended| State {
                real: 0,
                wait: OneWait::new(None, Duration::from_millis(POLL), false)
                    .in_line_first(contended),
                stage: Stage::Attempt,
                other_holds: true,
                waiter_holds: false,
                token: 1,
                rings: 0,
                forged: 0,
                duplicated: 0,
            })
            .into()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let due = match state.stage {
            Stage::Attempt => true,
            Stage::Nap(until) => until <= state.real,
            Stage::Granted => false,
        };
        if due {
            actions.push(Action::Attempt);
        }
        // Time passes only when the waiter has nothing due, and the other holder releases by
        // `RELEASE_BY`.
        let must_release = state.other_holds && state.real >= RELEASE_BY;
        if !due && !must_release && state.real < HORIZON {
            actions.push(Action::Tick);
        }
        if matches!(state.stage, Stage::Nap(_)) && state.rings > 0 {
            actions.push(Action::Ring);
        }
        if state.rings > 0 {
            actions.push(Action::LoseRing);
            if state.duplicated < DUPLICATES {
                actions.push(Action::DuplicateRing);
            }
        }
        if state.forged < FORGED {
            actions.push(Action::Forge);
        }
        if state.other_holds {
            actions.push(Action::Release);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.real += STEP,
            Action::Attempt => {
                state.wait.ask();
                let answer = self.answer(&mut state);
                state.stage = match state.wait.after(answer, self.at(state.real)) {
                    Next::Granted(_) => Stage::Granted,
                    Next::Again => Stage::Attempt,
                    Next::Nap(nap) => Stage::Nap(self.nap_until(state.real, nap)),
                    other => unreachable!("no failures in this model: {other:?}"),
                };
            }
            Action::Ring => {
                state.rings -= 1;
                state.stage = match self.mutant {
                    // The bug: a ring believed.
                    Mutant::TrustRing => Stage::Granted,
                    _ => Stage::Attempt,
                };
            }
            Action::LoseRing => state.rings -= 1,
            Action::DuplicateRing => {
                state.rings += 1;
                state.duplicated += 1;
            }
            Action::Forge => {
                state.rings += 1;
                state.forged += 1;
            }
            Action::Release => {
                state.other_holds = false;
                // The release's announcement.
                state.rings += 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("only an attempt's answer grants", |_, s: &State| {
                s.stage != Stage::Granted || s.waiter_holds
            }),
            Property::eventually("a released lease reaches its waiter", |_, s: &State| {
                s.stage == Stage::Granted
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use stateright::Checker;

    use super::*;

    fn check(mutant: Mutant) -> impl Checker<Waiting> {
        super::super::explore(&format!("wait {mutant:?}"), Waiting::new(mutant))
    }

    #[test]
    fn a_wait_is_granted_only_by_an_attempt_and_always_once_the_lease_is_free() {
        check(Mutant::None).assert_properties();
    }

    #[test]
    fn a_wait_that_believes_a_ring_holds_what_another_holds() {
        check(Mutant::TrustRing).assert_any_discovery("only an attempt's answer grants");
    }

    #[test]
    fn a_wait_without_the_polls_bound_misses_a_release_whose_announcement_is_lost() {
        check(Mutant::NoPoll).assert_any_discovery("a released lease reaches its waiter");
    }
}
