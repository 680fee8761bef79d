//! Lease benchmark: pgcoord's figures next to the raw SQL floor measured in the same run.
//!
//! Run with `cargo run --release -p pgcoord-actors --example bench` (add `-- --quick` for a
//! short run). Uses `DATABASE_URL` when set, else a throwaway PostgreSQL. Prints a markdown
//! table; docs/BENCHMARKS.md holds a copy with the machine described.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Acquire, AdvisoryLock, AdvisoryUnlock, LockManager};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(workload: &str, ours: String, floor: String, ratio: f64) {
    println!("| {workload} | {ours} | {floor} | {ratio:.2}× |");
}

fn summary(mut samples: Vec<Duration>, elapsed: Duration) -> (f64, Duration, Duration) {
    samples.sort();
    (
        samples.len() as f64 / elapsed.as_secs_f64(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
    )
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (pairs, contend_for) = if quick {
        (300, Duration::from_secs(1))
    } else {
        (3000, Duration::from_secs(5))
    };
    let (_server, pg) = pgcoord::embedded::from_env_or_start()?;
    let config = |owner: &str| {
        Config::builder()
            .pg_config(&pg)
            .owner(owner)
            .lock_table("bench_locks")
            .build()
    };
    let admin_config = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_config).await?;
    pgcoord::schema::drop_tables(&admin, &admin_config).await?;
    pgcoord::schema::migrate(&admin, &admin_config).await?;
    let table = LeaseTable::new(&admin_config);
    let lease = admin_config.lease();

    println!("| workload | pgcoord | raw floor | ratio |\n|---|---|---|---|");
    let (started, select_one) = (Instant::now(), admin.prepare("SELECT 1").await?);
    for _ in 0..pairs {
        admin.query_one(&select_one, &[]).await?;
    }
    println!(
        "| floor: prepared `SELECT 1` round trip | | {:.2?} | |",
        started.elapsed() / pairs as u32
    );
    // Floor: the same acquire and release statements, back to back on one dedicated connection.
    let (mut floor, started) = (Vec::new(), Instant::now());
    for i in 0..pairs {
        let t = Instant::now();
        let name = format!("raw-{i}");
        let pgcoord::lease::Attempt::Granted(g) = table
            .try_acquire(&admin, &name, "raw", None, false, lease)
            .await?
        else {
            panic!("free")
        };
        table.release(&admin, &name, g.token, false).await?;
        floor.push(t.elapsed());
    }
    let (floor_rate, floor_p50, floor_p99) = summary(floor, started.elapsed());

    let manager = LockManager::new(config("bench")?).start();
    for clients in [1usize, 8] {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (manager, samples) = (manager.clone(), samples.clone());
                actix_rt::spawn(async move {
                    for i in 0..pairs / clients {
                        let t = Instant::now();
                        let lease = manager
                            .send(Acquire::new(format!("u-{c}-{i}")))
                            .await
                            .unwrap()
                            .unwrap();
                        lease.release().await.unwrap();
                        samples.lock().unwrap().push(t.elapsed());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await?;
        }
        let (rate, p50, p99) = summary(
            Arc::try_unwrap(samples).unwrap().into_inner()?,
            started.elapsed(),
        );
        row(
            &format!("acquire+release, {clients} client(s): pairs/s"),
            format!("{rate:.0}"),
            format!("{floor_rate:.0}"),
            floor_rate / rate,
        );
        row(
            &format!("acquire+release, {clients} client(s): p50"),
            format!("{p50:.2?}"),
            format!("{floor_p50:.2?}"),
            p50.as_secs_f64() / floor_p50.as_secs_f64(),
        );
        row(
            &format!("acquire+release, {clients} client(s): p99"),
            format!("{p99:.2?}"),
            format!("{floor_p99:.2?}"),
            p99.as_secs_f64() / floor_p99.as_secs_f64(),
        );
    }

    // Contended handoff: 8 managers (as 8 processes would) loop on one name.
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let stop = Instant::now() + contend_for;
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let manager = LockManager::new(config(&format!("contender-{c}")).unwrap()).start();
            let (released_at, handoffs) = (released_at.clone(), handoffs.clone());
            actix_rt::spawn(async move {
                let mut count = 0u32;
                while Instant::now() < stop {
                    let lease = manager
                        .send(Acquire::new("contended"))
                        .await
                        .unwrap()
                        .unwrap();
                    if let Some(at) = released_at.lock().unwrap().take() {
                        handoffs.lock().unwrap().push(at.elapsed());
                    }
                    count += 1;
                    *released_at.lock().unwrap() = Some(Instant::now());
                    lease.release().await.unwrap();
                }
                count
            })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await?);
    }
    let mut handoffs = Arc::try_unwrap(handoffs).unwrap().into_inner()?;
    handoffs.sort();
    let mean = counts.iter().sum::<u32>() as f64 / counts.len() as f64;
    let min = *counts.iter().min().unwrap() as f64;
    row(
        "handoff release→next holder: p50",
        format!("{:.2?}", percentile(&handoffs, 0.5)),
        format!("{floor_p50:.2?}"),
        percentile(&handoffs, 0.5).as_secs_f64() / floor_p50.as_secs_f64(),
    );
    row(
        "handoff release→next holder: p99",
        format!("{:.2?}", percentile(&handoffs, 0.99)),
        format!("{floor_p99:.2?}"),
        percentile(&handoffs, 0.99).as_secs_f64() / floor_p99.as_secs_f64(),
    );
    println!("| handoff max | {:.2?} | | |", handoffs.last().unwrap());
    println!(
        "| fairness: acquisitions per contender (min/mean) | {counts:?} | | {:.2} |",
        min / mean
    );

    // Advisory: the raw pair on one connection against the runtime (a new session per lock).
    let n = pairs / 10;
    let started = Instant::now();
    for key in 0..n as i64 {
        admin
            .execute("SELECT pg_advisory_lock($1)", &[&key])
            .await?;
        admin
            .execute("SELECT pg_advisory_unlock($1)", &[&key])
            .await?;
    }
    let raw = started.elapsed() / n as u32;
    let started = Instant::now();
    for key in 0..n as i64 {
        manager.send(AdvisoryLock::new(key)).await??;
        manager.send(AdvisoryUnlock(key)).await??;
    }
    let ours = started.elapsed() / n as u32;
    row(
        "advisory lock+unlock (mean)",
        format!("{ours:.2?}"),
        format!("{raw:.2?}"),
        ours.as_secs_f64() / raw.as_secs_f64(),
    );
    Ok(())
}
