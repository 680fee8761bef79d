//! One wait for a lease or a permit, apart from I/O: which statement the next attempt is, what
//! each answer means, and how long to nap. `wait` runs it against the database.
//!
//! A wait's first attempt asks plainly (no place in line: an uncontended acquire costs the
//! waiters' table nothing). A refused first attempt asks again at once in line, and from then on
//! every attempt refreshes the place. Only the answer of an attempt ever grants; wake-ups only
//! end a nap early.

use std::time::{Duration, Instant};

use pgcoord::{Error, Holder};

/// The statement of the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Once, not waiting (`fail_if_locked`): a refusal names the holder.
    Once,
    /// The first attempt of a wait: plain, batched with others under way.
    First,
    /// Every later attempt: a refusal keeps the caller in line.
    InLine,
}

/// What an attempt answered.
#[derive(Debug)]
pub(crate) enum Answer<G> {
    /// Granted.
    Granted(G),
    /// Held by another; `None` when free but another waiter is first in line.
    Held(Option<Holder>),
    /// Every permit is held.
    Full,
    /// The row was locked by another transaction for a moment: not waited for.
    Busy,
    /// The attempt may have run, but its answer was lost (its connection failed or it passed
    /// its bound): it may have granted what nobody received.
    Unknown(Error),
    /// Nothing was granted: an error before the statement was sent, or one it answered.
    Failed(Error),
}

/// What the wait does next.
#[derive(Debug)]
pub(crate) enum Next<G> {
    /// Done: granted.
    Granted(G),
    /// Done: the lease is held (fail-if-locked), naming the holder when known.
    NotAcquired(Option<Holder>),
    /// Done: failed.
    Fail(Error),
    /// Ask again at once.
    Again,
    /// Wait for a wake-up, at most this long (the deadline and the caller end it too).
    Nap(Duration),
    /// Free any grant of the unknown attempt, then call [`OneWait::after_check`].
    CheckOrphans(Error),
}

/// How long the next grant is ours for sure and another attempt holds the row: ask again
/// almost at once, this many times.
const QUICK_RETRIES: u32 = 4;

/// The state of one wait.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct OneWait {
    deadline: Option<Instant>,
    /// The longest nap without a wake-up.
    poll: Duration,
    once: bool,
    /// Whether an attempt was sent.
    asked: bool,
    /// Whether an attempt in line was sent: leaving without the lease must leave the line.
    in_line: bool,
    /// Whether the first attempt gets in line too (the name was contended here lately).
    in_line_first: bool,
    /// Whether an attempt was refused (held, full, busy): the name is contended.
    refused: bool,
    /// Busy answers in a row.
    busy: u32,
    /// The last holder an attempt named.
    holder: Option<Holder>,
}

impl OneWait {
    /// A wait until `deadline` (forever without one), napping at most `poll`; `once` for a
    /// single attempt that does not wait.
    pub(crate) fn new(deadline: Option<Instant>, poll: Duration, once: bool) -> OneWait {
        OneWait {
            deadline,
            poll,
            once,
            asked: false,
            in_line: false,
            in_line_first: false,
            refused: false,
            busy: 0,
            holder: None,
        }
    }

