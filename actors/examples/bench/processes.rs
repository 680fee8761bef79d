//! A fleet of separate processes on one server with PostgreSQL's default `max_connections`
//! (100): 8 and 32 processes of one worker each; then 100 workers in 10 processes, first as one
//! shared manager per process (10 tasks on it), then as 10 managers per process (one each).
//! Connections used (the fleet's sessions, sampled from `pg_stat_activity`) and pairs/s of
//! distinct names. The 8 and 32 rows have two floors: as many raw clients in this process, and
//! as many raw client processes (what N processes on the machine cost apart from the runtime),
//! with each side's CPU time and wake-ups per pair; then a run of their own for the handoff of
//! one contended lease between the processes (release sent → the next holder granted, on the
//! machine's clock).
//!
//! The bench runs itself as the processes (`--fleet-child`): each waits for a start instant the
//! parent gives, runs for the given seconds and prints what it did.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{Acquire, LockManager};

use crate::Sizes;
use crate::leases::{Res, floor_clients};
use crate::report::{Report, Samples};

const TABLE: &str = "bench_fleet";

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// This process's CPU time (user + system, µs) and voluntary context switches so far.
fn usage() -> (i64, i64) {
    // SAFETY: a rusage is plain integers, for which all zeroes is a value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given, and only that.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let micros = |t: libc::timeval| t.tv_sec * 1_000_000 + t.tv_usec;
    (micros(u.ru_utime) + micros(u.ru_stime), u.ru_nvcsw)
}

/// One process of the fleet:
/// `--fleet-child DSN INDEX MANAGERS WORKERS POOL START_UNIX_MS SECONDS`. No managers: a raw
/// client of the floor; no workers: a contender for the handoff's one lease.
pub async fn child(args: &[String]) -> Res {
    let [dsn, index, managers, workers, pool, start, seconds] = args else {
        return Err(format!("--fleet-child: seven arguments, got {args:?}").into());
    };
    let pg: tokio_postgres::Config = dsn.parse()?;
    let (index, managers, pool) = (index.parse::<usize>()?, managers.parse()?, pool.parse()?);
    let workers: usize = workers.parse()?;
    let start = UNIX_EPOCH + Duration::from_millis(start.parse()?);
    let seconds = Duration::from_secs(seconds.parse()?);
    if managers == 0 {
        return raw_child(&pg, index, start, seconds).await;
    }
    let managers: Vec<Addr<LockManager>> = (0..managers)
        .map(|m| {
            let config = Config::builder()
                .pg_config(&pg)
                .owner(format!("proc{index}-{m}"))
                .application_name(format!("fleetproc-{index}-{m}"))
                .lock_table(TABLE)
                .lease(Duration::from_secs(20))
                .heartbeat(Duration::from_secs(5))
                .pool_size(pool)
                .build()?;
            Ok(LockManager::new(config).start())
        })
        .collect::<Res<_>>()?;
    // Warm, as the floor's clients are: each manager's pool connected and its statements
    // prepared before the clock starts. Where the server refuses the sessions (a fleet past
    // `max_connections`), the failures are the row's to count, not the warm-up's.
    for (m, manager) in managers.iter().enumerate() {
        let warm = Acquire::new(format!("fleet-warm-{index}-{m}")).timeout(Duration::from_secs(1));
        if let Ok(Ok(lease)) = manager.send(warm).await {
            let _ = lease.release().await;
        }
    }
    let wait = start.duration_since(SystemTime::now()).unwrap_or_default();
    let deadline = Instant::now() + wait + seconds;
    tokio::time::sleep(wait).await;
    let used = usage();
    let workers: Vec<_> = (0..workers)
        .map(|t| {
            let manager = managers[t % managers.len()].clone();
            actix_rt::spawn(async move {
                let (mut pairs, mut errors) = (0usize, 0usize);
                while Instant::now() < deadline {
                    let name = format!("fleet-{index}-{t}-{pairs}-{errors}");
                    let acquire = Acquire::new(name).timeout(Duration::from_secs(1));
                    let released = match manager.send(acquire).await.unwrap() {
                        Ok(lease) => lease.release().await.is_ok(),
                        Err(_) => false,
                    };
                    match released {
                        true => pairs += 1,
                        false => errors += 1,
                    }
                }
                (pairs, errors)
            })
        })
        .collect();
    // With no workers, one task contends for one lease with every other process. (Beside the
    // workers it would load them with what the floor has not: every release of it wakes every
    // process, whose attempt queues on the worker's one connection.)
    let handoffs = (workers.is_empty()).then(|| {
        actix_rt::spawn({
            let manager = managers[0].clone();
            async move {
                let mut lines = Vec::new();
                while Instant::now() < deadline {
                    let acquire = Acquire::new("fleet-handoff").timeout(Duration::from_secs(2));
                    let Ok(Ok(lease)) = manager.send(acquire).await else {
                        continue;
                    };
                    lines.push(format!("grant {} {}", lease.token(), unix_nanos()));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    lines.push(format!("release {} {}", lease.token(), unix_nanos()));
                    let _ = lease.release().await;
                }
                lines
            }
        })
    });
    let (mut pairs, mut errors) = (0, 0);
    for worker in workers {
        let (p, e) = worker.await?;
        pairs += p;
        errors += e;
    }
    let (cpu, switches) = usage();
    println!("pairs {pairs} {errors}");
    println!("usage {} {}", cpu - used.0, switches - used.1);
    for line in match handoffs {
        Some(handoffs) => handoffs.await?,
        None => Vec::new(),
    } {
        println!("{line}");
    }
    for manager in managers {
        let _ = manager.send(pgcoord_actors::Shutdown).await;
    }
    Ok(())
}

