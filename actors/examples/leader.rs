//! Leader election: three candidates campaign for one lease; the leader works while it holds it,
//! and when it steps down (or loses the lease) another takes over at once.
//!
//! Run with `cargo run -p pgcoord-actors --example leader`. Uses `DATABASE_URL` when set, else a
//! throwaway PostgreSQL from the locally installed server binaries.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{Acquire, LockManager};

/// Campaigns until elected, leads for `term`, steps down; `terms` times.
async fn candidate(name: &'static str, manager: Addr<LockManager>, terms: u32) {
    for _ in 0..terms {
        let lease = match manager.send(Acquire::new("leader").data(name)).await {
            Ok(Ok(lease)) => lease,
            other => return eprintln!("{name}: campaign failed: {other:?}"),
        };
        println!("{name} elected (token {})", lease.token());
        // Lead until the term ends, or stop at once if the lease is lost.
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(300)) => {
                println!("{name} steps down");
                let _ = lease.release().await;
            }
            reason = lease.lost() => println!("{name} lost leadership: {reason:?}"),
        }
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| {
        Config::builder()
            .pg_config(&pg)
            .owner(owner)
            .lease(Duration::from_secs(2))
            .heartbeat(Duration::from_millis(500))
            .build()
    };
    let admin = pgcoord::db::connect_spawned(&config("admin")?).await?;
    pgcoord::schema::migrate(&admin, &config("admin")?).await?;
    let campaigns: Vec<_> = ["ada", "grace", "edsger"]
        .into_iter()
        .map(|name| {
            let manager = LockManager::new(config(name).unwrap()).start();
            actix_rt::spawn(candidate(name, manager, 2))
        })
        .collect();
    for campaign in campaigns {
        campaign.await?;
    }
    Ok(())
}
