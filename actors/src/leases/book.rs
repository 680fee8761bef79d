//! The holding side's book, apart from I/O: the leases held with their monotonic deadlines,
//! what the next renewal asks for, what its answer means for each lease, and which deadlines
//! have passed. `heartbeat` runs it against the database.
//!
//! A lease's deadline is when its last confirmed (re)grant was sent, plus its lease, less a
//! margin for the clocks' rates: past it the server may grant the lease elsewhere, so the book
//! gives it up first. Only a renewal's answer moves a deadline, and only for a lease still in
//! the book with the token asked for: a lease swept as lost stays lost, whatever comes back.
//! No clock is read here: every instant is the caller's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::lease::margin;

use crate::losses::LossReason;

/// When a lease (re)granted for `lease` by a statement sent at `sent` is given up: the server
/// keeps it at least `lease` from then by its own clock, which may run faster than ours.
pub(crate) fn deadline(sent: Instant, lease: Duration) -> Instant {
    sent + lease - margin(lease)
}

/// How often to sweep deadlines when every lease is at least `lease`: half the least margin,
/// so a lease is given up before the server's expiry even when the sweep comes late.
pub(crate) fn sweep_every(lease: Duration) -> Duration {
    (margin(lease) / 2).max(Duration::from_millis(1))
}

/// One lease in the book, with what its holder keeps beside it (`T`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Entry<T> {
    token: i64,
    /// How long each (re)grant lasts.
    lease: Duration,
    deadline: Instant,
    value: T,
}

/// Every lease held, by name, and whether a renewal is under way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Book<T> {
    leases: BTreeMap<Arc<str>, Entry<T>>,
    renewing: bool,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Book {
            leases: BTreeMap::new(),
            renewing: false,
        }
    }
}

/// One renewal statement: what it asks for and when its answer is too late to matter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Renewal {
    /// Every lease held, by name, token and lease.
    pub(crate) tenures: Vec<(Arc<str>, i64, Duration)>,
    /// The statement is cut off here: at the earliest deadline (a confirmation after it saves
    /// nothing), or sooner when stuck (a retry on a new connection still has most of the lease).
    pub(crate) bound: Instant,
}

/// What a renewal statement answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The tokens of the leases it renewed.
    Renewed(Vec<i64>),
    /// No answer (an error, a cut connection, the bound): it may have renewed or not.
    Unknown,
}

/// What a renewal's answer means for one lease it asked for, still in the book.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict<T> {
    /// Held until this new deadline.
    Renewed(Instant),
    /// Gone on the server, so out of the book: its holder is told.
    Lost(LossReason, T),
    /// Not known: the deadline stays, and the sweep gives the lease up at it.
    Unknown,
}

impl<T> Book<T> {
    /// Records `name` as held with `token`, (re)granted for `lease` by a statement sent at
    /// `sent`; returns the token and value held under that name before (never, by the turns of
    /// names, but said if it were).
    pub(crate) fn hold(
        &mut self,
        name: Arc<str>,
        token: i64,
        lease: Duration,
        sent: Instant,
        value: T,
    ) -> Option<(i64, T)> {
        let deadline = deadline(sent, lease);
        let entry = Entry {
            token,
            lease,
            deadline,
            value,
        };
        (self.leases.insert(name, entry)).map(|old| (old.token, old.value))
    }

    /// Forgets `name` when it is held with `token`, returning its value.
    pub(crate) fn remove(&mut self, name: &str, token: i64) -> Option<T> {
        if !self.holds(name, token) {
            return None;
        }
        self.leases.remove(name).map(|entry| entry.value)
    }

    /// Whether `name` is held with `token`.
    pub(crate) fn holds(&self, name: &str, token: i64) -> bool {
        self.leases.get(name).is_some_and(|e| e.token == token)
    }

