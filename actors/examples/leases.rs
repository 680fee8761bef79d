//! Leases in one minute: two lock managers (as two processes would run) contend for a leader
//! lease, with data, a fencing guard, a takeover and a loss report.
//!
//! Run with `cargo run -p pgcoord-actors --example leases`. Uses `DATABASE_URL` when set, else
//! a throwaway PostgreSQL from the locally installed server binaries.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Config, schema};
use pgcoord_actors::{Acquire, LockManager};

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| {
        let (lease, heartbeat) = (Duration::from_secs(2), Duration::from_millis(500));
        Config::builder()
            .pg_config(&pg)
            .owner(owner)
            .lease(lease)
            .heartbeat(heartbeat)
            .build()
    };
    let alice = config("alice")?;
    let mut client = pgcoord::db::connect_spawned(&alice).await?;
    schema::migrate(&client, &alice).await?;
    let (a, b) = (
        LockManager::new(alice.clone()).start(),
        LockManager::new(config("bob")?).start(),
    );

    let leader = a
        .send(
            Acquire::new("leader")
                .data(b"alice at 10.0.0.1".to_vec())
                .keep_on_release(),
        )
        .await??;
    println!("alice leads with fencing token {}", leader.token());
    let refused = b
        .send(Acquire::new("leader").fail_if_locked())
        .await?
        .unwrap_err();
    println!("bob, fail-if-locked: {refused}");

    // Writes guarded by the fencing token are exclusive, even against a stale leader.
    let tx = client.transaction().await?;
    leader.fence(&tx).await?;
    tx.commit().await?;
    println!("alice's guarded transaction committed");

    let waiting = b.send(Acquire::new("leader").timeout(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "alice still leads after 3 s of heartbeats: {:?}",
        pgcoord::LeaseTable::new(&alice)
            .get(&client, "leader")
            .await?
            .owner
    );
    leader.release().await?;
    let bob = waiting.await??;
    println!(
        "bob took over at once with token {}, data {:?}",
        bob.token(),
        String::from_utf8_lossy(bob.data().unwrap_or_default())
    );
    bob.release().await?;
    Ok(())
}
