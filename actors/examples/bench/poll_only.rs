//! Poll-only mode (no LISTEN, no NOTIFY): a handoff between two managers, and a takeover past
//! an expiry, run after the lease workloads on their table.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Acquire, LockManager};

use crate::Sizes;
use crate::leases::Res;
use crate::report::{Report, Samples, ms};

/// Poll-only mode (no LISTEN, no NOTIFY), with the default 20 s lease: a waiter's poll is 1 s.
/// A handoff between two managers, and a takeover past an expiry.
pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        let builder = Config::builder().pg_config(pg).owner(owner);
        builder.lock_table("bench_locks").poll_only(true).build()
    };
    let admin_cfg = &config("poll-admin")?;
    let admin = &pgcoord::db::connect_spawned(admin_cfg).await?;
    pgcoord::schema::migrate(admin, admin_cfg).await?;
    let (a, b) = (
        LockManager::new(config("poll-a")?).start(),
        LockManager::new(config("poll-b")?).start(),
    );
    let rounds = (sizes.contend_secs * 2).clamp(3, 10);
    let mut handoffs = Vec::new();
    for round in 0..rounds {
        let (holder, waiter) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let held = holder.send(Acquire::new("poll-only")).await??;
        let waiting = actix_rt::spawn(waiter.send(Acquire::new("poll-only")));
        // Let the waiter's first attempt be refused, so it waits for its next look.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        held.release().await?;
        let taken = waiting.await??.map_err(|e| e.to_string())?;
        handoffs.push(released.elapsed());
        taken.release().await?;
    }
    let handoffs = Samples::new(handoffs);
    report.note(
        "poll-only (no LISTEN/NOTIFY, 20 s lease: a 1 s poll): handoff, release sent → next holder, p50 / max",
        format!("{} / {}", ms(handoffs.p(0.5)), ms(handoffs.max())),
    );
    let table = LeaseTable::new(admin_cfg);
    let short = Duration::from_millis(500);
    let granted = Instant::now();
    let Attempt::Granted(_) = table
        .owner("frozen")?
        .try_acquire(admin, &AcquireRequest::new("poll-only-takeover"), short)
        .await?
    else {
        panic!("free")
    };
    let lease = a.send(Acquire::new("poll-only-takeover")).await??;
    report.note(
        "poll-only: takeover after the holder stops renewing, time past expiry",
        ms(granted.elapsed().saturating_sub(short)),
    );
    lease.release().await?;
    Ok(())
}