    /// Whether `name` is held, with any token.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.leases.contains_key(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.leases.len()
    }

    /// The renewal to send at `now`, marked as under way: none while one is, nor with nothing
    /// held. Cut off at the earliest deadline, or after the statement timeout or a quarter of
    /// the manager's `lease`, whichever comes first.
    pub(crate) fn plan(
        &mut self,
        now: Instant,
        statement_timeout: Duration,
        lease: Duration,
    ) -> Option<Renewal> {
        let earliest = self.leases.values().map(|e| e.deadline).min()?;
        if self.renewing {
            return None;
        }
        self.renewing = true;
        let attempt = statement_timeout.min(lease / 4);
        let tenures = (self.leases.iter())
            .map(|(name, e)| (name.clone(), e.token, e.lease))
            .collect();
        Some(Renewal {
            tenures,
            bound: earliest.min(now + attempt),
        })
    }

    /// What `answer` to `renewal`, sent at `sent`, means for each lease it asked for that is
    /// still held with the token asked for (the others were released or given up meanwhile,
    /// and stay so); applied to the book. The next renewal may be planned.
    pub(crate) fn answered(
        &mut self,
        renewal: Renewal,
        sent: Instant,
        answer: Answer,
    ) -> Vec<(Arc<str>, i64, Verdict<T>)> {
        self.renewing = false;
        let renewed: Option<std::collections::HashSet<i64>> = match answer {
            Answer::Renewed(tokens) => Some(tokens.into_iter().collect()),
            Answer::Unknown => None,
        };
        let mut verdicts = Vec::new();
        for (name, token, _) in renewal.tenures {
            let Some(entry) = self.leases.get_mut(&name).filter(|e| e.token == token) else {
                continue;
            };
            let verdict = match &renewed {
                None => Verdict::Unknown,
                Some(renewed) if renewed.contains(&token) => {
                    entry.deadline = deadline(sent, entry.lease);
                    Verdict::Renewed(entry.deadline)
                }
                Some(_) => {
                    let entry = self.leases.remove(&name).expect("found above");
                    Verdict::Lost(LossReason::TakenOver, entry.value)
                }
            };
            verdicts.push((name, token, verdict));
        }
        verdicts
    }

    /// Gives up every lease whose deadline is `now` or earlier, returning them.
    pub(crate) fn sweep(&mut self, now: Instant) -> Vec<(Arc<str>, i64, T)> {
        let past: Vec<Arc<str>> = (self.leases.iter())
            .filter(|(_, e)| e.deadline <= now)
            .map(|(name, _)| name.clone())
            .collect();
        (past.into_iter())
            .filter_map(|name| {
                let entry = self.leases.remove(&name)?;
                Some((name, entry.token, entry.value))
            })
            .collect()
    }

    /// Forgets every lease, returning them.
    pub(crate) fn drain(&mut self) -> Vec<(Arc<str>, i64, T)> {
        (std::mem::take(&mut self.leases).into_iter())
            .map(|(name, e)| (name, e.token, e.value))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const TIMEOUT: Duration = Duration::from_secs(30);

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A book holding `a` (token 1) and `b` (token 2) for `LEASE`, granted at `t0`.
    fn book(t0: Instant) -> Book<()> {
        let mut book = Book::default();
        book.hold("a".into(), 1, LEASE, t0, ());
        book.hold("b".into(), 2, LEASE, t0, ());
        book
    }

    fn deadline_of(book: &Book<()>, name: &str) -> Instant {
        book.leases[name].deadline
    }

    #[test]
    fn a_grant_is_given_up_a_tenth_of_its_lease_early_never_less_than_a_millisecond() {
        let t0 = Instant::now();
        assert_eq!(deadline(t0, LEASE), t0 + ms(9_000));
        assert_eq!(deadline(t0, ms(10)), t0 + ms(9));
        // Below ten milliseconds the tenth is under a millisecond: a millisecond still.
        assert_eq!(deadline(t0, ms(5)), t0 + ms(4));
        assert_eq!(
            deadline(t0, ms(1)),
            t0,
            "a 1 ms lease is given up as it is granted"
        );
        assert_eq!(sweep_every(LEASE), ms(500));
        assert_eq!(sweep_every(ms(10)), ms(1));
        assert_eq!(sweep_every(ms(5)), ms(1), "never a sweep of no time");
        // The sweep takes a lease at its deadline, not a nanosecond before.
        let mut book = book(t0);
        let at = deadline_of(&book, "a");
        assert!(book.sweep(at - Duration::from_nanos(1)).is_empty());
        let gone = book.sweep(at);
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn a_renewal_answered_in_time_extends_the_deadline_from_its_sending() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let now = t0 + ms(3_000);
        let renewal = book.plan(now, TIMEOUT, LEASE).expect("leases to renew");
        assert_eq!(renewal.tenures.len(), 2);
        assert_eq!(
            renewal.bound,
            now + LEASE / 4,
            "a quarter lease before the deadline"
        );
        assert_eq!(
            book.plan(now, TIMEOUT, LEASE),
            None,
            "one renewal at a time"
        );
        let sent = now + ms(1);
        let verdicts = book.answered(renewal, sent, Answer::Renewed(vec![1, 2]));
        let until = sent + ms(9_000);
        assert_eq!(
            verdicts,
            [
                ("a".into(), 1, Verdict::Renewed(until)),
                ("b".into(), 2, Verdict::Renewed(until)),
            ]
        );
        assert_eq!(deadline_of(&book, "a"), until);
        // Not swept at the old deadline; the next renewal may go.
        assert!(book.sweep(t0 + ms(9_000)).is_empty());
        assert!(book.plan(now, TIMEOUT, LEASE).is_some());
    }

    #[test]
    fn a_lease_missing_from_the_answer_is_lost_and_the_others_renewed() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let renewal = book.plan(t0, TIMEOUT, LEASE).unwrap();
        let verdicts = book.answered(renewal, t0, Answer::Renewed(vec![2]));
        assert_eq!(
            verdicts,
            [
                ("a".into(), 1, Verdict::Lost(LossReason::TakenOver, ())),
                ("b".into(), 2, Verdict::Renewed(deadline(t0, LEASE))),
            ]
        );
        assert!(!book.contains("a") && book.holds("b", 2));
    }

    #[test]
    fn an_answer_after_the_sweep_does_not_bring_a_lost_lease_back() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let renewal = book.plan(t0 + ms(8_000), TIMEOUT, LEASE).unwrap();
        // Cut off at the earliest deadline: nothing later saves anything.
        assert_eq!(renewal.bound, t0 + ms(9_000));
        let swept = book.sweep(t0 + ms(9_000));
        assert_eq!(swept, [("a".into(), 1, ()), ("b".into(), 2, ())]);
        // Granted again meanwhile, with a new token: not the tenure the renewal asked for.
        book.hold("b".into(), 5, LEASE, t0 + ms(9_500), ());
        let late = book.answered(renewal, t0 + ms(8_000), Answer::Renewed(vec![1, 2]));
        assert!(late.is_empty(), "{late:?}");
        assert!(!book.contains("a"), "a swept lease stays lost");
        assert_eq!(deadline_of(&book, "b"), t0 + ms(9_500) + ms(9_000));
    }

    #[test]
    fn an_unknown_answer_keeps_the_deadlines_and_the_sweep_still_fires_at_them() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let renewal = book.plan(t0 + ms(2_500), TIMEOUT, LEASE).unwrap();
        let verdicts = book.answered(renewal, t0 + ms(2_500), Answer::Unknown);
        assert_eq!(
            verdicts,
            [
                ("a".into(), 1, Verdict::Unknown),
                ("b".into(), 2, Verdict::Unknown),
            ]
        );
        assert_eq!(deadline_of(&book, "a"), t0 + ms(9_000));
        assert!(book.sweep(t0 + ms(8_999)).is_empty());
        assert_eq!(book.sweep(t0 + ms(9_000)).len(), 2);
        // Nothing held: nothing to renew.
        assert_eq!(book.plan(t0 + ms(9_000), TIMEOUT, LEASE), None);
    }

    #[test]
    fn a_renewal_is_cut_off_at_the_statement_timeout_a_quarter_lease_or_the_earliest_deadline() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let short = ms(100);
        let renewal = book.plan(t0, short, LEASE).unwrap();
        assert_eq!(renewal.bound, t0 + short);
        let _ = book.answered(renewal, t0, Answer::Unknown);
        // A lease of its own (longer than the manager's) keeps its own deadline.
        book.hold("long".into(), 3, LEASE * 6, t0, ());
        let renewal = book.plan(t0 + ms(8_000), TIMEOUT, LEASE).unwrap();
        assert_eq!(renewal.bound, t0 + ms(9_000));
        let sent = t0 + ms(8_000);
        let _ = book.answered(renewal, sent, Answer::Renewed(vec![1, 2, 3]));
        assert_eq!(deadline_of(&book, "long"), sent + ms(54_000));
    }

    #[test]
    fn released_leases_leave_the_book_and_their_renewal_says_nothing_of_them() {
        let t0 = Instant::now();
        let mut book = book(t0);
        let renewal = book.plan(t0, TIMEOUT, LEASE).unwrap();
        assert_eq!(book.remove("a", 9), None, "another tenure's token");
        assert_eq!(book.remove("a", 1), Some(()));
        let verdicts = book.answered(renewal, t0, Answer::Renewed(vec![]));
        assert_eq!(
            verdicts,
            [("b".into(), 2, Verdict::Lost(LossReason::TakenOver, ()))]
        );
        assert_eq!(book.len(), 0);
    }
}
