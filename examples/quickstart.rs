//! Quickstart: the tour of pgcoord — schema, a lease with its fencing token and a lost lease, an
//! advisory lock, an event and a request/reply round trip, all through one `Coordinator`.
//!
//! Run with `cargo run --example quickstart`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use std::time::Duration;

use pgcoord::{Config, schema};
use pgcoord_actors::{Acquire, AdvisoryLock, Coordinator, Heard, Publish, RunNow, Serve};

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (server, pg) = pgcoord_testkit::from_env_or_start()?;
    if let Some(server) = &server {
        println!("started a throwaway PostgreSQL on port {}", server.port());
    }
    let config = Config::builder().pg_config(&pg).build()?;
    let mut client = pgcoord::db::connect_spawned(&config).await?;
    schema::migrate(&client, &config).await?;
    println!(
        "schema applied: {} and {}",
        config.lock_table(),
        config.payload_table()
    );
    // The start that can fail: checks the server (reachable, writable, migrated) first.
    let coord = Coordinator::connect(config.clone()).await?;

    // A lease: named, kept alive by heartbeats, with a fencing token.
    let lease = coord
        .locks()
        .unwrap()
        .send(Acquire::new("leader").data(b"node-1".to_vec()))
        .await??;
    println!(
        "lease {:?} held by {}, token {}",
        lease.name(),
        config.owner(),
        lease.token()
    );
    let tx = client.transaction().await?;
    lease.fence(&tx).await?; // fails unless the lease is still ours; holds off takeover
    tx.commit().await?;
    let other = Coordinator::start(
        Config::builder()
            .pg_config(&pg)
            .owner("someone-else")
            .build()?,
    );
    let refused = other
        .locks()
        .unwrap()
        .send(Acquire::new("leader").fail_if_locked())
        .await?
        .unwrap_err();
    println!("a second owner, fail-if-locked: {refused}");
    lease.release().await?;

    // A loss: an operator frees a lease by hand; the holder learns at its next renewal.
    let lease = coord
        .locks()
        .unwrap()
        .send(Acquire::new("report"))
        .await??;
    let table = config.lock_table().quoted();
    client
        .execute(&format!("DELETE FROM {table} WHERE name = 'report'"), &[])
        .await?;
    coord.locks()?.send(RunNow).await??;
    println!("lease {:?} lost: {:?}", lease.name(), lease.lost().await);

    // An advisory lock on a dedicated, pinged session.
    let key = pgcoord::advisory::key_for_name("nightly-report");
    let guard = coord
        .advisory()
        .unwrap()
        .send(AdvisoryLock::new(key))
        .await??;
    println!("advisory lock {key} held");
    guard.release().await?; // or drop it

    // An event, and a request answered by the other "process".
    let mut greetings = coord.subscribe("greetings").await?; // listening once it answers
    other
        .signals()
        .unwrap()
        .send(Publish::value("greetings", "hello")?)
        .await??;
    if let Some(Heard::Signal(greeting)) = greetings.next().await {
        println!("event received: {:?}", greeting.value::<String>()?);
    }

    other
        .signals()
        .unwrap()
        .send(Serve::typed("double", |n: i64| async move {
            Ok::<_, String>(n * 2)
        }))
        .await??;
    let request = pgcoord_actors::Ask::value("double", &21i64)?.timeout(Duration::from_secs(5));
    let reply: i64 = coord.ask_returning(request).await?;
    println!("request/reply: 21 doubled is {reply}");
    Ok(())
}
