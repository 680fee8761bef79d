//! Advisory workloads: lock+unlock through the runtime against the raw pair, and how long a
//! killed session takes to be reported.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{
    AdvisoryLock, AdvisoryLocks, AdvisoryStats, GetStats, LockLost, SubscribeLockLost,
};

use crate::Sizes;
use crate::placement::{self, Placement};
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

/// One placement's repetitions of the comparison.
struct Repeated {
    /// Each repetition's p50, raw pair and through the runtime.
    raw_p50s: Vec<Duration>,
    ours_p50s: Vec<Duration>,
    /// Each repetition's ratio of the two.
    ratios: Vec<f64>,
    raw_all: Vec<Duration>,
    ours_all: Vec<Duration>,
    /// Actor round trips without the database.
    hops: Vec<Duration>,
    manager: Addr<AdvisoryLocks>,
}

impl Repeated {
    /// The repetitions sorted by ratio: the median one is reported, both of its sides having run
    /// side by side on the same machine.
    fn by_ratio(&self) -> Vec<usize> {
        let mut by_ratio: Vec<usize> = (0..self.ratios.len()).collect();
        by_ratio.sort_by(|&a, &b| self.ratios[a].total_cmp(&self.ratios[b]));
        by_ratio
    }
}

/// The backend of the session `manager` locks with: found by the lock it holds.
async fn session_pid(admin: &tokio_postgres::Client, manager: &Addr<AdvisoryLocks>) -> Res<i32> {
    const KEY: i64 = 7_000_000;
    let guard = manager.send(AdvisoryLock::new(KEY)).await??;
    let pid = admin
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND classid = 0 AND objid = $1::bigint::oid AND objsubid = 1",
            &[&KEY],
        )
        .await?
        .get(0);
    guard.release().await?;
    Ok(pid)
}

/// `repetitions` of the comparison, each with fresh connections and a fresh runtime; with a
/// placement, this thread and both sides' backends are pinned to its cores for the duration.
async fn repeat(
    config: &Config,
    placement: Option<Placement>,
    repetitions: usize,
    pairs: usize,
) -> Res<Repeated> {
    let (mut raw_all, mut ours_all, mut hops, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut raw_p50s, mut ours_p50s) = (Vec::new(), Vec::new());
    let mut manager = None;
    let saved = placement.map(|_| placement::current()).transpose()?;
    for _ in 0..repetitions {
        let admin = pgcoord::db::connect_spawned(config).await?;
        let (lock, unlock) = (
            admin.prepare("SELECT pg_advisory_lock($1)").await?,
            admin.prepare("SELECT pg_advisory_unlock($1)").await?,
        );
        if let Some(old) = manager.replace(AdvisoryLocks::new(config.clone()).start()) {
            old.send(pgcoord_actors::Shutdown).await?;
        }
        let manager = manager.as_ref().expect("just set");
        if let Some(placement) = placement {
            // The session is opened by the first lock, and reused for every later one.
            let ours = session_pid(&admin, manager).await?;
            let raw: i32 = admin
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0);
            let (client, backends) = placement.cores();
            placement::pin(0, client)?;
            placement::pin(raw, backends)?;
            placement::pin(ours, backends)?;
        }
        // Interleaved in blocks of 20, so both sides see the same machine and each runs in its
        // steady state: the first operation after a switch is slower.
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for block in 0..(pairs / repetitions).div_ceil(20) as i64 {
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
    if let Some(saved) = &saved {
        placement::restore(saved)?;
    }
    Ok(Repeated {
        raw_p50s,
        ours_p50s,
        ratios,
        raw_all,
        ours_all,
        hops,
        manager: manager.expect("at least one repetition"),
    })
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
    // whole connection's life (see `placement`): so the comparison is repeated with fresh
    // connections and a fresh runtime, with this thread and both sides' backends pinned to
    // cores, and the spread across repetitions is reported. Judged with client and backends on
    // separate cores (as on separate machines); one core is shown too.
    let repetitions = 2 * sizes.rounds + 1;
    let pinned = placement::available();
    let judged = pinned.then_some(Placement::SeparateCores);
    let runs = repeat(&config, judged, repetitions, sizes.pairs).await?;
    let where_ = judged.map_or("not pinned (one core only)", Placement::describe);
    let by_ratio = runs.by_ratio();
    let median = by_ratio[repetitions / 2];
    let advisory = report.time(
        &format!("advisory lock+unlock through the runtime, p50, the repetition with the median ratio of {repetitions}, {where_} (floor: the prepared raw pair)"),
        runs.ours_p50s[median],
        runs.raw_p50s[median],
    );
    report.target(
        "advisory lock+unlock p50 (median repetition, client and backends on separate cores): at most 1.5× the raw pair",
        format!("{advisory:.3}×"),
        advisory <= 1.5,
    );
    let (raw, ours) = (
        Samples::new(runs.raw_all.clone()),
        Samples::new(runs.ours_all.clone()),
    );
    report.time("advisory lock+unlock p99", ours.p(0.99), raw.p(0.99));
    let spread = |runs: &Repeated| {
        let by_ratio = runs.by_ratio();
        format!(
            "{:.2}× / {:.2}× / {:.2}×",
            runs.ratios[by_ratio[0]],
            runs.ratios[by_ratio[repetitions / 2]],
            runs.ratios[by_ratio[repetitions - 1]]
        )
    };
    report.note(
        &format!("advisory p50 ratio across {repetitions} repetitions (fresh connections), {where_}: min / median / max"),
        spread(&runs),
    );
    if pinned {
        let one_core = repeat(&config, Some(Placement::OneCore), repetitions, sizes.pairs).await?;
        let by_ratio = one_core.by_ratio();
        let median = by_ratio[repetitions / 2];
        report.time(
            &format!("advisory lock+unlock through the runtime, p50, the repetition with the median ratio, {} (floor: the prepared raw pair)", Placement::OneCore.describe()),
            one_core.ours_p50s[median],
            one_core.raw_p50s[median],
        );
        report.note(
            &format!(
                "advisory p50 ratio across {repetitions} repetitions, {}: min / median / max",
                Placement::OneCore.describe()
            ),
            spread(&one_core),
        );
        one_core.manager.send(pgcoord_actors::Shutdown).await?;
    }
    let hop = Samples::new(runs.hops.clone()).p(0.5);
    report.note(
        "advisory breakdown: one actor round trip without the database, p50",
        ms(hop),
    );
    // The runtime's share of a lock+unlock, in the median repetition: two messages to the actor
    // (lock, release), the session taken from and put back on its idle list, the guard; the
    // statements are the raw pair's own (one to lock, one to unlock, each on the lock's session).
    report.note(
        "advisory breakdown: what the runtime adds to the raw pair, p50 of the median repetition (pgcoord − raw)",
        ms(runs.ours_p50s[median].saturating_sub(runs.raw_p50s[median])),
    );
    report.note(
        "advisory breakdown: of which two actor round trips (lock, release), p50",
        ms(hop * 2),
    );
    let manager = runs.manager;
    let admin = pgcoord::db::connect_spawned(&config).await?;
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
