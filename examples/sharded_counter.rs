//! A sharded counter: three member processes serve 1,000 counters (one worker per key across
//! them), and this process routes increments to each key's worker wherever it runs. While
//! traffic flows, one member is killed (SIGKILL) and another drained (it hands its keys over and
//! exits). Each worker applies an increment in a transaction fenced by its key's lease, so a
//! worker that lost its key cannot write. At the end every counter is checked against what was
//! sent: each increment answered as handled is counted once, none answered "not delivered" is,
//! and "may or may not have been handled" went either way — at most once, never twice.
//!
//! Beside them, increments sent as durable mail (an event of the key's mail topic, appended in
//! this process's transaction) go to the same workers, which apply each in a transaction that
//! also acks it: every one of those is counted exactly once, killed member or not.
//!
//! Run with `cargo run --example sharded_counter`. It uses `DATABASE_URL` when set, and
//! otherwise starts a throwaway PostgreSQL from the locally installed server binaries (removed
//! on exit). The members are this program again, started with `member DSN OWNER`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, ErrorKind};
use pgcoord_actors::{
    Coordinator, Drain, KeyRouter, Mail, Routed, Shutdown, WorkerKey, WorkerPool, mail_topic,
};

const KEYS: usize = 1_000;

fn config(dsn: &str, owner: &str) -> Result<Config, pgcoord::Error> {
    Config::builder()
        .dsn(dsn)
        .owner(owner)
        .lease(Duration::from_secs(2))
        .heartbeat(Duration::from_millis(500))
        .build()
}

/// The worker of one counter: adds 1 per routed message, fenced by its key's lease.
struct Counter {
    key: WorkerKey,
    client: Arc<tokio::sync::Mutex<tokio_postgres::Client>>,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Counter {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop(); // the key is moving: stop before another process may start its worker
    }
}

impl Handler<Routed> for Counter {
    type Result = ResponseActFuture<Self, Result<Vec<u8>, String>>;
    fn handle(&mut self, _: Routed, _: &mut Context<Self>) -> Self::Result {
        let (key, client) = (self.key.clone(), self.client.clone());
        // One increment at a time per key: the actor waits for each.
        Box::pin(
            async move {
                let mut client = client.lock().await;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                key.fence(&tx).await.map_err(|e| e.to_string())?; // still this key's holder?
                tx.execute(
                    "INSERT INTO counters (key, n) VALUES ($1, 1)
                     ON CONFLICT (key) DO UPDATE SET n = counters.n + 1",
                    &[&key.key],
                )
                .await
                .map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                Ok(Vec::new())
            }
            .into_actor(self),
        )
    }
}

/// A durable increment: added to `mailed` and acked in one transaction fenced by the key's
/// lease, so it counts exactly once however often it is handed over.
impl Handler<Mail> for Counter {
    type Result = ResponseActFuture<Self, Result<(), String>>;
    fn handle(&mut self, mail: Mail, _: &mut Context<Self>) -> Self::Result {
        let (key, client) = (self.key.clone(), self.client.clone());
        Box::pin(
            async move {
                let mut client = client.lock().await;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                tx.execute(
                    "INSERT INTO counters (key, n, mailed) VALUES ($1, 0, 1)
                     ON CONFLICT (key) DO UPDATE SET mailed = counters.mailed + 1",
                    &[&key.key],
                )
                .await
                .map_err(|e| e.to_string())?;
                mail.ack(&tx).await.map_err(|e| e.to_string())?; // fenced: still this key's holder?
                tx.commit().await.map_err(|e| e.to_string())
            }
            .into_actor(self),
        )
    }
}

/// A member process: serves the pool until its standard input says `drain`, then hands its
/// keys over and exits.
async fn member(dsn: &str, owner: &str) -> Result<(), Box<dyn std::error::Error>> {
    let config = config(dsn, owner)?;
    let client = Arc::new(tokio::sync::Mutex::new(
        pgcoord::db::connect_spawned(&config).await?,
    ));
    let coordinator = Coordinator::connect(config.clone()).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("counter-{i}")).collect();
    let factory = move |key: WorkerKey| Counter {
        key,
        client: client.clone(),
    };
    let pool = WorkerPool::new(
        &config,
        coordinator.locks()?.clone(),
        "counters",
        keys,
        factory,
    )
    .routed(coordinator.signals()?.clone())
    .durable(&coordinator)?
    .start();
    println!("READY");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        line
    })
    .await?;
    if line.trim() == "drain" {
        pool.send(Drain).await?;
        println!("DRAINED");
    }
    Ok(())
}

/// Starts a member process and waits for its `READY`.
fn spawn_member(dsn: &str, owner: &str) -> Result<Child, Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["member", dsn, owner])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "READY" {
        return Err(format!("member {owner} said {line:?}").into());
    }
    // The rest of its output (DRAINED) is read by whoever waits for it.
    child.stdout = Some(out.into_inner());
    Ok(child)
}

