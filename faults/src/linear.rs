//! Operation histories of a fenced lock guarding a register, checked for linearizability.
//!
//! Each worker (a manager of a holder process, or a test) records every operation it starts
//! and how it ended, as two lines: `OP <worker> <at> invoke <op>` just before the call and
//! `OP <worker> <at> return <outcome>` just after it. `<at>` is the machine's monotonic clock
//! (`CLOCK_MONOTONIC`, in ns): one clock for every process of the machine, which no wall-clock
//! step moves and a paused process does not stop. The operations:
//! - `acquire` → `granted <token>` | `not-granted` | `unknown`;
//! - `write <token> <value>` (a fenced section setting the register) → `written` |
//!   `rejected` (the fence refused the token) | `unknown`;
//! - `read` → `value <v>` | `unknown`;
//! - `release <token>` → `released` | `lost` (nothing was held with it) | `unknown`.
//!
//! `unknown` (the call timed out or its connection failed) means the operation may or may not
//! have taken effect: the checker leaves it in flight, so that it may be placed anywhere after
//! its invocation or nowhere. The worker's later operations then count as a new thread's (an
//! operation in flight forever would otherwise overlap all of them).
//!
//! [`check`] checks the history against [`Fenced`], the sequential specification, in windows
//! of a few operations ordered by completion (an operation in flight by its invocation), each
//! from the state the previous window's linearization ended in. That is sound: every operation
//! of a window completed after every operation of the previous window was invoked, so the
//! windows' linearizations put end to end are a linearization of the whole. It is also
//! complete, because a window ends only where nothing ahead must be placed before something
//! behind (`cuts`): the specification's state is the last grant, whether it is released, and
//! the register, and each way an operation can depend on one the other side of an edge is one
//! of the rules there. Each window is searched with a memory of dead ends (`search`, the
//! algorithm of porcupine, etcd's checker); [`check_by_stateright`] searches them with
//! stateright's [`LinearizabilityTester`] instead, the reference the tests compare it with.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

mod record;
mod search;
mod spec;

pub use record::{Event, Op, Recorder, Ret, What, events, now};
pub use spec::Fenced;
use spec::InOrder;

/// One operation as the tester sees it.
#[derive(Debug, Clone, Copy)]
struct Record {
    thread: u32,
    op: Op,
    invoked: u64,
    /// When and how it ended; `None`: in flight (unknown).
    returned: Option<(u64, Ret)>,
}

impl Record {
    /// Where it falls in the windows: its completion, or its invocation when in flight.
    fn key(&self) -> u64 {
        self.returned.map_or(self.invoked, |(at, _)| at)
    }

    fn in_flight(thread: u32, op: Op, invoked: u64) -> Record {
        Record {
            thread,
            op,
            invoked,
            returned: None,
        }
    }
}

/// What [`check`] found.
#[derive(Debug, Clone)]
pub struct Linearity {
    /// Operations in the history.
    pub operations: usize,
    /// Of which in flight (unknown outcome).
    pub unknown: usize,
    /// Windows found linearizable.
    pub windows: usize,
    /// Operations in the largest window checked.
    pub widest: usize,
    /// States the search visited (not counted by stateright's tester).
    pub steps: u64,
    /// Time spent searching.
    pub elapsed: Duration,
    /// `None` when linearizable; otherwise the operations of the window without a
    /// linearization, one a line.
    pub violation: Option<String>,
}

impl Linearity {
    /// True when a linearization was found.
    pub fn is_linearizable(&self) -> bool {
        self.violation.is_none()
    }
}

impl fmt::Display for Linearity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} operations ({} unknown) in {} windows (at most {} operations), {} states: {} in {:?}",
            self.operations,
            self.unknown,
            self.windows,
            self.widest,
            self.steps,
            if self.is_linearizable() {
                "linearizable"
            } else {
                "NOT linearizable"
            },
            self.elapsed
        )?;
        if let Some(ops) = &self.violation {
            write!(f, "; no linearization of:\n{ops}")?;
        }
        Ok(())
    }
}

