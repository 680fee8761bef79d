//! A worker pool: two pools (standing in for two processes) share 20 keys — one worker actor per
//! key, each given its key's lease to fence with. A third process sends a message to every key
//! through a `KeyRouter`, which finds the key's worker wherever it runs. One pool stops; its keys
//! move to the other, the messages follow them, and no key ever has two workers.
//!
//! Run with `cargo run --example worker_pool`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Config, schema};
use pgcoord_actors::{
    GetStats, KeyRouter, ListenerActor, LockManager, Routed, Shutdown, WorkerKey, WorkerPool,
};

/// The workers alive now, by key, with their tokens.
type Running = Arc<Mutex<std::collections::HashMap<String, i64>>>;

/// Serves one customer; counts itself in `running` while alive.
struct CustomerWorker {
    key: WorkerKey,
    process: String,
    running: Running,
    most_at_once: Arc<AtomicI64>,
}

impl Actor for CustomerWorker {
    type Context = Context<Self>;
    fn started(&mut self, _: &mut Context<Self>) {
        let mut running = self.running.lock().unwrap();
        let twice = running
            .insert(self.key.key.clone(), self.key.token)
            .is_some();
        assert!(!twice, "two workers for {}", self.key.key);
        self.most_at_once
            .fetch_max(running.len() as i64, Ordering::SeqCst);
    }
    fn stopped(&mut self, _: &mut Context<Self>) {
        self.running.lock().unwrap().remove(&self.key.key);
    }
}

/// A routed message: the worker answers which process it runs in, and its key's token.
impl Handler<Routed> for CustomerWorker {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, _: Routed, _: &mut Context<Self>) -> Self::Result {
        Ok(format!("{} (token {})", self.process, self.key.token).into_bytes())
    }
}

impl Handler<Shutdown> for CustomerWorker {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop(); // the key's lease is going: stop before anyone else may start
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
            .heartbeat(Duration::from_millis(400))
            .build()
    };
    schema::migrate(
        &pgcoord::db::connect_spawned(&config("setup")?).await?,
        &config("setup")?,
    )
    .await?;
    let keys: Vec<String> = (1..=20).map(|i| format!("customer-{i}")).collect();
    let running: Running = Arc::default();
    let most = Arc::new(AtomicI64::new(0));
    let start = |owner: &str| -> Result<_, pgcoord::Error> {
        let config = config(owner)?;
        let (running, most) = (Arc::clone(&running), Arc::clone(&most));
        let process = owner.to_owned();
        let factory = move |key| CustomerWorker {
            key,
            process: process.clone(),
            running: running.clone(),
            most_at_once: most.clone(),
        };
        Ok(WorkerPool::new(
            &config,
            LockManager::new(config.clone()).start(),
            "customers",
            keys.clone(),
            factory,
        )
        .routed(ListenerActor::new(config, None).start_supervised())
        .start())
    };
    // The sender: any process, a member of the pool or not.
    let sender = config("sender")?;
    let router = KeyRouter::new(
        "customers",
        LockManager::new(sender.clone()).start(),
        ListenerActor::new(sender, None).start_supervised(),
    );
    let ask = async |key: &str| -> Result<String, pgcoord::Error> {
        let answer = router
            .ask(key, b"hello".to_vec(), Duration::from_secs(5))
            .await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let (a, b) = (start("process-a")?, start("process-b")?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (held_a, held_b) = (
        a.send(GetStats::new()).await?.keys.len(),
        b.send(GetStats::new()).await?.keys.len(),
    );
    println!("process-a serves {held_a} keys, process-b {held_b}");
    println!("customer-1 is served by {}", ask("customer-1").await?);

    a.send(Shutdown).await?; // its workers stop, its keys' leases are released
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = b.send(GetStats::new()).await?.keys;
    if let Some((key, token)) = held.first_key_value() {
        println!(
            "process-a stopped; process-b serves {} keys, e.g. {key} (token {token})",
            held.len()
        );
    }
    for key in &keys {
        assert!(ask(key).await?.starts_with("process-b"), "{key} followed");
    }
    println!("customer-1 is served by {} now", ask("customer-1").await?);
    println!(
        "workers running now: {}; never more than one per key",
        running.lock().unwrap().len()
    );
    Ok(())
}
