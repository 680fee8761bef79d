//! The doorbell: a notification that only says "look", and the one rule every reader of one
//! follows.
//!
//! Anyone who can connect can NOTIFY, so a ring may be late, lost, forged, replayed or flooded.
//! It never carries a verdict: it only makes a reader read the truth from the database, and a
//! lost one costs the reader's poll. Nothing here takes a payload: a wing may turn one into a
//! hint of *which* of its readers to ring (a topic's, a key's, a name's), never into what a read
//! finds, and never into skipping a read (a ring it drops is one lost, which the poll covers).
//!
//! The rule, in [`Quiet`]: after a read that a ring asked for found nothing new — the second
//! such since a read last found something — the next ring's read waits until [`GAP`] has passed
//! since that read ended, so a flood costs a read per gap (and one more), not one each. A read
//! that found something lifts the gap: the next ring reads at once.
//!
//! Two ways to be rung:
//! - [`Gate`], for an actor that reads: one read at a time, rings during a read make one more
//!   read after it, rings before a put-off read are covered by it. Pure: the actor does what it
//!   answers ([`Go`]).
//! - [`Bell`] and [`Reader`], for a loop on a task of its own: the actor rings the `Bell`, the
//!   loop waits for it with its `Reader`; rings during a read leave one wake-up behind.

use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// After a ring's read that found nothing, the next ring's read waits this long.
const GAP: Duration = Duration::from_millis(50);

/// The flood rule alone: when a ring may make its reader read.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Quiet {
    /// The end of the gap after a ring's read that found nothing.
    until: Option<Instant>,
    /// A ring's read found nothing since the last read that found something.
    missed: bool,
}

impl Quiet {
    /// A read ended at `now`: `rung` when a ring asked for it, `found` when it found something
    /// new. Only a ring's read that found nothing opens a gap (a poll's does not: polls are
    /// bounded by their own rate), and not the first since a read found something: a reader's
    /// own write is often rung for during its next read, and that read's "nothing" must not
    /// put off the ring that matters a moment later. Any read that found something closes it.
    pub(crate) fn read(&mut self, rung: bool, found: bool, now: Instant) {
        if found {
            (self.until, self.missed) = (None, false);
        } else if rung && std::mem::replace(&mut self.missed, true) {
            self.until = Some(now + GAP);
        }
    }

    /// When a ring heard at `now` may read: `now`, or the end of the gap.
    pub(crate) fn opens(&self, now: Instant) -> Instant {
        self.until.map_or(now, |until| until.max(now))
    }
}

/// What a [`Gate`] tells its reader to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Go {
    /// Read now; report its end with [`Gate::finished`].
    Now,
    /// Read at this instant: call [`Gate::due`] then.
    At(Instant),
    /// Nothing: a read under way or put off covers it.
    Covered,
}

/// One reader's reads, one at a time, for an actor: see the module docs.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Gate {
    quiet: Quiet,
    /// A read under way, and whether a ring asked for it.
    reading: Option<bool>,
    /// Rung during the read under way, whose snapshot may predate what was rung for: read again
    /// after it.
    again: bool,
    /// When the put-off read is due.
    put_off: Option<Instant>,
}

impl Gate {
    /// A ring at `now`.
    pub(crate) fn ring(&mut self, now: Instant) -> Go {
        if self.reading.is_some() {
            self.again = true;
            return Go::Covered;
        }
        if self.put_off.is_some() {
            return Go::Covered;
        }
        let opens = self.quiet.opens(now);
        if opens > now {
            self.put_off = Some(opens);
            return Go::At(opens);
        }
        self.reading = Some(true);
        Go::Now
    }

    /// The instant a put-off read was due came (`now`). A timer left from a put-off read that a
    /// read of another cause covered since does nothing.
    pub(crate) fn due(&mut self, now: Instant) -> Go {
        match self.put_off {
            Some(at) if at <= now => {
                self.put_off = None;
                self.ring(now)
            }
            _ => Go::Covered,
        }
    }

    /// A read of another cause (a poll, a tick, a reconnect): now, unless one is under way
    /// (then once more after it). It covers a put-off read: what was rung before it started has
    /// committed before it.
    pub(crate) fn ask(&mut self) -> Go {
        if self.reading.is_some() {
            self.again = true;
            return Go::Covered;
        }
        self.put_off = None;
        self.reading = Some(false);
        Go::Now
    }

    /// The read under way ended at `now`, having `found` something new or not.
    pub(crate) fn finished(&mut self, found: bool, now: Instant) -> Go {
        let rung = self.reading.take() == Some(true);
        self.quiet.read(rung, found, now);
        match std::mem::take(&mut self.again) {
            true => self.ring(now),
            false => Go::Covered,
        }
    }

    /// The read under way found something and the reader reads on at once, a read of its own
    /// (not a ring's): it covers whatever was rung so far.
    pub(crate) fn read_on(&mut self) {
        self.quiet = Quiet::default();
        self.again = false;
        self.reading = Some(false);
    }

    /// Nothing under way, put off or remembered at `now`: the gate can be forgotten. A miss
    /// is remembered: a gate forgotten with it would give a flood its spare miss again.
    pub(crate) fn at_rest(&self, now: Instant) -> bool {
        self.reading.is_none()
            && self.put_off.is_none()
            && self.quiet.opens(now) <= now
            && !self.quiet.missed
    }
}

/// The ringing side of a doorbell whose reader is a loop on a task of its own. Rings while the
/// loop is not waiting leave one wake-up behind: the loop reads once more, however many came.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    notify: Notify,
}

impl Bell {
    /// Rings: the reader reads, now or at the end of its gap.
    pub(crate) fn ring(&self) {
        self.notify.notify_one();
    }
}

/// The reading side of a [`Bell`]: the loop's [`Quiet`], and whether its next read is a ring's.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    quiet: Quiet,
    rung: bool,
}

impl Reader {
    /// Waits for a ring, then for the instant its read may start. Cancel-safe: a ring taken
    /// and not read yet is covered by the read the loop makes instead (or the loop ends).
    pub(crate) async fn rung(&mut self, bell: &Bell) {
        bell.notify.notified().await;
        // Only while a gap is open: the timer counts whole milliseconds, and a sleep until now
        // would wait for its next tick.
        let now = Instant::now();
        let opens = self.quiet.opens(now);
        if opens > now {
            tokio::time::sleep_until(opens.into()).await;
        }
        self.rung = true;
    }

    /// A read is about to start: it covers every ring heard before it, so one left behind
    /// while the loop was not waiting (by a ring the last read already covered, say) is
    /// forgotten instead of making a read of its own. Rings during the read still make one.
    pub(crate) fn reading(&mut self, bell: &Bell) {
        use futures_util::FutureExt;
        let _ = bell.notify.notified().now_or_never();
    }

    /// A read ended, having `found` something new or not.
    pub(crate) fn read(&mut self, found: bool) {
        let rung = std::mem::take(&mut self.rung);
        self.quiet.read(rung, found, Instant::now());
    }
}

#[cfg(test)]
mod tests;
