//! The checkers themselves: they must see the violations they exist to find.

use pgcoord_faults::history::Ack;
use pgcoord_faults::linear::{self, Event, Op, Ret, What};

use super::Workload;

#[tokio::test]
async fn the_checker_finds_overlaps_regressions_and_lost_writes() {
    let workload = Workload::shared_server().await;
    let table = format!("\"{}_history\"", workload.prefix);
    // Two sections that overlap in time, the second carrying an older token than the resource
    // had: what a lease without fencing lets a paused holder do.
    workload
        .admin
        .batch_execute(&format!(
            "INSERT INTO {table} (process, token, previous_token, write_no, entered, exited) VALUES
               ('a', 7, 0, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:02'),
               ('b', 5, 7, 2, '2026-01-01 00:00:01', '2026-01-01 00:00:03'),
               ('a', 8, 7, 3, '2026-01-01 00:00:04', '2026-01-01 00:00:05')"
        ))
        .await
        .unwrap();
    let acks = [
        Ack { token: 7, write: 1 },
        Ack { token: 8, write: 3 },
        Ack { token: 9, write: 4 },
    ];
    let verdict = workload.verdict(&acks).await;
    assert_eq!(verdict.sections, 3);
    assert_eq!(verdict.overlaps, 1, "{verdict}");
    assert_eq!(verdict.regressions, 1, "{verdict}");
    assert_eq!(verdict.missing, [Ack { token: 9, write: 4 }]);
    assert!(!verdict.is_safe());
}

/// One operation of a hand-made history: `(worker, invoked, returned, op, outcome)`, times in
/// ms; `returned` `None` for an operation whose outcome is unknown.
type Hand<'a> = (&'a str, u64, Option<u64>, Op, Option<Ret>);

