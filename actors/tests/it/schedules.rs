//! Schedules: each tick runs once across processes, its effects fenced with it; failures are
//! retried then abandoned; a run that lost its lease is taken over and does not count. Runs
//! past their bound, kept ticks and partitions: `schedule_faults`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgcoord::ErrorKind;
use pgcoord::schedule::{CatchUp, RunState, ScheduleTable, Timing};
use pgcoord_actors::*;
use tokio::sync::Mutex;

use super::Setup;

/// A client of the test's own, one per process, for the handlers' transactions.
pub(super) async fn client(setup: &Setup) -> Arc<Mutex<tokio_postgres::Client>> {
    let config = setup.builder("app").build().unwrap();
    Arc::new(Mutex::new(
        pgcoord::db::connect_spawned(&config).await.unwrap(),
    ))
}

/// A schedule every 200 ms whose run records (tick, process, attempt) in `applied` and marks
/// the tick done in the same transaction.
pub(super) fn recording(
    name: &str,
    applied: &str,
    process: &str,
    client: Arc<Mutex<tokio_postgres::Client>>,
) -> Schedule {
    let (applied, process) = (applied.to_owned(), process.to_owned());
    Schedule::new(
        name,
        Timing::every(Duration::from_millis(200)).unwrap(),
        move |tick| {
            let (client, applied, process) = (client.clone(), applied.clone(), process.clone());
            async move { record(&tick, &mut *client.lock().await, &applied, &process).await }
        },
    )
    .catch_up(CatchUp::Each { max: 1000 })
}

/// Records (tick, process, attempt) in `applied` and marks the tick done, in one transaction.
pub(super) async fn record(
    tick: &Tick,
    client: &mut tokio_postgres::Client,
    applied: &str,
    process: &str,
) -> Result<(), String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    apply(&tx, applied, tick, process).await?;
    tick.complete(&tx).await.map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// The run's effect: a row (tick, process, attempt) in `applied`, in `tx`.
pub(super) async fn apply(
    tx: &tokio_postgres::Transaction<'_>,
    applied: &str,
    tick: &Tick,
    process: &str,
) -> Result<(), String> {
    tx.execute(
        &format!("INSERT INTO {applied} VALUES ($1, $2, $3)"),
        &[&tick.at(), &process, &(tick.attempt() as i32)],
    )
    .await
    .map(drop)
    .map_err(|e| e.to_string())
}

pub(super) async fn applied_table(admin: &tokio_postgres::Client, setup: &Setup) -> String {
    let applied = format!("\"{}_applied\"", setup.table);
    admin
        .batch_execute(&format!(
            "CREATE TABLE {applied} (tick timestamptz, process text, attempt int)"
        ))
        .await
        .unwrap();
    applied
}

