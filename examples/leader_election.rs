//! Leader election: three candidates, one leader at a time; a leader proclaims a new value,
//! resigns and hands over at once; an observer prints every change of leader in term order.
//!
//! Run with `cargo run --example leader_election`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, schema};
use pgcoord_actors::{Coordinator, LeaderChanged};

/// Prints what the observer is told.
struct Printer(Instant);

impl Actor for Printer {
    type Context = Context<Self>;
}

impl Handler<LeaderChanged> for Printer {
    type Result = ();

    fn handle(&mut self, change: LeaderChanged, _: &mut Context<Self>) {
        let at = self.0.elapsed().as_secs_f64() * 1000.0;
        match change.leader {
            Some(l) => println!(
                "{at:8.1} ms  observer: {} leads (token {}), value {:?}",
                l.owner,
                l.token,
                String::from_utf8_lossy(&l.value)
            ),
            None => println!("{at:8.1} ms  observer: nobody leads"),
        }
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| Config::builder().pg_config(&pg).owner(owner).build();
    schema::migrate(
        &pgcoord::db::connect_spawned(&config("setup")?).await?,
        &config("setup")?,
    )
    .await?;
    // Each candidate stands for a process of its own: its own Coordinator (pool, listener).
    let watcher = Coordinator::connect(config("watcher")?).await?;
    let started = Instant::now();
    watcher
        .election("scheduler")?
        .observe(Printer(started).start().recipient());

    let candidates: Vec<_> = (1..=3)
        .map(|n| {
            let config = config(&format!("node-{n}"));
            actix_rt::spawn(async move {
                let election = Coordinator::connect(config?).await?.election("scheduler")?;
                let address = format!("10.0.0.{n}:8080");
                let mut term = election.campaign(address.clone(), None).await?;
                let at = started.elapsed().as_secs_f64() * 1000.0;
                println!("{at:8.1} ms  node-{n} elected, token {}", term.token());
                tokio::time::sleep(Duration::from_millis(100)).await;
                term.proclaim(format!("{address} (warm)")).await?; // no new election
                tokio::time::sleep(Duration::from_millis(100)).await;
                term.resign().await?; // the next candidate takes over at once
                Ok::<_, pgcoord::Error>(())
            })
        })
        .collect();
    for candidate in candidates {
        candidate.await??;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("all three led in turn; nobody leads now");
    Ok(())
}
