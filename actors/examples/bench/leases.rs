//! Lease workloads: acquire+release (1, 8 and 64 clients), contended handoff and fairness,
//! takeover past expiry. Many held leases (the 10,000-lease claim, memory, the heartbeat) are in
//! `held`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::__private::CachingClient;
use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Acquire, GetStats, LockManager};

use crate::Sizes;
use crate::cpu::{CpuMark, CpuUse};
use crate::report::{Report, Samples, ms};

pub(crate) type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// When the last release was sent, and when it was answered.
type ReleaseTimes = (Instant, Option<Instant>);

pub(crate) fn config(
    pg: &tokio_postgres::Config,
    owner: &str,
    lease: Duration,
    heartbeat: Duration,
) -> Config {
    Config::builder()
        .pg_config(pg)
        .owner(owner)
        .lock_table("bench_locks")
        .lease(lease)
        .heartbeat(heartbeat)
        .pool_size(16)
        .build()
        .unwrap()
}

/// One raw acquire and release of `name`, which must be free: the floor's unit of work.
pub(crate) async fn raw_pair(
    table: &LeaseTable,
    client: &CachingClient,
    name: &str,
    lease: Duration,
) -> Res {
    let owner = table.owner("raw")?;
    let Attempt::Granted(g) = owner
        .try_acquire(client, &AcquireRequest::new(name), lease)
        .await?
    else {
        return Err(format!("the raw floor's lease {name} is not free").into());
    };
    let keep = false;
    let release = ReleaseRequest {
        name,
        token: g.token,
        keep,
        announce_always: false,
    };
    // Nobody waits for the floor's names: the release statement alone, as a raw client's.
    owner.release(client, &release).await?;
    Ok(())
}

/// Connections for the raw floor, opened and warmed (statements prepared) before any clock
/// starts: a floor is the best the raw statements can do.
pub(crate) async fn floor_clients(cfg: &Config, clients: usize) -> Res<Vec<Arc<CachingClient>>> {
    let table = LeaseTable::new(cfg);
    let mut opened = Vec::new();
    for c in 0..clients {
        let (client, connection) = pgcoord::__private::connect(cfg).await?;
        tokio::spawn(connection);
        let client = CachingClient::new(client, cfg.session_tls().clone());
        raw_pair(&table, &client, &format!("warm-{c}"), cfg.lease()).await?;
        opened.push(Arc::new(client));
    }
    Ok(opened)
}

