//! Fault workloads: how soon the runtime serves again after a server restart, and how soon it
//! gives up on a database it cannot reach.
//!
//! - **Restart → first acquire.** A throwaway cluster of this workload's own (never the one the
//!   other workloads use, which may be a user's `DATABASE_URL`) is stopped (fast shutdown),
//!   left down for 200 ms and started again; the clock starts when the server accepts
//!   connections again, and stops when an `Acquire` sent at that moment is granted. Meanwhile the
//!   manager holds one lease (2 s lease, 400 ms heartbeat) and its pool holds connections that
//!   the restart killed. The floor is what any client pays at least after a restart: a fresh raw
//!   `tokio_postgres` connect and one simple `SELECT 1`, timed from the same moment after a
//!   restart of the same kind. Restarts alternate between the two sides and are spaced by 1 s, so
//!   both see the same machine and the manager settles in between; the held lease must survive
//!   them all.
//! - **Unreachable DSN → error.** `LockManager::connect` with a 1 s connect timeout against a
//!   closed loopback port, whose floor is a raw `tokio_postgres::connect` to the same port (the
//!   refusal itself), and against a loopback listener that accepts and never answers, whose
//!   floor is the configured connect timeout: nothing can tell a silent server from a slow one
//!   sooner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, ErrorKind};
use pgcoord_actors::{Acquire, LockManager};
use pgcoord_testkit::TempPostgres;

use crate::Sizes;
use crate::report::{Report, Samples, ms};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const LEASE: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(400);
/// How long the server stays down in each restart.
const DOWN: Duration = Duration::from_millis(200);
/// The pause between one measured restart and the next.
const SETTLE: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs a blocking cluster operation (stop, start again) off the actors' thread.
async fn on_server(
    server: &Arc<TempPostgres>,
    op: fn(&TempPostgres) -> pgcoord::Result<()>,
) -> Res {
    let server = server.clone();
    tokio::task::spawn_blocking(move || op(&server)).await??;
    Ok(())
}

/// Stops the server, leaves it down for [`DOWN`], starts it again, and returns the moment it
/// accepts connections again.
async fn restart(server: &Arc<TempPostgres>) -> Res<Instant> {
    on_server(server, TempPostgres::stop).await?;
    tokio::time::sleep(DOWN).await;
    on_server(server, TempPostgres::start_again).await?;
    Ok(Instant::now())
}

/// A fresh raw connection and one simple query: what any client pays after a restart.
async fn raw_connect_select(pg: &tokio_postgres::Config) -> Res {
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client.simple_query("SELECT 1").await?;
    Ok(())
}

/// Times `LockManager::connect`; a description of the outcome unless it failed, as it should,
/// with [`ErrorKind::Unavailable`].
async fn connect_fails(config: &Config) -> (Duration, Option<String>) {
    let t = Instant::now();
    let outcome = LockManager::connect(config.clone()).await;
    let elapsed = t.elapsed();
    match outcome {
        Err(e) if e.kind() == ErrorKind::Unavailable => (elapsed, None),
        Err(e) => (elapsed, Some(format!("Err({:?}): {e}", e.kind()))),
        Ok(manager) => {
            manager.do_send(pgcoord_actors::Shutdown);
            (elapsed, Some("Ok: started".into()))
        }
    }
}

fn unreachable(port: u16) -> Res<Config> {
    Ok(Config::builder()
        .dsn(format!(
            "host=127.0.0.1 port={port} user=postgres dbname=postgres"
        ))
        .owner("bench-unreachable")
        .connect_timeout(CONNECT_TIMEOUT)
        .build()?)
}

pub async fn run(_pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    restarts(sizes, report).await?;
    unreachable_dsn(sizes, report).await
}

