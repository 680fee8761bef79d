use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_ring_reads_at_once_when_no_gap_is_open() {
    let (mut gate, t0) = (Gate::default(), Instant::now());
    assert_eq!(gate.ring(t0), Go::Now);
    assert_eq!(gate.finished(true, t0 + MS), Go::Covered);
    assert_eq!(gate.ring(t0 + 2 * MS), Go::Now);
}

/// A gate whose reader's first ring found nothing at `t0`, so the next miss opens the gap.
fn missed_once(t0: Instant) -> Gate {
    let mut gate = Gate::default();
    assert_eq!(gate.ring(t0), Go::Now);
    assert_eq!(gate.finished(false, t0), Go::Covered);
    gate
}

#[test]
fn after_two_rings_reads_found_nothing_the_next_ring_waits_out_the_gap() {
    let t0 = Instant::now();
    let mut gate = missed_once(t0);
    // The first miss opened no gap: the reader's own write, rung for during its next read,
    // must not put off the ring that matters.
    assert_eq!(gate.ring(t0 + MS), Go::Now);
    let ended = t0 + 5 * MS;
    assert_eq!(gate.finished(false, ended), Go::Covered);
    // However slow the flood: any ring within the gap is put off to its end.
    assert_eq!(gate.ring(ended + 10 * MS), Go::At(ended + GAP));
    assert_eq!(gate.ring(ended + 20 * MS), Go::Covered, "put off already");
    assert_eq!(gate.due(ended + GAP), Go::Now);
    // Past the gap, a ring reads at once; a miss then opens the gap again at once.
    assert_eq!(gate.finished(false, ended + GAP), Go::Covered);
    assert_eq!(gate.ring(ended + 2 * GAP), Go::Now);
    assert_eq!(gate.finished(false, ended + 2 * GAP), Go::Covered);
    assert_eq!(gate.ring(ended + 2 * GAP + MS), Go::At(ended + 3 * GAP));
    // A read that found something gives the reader its spare miss back.
    assert_eq!(gate.ask(), Go::Now);
    assert_eq!(gate.finished(true, ended + 2 * GAP + MS), Go::Covered);
    assert_eq!(
        gate.due(ended + 3 * GAP),
        Go::Covered,
        "the poll covered it"
    );
    assert_eq!(gate.ring(ended + 3 * GAP), Go::Now);
    assert_eq!(gate.finished(false, ended + 3 * GAP), Go::Covered);
    assert_eq!(gate.ring(ended + 3 * GAP + MS), Go::Now);
}

#[test]
fn a_flood_costs_a_read_per_gap() {
    let (mut gate, t0) = (Gate::default(), Instant::now());
    let (mut reads, mut due) = (0, None);
    // A ring every millisecond for a second; each read takes 2 ms and finds nothing.
    let mut reading_until = None;
    for ms in 0..1000u32 {
        let now = t0 + ms * MS;
        if reading_until == Some(now) {
            reading_until = None;
            match gate.finished(false, now) {
                Go::Now => {
                    reads += 1;
                    reading_until = Some(now + 2 * MS);
                }
                Go::At(at) => due = Some(at),
                Go::Covered => {}
            }
        }
        if due.is_some_and(|at| at <= now) {
            due = None;
            if gate.due(now) == Go::Now {
                reads += 1;
                reading_until = Some(now + 2 * MS);
            }
        }
        match gate.ring(now) {
            Go::Now => {
                reads += 1;
                reading_until = Some(now + 2 * MS);
            }
            Go::At(at) => due = Some(at),
            Go::Covered => {}
        }
    }
    // A read per gap, the first ring's and its spare miss's.
    assert!(reads <= 1000 / 50 + 2, "{reads} reads");
    assert!(
        reads >= 1000 / 52 - 1,
        "{reads} reads: the flood is still heard"
    );
}

#[test]
fn a_ring_during_a_read_makes_one_read_after_it() {
    let (mut gate, t0) = (Gate::default(), Instant::now());
    assert_eq!(gate.ring(t0), Go::Now);
    for ms in 1..10 {
        assert_eq!(gate.ring(t0 + ms * MS), Go::Covered);
    }
    // The read found something: the rings during it read again at once.
    assert_eq!(gate.finished(true, t0 + 10 * MS), Go::Now);
    assert_eq!(gate.finished(true, t0 + 11 * MS), Go::Covered, "once");
    // Found nothing, a second time since: the read again is put off to the gap's end.
    assert_eq!(gate.ring(t0 + 12 * MS), Go::Now);
    assert_eq!(gate.ring(t0 + 13 * MS), Go::Covered);
    assert_eq!(
        gate.finished(false, t0 + 14 * MS),
        Go::Now,
        "the first miss"
    );
    assert_eq!(gate.ring(t0 + 15 * MS), Go::Covered);
    let ended = t0 + 16 * MS;
    assert_eq!(gate.finished(false, ended), Go::At(ended + GAP));
}

