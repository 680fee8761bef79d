//! Advisory workloads: lock+unlock through the runtime against the raw pair, and how long a
//! killed session takes to be reported.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{
    AdvisoryLock, AdvisoryLocks, AdvisoryStats, GetStats, LockLost, SubscribeLockLost,
};

use crate::Sizes;
use crate::report::{Report, Samples, ms};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

struct Lost(tokio::sync::mpsc::UnboundedSender<Instant>);
impl Actor for Lost {
    type Context = Context<Self>;
}
impl Handler<LockLost> for Lost {
    type Result = ();
    fn handle(&mut self, _: LockLost, _: &mut Context<Self>) {
        let _ = self.0.send(Instant::now());
    }
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let fast = Duration::from_millis(200);
    let config = Config::builder()
        .pg_config(pg)
        .owner("bench-advisory")
        .ping_interval(fast)
        .ping_timeout(fast)
        .build()?;
    // Single-connection round trips on this 2-core VM are bimodal by scheduler placement, for a
    // whole connection's life: so the comparison is repeated with fresh connections and a fresh
    // runtime, and the spread across repetitions is reported.
    let repetitions = 2 * sizes.rounds + 1;
    let (mut raw_all, mut ours_all, mut hops, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut raw_p50s, mut ours_p50s) = (Vec::new(), Vec::new());
    let mut manager = None;
    for _ in 0..repetitions {
        let admin = pgcoord::db::connect_spawned(&config).await?;
        let (lock, unlock) = (
            admin.prepare("SELECT pg_advisory_lock($1)").await?,
            admin.prepare("SELECT pg_advisory_unlock($1)").await?,
        );
        if let Some(old) = manager.replace(AdvisoryLocks::new(config.clone()).start()) {
            old.send(pgcoord_actors::Shutdown).await?;
        }
        let manager = manager.as_ref().expect("just set");
        // Interleaved in blocks of 20, so both sides see the same machine and each runs in its
        // steady state: the first operation after a switch is slower.
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for block in 0..(sizes.pairs / repetitions).div_ceil(20) as i64 {
            for side in [block % 2, 1 - block % 2] {
                for key in block * 20..(block + 1) * 20 {
                    let t = Instant::now();
                    if side == 0 {
                        admin.query_one(&lock, &[&key]).await?;
                        admin.query_one(&unlock, &[&key]).await?;
                        raw.push(t.elapsed());
                    } else {
                        let guard = manager.send(AdvisoryLock::new(key)).await??;
                        guard.release().await?;
                        ours.push(t.elapsed());
                    }
                }
            }
            // One actor round trip without the database: what the message hops cost.
            let t = Instant::now();
            manager.send(GetStats::<AdvisoryStats>::new()).await?;
            hops.push(t.elapsed());
        }
        let (r, o) = (Samples::new(raw.clone()), Samples::new(ours.clone()));
        ratios.push(o.p(0.5).as_secs_f64() / r.p(0.5).as_secs_f64());
        raw_p50s.push(r.p(0.5));
        ours_p50s.push(o.p(0.5));
        raw_all.extend(raw);
        ours_all.extend(ours);
    }
    let manager = manager.expect("at least one repetition");
    let admin = pgcoord::db::connect_spawned(&config).await?;
    let (raw, ours) = (Samples::new(raw_all), Samples::new(ours_all));
    // Each side's connections land on fast or slow placements at random, for a repetition's
    // whole life, so the two sides' medians can come from different modes (one run: pgcoord's
    // median p50 from slow repetitions, the raw pair's from fast ones, 5.9× apart, while the
    // median of the repetitions' own ratios was 1.39×). The repetition whose ratio is the median
    // is reported: both of its sides ran side by side on the same machine.
    let mut by_ratio: Vec<usize> = (0..repetitions).collect();
    by_ratio.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
    let median = by_ratio[repetitions / 2];
    let advisory = report.time(
        &format!("advisory lock+unlock through the runtime, p50, the repetition with the median ratio of {repetitions} (floor: the prepared raw pair)"),
        ours_p50s[median],
        raw_p50s[median],
    );
    report.target(
        "advisory lock+unlock p50 (median repetition): at most 1.5× the raw pair",
        format!("{advisory:.3}×"),
        advisory <= 1.5,
    );
    report.time("advisory lock+unlock p99", ours.p(0.99), raw.p(0.99));
    report.note(
        &format!("advisory p50 ratio across {repetitions} repetitions (fresh connections): min / median / max"),
        format!(
            "{:.2}× / {:.2}× / {:.2}×",
            ratios[by_ratio[0]],
            ratios[median],
            ratios[by_ratio[repetitions - 1]]
        ),
    );
    let hop = Samples::new(hops).p(0.5);
    report.note(
        "advisory breakdown: one actor round trip without the database, p50",
        ms(hop),
    );
    // The runtime's share of a lock+unlock, in the median repetition: two messages to the actor
    // (lock, release), the session taken from and put back on its idle list, the guard; the
    // statements are the raw pair's own (one to lock, one to unlock, each on the lock's session).
    report.note(
        "advisory breakdown: what the runtime adds to the raw pair, p50 of the median repetition (pgcoord − raw)",
        ms(ours_p50s[median].saturating_sub(raw_p50s[median])),
    );
    report.note(
        "advisory breakdown: of which two actor round trips (lock, release), p50",
        ms(hop * 2),
    );
    let stats = manager.send(GetStats::<AdvisoryStats>::new()).await?;
    report.note(
        "advisory breakdown: sessions open after the last repetition (one per lock, reused from an idle list)",
        format!("{} idle, {} holding", stats.idle_sessions, stats.held),
    );

    // Detection of a killed session, with 200 ms interval and 200 ms timeout.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    manager
        .send(SubscribeLockLost(Lost(tx).start().recipient()))
        .await?;
    let mut detect = Vec::new();
    for key in 0..3i64 {
        let key = 1_000_000 + key;
        let _held = manager.send(AdvisoryLock::new(key)).await??;
        let killed = Instant::now();
        admin
            .execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid::text::bigint = $1", &[&key])
            .await?;
        let at = rx.recv().await.expect("a loss report");
        detect.push(at - killed);
    }
    report.note(
        "killed session → LockLost, worst of 3 (200 ms interval + 200 ms timeout)",
        ms(*detect.iter().max().unwrap()),
    );
    Ok(())
}
