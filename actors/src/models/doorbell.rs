//! A reader behind the doorbell: the gate's own code (`signals::doorbell::Gate`) decides when the
//! reader reads; the model plays writers who commit and ring, an adversary who rings without
//! committing (anyone can NOTIFY), reads that take time, and the gate's timers.
//!
//! Property: every commit that rang is read — some read whose snapshot was taken after the
//! commit ends — however rings fall against reads under way, put-off reads and forged floods;
//! no poll helps here, so the doorbell alone must not lose a wake-up. And a flood costs little:
//! forged rings make at most one read per gap after the first, and one spare miss after each
//! read that found something. The mutant is a reader that does
//! not act on what a read's end answers (the gate's "read again"), the bug a wing that keeps the
//! rule by hand makes; it yields a counterexample.

use std::time::{Duration, Instant};

use stateright::{Model, Property};

use crate::signals::doorbell::{Gate, Go};

/// One step of real time, in model milliseconds.
const STEP: u64 = 10;
/// Writers commit by then; the adversary rings by then too.
const ACT_BY: u64 = 80;
/// Long enough for every put-off read to run after the last ring.
const HORIZON: u64 = ACT_BY + 100;
/// A read lasts at most this long.
const READ_AT_MOST: u64 = 20;
const COMMITS: u8 = 2;
const FORGED: u8 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    None,
    /// What a read's end answers is ignored.
    IgnoreFinished,
}

pub(crate) struct Doorbell {
    base: Instant,
    mutant: Mutant,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    real: u64,
    gate: Gate,
    committed: u8,
    /// The commits some finished read saw.
    seen: u8,
    /// A read under way: what its snapshot holds, and when it started.
    reading: Option<(u8, u64)>,
    /// A put-off read's timer.
    timer: Option<u64>,
    forged: u8,
    /// Reads begun by forged rings alone (none committed since the last read).
    reads: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    CommitAndRing,
    Forge,
    FinishRead,
    Timer,
}

impl Doorbell {
    pub(crate) fn new(mutant: Mutant) -> Doorbell {
        Doorbell {
            base: Instant::now(),
            mutant,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn ms(&self, at: Instant) -> u64 {
        at.duration_since(self.base).as_millis() as u64
    }

    /// Does what the gate answered.
    fn go(&self, state: &mut State, go: Go) {
        match go {
            Go::Now => {
                state.reading = Some((state.committed, state.real));
                state.reads += 1;
            }
            Go::At(at) => state.timer = Some(self.ms(at)),
            Go::Covered => {}
        }
    }
}

impl Model for Doorbell {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            real: 0,
            gate: Gate::default(),
            committed: 0,
            seen: 0,
            reading: None,
            timer: None,
            forged: 0,
            reads: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.reading.is_some() {
            // A read ends when it likes, within its bound.
            actions.push(Action::FinishRead);
        }
        let timer_due = state.timer.is_some_and(|at| at <= state.real);
        if timer_due {
            actions.push(Action::Timer);
        }
        let read_overdue = state
            .reading
            .is_some_and(|(_, started)| state.real >= started + READ_AT_MOST);
        if !timer_due && !read_overdue && state.real < HORIZON {
            actions.push(Action::Tick);
        }
        if state.real <= ACT_BY {
            if state.committed < COMMITS {
                actions.push(Action::CommitAndRing);
            }
            if state.forged < FORGED {
                actions.push(Action::Forge);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = self.at(state.real);
        match action {
            Action::Tick => state.real += STEP,
            Action::CommitAndRing => {
                state.committed += 1;
                let go = state.gate.ring(now);
                self.go(&mut state, go);
            }
            Action::Forge => {
                state.forged += 1;
                let go = state.gate.ring(now);
                self.go(&mut state, go);
            }
            Action::FinishRead => {
                let (snapshot, _) = state.reading.take()?;
                let found = snapshot > state.seen;
                state.seen = state.seen.max(snapshot);
                let go = state.gate.finished(found, now);
                if self.mutant != Mutant::IgnoreFinished {
                    self.go(&mut state, go);
                }
            }
            Action::Timer => {
                state.timer = None;
                let go = state.gate.due(now);
                self.go(&mut state, go);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::eventually("every commit that rang is read", |_, s: &State| {
                s.real >= HORIZON && s.reading.is_none() && s.seen == s.committed
            }),
            // Two commits and six forged rings within 80 ms: at most a read each for the
            // commits, the first forged ring's, one per 50 ms gap after it, and a spare miss
            // at the start and after each read that found a commit.
            Property::always("a flood costs a read per gap", |_, s: &State| {
                let spare = u64::from(COMMITS) + 1;
                u64::from(s.reads) <= u64::from(COMMITS) + 1 + ACT_BY.div_ceil(50) + 1 + spare
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use stateright::Checker;

    use super::*;

    fn check(mutant: Mutant) -> impl Checker<Doorbell> {
        super::super::explore(&format!("doorbell {mutant:?}"), Doorbell::new(mutant))
    }

    #[test]
    fn behind_the_gate_every_commit_that_rang_is_read_and_a_flood_costs_a_read_per_gap() {
        check(Mutant::None).assert_properties();
    }

    #[test]
    fn a_reader_that_ignores_a_reads_end_loses_a_ring_heard_during_it() {
        check(Mutant::IgnoreFinished).assert_any_discovery("every commit that rang is read");
    }
}
