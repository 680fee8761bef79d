//! A schedule run by three worker processes for 20 s: a tick every 200 ms, each tick's row written in the
//! run's own transaction with `tick.complete(&tx)`. Midway the process running the schedule is
//! frozen (SIGSTOP) past its lease and let go again, and later the one running it is killed
//! (SIGKILL) and a new one started. The ticks table ends with every tick between the first and the
//! last exactly once: none doubled by the frozen process, none lost to the killed one. Where
//! libfaketime is installed (Debian's `faketime`), worker-3's wall clock runs an hour ahead: the
//! server's clock decides when a tick is due, so it runs none early.
//!
//! Run with `cargo run --example schedule`. It uses `DATABASE_URL` when set, and otherwise starts
//! a throwaway PostgreSQL (removed on exit); the workers get its address through `DATABASE_URL`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use pgcoord::schedule::{CatchUp, Timing};
use pgcoord::{Config, schema};
use pgcoord_actors::{Coordinator, Schedule};
use tokio::process::{Child, Command};

const PERIOD: Duration = Duration::from_millis(200);

/// Where Debian's `faketime` package puts the library.
const FAKETIME: &[&str] = &["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"];

/// A short lease, so a frozen or killed worker's tick is taken over within seconds.
fn config(pg: &tokio_postgres::Config, owner: &str) -> Result<Config, pgcoord::Error> {
    Config::builder()
        .pg_config(pg)
        .owner(owner)
        .lease(Duration::from_secs(2))
        .heartbeat(Duration::from_millis(500))
        .build()
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("worker") {
        return worker(&args.next().unwrap_or_default()).await;
    }
    let (server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = config(&pg, "main")?;
    let client = pgcoord::db::connect_spawned(&config).await?;
    schema::migrate(&client, &config).await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS report_ticks;
             CREATE TABLE report_ticks (tick timestamptz NOT NULL, worker text NOT NULL);
             DELETE FROM pgcoord_schedules WHERE schedule = 'report';",
        )
        .await?;
    let dsn = match &server {
        Some(server) => server.dsn(),
        None => std::env::var("DATABASE_URL")?,
    };
    // Missing, a line says so and every worker runs on this machine's clock (under CI: fails).
    let found = FAKETIME
        .iter()
        .map(std::path::PathBuf::from)
        .find(|lib| lib.exists());
    let faketime = pgcoord_testkit::require(found, "libfaketime", "faketime");
    let start = |name: String| {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["worker", &name])
            .env("DATABASE_URL", &dsn)
            .kill_on_drop(true);
        if name == "worker-3"
            && let Some(lib) = &faketime
        {
            // The wall clock only: tokio's timers run on the monotonic one.
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", "+1h")
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        command.spawn().map(|child| (name, child))
    };
    let mut workers: Vec<(String, Child)> = Vec::new();
    for n in 1..=3 {
        workers.push(start(format!("worker-{n}"))?);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Freeze whoever is running the schedule now, for twice its lease.
    let frozen = running(&client, &workers).await?;
    let pid = workers[frozen].1.id().ok_or("no pid")?.to_string();
    signal("-STOP", &pid)?;
    println!(
        "{} frozen (SIGSTOP) while running the schedule",
        workers[frozen].0
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    signal("-CONT", &pid)?;
    println!("{} let go again (SIGCONT)", workers[frozen].0);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Kill whoever is running it now, and start another.
    let killed = running(&client, &workers).await?;
    workers[killed].1.kill().await?;
    println!(
        "{} killed (SIGKILL) while running the schedule",
        workers[killed].0
    );
    workers.push(start("worker-4".into())?);
    // 20 s in all, as issue #28's scenario asks.
    tokio::time::sleep(Duration::from_secs(11)).await;
    for (i, (_, child)) in workers.iter_mut().enumerate() {
        if i != killed {
            child.kill().await?;
        }
    }

    let rows = client
        .query("SELECT tick, worker FROM report_ticks ORDER BY tick", &[])
        .await?;
    let ticks: Vec<SystemTime> = rows.iter().map(|r| r.get(0)).collect();
    let mut by: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    by.dedup();
    for pair in ticks.windows(2) {
        let step = pair[1].duration_since(pair[0])?;
        assert_eq!(step, PERIOD, "each tick once, none missing: {pair:?}");
    }
    assert!(ticks.len() >= 80, "only {} ticks ran", ticks.len());
    println!(
        "{} ticks, each exactly once, run in turn by: {}",
        ticks.len(),
        by.join(" → ")
    );
    Ok(())
}

/// The index of the worker holding the schedule's lease (waits until one does).
async fn running(
    client: &tokio_postgres::Client,
    workers: &[(String, Child)],
) -> Result<usize, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = client
            .query(
                "SELECT owner FROM pgcoord_locks
                 WHERE name = 'schedules/report' AND expires_at > now()",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        if let Some(owner) = rows.first().and_then(|r| r.get::<_, Option<String>>(0))
            && let Some(i) = workers.iter().position(|(name, _)| *name == owner)
        {
            return Ok(i);
        }
        if Instant::now() > deadline {
            let rows = client.query("SELECT name, owner FROM pgcoord_locks", &[]);
            let rows = rows.await.map_err(|e| e.to_string())?;
            let leases: Vec<(String, Option<String>)> =
                rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            return Err(format!("no worker ran the schedule; leases: {leases:?}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn signal(which: &str, pid: &str) -> Result<(), Box<dyn std::error::Error>> {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()?;
    if !status.success() {
        return Err(format!("kill {which} {pid} failed").into());
    }
    Ok(())
}

/// A worker: runs the schedule "report" until it is killed. Each run takes 100 ms (half the
/// period), so a freeze or a kill likely lands in the middle of one.
async fn worker(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    // The runtime's warnings (a tick taken over, a run that failed) on stderr.
    tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let pg: tokio_postgres::Config = std::env::var("DATABASE_URL")?.parse()?;
    let config = config(&pg, name)?;
    let client = pgcoord::db::connect_spawned(&config).await?;
    let server_now: SystemTime = client.query_one("SELECT now()", &[]).await?.get(0);
    let ahead = SystemTime::now()
        .duration_since(server_now)
        .unwrap_or_default();
    if ahead > Duration::from_secs(60) {
        println!(
            "{name}'s clock is {} s ahead of the server's",
            ahead.as_secs()
        );
    }
    let client = Arc::new(tokio::sync::Mutex::new(client));
    let coordinator = Coordinator::connect(config).await?;
    let name = name.to_owned();
    let report = Schedule::new("report", Timing::every(PERIOD)?, move |tick| {
        let (client, name) = (client.clone(), name.clone());
        async move {
            let mut client = client.lock().await;
            let tx = client.transaction().await.map_err(|e| e.to_string())?;
            tx.execute(
                "INSERT INTO report_ticks VALUES ($1, $2)",
                &[&tick.at(), &name],
            )
            .await
            .map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Fails (and the insert rolls back) if another worker took the tick over.
            tick.complete(&tx).await.map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())
        }
    })
    .catch_up(CatchUp::Each { max: 1000 })
    .jitter(Duration::from_millis(20));
    coordinator.schedule(report)?;
    std::future::pending::<()>().await;
    Ok(())
}
