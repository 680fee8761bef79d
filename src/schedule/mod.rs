//! Schedules: each tick of a schedule runs once across the fleet, on the server's clock.
//!
//! - [`Timing`] — when the ticks are: every period (from the Unix epoch, plus an offset), or a
//!   cron expression (UTC, through the `croner` crate).
//! - [`plan`] — pure: given what the table says and the server's time, which tick to run, retry
//!   or give up on next, or how long to wait. [`CatchUp`] says what happens to ticks nobody ran.
//! - [`ScheduleTable`] — the statements of the runs table: one row per tick that was started,
//!   claimed under the schedule's lease with its token, finished (in the run's own transaction
//!   when it wants its effects fenced), listed for `pgcoord schedules`, trimmed to a history.
//!
//! The runtime (`pgcoord-actors`' `Schedule`) holds the schedule's lease while it runs a tick, so
//! one process at a time decides and runs; the row per tick, unique, makes a tick that is done
//! stay done. The argument is in docs/DESIGN.md, "Schedules".

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, ErrorKind, Result};

pub(crate) mod table;

pub use table::{RunInfo, RunState, ScheduleTable};

/// The shortest period of [`Timing::every`].
pub const MIN_PERIOD: Duration = Duration::from_millis(10);

/// When a schedule's ticks are. Ticks are instants on the server's clock, whole microseconds
/// (as `timestamptz` stores them).
#[derive(Debug, Clone)]
pub struct Timing(Kind);

#[derive(Debug, Clone)]
enum Kind {
    /// Ticks at `offset + k × period` microseconds after the Unix epoch.
    Every {
        period: u64,
        offset: u64,
    },
    Cron(Box<croner::Cron>),
}

impl Timing {
    /// A tick every `period` (at least 10 ms, whole microseconds), at whole multiples of it
    /// since the Unix epoch: every process computes the same ticks.
    pub fn every(period: Duration) -> Result<Timing> {
        if period < MIN_PERIOD {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                format!("a schedule's period {period:?} is shorter than {MIN_PERIOD:?}"),
            ));
        }
        Ok(Timing(Kind::Every {
            period: micros(period),
            offset: 0,
        }))
    }

    /// The ticks of [`every`](Self::every) moved later by `offset` (less than the period):
    /// `every(1 day).offset(2 h)` ticks at 02:00 UTC.
    pub fn offset(self, offset: Duration) -> Result<Timing> {
        match self.0 {
            Kind::Every { period, .. } if micros(offset) < period => Ok(Timing(Kind::Every {
                period,
                offset: micros(offset),
            })),
            Kind::Every { .. } => Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("a schedule's offset {offset:?} is not shorter than its period"),
            )),
            Kind::Cron(_) => Err(Error::new(
                ErrorKind::InvalidConfig,
                "a cron schedule takes no offset",
            )),
        }
    }

    /// The ticks of a cron expression, in UTC: five fields (minute hour day month weekday), or
    /// six with seconds first; `@daily` and the like. An expression croner refuses is
    /// [`ErrorKind::InvalidConfig`], naming why.
    pub fn cron(expression: &str) -> Result<Timing> {
        let cron = croner::Cron::from_str(expression).map_err(|e| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("cron expression {expression:?}: {e}"),
            )
        })?;
        // An expression that never matches (`0 0 30 2 *`) would leave the schedule idle for
        // good without a word: refuse it here.
        let probe = chrono::DateTime::<chrono::Utc>::from(UNIX_EPOCH);
        if cron.find_next_occurrence(&probe, false).is_err() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("cron expression {expression:?} never matches"),
            ));
        }
        Ok(Timing(Kind::Cron(Box::new(cron))))
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.0 {
            Kind::Every { period, offset } => {
                let at = since_epoch(t);
                let k = if at < *offset {
                    0
                } else {
                    (at - offset) / period + 1
                };
                Some(from_micros(offset + k * period))
            }
            Kind::Cron(cron) => {
                let at = chrono::DateTime::<chrono::Utc>::from(t);
                cron.find_next_occurrence(&at, false).ok().map(Into::into)
            }
        }
    }

    /// The last tick at or before `t`, if there is one.
    pub fn latest_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.0 {
            Kind::Every { period, offset } => {
                let at = since_epoch(t);
                (at >= *offset).then(|| from_micros(offset + (at - offset) / period * period))
            }
            Kind::Cron(cron) => {
                let at = chrono::DateTime::<chrono::Utc>::from(t);
                cron.find_previous_occurrence(&at, true)
                    .ok()
                    .map(Into::into)
            }
        }
    }

    /// The tick before `tick`, if there is one.
    fn previous(&self, tick: SystemTime) -> Option<SystemTime> {
        self.latest_at_or_before(tick.checked_sub(Duration::from_micros(1))?)
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Kind::Every { period, offset: 0 } => write!(f, "every {period} µs"),
            Kind::Every { period, offset } => write!(f, "every {period} µs + {offset} µs"),
            Kind::Cron(cron) => write!(f, "cron {:?}", cron.pattern.to_string()),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Microseconds since the epoch; times before it count as the epoch (no schedule starts then).
fn since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(micros).unwrap_or(0)
}