/// Pairs each worker's invocations with their returns; a worker's operations after an unknown
/// one go to a new thread.
fn records(events: &[Event]) -> Vec<Record> {
    // Per worker: its thread now, and its operation in progress.
    type Pending = Option<(Op, u64)>;
    let mut workers: BTreeMap<&str, (u32, Pending)> = BTreeMap::new();
    let mut threads = 0;
    let mut records = Vec::new();
    for event in events.iter().map(Some).chain(std::iter::once(None)) {
        let Some(event) = event else {
            // The end: what is still in progress never ended.
            for (thread, pending) in workers.values_mut() {
                if let Some((op, invoked)) = pending.take() {
                    records.push(Record::in_flight(*thread, op, invoked));
                }
            }
            break;
        };
        let (thread, pending) = workers.entry(&event.worker).or_insert_with(|| {
            threads += 1;
            (threads - 1, None)
        });
        let (op, invoked, outcome) = match (event.what, pending.take()) {
            (What::Invoke(op), None) => {
                *pending = Some((op, event.at));
                continue;
            }
            // An invocation without a return before it: that one never ended.
            (What::Invoke(next), Some((op, invoked))) => {
                *pending = Some((next, event.at));
                (op, invoked, None)
            }
            (What::Return(_), None) => continue,
            (What::Return(outcome), Some((op, invoked))) => (op, invoked, outcome),
        };
        match outcome {
            Some(ret) => records.push(Record {
                thread: *thread,
                op,
                invoked,
                returned: Some((event.at, ret)),
            }),
            None => {
                records.push(Record::in_flight(*thread, op, invoked));
                // The tester allows one operation in flight per thread.
                *thread = threads;
                threads += 1;
            }
        }
    }
    // An unknown acquire, read or release is left out: taking effect, it could only make other
    // outcomes invalid (a token skipped, a lease closed), never one valid, so the tester need
    // not try it. Nor an unknown write whose value nobody read: no read can have followed it
    // before the next write. The other unknown writes stay, in flight.
    let read: std::collections::HashSet<i64> = (records.iter())
        .filter_map(|r| match r.returned {
            Some((_, Ret::Value(value))) => Some(value),
            _ => None,
        })
        .collect();
    records.retain(|r| match (r.op, r.returned) {
        (_, Some(_)) => true,
        (Op::Write { value, .. }, None) => read.contains(&value),
        _ => false,
    });
    records.sort_by_key(|r| (r.key(), r.invoked));
    records
}

/// The state after a linearization of `window` from `start`, if there is one: stateright's
/// tester, which remembers no dead end (the reference for [`search::linearize`]).
fn linearize_by_stateright(window: &[Record], start: Fenced, _: &mut u64) -> Option<Fenced> {
    // Invocations and returns in time order. At the same instant an invocation comes before
    // the returns (the operations are then taken as concurrent), unless its own thread's last
    // operation returns then.
    let returns: std::collections::HashSet<(u32, u64)> = (window.iter())
        .filter_map(|r| Some((r.thread, r.returned?.0)))
        .collect();
    // The tester tries threads in the order of their ids: those ending in flight last.
    let in_flight: std::collections::HashSet<u32> = (window.iter())
        .filter(|r| r.returned.is_none())
        .map(|r| r.thread)
        .collect();
    let thread = |r: &Record| {
        r.thread
            + if in_flight.contains(&r.thread) {
                1 << 20
            } else {
                0
            }
    };
    let mut steps: Vec<(u64, u8, usize)> = Vec::with_capacity(window.len() * 2);
    for (i, r) in window.iter().enumerate() {
        let after_own_return = returns.contains(&(r.thread, r.invoked));
        steps.push((r.invoked, if after_own_return { 2 } else { 0 }, i));
        if let Some((at, _)) = r.returned {
            steps.push((at, 1, i));
        }
    }
    steps.sort_unstable();
    let mut grants: Vec<i64> = (window.iter())
        .filter_map(|r| match r.returned {
            Some((_, Ret::Granted(token))) => Some(token),
            _ => None,
        })
        .collect();
    grants.sort_unstable();
    let mut tester = LinearizabilityTester::new(InOrder {
        spec: start,
        grants: grants.into(),
    });
    for (_, class, i) in steps {
        let r = window[i];
        let fed = if class == 1 {
            tester.on_return(thread(&r), r.returned.expect("a return").1)
        } else {
            tester.on_invoke(thread(&r), r.op)
        };
        fed.expect("one operation at a time per thread");
    }
    let order = tester.serialized_history()?;
    let mut end = start;
    for (op, ret) in order {
        assert!(end.is_valid_step(&op, &ret), "the tester's own order");
    }
    Some(end)
}

