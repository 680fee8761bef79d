//! A durable topic's consumer as a process of its own, for the scenarios that kill it.
//!
//! `consumer --dsn D --lock-table L --topic-table T --applied A --owner O --mode fenced|plain
//! [--lease-ms 2000] [--window 16]` consumes consumer `c` of topic `t` and applies each event to
//! table `A` (`xid`, `position`, `owner`, `token`), a row per application, after which it waits
//! up to 2 ms, so that a SIGKILL often lands between an effect and its ack:
//! - `fenced`: the row and the ack in one transaction ([`pgcoord_actors::Delivery::ack`]); the
//!   table must end with each event exactly once.
//! - `plain`: the row in a transaction of its own, the ack left to the runtime (after each
//!   window); the table may hold an event twice, never miss one.
//!
//! It prints `READY` once it consumes, and `ERROR <message>` when it cannot go on.

use std::sync::Arc;
use std::time::Duration;

use pgcoord::Config;
use pgcoord_actors::{Consume, Coordinator, Delivery};
use pgcoord_faults::program::{need, number, say};
use tokio::sync::Mutex;

/// A random duration up to `max`, from std's randomly keyed hasher.
fn up_to(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    Duration::from_micros(h.finish() % max.as_micros().max(1) as u64)
}

/// Applies one event as `mode` says; `Err` hands it over again.
async fn apply(
    client: &Mutex<tokio_postgres::Client>,
    config: &Config,
    applied: &str,
    fenced: bool,
    delivery: Delivery,
) -> Result<(), String> {
    let mut client = client.lock().await;
    // Opened again after a failure (a restart, a failover), as an application would.
    if client.is_closed() {
        *client = (pgcoord::db::connect_spawned(config).await).map_err(|e| e.to_string())?;
    }
    let owner = config.owner();
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let cursor = delivery.event().cursor;
    tx.execute(
        &format!("INSERT INTO {applied} (xid, position, owner, token) VALUES ($1, $2, $3, $4)"),
        &[&cursor.xid, &cursor.position, &owner, &delivery.token()],
    )
    .await
    .map_err(|e| e.to_string())?;
    if fenced {
        tokio::time::sleep(up_to(Duration::from_millis(2))).await;
        delivery.ack(&tx).await.map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
    } else {
        tx.commit().await.map_err(|e| e.to_string())?;
        tokio::time::sleep(up_to(Duration::from_millis(2))).await;
    }
    Ok(())
}

#[actix::main]
async fn main() {
    // pgcoord's warnings on standard error, where the test's output shows them.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let applied = need("--applied");
    let fenced = match need("--mode").as_str() {
        "fenced" => true,
        "plain" => false,
        other => panic!("--mode fenced|plain, not {other}"),
    };
    let lease = Duration::from_millis(number("--lease-ms", 2000));
    let config = Config::builder()
        .dsn(need("--dsn"))
        .lock_table(need("--lock-table"))
        .topic_table(need("--topic-table"))
        .owner(need("--owner"))
        .lease(lease)
        .heartbeat(lease / 4)
        .build()
        .expect("valid configuration");
    let client = match pgcoord::db::connect_spawned(&config).await {
        Ok(client) => Arc::new(Mutex::new(client)),
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let coordinator = match Coordinator::connect(config.clone()).await {
        Ok(coordinator) => coordinator,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let consume = {
        let (client, config, applied) =
            (client.clone(), Arc::new(config.clone()), Arc::new(applied));
        Consume::new("t", "c", move |delivery: Delivery| {
            let (client, config, applied) = (client.clone(), config.clone(), applied.clone());
            async move { apply(&client, &config, &applied, fenced, delivery).await }
        })
        .window(number("--window", 16) as u32)
        .poll(Duration::from_millis(100))
    };
    let _consumer = match coordinator.consume(consume) {
        Ok(consumer) => consumer,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    say("READY");
    // Runs until killed.
    std::future::pending::<()>().await;
}
