//! Durable worker pools: mail to a key (an event of its topic, appended in the sender's
//! transaction) reaches the key's worker at least once and in order, follows the key when it
//! moves, comes again after the worker's `Err`, and, acked in the worker's own fenced
//! transaction, is applied exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::topic::TopicTable;
use pgcoord_actors::*;
use tokio_postgres::Client;

use super::Setup;

/// What each key's worker was handed, in order: (the process, the token, the message).
type Received = Arc<Mutex<HashMap<String, Vec<(String, i64, u32)>>>>;

/// Records each mail; refuses the message 13 the first time each key's worker sees it; with
/// `apply`, applies each message to the table `applied` in a transaction that acks it.
struct Counter {
    key: WorkerKey,
    process: String,
    received: Received,
    refused: bool,
    apply: Option<Arc<tokio::sync::Mutex<Client>>>,
    table: String,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Counter {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Mail> for Counter {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, mail: Mail, _: &mut Context<Self>) -> Self::Result {
        assert_eq!(mail.key(), self.key.key, "handed to the key's own worker");
        let n: u32 = mail.value().unwrap();
        (self.received.lock().unwrap())
            .entry(self.key.key.clone())
            .or_default()
            .push((self.process.clone(), mail.token(), n));
        if n == 13 && !self.refused {
            self.refused = true;
            return Box::pin(async { Err("13 is refused once".to_owned()) });
        }
        let (apply, table, key) = (self.apply.clone(), self.table.clone(), self.key.key.clone());
        Box::pin(async move {
            let Some(client) = apply else {
                return Ok(());
            };
            let mut client = client.lock().await;
            let tx = client.transaction().await.map_err(|e| e.to_string())?;
            let insert = format!("INSERT INTO {table} (key, n) VALUES ($1, $2)");
            (tx.execute(&insert, &[&key, &(n as i32)]).await).map_err(|e| e.to_string())?;
            mail.ack(&tx).await.map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            // Acked with its effects: an error now does not hand it over again.
            if n % 10 == 5 {
                return Err("failed after its commit".to_owned());
            }
            Ok(())
        })
    }
}

struct Process {
    coordinator: Coordinator,
    pool: Addr<WorkerPool<Counter>>,
}

async fn start(
    setup: &Setup,
    process: &str,
    keys: &[String],
    received: &Received,
    apply: Option<&str>,
) -> Process {
    let config = setup.builder(process).build().unwrap();
    let coordinator = Coordinator::connect(config.clone()).await.unwrap();
    let client = match apply {
        Some(_) => Some(Arc::new(tokio::sync::Mutex::new(
            pgcoord::db::connect_spawned(&config).await.unwrap(),
        ))),
        None => None,
    };
    let (name, received) = (process.to_owned(), received.clone());
    let table = apply.unwrap_or_default().to_owned();
    let factory = move |key: WorkerKey| Counter {
        key,
        process: name.clone(),
        received: received.clone(),
        refused: false,
        apply: client.clone(),
        table: table.clone(),
    };
    let pool = WorkerPool::new(
        &config,
        coordinator.locks().unwrap().clone(),
        "mailed",
        keys.to_vec(),
        factory,
    )
    .durable(&coordinator)
    .unwrap()
    .start();
    Process { coordinator, pool }
}

/// Sends `range` to each key, each key's messages in one transaction of the sender's.
async fn send(
    admin: &mut Client,
    table: &TopicTable,
    keys: &[String],
    range: std::ops::Range<u32>,
) {
    let tx = admin.transaction().await.unwrap();
    for key in keys {
        for n in range.clone() {
            table
                .append_value(&tx, &mail_topic("mailed", key), &n)
                .await
                .unwrap();
        }
    }
    tx.commit().await.unwrap();
}

/// Each key's messages in the order handed over, first deliveries only.
fn firsts(received: &Received) -> HashMap<String, Vec<u32>> {
    let received = received.lock().unwrap();
    (received.iter())
        .map(|(key, got)| {
            let mut seen = std::collections::HashSet::new();
            let firsts = got.iter().map(|(_, _, n)| *n).filter(|n| seen.insert(*n));
            (key.clone(), firsts.collect())
        })
        .collect()
}

/// Waits until the keys are shared two and two.
async fn shared(a: &Process, b: &Process) {
    pgcoord_testkit::eventually(Duration::from_secs(10), "keys shared 2/2", async || {
        let held = |p: &Process| p.pool.send(GetStats::new());
        let (a, b) = (held(a).await.unwrap(), held(b).await.unwrap());
        a.keys.len() == 2 && b.keys.len() == 2
    })
    .await;
}

async fn until_received(received: &Received, keys: &[String], n: usize) {
    pgcoord_testkit::eventually(
        Duration::from_secs(30),
        "every message handed over",
        async || {
            let firsts = firsts(received);
            keys.iter()
                .all(|k| firsts.get(k).is_some_and(|got| got.len() >= n))
        },
    )
    .await;
}

#[actix_rt::test]
async fn mail_reaches_its_keys_worker_in_order_at_least_once_and_follows_a_move() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let table = TopicTable::new(&setup.builder("admin").build().unwrap());
    // Sent before any member runs: it waits in the table.
    send(&mut admin, &table, &keys, 0..10).await;
    // A transaction rolled back sends nothing.
    let tx = admin.transaction().await.unwrap();
    table
        .append_value(&tx, &mail_topic("mailed", "k0"), &999u32)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let received = Received::default();
    let a = start(&setup, "a", &keys, &received, None).await;
    until_received(&received, &keys, 10).await;
    // More while a second member joins and half the keys move to it.
    let b = start(&setup, "b", &keys, &received, None).await;
    shared(&a, &b).await;
    for round in 1..4 {
        send(&mut admin, &table, &keys, round * 10..round * 10 + 10).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    until_received(&received, &keys, 40).await;
    let firsts = firsts(&received);
    for key in &keys {
        assert_eq!(
            firsts[key],
            (0..40).collect::<Vec<u32>>(),
            "{key}: each once at least, in order"
        );
    }
    let received = received.lock().unwrap();
    let processes: std::collections::HashSet<&str> = (received.values().flatten())
        .map(|(process, _, _)| process.as_str())
        .collect();
    assert_eq!(processes.len(), 2, "both members handled mail");
    for (key, got) in received.iter() {
        // 13 was refused once, then handed over again (to whichever member held the key).
        assert!(
            got.iter().filter(|(_, _, n)| *n == 13).count() >= 2,
            "{key}: {got:?}"
        );
        // In order within each tenure: a token's messages never go back.
        let mut last: HashMap<i64, u32> = HashMap::new();
        for (_, token, n) in got {
            if let Some(before) = last.insert(*token, *n) {
                assert!(*n > before || *n == 13, "{key}: {got:?}");
            }
        }
    }
    drop(received);
    let _ = (a.pool, b.pool, a.coordinator, b.coordinator);
}

#[actix_rt::test]
async fn mail_acked_in_the_workers_fenced_transaction_is_applied_exactly_once() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let applied = pgcoord_testkit::unique_name("applied");
    admin
        .batch_execute(&format!("CREATE TABLE {applied} (key text, n int)"))
        .await
        .unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let table = TopicTable::new(&setup.builder("admin").build().unwrap());
    let received = Received::default();
    let a = start(&setup, "a", &keys, &received, Some(&applied)).await;
    send(&mut admin, &table, &keys, 0..10).await;
    // A second member joins: keys move while mail is applied.
    let b = start(&setup, "b", &keys, &received, Some(&applied)).await;
    shared(&a, &b).await;
    for round in 1..4 {
        send(&mut admin, &table, &keys, round * 10..round * 10 + 10).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let count = format!("SELECT count(*), count(DISTINCT (key, n)) FROM {applied}");
    pgcoord_testkit::eventually(
        Duration::from_secs(30),
        "every message applied",
        async || {
            let row = admin.query_one(&count, &[]).await.unwrap();
            row.get::<_, i64>(0) == 160
        },
    )
    .await;
    // No duplicate (the table has no constraint to hide one), none missing.
    let row = admin.query_one(&count, &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (160, 160));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let handed: usize = received.lock().unwrap().values().map(Vec::len).sum();
    // Handed over again only when refused (13, once per worker) or moved before its commit;
    // a handler's error after its commit hands nothing over again.
    assert!((160..200).contains(&handed), "{handed} handed over");
    let _ = (a.pool, b.pool, a.coordinator, b.coordinator);
}

/// Mail sent around a server restart and a killed listener session: every message reaches its
/// key's worker, in order (at least once), without anyone restarting the pool — its reads go on
/// at the next tick, and after the listener's reconnect.
#[actix_rt::test]
async fn mail_sent_around_a_server_restart_and_a_lost_listener_all_arrives_in_order() {
    let (server, setup, admin) = super::own_cluster::own_cluster().await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let config = setup.builder("admin").build().unwrap();
    let table = TopicTable::new(&config);
    let received = Received::default();
    let app = pgcoord_testkit::unique_name("mailed");
    let member = setup.builder("a").application_name(&app).build().unwrap();
    let coordinator = Coordinator::connect(member.clone()).await.unwrap();
    let factory = {
        let received = received.clone();
        move |key: WorkerKey| Counter {
            key,
            process: "a".into(),
            received: received.clone(),
            refused: true,
            apply: None,
            table: String::new(),
        }
    };
    let pool = WorkerPool::new(
        &member,
        coordinator.locks().unwrap().clone(),
        "mailed",
        keys.clone(),
        factory,
    )
    .durable(&coordinator)
    .unwrap()
    .start();
    let mut admin = admin;
    send(&mut admin, &table, &keys, 0..10).await;
    until_received(&received, &keys, 10).await;

    // The listener's session ends: doorbells rung meanwhile are lost, the mail is not.
    let listener = format!("{app} listener");
    let killed = pgcoord_testkit::terminate_backends(&admin, &listener)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the listener's session");
    send(&mut admin, &table, &keys, 10..20).await;
    until_received(&received, &keys, 20).await;

    super::own_cluster::on_server(&server, pgcoord_testkit::TempPostgres::restart).await;
    let mut admin = pgcoord::db::connect_spawned(&config).await.unwrap();
    send(&mut admin, &table, &keys, 20..30).await;
    until_received(&received, &keys, 30).await;
    let firsts = firsts(&received);
    for key in &keys {
        assert_eq!(firsts[key], (0..30).collect::<Vec<_>>(), "{key}: in order");
    }
    let _ = (pool, coordinator);
}

/// Anyone can NOTIFY: a flood of doorbells for a key's mail costs a read per doorbell gap (50
/// ms), not one per doorbell, and mail sent after it still arrives.
#[actix_rt::test]
async fn a_flood_of_mail_doorbells_costs_a_read_per_gap() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let keys = vec!["k".to_owned()];
    let table = TopicTable::new(&setup.builder("admin").build().unwrap());
    let received = Received::default();
    let member = start(&setup, "a", &keys, &received, None).await;
    send(&mut admin, &table, &keys, 0..1).await;
    until_received(&received, &keys, 1).await;
    let reads = async || member.pool.send(GetStats::new()).await.unwrap().mail_reads;
    let topic = mail_topic("mailed", "k");
    let (sent, read, most) = super::flood(&admin, table.channel(), &topic, reads).await;
    assert!(read <= most, "{read} reads for {sent} doorbells");

    send(&mut admin, &table, &keys, 1..2).await;
    until_received(&received, &keys, 2).await;
    drop(member.coordinator);
}
