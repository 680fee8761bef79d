//! The unlogged lock table next to the logged one, each against its own raw floor.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::LockManager;

use crate::Sizes;
use crate::leases::{Res, floor, floor_clients, through_manager};
use crate::report::Report;

/// The unlogged lock table next to the logged one, 1 and 8 clients, with durable commits: what an
/// unlogged table saves is the WAL flush of each commit, which the throwaway cluster (fsync
/// off) does not pay. So this part runs on a cluster of its own with `fsync=on` and
/// `synchronous_commit=on` — or on `DATABASE_URL`'s server with `synchronous_commit=on` for
/// these sessions.
pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let (_server, durable) = durable_server(pg).await?;
    let mut floors = Vec::new();
    for (unlogged, table) in [(false, "bench_logged"), (true, "bench_unlogged")] {
        let cfg = Config::builder()
            .pg_config(&durable)
            .owner("bench")
            .lock_table(table)
            .payload_table(format!("{table}_payloads"))
            .unlogged_lock_table(unlogged)
            .pool_size(16)
            .build()?;
        let admin = pgcoord::db::connect_spawned(&cfg).await?;
        pgcoord::schema::drop_tables(&admin, &cfg).await?;
        pgcoord::schema::migrate(&admin, &cfg).await?;
        let manager = LockManager::new(cfg.clone()).start();
        for clients in [1, 8] {
            let raw = floor_clients(&cfg, clients).await?;
            let (mut floor_time, mut floor_pairs, mut time, mut pairs) =
                (Duration::ZERO, 0, Duration::ZERO, 0);
            for _ in 0..4 {
                let (t, s) = floor(&cfg, &raw, sizes.pairs / 4).await?;
                (floor_time, floor_pairs) = (floor_time + t, floor_pairs + s.len());
                let (t, s) = through_manager(&manager, clients, sizes.pairs / 4).await?;
                (time, pairs) = (time + t, pairs + s.len());
            }
            let floor_rate = floor_pairs as f64 / floor_time.as_secs_f64();
            let kind = if unlogged { "unlogged" } else { "logged" };
            let rate = pairs as f64 / time.as_secs_f64();
            report.rate(
                &format!("lease acquire+release, {clients} client(s), fsync and synchronous_commit on, {kind} lock table"),
                rate,
                floor_rate,
                "pairs/s",
            );
            if clients == 8 && !unlogged {
                report.target(
                    "8 clients: at least 2× the unbatched raw floor's rate, with durable commits \
                     (`fsync` and `synchronous_commit` on, the default lock table): the one judged, \
                     see notes",
                    format!("{:.3}×", rate / floor_rate),
                    rate >= 2.0 * floor_rate,
                );
            }
            if clients == 1 {
                floors.push(floor_rate);
            }
        }
        manager.send(pgcoord_actors::Shutdown).await?;
        pgcoord::schema::drop_tables(&admin, &cfg).await?;
    }
    report.note(
        "unlogged ÷ logged lock table, raw floor rate, fsync and synchronous_commit on",
        format!("{:.2}×", floors[1] / floors[0]),
    );
    Ok(())
}

/// A server whose commits wait for the disk: a cluster of its own with `fsync` and
/// `synchronous_commit` on (kept while the first value lives), or `DATABASE_URL`'s server
/// with `synchronous_commit` on for the sessions of the settings returned.
pub async fn durable_server(
    pg: &tokio_postgres::Config,
) -> Res<(
    Option<pgcoord_testkit::TempPostgres>,
    tokio_postgres::Config,
)> {
    let settings = [
        ("fsync", "on"),
        ("synchronous_commit", "on"),
        ("full_page_writes", "on"),
    ];
    let (server, mut durable) = match std::env::var("DATABASE_URL") {
        Ok(_) => (None, pg.clone()),
        Err(_) => {
            let start = move || pgcoord_testkit::TempPostgres::start_with(&settings);
            let server = tokio::task::spawn_blocking(start).await??;
            let pg = server.pg_config();
            (Some(server), pg)
        }
    };
    durable.options("-c synchronous_commit=on");
    Ok((server, durable))
}