async fn restarts(sizes: &Sizes, report: &mut Report) -> Res {
    let server = Arc::new(tokio::task::spawn_blocking(TempPostgres::start).await??);
    let pg = server.pg_config();
    let config = Config::builder()
        .pg_config(&pg)
        .owner("bench-faults")
        .lease(LEASE)
        .heartbeat(HEARTBEAT)
        .build()?;
    {
        let admin = pgcoord::db::connect_spawned(&config).await?;
        pgcoord::schema::migrate(&admin, &config).await?;
    }
    let pool = pgcoord::Pool::new(&config);
    let table = pgcoord::LeaseTable::new(&config);
    let manager = LockManager::with_pool(config, pool.clone(), None).start();
    let held = manager.send(Acquire::new("held")).await??;
    // Warm the pool: a few lookups at once, so several pooled connections exist to be killed.
    let statements = pool.idempotent(None);
    let warm: Vec<_> = (0..4).map(|_| table.get(&statements, "held")).collect();
    for w in warm {
        w.await?;
    }
    tokio::time::sleep(SETTLE).await;

    let (mut ours, mut floor, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        for side in [round % 2, 1 - round % 2] {
            let accepting = restart(&server).await?;
            if side == 0 {
                let acquired = manager
                    .send(Acquire::new(format!("after-{round}")).timeout(Duration::from_secs(10)))
                    .await?;
                let elapsed = accepting.elapsed();
                match acquired {
                    Ok(lease) => {
                        ours.push(elapsed);
                        lease.release().await?;
                    }
                    Err(e) => failures.push(format!("round {round}: {e} after {}", ms(elapsed))),
                }
            } else {
                raw_connect_select(&pg).await?;
                floor.push(accepting.elapsed());
            }
            tokio::time::sleep(SETTLE).await;
        }
    }
    let floor = Samples::new(floor);
    let label = "server restart → first acquire granted, from accepting connections again";
    if ours.is_empty() {
        report.note(
            &format!("{label}: every attempt failed"),
            failures.join("; "),
        );
    } else {
        let ours = Samples::new(ours);
        report.time(
            &format!(
                "{label}, p50 of {} (floor: raw connect + `SELECT 1`; target ≤ 100 ms, was 2.9 s)",
                sizes.rounds
            ),
            ours.p(0.5),
            floor.p(0.5),
        );
        report.time(&format!("{label}, max"), ours.max(), floor.max());
        if !failures.is_empty() {
            report.note(&format!("{label}: failed attempts"), failures.join("; "));
        }
    }

    // The held lease: never reported lost, and the row still carries its token.
    let info = table.get(&pool.idempotent(None), "held").await;
    let kept = held.loss().is_none() && info.as_ref().is_ok_and(|i| i.token == Some(held.token()));
    report.note(
        &format!(
            "held lease ({} s lease, {} ms heartbeat) through {} restarts",
            LEASE.as_secs(),
            HEARTBEAT.as_millis(),
            2 * sizes.rounds
        ),
        if kept {
            "held lease lost: no".into()
        } else {
            format!(
                "held lease lost: yes ({:?}; row: {:?})",
                held.loss(),
                info.map(|i| i.token)
            )
        },
    );
    let _ = held.release().await;
    manager.send(pgcoord_actors::Shutdown).await?;
    // Dropping the cluster stops it: blocking work.
    tokio::task::spawn_blocking(move || drop(server)).await?;
    Ok(())
}

async fn unreachable_dsn(sizes: &Sizes, report: &mut Report) -> Res {
    let mut unexpected = Vec::new();

    // (a) A closed port: bound, then let go, so nothing listens on it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = unreachable(closed)?;
    let dsn = format!("host=127.0.0.1 port={closed} user=postgres dbname=postgres");
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    for round in 0..10 {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let (elapsed, outcome) = connect_fails(&config).await;
                ours.push(elapsed);
                unexpected.extend(outcome.map(|o| format!("closed port: {o}")));
            } else {
                let t = Instant::now();
                let raw = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await;
                floor.push(t.elapsed());
                if raw.is_ok() {
                    unexpected.push("closed port: the raw connect succeeded".into());
                }
            }
        }
    }
    let (ours, floor) = (Samples::new(ours), Samples::new(floor));
    let label = "unreachable DSN, closed port → Err(Unavailable)";
    report.time(
        &format!("{label}, p50 of 10 (floor: raw `tokio_postgres::connect`, refused)"),
        ours.p(0.5),
        floor.p(0.5),
    );
    report.time(&format!("{label}, max"), ours.max(), floor.max());

    // (b) A listener that accepts and never answers, as a hung server or a black hole does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let silent = listener.local_addr()?.port();
    let accepting = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let config = unreachable(silent)?;
    let mut ours = Vec::new();
    for _ in 0..sizes.rounds {
        let (elapsed, outcome) = connect_fails(&config).await;
        ours.push(elapsed);
        unexpected.extend(outcome.map(|o| format!("silent listener: {o}")));
    }
    accepting.abort();
    let ours = Samples::new(ours);
    let label = "unreachable DSN, listener that never answers → Err(Unavailable)";
    report.time(
        &format!(
            "{label}, p50 of {} (floor: the {} s connect timeout; was 30 s)",
            sizes.rounds,
            CONNECT_TIMEOUT.as_secs()
        ),
        ours.p(0.5),
        CONNECT_TIMEOUT,
    );
    report.time(&format!("{label}, max"), ours.max(), CONNECT_TIMEOUT);
    if !unexpected.is_empty() {
        report.note(
            "unreachable DSN: unexpected outcomes",
            unexpected.join("; "),
        );
    }
    Ok(())
}