    /// The same wait, whose first attempt gets in line when `contended`: the name's last wait
    /// here had to, so a plain first attempt would most likely be refused, one statement for
    /// nothing. A name no longer contended is granted by that attempt all the same.
    pub(crate) fn in_line_first(mut self, contended: bool) -> OneWait {
        self.in_line_first = contended && !self.once;
        self
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether this is a single attempt that does not wait.
    pub(crate) fn once(&self) -> bool {
        self.once
    }

    /// Whether the deadline has passed at `now`.
    pub(crate) fn passed(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Whether an attempt may have put the caller in line.
    pub(crate) fn in_line(&self) -> bool {
        self.in_line
    }

    /// The last holder an attempt named, for the error at the deadline.
    pub(crate) fn holder(&self) -> Option<Holder> {
        self.holder.clone()
    }

    /// The statement of the next attempt, marked as sent: from an attempt in line on, the
    /// caller may be in line even if its answer is lost.
    pub(crate) fn ask(&mut self) -> Ask {
        let ask = match (self.once, self.asked) {
            (true, _) => Ask::Once,
            (false, false) if !self.in_line_first => Ask::First,
            (false, _) => Ask::InLine,
        };
        self.asked = true;
        self.in_line |= ask == Ask::InLine;
        ask
    }

    /// Whether an attempt was refused: the name is contended.
    pub(crate) fn refused(&self) -> bool {
        self.refused
    }

    /// What comes after `answer`, at `now`.
    pub(crate) fn after<G>(&mut self, answer: Answer<G>, now: Instant) -> Next<G> {
        self.refused |= matches!(answer, Answer::Held(_) | Answer::Busy | Answer::Full);
        match answer {
            Answer::Granted(grant) => Next::Granted(grant),
            Answer::Unknown(error) => Next::CheckOrphans(error),
            Answer::Failed(error) => Next::Fail(error),
            Answer::Held(holder) if self.once => Next::NotAcquired(holder),
            Answer::Busy | Answer::Full if self.once => Next::NotAcquired(None),
            // Refused before it was in line: get in line at once.
            Answer::Held(holder) if !self.in_line => {
                self.busy = 0;
                self.holder = holder;
                Next::Again
            }
            Answer::Held(holder) => {
                self.busy = 0;
                // Wake at the holder's expiry at the latest: it may be taken over then.
                let until_expiry = holder
                    .as_ref()
                    .map_or(self.poll, |h| h.remaining + Duration::from_millis(1));
                self.holder = holder;
                self.nap(until_expiry.min(self.poll), now)
            }
            Answer::Full => {
                self.busy = 0;
                self.nap(self.poll, now)
            }
            Answer::Busy => {
                self.busy += 1;
                let nap = if self.in_line && self.busy <= QUICK_RETRIES {
                    // In line, and another statement holds the row for a moment (the
                    // releaser's own next attempt, meeting the announced waiter's).
                    Duration::from_micros(250 * u64::from(self.busy))
                } else {
                    // A renewal, a fencing guard, a DBA's transaction: less and less often.
                    pgcoord::__private::backoff(self.busy - 1).min(self.poll)
                };
                self.nap(nap, now)
            }
        }
    }

    /// What comes after the check of an unknown attempt's orphans: asked again when nothing is
    /// left behind and the deadline (if any) allows, else the attempt's error. A database that
    /// cannot be reached fails the next attempt's connection at once, `Unavailable`.
    pub(crate) fn after_check<G>(&mut self, cleaned: bool, error: Error, now: Instant) -> Next<G> {
        if cleaned && !self.passed(now) {
            Next::Again
        } else {
            Next::Fail(error)
        }
    }

    /// A nap of `nap`, never past the deadline.
    fn nap<G>(&self, nap: Duration, now: Instant) -> Next<G> {
        let left = self
            .deadline
            .map_or(nap, |d| d.saturating_duration_since(now));
        Next::Nap(nap.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgcoord::ErrorKind;

    const POLL: Duration = Duration::from_secs(5);

    fn holder(remaining: Duration) -> Holder {
        pgcoord::__private::holder("other".into(), 7, remaining)
    }

    fn unavailable() -> Error {
        Error::new(ErrorKind::Unavailable, "cut off")
    }

    fn nap(next: Next<()>) -> Duration {
        match next {
            Next::Nap(nap) => nap,
            other => panic!("not a nap: {other:?}"),
        }
    }

    #[test]
    fn the_first_attempt_asks_plainly_a_refusal_gets_in_line_and_a_grant_ends_it() {
        let now = Instant::now();
        let mut line = OneWait::new(None, POLL, false);
        assert_eq!(line.ask(), Ask::First);
        assert!(!line.in_line(), "a plain attempt puts nobody in line");
        let next = line.after::<u8>(Answer::Held(Some(holder(POLL))), now);
        assert!(matches!(next, Next::Again), "{next:?}");
        assert_eq!((line.ask(), line.ask()), (Ask::InLine, Ask::InLine));
        assert!(line.in_line());
        let _ = line.after::<u8>(Answer::Busy, now);
        assert!(matches!(
            line.after(Answer::Granted(3u8), now),
            Next::Granted(3)
        ));
    }

    #[test]
    fn a_wait_for_a_name_contended_lately_gets_in_line_with_its_first_attempt() {
        let now = Instant::now();
        let mut line = OneWait::new(None, POLL, false).in_line_first(true);
        assert_eq!(line.ask(), Ask::InLine);
        assert!(line.in_line(), "its place must be left if it gives up");
        assert!(!line.refused());
        // Refused in line: it naps (no second attempt at once, as a plain refusal gets).
        let next = line.after::<u8>(Answer::Held(Some(holder(POLL))), now);
        assert!(matches!(next, Next::Nap(_)), "{next:?}");
        assert!(
            line.refused(),
            "still contended: the next wait gets in line first too"
        );
        // A single attempt never gets in line, contended or not.
        let mut once = OneWait::new(None, POLL, true).in_line_first(true);
        assert_eq!(once.ask(), Ask::Once);
        assert!(!once.in_line());
    }

    #[test]
    fn in_line_a_waiter_naps_until_the_holders_expiry_the_poll_or_the_deadline() {
        let now = Instant::now();
        let mut line = OneWait::new(None, POLL, false);
        let _ = (line.ask(), line.ask());
        let soon = Duration::from_millis(30);
        let next = line.after(Answer::Held(Some(holder(soon))), now);
        assert_eq!(nap(next), soon + Duration::from_millis(1));
        assert_eq!(line.holder().unwrap().token, 7, "remembered for the error");
        let next = line.after(Answer::Held(Some(holder(POLL * 3))), now);
        assert_eq!(nap(next), POLL, "never longer than the poll");
        // Free, but another waiter is first: its grant or its lapse comes by the poll.
        assert_eq!(nap(line.after(Answer::Held(None), now)), POLL);
        assert_eq!(nap(line.after(Answer::Full, now)), POLL);
        let mut line = OneWait::new(Some(now + soon), POLL, false);
        let _ = (line.ask(), line.ask());
        assert_eq!(nap(line.after(Answer::Held(Some(holder(POLL))), now)), soon);
        assert!(!line.passed(now) && line.passed(now + soon));
    }

    #[test]
    fn busy_rows_are_asked_again_quickly_in_line_then_less_and_less_often() {
        let now = Instant::now();
        let mut line = OneWait::new(None, POLL, false);
        let _ = (line.ask(), line.ask());
        let quick: Vec<Duration> = (0..QUICK_RETRIES)
            .map(|_| nap(line.after(Answer::Busy, now)))
            .collect();
        assert_eq!(quick[0], Duration::from_micros(250));
        assert!(quick.windows(2).all(|w| w[0] < w[1]), "{quick:?}");
        assert!(nap(line.after(Answer::Busy, now)) <= POLL);
        // An answer other than busy starts the count again.
        let _ = line.after::<()>(Answer::Held(Some(holder(POLL))), now);
        assert_eq!(nap(line.after(Answer::Busy, now)), quick[0]);
    }

    #[test]
    fn once_a_refusal_or_a_busy_row_is_not_acquired() {
        let now = Instant::now();
        let mut line = OneWait::new(None, POLL, true);
        assert_eq!(line.ask(), Ask::Once);
        assert!(!line.in_line(), "once never gets in line");
        let next = line.after::<()>(Answer::Held(Some(holder(POLL))), now);
        assert!(matches!(next, Next::NotAcquired(Some(h)) if h.token == 7));
        let next = line.after::<()>(Answer::Busy, now);
        assert!(matches!(next, Next::NotAcquired(None)));
    }

    #[test]
    fn an_unknown_outcome_is_checked_then_asked_again_only_with_time_left() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(1);
        let mut line = OneWait::new(Some(deadline), POLL, false);
        line.ask();
        let next = line.after::<()>(Answer::Unknown(unavailable()), now);
        let Next::CheckOrphans(error) = next else {
            panic!("{next:?}")
        };
        assert!(matches!(
            line.after_check::<()>(true, error, now),
            Next::Again
        ));
        // Not cleaned: the attempt's error, whatever the time left; cleaned, too late: too.
        let next = line.after_check::<()>(false, unavailable(), now);
        assert!(matches!(next, Next::Fail(e) if e.is_unavailable()));
        let next = line.after_check::<()>(true, unavailable(), deadline);
        assert!(matches!(next, Next::Fail(_)));
        // A wait without a deadline asks again once nothing is left behind.
        let mut forever = OneWait::new(None, POLL, false);
        let next = forever.after_check::<()>(true, unavailable(), now);
        assert!(matches!(next, Next::Again));
        // A failure known to have granted nothing needs no check.
        let next = line.after::<()>(Answer::Failed(unavailable()), now);
        assert!(matches!(next, Next::Fail(_)));
    }
}
