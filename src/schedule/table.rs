//! The runs table: a row per tick that was started, keyed by (schedule, tick).
//!
//! Whoever writes a row holds the schedule's lease and writes its token: a claim takes over a
//! row only when it is unfinished and the claimant's token is not older than the row's, and a
//! finish names the token that claimed. A run that lost its lease cannot mark the tick done
//! after another took it over, and a tick marked done in the run's own transaction stays done.

use std::time::SystemTime;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Observed, Unfinished};
use crate::config::{Config, validate_name};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// Where a tick's run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunState {
    /// Started; under way, or its process stopped before it finished.
    Running,
    /// Finished well: it is never started again.
    Done,
    /// Finished with an error; started again after a backoff while attempts are left.
    Failed,
    /// Started as many times as the policy allows, without success.
    Abandoned,
}

impl RunState {
    /// The word stored in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Done => "done",
            RunState::Failed => "failed",
            RunState::Abandoned => "abandoned",
        }
    }

    fn parse(word: &str) -> Result<RunState> {
        Ok(match word {
            "running" => RunState::Running,
            "done" => RunState::Done,
            "failed" => RunState::Failed,
            "abandoned" => RunState::Abandoned,
            other => {
                return Err(Error::new(
                    ErrorKind::Other,
                    format!("unknown run state {other:?} in the runs table"),
                ));
            }
        })
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tick's row.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunInfo {
    /// The schedule's name.
    pub schedule: String,
    /// The tick, on the server's clock.
    pub tick: SystemTime,
    /// Where its run stands.
    pub state: RunState,
    /// How many times it was started.
    pub attempts: u32,
    /// The owner of the process that started it last.
    pub owner: String,
    /// The schedule lease's token under which it was started last.
    pub token: i64,
    /// When it was started last (server's clock).
    pub started_at: SystemTime,
    /// When it finished, unless it is running.
    pub finished_at: Option<SystemTime>,
    /// Why its last attempt failed.
    pub error: Option<String>,
    /// The schedule's next tick after it, as its runner saw when it finished.
    pub next_tick: Option<SystemTime>,
}

/// The statements of one configuration's runs table.
#[derive(Debug, Clone)]
pub struct ScheduleTable {
    observe: String,
    claim: String,
    finish: String,
    complete: String,
    fence: String,
    run_of: String,
    abandon: String,
    trim: String,
    latest: String,
    runs: String,
}

const COLUMNS: &str =
    "schedule, tick, state, attempts, owner, token, started_at, finished_at, error, next_tick";

