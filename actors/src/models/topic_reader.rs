//! A durable topic's reader against appending transactions that commit or abort in any order
//! (DESIGN, "Durable topics"; invariant I33). There is no pure room to call here: the read's
//! rule is one SQL statement (the migrations' `<topics>_read`), so the model plays it — events
//! after the cursor, in (xid, position) order, and only below the horizon, the oldest
//! transaction still running (`pg_snapshot_xmin`); the isolation spec `topic_horizon.spec`
//! checks the statement itself. A transaction's xid is drawn at its first write, as
//! PostgreSQL's is, and each append draws its position from the sequence then, so positions
//! and xids need not agree.
//!
//! Properties: no event is skipped — once the cursor is past an event that committed, the
//! reader has delivered it — and events are delivered once each, in cursor order. The mutant reads past the horizon (every
//! committed event after the cursor): a transaction that drew its xid first and commits last
//! is skipped for good.

use stateright::{Model, Property};

/// Appending transactions, each appending up to `APPENDS` events.
const TRANSACTIONS: usize = 3;
const APPENDS: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    None,
    /// The read ignores the horizon.
    PastTheHorizon,
}

pub(crate) struct TopicReader {
    mutant: Mutant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Txn {
    /// Running; its xid once it wrote.
    Running(Option<u64>),
    Committed,
    Aborted,
}

/// One appended event: its transaction, its xid and its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Event {
    xid: u64,
    position: u64,
    txn: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    txns: [Txn; TRANSACTIONS],
    /// Events appended, committed or not.
    events: Vec<Event>,
    next_xid: u64,
    next_position: u64,
    /// The reader's cursor: the last (xid, position) it delivered.
    cursor: (u64, u64),
    /// Events delivered, in delivery order.
    delivered: Vec<Event>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Append(usize),
    Commit(usize),
    Abort(usize),
    Read,
}

impl State {
    fn committed(&self, event: &Event) -> bool {
        self.txns[event.txn] == Txn::Committed
    }
}

impl TopicReader {
    pub(crate) fn new(mutant: Mutant) -> TopicReader {
        TopicReader { mutant }
    }

    /// The horizon the read stops below: the oldest xid still running, else the next xid.
    fn horizon(&self, state: &State) -> u64 {
        if self.mutant == Mutant::PastTheHorizon {
            return u64::MAX;
        }
        (state.txns.iter())
            .filter_map(|t| match t {
                Txn::Running(xid) => *xid,
                _ => None,
            })
            .min()
            .unwrap_or(state.next_xid)
    }
}

impl Model for TopicReader {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            txns: [Txn::Running(None); TRANSACTIONS],
            events: Vec::new(),
            next_xid: 1,
            next_position: 1,
            cursor: (0, 0),
            delivered: Vec::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (i, txn) in state.txns.iter().enumerate() {
            if let Txn::Running(_) = txn {
                let appended = state.events.iter().filter(|e| e.txn == i).count();
                if appended < usize::from(APPENDS) {
                    actions.push(Action::Append(i));
                }
                actions.push(Action::Commit(i));
                actions.push(Action::Abort(i));
            }
        }
        actions.push(Action::Read);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Append(i) => {
                let Txn::Running(xid) = state.txns[i] else {
                    return None;
                };
                let xid = xid.unwrap_or_else(|| {
                    state.next_xid += 1;
                    state.next_xid - 1
                });
                state.txns[i] = Txn::Running(Some(xid));
                state.events.push(Event {
                    xid,
                    position: state.next_position,
                    txn: i,
                });
                state.next_position += 1;
            }
            Action::Commit(i) => state.txns[i] = Txn::Committed,
            Action::Abort(i) => state.txns[i] = Txn::Aborted,
            Action::Read => {
                let horizon = self.horizon(&state);
                let mut read: Vec<Event> = (state.events.iter())
                    .filter(|e| state.committed(e))
                    .filter(|e| (e.xid, e.position) > state.cursor && e.xid < horizon)
                    .copied()
                    .collect();
                if read.is_empty() {
                    return None;
                }
                read.sort();
                let last = read.last().expect("not empty");
                state.cursor = (last.xid, last.position);
                state.delivered.extend(read);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no committed event is skipped", |_, s: &State| {
                (s.events.iter())
                    .filter(|e| s.committed(e) && (e.xid, e.position) <= s.cursor)
                    .all(|e| s.delivered.contains(e))
            }),
            Property::always(
                "events are delivered once, in cursor order",
                |_, s: &State| {
                    (s.delivered.windows(2))
                        .all(|w| (w[0].xid, w[0].position) < (w[1].xid, w[1].position))
                },
            ),
            Property::sometimes("every transaction's events are read", |_, s: &State| {
                (0..TRANSACTIONS).all(|t| s.delivered.iter().any(|e| e.txn == t))
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use stateright::Checker;

    use super::*;

    #[test]
    fn a_reader_below_the_horizon_skips_no_event_committed_in_any_order() {
        let checker = crate::models::explore("topic reader", TopicReader::new(Mutant::None));
        checker.assert_properties();
    }

    #[test]
    fn a_reader_past_the_horizon_skips_an_event_committed_late() {
        let checker = crate::models::explore(
            "topic reader, past the horizon",
            TopicReader::new(Mutant::PastTheHorizon),
        );
        let path = checker
            .discovery("no committed event is skipped")
            .expect("a counterexample");
        eprintln!("{path:?}");
    }
}
