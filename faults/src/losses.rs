//! Invariant I9 under faults: each lost lease is told once, to its handle and to its manager's
//! `SubscribeLockLost` subscriber, and a release is no loss. A holder process keeps, for each
//! tenure a manager ended, what its release answered and whether its handle was told of a loss,
//! counts what the subscriber was told by token, and says the result on a `LOSSES` line; a
//! scenario adds the lines up ([`Losses`]) and requires nothing told otherwise.

use std::collections::HashMap;

use crate::linear::Ret;

/// How one tenure ended, as its manager's holder saw it.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// The tenure's token.
    pub token: i64,
    /// What its release answered: `Released`, `Lost`, or `None` (unknown: it may have been
    /// either).
    pub answer: Option<Ret>,
    /// Whether its handle was told of a loss.
    pub handle_told: bool,
}

impl Ended {
    /// Whether what was told of this tenure breaks the rule, the subscriber having been told
    /// of it `subscriber` times.
    fn broken(&self, subscriber: u32) -> bool {
        let answer_agrees = match self.answer {
            Some(Ret::Released) => !self.handle_told,
            Some(Ret::Lost) => self.handle_told,
            // Released or lost: either, told once or not at all.
            _ => true,
        };
        subscriber != u32::from(self.handle_told) || !answer_agrees
    }
}

/// The `LOSSES` line of one manager: `LOSSES <owner> tenures=N lost=N broken=N [token:...]...`.
pub fn line(owner: &str, ended: &[Ended], told: &HashMap<i64, u32>) -> String {
    let mut broken = Vec::new();
    for e in ended {
        let subscriber = told.get(&e.token).copied().unwrap_or(0);
        if e.broken(subscriber) {
            broken.push(format!(
                "{}:{:?}:handle={}:subscriber={subscriber}",
                e.token, e.answer, e.handle_told
            ));
        }
    }
    let lost = ended.iter().filter(|e| e.handle_told).count();
    let mut line = format!(
        "LOSSES {owner} tenures={} lost={lost} broken={}",
        ended.len(),
        broken.len()
    );
    for b in broken {
        line.push(' ');
        line.push_str(&b);
    }
    line
}

/// What holder processes' managers said of their tenures' ends, added up.
#[derive(Debug, Default, Clone)]
pub struct Losses {
    /// Managers that said so.
    pub managers: usize,
    /// Tenures they ended.
    pub tenures: usize,
    /// Of which lost (told to the handle).
    pub lost: usize,
    /// Each tenure whose loss was told otherwise: `token:answer:handle=..:subscriber=..`.
    pub broken: Vec<String>,
}

impl Losses {
    /// Adds one `LOSSES` line; `None` when `line` is not one.
    pub fn add(&mut self, line: &str) -> Option<()> {
        let mut words = line.strip_prefix("LOSSES ")?.split(' ').skip(1);
        let mut count = |key: &str| -> Option<usize> {
            words
                .next()?
                .strip_prefix(key)?
                .strip_prefix('=')?
                .parse()
                .ok()
        };
        let (tenures, lost, _) = (count("tenures")?, count("lost")?, count("broken")?);
        self.managers += 1;
        self.tenures += tenures;
        self.lost += lost;
        self.broken.extend(words.map(str::to_string));
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(ended: &[(i64, Option<Ret>, bool)], told: &[(i64, u32)]) -> Losses {
        let ended: Vec<Ended> = (ended.iter())
            .map(|&(token, answer, handle_told)| Ended {
                token,
                answer,
                handle_told,
            })
            .collect();
        let mut losses = Losses::default();
        losses
            .add(&line("p0-0", &ended, &told.iter().copied().collect()))
            .unwrap();
        losses
    }

    #[test]
    fn losses_told_once_to_both_and_releases_told_never_pass() {
        let losses = said(
            &[
                (1, Some(Ret::Released), false),
                (2, Some(Ret::Lost), true),
                (3, None, false),
                (4, None, true),
            ],
            &[(2, 1), (4, 1)],
        );
        assert_eq!((losses.managers, losses.tenures, losses.lost), (1, 4, 2));
        assert!(losses.broken.is_empty(), "{losses:?}");
    }

    #[test]
    fn a_loss_told_twice_a_release_told_as_a_loss_and_a_loss_told_to_one_side_are_found() {
        let twice = said(&[(1, Some(Ret::Lost), true)], &[(1, 2)]);
        let release = said(&[(1, Some(Ret::Released), true)], &[(1, 1)]);
        let handle_only = said(&[(1, Some(Ret::Lost), true)], &[]);
        let subscriber_only = said(&[(1, None, false)], &[(1, 1)]);
        let untold = said(&[(1, Some(Ret::Lost), false)], &[]);
        for losses in [twice, release, handle_only, subscriber_only, untold] {
            assert_eq!(losses.broken.len(), 1, "{losses:?}");
        }
    }
}