/// One process of the floor (`--fleet-child` with no managers): a raw client, pgcoord's acquire
/// and release statements back to back on one warm connection, no runtime in between.
async fn raw_child(
    pg: &tokio_postgres::Config,
    index: usize,
    start: SystemTime,
    seconds: Duration,
) -> Res {
    let config = Config::builder()
        .pg_config(pg)
        .owner(format!("raw{index}"))
        .application_name(format!("fleetproc-raw-{index}"))
        .lock_table(TABLE)
        .lease(Duration::from_secs(20))
        .build()?;
    let (client, connection) = pgcoord::__private::connect(&config).await?;
    tokio::spawn(connection);
    let client = pgcoord::__private::CachingClient::new(client, config.session_tls().clone());
    let table = pgcoord::LeaseTable::new(&config);
    let warm = format!("fleet-raw-warm-{index}");
    crate::fleet::raw_pair(&table, &client, &warm, config.lease(), false).await?;
    let wait = start.duration_since(SystemTime::now()).unwrap_or_default();
    let deadline = Instant::now() + wait + seconds;
    tokio::time::sleep(wait).await;
    let used = usage();
    let mut pairs = 0usize;
    while Instant::now() < deadline {
        let name = format!("fleet-raw-{index}-{pairs}");
        crate::fleet::raw_pair(&table, &client, &name, config.lease(), false).await?;
        pairs += 1;
    }
    let (cpu, switches) = usage();
    println!("pairs {pairs} 0");
    println!("usage {} {}", cpu - used.0, switches - used.1);
    Ok(())
}

/// What one run of the fleet did.
struct Outcome {
    pairs: usize,
    errors: usize,
    peak_connections: i64,
    handoffs: Vec<Duration>,
    /// The processes' CPU time (µs) and voluntary context switches while the clock ran.
    cpu_micros: i64,
    switches: i64,
}

/// The shape of one fleet: processes, and in each its managers, workers and pool size.
#[derive(Clone, Copy)]
struct Shape {
    processes: usize,
    managers: usize,
    workers: usize,
    pool: usize,
}

