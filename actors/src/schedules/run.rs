//! The schedule's loop: sleep to the next tick, try the lease, run what is due, release.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgcoord::__private::{Failures, warn_due};
use pgcoord::db::Backoff;
use pgcoord::schedule::{Next, RunState, plan};
use pgcoord::{ErrorKind, Result};
use tracing::{Instrument, debug, info_span, warn};

use super::{Schedule, Shared, Tick, TickResult};
use crate::Call;
use crate::leases::{Acquire, Lease, Release};

/// How long a try of the lease may take before it counts as a failure.
const ACQUIRE_WITHIN: Duration = Duration::from_secs(5);

/// Runs the schedule until its actor stops.
pub(super) async fn run(shared: Arc<Shared>) {
    let span = info_span!("schedule", schedule.name = %shared.schedule.name);
    async move {
        // The server's time when this runner first read the table: a schedule with no row
        // starts with the first tick after it.
        let mut since = None;
        let mut wake = Instant::now();
        let mut next_tick = None;
        let mut failures = Failures::default();
        loop {
            let jitter = shared.schedule.jitter.mul_f64(rand::random::<f64>());
            let sleep = wake.saturating_duration_since(Instant::now()) + jitter;
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = shared.stopping.notified() => return,
            }
            match tenure(&shared, &mut since, &mut next_tick).await {
                Ok(Some(at)) => {
                    failures.succeeded();
                    wake = at;
                }
                Ok(None) => return,
                Err(e) => {
                    if failures.failed() {
                        let failures = failures.in_a_row();
                        warn!(error = %e, failures, "the schedule cannot run; trying again");
                    }
                    // From 100 ms to 5 s: the table is back within seconds of the server.
                    let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
                    wake = Instant::now() + failures.delay(backoff, 0);
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Takes the lease if it is free and runs what is due; answers when to look again (`None`:
/// the actor is stopping).
async fn tenure(
    shared: &Shared,
    since: &mut Option<SystemTime>,
    next_tick: &mut Option<Instant>,
) -> Result<Option<Instant>> {
    let acquire = Acquire::new(shared.schedule.lease_name())
        .fail_if_locked()
        .timeout(ACQUIRE_WITHIN);
    let lease = match shared.locks.call(acquire).await {
        Ok(lease) => Arc::new(lease),
        Err(e) if matches!(e.kind(), ErrorKind::NotAcquired | ErrorKind::AlreadyHeld) => {
            stats(shared, |s| s.busy += 1);
            // Its holder runs it; should it die, its lease runs out: look again then, or at the
            // next tick if that comes first.
            let remaining = e.holder().map_or(Duration::from_secs(1), |h| h.remaining);
            let again = Instant::now() + remaining + Duration::from_millis(10);
            debug!(?remaining, "the schedule's lease is held elsewhere");
            return Ok(Some(next_tick.map_or(again, |t| t.min(again))));
        }
        Err(e) => return Err(e),
    };
    let result = run_due(shared, &lease, since, next_tick).await;
    let released = match Arc::try_unwrap(lease) {
        Ok(lease) => lease.release().await,
        // A Tick outlived its run (a task the handler spawned keeps it): it does not hold the
        // schedule. Released by token, so its fence fails from here on.
        Err(kept) => {
            let release = Release {
                name: kept.name().to_owned(),
                token: kept.token(),
            };
            shared.locks.call(release).await
        }
    };
    match released {
        // Lost, or released already as the kept Tick was dropped: not held either way.
        Err(e) if e.kind() != ErrorKind::LockLost => {
            debug!(error = %e, "the schedule's lease was not released; it runs out");
        }
        _ => {}
    }
    result
}

/// Runs every tick due while the lease is held.
async fn run_due(
    shared: &Shared,
    lease: &Arc<Lease>,
    since: &mut Option<SystemTime>,
    next_tick: &mut Option<Instant>,
) -> Result<Option<Instant>> {
    let schedule = &shared.schedule;
    loop {
        if shared.stop_asked() {
            return Ok(None);
        }
        let seen = shared
            .table
            .observe(&shared.pool.idempotent(None), &schedule.name)
            .await?;
        let read_at = Instant::now();
        let since = *since.get_or_insert(seen.now);
        match plan(&schedule.timing, &schedule.policy, &seen, since) {
            Next::WaitUntil(at) => {
                let wait = at.duration_since(seen.now).unwrap_or_default();
                *next_tick = Some(read_at + wait);
                shared
                    .table
                    .trim(
                        &shared.pool.idempotent(None),
                        &schedule.name,
                        schedule.history,
                    )
                    .await?;
                return Ok(Some(read_at + wait));
            }
            Next::Abandon { tick } => {
                shared
                    .table
                    .abandon(
                        &shared.pool.statements(None),
                        &schedule.name,
                        tick,
                        lease.token(),
                    )
                    .await?;
                let abandoned = stats(shared, |s| {
                    s.abandoned += 1;
                    s.abandoned
                });
                shared.metrics.abandoned.increment(1);
                if warn_due(abandoned) {
                    warn!(tick = ?tick, attempts = schedule.policy.max_attempts, abandoned, "a tick is abandoned");
                }
            }
            Next::Run { tick, retry } => {
                if !run_tick(shared, lease, tick, retry).await? {
                    // Claimed with a newer token: this process lost the lease.
                    return Ok(Some(Instant::now()));
                }
            }
        }
        if lease.loss().is_some() {
            return Ok(Some(Instant::now()));
        }
    }
}

/// Claims `tick` and runs it; false when the claim found the tick taken by a newer token.
async fn run_tick(
    shared: &Shared,
    lease: &Arc<Lease>,
    tick: SystemTime,
    retry: bool,
) -> Result<bool> {
    let schedule = &shared.schedule;
    let token = lease.token();
    let claimed = shared
        .table
        .claim(
            &shared.pool.statements(None),
            &schedule.name,
            tick,
            token,
            &shared.owner,
        )
        .await?;
    let Some(attempt) = claimed else {
        return Ok(false);
    };
    stats(shared, |s| s.started += 1);
    if retry {
        debug!(tick = ?tick, attempt, "a tick is started again");
    }
    let next = schedule.timing.next_after(tick);
    let handed = Tick {
        schedule: Arc::from(schedule.name.as_str()),
        at: tick,
        attempt,
        lease: lease.clone(),
        table: shared.table.clone(),
        next,
    };
    let outcome = run_handler(schedule, handed).await;
    let (state, error) = match &outcome {
        Ok(()) => (RunState::Done, None),
        Err(why) => (RunState::Failed, Some(why.as_str())),
    };
    let finished = shared
        .table
        .finish(
            &shared.pool.idempotent(None),
            &schedule.name,
            tick,
            token,
            attempt,
            state,
            error,
            next,
        )
        .await;
    let ended = ended(finished)?;
    count(shared, ended, tick, attempt, error);
    Ok(ended != Ended::TakenOver)
}

/// Runs the handler on `tick` within the schedule's bound: a panic, or the bound passing, is a
/// failed run.
async fn run_handler(schedule: &Schedule, tick: Tick) -> TickResult {
    use futures_util::FutureExt;
    let run = std::panic::AssertUnwindSafe((schedule.handler)(tick)).catch_unwind();
    let ran = match schedule.run_within {
        Some(bound) => tokio::time::timeout(bound, run)
            .await
            .unwrap_or_else(|_| Ok(Err(format!("the run passed its bound of {bound:?}")))),
        None => run.await,
    };
    ran.unwrap_or_else(|_| Err("the handler panicked".to_owned()))
}

/// How a claimed run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Done,
    Failed,
    /// Another process took the tick over meanwhile: this run does not count.
    TakenOver,
}

/// How a run ended, from what finishing its row answered. The row decides, not the handler: a
/// handler whose future passed its bound may still have committed `Tick::complete`, and then
/// the tick is done.
fn ended(finished: Result<RunState>) -> Result<Ended> {
    match finished {
        Ok(RunState::Done) => Ok(Ended::Done),
        Ok(_) => Ok(Ended::Failed),
        Err(e) if e.kind() == ErrorKind::LockLost => Ok(Ended::TakenOver),
        // The row stays 'running': the next holder starts the tick again.
        Err(e) => Err(e),
    }
}

/// Counts a run that ended, and warns of a failed or taken-over one at a bounded rate.
fn count(shared: &Shared, ended: Ended, tick: SystemTime, attempt: u32, error: Option<&str>) {
    match ended {
        Ended::Done => {
            stats(shared, |s| s.done += 1);
            shared.metrics.done.increment(1);
        }
        Ended::Failed => {
            let failed = stats(shared, |s| {
                s.failed += 1;
                s.failed
            });
            shared.metrics.failed.increment(1);
            // Bounded: a schedule failing every tick says so at 1, 2, 4, 8… failures.
            if warn_due(failed) {
                warn!(tick = ?tick, attempt, failed, error = error.unwrap_or_default(), "a tick's run failed");
            }
        }
        Ended::TakenOver => {
            let taken_over = stats(shared, |s| {
                s.taken_over += 1;
                s.taken_over
            });
            shared.metrics.taken_over.increment(1);
            if warn_due(taken_over) {
                warn!(tick = ?tick, taken_over, "a tick's run finished after another process took it over; it does not count");
            }
        }
    }
}

fn stats<R>(shared: &Shared, f: impl FnOnce(&mut super::ScheduleStats) -> R) -> R {
    f(&mut shared.stats.lock().expect("stats lock"))
}

#[cfg(test)]
mod tests {
    use pgcoord::Error;

    use super::*;

    #[test]
    fn the_row_says_how_a_run_ended() {
        assert_eq!(ended(Ok(RunState::Done)).unwrap(), Ended::Done);
        assert_eq!(ended(Ok(RunState::Failed)).unwrap(), Ended::Failed);
        assert_eq!(ended(Ok(RunState::Abandoned)).unwrap(), Ended::Failed);
        let lost = Error::new(ErrorKind::LockLost, "taken over");
        assert_eq!(ended(Err(lost)).unwrap(), Ended::TakenOver);
        // Any other error leaves the row running, for the next holder to start again.
        let down = Error::new(ErrorKind::Unavailable, "server down");
        assert_eq!(ended(Err(down)).unwrap_err().kind(), ErrorKind::Unavailable);
    }
}
