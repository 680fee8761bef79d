//! NOTIFY's cost on the host application: the application's own write transactions (pgbench's
//! shape: an UPDATE and an INSERT on tables of its own, 8 clients) with pgcoord beside it at
//! about 1,000 operations a second — lease acquire+release pairs and published signals, half
//! each, with a listener listening — against the same transactions without pgcoord. The
//! application runs on a thread and runtime of its own, as another process would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::{Acquire, Call, ListenerActor, LockManager, Publish, Subscribe};

use crate::Sizes;
use crate::leases::Res;
use crate::report::Report;

/// The application, as a process of its own would be: on a thread and runtime of its own, 8
/// clients in closed loops of one write transaction each, for `run_for`; its transactions per
/// second.
async fn application(cfg: &pgcoord::Config, run_for: Duration) -> Res<f64> {
    let cfg = cfg.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let rate = runtime.map_err(|e| e.to_string()).and_then(|runtime| {
            runtime.block_on(async {
                let mut clients = Vec::new();
                for _ in 0..8 {
                    let client = pgcoord::db::connect_spawned(&cfg).await;
                    clients.push(client.map_err(|e| e.to_string())?);
                }
                transactions(&clients, run_for)
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        let _ = tx.send(rate);
    });
    Ok(rx.await??)
}

/// `clients` closed loops of one write transaction each, for `run_for`: transactions/s.
async fn transactions(
    clients: &[tokio_postgres::Client],
    run_for: Duration,
) -> Result<f64, tokio_postgres::Error> {
    let started = Instant::now();
    let loops = clients.iter().enumerate().map(|(c, client)| async move {
        let mut done = 0u64;
        let mut i = c as i32;
        while started.elapsed() < run_for {
            i = (i * 7919 + 13) % 10_000;
            client
                .batch_execute(&format!(
                    "BEGIN;
                     UPDATE bench_host_accounts SET balance = balance + 1 WHERE id = {i};
                     INSERT INTO bench_host_history (aid, delta) VALUES ({i}, 1);
                     COMMIT"
                ))
                .await?;
            done += 1;
        }
        Ok::<u64, tokio_postgres::Error>(done)
    });
    let mut total = 0;
    for done in futures_util::future::join_all(loops).await {
        total += done?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// What runs beside the application.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    /// Lease pairs and published signals, half each, a listener listening.
    Mix,
    /// Lease pairs from a poll-only manager.
    PollOnlyPairs,
    /// Lease pairs as raw statements from one client.
    RawPairs,
    /// The mix as raw statements from one client: pairs, and `pg_notify` of the same payloads
    /// on the channel the listener listens on.
    RawMix,
}

/// A subscriber that counts what it hears.
struct Heard(Arc<AtomicU64>);
impl Actor for Heard {
    type Context = Context<Self>;
}
impl Handler<pgcoord_actors::Signal> for Heard {
    type Result = ();
    fn handle(&mut self, _: pgcoord_actors::Signal, _: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    // A pool of 2: at ~1,000 operations a second a bigger pool opens more backends, which cost
    // the application far more than the statements do (measured: docs/BENCHMARKS.md).
    let pool_size: u32 = std::env::var("HOST_POOL_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let cfg = pgcoord::Config::builder()
        .pg_config(pg)
        .owner("bench-host")
        .lock_table("bench_locks")
        .lease(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(2))
        .pool_size(pool_size)
        .build()?;
    let admin = pgcoord::db::connect_spawned(&cfg).await?;
    pgcoord::schema::migrate(&admin, &cfg).await?;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS bench_host_accounts, bench_host_history;
             CREATE TABLE bench_host_accounts (id int PRIMARY KEY, balance int8 NOT NULL);
             INSERT INTO bench_host_accounts SELECT g, 0 FROM generate_series(0, 9999) g;
             CREATE TABLE bench_host_history (id bigserial PRIMARY KEY, aid int NOT NULL,
                 delta int NOT NULL, at timestamptz NOT NULL DEFAULT now());",
        )
        .await?;
    // pgcoord beside it: a manager, and a listener subscribed to what is published.
    let locks = LockManager::new(cfg.clone()).start();
    let listener = ListenerActor::new(cfg.clone(), None).start_supervised();
    let heard = Arc::new(AtomicU64::new(0));
    listener
        .send(Subscribe::new(
            "bench_host",
            Heard(heard.clone()).start().recipient(),
        ))
        .await??;
    // The same pairs from a poll-only manager (no NOTIFY), and from a raw client (the SQL's own
    // cost, no runtime).
    let poll_only = pgcoord::Config::builder()
        .pg_config(pg)
        .owner("bench-host-poll")
        .pool_size(pool_size)
        .lock_table(cfg.lock_table().to_string().trim_matches('"'))
        .poll_only(true)
        .build()?;
    let poll_only = LockManager::new(poll_only).start();
    let raw = crate::leases::floor_clients(&cfg, 1).await?.remove(0);
    let table = Arc::new(pgcoord::LeaseTable::new(&cfg));
    let run_for = Duration::from_secs(sizes.contend_secs.max(1));
    // The operations at about 1,000 a second: one every millisecond, each on its own task so
    // a slow one does not hold back the rate.
    let beside = |mode: Beside, until: Instant| {
        let (locks, listener, poll_only) = (locks.clone(), listener.clone(), poll_only.clone());
        let (raw, table) = (raw.clone(), table.clone());
        let done = Arc::new(AtomicU64::new(0));
        let counted = done.clone();
        let pacer = actix::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut n = 0u64;
            while Instant::now() < until {
                tick.tick().await;
                n += 1;
                let (locks, listener, done) = (locks.clone(), listener.clone(), done.clone());
                let (poll_only, raw, table) = (poll_only.clone(), raw.clone(), table.clone());
                actix::spawn(async move {
                    let name = format!("host-{}", n % 64);
                    let pair = |locks: Addr<LockManager>| async move {
                        match locks.call(Acquire::new(name)).await {
                            Ok(lease) => lease.release().await.is_ok(),
                            Err(_) => false,
                        }
                    };
                    let ok = match mode {
                        Beside::Mix if n.is_multiple_of(2) => pair(locks).await,
                        Beside::Mix => {
                            let publish = Publish::new("bench_host", n.to_be_bytes().to_vec());
                            listener.call(publish).await.is_ok()
                        }
                        Beside::PollOnlyPairs => pair(poll_only).await,
                        Beside::RawMix if !n.is_multiple_of(2) => {
                            let channel = "bench_host";
                            let text = format!("{n:016x}");
                            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                                [&channel, &text];
                            raw.execute("SELECT pg_notify($1, $2)", &params)
                                .await
                                .is_ok()
                        }
                        Beside::RawPairs | Beside::RawMix => {
                            let name = format!("host-raw-{}", n % 64);
                            let lease = Duration::from_secs(10);
                            crate::leases::raw_pair(&table, &raw, &name, lease)
                                .await
                                .is_ok()
                        }
                    };
                    if ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        (pacer, counted)
    };
    for (mode, what) in [
        (Beside::Mix, "pgcoord (pairs and publishes, half each)"),
        (
            Beside::PollOnlyPairs,
            "pgcoord in poll-only mode (pairs only: no NOTIFY)",
        ),
        (
            Beside::RawPairs,
            "raw acquire+release statements (no runtime; a NOTIFY only when someone waits)",
        ),
        (
            Beside::RawMix,
            "raw statements, pairs and pg_notify half each (the mix's floor)",
        ),
    ] {
        // Interleaved rounds, the best of each: without, with, without, with.
        let (mut without, mut with, mut rate) = (0f64, 0f64, 0f64);
        for _ in 0..2 {
            without = without.max(application(&cfg, run_for).await?);
            let started = Instant::now();
            let (pacer, done) = beside(mode, started + run_for);
            with = with.max(application(&cfg, run_for).await?);
            pacer.await?;
            rate = rate.max(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64());
        }
        report.note(
            &format!("host application: operations/s beside it, {what}"),
            format!("{rate:.0}"),
        );
        let ratio = report.rate(
            &format!("host application's write transactions/s, 8 clients, with {what} at ~1,000/s beside it (floor: the same without)"),
            with,
            without,
            "tx/s",
        );
        if mode == Beside::Mix {
            report.target(
                "host application: at least 0.95× its write throughput with pgcoord at ~1,000 ops/s beside it",
                format!("{:.3}×", 1.0 / ratio),
                1.0 / ratio >= 0.95,
            );
        }
    }
    admin
        .batch_execute("DROP TABLE bench_host_accounts, bench_host_history")
        .await?;
    Ok(())
}