/// The raw floor: pgcoord's own acquire and release statements, prepared, back to back on one
/// warm connection per client, all clients at once, with no runtime in between.
pub(crate) async fn floor(
    cfg: &Config,
    clients: &[Arc<CachingClient>],
    pairs: usize,
) -> Res<(Duration, Vec<Duration>)> {
    let table = Arc::new(LeaseTable::new(cfg));
    let per_client = pairs / clients.len();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (table, lease, client) = (table.clone(), cfg.lease(), client.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            for i in 0..per_client {
                let t = Instant::now();
                let name = format!("raw-{c}-{i}");
                raw_pair(&table, &client, &name, lease).await.unwrap();
                samples.push(t.elapsed());
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    Ok((started.elapsed(), all))
}

pub(crate) async fn through_manager(
    manager: &Addr<LockManager>,
    clients: usize,
    pairs: usize,
) -> Res<(Duration, Vec<Duration>)> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let manager = manager.clone();
            actix_rt::spawn(async move {
                let mut samples = Vec::new();
                for i in 0..pairs / clients {
                    let t = Instant::now();
                    let lease = manager
                        .send(Acquire::new(format!("u-{c}-{i}")))
                        .await
                        .unwrap()
                        .unwrap();
                    lease.release().await.unwrap();
                    samples.push(t.elapsed());
                }
                samples
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    Ok((started.elapsed(), all))
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let (lease, beat) = (Duration::from_secs(20), Duration::from_secs(5));
    let admin_cfg = config(pg, "admin", lease, beat);
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::drop_tables(&admin, &admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;

    let select_one = admin.prepare("SELECT 1").await?;
    let t = Instant::now();
    for _ in 0..sizes.pairs {
        admin.query_one(&select_one, &[]).await?;
    }
    report.note(
        "floor: prepared `SELECT 1` round trip",
        ms(t.elapsed() / sizes.pairs as u32),
    );

    let manager = LockManager::new(config(pg, "bench", lease, beat)).start();
    let mut one_client_floor = None;
    for clients in [1, 8, 64] {
        // Alternate rounds of floor and pgcoord, so both see the same (shared, noisy) machine.
        let (mut floor_time, mut floor_samples, mut time, mut samples) =
            (Duration::ZERO, Vec::new(), Duration::ZERO, Vec::new());
        let raw = floor_clients(&admin_cfg, clients).await?;
        // Enough pairs per client to reach a steady state.
        let pairs = sizes.pairs.max(clients * 16);
        let (mut floor_cpu, mut cpu) = (CpuUse::default(), CpuUse::default());
        for _ in 0..4 {
            let mark = CpuMark::now();
            let (t, s) = floor(&admin_cfg, &raw, pairs / 4).await?;
            mark.add_since(&mut floor_cpu);
            floor_time += t;
            floor_samples.extend(s);
            let mark = CpuMark::now();
            let (t, s) = through_manager(&manager, clients, pairs / 4).await?;
            mark.add_since(&mut cpu);
            time += t;
            samples.extend(s);
        }
        let floor_rate = floor_samples.len() as f64 / floor_time.as_secs_f64();
        let rate = samples.len() as f64 / time.as_secs_f64();
        let (floor, ours) = (Samples::new(floor_samples), Samples::new(samples));
        report.rate(
            &format!("lease acquire+release, {clients} client(s)"),
            rate,
            floor_rate,
            "pairs/s",
        );
        if clients == 1 {
            report.target(
                "1 client: at most 1.2× the raw pair's time (pairs/s of the floor ÷ pgcoord's)",
                format!("{:.3}×", floor_rate / rate),
                floor_rate <= 1.2 * rate,
            );
        }
        if clients == 8 {
            report.target(
                "8 clients: at least 2× the unbatched raw floor's rate, on the throwaway cluster \
                 (`fsync` and `synchronous_commit` off: commits cost nothing, see notes)",
                format!("{:.3}×", rate / floor_rate),
                rate >= 2.0 * floor_rate,
            );
        }
        report.time(
            &format!("lease acquire+release, {clients} client(s), p50"),
            ours.p(0.5),
            floor.p(0.5),
        );
        report.time(
            &format!("lease acquire+release, {clients} client(s), p99"),
            ours.p(0.99),
            floor.p(0.99),
        );
        if clients > 1 {
            let pairs = pairs as u32;
            report.time(
                &format!("lease acquire+release, {clients} client(s): this process's CPU per pair"),
                cpu.process / pairs,
                floor_cpu.process / pairs,
            );
            report.note(
                &format!("lease acquire+release, {clients} client(s): machine busy (2 cores shared with the server), pgcoord / floor"),
                format!("{:.0}% / {:.0}%", cpu.machine_busy(), floor_cpu.machine_busy()),
            );
            report.rate(
                &format!("lease acquire+release, {clients} client(s): pairs per second of the machine's CPU (server and clients)"),
                rate / cpu.machine_cores_used(),
                floor_rate / floor_cpu.machine_cores_used(),
                "pairs/CPU-s",
            );
        }
        one_client_floor.get_or_insert(floor);
    }
    let floor = one_client_floor.expect("measured above");

    // Contended handoff: 8 managers, as 8 processes would, loop on one name. Each handoff is
    // timed from the release being sent, and split at the release's answer.
    let released_at: Arc<Mutex<Option<ReleaseTimes>>> = Arc::default();
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let stop = Instant::now() + Duration::from_secs(sizes.contend_secs);
    let contenders: usize = std::env::var("CONTENDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let managers: Vec<_> = (0..contenders)
        .map(|c| LockManager::new(config(pg, &format!("contender-{c}"), lease, beat)).start())
        .collect();
    let mut attempts_before = 0;
    for manager in &managers {
        attempts_before += manager.send(GetStats::new()).await?.acquire_statements;
    }
    let tasks: Vec<_> = managers
        .iter()
        .map(|manager| {
            let manager = manager.clone();
            let (released_at, handoffs) = (released_at.clone(), handoffs.clone());
            actix_rt::spawn(async move {
                let mut count = 0u32;
                while Instant::now() < stop {
                    let lease = manager
                        .send(Acquire::new("contended"))
                        .await
                        .unwrap()
                        .unwrap();
                    let now = Instant::now();
                    if let Some((sent, Some(answered))) = released_at.lock().unwrap().take() {
                        handoffs.lock().unwrap().push((now - sent, answered - sent));
                    }
                    count += 1;
                    *released_at.lock().unwrap() = Some((Instant::now(), None));
                    lease.release().await.unwrap();
                    if let Some((_, answered)) = released_at.lock().unwrap().as_mut() {
                        *answered = Some(Instant::now());
                    }
                }
                count
            })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await?);
    }
    let mut attempts = 0;
    for manager in &managers {
        attempts += manager.send(GetStats::new()).await?.acquire_statements;
    }
    let (handoffs, release_parts): (Vec<_>, Vec<_>) = Arc::try_unwrap(handoffs)
        .unwrap()
        .into_inner()?
        .into_iter()
        .unzip();
    let measured = handoffs.len();
    let (handoffs, release_parts) = (Samples::new(handoffs), Samples::new(release_parts));
    let handoff = report.time(
        "handoff, release sent → next holder, p50 (floor: one acquire+release)",
        handoffs.p(0.5),
        floor.p(0.5),
    );
    report.target(
        "handoff p50: at most 2.5× one acquire+release pair",
        format!("{handoff:.3}×"),
        handoff <= 2.5,
    );
    report.time("handoff p99", handoffs.p(0.99), floor.p(0.99));
    report.note("handoff max", ms(handoffs.max()));
    report.note(
        "handoff breakdown: the release statement (sent → answered), p50",
        ms(release_parts.p(0.5)),
    );
    report.note(
        "handoff breakdown: answered → announced, heard, woken, granted, p50 (difference of p50s)",
        ms(handoffs.p(0.5).saturating_sub(release_parts.p(0.5))),
    );
    let total: u32 = counts.iter().sum();
    report.note(
        "handoff breakdown: acquire statements per acquisition, all 8 managers",
        format!(
            "{:.2} ({measured} handoffs)",
            (attempts - attempts_before) as f64 / f64::from(total.max(1))
        ),
    );
    let mean = counts.iter().sum::<u32>() as f64 / counts.len() as f64;
    let min = *counts.iter().min().unwrap() as f64;
    report.note(
        "fairness: acquisitions per contender, min ÷ mean",
        format!("{:.2} ({counts:?})", min / mean),
    );
    report.target(
        "fairness: the fewest acquisitions of a contender at least 0.9× the mean",
        format!("{:.2}", min / mean),
        min / mean >= 0.9,
    );

    // Takeover: a holder that never renews; how long past its expiry a waiter gets the lease.
    let short = Duration::from_millis(500);
    let table = LeaseTable::new(&admin_cfg);
    let taker = LockManager::new(config(pg, "taker", short * 4, short)).start();
    let mut late = Vec::new();
    for i in 0..3 {
        let name = format!("takeover-{i}");
        let granted = Instant::now();
        let Attempt::Granted(_) = table
            .owner("frozen")?
            .try_acquire(&admin, &AcquireRequest::new(&name), short)
            .await?
        else {
            panic!("free")
        };
        let lease = taker.send(Acquire::new(&name)).await??;
        late.push(granted.elapsed().saturating_sub(short));
        lease.release().await?;
    }
    report.note(
        "takeover after the holder stops renewing: time past expiry, worst of 3",
        ms(*late.iter().max().unwrap()),
    );
    Ok(())
}
