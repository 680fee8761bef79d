//! A routed worker pool's member as a process of its own, for the scenarios that kill and
//! drain it.
//!
//! `member --dsn D --lock-table L --applied A --owner O --keys N [--lease-ms 2000]
//! [--mail --topic-table T]` runs pool `routed` over keys `k0`…`k{N-1}`. Each key's worker
//! applies a routed message (a `u64`, MessagePack) as a row of table `A` (`key`, `n`, `owner`,
//! `token`) in a transaction fenced by its key's lease, then answers. With `--mail` the pool is
//! durable: each key's mail (topic table `T`) is applied the same way, acked in the same
//! transaction. It prints `READY` once it runs, and on SIGTERM drains (hands its keys over) and
//! prints `DRAINED` (or `ERROR <message>`).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{Coordinator, Drain, Mail, Routed, Shutdown, WorkerKey, WorkerPool};
use pgcoord_faults::program::{arg, flag, need, number, say};
use tokio::sync::Mutex;

/// Applies the messages of one key.
struct Applier {
    key: WorkerKey,
    config: Arc<Config>,
    applied: Arc<String>,
    client: Arc<Mutex<tokio_postgres::Client>>,
}

impl Actor for Applier {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Applier {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Applier {
    /// Applies `n` in a transaction fenced by the key's lease; `ack`, run in it before the
    /// commit, acks a mail with it.
    fn apply(
        &self,
        n: u64,
        ack: Option<Mail>,
    ) -> impl std::future::Future<Output = Result<(), String>> + 'static {
        let (key, config, applied, client) = (
            self.key.clone(),
            self.config.clone(),
            self.applied.clone(),
            self.client.clone(),
        );
        async move {
            let mut client = client.lock().await;
            if client.is_closed() {
                *client =
                    (pgcoord::db::connect_spawned(&config).await).map_err(|e| e.to_string())?;
            }
            let tx = client.transaction().await.map_err(|e| e.to_string())?;
            key.fence(&tx).await.map_err(|e| e.to_string())?;
            tx.execute(
                &format!("INSERT INTO {applied} (key, n, owner, token) VALUES ($1, $2, $3, $4)"),
                &[&key.key, &(n as i64), &config.owner(), &key.token],
            )
            .await
            .map_err(|e| e.to_string())?;
            if let Some(mail) = ack {
                mail.ack(&tx).await.map_err(|e| e.to_string())?;
            }
            tx.commit().await.map_err(|e| e.to_string())
        }
    }
}

impl Handler<Routed> for Applier {
    type Result = ResponseActFuture<Self, Result<Vec<u8>, String>>;

    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        // One message at a time (the actor waits for each): a key's messages apply in the
        // order they arrive.
        let n: Result<u64, String> = routed.value().map_err(|e| e.to_string());
        let apply = n.map(|n| self.apply(n, None));
        Box::pin(
            async move {
                apply?.await?;
                Ok(Vec::new())
            }
            .into_actor(self),
        )
    }
}

impl Handler<Mail> for Applier {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, mail: Mail, _: &mut Context<Self>) -> Self::Result {
        let n: Result<u64, String> = mail.value().map_err(|e| e.to_string());
        let apply = n.map(|n| self.apply(n, Some(mail)));
        Box::pin(async move { apply?.await }.into_actor(self))
    }
}

#[actix::main]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let lease = Duration::from_millis(number("--lease-ms", 2000));
    let mut config = Config::builder()
        .dsn(need("--dsn"))
        .lock_table(need("--lock-table"));
    if let Some(topics) = arg("--topic-table") {
        config = config.topic_table(topics);
    }
    let config = config
        .owner(need("--owner"))
        .lease(lease)
        .heartbeat(lease / 4)
        .build()
        .expect("valid configuration");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let client = match pgcoord::db::connect_spawned(&config).await {
        Ok(client) => Arc::new(Mutex::new(client)),
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let coordinator = match Coordinator::connect(config.clone()).await {
        Ok(coordinator) => coordinator,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let keys: Vec<String> = (0..number("--keys", 20)).map(|i| format!("k{i}")).collect();
    let (config, applied) = (Arc::new(config), Arc::new(need("--applied")));
    let factory = {
        let config = config.clone();
        move |key: WorkerKey| Applier {
            key,
            config: config.clone(),
            applied: applied.clone(),
            client: client.clone(),
        }
    };
    let pool = WorkerPool::new(
        &config,
        coordinator.locks().expect("on PostgreSQL").clone(),
        "routed",
        keys,
        factory,
    )
    .routed(coordinator.signals().expect("on PostgreSQL").clone());
    let pool = if flag("--mail") {
        pool.durable(&coordinator).expect("on PostgreSQL")
    } else {
        pool
    };
    let pool = pool.start();
    say("READY");
    terminate.recv().await;
    match pool.send(Drain).await {
        Ok(()) => say("DRAINED"),
        Err(e) => say(&format!("ERROR {e}")),
    }
}
