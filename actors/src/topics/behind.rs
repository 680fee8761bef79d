//! How far behind a consumer is: its lag gauge, and the transaction holding every reader back.

use std::time::{Duration, Instant};

use pgcoord::topic::Cursor;
use tracing::{debug, warn};

use super::Run;

/// Behind full reads, the lag in events is counted at most this often (the first time this long
/// into a tenure, so a short catch-up pays nothing), up to this many.
const LAG_COUNT_EVERY: Duration = Duration::from_secs(10);
const LAG_COUNT_MAX: u32 = 1_000_000;

/// The consumer's lag in events, as the gauge shows it.
pub(super) struct Lag {
    /// When it was last counted (or the tenure began).
    counted: Instant,
    /// What the gauge shows.
    shown: u64,
}

impl Lag {
    pub(super) fn new() -> Lag {
        Lag {
            counted: Instant::now(),
            shown: 0,
        }
    }

    fn show(&mut self, run: &Run, lag: u64) {
        self.shown = lag;
        run.metrics.lag_events.set(lag as f64);
    }
}

/// The lag gauge after a read of `read` events from `cursor`: exact when the read was not full
/// (it read everything there is to read now); behind a full one, at least a window, and counted
/// every `LAG_COUNT_EVERY` (a million index entries take 0.1–0.3 s of the server).
pub(super) async fn note_lag(run: &Run, cursor: Cursor, read: usize, lag: &mut Lag) {
    if read < run.consume.window as usize {
        return lag.show(run, read as u64);
    }
    if lag.counted.elapsed() < LAG_COUNT_EVERY {
        return lag.show(run, lag.shown.max(read as u64));
    }
    lag.counted = Instant::now();
    let statements = run.pool.idempotent(None);
    let topic = &run.consume.topic;
    match run
        .table
        .lag(&statements, topic, cursor, LAG_COUNT_MAX)
        .await
    {
        Ok(counted) => lag.show(run, counted),
        // The gauge keeps its last value; the next count is due in `LAG_COUNT_EVERY`.
        Err(e) => debug!(error = %e, "cannot count the consumer's lag"),
    }
}

/// How often, at most, a caught-up consumer looks for the transaction holding readers back.
pub(super) const HELD_BACK_LOOK: Duration = Duration::from_secs(10);

/// At most one held-back warning this often.
const HELD_BACK_WARN_EVERY: Duration = Duration::from_secs(60);

/// Looks for the oldest transaction on the server: its age is the held-back gauge, and one open
/// for longer than the consumer's `held_back_warning` is warned about (at most once a minute):
/// readers read nothing appended since it began until it ends (docs/DESIGN.md, "Durable topics").
pub(super) async fn look_for_held_back(run: &Run, warned: &mut Option<Instant>) {
    let Ok(held) = run.table.held_back(&run.pool.idempotent(None)).await else {
        return;
    };
    let age = held.as_ref().map_or(Duration::ZERO, |h| h.age);
    run.metrics.held_back.set(age.as_secs_f64());
    if let Some(held) = held
        && held.age >= run.consume.held_back_warning
        && warned.is_none_or(|at| at.elapsed() >= HELD_BACK_WARN_EVERY)
    {
        *warned = Some(Instant::now());
        // A prepared transaction has no backend (pid 0): its gid is what ends it.
        warn!(
            pid = held.pid,
            prepared = held.prepared.as_deref(),
            database = held.database.as_deref().unwrap_or("?"),
            age = ?held.age,
            "a transaction open this long holds every topic reader back until it ends"
        );
    }
}
