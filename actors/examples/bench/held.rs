//! Many held leases: 10,000 taken by one `Claim`, as a worker pool takes its keys (time, the
//! memory they take); 10,000 asked for at once by as many callers (time, statements, the
//! memory they take and what the burst of waits leaves in the allocator); and the one renew
//! statement per heartbeat tick that keeps them.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::LeaseTable;
use pgcoord_actors::{Acquire, Claim, GetStats, Lease, LockManager};

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
    // First, so that its figures are the held leases' alone; kept until the section ends, so
    // the burst after it cannot reuse its memory.
    let (claimer, claimed_leases) = by_claim(pg, sizes, report).await?;
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
    // Transactions committed in the database while the leases are asked for: each statement of
    // the burst is one (the statistics lag, so they are read after a pause).
    let commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let commits_before: i64 = admin.query_one(commits, &[]).await?.get(0);
    let statements_before = holder.send(GetStats::new()).await?.acquire_statements;
    let asked = Instant::now();
    // All sent at once, by as many callers. (Awaited one by one instead, the requests past
    // the manager's mailbox capacity would only be sent as the loop reaches them, one at a time
    // after the rest are done: measured: 5,925 statements instead of 27.)
    let requests = (0..sizes.held).map(|i| holder.send(Acquire::new(format!("held-{i}"))));
    // The heap in use at the burst's height, looked at every 10 ms meanwhile.
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
    let burst_time = asked.elapsed();
    let statements = holder.send(GetStats::new()).await?.acquire_statements - statements_before;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let commits_after: i64 = admin.query_one(commits, &[]).await?.get(0);
    report.note(
        &format!(
            "{} distinct leases asked for at once of one manager, an Acquire each: time (target < 1 s)",
            sizes.held
        ),
        ms(burst_time),
    );
    report.target(
        &format!(
            "{} distinct leases asked for at once, an Acquire each: under 1 s",
            sizes.held
        ),
        ms(burst_time),
        burst_time < Duration::from_secs(1),
    );
    report.note(
        &format!(
            "{} distinct leases asked for at once: acquire statements sent",
            sizes.held
        ),
        format!("{statements}"),
    );
    report.note(
        &format!(
            "{} distinct leases asked for at once: transactions committed meanwhile (all sessions)",
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
            "resident memory growth per 10,000 leases asked for at once (an Acquire each) and held (measured with {}; the burst's transient allocations included, as the allocator keeps them)",
            sizes.held
        ),
        format!("{per_10k:.1} MiB"),
    );
    report.target(
        "resident memory growth per 10,000 leases asked for at once (an Acquire each) and held: at most 20 MiB",
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
            "memory in use per 10,000 leases asked for at once (an Acquire each) and held (measured with {}; after the burst, the allocator's free memory returned)",
            sizes.held
        ),
        format!("{in_use:.1} MiB"),
    );
    report.target(
        "memory in use per 10,000 leases asked for at once (an Acquire each) and held: at most 8 MiB",
        format!("{in_use:.1} MiB"),
        in_use <= 8.0,
    );
    let counted = (crate::counting::in_use() - counted_before) as f64;
    let counted_per_10k = |bytes: f64| bytes * 10_000.0 / sizes.held as f64 / MIB;
    report.note(
        &format!(
            "heap in use per 10,000 leases asked for at once (an Acquire each) and held, counted by the allocator (measured with {}; the same moment, without the free memory the allocator keeps among it)",
            sizes.held
        ),
        format!("{:.1} MiB", counted_per_10k(counted)),
    );
    report.note(
        &format!(
            "heap in use at the burst's height per 10,000 leases asked for at once, counted (measured with {}, every 10 ms)",
            sizes.held
        ),
        format!("{:.1} MiB", counted_per_10k(peak as f64)),
    );
    let rows_of = async |owner: &str| -> Res<i64> {
        let sql = "SELECT count(*) FROM bench_locks WHERE owner = $1";
        Ok(admin.query_one(sql, &[&owner]).await?.get(0))
    };
    let released = async |owner: &str| -> Res<Duration> {
        let (started, give_up) = (Instant::now(), Instant::now() + Duration::from_secs(60));
        while rows_of(owner).await? > 0 && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(started.elapsed())
    };
    // The claiming manager shut down holding its leases, before the heartbeat is measured
    // on a table of the holder's leases alone: it releases them all.
    let stopping = Instant::now();
    claimer.send(pgcoord_actors::Shutdown).await?;
    drop(claimed_leases);
    released("claimer").await?;
    let stopped = stopping.elapsed();
    report.note(
        &format!(
            "a manager holding {} leases shut down: until every row is released",
            sizes.held
        ),
        ms(stopped),
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
    // Stop renewing them every 500 ms, or the next workloads would measure that too. Their
    // handles dropped at once: the releases, batched, until no row is left.
    drop(held);
    let dropped = released("holder").await?;
    report.note(
        &format!(
            "{} held leases' handles dropped at once: until every row is released",
            sizes.held
        ),
        ms(dropped),
    );
    holder.send(pgcoord_actors::Shutdown).await?;
    Ok(())
}

/// `sizes.held` leases taken by one [`Claim`] (batched statements, no wait per name), as a
/// worker pool takes its keys: the time, and the memory the held leases take.
async fn by_claim(
    pg: &tokio_postgres::Config,
    sizes: &Sizes,
    report: &mut Report,
) -> Res<(Addr<LockManager>, Vec<Lease>)> {
    // A heartbeat that does not tick during the section.
    let claimer = LockManager::new(config(
        pg,
        "claimer",
        Duration::from_secs(60),
        Duration::from_secs(20),
    ))
    .start();
    let (before, counted_before) = (resident_bytes(), crate::counting::in_use());
    let names = (0..sizes.held).map(|i| format!("claimed-{i}")).collect();
    let started = Instant::now();
    let held = claimer.send(Claim::new(names)).await??;
    let took = started.elapsed();
    if held.len() != sizes.held {
        return Err(format!("the claim took {} of {} leases", held.len(), sizes.held).into());
    }
    let n = sizes.held;
    report.note(
        &format!("{n} distinct leases taken by one Claim (as a worker pool takes its keys): time"),
        ms(took),
    );
    let per_10k = |bytes: u64| bytes as f64 * 10_000.0 / n as f64 / MIB;
    let grown = per_10k(resident_bytes().saturating_sub(before));
    report.target(
        "resident memory growth per 10,000 leases taken by one Claim and held: at most 20 MiB",
        format!("{grown:.1} MiB"),
        grown <= 20.0,
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: malloc_trim only returns free memory to the system; it takes no pointer.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    let in_use = per_10k(resident_bytes().saturating_sub(before));
    report.target(
        "memory in use per 10,000 leases taken by one Claim and held (after the allocator's free memory is returned): at most 8 MiB",
        format!("{in_use:.1} MiB"),
        in_use <= 8.0,
    );
    let counted = per_10k((crate::counting::in_use() - counted_before).max(0) as u64);
    report.note(
        "heap in use per 10,000 leases taken by one Claim and held, counted by the allocator",
        format!("{counted:.1} MiB"),
    );
    Ok((claimer, held))
}
