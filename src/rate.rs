//! Rate limits across the fleet: at most `limit` per `period` for each key, with a burst, decided
//! by one statement on the server's clock.
//!
//! The algorithm is GCRA, the token bucket kept as one number per key: the *theoretical arrival
//! time* (`tat`), when the bucket would be full again. A take of `n` from a key whose `tat` is
//! `t` at server time `now` may use `burst - ceil((max(t, now) - now) / interval)` tokens, and
//! moves `tat` to `max(t, now) + granted × interval`. The row is locked by the upsert and the
//! arithmetic reads the locked row, so concurrent takes serialise on the key and never admit more
//! than the limit, whatever the processes' clocks say. A key that was never taken from is full.
//!
//! Times are whole microseconds: the interval is `period / limit` rounded down, so a limit whose
//! interval is not a whole number of microseconds admits at most 1 µs per take early (3 per second
//! is 333,333 µs, 0.0001% above the limit).

use std::time::Duration;

use tokio_postgres::types::Type;
use tracing::instrument;

use crate::config::{Config, validate_name};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// A rate: `limit` takes per `period` on average, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    interval_micros: i64,
    burst: u32,
}

impl RateLimit {
    /// `limit` per `period`, with a burst of `limit` (a full bucket is one period's worth).
    /// [`ErrorKind::InvalidConfig`] when `limit` is zero, or `period / limit` is shorter than 1 µs
    /// or longer than a year.
    pub fn new(limit: u32, period: Duration) -> Result<RateLimit> {
        let invalid = |why: String| Error::new(ErrorKind::InvalidConfig, why);
        if limit == 0 {
            return Err(invalid("a rate limit of 0 admits nothing".into()));
        }
        let interval = period / limit;
        if interval < Duration::from_micros(1) || interval > Duration::from_secs(366 * 86_400) {
            return Err(invalid(format!(
                "{limit} per {period:?} is one per {interval:?}: outside 1 µs to a year"
            )));
        }
        RateLimit {
            interval_micros: interval.as_micros() as i64,
            burst: limit,
        }
        .checked()
    }

    /// Refuses a bucket that takes longer than a century to fill: its arithmetic (µs in an
    /// `int8`) would overflow on the server.
    fn checked(self) -> Result<RateLimit> {
        const CENTURY_MICROS: i64 = 100 * 366 * 86_400 * 1_000_000;
        if self.interval_micros.saturating_mul(i64::from(self.burst)) > CENTURY_MICROS {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a burst of {} at one per {:?} takes more than a century to fill",
                    self.burst,
                    self.interval()
                ),
            ));
        }
        Ok(self)
    }

    /// `limit` per second.
    pub fn per_second(limit: u32) -> Result<RateLimit> {
        RateLimit::new(limit, Duration::from_secs(1))
    }

    /// The same rate with at most `burst` at once (from a full bucket). Zero is
    /// [`ErrorKind::InvalidConfig`].
    pub fn burst(self, burst: u32) -> Result<RateLimit> {
        if burst == 0 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "a burst of 0 admits nothing",
            ));
        }
        RateLimit { burst, ..self }.checked()
    }

    /// The time between two takes at the limit (the period divided by the limit).
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_micros as u64)
    }

    /// The most one take can have at once.
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The take [`RateTable`]'s statement makes, on a bucket kept elsewhere (the runtime's
    /// in-memory backend keeps its own): `tat` is the bucket's theoretical arrival time in µs,
    /// `None` for a new (full) bucket, `now` the clock in the same µs. A take of `n` all or none
    /// (`all`), else up to `n`. Answers the bucket's new `tat` and what was taken.
    pub fn take_at(&self, tat: Option<i64>, now: i64, n: u32, all: bool) -> (i64, Taken) {
        let (asked, interval, burst) = (i64::from(n), self.interval_micros, i64::from(self.burst));
        let base = tat.map_or(now, |tat| tat.max(now));
        let avail = ((burst * interval - (base - now)) / interval).max(0);
        let granted = match all {
            true if asked <= avail => asked,
            true => 0,
            false => asked.min(avail),
        };
        let tat = base + granted * interval;
        (tat, taken(asked, granted, tat, now, interval, burst, all))
    }
}

/// What a take answers: `granted` of `asked`, and when the rest would fit (the whole ask with
/// `all`, else one) given the bucket's `tat` after it, at `now`.
fn taken(
    asked: i64,
    granted: i64,
    tat: i64,
    now: i64,
    interval: i64,
    burst: i64,
    all: bool,
) -> Taken {
    let retry_after = if asked == granted {
        0
    } else {
        let need = if all { asked } else { 1 }.saturating_mul(interval);
        (tat.saturating_add(need) - burst * interval - now).max(0)
    };
    Taken {
        granted: granted as u32,
        retry_after: Duration::from_micros(retry_after as u64),
    }
}

/// What a take got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Taken {
    /// How many were granted: all asked or none for [`RateTable::try_take`], up to the asked
    /// for [`RateTable::take_up_to`].
    pub granted: u32,
    /// When not all were granted: how long until the rest would be (at the server's clock, if
    /// nobody else takes meanwhile). Zero when all were granted.
    pub retry_after: Duration,
}

/// The statement of one configuration's rate-limit table.
#[derive(Debug, Clone)]
pub struct RateTable {
    take: String,
    buckets: String,
}

/// The most buckets [`RateTable::buckets`] lists.
pub const MAX_BUCKETS_LISTED: usize = 100;

/// A key's bucket as [`RateTable::buckets`] lists it. The rate is the caller's (it is not
/// stored): how drained a bucket is shows as the time until it is full again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Bucket {
    /// The rate-limited key.
    pub key: String,
    /// How long until its bucket is full again, on the server's clock (zero: full).
    pub full_in: Duration,
    /// What its last take got.
    pub granted: u64,
}

