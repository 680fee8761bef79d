//! The durable-topic workload's history and its checker, after etcd's watch guarantees.
//!
//! Appenders record each append: its cursor, when its transaction began, and how it ended
//! (committed and acknowledged, rolled back, or unknown: the commit's answer was lost). A
//! consumer records what it was delivered, in order. The checker reports:
//! - **out of order**: a delivery whose cursor is not above the one before it (a duplicate is
//!   one too: at-least-once redeliveries are checked per resumption, not here);
//! - **lost**: an acknowledged append never delivered — with the order checked, this is also a
//!   gap, since every delivery after it moved the cursor past it;
//! - **phantom**: a delivery of an append that rolled back, or that nobody made;
//! - **late**: an append delivered before one that had committed before it began (real-time
//!   order: an event caused by another comes after it).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use pgcoord::topic::Cursor;

/// How an append's transaction ended, as its appender saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The commit was acknowledged at this instant.
    Committed(Instant),
    /// The transaction rolled back: the event must never be delivered.
    RolledBack,
    /// The commit's answer was lost: the event may or may not be delivered.
    Unknown,
}

/// One append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Append {
    /// The cursor the append returned.
    pub cursor: Cursor,
    /// When its transaction began (before the append).
    pub began: Instant,
    /// How its transaction ended.
    pub outcome: Outcome,
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicVerdict {
    /// Deliveries checked.
    pub delivered: usize,
    /// Deliveries not above the one before.
    pub out_of_order: usize,
    /// Acknowledged appends never delivered.
    pub lost: Vec<Cursor>,
    /// Deliveries of appends that rolled back or were never made.
    pub phantom: Vec<Cursor>,
    /// Deliveries that came before an append which had committed before they began.
    pub late: usize,
}

impl TopicVerdict {
    /// True when nothing was out of order, lost, phantom or late.
    pub fn is_safe(&self) -> bool {
        self.out_of_order == 0 && self.lost.is_empty() && self.phantom.is_empty() && self.late == 0
    }
}

impl std::fmt::Display for TopicVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} delivered: {} out of order, {} lost, {} phantom, {} late",
            self.delivered,
            self.out_of_order,
            self.lost.len(),
            self.phantom.len(),
            self.late
        )
    }
}

/// Checks `delivered` (in delivery order) against `appends`.
pub fn check(appends: &[Append], delivered: &[Cursor]) -> TopicVerdict {
    let mut verdict = TopicVerdict {
        delivered: delivered.len(),
        ..TopicVerdict::default()
    };
    verdict.out_of_order = delivered.windows(2).filter(|w| w[1] <= w[0]).count();
    let by_cursor: HashMap<Cursor, &Append> = appends.iter().map(|a| (a.cursor, a)).collect();
    let seen: HashSet<Cursor> = delivered.iter().copied().collect();
    verdict.phantom = (delivered.iter())
        .filter(|c| {
            by_cursor
                .get(c)
                .is_none_or(|a| a.outcome == Outcome::RolledBack)
        })
        .copied()
        .collect();
    let mut committed: Vec<(Instant, Cursor)> = (appends.iter())
        .filter_map(|a| match a.outcome {
            Outcome::Committed(at) => Some((at, a.cursor)),
            _ => None,
        })
        .collect();
    verdict.lost = (committed.iter())
        .filter(|(_, c)| !seen.contains(c))
        .map(|(_, c)| *c)
        .collect();
    verdict.lost.sort();
    // Real time: for each delivery b, every append committed before b began was delivered
    // earlier. By commit instant, the latest delivery index among those committed so far.
    committed.sort();
    let index: HashMap<Cursor, usize> = (delivered.iter().enumerate())
        .map(|(i, c)| (*c, i))
        .collect();
    let mut latest = Vec::with_capacity(committed.len());
    let mut max = None;
    for (_, cursor) in &committed {
        max = max.max(index.get(cursor).copied());
        latest.push(max);
    }
    for (i, cursor) in delivered.iter().enumerate() {
        let Some(append) = by_cursor.get(cursor) else {
            continue;
        };
        let before = committed.partition_point(|(at, _)| *at < append.began);
        if let Some(Some(j)) = before.checked_sub(1).map(|k| latest[k])
            && j > i
        {
            verdict.late += 1;
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cursor(xid: i64, position: i64) -> Cursor {
        Cursor { xid, position }
    }

    /// a committed before b and c began; c rolled back.
    fn history() -> (Vec<Append>, Instant) {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let appends = vec![
            Append {
                cursor: cursor(10, 1),
                began: at(0),
                outcome: Outcome::Committed(at(5)),
            },
            Append {
                cursor: cursor(11, 2),
                began: at(6),
                outcome: Outcome::Committed(at(9)),
            },
            Append {
                cursor: cursor(12, 3),
                began: at(7),
                outcome: Outcome::RolledBack,
            },
            Append {
                cursor: cursor(13, 4),
                began: at(8),
                outcome: Outcome::Unknown,
            },
        ];
        (appends, t)
    }

    #[test]
    fn a_clean_history_is_safe_with_or_without_the_unknown_one() {
        let (appends, _) = history();
        let verdict = check(&appends, &[cursor(10, 1), cursor(11, 2)]);
        assert!(verdict.is_safe(), "{verdict}");
        let verdict = check(&appends, &[cursor(10, 1), cursor(11, 2), cursor(13, 4)]);
        assert!(verdict.is_safe(), "{verdict}");
    }

    #[test]
    fn each_violation_is_found_alone() {
        let (appends, _) = history();
        let out_of_order = check(&appends, &[cursor(11, 2), cursor(10, 1)]);
        assert_eq!(out_of_order.out_of_order, 1, "{out_of_order}");
        assert_eq!(
            out_of_order.late, 1,
            "a came after b, which began after a committed"
        );
        let duplicate = check(&appends, &[cursor(10, 1), cursor(10, 1), cursor(11, 2)]);
        assert_eq!((duplicate.out_of_order, duplicate.late), (1, 0));
        let lost = check(&appends, &[cursor(10, 1)]);
        assert_eq!(lost.lost, [cursor(11, 2)]);
        assert_eq!((lost.out_of_order, lost.late), (0, 0));
        let phantom = check(&appends, &[cursor(10, 1), cursor(11, 2), cursor(12, 3)]);
        assert_eq!(phantom.phantom, [cursor(12, 3)]);
        let invented = check(&appends, &[cursor(10, 1), cursor(11, 2), cursor(99, 9)]);
        assert_eq!(invented.phantom, [cursor(99, 9)]);
        for verdict in [out_of_order, duplicate, lost, phantom, invented] {
            assert!(!verdict.is_safe());
        }
    }

    #[test]
    fn concurrent_appends_may_come_in_either_order() {
        // Neither committed before the other began: both orders are fine.
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let appends = [
            Append {
                cursor: cursor(20, 1),
                began: at(0),
                outcome: Outcome::Committed(at(10)),
            },
            Append {
                cursor: cursor(21, 2),
                began: at(1),
                outcome: Outcome::Committed(at(2)),
            },
        ];
        assert!(check(&appends, &[cursor(20, 1), cursor(21, 2)]).is_safe());
        let reversed = check(&appends, &[cursor(21, 2), cursor(20, 1)]);
        assert_eq!((reversed.out_of_order, reversed.late), (1, 0));
    }
}