#[test]
fn a_read_of_another_cause_is_one_at_a_time_and_covers_a_put_off_read() {
    let t0 = Instant::now();
    let mut gate = missed_once(t0);
    assert_eq!(gate.ring(t0), Go::Now);
    assert_eq!(gate.finished(false, t0), Go::Covered);
    assert_eq!(gate.ring(t0 + MS), Go::At(t0 + GAP));
    // A poll meanwhile reads at once, and the put-off read is then covered.
    assert_eq!(gate.ask(), Go::Now);
    assert_eq!(gate.ask(), Go::Covered, "one at a time");
    assert_eq!(gate.due(t0 + GAP), Go::Covered);
    // Asked during it: once more after it; a poll's read that found nothing opens no gap
    // of its own, and the one the ring opened still holds.
    assert_eq!(gate.finished(false, t0 + 2 * MS), Go::At(t0 + GAP));
    assert_eq!(gate.due(t0 + GAP), Go::Now);
    assert_eq!(gate.finished(false, t0 + GAP), Go::Covered);
    assert!(!gate.at_rest(t0 + GAP), "its gap is open");
    assert!(!gate.at_rest(t0 + 2 * GAP), "its miss is remembered");
    let mut rested = Gate::default();
    assert!(rested.at_rest(t0));
    assert_eq!(rested.ask(), Go::Now);
    assert_eq!(rested.finished(true, t0), Go::Covered);
    assert!(
        rested.at_rest(t0),
        "a read that found something forgets the miss"
    );
    assert_eq!(gate.ask(), Go::Now);
    assert_eq!(gate.finished(false, t0 + 2 * GAP), Go::Covered);
    assert_eq!(gate.ring(t0 + 2 * GAP + MS), Go::Now, "a poll opens no gap");
}

#[test]
fn a_timer_left_from_a_covered_read_does_not_read_early() {
    let t0 = Instant::now();
    let mut gate = missed_once(t0);
    assert_eq!(gate.ring(t0), Go::Now);
    assert_eq!(gate.finished(false, t0), Go::Covered);
    assert_eq!(gate.ring(t0 + MS), Go::At(t0 + GAP));
    assert_eq!(gate.ask(), Go::Now);
    assert_eq!(gate.ring(t0 + 2 * MS), Go::Covered);
    // The ring during the poll's read waits out the gap still open.
    assert_eq!(gate.finished(false, t0 + 3 * MS), Go::At(t0 + GAP));
    assert_eq!(gate.due(t0 + GAP), Go::Now);
    assert_eq!(gate.ring(t0 + GAP + MS), Go::Covered);
    let ended = t0 + GAP + 2 * MS;
    assert_eq!(gate.finished(false, ended), Go::At(ended + GAP));
    // The first timer again, or one fired before its instant: nothing.
    assert_eq!(gate.due(ended + MS), Go::Covered);
    assert_eq!(gate.due(ended + GAP), Go::Now);
}

#[test]
fn reading_on_covers_the_rings_so_far_and_lifts_the_gap() {
    let t0 = Instant::now();
    let mut gate = missed_once(t0);
    assert_eq!(gate.ring(t0), Go::Now);
    assert_eq!(gate.ring(t0 + MS), Go::Covered);
    gate.read_on();
    assert_eq!(gate.finished(false, t0 + 2 * MS), Go::Covered, "covered");
    // A read of its own that found nothing opens no gap.
    assert_eq!(gate.ring(t0 + 3 * MS), Go::Now);
}

#[test]
fn quiet_opens_a_gap_only_after_a_second_rings_read_that_found_nothing() {
    let (mut quiet, t0) = (Quiet::default(), Instant::now());
    quiet.read(false, false, t0);
    quiet.read(false, false, t0);
    assert_eq!(quiet.opens(t0), t0, "a poll's reads open no gap");
    quiet.read(true, false, t0);
    assert_eq!(quiet.opens(t0), t0, "the first miss opens none");
    quiet.read(true, false, t0);
    assert_eq!(quiet.opens(t0 + MS), t0 + GAP);
    assert_eq!(quiet.opens(t0 + 2 * GAP), t0 + 2 * GAP);
    quiet.read(false, true, t0 + MS);
    assert_eq!(quiet.opens(t0 + 2 * MS), t0 + 2 * MS);
    // Found: the next miss is a first one again.
    quiet.read(true, false, t0 + 2 * MS);
    assert_eq!(quiet.opens(t0 + 2 * MS), t0 + 2 * MS);
}

/// Whether `reader` is rung within a moment (a stored ring answers at once; the moment is
/// generous because `rung` ends on the timer's next tick, which a busy machine may delay).
async fn rung_now(reader: &mut Reader, bell: &Bell) -> bool {
    tokio::time::timeout(20 * MS, reader.rung(bell))
        .await
        .is_ok()
}

#[tokio::test]
async fn a_read_covers_the_rings_before_it_but_not_those_during_it() {
    let (bell, mut reader) = (Bell::default(), Reader::default());
    // A ring while the loop was not waiting is left behind...
    bell.ring();
    assert!(rung_now(&mut reader, &bell).await);
    reader.read(true);
    // ... unless a read starts after it: that read covers it.
    bell.ring();
    reader.reading(&bell);
    assert!(
        !rung_now(&mut reader, &bell).await,
        "a ring the read covered"
    );
    // A ring during the read makes one more read.
    reader.reading(&bell);
    bell.ring();
    reader.read(true);
    assert!(rung_now(&mut reader, &bell).await);
}