#[actix_rt::test]
async fn every_tick_runs_once_across_three_processes() {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let applied = applied_table(&admin, &setup).await;
    let mut runners = Vec::new();
    let mut coordinators = Vec::new();
    for process in ["one", "two", "three"] {
        let coordinator = Coordinator::connect(setup.builder(process).build().unwrap())
            .await
            .unwrap();
        let schedule = recording("tick", &applied, process, client(&setup).await)
            .jitter(Duration::from_millis(20));
        runners.push(coordinator.schedule(schedule).unwrap());
        coordinators.push(coordinator);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut stats = Vec::new();
    for runner in &runners {
        stats.push(super::stop_schedule(runner).await.unwrap());
    }
    let rows = admin
        .query(
            &format!("SELECT tick, process FROM {applied} ORDER BY tick"),
            &[],
        )
        .await
        .unwrap();
    let ticks: Vec<SystemTime> = rows.iter().map(|r| r.get(0)).collect();
    assert!(ticks.len() >= 10, "only {} ticks ran in 4 s", ticks.len());
    for pair in ticks.windows(2) {
        let step = pair[1].duration_since(pair[0]).unwrap();
        assert_eq!(
            step,
            Duration::from_millis(200),
            "each tick once, none missing: {pair:?}"
        );
    }
    let processes: std::collections::HashSet<String> = rows.iter().map(|r| r.get(1)).collect();
    assert!(!processes.is_empty());
    // Every tick's row is done; a process found the lease taken at some tick.
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    let runs = table.runs(&admin, "tick", 1000).await.unwrap();
    assert!(runs.len() >= ticks.len());
    assert!(runs.iter().all(|r| r.state == RunState::Done), "{runs:?}");
    // The processes' own counts agree: each run started once and finished done.
    let started: u64 = stats.iter().map(|s| s.started).sum();
    let done: u64 = stats.iter().map(|s| s.done).sum();
    assert_eq!(
        (started, done),
        (runs.len() as u64, runs.len() as u64),
        "{stats:?}"
    );
    assert!(
        stats.iter().all(|s| s.failed + s.taken_over == 0),
        "{stats:?}"
    );
}

#[actix_rt::test]
async fn a_failed_run_is_retried_and_one_that_keeps_failing_is_abandoned() {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let every = || Timing::every(Duration::from_millis(200)).unwrap();
    // Fails on each tick's first attempt, succeeds on its second.
    let flaky = Schedule::new("flaky", every(), |tick| async move {
        if tick.attempt() == 1 {
            Err("first attempts fail".to_owned())
        } else {
            Ok(())
        }
    })
    .retry_backoff(Duration::from_millis(20));
    let broken = Schedule::new("broken", every(), |_| async { Err("always".to_owned()) })
        .max_attempts(2)
        .retry_backoff(Duration::from_millis(20));
    let flaky = one.schedule(flaky).unwrap();
    let broken = one.schedule(broken).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(flaky.send(GetStats::new()).await.unwrap().failed >= 1);
    let flaky_stats = super::stop_schedule(&flaky).await.unwrap();
    let broken_stats = super::stop_schedule(&broken).await.unwrap();

    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    let runs = table.runs(&admin, "flaky", 100).await.unwrap();
    assert!(runs.len() >= 3, "{runs:?}");
    // The newest may have been stopped between its attempts.
    for run in &runs[1..] {
        assert_eq!((run.state, run.attempts), (RunState::Done, 2), "{run:?}");
    }
    let runs = table.runs(&admin, "broken", 100).await.unwrap();
    assert!(runs.len() >= 3, "{runs:?}");
    for run in &runs[1..] {
        assert_eq!(
            (run.state, run.attempts),
            (RunState::Abandoned, 2),
            "{run:?}"
        );
        assert_eq!(run.error.as_deref(), Some("always"));
    }
    // Each done run failed once first; each abandoned one failed twice.
    let done = runs_in(&table, &admin, "flaky", RunState::Done).await;
    assert_eq!(flaky_stats.done, done, "{flaky_stats:?}");
    assert!(flaky_stats.failed >= done, "{flaky_stats:?}");
    let abandoned = runs_in(&table, &admin, "broken", RunState::Abandoned).await;
    assert_eq!(broken_stats.abandoned, abandoned, "{broken_stats:?}");
    assert!(broken_stats.failed >= 2 * abandoned, "{broken_stats:?}");
    assert_eq!(broken_stats.done, 0);
}

async fn runs_in(
    table: &ScheduleTable,
    admin: &tokio_postgres::Client,
    schedule: &str,
    state: RunState,
) -> u64 {
    let runs = table.runs(admin, schedule, 100).await.unwrap();
    runs.iter().filter(|r| r.state == state).count() as u64
}

#[actix_rt::test]
async fn a_run_that_lost_its_lease_is_taken_over_and_its_effects_apply_once() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(300)).await;
    let applied = applied_table(&admin, &setup).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    // Process one's first run waits until its lease is lost (deleted on the server below, as
    // if it had paused past its lease), then tries to commit its effects.
    let first_outcome = Arc::new(std::sync::Mutex::new(None));
    let outcome = first_outcome.clone();
    let app = client(&setup).await;
    let stalled_applied = applied.clone();
    let stalled = Schedule::new(
        "takeover",
        Timing::every(Duration::from_millis(200)).unwrap(),
        move |tick| {
            let (app, applied, outcome) = (app.clone(), stalled_applied.clone(), outcome.clone());
            async move {
                if outcome.lock().unwrap().is_some() {
                    return Ok(());
                }
                let _ = tokio::time::timeout(Duration::from_secs(20), tick.lease().lost()).await;
                let mut client = app.lock().await;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                apply(&tx, &applied, &tick, "one").await?;
                let completed = tick.complete(&tx).await;
                *outcome.lock().unwrap() = Some((tick.at(), completed.map_err(|e| e.kind())));
                Err("lost".into())
            }
        },
    )
    .catch_up(CatchUp::Each { max: 1000 });
    let first = one.schedule(stalled).unwrap();
    // Process one holds the lease, in its first run.
    let lease = format!("schedules/{}", "takeover");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = admin
            .query(
                &format!(
                    "SELECT 1 FROM {} s JOIN {} l ON l.name = $1 AND l.owner = 'one' WHERE s.state = 'running'",
                    format_args!("\"{}_s\"", setup.table),
                    setup.quoted_table()
                ),
                &[&lease],
            )
            .await
            .unwrap();
        if !held.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "process one never ran a tick");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = two
        .schedule(recording("takeover", &applied, "two", client(&setup).await))
        .unwrap();
    admin
        .execute(
            &format!("DELETE FROM {} WHERE name = $1", setup.quoted_table()),
            &[&lease],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (tick, completed) = loop {
        if let Some(outcome) = *first_outcome.lock().unwrap() {
            break outcome;
        }
        assert!(Instant::now() < deadline, "process one's run never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        completed,
        Err(ErrorKind::LockLost),
        "the stale run is fenced out"
    );
    // Process two ran the same tick again, once; process one's effects were rolled back.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = admin
            .query(
                &format!("SELECT process, attempt FROM {applied} WHERE tick = $1"),
                &[&tick],
            )
            .await
            .unwrap();
        let rows: Vec<(String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if !rows.is_empty() {
            assert_eq!(rows, vec![("two".to_owned(), 2)], "once, by the taker-over");
            break;
        }
        assert!(Instant::now() < deadline, "the tick was never taken over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = super::stop_schedule(&first).await.unwrap();
    let second = super::stop_schedule(&second).await.unwrap();
    assert_eq!(
        first.taken_over, 1,
        "process one knows its run did not count: {first:?}"
    );
    assert!(second.done >= 1, "{second:?}");
    let rows = admin
        .query(
            &format!("SELECT count(*) FROM {applied} WHERE process = 'one'"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows[0].get::<_, i64>(0),
        0,
        "nothing of process one's committed"
    );
}

#[actix_rt::test]
async fn bad_schedules_are_typed_errors_before_anything_starts() {
    let (setup, _admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let every = || Timing::every(Duration::from_secs(1)).unwrap();
    let noop = |_| async { Ok(()) };
    let err = one
        .schedule(Schedule::new("s", every(), noop).max_attempts(0))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = one
        .schedule(Schedule::new("x".repeat(250), every(), noop))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    let err = one
        .schedule(Schedule::new("s", every(), noop).catch_up(CatchUp::Each { max: 0 }))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = one
        .schedule(Schedule::new("s", every(), noop).run_within(Duration::ZERO))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert_eq!(
        Timing::cron("not cron").unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
}

/// The ticks a runner of `catch_up` runs after every process was down for 2 s: the table's
/// latest row is a done tick 2 s (ten ticks) before the server's now.
async fn after_an_outage(catch_up: CatchUp) -> (Vec<SystemTime>, SystemTime) {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let applied = applied_table(&admin, &setup).await;
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    let now: SystemTime = admin.query_one("SELECT now()", &[]).await.unwrap().get(0);
    let every = Timing::every(Duration::from_millis(200)).unwrap();
    let last = every
        .latest_at_or_before(now - Duration::from_secs(2))
        .unwrap();
    assert_eq!(
        table.claim(&admin, "tick", last, 0, "gone").await.unwrap(),
        Some(1)
    );
    table
        .finish(&admin, "tick", last, 0, 1, RunState::Done, None, None)
        .await
        .unwrap();
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let runner = one
        .schedule(recording("tick", &applied, "one", client(&setup).await).catch_up(catch_up))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    super::stop_schedule(&runner).await.unwrap();
    let rows = admin
        .query(&format!("SELECT tick FROM {applied} ORDER BY tick"), &[])
        .await
        .unwrap();
    (rows.iter().map(|r| r.get(0)).collect(), last)
}

#[actix_rt::test]
async fn missed_ticks_follow_the_catch_up_policy_after_an_outage() {
    let step = Duration::from_millis(200);
    // Each: every missed tick, oldest first, then on time.
    let (ticks, last) = after_an_outage(CatchUp::Each { max: 1000 }).await;
    assert_eq!(ticks.first(), Some(&(last + step)), "{ticks:?}");
    assert!(
        ticks.len() >= 12,
        "the ten missed and the ones after: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].duration_since(pair[0]).unwrap(), step, "{ticks:?}");
    }
    // Latest: the missed ones fold into the latest; then every tick on time.
    let (ticks, last) = after_an_outage(CatchUp::Latest).await;
    let first = ticks.first().expect("a tick ran");
    assert!(
        *first >= last + 9 * step,
        "the latest due tick, not the oldest: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].duration_since(pair[0]).unwrap(), step, "{ticks:?}");
    }
    // Skip: no missed tick runs (the latest only if found within its grace); then on time.
    // (Which one is skipped depends on when the runner first looks: the unit tests pin it.)
    let grace = Duration::from_millis(100);
    let (ticks, last) = after_an_outage(CatchUp::Skip { grace }).await;
    assert!(!ticks.is_empty(), "the ticks after the outage run");
    assert!(
        ticks.iter().all(|t| *t >= last + 10 * step),
        "no missed tick ran: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].duration_since(pair[0]).unwrap(), step, "{ticks:?}");
    }
}

#[actix_rt::test]
async fn a_schedule_whose_address_was_dropped_runs_on() {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let every = Timing::every(Duration::from_millis(100)).unwrap();
    drop(
        one.schedule(Schedule::new("dropped", every, |_| async { Ok(()) }))
            .unwrap(),
    );
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    pgcoord_testkit::eventually(Duration::from_secs(10), "ticks run", async || {
        runs_in(&table, &admin, "dropped", RunState::Done).await >= 3
    })
    .await;
}

/// `Shutdown` stops a runner: no tick runs
/// after it answers, and its lease is released, so another process's runner ticks long before
/// the lease (30 s) would have expired.
#[actix_rt::test]
async fn shutdown_stops_a_runner_and_releases_its_lease() {
    let (setup, admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(1)).await;
    let applied = applied_table(&admin, &setup).await;
    let count = async |process: &str| -> i64 {
        let sql = format!("SELECT count(*) FROM {applied} WHERE process = $1");
        admin.query_one(&sql, &[&process]).await.unwrap().get(0)
    };
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let runner = (one.schedule(recording("tick", &applied, "one", client(&setup).await))).unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(10), "a tick of one", async || {
        count("one").await >= 1
    })
    .await;
    runner.send(Shutdown).await.unwrap();
    let ran = count("one").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(count("one").await, ran, "no tick after the stop");
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    let other = (two.schedule(recording("tick", &applied, "two", client(&setup).await))).unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(10), "a tick of two", async || {
        count("two").await >= 1
    })
    .await;
    super::stop_schedule(&other).await.unwrap();
}
