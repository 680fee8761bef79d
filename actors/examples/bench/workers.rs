//! Worker pools: a pool claiming 10,000 keys at its start (time, statements), and how long keys
//! take to move when a second process joins and when it leaves.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{GetStats, LockManager, Shutdown, WorkerKey, WorkerPool};

use crate::Sizes;
use crate::leases::Res;
use crate::report::{Report, ms};

struct Idle;
impl Actor for Idle {
    type Context = Context<Self>;
}
impl Handler<Shutdown> for Idle {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

async fn held(pool: &Addr<WorkerPool<Idle>>) -> usize {
    pool.send(GetStats::new())
        .await
        .map(|a| a.keys.len())
        .unwrap_or(0)
}

async fn until(pool: &Addr<WorkerPool<Idle>>, keys: usize) -> Duration {
    let started = Instant::now();
    while held(pool).await != keys && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        Config::builder()
            .pg_config(pg)
            .owner(owner)
            .lock_table("bench_workers")
            .lease(Duration::from_secs(4))
            .heartbeat(Duration::from_secs(1))
            .pool_size(8)
            .build()
    };
    let admin_cfg = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::drop_tables(&admin, &admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    let keys: Vec<String> = (0..sizes.held).map(|i| format!("k{i}")).collect();
    let start = |owner: &str| -> Res<(Addr<WorkerPool<Idle>>, Addr<LockManager>)> {
        let config = config(owner)?;
        let locks = LockManager::new(config.clone()).start();
        let pool = WorkerPool::new(
            &config,
            locks.clone(),
            "bench",
            keys.clone(),
            |_: WorkerKey| Idle,
        );
        Ok((pool.start(), locks))
    };
    let (a, a_locks) = start("a")?;
    // The first tick (a quarter lease) only registers membership; timed from the claim.
    let t = until(&a, keys.len()).await;
    let statements = a_locks.send(GetStats::new()).await?.acquire_statements;
    report.note(
        &format!("worker pool: {} keys claimed by a process starting alone, from its start (first tick: 1 s)", keys.len()),
        ms(t),
    );
    report.note(
        &format!(
            "worker pool: {} keys claimed: acquire statements",
            keys.len()
        ),
        format!("{statements}"),
    );
    let (b, _b_locks) = start("b")?;
    let half = keys.len() / 2;
    let joined = until(&b, half).await;
    report.note(
        "worker pool: a second process joins → it serves half the keys (tick: 1 s)",
        ms(joined),
    );
    // Moved: what the first process let go (the joiner's share, ⌈keys ÷ 2⌉, is the least).
    let moved = keys.len() - held(&a).await;
    report.note(
        &format!(
            "worker pool: keys moved when the second process joins (of {})",
            keys.len()
        ),
        format!("{moved}"),
    );
    a.send(Shutdown).await?;
    let left = until(&b, keys.len()).await;
    report.note(
        "worker pool: the first process leaves → the other serves every key",
        ms(left),
    );
    b.send(Shutdown).await?;
    Ok(())
}