impl RateTable {
    /// Renders the statement for `config`'s rate-limit table ([`Config::rate_table`]).
    pub fn new(config: &Config) -> RateTable {
        let t = config.rate_table().quoted();
        // $1 key, $2 asked, $3 interval (µs), $4 burst, $5 all or nothing. `avail` is what the
        // locked row's bucket holds now; a new key's bucket is full.
        let granted = |avail: &str| {
            format!(
                "CASE WHEN $5 THEN CASE WHEN $2 <= {avail} THEN $2 ELSE 0 END ELSE least($2, {avail}) END"
            )
        };
        let avail = "greatest(0, ($4 * $3 - (greatest(r.tat, c.now) - c.now)) / $3)";
        RateTable {
            take: format!(
                "WITH c AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS now)
                 INSERT INTO {t} AS r (key, tat, granted)
                 SELECT $1, c.now + g.n * $3, g.n FROM c, LATERAL (SELECT {new} AS n) AS g
                 ON CONFLICT (key) DO UPDATE
                 SET (tat, granted) = (
                     SELECT greatest(r.tat, c.now) + g.n * $3, g.n
                     FROM c, LATERAL (SELECT {old} AS n) AS g
                 )
                 RETURNING r.granted, r.tat, (SELECT now FROM c)",
                new = granted("$4"),
                old = granted(avail),
            ),
            // The most drained first: those furthest from full.
            buckets: format!(
                "SELECT key::text,
                        greatest(0, tat - (extract(epoch FROM clock_timestamp()) * 1000000)::int8),
                        granted
                 FROM {t} ORDER BY tat DESC LIMIT {MAX_BUCKETS_LISTED}"
            ),
        }
    }

    /// The buckets furthest from full (at most [`MAX_BUCKETS_LISTED`]): what an operator looks
    /// at.
    pub async fn buckets(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<Bucket>> {
        let rows = client.run(&self.buckets, &[]).await?;
        (rows.iter())
            .map(|row| {
                let micros: i64 = row.try_get(1)?;
                let granted: i64 = row.try_get(2)?;
                Ok(Bucket {
                    key: row.try_get(0)?,
                    full_in: Duration::from_micros(micros.max(0) as u64),
                    granted: granted.max(0) as u64,
                })
            })
            .collect()
    }

    /// Takes `n` from `key` if all `n` fit, or nothing. [`ErrorKind::InvalidConfig`] when `n`
    /// is more than the burst (it could never fit) or zero.
    #[instrument(skip_all, fields(rate.key = key, n), level = "debug")]
    pub async fn try_take(
        &self,
        client: &(impl Statements + ?Sized),
        key: &str,
        n: u32,
        rate: &RateLimit,
    ) -> Result<Taken> {
        if n > rate.burst {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("{n} at once is more than the burst of {}", rate.burst),
            ));
        }
        self.take(client, key, n, rate, true).await
    }

    /// Takes as many of `n` from `key` as fit now, perhaps none: how a batch of waiters on a hot
    /// key shares one statement. [`ErrorKind::InvalidConfig`] when `n` is zero.
    #[instrument(skip_all, fields(rate.key = key, n), level = "debug")]
    pub async fn take_up_to(
        &self,
        client: &(impl Statements + ?Sized),
        key: &str,
        n: u32,
        rate: &RateLimit,
    ) -> Result<Taken> {
        self.take(client, key, n, rate, false).await
    }

    async fn take(
        &self,
        client: &(impl Statements + ?Sized),
        key: &str,
        n: u32,
        rate: &RateLimit,
        all: bool,
    ) -> Result<Taken> {
        let key = validate_name("rate-limit key", key.to_owned())?;
        if n == 0 {
            return Err(Error::new(ErrorKind::InvalidConfig, "a take of 0"));
        }
        let (asked, interval, burst) = (i64::from(n), rate.interval_micros, i64::from(rate.burst));
        let params: &[Param<'_>] = &[
            (&key, Type::TEXT),
            (&asked, Type::INT8),
            (&interval, Type::INT8),
            (&burst, Type::INT8),
            (&all, Type::BOOL),
        ];
        let rows = client.run(&self.take, params).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Other, "the take returned no row"))?;
        let (granted, tat, now): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        // The rest fits once the bucket has room for it: `tat` minus a full bucket plus the rest.
        Ok(taken(asked, granted, tat, now, interval, burst, all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_at_computes_what_the_statement_does() {
        // 4 per second: one per 250 ms, a burst of 4.
        let rate = RateLimit::per_second(4).unwrap();
        let (tat, taken) = rate.take_at(None, 0, 3, true);
        assert_eq!((tat, taken.granted), (750_000, 3));
        // One left: all-or-none of 2 refused, with when both would fit; up to 2 gets one.
        let (same, refused) = rate.take_at(Some(tat), 0, 2, true);
        assert_eq!((same, refused.granted), (750_000, 0));
        assert_eq!(refused.retry_after, Duration::from_millis(250));
        let (tat, one) = rate.take_at(Some(tat), 0, 2, false);
        assert_eq!((tat, one.granted), (1_000_000, 1));
        assert_eq!(one.retry_after, Duration::from_millis(250));
        // Half a second later, two have refilled; a bucket left alone is full again, no fuller.
        assert_eq!(rate.take_at(Some(tat), 500_000, 3, true).1.granted, 0);
        assert_eq!(rate.take_at(Some(tat), 500_000, 2, true).1.granted, 2);
        assert_eq!(rate.take_at(Some(tat), 60_000_000, 5, false).1.granted, 4);
    }
}