fn from_micros(us: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us)
}

/// What happens to ticks nobody ran at their time (every process was down, or a run took
/// longer than the period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatchUp {
    /// Missed ticks fold into one: the latest due tick runs, the ones before it are skipped.
    /// The default.
    Latest,
    /// A tick runs only while it is no more than `grace` late; later than that it is skipped
    /// and the schedule waits for the next one.
    Skip {
        /// How late a tick may still start.
        grace: Duration,
    },
    /// Every missed tick runs, oldest first — the newest `max` of them when more were missed.
    Each {
        /// The most missed ticks run (at least 1).
        max: u32,
    },
}

/// How a schedule treats failures and missed ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// What happens to missed ticks.
    pub catch_up: CatchUp,
    /// How many times a tick is started before it is abandoned (at least 1): a run that
    /// failed, or whose process stopped before it finished, is started again until then.
    pub max_attempts: u32,
    /// The wait before the first retry of a failed run; each further retry waits twice as long
    /// as the one before, up to 64 times this.
    pub retry_backoff: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            catch_up: CatchUp::Latest,
            max_attempts: 3,
            retry_backoff: Duration::from_secs(1),
        }
    }
}

/// What the runs table says about a schedule, read with the server's time in one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The server's time when it read.
    pub now: SystemTime,
    /// The latest tick with a row (started at least once).
    pub last: Option<SystemTime>,
    /// The oldest tick that is neither done nor abandoned: failed, or left running by a run
    /// whose process stopped (whoever reads holds the schedule's lease, so no run is under way).
    pub unfinished: Option<Unfinished>,
}

/// A tick that was started and did not finish well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The tick.
    pub tick: SystemTime,
    /// Its state: [`RunState::Failed`] or [`RunState::Running`] (its runner is gone).
    pub state: RunState,
    /// How many times it was started.
    pub attempts: u32,
    /// When its last attempt finished (failed), on the server's clock.
    pub finished_at: Option<SystemTime>,
}

/// What a schedule does next, by [`plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Start `tick` (again, when `retry`).
    Run {
        /// The tick to start.
        tick: SystemTime,
        /// Whether it was started before.
        retry: bool,
    },
    /// Mark `tick` abandoned: it was started `max_attempts` times.
    Abandon {
        /// The tick.
        tick: SystemTime,
    },
    /// Nothing is due before this time (server's clock).
    WaitUntil(SystemTime),
}

/// Which tick is due, on the server's time `seen.now`. `since` is when this runner first read
/// the table (server's clock): a schedule with no row yet starts with the first tick after it.
/// Retries of unfinished ticks come first when due; a retry that is not yet due does not hold
/// back a new tick.
pub fn plan(timing: &Timing, policy: &Policy, seen: &Observed, since: SystemTime) -> Next {
    let now = seen.now;
    let mut wake = None;
    if let Some(u) = &seen.unfinished {
        if u.attempts >= policy.max_attempts.max(1) {
            return Next::Abandon { tick: u.tick };
        }
        let retry_at = match (u.state, u.finished_at) {
            (RunState::Failed, Some(at)) => {
                let doublings = u.attempts.saturating_sub(1).min(6);
                at + policy.retry_backoff * (1u32 << doublings)
            }
            // Left running by a runner that is gone: at once.
            _ => now,
        };
        if retry_at <= now {
            return Next::Run {
                tick: u.tick,
                retry: true,
            };
        }
        wake = Some(retry_at);
    }
    let anchor = seen.last.unwrap_or(since);
    let due = timing.next_after(anchor).filter(|first| *first <= now);
    if let Some(first) = due {
        let latest = timing.latest_at_or_before(now).unwrap_or(first);
        match policy.catch_up {
            CatchUp::Latest => {
                return Next::Run {
                    tick: latest,
                    retry: false,
                };
            }
            CatchUp::Skip { grace } => {
                if now.duration_since(latest).unwrap_or_default() <= grace {
                    return Next::Run {
                        tick: latest,
                        retry: false,
                    };
                }
            }
            CatchUp::Each { max } => {
                let mut tick = latest;
                for _ in 1..max.max(1) {
                    match timing.previous(tick) {
                        Some(before) if before >= first => tick = before,
                        _ => break,
                    }
                }
                return Next::Run { tick, retry: false };
            }
        }
    }
    let next = timing.next_after(anchor.max(now));
    let at = match (wake, next) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(now + Duration::from_secs(3600)),
    };
    Next::WaitUntil(at)
}

#[cfg(test)]
mod tests;