fn history(ops: &[Hand<'_>]) -> Vec<Event> {
    let mut events = Vec::new();
    for &(worker, invoked, returned, op, outcome) in ops {
        let event = |at: u64, what| Event {
            worker: worker.to_string(),
            at: at * 1_000_000,
            what,
        };
        events.push(event(invoked, What::Invoke(op)));
        if let Some(at) = returned {
            events.push(event(at, What::Return(outcome)));
        }
    }
    // Each worker's lines in its own order, the workers' interleaved by time.
    events.sort_by_key(|e| e.at);
    events
}

const GRANT: Op = Op::Acquire;
const READ: Op = Op::Read;
fn write(token: i64, value: i64) -> Op {
    Op::Write { token, value }
}
fn release(token: i64) -> Op {
    Op::Release { token }
}

/// Checks `ops` in windows of every size from 1 to the whole, so that the merging of windows
/// is exercised too, with the checker's search and with stateright's tester; all must agree.
fn linearizable(ops: &[Hand<'_>]) -> bool {
    let events = history(ops);
    let verdicts: Vec<bool> = (1..=ops.len())
        .flat_map(|window| {
            let report = linear::check(&events, window);
            let reference = linear::check_by_stateright(&events, window);
            eprintln!("window {window}: {report}; stateright: {reference}");
            [report.is_linearizable(), reference.is_linearizable()]
        })
        .collect();
    assert!(verdicts.iter().all(|v| *v == verdicts[0]), "{verdicts:?}");
    verdicts[0]
}

#[test]
fn the_linearizability_checker_accepts_a_fenced_history() {
    // a holds token 1 and writes; b waits, is granted 2 once a released, writes, and a's
    // late write with token 1 is rejected; reads see the last accepted write.
    assert!(linearizable(&[
        ("a", 0, Some(1), GRANT, Some(Ret::Granted(1))),
        ("b", 0, Some(6), GRANT, Some(Ret::Granted(2))),
        ("a", 2, Some(3), write(1, 10), Some(Ret::Written)),
        ("c", 2, Some(4), READ, Some(Ret::Value(0))),
        ("a", 4, Some(5), release(1), Some(Ret::Released)),
        ("a", 6, Some(7), write(1, 11), Some(Ret::Rejected)),
        ("c", 5, Some(7), READ, Some(Ret::Value(10))),
        ("b", 7, Some(8), write(2, 20), Some(Ret::Written)),
        ("c", 9, Some(10), READ, Some(Ret::Value(20))),
        ("b", 9, Some(10), release(2), Some(Ret::Released)),
        ("a", 11, Some(12), release(1), Some(Ret::Lost)),
    ]));
}

#[test]
fn the_linearizability_checker_rejects_two_grants_both_writing() {
    // b is granted 2 while a still holds 1 (no expiry can make that wrong by itself), then
    // both write: a's write follows b's grant, so no order lets the fence accept it.
    assert!(!linearizable(&[
        ("a", 0, Some(1), GRANT, Some(Ret::Granted(1))),
        ("b", 2, Some(3), GRANT, Some(Ret::Granted(2))),
        ("a", 4, Some(6), write(1, 10), Some(Ret::Written)),
        ("b", 4, Some(6), write(2, 20), Some(Ret::Written)),
    ]));
}

#[test]
fn the_linearizability_checker_rejects_a_stale_write_after_a_newer_one() {
    assert!(!linearizable(&[
        ("a", 0, Some(1), GRANT, Some(Ret::Granted(1))),
        ("a", 1, Some(2), write(1, 10), Some(Ret::Written)),
        ("b", 3, Some(4), GRANT, Some(Ret::Granted(2))),
        ("b", 4, Some(5), write(2, 20), Some(Ret::Written)),
        ("a", 6, Some(7), write(1, 11), Some(Ret::Written)),
    ]));
}

#[test]
fn the_linearizability_checker_rejects_a_read_of_an_older_value() {
    assert!(!linearizable(&[
        ("a", 0, Some(1), GRANT, Some(Ret::Granted(1))),
        ("a", 1, Some(2), write(1, 10), Some(Ret::Written)),
        ("a", 2, Some(3), release(1), Some(Ret::Released)),
        ("b", 3, Some(4), GRANT, Some(Ret::Granted(2))),
        ("b", 4, Some(5), write(2, 20), Some(Ret::Written)),
        ("c", 6, Some(7), READ, Some(Ret::Value(10))),
    ]));
}

#[test]
fn the_linearizability_checker_takes_an_unknown_write_either_way() {
    // a's write timed out: it may have committed or not, and stays in flight; a's next
    // operations are a new thread's.
    let unknown = |read: i64| {
        vec![
            ("a", 0, Some(1), GRANT, Some(Ret::Granted(1))),
            ("a", 1, Some(9), write(1, 10), None),
            ("a", 10, Some(11), READ, Some(Ret::Value(read))),
        ]
    };
    assert!(linearizable(&unknown(10)), "it took effect");
    assert!(linearizable(&unknown(0)), "it did not");
    // Nor is an unknown write's effect undone: once read, it stays.
    let mut undone = unknown(10);
    undone.push(("c", 12, Some(13), READ, Some(Ret::Value(0))));
    assert!(!linearizable(&undone));
    // An unknown grant may have taken a token; the next grant's is only higher.
    assert!(linearizable(&[
        ("a", 0, None, GRANT, None),
        ("b", 1, Some(2), GRANT, Some(Ret::Granted(2))),
        ("b", 3, Some(4), write(2, 20), Some(Ret::Written)),
    ]));
}

/// A long run's history as a paused process makes it: a read invoked before round 1 that
/// answers only after `rounds` rounds (the value before round 1's write), while each round's
/// holder is granted, writes and releases, and four readers read concurrently with it. That read
/// puts every round in one window, and the search must find that it goes first.
fn a_read_across(rounds: i64, value: i64) -> Vec<Event> {
    let mut ops = Vec::new();
    for r in 1..=rounds {
        let (at, holder) = (10 * r as u64, if r % 2 == 0 { "h0" } else { "h1" });
        ops.push((holder, at, Some(at + 1), GRANT, Some(Ret::Granted(r))));
        ops.push((
            holder,
            at + 2,
            Some(at + 3),
            write(r, 10 * r),
            Some(Ret::Written),
        ));
        ops.push((
            holder,
            at + 4,
            Some(at + 5),
            release(r),
            Some(Ret::Released),
        ));
        for reader in ["r0", "r1", "r2", "r3"] {
            ops.push((
                reader,
                at,
                Some(at + 9),
                READ,
                Some(Ret::Value(10 * (r - 1))),
            ));
        }
    }
    let end = 10 * rounds as u64 + 10;
    ops.push(("z", 11, Some(end), READ, Some(Ret::Value(value))));
    history(&ops)
}

#[test]
fn the_linearizability_checker_remembers_dead_ends_in_a_wide_window() {
    // Small, both searches agree.
    for value in [0, 5] {
        let events = a_read_across(2, value);
        let (ours, reference) = (
            linear::check(&events, 8),
            linear::check_by_stateright(&events, 8),
        );
        assert_eq!(ours.is_linearizable(), value == 0, "{ours}");
        assert_eq!(reference.is_linearizable(), value == 0, "{reference}");
    }
    // 200 rounds, 1,401 operations in one window: every order of each round's five
    // concurrent operations, tried again after each dead end, is beyond any search without a
    // memory; with one, the states visited stay a few per operation.
    for value in [0, 5] {
        let report = linear::check(&a_read_across(200, value), 8);
        eprintln!("{report}");
        assert_eq!(report.widest, 1_401, "{report}");
        assert_eq!(report.is_linearizable(), value == 0, "{report}");
        assert!(report.steps < 100 * 1_401, "{report}");
    }
}

#[test]
fn the_linearizability_checker_reads_its_own_lines() {
    let mut record = linear::Recorder::keeping("p0-1");
    for (op, ret) in [
        (GRANT, Some(Ret::Granted(3))),
        (write(3, 7), None),
        (READ, Some(Ret::Value(7))),
        (release(3), Some(Ret::Lost)),
    ] {
        record.invoke(op);
        record.complete(ret);
    }
    let events = linear::events(record.lines());
    assert_eq!(events.len(), 8, "{:?}", record.lines());
    assert!(
        events
            .iter()
            .zip(record.lines())
            .all(|(e, l)| e.line() == *l)
    );
    let report = linear::check(&events, 2);
    assert!(report.is_linearizable(), "{report}");
    assert_eq!((report.operations, report.unknown), (4, 1));
}

/// Checks a history kept by a run (`LINEAR_HISTORY=path`, a file of `OP` lines; see
/// `LINEAR_HISTORY_DIR`) again, as the run did.
#[test]
#[ignore = "checks a history kept by an earlier run: LINEAR_HISTORY=path"]
fn linear_check() {
    let path = std::env::var("LINEAR_HISTORY").expect("LINEAR_HISTORY=path");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let report = linear::check(&linear::events(&lines), super::WINDOW);
    eprintln!("{report}");
    assert!(report.is_linearizable(), "{report}");
}
