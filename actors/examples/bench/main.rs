//! The benchmark: every pgcoord figure next to a raw SQL floor measured in the same run.
//!
//! Run with `cargo run --release -p pgcoord-actors --example bench`. Options:
//! `--quick` (tiny sizes, a smoke run), `--only leases|held|fleet|election|routing|advisory|signals|topics|rates|schedules|view|faults` (held: the held leases' part of leases alone; election includes semaphores and worker pools; fleet the host application's throughput beside pgcoord and a fleet of 10 processes), sizes one by one
//! (`--pairs N`, `--seconds N` of contention, `--held N` leases, `--requests N`, `--fanout N`, `--backlog N` events of the topic catch-up,
//! `--rounds N` of server restarts and of advisory repetitions),
//! `--write PATH` (also write the table, with the machine described, as markdown;
//! docs/BENCHMARKS.md is made this way). Uses `DATABASE_URL` when set, else a throwaway PostgreSQL.
//! `CONTENDERS=N` runs the contended handoff with N managers instead of 8.

mod batches;
mod catch_up;
mod counting;
mod cpu;
mod durable_appends;
mod election;
mod faults;
mod fleet;
mod held;
mod host;
mod leases;
mod locks;
mod placement;
mod poll_only;
mod processes;
mod rates;
mod report;
mod routing;
mod schedules;
mod semaphore;
mod signals;
mod topics;
mod unlogged;
mod view;
mod workers;

use std::time::Duration;

use report::Report;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// Sizes of one run.
pub struct Sizes {
    pub pairs: usize,
    pub contend_secs: u64,
    pub held: usize,
    pub requests: usize,
    pub fanout: usize,
    pub backlog: usize,
    pub rounds: usize,
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Diagnostics on request only: logging would slow what is measured.
    if let Ok(filter) = std::env::var("RUST_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let args: Vec<String> = std::env::args().collect();
    // One process of the fleet section, run by the bench itself.
    if args.get(1).is_some_and(|a| a == "--fleet-child") {
        return processes::child(&args[2..]).await;
    }
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let quick = args.iter().any(|a| a == "--quick");
    let only = arg("--only");
    let mut sizes = if quick {
        Sizes {
            pairs: 100,
            contend_secs: 1,
            held: 500,
            requests: 50,
            fanout: 2_000,
            backlog: 2_000,
            rounds: 2,
        }
    } else {
        Sizes {
            pairs: 2_000,
            contend_secs: 5,
            held: 10_000,
            requests: 1_000,
            fanout: 50_000,
            backlog: 1_000_000,
            rounds: 5,
        }
    };
    // Any size can be set on its own: --pairs, --seconds, --held, --requests, --fanout, --backlog,
    // --rounds.
    let size =
        |name: &str| arg(name).map(|v| v.parse::<usize>().map_err(|e| format!("{name} {v}: {e}")));
    if let Some(n) = size("--pairs").transpose()? {
        sizes.pairs = n.max(8);
    }
    if let Some(n) = size("--seconds").transpose()? {
        sizes.contend_secs = n as u64;
    }
    if let Some(n) = size("--held").transpose()? {
        sizes.held = n.max(1);
    }
    if let Some(n) = size("--requests").transpose()? {
        sizes.requests = n.max(1);
    }
    if let Some(n) = size("--fanout").transpose()? {
        sizes.fanout = n.max(1);
    }
    if let Some(n) = size("--backlog").transpose()? {
        sizes.backlog = n.max(1);
    }
    if let Some(n) = size("--rounds").transpose()? {
        sizes.rounds = n.max(1);
    }
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let mut report = Report::new(&pg).await?;
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if only.as_deref() == Some("held") {
        // The held leases alone, on fresh tables.
        let (lease, beat) = (Duration::from_secs(20), Duration::from_secs(5));
        let admin_cfg = leases::config(&pg, "admin", lease, beat);
        let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
        pgcoord::schema::drop_tables(&admin, &admin_cfg).await?;
        pgcoord::schema::migrate(&admin, &admin_cfg).await?;
        held::run(&pg, &sizes, &mut report).await?;
    }
    if run("leases") {
        leases::run(&pg, &sizes, &mut report).await?;
        poll_only::run(&pg, &sizes, &mut report).await?;
        held::run(&pg, &sizes, &mut report).await?;
        let (lease, heartbeat) = (Duration::from_secs(20), Duration::from_secs(5));
        batches::run(
            &leases::config(&pg, "batches", lease, heartbeat),
            &mut report,
        )
        .await?;
        unlogged::run(&pg, &sizes, &mut report).await?;
    }
    if run("fleet") {
        fleet::run(&pg, &sizes, &mut report).await?;
        processes::run(&sizes, &mut report).await?;
        host::run(&pg, &sizes, &mut report).await?;
    }
    if run("election") {
        election::run(&pg, &sizes, &mut report).await?;
        semaphore::run(&pg, &sizes, &mut report).await?;
        workers::run(&pg, &sizes, &mut report).await?;
    }
    if run("routing") {
        routing::run(&pg, &sizes, &mut report).await?;
    }
    if run("advisory") {
        locks::run(&pg, &sizes, &mut report).await?;
    }
    if run("signals") {
        signals::run(&pg, &sizes, &mut report).await?;
    }
    if run("topics") {
        topics::run(&pg, &sizes, &mut report).await?;
        durable_appends::run(&pg, &sizes, &mut report).await?;
    }
    if run("rates") {
        rates::run(&pg, &sizes, &mut report).await?;
    }
    if run("schedules") {
        schedules::run(&pg, &sizes, &mut report).await?;
    }
    if run("view") {
        view::run(&pg, &sizes, &mut report).await?;
    }
    if run("faults") {
        faults::run(&pg, &sizes, &mut report).await?;
    }
    report.print();
    if let Some(path) = arg("--write") {
        report.write(&path)?;
        println!("written to {path}");
    }
    Ok(())
}