#[derive(Default, Debug)]
struct Sent {
    handled: u64,
    maybe: u64,
    not_delivered: u64,
    failed: u64,
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("member") {
        return member(&args[2], &args[3]).await;
    }
    let (server, _) = pgcoord_testkit::from_env_or_start()?;
    let dsn = match &server {
        Some(server) => server.dsn(),
        None => std::env::var("DATABASE_URL")?,
    };
    let admin = pgcoord::db::connect_spawned(&config(&dsn, "admin")?).await?;
    pgcoord::schema::migrate(&admin, &config(&dsn, "admin")?).await?;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS counters;
             CREATE TABLE counters (key text PRIMARY KEY, n int8 NOT NULL,
                                    mailed int8 NOT NULL DEFAULT 0)",
        )
        .await?;
    let mut members: HashMap<&str, Child> = HashMap::new();
    for owner in ["member-a", "member-b", "member-c"] {
        members.insert(owner, spawn_member(&dsn, owner)?);
    }
    println!("three members started; routing increments to {KEYS} counters");

    // The sender: this process, a member of nothing.
    let sender = config(&dsn, "sender")?;
    let coordinator = Coordinator::connect(sender.clone()).await?;
    let router = KeyRouter::new(
        "counters",
        coordinator.locks()?.clone(),
        coordinator.signals()?.clone(),
    );
    let started = Instant::now();
    // Durable increments: each its own transaction of this process's (an outbox).
    let mailer = {
        let (client, topics) = (
            pgcoord::db::connect_spawned(&sender).await?,
            pgcoord::TopicTable::new(&sender),
        );
        actix::spawn(async move {
            let mut mailed: HashMap<String, u64> = HashMap::new();
            let mut i = 0;
            while started.elapsed() < Duration::from_secs(10) {
                let key = format!("counter-{}", (i * 104_729) % KEYS);
                i += 1;
                topics
                    .append(&client, &mail_topic("counters", &key), b"+1")
                    .await?;
                *mailed.entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, pgcoord::Error>(mailed)
        })
    };
    let senders: Vec<_> = (0..16)
        .map(|s| {
            let router = router.clone();
            actix::spawn(async move {
                let mut sent: HashMap<String, Sent> = HashMap::new();
                let mut i = s;
                while started.elapsed() < Duration::from_secs(10) {
                    let key = format!("counter-{}", (i * 7919) % KEYS);
                    i += 16;
                    let answer = router.ask(&key, Vec::new(), Duration::from_secs(3)).await;
                    let counts = sent.entry(key).or_default();
                    match answer {
                        Ok(_) => counts.handled += 1,
                        Err(e) if e.kind() == ErrorKind::Timeout => {
                            if e.to_string().contains("may or may not") {
                                counts.maybe += 1
                            } else {
                                counts.not_delivered += 1
                            }
                        }
                        Err(_) => counts.failed += 1,
                    }
                }
                sent
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    members.get_mut("member-a").ok_or("a")?.kill()?; // SIGKILL: its keys move after its leases expire
    println!("member-a killed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = members.get_mut("member-b").ok_or("b")?;
    writeln!(b.stdin.as_mut().ok_or("stdin")?, "drain")?;
    let mut said = String::new();
    std::io::BufReader::new(b.stdout.as_mut().ok_or("stdout")?).read_line(&mut said)?;
    println!("member-b: {}", said.trim());

    let mut sent: HashMap<String, Sent> = HashMap::new();
    for task in senders {
        for (key, counts) in task.await? {
            let total = sent.entry(key).or_default();
            total.handled += counts.handled;
            total.maybe += counts.maybe;
            total.not_delivered += counts.not_delivered;
            total.failed += counts.failed;
        }
    }
    let rows = admin.query("SELECT key, n FROM counters", &[]).await?;
    let counted: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut all = Sent::default();
    for (key, s) in &sent {
        let n = counted.get(key).copied().unwrap_or(0) as u64;
        // At most once: every handled increment counted, none twice, "maybe" either way.
        assert!(
            n >= s.handled && n <= s.handled + s.maybe,
            "{key}: counted {n}, sent {s:?}"
        );
        all.handled += s.handled;
        all.maybe += s.maybe;
        all.not_delivered += s.not_delivered;
        all.failed += s.failed;
    }
    println!(
        "sent {} increments: {} handled, {} may or may not have been, {} not delivered, {} failed",
        all.handled + all.maybe + all.not_delivered + all.failed,
        all.handled,
        all.maybe,
        all.not_delivered,
        all.failed
    );
    println!(
        "counted {}: every counter within what was sent (handled ≤ count ≤ handled + maybe)",
        counted.values().sum::<i64>()
    );
    // Durable increments: all counted, each once, once the mail left is read (by member-c).
    let mailed = mailer.await??;
    let total: u64 = mailed.values().sum();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = admin
            .query_one("SELECT sum(mailed)::int8 FROM counters", &[])
            .await?;
        let counted: Option<i64> = row.get(0);
        if counted.unwrap_or(0) as u64 >= total {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{counted:?} of {total} mailed increments counted").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = admin.query("SELECT key, mailed FROM counters", &[]).await?;
    for row in &rows {
        let (key, n): (String, i64) = (row.get(0), row.get(1));
        let sent = mailed.get(&key).copied().unwrap_or(0);
        assert_eq!(
            n as u64, sent,
            "{key}: mailed increments counted exactly once"
        );
    }
    println!("mailed {total} increments durably: every one counted exactly once");
    for (_, mut child) in members {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(())
}