/// Where a window may end: `cuts[i]` when no operation from `i` on may need placing before one
/// ahead of `i` — a grant of a lower token than one ahead; an accepted write or a release of a
/// token older than a grant ahead; a read of a value written from `i` on, or by an unknown
/// write ahead (which must be in the read's window to be placed at all), or of one overwritten
/// ahead of `i`. (A thread's own operations are in order already; a rejection, a lost release,
/// a refusal are valid anywhere after their grant.)
fn cuts(records: &[Record]) -> Vec<bool> {
    let n = records.len();
    // +1 where a forbidden span starts, -1 past its end.
    let mut spans = vec![0i64; n + 2];
    let mut forbid = |from: usize, to: usize| {
        if from < to {
            spans[from + 1] += 1;
            spans[to + 1] -= 1;
        }
    };
    let mut grants: BTreeMap<i64, usize> = BTreeMap::new();
    let mut writes: BTreeMap<i64, usize> = BTreeMap::new();
    let mut written_at = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if let (Op::Write { value, .. }, None | Some((_, Ret::Written))) = (r.op, r.returned) {
            writes.insert(value, i);
            written_at.push(i);
        }
    }
    for (i, r) in records.iter().enumerate() {
        let token = match (r.op, r.returned) {
            (_, Some((_, Ret::Granted(token)))) => Some(token),
            (Op::Write { token, .. }, Some((_, Ret::Written))) => Some(token),
            (Op::Release { token }, Some((_, Ret::Released))) => Some(token),
            (_, Some((_, Ret::Value(value)))) => {
                let written = writes.get(&value).copied();
                match written {
                    // Its write must come before it.
                    Some(w) if w > i => forbid(i, w),
                    // An unknown write must be in its reads' window, to be placed before them.
                    Some(w) if records[w].returned.is_none() => forbid(w, i),
                    // The writes after its write and before it must come after it.
                    _ => {
                        let after = written.map_or(0, |w| w + 1);
                        let next = written_at.partition_point(|&at| at < after);
                        if let Some(&q) = written_at.get(next).filter(|&&q| q < i) {
                            forbid(q, i);
                        }
                    }
                }
                None
            }
            _ => None,
        };
        if let Some(token) = token {
            let earliest = grants.range(token + 1..).map(|(_, &at)| at).min();
            if let Some(at) = earliest {
                forbid(at, i);
            }
        }
        if let Some((_, Ret::Granted(token))) = r.returned {
            grants.entry(token).or_insert(i);
        }
    }
    let mut depth = 0;
    (0..=n)
        .map(|i| {
            depth += spans[i];
            depth == 0
        })
        .collect()
}

/// Checks `events` (several workers' records, in any order across workers) for
/// linearizability against [`Fenced`], in windows of about `window` operations, each searched
/// with a memory of dead ends (`search`).
pub fn check(events: &[Event], window: usize) -> Linearity {
    check_with(events, window, search::linearize)
}

/// [`check`] with stateright's `LinearizabilityTester` searching each window: the reference
/// the checker's own search is compared with on short histories (it remembers no dead end, so
/// a long run's wide windows can take it hours).
pub fn check_by_stateright(events: &[Event], window: usize) -> Linearity {
    check_with(events, window, linearize_by_stateright)
}

fn check_with(
    events: &[Event],
    window: usize,
    linearize: fn(&[Record], Fenced, &mut u64) -> Option<Fenced>,
) -> Linearity {
    let started = Instant::now();
    let records = records(events);
    let cuts = cuts(&records);
    let window = window.max(1);
    let invoked = (events.iter())
        .filter(|e| matches!(e.what, What::Invoke(_)))
        .count();
    let returned = (events.iter())
        .filter(|e| matches!(e.what, What::Return(Some(_))))
        .count();
    let mut report = Linearity {
        operations: invoked,
        unknown: invoked - returned,
        windows: 0,
        widest: 0,
        steps: 0,
        elapsed: Duration::ZERO,
        violation: None,
    };
    let (mut from, mut state) = (0, Fenced::default());
    while from < records.len() {
        let mut to = (from + window).min(records.len());
        while !cuts[to] {
            to += 1;
        }
        report.widest = report.widest.max(to - from);
        let Some(end) = linearize(&records[from..to], state, &mut report.steps) else {
            report.violation = Some(describe(&records[from..to]));
            break;
        };
        report.windows += 1;
        (from, state) = (to, end);
    }
    report.elapsed = started.elapsed();
    report
}

/// The operations of a window, one a line, with times in µs from its first invocation.
fn describe(window: &[Record]) -> String {
    let origin = window.iter().map(|r| r.invoked).min().unwrap_or(0);
    let micros = |at: u64| (at - origin) / 1000;
    let mut sorted = window.to_vec();
    sorted.sort_by_key(|r| r.invoked);
    sorted
        .iter()
        .map(|r| match r.returned {
            Some((at, ret)) => format!(
                "  thread {:>3} {:>9}..{:<9} µs {:?} -> {ret:?}",
                r.thread,
                micros(r.invoked),
                micros(at),
                r.op
            ),
            None => format!(
                "  thread {:>3} {:>9}..          µs {:?} -> unknown",
                r.thread,
                micros(r.invoked),
                r.op
            ),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
