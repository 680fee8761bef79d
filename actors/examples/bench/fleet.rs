//! A fleet on one PostgreSQL: many managers, each with its own pool, listener and heartbeat
//! session as one process per worker would have, one client each, distinct names.
//!
//! The floors are the raw statements on one warm connection per client, with the fleet's
//! listeners listening: the release statement alone (a raw client's), and the release with a
//! NOTIFY (what every release cost when each one was announced: PostgreSQL serialises the
//! commits of transactions that sent one, database-wide, and signals every listener).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::__private::CachingClient;
use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Acquire, LockManager};

use crate::Sizes;
use crate::leases::{Res, config, floor_clients};
use crate::report::Report;

/// One raw acquire and release of `name` by `client`, the release announced when `notify`.
pub(crate) async fn raw_pair(
    table: &LeaseTable,
    client: &CachingClient,
    name: &str,
    lease: Duration,
    notify: bool,
) -> Res {
    let owner = table.owner("raw")?;
    let Attempt::Granted(g) = owner
        .try_acquire(client, &AcquireRequest::new(name), lease)
        .await?
    else {
        return Err(format!("the floor's lease {name} is not free").into());
    };
    let release = ReleaseRequest {
        name,
        token: g.token,
        keep: false,
        announce_always: notify,
    };
    owner.release(client, &release).await?;
    Ok(())
}

/// Pairs per second of the raw floor: every client at once, `pairs` in all.
pub(crate) async fn floor_rate(
    cfg: &Config,
    clients: &[Arc<CachingClient>],
    pairs: usize,
    notify: bool,
    round: usize,
) -> Res<(usize, Duration)> {
    let table = Arc::new(LeaseTable::new(cfg));
    let per_client = pairs / clients.len();
    let started = Instant::now();
    let tasks: Vec<_> = (clients.iter().enumerate())
        .map(|(c, client)| {
            let (table, client, lease) = (table.clone(), client.clone(), cfg.lease());
            tokio::spawn(async move {
                for i in 0..per_client {
                    let name = format!("fleet-raw-{notify}-{round}-{c}-{i}");
                    raw_pair(&table, &client, &name, lease, notify)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    Ok((per_client * clients.len(), started.elapsed()))
}

/// Pairs per second of the fleet: one client per manager, `pairs` in all.
async fn fleet_rate(
    managers: &[Addr<LockManager>],
    pairs: usize,
    round: usize,
) -> Res<(usize, Duration)> {
    let per_manager = pairs / managers.len();
    let started = Instant::now();
    let tasks: Vec<_> = (managers.iter().enumerate())
        .map(|(m, manager)| {
            let manager = manager.clone();
            actix_rt::spawn(async move {
                for i in 0..per_manager {
                    let name = format!("fleet-{round}-{m}-{i}");
                    let lease = manager.send(Acquire::new(name)).await.unwrap().unwrap();
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    Ok((per_manager * managers.len(), started.elapsed()))
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let (lease, beat) = (Duration::from_secs(20), Duration::from_secs(5));
    let admin_cfg = config(pg, "fleet-admin", lease, beat);
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    for size in [8, 32] {
        let managers: Vec<Addr<LockManager>> = (0..size)
            .map(|m| {
                // One client each: two pooled connections, as a small service would open.
                let cfg = Config::builder()
                    .pg_config(pg)
                    .owner(format!("fleet-{m}"))
                    .lock_table("bench_locks")
                    .lease(lease)
                    .heartbeat(beat)
                    .pool_size(2)
                    .build()
                    .unwrap();
                LockManager::new(cfg).start()
            })
            .collect();
        // Every manager listening and warm before a clock starts.
        for manager in &managers {
            let lease = manager.send(Acquire::new("fleet-warm")).await??;
            lease.release().await?;
        }
        let raw = floor_clients(&admin_cfg, size).await?;
        let pairs = (sizes.pairs * 2).max(size * 32);
        let (mut floor, mut notifying, mut fleet) = (
            (0, Duration::ZERO),
            (0, Duration::ZERO),
            (0, Duration::ZERO),
        );
        let add = |sum: &mut (usize, Duration), (n, t): (usize, Duration)| {
            sum.0 += n;
            sum.1 += t;
        };
        // Interleaved rounds, so all three see the same (shared, noisy) machine.
        for round in 0..4 {
            add(
                &mut floor,
                floor_rate(&admin_cfg, &raw, pairs / 4, false, round).await?,
            );
            add(
                &mut notifying,
                floor_rate(&admin_cfg, &raw, pairs / 4, true, round).await?,
            );
            add(&mut fleet, fleet_rate(&managers, pairs / 4, round).await?);
        }
        let rate = |(n, t): (usize, Duration)| n as f64 / t.as_secs_f64();
        let (floor, notifying, fleet) = (rate(floor), rate(notifying), rate(fleet));
        report.rate(
            &format!("fleet: {size} managers (own pool, listener, heartbeat), one client each, acquire+release"),
            fleet,
            floor,
            "pairs/s",
        );
        report.rate(
            &format!("fleet: {size} raw clients whose every release sends a NOTIFY (what every release cost when each was announced)"),
            notifying,
            floor,
            "pairs/s",
        );
        for manager in managers {
            manager.send(pgcoord_actors::Shutdown).await?;
            drop(manager);
        }
    }
    Ok(())
}
