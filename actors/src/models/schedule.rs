//! A schedule's tick against a runner that pauses: the core's own `schedule::plan` decides what
//! each runner does on what it reads; the model plays the runs table (its claim, fence and
//! finish statements, their conditions as `pgcoord::schedule::ScheduleTable` writes them — the
//! isolation specs check the statements themselves), the schedule's lease (taken over once it
//! expires on the server's clock), and two runners, either of which may stop anywhere.
//!
//! Property: the tick's effects apply once — a run's effects commit in the transaction that
//! fences its attempt and marks the tick done (`Tick::complete`), and only one can. The mutant
//! marks the tick done after the effects' transaction, as a separate statement (`finish`
//! alone, without `complete`): a runner paused between the two leaves the tick running with
//! its effects applied, and the runner that takes over applies them again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgcoord::schedule::{CatchUp, Next, Observed, Policy, RunState, Timing, Unfinished, plan};
use stateright::{Model, Property};

const STEP: u64 = 10;
/// The tick, every 1 000 ms from the epoch: the first at 1 000.
const TICK: u64 = 1_000;
/// The first runner starts then, holding the lease until it expires.
const START: u64 = 950;
const LEASE: u64 = 200;
const HORIZON: u64 = START + 3 * LEASE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    None,
    /// The tick is marked done after the effects' transaction, not in it.
    DoneAfter,
}

pub(crate) struct Schedules {
    mutant: Mutant,
    timing: Timing,
    policy: Policy,
}

