//! Schedules: how late a tick's run starts after its instant, three coordinators sharing a
//! 100 ms schedule, against one client running the raw statements a holder needs before a run
//! (try the lease, observe, claim) at the same instants.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::schedule::{RunState, ScheduleTable, Timing};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Coordinator, Schedule, Shutdown};

use crate::Sizes;
use crate::leases::{Res, floor_clients};
use crate::report::{Report, Samples};

const PERIOD: Duration = Duration::from_millis(100);

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        Config::builder()
            .pg_config(pg)
            .owner(owner)
            .lock_table("bench_schedule_leases")
            .schedule_table("bench_schedules")
            .build()
    };
    let admin_cfg = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    admin
        .batch_execute("TRUNCATE bench_schedules; TRUNCATE bench_schedule_leases")
        .await?;
    let seconds = sizes.contend_secs * 2;
    let timing = Timing::every(PERIOD)?;

    // Ours: three coordinators, each tick's lateness taken as its handler starts.
    let late = Arc::new(Mutex::new(Vec::new()));
    let mut coordinators = Vec::new();
    let mut runners = Vec::new();
    for n in 0..3 {
        let coordinator = Coordinator::connect(config(&format!("bench-{n}"))?).await?;
        let late = late.clone();
        let schedule = Schedule::new("bench", timing.clone(), move |tick| {
            let lateness = SystemTime::now()
                .duration_since(tick.at())
                .unwrap_or_default();
            late.lock().unwrap().push(lateness);
            async { Ok(()) }
        });
        runners.push(coordinator.schedule(schedule)?);
        coordinators.push(coordinator);
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for runner in &runners {
        runner.send(Shutdown).await?;
    }
    let ours = std::mem::take(&mut *late.lock().unwrap());
    let ticks = ours.len();

    // The floor: the statements alone, from one warmed client, at the same kind of instants.
    let raw = floor_clients(&admin_cfg, 1).await?.remove(0);
    let leases = LeaseTable::new(&admin_cfg);
    let runs = ScheduleTable::new(&admin_cfg);
    let owner = leases.owner("raw")?;
    let mut floor = Vec::new();
    for _ in 0..ticks.max(1) {
        let now = SystemTime::now();
        let tick = timing.next_after(now).ok_or("a next tick")?;
        tokio::time::sleep(tick.duration_since(now).unwrap_or_default()).await;
        let Attempt::Granted(grant) = owner
            .try_acquire(&*raw, &AcquireRequest::new("raw"), admin_cfg.lease())
            .await?
        else {
            return Err("the raw floor's lease is not free".into());
        };
        runs.observe(&*raw, "raw").await?;
        let claimed = runs.claim(&*raw, "raw", tick, grant.token, "raw").await?;
        floor.push(SystemTime::now().duration_since(tick).unwrap_or_default());
        let attempt = claimed.ok_or("the raw floor's tick is free")?;
        runs.finish(
            &*raw,
            "raw",
            tick,
            grant.token,
            attempt,
            RunState::Done,
            None,
            None,
        )
        .await?;
        let release = ReleaseRequest {
            name: "raw",
            token: grant.token,
            keep: false,
            announce_always: false,
        };
        owner.release(&*raw, &release).await?;
    }
    let (ours, floor) = (Samples::new(ours), Samples::new(floor));
    report.time(
        "schedule tick: its run starts after its instant, 3 coordinators on 100 ms, p50 (floor: sleep to the instant, then the raw try-lease, observe and claim)",
        ours.p(0.5),
        floor.p(0.5),
    );
    report.time(
        "schedule tick lateness, p99 (floor: the same statements)",
        ours.p(0.99),
        floor.p(0.99),
    );
    let expected = (Duration::from_secs(seconds).as_millis() / PERIOD.as_millis()) as usize;
    report.note(
        "schedule ticks run in the window (each once; per tick the holder sends 7 statements: acquire, observe, claim, finish, observe, trim, release; each other process 1)",
        format!("{ticks} of {expected}"),
    );
    Ok(())
}