async fn fleet(
    server: &pgcoord_testkit::TempPostgres,
    admin: &tokio_postgres::Client,
    shape: Shape,
    seconds: u64,
) -> Res<Outcome> {
    let Shape {
        processes,
        managers,
        workers,
        pool,
    } = shape;
    // Time for every process to start and connect before the clock starts.
    let start = SystemTime::now() + Duration::from_secs(3);
    let start_ms = start.duration_since(UNIX_EPOCH)?.as_millis();
    let children: Vec<_> = (0..processes)
        .map(|index| {
            std::process::Command::new(std::env::current_exe()?)
                .arg("--fleet-child")
                .args([server.dsn(), index.to_string(), managers.to_string()])
                .arg(workers.to_string())
                .args([pool.to_string(), start_ms.to_string(), seconds.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let mut peak = 0;
    let end = Instant::now() + Duration::from_secs(3 + seconds);
    while Instant::now() < end {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fleetproc-%'";
        peak = peak.max(admin.query_one(sql, &[]).await?.get::<_, i64>(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut pairs, mut errors, mut cpu_micros, mut switches) = (0, 0, 0, 0);
    let (mut grants, mut releases) = (Vec::new(), Vec::new());
    for child in children {
        let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        if !output.status.success() {
            return Err(format!("a fleet process failed: {}", output.status).into());
        }
        for line in String::from_utf8(output.stdout)?.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["pairs", p, e] => {
                    (pairs, errors) = (pairs + p.parse::<usize>()?, errors + e.parse::<usize>()?)
                }
                ["usage", cpu, s] => {
                    cpu_micros += cpu.parse::<i64>()?;
                    switches += s.parse::<i64>()?;
                }
                ["grant", token, at] => grants.push((token.parse::<i64>()?, at.parse::<u128>()?)),
                ["release", token, at] => {
                    releases.push((token.parse::<i64>()?, at.parse::<u128>()?))
                }
                _ => return Err(format!("a fleet process said {line:?}").into()),
            }
        }
    }
    // Each grant follows the release of the token before it (tokens grow by one a term).
    releases.sort();
    let handoffs = grants
        .iter()
        .filter_map(|&(token, at)| {
            let previous = releases.binary_search_by_key(&(token - 1), |r| r.0).ok()?;
            let sent = releases[previous].1;
            (at >= sent).then(|| Duration::from_nanos((at - sent) as u64))
        })
        .collect();
    Ok(Outcome {
        pairs,
        errors,
        peak_connections: peak,
        handoffs,
        cpu_micros,
        switches,
    })
}

pub async fn run(sizes: &Sizes, report: &mut Report) -> Res {
    // PostgreSQL's default, not the throwaway cluster's 500.
    let server = tokio::task::spawn_blocking(|| {
        pgcoord_testkit::TempPostgres::start_with(&[("max_connections", "100")])
    })
    .await??;
    let pg = server.pg_config();
    let admin_cfg = Config::builder()
        .pg_config(&pg)
        .owner("fleet-admin")
        .lock_table(TABLE)
        .build()?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    let seconds = sizes.contend_secs;
    let one = |processes| Shape {
        processes,
        managers: 1,
        workers: 1,
        pool: 1,
    };
    let ten = |managers, pool| Shape {
        processes: 10,
        managers,
        workers: 10,
        pool,
    };
    for (what, shape) in [
        ("8 processes, one worker each (pool 1)", one(8)),
        ("32 processes, one worker each (pool 1)", one(32)),
        (
            "10 processes, 100 workers: one manager each (pool 2) shared by its 10 workers",
            ten(1, 2),
        ),
        (
            "10 processes, 100 workers: 10 managers each (pool 1), one per worker",
            ten(10, 1),
        ),
    ] {
        // The floor: as many raw clients as processes, pgcoord's statements back to back, for
        // as long as the fleet runs (a short floor would leave out the dead rows that its
        // deletes pile up, which the fleet pays for): a short run sizes it.
        let raw = floor_clients(&admin_cfg, shape.processes).await?;
        let pairs = (sizes.pairs * 2).max(shape.processes * 32);
        let (n, took) = crate::fleet::floor_rate(&admin_cfg, &raw, pairs, false, 0).await?;
        let pairs = (n as f64 / took.as_secs_f64() * seconds as f64) as usize;
        let pairs = pairs.max(shape.processes);
        let (n, took) = crate::fleet::floor_rate(&admin_cfg, &raw, pairs, false, 1).await?;
        let floor = n as f64 / took.as_secs_f64();
        drop(raw);
        let out = fleet(&server, &admin, shape, seconds).await?;
        let label = format!("fleet on max_connections 100, {what}");
        let rate = out.pairs as f64 / seconds as f64;
        let floor_is = format!("floor: {} raw clients in one process", shape.processes);
        report.rate(
            &format!("{label}: pairs/s ({floor_is})"),
            rate,
            floor,
            "pairs/s",
        );
        // The same floor as as many processes, one raw client each: what N processes on the
        // machine cost apart from what the runtime costs.
        if shape.workers == 1 {
            let raw = Shape {
                managers: 0,
                ..shape
            };
            let floor = fleet(&server, &admin, raw, seconds).await?;
            let floor_is = format!("floor: {} raw client processes", shape.processes);
            let floor_rate = floor.pairs as f64 / seconds as f64;
            report.rate(
                &format!("{label}: pairs/s ({floor_is})"),
                rate,
                floor_rate,
                "pairs/s",
            );
            // Where a process's pair goes: its own CPU, and how often it slept (each sleep a
            // wake-up the machine's scheduler must give it, behind every other process).
            let per_pair = |o: &Outcome| {
                let pairs = o.pairs.max(1) as f64;
                let (cpu, switches) = (o.cpu_micros as f64, o.switches as f64);
                format!(
                    "{:.0} µs CPU, {:.2} wake-ups",
                    cpu / pairs,
                    switches / pairs
                )
            };
            report.note(
                &format!(
                    "{label}: per pair, in the fleet's processes / in the raw client processes"
                ),
                format!("{} / {}", per_pair(&out), per_pair(&floor)),
            );
        }
        let managers = shape.processes * shape.managers;
        let handoffs = match shape.workers {
            1 => {
                fleet(
                    &server,
                    &admin,
                    Shape {
                        workers: 0,
                        ..shape
                    },
                    seconds,
                )
                .await?
                .handoffs
            }
            _ => Vec::new(),
        };
        report.note(
            &format!("{label}: the fleet's sessions at most; acquires that failed"),
            format!(
                "{} (at most {managers} × (pool + 2) = {}); {} failed",
                out.peak_connections,
                managers * (shape.pool + 2),
                out.errors
            ),
        );
        if !handoffs.is_empty() {
            let handoffs = Samples::new(handoffs);
            report.note(
                &format!("{label}: one lease contended by every process, release sent → next holder, p50 / p99"),
                format!(
                    "{} / {}",
                    crate::report::ms(handoffs.p(0.5)),
                    crate::report::ms(handoffs.p(0.99))
                ),
            );
        }
    }
    Ok(())
}
