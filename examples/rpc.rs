//! Typed request/reply between two processes: this program starts a second copy of itself that
//! serves `quote` requests, asks it three times, and tells it to stop.
//!
//! Run with `cargo run --example rpc`. It uses `DATABASE_URL` when set, and otherwise starts a
//! throwaway PostgreSQL from the locally installed server binaries (removed on exit); the second
//! process gets its address through `DATABASE_URL`.

use std::time::Duration;

use pgcoord::{Config, schema};
use pgcoord_actors::{Ask, Coordinator, Heard, Publish, Serve};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Quote {
    item: String,
    quantity: u32,
}

#[derive(Serialize, Deserialize, Debug)]
struct Price {
    cents: u64,
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "serve") {
        return serve().await;
    }
    let (server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = Config::builder().pg_config(&pg).owner("client").build()?;
    schema::migrate(&pgcoord::db::connect_spawned(&config).await?, &config).await?;
    let coord = Coordinator::connect(config).await?;

    let mut ready = coord.subscribe("rpc_ready").await?; // listening once it answers
    let dsn = match &server {
        Some(server) => server.dsn(),
        None => std::env::var("DATABASE_URL")?,
    };
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("serve")
        .env("DATABASE_URL", dsn)
        .spawn()?;
    // The message, or a gap in which it may have been: either way ask (each ask has a deadline).
    ready.next().await;
    for (item, quantity) in [("apple", 3), ("pear", 10), ("plum", 1)] {
        let quote = Quote {
            item: item.into(),
            quantity,
        };
        let ask = Ask::value("quote", &quote)?.timeout(Duration::from_secs(5));
        let price: Price = coord.ask_returning(ask).await?;
        println!(
            "{quantity} × {item}: {} cents (from process {})",
            price.cents,
            child.id().unwrap_or(0)
        );
    }
    coord
        .signals()
        .unwrap()
        .send(Publish::new("rpc_stop", Vec::new()))
        .await??;
    let status = child.wait().await?;
    println!("server process exited: {status}");
    Ok(())
}

/// The second process: serves `quote` until told to stop.
async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let (_none, pg) = pgcoord_testkit::from_env_or_start()?;
    let coord =
        Coordinator::connect(Config::builder().pg_config(&pg).owner("server").build()?).await?;
    coord
        .signals()
        .unwrap()
        .send(Serve::typed("quote", |q: Quote| async move {
            let each = match q.item.as_str() {
                "apple" => 40,
                "pear" => 55,
                _ => 99,
            };
            Ok::<_, String>(Price {
                cents: each * u64::from(q.quantity),
            })
        }))
        .await??;
    let mut stop = coord.subscribe("rpc_stop").await?;
    coord
        .signals()
        .unwrap()
        .send(Publish::new("rpc_ready", Vec::new()))
        .await??;
    // Only the message stops it: a gap (the listener reconnected) is no reason to.
    while let Some(Heard::Gap(_)) = stop.next().await {}
    Ok(())
}