/// The tick's row in the runs table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Row {
    state: RunState,
    attempts: u32,
    token: i64,
    /// A fencing transaction holds the row: the runner's index.
    locked_by: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Runner {
    /// Not holding the schedule's lease.
    Waiting,
    /// Holding it with this token: reads the table and plans.
    Holding(i64),
    /// Ran the handler of this attempt; its transaction is next.
    Claimed(i64, u32),
    /// Its transaction fenced the attempt and holds the row.
    Fenced(i64, u32),
    /// Its effects committed; the tick is marked done next (the mutant only).
    Committed(i64, u32),
    /// Done with the tick, one way or another.
    Finished,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    now: u64,
    /// The lease: its token and expiry on the server's clock.
    token: i64,
    expires: u64,
    row: Option<Row>,
    runners: [Runner; 2],
    /// Effects of the tick committed.
    effects: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    TakeOver(usize),
    PlanAndClaim(usize),
    Fence(usize),
    Commit(usize),
    Abort(usize),
    MarkDone(usize),
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl Schedules {
    pub(crate) fn new(mutant: Mutant) -> Schedules {
        let policy = Policy {
            catch_up: CatchUp::Latest,
            max_attempts: 3,
            retry_backoff: Duration::from_millis(50),
        };
        Schedules {
            mutant,
            timing: Timing::every(Duration::from_millis(TICK)).expect("a period"),
            policy,
        }
    }

    /// What the observe statement reads, at the server's `now`.
    fn observed(&self, state: &State) -> Observed {
        let unfinished = state.row.as_ref().and_then(|row| {
            matches!(row.state, RunState::Running | RunState::Failed).then(|| Unfinished {
                tick: at(TICK),
                state: row.state,
                attempts: row.attempts,
                finished_at: (row.state == RunState::Failed).then(|| at(state.now)),
            })
        });
        Observed {
            now: at(state.now),
            last: state.row.as_ref().map(|_| at(TICK)),
            unfinished,
        }
    }

    /// The claim statement: a new row, or a running or failed one claimed by no newer token;
    /// it waits for a fencing transaction that holds the row (not modelled as enabled then).
    fn claim(&self, state: &mut State, token: i64) -> Option<u32> {
        match &mut state.row {
            None => {
                state.row = Some(Row {
                    state: RunState::Running,
                    attempts: 1,
                    token,
                    locked_by: None,
                });
                Some(1)
            }
            Some(row)
                if matches!(row.state, RunState::Running | RunState::Failed)
                    && row.token <= token =>
            {
                row.state = RunState::Running;
                row.attempts += 1;
                row.token = token;
                Some(row.attempts)
            }
            Some(_) => None,
        }
    }

    /// The fence statement: this attempt's row, running.
    fn fences(&self, row: &Row, token: i64, attempt: u32) -> bool {
        row.token == token && row.attempts == attempt && row.state == RunState::Running
    }
}

impl Model for Schedules {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: START,
            token: 1,
            expires: START + LEASE,
            row: None,
            runners: [Runner::Holding(1), Runner::Waiting],
            effects: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < HORIZON {
            actions.push(Action::Tick);
        }
        let locked = state.row.as_ref().and_then(|r| r.locked_by);
        for (i, runner) in state.runners.iter().enumerate() {
            match runner {
                Runner::Waiting if state.now >= state.expires => actions.push(Action::TakeOver(i)),
                // A claim waits while another's fencing transaction holds the row.
                Runner::Holding(_) if locked.is_none_or(|by| by == i) => {
                    actions.push(Action::PlanAndClaim(i))
                }
                Runner::Claimed(..) if locked.is_none() => actions.push(Action::Fence(i)),
                Runner::Fenced(..) => {
                    actions.push(Action::Commit(i));
                    actions.push(Action::Abort(i));
                }
                Runner::Committed(..) => actions.push(Action::MarkDone(i)),
                _ => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now += STEP,
            Action::TakeOver(i) => {
                state.token += 1;
                state.expires = state.now + LEASE;
                state.runners[i] = Runner::Holding(state.token);
            }
            Action::PlanAndClaim(i) => {
                let Runner::Holding(token) = state.runners[i] else {
                    return None;
                };
                // The plan is the core's; `since` is the runner's first read.
                match plan(
                    &self.timing,
                    &self.policy,
                    &self.observed(&state),
                    at(START),
                ) {
                    Next::Run { .. } => {}
                    Next::WaitUntil(_) => return None,
                    Next::Abandon { .. } => {
                        state.runners[i] = Runner::Finished;
                        return Some(state);
                    }
                }
                state.runners[i] = match self.claim(&mut state, token) {
                    Some(attempt) => Runner::Claimed(token, attempt),
                    None => Runner::Finished,
                };
            }
            Action::Fence(i) => {
                let Runner::Claimed(token, attempt) = state.runners[i] else {
                    return None;
                };
                let row = state.row.as_mut()?;
                if self.fences(row, token, attempt) {
                    row.locked_by = Some(i);
                    state.runners[i] = Runner::Fenced(token, attempt);
                } else {
                    // LockLost or AlreadyAcknowledged: the effects are not applied.
                    state.runners[i] = Runner::Finished;
                }
            }
            Action::Commit(i) => {
                let Runner::Fenced(token, attempt) = state.runners[i] else {
                    return None;
                };
                let row = state.row.as_mut()?;
                row.locked_by = None;
                state.effects += 1;
                state.runners[i] = match self.mutant {
                    Mutant::None => {
                        row.state = RunState::Done;
                        Runner::Finished
                    }
                    Mutant::DoneAfter => Runner::Committed(token, attempt),
                };
            }
            Action::MarkDone(i) => {
                // The finish statement: this attempt's row, if still running.
                let Runner::Committed(token, attempt) = state.runners[i] else {
                    return None;
                };
                let row = state.row.as_mut()?;
                if row.token == token && row.attempts == attempt && row.state == RunState::Running {
                    row.state = RunState::Done;
                }
                state.runners[i] = Runner::Finished;
            }
            Action::Abort(i) => {
                // The transaction failed or the process stopped: the row is let go, still
                // running, for a retry.
                state.row.as_mut()?.locked_by = None;
                state.runners[i] = Runner::Finished;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("a tick's effects apply once", |_, s: &State| s.effects <= 1),
            Property::sometimes("a tick taken over is run again", |_, s: &State| {
                s.effects == 1 && s.row.as_ref().is_some_and(|r| r.attempts > 1)
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use stateright::Checker;

    use super::*;

    fn check(mutant: Mutant) -> impl Checker<Schedules> {
        super::super::explore(&format!("schedule {mutant:?}"), Schedules::new(mutant))
    }

    #[test]
    fn a_ticks_effects_apply_once_whatever_runner_pauses_where() {
        check(Mutant::None).assert_properties();
    }

    #[test]
    fn a_tick_marked_done_after_its_effects_lets_a_paused_runner_be_run_again() {
        check(Mutant::DoneAfter).assert_any_discovery("a tick's effects apply once");
    }
}
