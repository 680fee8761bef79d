//! Rate limits: one `try_take` through the runtime against one raw UPDATE of a counter row on a
//! warm connection (the floor), and eight takers on one hot key against eight raw
//! UPDATEs of one row.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgcoord::Config;
use pgcoord::rate::RateLimit;
use pgcoord_actors::Coordinator;

use crate::Sizes;
use crate::leases::{Res, floor_clients};
use crate::report::{Report, Samples};

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = Config::builder()
        .pg_config(pg)
        .owner("bench-rates")
        .lock_table("bench_rate_leases")
        .build()?;
    let admin = pgcoord::db::connect_spawned(&config).await?;
    pgcoord::schema::migrate(&admin, &config).await?;
    admin
        .batch_execute(
            "TRUNCATE bench_rate_leases_rl;
             CREATE TABLE IF NOT EXISTS bench_rate_floor (k int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO bench_rate_floor VALUES (1, 0) ON CONFLICT DO NOTHING",
        )
        .await?;
    // Never refused: what is measured is the statement, not the waiting.
    let rate = RateLimit::per_second(1_000_000)?.burst(u32::MAX)?;
    let coordinator = Coordinator::connect(config.clone()).await?;
    let limiter = coordinator.rate_limiter(rate);
    let raw = floor_clients(&config, 8).await?;
    let update = "UPDATE bench_rate_floor SET n = n + 1 WHERE k = 1";
    // Prepared once per client, as the pool's statements are: a round trip per UPDATE.
    let mut prepared = Vec::new();
    for client in &raw {
        prepared.push(client.prepare(update).await?);
    }

    // One at a time: p50 of a take against p50 of the raw UPDATE, interleaved; and the take's
    // statement alone on a warm connection, to tell the statement's cost from the pool's.
    let table = pgcoord::RateTable::new(&config);
    let (mut ours, mut floor, mut statement) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..sizes.pairs + 50 {
        let started = Instant::now();
        let taken = limiter.try_take("one", 1).await?;
        let took = started.elapsed();
        assert_eq!(taken.granted, 1);
        let started = Instant::now();
        raw[0].execute(&prepared[0], &[]).await?;
        let raw_took = started.elapsed();
        let started = Instant::now();
        table.try_take(&*raw[1], "alone", 1, &rate).await?;
        if i >= 50 {
            ours.push(took);
            floor.push(raw_took);
            statement.push(started.elapsed());
        }
    }
    let (ours, floor) = (Samples::new(ours), Samples::new(floor));
    let ratio = report.time(
        "rate limit try_take, one at a time, p50 (floor: one raw UPDATE of a counter row, prepared, on a warm connection)",
        ours.p(0.5),
        floor.p(0.5),
    );
    report.target(
        "rate limit try_take p50: at most 1.3× one raw UPDATE",
        format!("{ratio:.2}×"),
        ratio <= 1.3,
    );
    report.time(
        "rate limit take statement alone on a warm connection, p50 (floor: the raw UPDATE)",
        Samples::new(statement).p(0.5),
        floor.p(0.5),
    );
    report.time(
        "rate limit try_take, p99 (floor: the raw UPDATE)",
        ours.p(0.99),
        floor.p(0.99),
    );

    // Eight at once on one hot key, for the same time as the floor's eight.
    let window = Duration::from_secs(sizes.contend_secs);
    let takes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (limiter, takes) = (limiter.clone(), takes.clone());
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + window;
            while Instant::now() < until {
                limiter.try_take("hot", 1).await.unwrap();
                takes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let updates = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (client, update) in raw.into_iter().zip(prepared) {
        let updates = updates.clone();
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + window;
            while Instant::now() < until {
                client.execute(&update, &[]).await.unwrap();
                updates.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let per_second = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / window.as_secs_f64();
    report.rate(
        "rate limit takes on one hot key, 8 takers, one statement each (floor: 8 clients' raw UPDATEs of one row)",
        per_second(&takes),
        per_second(&updates),
        "takes/s",
    );
    coordinator.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
