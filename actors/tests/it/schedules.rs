//! Schedules: each tick runs once across processes, its effects fenced with it; failures are
//! retried then abandoned; a run that lost its lease is taken over and does not count.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgcoord::ErrorKind;
use pgcoord::schedule::{CatchUp, RunState, ScheduleTable, Timing};
use pgcoord_actors::*;
use tokio::sync::Mutex;

use pgcoord_testkit::Proxy;

use super::Setup;

/// A client of the test's own, one per process, for the handlers' transactions.
async fn client(setup: &Setup) -> Arc<Mutex<tokio_postgres::Client>> {
    let config = setup.builder("app").build().unwrap();
    Arc::new(Mutex::new(
        pgcoord::db::connect_spawned(&config).await.unwrap(),
    ))
}

/// A schedule every 200 ms whose run records (tick, process, attempt) in `applied` and marks
/// the tick done in the same transaction.
fn recording(
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
async fn record(
    tick: &Tick,
    client: &mut tokio_postgres::Client,
    applied: &str,
    process: &str,
) -> Result<(), String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    tx.execute(
        &format!("INSERT INTO {applied} VALUES ($1, $2, $3)"),
        &[&tick.at(), &process, &(tick.attempt() as i32)],
    )
    .await
    .map_err(|e| e.to_string())?;
    tick.complete(&tx).await.map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

async fn applied_table(admin: &tokio_postgres::Client, setup: &Setup) -> String {
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
        stats.push(runner.send(StopSchedule).await.unwrap());
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
    assert!(flaky.send(GetScheduleStats).await.unwrap().failed >= 1);
    let flaky_stats = flaky.send(StopSchedule).await.unwrap();
    let broken_stats = broken.send(StopSchedule).await.unwrap();

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
                tx.execute(
                    &format!("INSERT INTO {applied} VALUES ($1, 'one', $2)"),
                    &[&tick.at(), &(tick.attempt() as i32)],
                )
                .await
                .map_err(|e| e.to_string())?;
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
    let first = first.send(StopSchedule).await.unwrap();
    let second = second.send(StopSchedule).await.unwrap();
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

#[actix_rt::test]
async fn a_run_past_its_bound_is_failed_and_retried_and_its_late_complete_does_not_count() {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let applied = applied_table(&admin, &setup).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let (app, late_app) = (client(&setup).await, client(&setup).await);
    let again_app = client(&setup).await;
    let first = Arc::new(std::sync::Mutex::new(None::<SystemTime>));
    let (said, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let (said_again, mut heard_again) = tokio::sync::mpsc::unbounded_channel();
    let handler = {
        let (first, applied) = (first.clone(), applied.clone());
        move |tick: Tick| {
            let (first, applied, app) = (first.clone(), applied.clone(), app.clone());
            let (late_app, said, said_again) = (late_app.clone(), said.clone(), said_again.clone());
            let again_app = again_app.clone();
            async move {
                if tick.attempt() == 1 {
                    // The first tick's first run hands its tick to a task that completes it
                    // after the bound; every first attempt hangs.
                    let is_first = first.lock().unwrap().get_or_insert(tick.at()) == &tick.at();
                    if is_first {
                        tokio::spawn(late_complete(tick, late_app, applied, said));
                    }
                    return std::future::pending().await;
                }
                let mut client = app.lock().await;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                tx.execute(
                    &format!("INSERT INTO {applied} VALUES ($1, 'one', $2)"),
                    &[&tick.at(), &(tick.attempt() as i32)],
                )
                .await
                .map_err(|e| e.to_string())?;
                // A second transaction of the same run (say, a retry after an unclear COMMIT)
                // racing this one, which has fenced and not yet completed: it waits, then is
                // told the tick is done — no deadlock, no second commit.
                tick.fence(&tx).await.map_err(|e| e.to_string())?;
                let racing = async {
                    let mut again = again_app.lock().await;
                    let again = again.transaction().await.unwrap();
                    let refused = tick.complete(&again).await.expect_err("done already");
                    refused.kind()
                };
                let completing = async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    tick.complete(&tx).await.map_err(|e| e.to_string())?;
                    tx.commit().await.map_err(|e| e.to_string())
                };
                let (refused, completed) = tokio::join!(racing, completing);
                completed?;
                let _ = said_again.send(refused);
                Ok(())
            }
        }
    };
    let schedule = Schedule::new(
        "bounded",
        Timing::every(Duration::from_millis(200)).unwrap(),
        handler,
    )
    .run_within(Duration::from_millis(300));
    let runner = one.schedule(schedule).unwrap();

    // At 600 ms the tick is marked failed (attempt 1 passed its bound), not yet started again:
    // attempt 1's run has ended.
    assert_eq!(heard.recv().await.unwrap(), ErrorKind::LockLost);
    // Once attempt 2 has run, attempt 1's complete is refused all the same.
    assert_eq!(heard.recv().await.unwrap(), ErrorKind::LockLost);
    assert_eq!(
        heard_again.recv().await.unwrap(),
        ErrorKind::AlreadyAcknowledged
    );

    // A run under way hangs: the stop waits for its bound, not for ever.
    let stopped = tokio::time::timeout(Duration::from_secs(5), runner.send(StopSchedule))
        .await
        .expect("StopSchedule answers within the run's bound")
        .unwrap();
    assert!(stopped.failed >= 1 && stopped.done >= 1, "{stopped:?}");

    let first = first.lock().unwrap().unwrap();
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    let runs = table.runs(&admin, "bounded", 100).await.unwrap();
    let run = runs.iter().find(|r| r.tick == first).unwrap();
    assert_eq!((run.state, run.attempts), (RunState::Done, 2), "{run:?}");
    // Only attempt 2's effects committed: the late attempt's transaction rolled back.
    let rows = admin
        .query(
            &format!("SELECT process, attempt FROM {applied} WHERE tick = $1"),
            &[&first],
        )
        .await
        .unwrap();
    let rows: Vec<(String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, [("one".to_owned(), 2)]);
}

#[actix_rt::test]
async fn a_tick_kept_past_its_run_does_not_hold_the_schedule() {
    let (setup, admin) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let (kept, mut keeping) = tokio::sync::mpsc::unbounded_channel();
    let handler = move |tick: Tick| {
        let kept = kept.clone();
        async move {
            if tick.attempt() == 1 {
                // The first attempt of every tick hands its Tick away and hangs past its bound.
                let _ = kept.send(tick);
                return std::future::pending().await;
            }
            Ok(())
        }
    };
    let schedule = Schedule::new(
        "kept",
        Timing::every(Duration::from_millis(500)).unwrap(),
        handler,
    )
    .run_within(Duration::from_millis(100))
    .retry_backoff(Duration::from_millis(100));
    let runner = one.schedule(schedule).unwrap();
    let first = keeping.recv().await.unwrap();
    // Attempt 2 needs the schedule's lease: the runner let it go though the first Tick is kept.
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    pgcoord_testkit::eventually(Duration::from_secs(4), "attempt 2 done", async || {
        let runs = table.runs(&admin, "kept", 100).await.unwrap();
        runs.iter()
            .any(|r| r.tick == first.at() && r.state == RunState::Done && r.attempts == 2)
    })
    .await;
    // The kept Tick's fence fails: its lease was released.
    let client = client(&setup).await;
    let mut client = client.lock().await;
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        first.fence(&tx).await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
    drop(tx);
    let stopped = runner.send(StopSchedule).await.unwrap();
    assert!(stopped.done >= 1 && stopped.failed >= 1, "{stopped:?}");
    assert_eq!(stopped.taken_over, 0, "{stopped:?}");
}

/// Completes `tick` 600 ms into its run (past its bound), then again once its attempt 2 is
/// done; says how each was refused, committing only what was not.
async fn late_complete(
    tick: Tick,
    app: Arc<Mutex<tokio_postgres::Client>>,
    applied: String,
    said: tokio::sync::mpsc::UnboundedSender<ErrorKind>,
) {
    tokio::time::sleep(Duration::from_millis(600)).await;
    said.send(try_complete(&tick, &app, &applied).await)
        .unwrap();
    let attempt_2 = format!("SELECT 1 FROM {applied} WHERE tick = $1 AND attempt = 2");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let at = tick.at();
        let rows = app.lock().await.query(&attempt_2, &[&at]).await.unwrap();
        if !rows.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "attempt 2 did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    said.send(try_complete(&tick, &app, &applied).await)
        .unwrap();
}

/// Applies a row for `tick` and completes it, committing only if that was not refused.
async fn try_complete(
    tick: &Tick,
    app: &Mutex<tokio_postgres::Client>,
    applied: &str,
) -> ErrorKind {
    let mut client = app.lock().await;
    let tx = client.transaction().await.unwrap();
    let at = tick.at();
    let insert = format!("INSERT INTO {applied} VALUES ($1, 'late', 1)");
    tx.execute(&insert, &[&at]).await.unwrap();
    let refused = tick
        .complete(&tx)
        .await
        .expect_err("a late complete is refused");
    refused.kind()
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
    runner.send(StopSchedule).await.unwrap();
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

/// Like [`recording`], each run on a connection of its own from `config`: a run cut off by a
/// partition does not leave the next runs a dead client.
fn recording_anew(name: &str, applied: &str, process: &str, config: pgcoord::Config) -> Schedule {
    let (applied, process) = (applied.to_owned(), process.to_owned());
    Schedule::new(
        name,
        Timing::every(Duration::from_millis(200)).unwrap(),
        move |tick| {
            let (config, applied, process) = (config.clone(), applied.clone(), process.clone());
            async move {
                let mut client = pgcoord::db::connect_spawned(&config)
                    .await
                    .map_err(|e| e.to_string())?;
                record(&tick, &mut client, &applied, &process).await
            }
        },
    )
    .catch_up(CatchUp::Each { max: 1000 })
    // A run whose connections were black-holed hangs; the bound ends it.
    .run_within(Duration::from_secs(1))
}

#[actix_rt::test]
async fn a_partitioned_process_loses_the_schedule_and_every_tick_still_runs_once() {
    let lease = Duration::from_secs(3);
    let (setup, admin) = Setup::new(lease, Duration::from_secs(1)).await;
    let applied = applied_table(&admin, &setup).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let cut_off = setup
        .builder("one")
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let one = Coordinator::connect(cut_off.clone()).await.unwrap();
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    // Process one starts first and takes the first ticks; two looks on.
    let one_runner = one
        .schedule(recording_anew("tick", &applied, "one", cut_off))
        .unwrap();
    let who_ran = async |process: &str| {
        let rows = admin
            .query(
                &format!("SELECT count(*) FROM {applied} WHERE process = $1"),
                &[&process],
            )
            .await
            .unwrap();
        rows[0].get::<_, i64>(0)
    };
    pgcoord_testkit::eventually(Duration::from_secs(10), "one runs ticks", async || {
        who_ran("one").await >= 3
    })
    .await;
    let two_runner = two
        .schedule(recording_anew(
            "tick",
            &applied,
            "two",
            setup.builder("two").build().unwrap(),
        ))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Every connection of one's black-holed, new ones refused: two runs the ticks (the missed
    // ones too) once one's lease has run out.
    proxy.refuse(true);
    proxy.cut();
    let before = who_ran("two").await;
    pgcoord_testkit::eventually(lease * 3, "two runs ticks", async || {
        who_ran("two").await >= before + 5
    })
    .await;

    // Healed: one comes back; both go on sharing the schedule without doubling a tick.
    proxy.refuse(false);
    tokio::time::sleep(lease).await;
    for runner in [&one_runner, &two_runner] {
        let stopped = tokio::time::timeout(lease * 2, runner.send(StopSchedule))
            .await
            .expect("StopSchedule answers")
            .unwrap();
        assert!(stopped.started >= 1, "{stopped:?}");
    }

    let ticks: Vec<SystemTime> = admin
        .query(&format!("SELECT tick FROM {applied} ORDER BY tick"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for pair in ticks.windows(2) {
        let step = pair[1].duration_since(pair[0]).unwrap();
        assert_eq!(
            step,
            Duration::from_millis(200),
            "each tick once, none missing: {pair:?}"
        );
    }
    let table = ScheduleTable::new(&setup.builder("admin").build().unwrap());
    let runs = table.runs(&admin, "tick", 1000).await.unwrap();
    // The newest may have been stopped under way.
    assert!(
        runs[1..].iter().all(|r| r.state == RunState::Done),
        "{runs:?}"
    );
}
