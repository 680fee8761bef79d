//! Schedules under faults: a run past its bound, a Tick kept past its run, a transaction of a
//! run racing another, a partitioned process. Each tick still applies once.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgcoord::ErrorKind;
use pgcoord::schedule::{CatchUp, RunState, ScheduleTable, Timing};
use pgcoord_actors::*;
use pgcoord_testkit::Proxy;
use tokio::sync::Mutex;

use super::Setup;
use super::schedules::{applied_table, apply, client, record};

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
                apply(&tx, &applied, &tick, "one").await?;
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
    let stopped = tokio::time::timeout(Duration::from_secs(5), super::stop_schedule(&runner))
        .await
        .expect("the stop answers within the run's bound")
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
    let stopped = super::stop_schedule(&runner).await.unwrap();
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
        let stopped = tokio::time::timeout(lease * 2, super::stop_schedule(runner))
            .await
            .expect("the stop answers")
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