impl ScheduleTable {
    /// Renders the statements for `config`'s runs table.
    pub fn new(config: &Config) -> ScheduleTable {
        let r = config.schedule_table().quoted();
        ScheduleTable {
            observe: format!(
                "SELECT now(), (SELECT max(tick) FROM {r} WHERE schedule = $1),
                        u.tick, u.state, u.attempts, u.finished_at
                 FROM (SELECT 1) AS one LEFT JOIN LATERAL (
                     SELECT tick, state, attempts, finished_at FROM {r}
                     WHERE schedule = $1 AND state IN ('running', 'failed')
                     ORDER BY tick LIMIT 1
                 ) AS u ON true"
            ),
            // A tick not yet due on the server's clock is never claimed, whatever the
            // claimant's clock says.
            claim: format!(
                "INSERT INTO {r} AS r (schedule, tick, state, attempts, token, owner, started_at)
                 SELECT $1, $2, 'running', 1, $3, $4, now() WHERE $2 <= now()
                 ON CONFLICT (schedule, tick) DO UPDATE
                 SET state = 'running', attempts = r.attempts + 1, token = EXCLUDED.token,
                     owner = EXCLUDED.owner, started_at = EXCLUDED.started_at,
                     finished_at = NULL, error = NULL
                 WHERE r.state IN ('running', 'failed') AND r.token <= EXCLUDED.token
                 RETURNING attempts"
            ),
            // A row already finished (done in the run's own transaction) keeps its outcome.
            finish: format!(
                "UPDATE {r} AS r
                 SET state = CASE WHEN r.state = 'running' THEN $4 ELSE r.state END,
                     finished_at = CASE WHEN r.state = 'running' THEN now() ELSE r.finished_at END,
                     error = CASE WHEN r.state = 'running' THEN $5 ELSE r.error END,
                     next_tick = coalesce($6, r.next_tick)
                 WHERE schedule = $1 AND tick = $2 AND token = $3 AND attempts = $7
                 RETURNING state"
            ),
            // The migrations' function, which other drivers call too: the fence below and the
            // finish above, as done, in one.
            complete: format!(
                "SELECT {}($1, $2, $3, $4, $5)::text",
                config.sql_function("pgcoord_schedules_complete").quoted()
            ),
            // The row is locked only when it is this run's, and as an UPDATE would lock it: it
            // cannot be finished, taken over or started again until the fencing transaction
            // ends, and a second fencing transaction of the same run waits, then sees it done.
            fence: format!(
                "SELECT 1 FROM {r}
                 WHERE schedule = $1 AND tick = $2 AND token = $3 AND attempts = $4
                   AND state = 'running'
                 FOR NO KEY UPDATE"
            ),
            run_of: format!(
                "SELECT state, attempts, token FROM {r} WHERE schedule = $1 AND tick = $2"
            ),
            abandon: format!(
                "UPDATE {r} AS r SET state = 'abandoned', token = $3, finished_at = now(),
                     error = coalesce(r.error, 'its process stopped before it finished')
                 WHERE schedule = $1 AND tick = $2 AND state IN ('running', 'failed')
                   AND r.token <= $3"
            ),
            trim: format!(
                "DELETE FROM {r} WHERE schedule = $1 AND tick < (
                     SELECT tick FROM {r} WHERE schedule = $1
                     ORDER BY tick DESC OFFSET $2 LIMIT 1)"
            ),
            latest: format!(
                "SELECT DISTINCT ON (schedule) {COLUMNS} FROM {r} ORDER BY schedule, tick DESC"
            ),
            runs: format!(
                "SELECT {COLUMNS} FROM {r} WHERE schedule = $1 ORDER BY tick DESC LIMIT $2"
            ),
        }
    }

    /// The server's time, the latest tick started and the oldest unfinished one, in one
    /// statement.
    #[instrument(skip_all, fields(schedule))]
    pub async fn observe(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
    ) -> Result<Observed> {
        check(schedule)?;
        let rows = client
            .run(&self.observe, &[(&schedule, Type::TEXT)])
            .await?;
        let row = rows.first().ok_or_else(|| {
            Error::new(
                ErrorKind::Other,
                "the schedule's observation returned no row",
            )
        })?;
        let unfinished = match row.try_get::<_, Option<SystemTime>>(2)? {
            None => None,
            Some(tick) => Some(Unfinished {
                tick,
                state: RunState::parse(row.try_get(3)?)?,
                attempts: attempts(row.try_get(4)?),
                finished_at: row.try_get(5)?,
            }),
        };
        Ok(Observed {
            now: row.try_get(0)?,
            last: row.try_get(1)?,
            unfinished,
        })
    }

    /// Starts `tick` under the schedule lease's `token`: the attempt's number, or `None` when
    /// the tick is not due on the server's clock, is finished, or was claimed with a newer
    /// token.
    #[instrument(skip_all, fields(schedule, token))]
    pub async fn claim(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        tick: SystemTime,
        token: i64,
        owner: &str,
    ) -> Result<Option<u32>> {
        check(schedule)?;
        let params: &[Param<'_>] = &[
            (&schedule, Type::TEXT),
            (&tick, Type::TIMESTAMPTZ),
            (&token, Type::INT8),
            (&owner, Type::TEXT),
        ];
        let rows = client.run(&self.claim, params).await?;
        rows.first()
            .map(|row| Ok(attempts(row.try_get(0)?)))
            .transpose()
    }

    /// Records how `attempt` under `token` ended (`Done`, `Failed` with why), and the next
    /// tick; answers the row's state. A row already finished keeps its state.
    /// [`ErrorKind::LockLost`] when the tick was claimed again, under another token or as a
    /// later attempt: this attempt no longer counts.
    #[allow(clippy::too_many_arguments)]
    #[instrument(skip_all, fields(schedule, token, state = %state))]
    pub async fn finish(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        tick: SystemTime,
        token: i64,
        attempt: u32,
        state: RunState,
        error: Option<&str>,
        next_tick: Option<SystemTime>,
    ) -> Result<RunState> {
        check(schedule)?;
        let word = state.as_str();
        let attempt = attempt_param(attempt);
        let params: &[Param<'_>] = &[
            (&schedule, Type::TEXT),
            (&tick, Type::TIMESTAMPTZ),
            (&token, Type::INT8),
            (&word, Type::TEXT),
            (&error, Type::TEXT),
            (&next_tick, Type::TIMESTAMPTZ),
            (&attempt, Type::INT4),
        ];
        let rows = client.run(&self.finish, params).await?;
        match rows.first() {
            Some(row) => RunState::parse(row.try_get(0)?),
            None => Err(Error::new(
                ErrorKind::LockLost,
                format!(
                    "schedule {schedule:?}: its tick was taken over or started again; attempt {attempt} under token {token} no longer counts"
                ),
            )),
        }
    }

    /// Fences `attempt` under `token` as [`fence`](Self::fence) does and marks the tick done,
    /// with `next_tick` when given, inside `client`'s transaction: the tick is done if and only
    /// if that transaction commits. [`ErrorKind::LockLost`] when this run no longer counts;
    /// [`ErrorKind::AlreadyAcknowledged`] when the tick is done already; either aborts the
    /// transaction (SQLSTATE `PC001`, `PC003`).
    #[instrument(skip_all, fields(schedule, token, attempt))]
    pub async fn complete(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        tick: SystemTime,
        token: i64,
        attempt: u32,
        next_tick: Option<SystemTime>,
    ) -> Result<()> {
        check(schedule)?;
        let attempt = attempt_param(attempt);
        let params: &[Param<'_>] = &[
            (&schedule, Type::TEXT),
            (&tick, Type::TIMESTAMPTZ),
            (&token, Type::INT8),
            (&attempt, Type::INT4),
            (&next_tick, Type::TIMESTAMPTZ),
        ];
        client.run(&self.complete, params).await?;
        Ok(())
    }

    /// The fencing guard of one run: inside `client`'s transaction, it fails unless `attempt`
    /// under `token` is the tick's current run and still running, and keeps the row so until
    /// the transaction ends (a second transaction of the same run waits for the first). [`ErrorKind::LockLost`] when the tick was taken over, started again
    /// or this run already ended; [`ErrorKind::AlreadyAcknowledged`] when the tick is done
    /// (an earlier commit of this run counted: do not apply its effects again).
    #[instrument(skip_all, fields(schedule, token, attempt))]
    pub async fn fence(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        tick: SystemTime,
        token: i64,
        attempt: u32,
    ) -> Result<()> {
        check(schedule)?;
        let attempt_param = attempt_param(attempt);
        let params: &[Param<'_>] = &[
            (&schedule, Type::TEXT),
            (&tick, Type::TIMESTAMPTZ),
            (&token, Type::INT8),
            (&attempt_param, Type::INT4),
        ];
        if !client.run(&self.fence, params).await?.is_empty() {
            return Ok(());
        }
        // Not this run's to fence: read the row, unlocked, to say why.
        let params: &[Param<'_>] = &[(&schedule, Type::TEXT), (&tick, Type::TIMESTAMPTZ)];
        let rows = client.run(&self.run_of, params).await?;
        let lost = |why: String| {
            Err(Error::new(
                ErrorKind::LockLost,
                format!(
                    "schedule {schedule:?}: attempt {attempt} of its tick {why}; it no longer counts"
                ),
            ))
        };
        let Some(row) = rows.first() else {
            return lost("has no row (trimmed, or never claimed)".into());
        };
        let (state, attempts, held_by) = (
            RunState::parse(row.try_get(0)?)?,
            attempts(row.try_get(1)?),
            row.try_get::<_, i64>(2)?,
        );
        if held_by != token {
            return lost(format!("was taken over (token {held_by}, not {token})"));
        }
        if attempts != attempt {
            return lost(format!("was started again (attempt {attempts})"));
        }
        match state {
            RunState::Done => Err(Error::new(
                ErrorKind::AlreadyAcknowledged,
                format!(
                    "schedule {schedule:?}: its tick is already done by attempt {attempt} (a transaction that completed it committed, or its handler returned Ok): do not apply its effects again"
                ),
            )),
            state => lost(format!("already ended {}", state.as_str())),
        }
    }

    /// Marks an unfinished `tick` abandoned, under the schedule lease's `token`.
    #[instrument(skip_all, fields(schedule, token))]
    pub async fn abandon(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        tick: SystemTime,
        token: i64,
    ) -> Result<()> {
        check(schedule)?;
        let params: &[Param<'_>] = &[
            (&schedule, Type::TEXT),
            (&tick, Type::TIMESTAMPTZ),
            (&token, Type::INT8),
        ];
        client.run(&self.abandon, params).await?;
        Ok(())
    }

    /// Deletes the schedule's rows beyond its newest `keep` (at least one is kept).
    #[instrument(skip_all, fields(schedule))]
    pub async fn trim(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        keep: u32,
    ) -> Result<()> {
        check(schedule)?;
        let offset = i64::from(keep.max(1)) - 1;
        let params: &[Param<'_>] = &[(&schedule, Type::TEXT), (&offset, Type::INT8)];
        client.run(&self.trim, params).await?;
        Ok(())
    }

    /// Every schedule's latest tick, by name.
    pub async fn latest(&self, client: &(impl Statements + ?Sized)) -> Result<Vec<RunInfo>> {
        let rows = client.run(&self.latest, &[]).await?;
        rows.iter().map(run_info).collect()
    }

    /// The schedule's newest `limit` ticks, newest first.
    pub async fn runs(
        &self,
        client: &(impl Statements + ?Sized),
        schedule: &str,
        limit: u32,
    ) -> Result<Vec<RunInfo>> {
        check(schedule)?;
        let limit = i64::from(limit);
        let params: &[Param<'_>] = &[(&schedule, Type::TEXT), (&limit, Type::INT8)];
        let rows = client.run(&self.runs, params).await?;
        rows.iter().map(run_info).collect()
    }
}

fn run_info(row: &tokio_postgres::Row) -> Result<RunInfo> {
    Ok(RunInfo {
        schedule: row.try_get(0)?,
        tick: row.try_get(1)?,
        state: RunState::parse(row.try_get(2)?)?,
        attempts: attempts(row.try_get(3)?),
        owner: row.try_get(4)?,
        token: row.try_get(5)?,
        started_at: row.try_get(6)?,
        finished_at: row.try_get(7)?,
        error: row.try_get(8)?,
        next_tick: row.try_get(9)?,
    })
}

/// An attempt as the `integer` column holds it.
pub(crate) fn attempt_param(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

fn attempts(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// A schedule's name: 1 to 255 bytes, no NUL.
pub(crate) fn check(schedule: &str) -> Result<()> {
    validate_name("schedule", schedule.to_owned()).map(drop)
}
