//! A durable topic between two processes: an order service appends an event inside the
//! transaction that records each order; a billing process consumes them and applies each one to
//! its own ledger, acking in the same transaction. The billing process is killed (SIGKILL)
//! midway and started again: the ledger ends with every order exactly once.
//!
//! Run with `cargo run --example durable_topic`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL (removed on exit); the billing process gets its address through
//! `DATABASE_URL`.

use std::time::{Duration, Instant};

use pgcoord::{Config, TopicTable, schema};
use pgcoord_actors::{Consume, Coordinator, Delivery};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    id: i64,
    cents: i64,
}

/// A short lease, so the restarted billing process takes over from the killed one in seconds.
fn config(pg: &tokio_postgres::Config, owner: &str) -> Result<Config, pgcoord::Error> {
    Config::builder()
        .pg_config(pg)
        .owner(owner)
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1))
        .build()
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "billing") {
        return billing().await;
    }
    let (server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = config(&pg, "orders")?;
    let mut client = pgcoord::db::connect_spawned(&config).await?;
    schema::migrate(&client, &config).await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS shop_orders, billing_ledger;
             CREATE TABLE shop_orders (id bigint PRIMARY KEY, cents bigint NOT NULL);
             CREATE TABLE billing_ledger (order_id bigint PRIMARY KEY, cents bigint NOT NULL);",
        )
        .await?;
    let dsn = match &server {
        Some(server) => server.dsn(),
        None => std::env::var("DATABASE_URL")?,
    };
    let start_billing = || {
        tokio::process::Command::new(std::env::current_exe()?)
            .arg("billing")
            .env("DATABASE_URL", &dsn)
            .spawn()
    };
    let topics = TopicTable::new(&config);
    let mut billing = start_billing()?;
    for id in 0..30 {
        // The order and its event commit together, or neither does.
        let tx = client.transaction().await?;
        let cents = 100 + id * 7;
        tx.execute("INSERT INTO shop_orders VALUES ($1, $2)", &[&id, &cents])
            .await?;
        topics
            .append_value(&tx, "orders", &Order { id, cents })
            .await?;
        tx.commit().await?;
        if id == 9 {
            until_billed(&client, 10).await?;
            billing.kill().await?; // SIGKILL, wherever it is
            println!("billing killed after 10 orders; starting it again");
            billing = start_billing()?;
        }
    }
    until_billed(&client, 30).await?;
    billing.kill().await?;
    let row = client
        .query_one(
            "SELECT count(*), sum(billing_ledger.cents)::int8 FROM billing_ledger
             JOIN shop_orders ON shop_orders.id = billing_ledger.order_id",
            &[],
        )
        .await?;
    let (billed, cents): (i64, i64) = (row.get(0), row.get(1));
    let expected: i64 = (0..30).map(|id| 100 + id * 7).sum();
    assert_eq!((billed, cents), (30, expected), "each order billed once");
    println!("30 orders, 30 ledger rows, {cents} cents: each order billed exactly once");
    Ok(())
}

/// Waits until the ledger has `n` rows.
async fn until_billed(client: &tokio_postgres::Client, n: i64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = client.query_one("SELECT count(*) FROM billing_ledger", &[]);
        let billed: i64 = row.await.map_err(|e| e.to_string())?.get(0);
        if billed >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{billed} of {n} orders billed"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The billing process: consumes "orders" as "billing" until it is killed.
async fn billing() -> Result<(), Box<dyn std::error::Error>> {
    let pg: tokio_postgres::Config = std::env::var("DATABASE_URL")?.parse()?;
    let config = config(&pg, &format!("billing-{}", std::process::id()))?;
    let client = pgcoord::db::connect_spawned(&config).await?;
    let client = std::sync::Arc::new(tokio::sync::Mutex::new(client));
    let coordinator = Coordinator::connect(config).await?;
    let consume = Consume::new("orders", "billing", move |delivery: Delivery| {
        let client = client.clone();
        async move {
            bill(&mut *client.lock().await, &delivery)
                .await
                .map_err(|e| e.to_string())
        }
    });
    coordinator.consume(consume)?;
    std::future::pending::<()>().await;
    Ok(())
}

/// Applies one order to the ledger and acks it in the same transaction: effect and cursor
/// commit together, so a kill at any point leaves the order either billed and acked, or
/// neither (and it comes again).
async fn bill(client: &mut tokio_postgres::Client, delivery: &Delivery) -> pgcoord::Result<()> {
    let order: Order = delivery.value()?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO billing_ledger VALUES ($1, $2)",
        &[&order.id, &order.cents],
    )
    .await?;
    delivery.ack(&tx).await?;
    tx.commit().await?;
    Ok(())
}
