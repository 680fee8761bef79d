//! What one snapshot cannot show: each consumer's lag over the last minutes, and the terms
//! seen for each lease (who held it with which token, from when). Kept by the view from the
//! snapshots it takes; nothing here touches the database or the clock.

use std::collections::{BTreeMap, VecDeque};

/// How many lag samples are kept for each consumer: ten minutes at one every fifteen seconds
/// (the pace of a look's slow part).
pub(crate) const LAG_SAMPLES: usize = 40;

/// How many terms are kept for each lease, the latest last.
pub(crate) const TERMS_KEPT: usize = 20;

/// How many leases' terms are followed at most: the first seen are kept.
pub(crate) const LEASES_FOLLOWED: usize = 1000;

/// A consumer's lag at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LagSample {
    /// Seconds since the Unix epoch, on the view's clock, when the snapshot was taken.
    pub at: f64,
    /// Events not yet acknowledged.
    pub events: i64,
    /// Age of the oldest of them, in seconds (0 when none).
    pub seconds: f64,
}

/// A term: a lease held by `owner` with `token`, first seen at `since`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Term {
    pub owner: String,
    pub token: i64,
    pub since: f64,
}

/// How long the terms of a lease whose row is gone are kept: a key released by one member and
/// claimed by another a moment later is one lease changing hands, not two.
pub(crate) const TERMS_OUTLIVE_ROW: f64 = 600.0;

/// The lag series (by `topic/consumer`) and the terms (by lease name, with when its row was
/// last seen).
#[derive(Debug, Default)]
pub(crate) struct History {
    lag: BTreeMap<String, VecDeque<LagSample>>,
    terms: BTreeMap<String, (f64, VecDeque<Term>)>,
}

impl History {
    /// Records `consumer`'s lag; the oldest sample goes once [`LAG_SAMPLES`] are kept.
    pub fn record_lag(&mut self, consumer: &str, sample: LagSample) {
        let series = self.lag.entry(consumer.to_owned()).or_default();
        if series.len() == LAG_SAMPLES {
            series.pop_front();
        }
        series.push_back(sample);
    }

    /// Forgets the series of consumers no longer seen.
    pub fn keep_consumers(&mut self, seen: &[String]) {
        self.lag.retain(|name, _| seen.contains(name));
    }

    /// Records that `name` is held by `owner` with `token` at `at`: a new term when the token
    /// differs from the last one seen (a term missed between two looks is not invented).
    pub fn record_holder(&mut self, name: &str, owner: &str, token: i64, at: f64) {
        if !self.terms.contains_key(name) && self.terms.len() >= LEASES_FOLLOWED {
            return;
        }
        let (seen, terms) = self.terms.entry(name.to_owned()).or_default();
        *seen = at;
        if terms.back().is_some_and(|last| last.token == token) {
            return;
        }
        if terms.len() == TERMS_KEPT {
            terms.pop_front();
        }
        terms.push_back(Term {
            owner: owner.to_owned(),
            token,
            since: at,
        });
    }

    /// Marks the leases whose rows are `seen` at `at`, and forgets the terms of those whose
    /// rows have been gone for [`TERMS_OUTLIVE_ROW`].
    pub fn keep_leases(&mut self, seen: &[String], at: f64) {
        for name in seen {
            if let Some((last, _)) = self.terms.get_mut(name) {
                *last = at;
            }
        }
        self.terms
            .retain(|_, (last, _)| *last >= at - TERMS_OUTLIVE_ROW);
    }

    /// Each consumer's series, oldest sample first.
    pub fn lag(&self) -> impl Iterator<Item = (&str, &VecDeque<LagSample>)> {
        self.lag.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Each lease's terms, oldest first.
    pub fn terms(&self, name: &str) -> Option<&VecDeque<Term>> {
        self.terms.get(name).map(|(_, terms)| terms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, events: i64) -> LagSample {
        LagSample {
            at,
            events,
            seconds: 0.0,
        }
    }

    #[test]
    fn a_series_keeps_the_last_samples_only() {
        let mut history = History::default();
        for i in 0..LAG_SAMPLES + 5 {
            history.record_lag("t/c", sample(i as f64, i as i64));
        }
        let (name, series) = history.lag().next().unwrap();
        assert_eq!(name, "t/c");
        assert_eq!(series.len(), LAG_SAMPLES);
        assert_eq!(series.front().unwrap().events, 5);
        assert_eq!(series.back().unwrap().events, (LAG_SAMPLES + 4) as i64);
    }

    #[test]
    fn consumers_no_longer_seen_are_forgotten() {
        let mut history = History::default();
        history.record_lag("t/a", sample(0.0, 1));
        history.record_lag("t/b", sample(0.0, 1));
        history.keep_consumers(&["t/b".to_owned()]);
        let names: Vec<&str> = history.lag().map(|(n, _)| n).collect();
        assert_eq!(names, ["t/b"]);
    }

    #[test]
    fn a_term_begins_when_the_token_changes_and_not_on_every_look() {
        let mut history = History::default();
        history.record_holder("leader", "a", 1, 0.0);
        history.record_holder("leader", "a", 1, 1.0);
        history.record_holder("leader", "b", 2, 2.0);
        // The same owner again, with a new token: a new term.
        history.record_holder("leader", "b", 3, 3.0);
        let terms = history.terms("leader").unwrap();
        let seen: Vec<(&str, i64, f64)> = terms
            .iter()
            .map(|t| (t.owner.as_str(), t.token, t.since))
            .collect();
        assert_eq!(seen, [("a", 1, 0.0), ("b", 2, 2.0), ("b", 3, 3.0)]);
    }

    #[test]
    fn terms_are_bounded_per_lease_and_in_leases_followed() {
        let mut history = History::default();
        for token in 0..(TERMS_KEPT as i64 + 3) {
            history.record_holder("x", "o", token, token as f64);
        }
        let terms = history.terms("x").unwrap();
        assert_eq!(terms.len(), TERMS_KEPT);
        assert_eq!(terms.front().unwrap().token, 3);
        for i in 0..LEASES_FOLLOWED + 10 {
            history.record_holder(&format!("n{i}"), "o", 1, 0.0);
        }
        assert!(
            history
                .terms(&format!("n{}", LEASES_FOLLOWED + 5))
                .is_none()
        );
        // Rows gone: kept a while (a key changing hands), then forgotten.
        history.keep_leases(&["x".to_owned()], 100.0);
        assert!(history.terms("n0").is_some());
        history.keep_leases(&["x".to_owned()], 100.0 + TERMS_OUTLIVE_ROW + 1.0);
        assert!(history.terms("n0").is_none());
        assert!(history.terms("x").is_some());
    }

    #[test]
    fn a_lease_released_and_taken_again_keeps_its_terms() {
        let mut history = History::default();
        history.record_holder("pool/keys/k", "a", 7, 0.0);
        // Released: its row is gone for a look.
        history.keep_leases(&[], 1.0);
        history.record_holder("pool/keys/k", "b", 9, 2.0);
        let owners: Vec<&str> = (history.terms("pool/keys/k").unwrap().iter())
            .map(|t| t.owner.as_str())
            .collect();
        assert_eq!(owners, ["a", "b"]);
    }
}
