//! Counting semaphores: a permit taken and given back through the runtime against the raw
//! statements, and the throughput of 8 callers on 3 permits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::lease::{ReleaseRequest, SlotAttempt, slot_names};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{AcquirePermit, LockManager, SetLimit};

use crate::Sizes;
use crate::leases::{Res, floor_clients};
use crate::report::{Report, Samples};

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        Config::builder()
            .pg_config(pg)
            .owner(owner)
            .lock_table("bench_semaphores")
            .build()
    };
    let admin_cfg = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    let table = LeaseTable::new(&admin_cfg);
    let raw = floor_clients(&admin_cfg, 1).await?.remove(0);
    let slots = slot_names("raw", 3)?;
    let manager = LockManager::new(config("bench")?).start();
    // 1 caller, interleaved in blocks of 20: the raw statements (any free slot, then release)
    // against a permit through the runtime; then the same with a stored limit of 3.
    manager.send(SetLimit::new("limited", 3)).await??;
    for (request, what) in [
        (AcquirePermit::new("one", 3), "semaphore"),
        (
            AcquirePermit::limited("limited"),
            "limited semaphore (stored limit)",
        ),
    ] {
        let (mut floor, mut ours) = (Vec::new(), Vec::new());
        for block in 0..sizes.requests.div_ceil(20) {
            for side in [block % 2, 1 - block % 2] {
                for _ in 0..20 {
                    let t = Instant::now();
                    if side == 0 {
                        raw_permit(&table, &raw, &slots, admin_cfg.lease()).await?;
                        floor.push(t.elapsed());
                    } else {
                        let permit = manager.send(request.clone()).await??;
                        permit.release().await?;
                        ours.push(t.elapsed());
                    }
                }
            }
        }
        report.time(
            &format!("{what} permit taken and given back, 1 caller, p50 (floor: the raw any-slot acquire and release)"),
            Samples::new(ours).p(0.5),
            Samples::new(floor).p(0.5),
        );
    }

    // 8 callers in one manager on 3 permits, each holding its permit for 1 ms.
    let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(sizes.contend_secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (manager, taken) = (manager.clone(), taken.clone());
            actix_rt::spawn(async move {
                while Instant::now() < stop {
                    let permit = manager
                        .send(AcquirePermit::new("three", 3))
                        .await
                        .unwrap()
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    permit.release().await.unwrap();
                    taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let rate =
        taken.load(std::sync::atomic::Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    report.note(
        "semaphore, 8 callers on 3 permits held 1 ms each: permits/s (at most 3,000/s by the holding alone)",
        format!("{rate:.0} /s"),
    );
    Ok(())
}

/// The floor: any free slot with the raw statement, then its release.
async fn raw_permit(
    table: &LeaseTable,
    raw: &tokio_postgres::Client,
    slots: &[String],
    lease: Duration,
) -> Res {
    let SlotAttempt::Granted { slot, grant } = table
        .owner("raw")?
        .try_acquire_any(raw, slots, lease)
        .await?
    else {
        panic!("a free slot")
    };
    let request = ReleaseRequest {
        name: &slot,
        token: grant.token,
        keep: false,
        announce_always: true,
    };
    table.owner("raw")?.release(raw, &request).await?;
    Ok(())
}
