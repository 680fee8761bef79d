//! Many held leases: 10,000 claimed at once by one manager (time, statements), the memory they
//! take, and the one renew statement per heartbeat tick that keeps them.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::LeaseTable;
use pgcoord_actors::{Acquire, GetStats, LockManager};

use crate::Sizes;
use crate::leases::{Res, config};
use crate::report::{Report, ms};

/// Bytes in a MiB.
const MIB: f64 = (1 << 20) as f64;

pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let admin_cfg = config(pg, "admin", Duration::from_secs(20), Duration::from_secs(5));
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    let table = LeaseTable::new(&admin_cfg);
    // Many held leases: memory, and the one renew statement per tick.
    let holder = LockManager::new(config(
        pg,
        "holder",
        Duration::from_secs(60),
        Duration::from_millis(500),
    ))
    .start();
    let (before, counted_before) = (resident_bytes(), crate::counting::in_use());
    // Transactions committed in the database while the leases are claimed: each statement of
    // the claim is one (the statistics lag, so they are read after a pause).
    let commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let commits_before: i64 = admin.query_one(commits, &[]).await?.get(0);
    let statements_before = holder.send(GetStats::new()).await?.acquire_statements;
    let claimed = Instant::now();
    // All sent at once, as a worker pool would. (Awaited one by one instead, the requests past
    // the manager's mailbox capacity would only be sent as the loop reaches them, one at a time
    // after the rest are done: measured: 5,925 statements instead of 27.)
    let requests = (0..sizes.held).map(|i| holder.send(Acquire::new(format!("held-{i}"))));
    // The heap in use at the claim's height, looked at every 10 ms meanwhile.
    let (mut peak, all) = (0, futures_util::future::join_all(requests));
    tokio::pin!(all);
    let answers = loop {
        tokio::select! {
            answers = &mut all => break answers,
            _ = tokio::time::sleep(Duration::from_millis(10)) => {
                peak = peak.max(crate::counting::in_use() - counted_before);
            }
        }
    };
    let mut held = Vec::new();
    for r in answers {
        held.push(r??);
    }
    let claim_time = claimed.elapsed();
    let statements = holder.send(GetStats::new()).await?.acquire_statements - statements_before;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let commits_after: i64 = admin.query_one(commits, &[]).await?.get(0);
    report.note(
        &format!(
            "{} distinct leases claimed at once by one manager: time (target < 1 s)",
            sizes.held
        ),
        ms(claim_time),
    );
    report.target(
        &format!("{} distinct leases claimed at once: under 1 s", sizes.held),
        ms(claim_time),
        claim_time < Duration::from_secs(1),
    );
    report.note(
        &format!(
            "{} distinct leases claimed at once: acquire statements sent",
            sizes.held
        ),
        format!("{statements}"),
    );
    report.note(
        &format!(
            "{} distinct leases claimed at once: transactions committed meanwhile (all sessions)",
            sizes.held
        ),
        format!("{}", commits_after - commits_before),
    );
    // Resident memory grown since `before`, in MiB per 10,000 held leases.
    let mib_per_10k =
        || resident_bytes().saturating_sub(before) as f64 * 10_000.0 / sizes.held as f64 / MIB;
    let per_10k = mib_per_10k();
    report.note(
        &format!(
            "resident memory growth per 10,000 leases claimed at once and held (measured with {}; the claim's transient allocations included, as the allocator keeps them)",
            sizes.held
        ),
        format!("{per_10k:.1} MiB"),
    );
    report.target(
        "resident memory growth per 10,000 leases claimed at once and held: at most 20 MiB",
        format!("{per_10k:.1} MiB"),
        per_10k <= 20.0,
    );
    // What the held leases take, apart from what the burst of 10,000 waits at once left in
    // the allocator's free lists: the free memory given back to the system first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: malloc_trim only returns free memory to the system; it takes no pointer.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    let in_use = mib_per_10k();
    report.note(
        &format!(
            "memory in use per 10,000 held leases (measured with {}; after the claim, the allocator's free memory returned)",
            sizes.held
        ),
        format!("{in_use:.1} MiB"),
    );
    report.target(
        "memory in use per 10,000 held leases: at most 8 MiB",
        format!("{in_use:.1} MiB"),
        in_use <= 8.0,
    );
    let counted = (crate::counting::in_use() - counted_before) as f64;
    let counted_per_10k = |bytes: f64| bytes * 10_000.0 / sizes.held as f64 / MIB;
    report.note(
        &format!(
            "heap in use per 10,000 held leases, counted by the allocator (measured with {}; the same moment, without the free memory the allocator keeps among it)",
            sizes.held
        ),
        format!("{:.1} MiB", counted_per_10k(counted)),
    );
    report.note(
        &format!(
            "heap in use at the claim's height per 10,000 leases claimed at once, counted (measured with {}, every 10 ms)",
            sizes.held
        ),
        format!("{:.1} MiB", counted_per_10k(peak as f64)),
    );
    let stats = holder.send(GetStats::new()).await?;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let ticks = holder.send(GetStats::new()).await?.renew_statements - stats.renew_statements;
    let snapshot: Vec<(&str, i64)> = held.iter().map(|l| (l.name(), l.token())).collect();
    // The holder's heartbeat renews the same rows meanwhile; two multi-row updates of the same
    // rows can deadlock (only here: in use, a lease is renewed by its holder alone), and one
    // that waits for the other's rows, or for the deadlock to be found (`deadlock_timeout`,
    // 1 s), measures the wait: the fastest of three attempts that succeed is the statement's.
    let (mut renewed, mut renew_time, mut succeeded) = (Vec::new(), Duration::MAX, 0);
    for _ in 0..8 {
        let t = Instant::now();
        match table
            .owner("holder")?
            .renew(&admin, &snapshot, Duration::from_secs(60))
            .await
        {
            Ok(r) => {
                (renewed, renew_time) = (r, renew_time.min(t.elapsed()));
                succeeded += 1;
                if succeeded == 3 {
                    break;
                }
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED) => {
            }
            Err(e) => return Err(e.into()),
        }
    }
    assert_eq!(renewed.len(), held.len());
    report.note(
        &format!(
            "heartbeat for {} held leases: statements per tick (3 ticks)",
            sizes.held
        ),
        format!("{:.1}", ticks as f64 / 3.0),
    );
    report.note(
        &format!(
            "heartbeat for {} held leases: the renew statement's time (fastest of 3)",
            sizes.held
        ),
        ms(renew_time),
    );
    // Stop renewing them every 500 ms, or the next workloads would measure that too.
    drop(held);
    holder.send(pgcoord_actors::Shutdown).await?;
    let remaining = "SELECT count(*) FROM bench_locks WHERE owner = 'holder'";
    let give_up = Instant::now() + Duration::from_secs(60);
    while admin.query_one(remaining, &[]).await?.get::<_, i64>(0) > 0 && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
