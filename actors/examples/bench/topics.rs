//! Durable topic workloads: appends (1 and 8 appenders) against a raw INSERT of the same row,
//! without and with a NOTIFY; append committed → handler called (a topic's consumer, and a
//! durable worker pool's worker for its key's mail) against a raw INSERT + NOTIFY → LISTEN +
//! SELECT; then a consumer reading a backlog (`catch_up.rs`). Batched appends with durable
//! commits (`durable_appends.rs`) follow, from `main`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::poll_fn;
use pgcoord::Config;
use pgcoord::topic::TopicTable;
use pgcoord_actors::{
    Consume, Coordinator, Delivery, GetStats, Mail, Shutdown, WorkerKey, WorkerPool, mail_topic,
};
use tokio_postgres::{AsyncMessage, Client};

use crate::Sizes;
use crate::report::{Report, Samples};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The raw floor's table: the topic table's columns, without pgcoord.
pub(crate) const RAW: &str = "CREATE TABLE IF NOT EXISTS bench_raw_events (
    topic varchar(255) NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    position bigint GENERATED ALWAYS AS IDENTITY, appended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    body bytea NOT NULL, PRIMARY KEY (topic, xid, position));
    TRUNCATE bench_raw_events";

/// The section's configuration on `pg`: a topic table of its own name, a pool of 16.
pub(crate) fn topic_config(pg: &tokio_postgres::Config, owner: &str) -> Res<Config> {
    Ok(Config::builder()
        .pg_config(pg)
        .owner(owner)
        .lock_table("bench_topic_locks")
        .topic_table(pgcoord_testkit::unique_name("bench_topics"))
        .pool_size(16)
        .build()?)
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = topic_config(pg, "bench-topics")?;
    let admin = pgcoord::db::connect_spawned(&config).await?;
    pgcoord::schema::migrate(&admin, &config).await?;
    admin.batch_execute(RAW).await?;
    let table = Arc::new(TopicTable::new(&config));
    let body = vec![7u8; 100];

    // Appends, each its own transaction: pgcoord's (INSERT and the doorbell's NOTIFY) and raw.
    let mut floor_of_8 = 0.0;
    for appenders in [1usize, 8] {
        let n = sizes.pairs * 2;
        let mut clients = Vec::new();
        for _ in 0..appenders {
            clients.push(Arc::new(pgcoord::db::connect_spawned(&config).await?));
        }
        // The floors' statements prepared on each client first (`execute` with a string would
        // prepare it at every call: a round trip more than the statement).
        let raw_rung =
            "WITH appended AS (INSERT INTO bench_raw_events (topic, body) VALUES ($1, $2)
                        RETURNING position) SELECT pg_notify('bench_raw', $1) FROM appended";
        let mut prepared = std::collections::HashMap::new();
        for c in &clients {
            let insert = c.prepare("INSERT INTO bench_raw_events (topic, body) VALUES ($1, $2)");
            let rung = c.prepare(raw_rung);
            prepared.insert(Arc::as_ptr(c) as usize, [insert.await?, rung.await?]);
        }
        let prepared = Arc::new(prepared);
        // An append by the statement `which` of those prepared on the appender's client.
        let run_prepared = |which: usize| {
            let prepared = prepared.clone();
            move |c: Arc<Client>, b: Vec<u8>| {
                let statement = prepared[&(Arc::as_ptr(&c) as usize)][which].clone();
                async move {
                    (c.execute(&statement, &[&"bench", &b]).await)
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            }
        };
        let (ours, floor) = (
            appends(
                &clients,
                n,
                |c, b| {
                    let table = table.clone();
                    async move {
                        table
                            .append(&*c, "bench", &b)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    }
                },
                &body,
            )
            .await?,
            appends(&clients, n, run_prepared(0), &body).await?,
        );
        // The floor with what a doorbell costs whoever rings it: the INSERT and a NOTIFY in one
        // statement. (A transaction that notifies takes a database-wide lock at commit.)
        let rung = appends(&clients, n, run_prepared(1), &body).await?;
        // And as pgcoord must send it on a caller's connection, where it keeps nothing prepared:
        // unnamed, parsed and planned at every run, one round trip.
        let unnamed = appends(
            &clients,
            n,
            |c, b| async move {
                let params: [(&(dyn tokio_postgres::types::ToSql + Sync), _); 2] = [
                    (&"bench", tokio_postgres::types::Type::TEXT),
                    (&b, tokio_postgres::types::Type::BYTEA),
                ];
                c.query_typed(raw_rung, &params)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
            &body,
        )
        .await?;
        report.rate(
            &format!("topic append, {appenders} appender(s), a transaction each (floor: the same INSERT without the doorbell's NOTIFY)"),
            ours,
            floor,
            "events/s",
        );
        report.rate(
            &format!("topic append, {appenders} appender(s), a transaction each (floor: the same INSERT and a NOTIFY, one statement)"),
            ours,
            rung,
            "events/s",
        );
        report.rate(
            &format!("topic append, {appenders} appender(s), a transaction each (floor: the same INSERT and NOTIFY, unnamed: parsed at every run)"),
            ours,
            unnamed,
            "events/s",
        );
        if appenders == 8 {
            floor_of_8 = floor;
        }
    }

    // Appends through the runtime, batched: 8 callers in closed loops.
    let coordinator = Coordinator::connect(config.clone()).await?;
    // A durable worker pool of one key, started now: its first ticks claim the key meanwhile.
    let (mailed, mut mail_arrivals) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let keys = vec!["k".to_owned()];
    let factory = move |_: WorkerKey| Handed(mailed.clone());
    let pool = WorkerPool::new(
        &config,
        coordinator.locks()?.clone(),
        "bench_mail",
        keys,
        factory,
    )
    .durable(&coordinator)?
    .start();
    let per = sizes.pairs * 2 / 8;
    let started = Instant::now();
    let loops = (0..8).map(|_| {
        let (coordinator, body) = (coordinator.clone(), body.clone());
        async move {
            for _ in 0..per {
                coordinator.append("bench", &body).await?;
            }
            Ok::<(), Box<dyn std::error::Error>>(())
        }
    });
    for result in futures_util::future::join_all(loops).await {
        result?;
    }
    let ours = (per * 8) as f64 / started.elapsed().as_secs_f64();
    let ratio = report.rate(
        "topic append through the runtime (batched), 8 callers (floor: 8 raw INSERTs, a transaction each)",
        ours,
        floor_of_8,
        "events/s",
    );
    report.target(
        "topic appends, 8 callers: batched appends at least 2× the raw INSERT floor",
        format!("{:.3}× the floor's rate", 1.0 / ratio),
        1.0 / ratio >= 2.0,
    );

    // Retention's cost on appends: 8 appenders, a transaction each, while a TopicRetention
    // trims the topic to its newest 1,000 events every 50 ms, against the same without it
    // (one after the other, on the same connections).
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(Arc::new(pgcoord::db::connect_spawned(&config).await?));
    }
    let append_retained = |c: Arc<Client>, b: Vec<u8>| {
        let table = table.clone();
        async move {
            table
                .append(&*c, "retained", &b)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    };
    let n = sizes.pairs * 2;
    let without = appends(&clients, n, append_retained, &body).await?;
    let keep = pgcoord::topic::Retention {
        max_age: None,
        max_events: Some(1_000),
    };
    let retention = coordinator.retain("retained", keep, Duration::from_millis(50))?;
    let with = appends(&clients, n, append_retained, &body).await?;
    retention.send(pgcoord_actors::Shutdown).await?;
    report.rate(
        "topic append, 8 appenders, while retention trims the topic to its newest 1,000 every 50 ms (floor: the same appends without retention)",
        with,
        without,
        "events/s",
    );

    // Append committed → handler called, one event at a time; floor: INSERT + NOTIFY, heard
    // on a raw LISTEN connection, then the row SELECTed.
    let (heard, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let consume = Consume::new("latency", "bench", move |_: Delivery| {
        let _ = heard.send(Instant::now());
        async { Ok(()) }
    })
    .start(pgcoord::topic::Start::Now);
    let consumer = coordinator.consume(consume)?;
    let (floor_listener, floor_arrivals) = raw_listener(&config).await?;
    let mut floor_arrivals = floor_arrivals;
    // Prepared once, as a consumer's read is.
    let floor_read = floor_listener
        .prepare(
            "SELECT body FROM bench_raw_events WHERE topic = 'latency'
             ORDER BY xid DESC, position DESC LIMIT 1",
        )
        .await?;
    let rounds = sizes.requests.min(500);
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    tokio::time::sleep(Duration::from_millis(300)).await; // the consumer is reading
    let claimed = Instant::now();
    while pool.send(GetStats::new()).await?.keys.is_empty() {
        if claimed.elapsed() > Duration::from_secs(60) {
            return Err("the mail pool's key was not claimed within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..rounds {
        let committed = Instant::now();
        table.append(&admin, "latency", &body).await?;
        let at = tokio::time::timeout(Duration::from_secs(10), arrivals.recv()).await?;
        ours.push(at.ok_or("consumer gone")? - committed);
        floor
            .push(raw_round_trip(&admin, &floor_listener, &floor_read, &mut floor_arrivals).await?);
    }
    let (ours, floor) = (Samples::new(ours), Samples::new(floor));
    let p50 = report.time(
        "topic append committed → handler called, p50 (floor: INSERT + NOTIFY → LISTEN + SELECT)",
        ours.p(0.5),
        floor.p(0.5),
    );
    report.time("topic append → handler, p99", ours.p(0.99), floor.p(0.99));
    // The same for a durable pool's mail, in rounds of their own: after each, the pool acks
    // and reads the key again, which must not overlap the next measurement.
    let (mut mail, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let committed = Instant::now();
        table
            .append(&admin, &mail_topic("bench_mail", "k"), &body)
            .await?;
        let at = tokio::time::timeout(Duration::from_secs(10), mail_arrivals.recv()).await?;
        mail.push(at.ok_or("worker gone")? - committed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        floor
            .push(raw_round_trip(&admin, &floor_listener, &floor_read, &mut floor_arrivals).await?);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (mail, floor) = (Samples::new(mail), Samples::new(floor));
    report.time(
        "durable mail committed → the key's worker handed it, p50 (floor: INSERT + NOTIFY → LISTEN + SELECT)",
        mail.p(0.5),
        floor.p(0.5),
    );
    report.time("durable mail → worker, p99", mail.p(0.99), floor.p(0.99));
    pool.send(pgcoord_actors::Shutdown).await?;
    report.target(
        "topic end to end p50: at most 1.5× INSERT + NOTIFY → LISTEN + SELECT",
        format!("{p50:.3}×"),
        p50 <= 1.5,
    );
    consumer.stop().await;

    crate::catch_up::run(&admin, &config, &coordinator, &body, sizes, report).await
}

/// `n` appends spread over `clients`, each a closed loop: the rate.
pub(crate) async fn appends<F, Fut>(
    clients: &[Arc<Client>],
    n: usize,
    append: F,
    body: &[u8],
) -> Res<f64>
where
    F: Fn(Arc<Client>, Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let per = n / clients.len();
    let loops = clients.iter().map(|c| {
        let futures: Vec<_> = (0..per).map(|_| append(c.clone(), body.to_vec())).collect();
        async move {
            for f in futures {
                f.await?;
            }
            Ok::<(), String>(())
        }
    });
    for result in futures_util::future::join_all(loops).await {
        result?;
    }
    Ok((per * clients.len()) as f64 / started.elapsed().as_secs_f64())
}

/// The end-to-end floor, once: INSERT + NOTIFY committed, heard on the raw LISTEN connection,
/// the row SELECTed.
async fn raw_round_trip(
    admin: &Client,
    listener: &Client,
    read: &tokio_postgres::Statement,
    arrivals: &mut tokio::sync::mpsc::UnboundedReceiver<Instant>,
) -> Res<Duration> {
    let sent = Instant::now();
    admin
        .batch_execute(
            "BEGIN; INSERT INTO bench_raw_events (topic, body) VALUES ('latency', '\\x00');
             NOTIFY bench_raw_events, 'latency'; COMMIT",
        )
        .await?;
    tokio::time::timeout(Duration::from_secs(10), arrivals.recv()).await?;
    listener.query(read, &[]).await?;
    Ok(sent.elapsed())
}

/// A raw LISTEN connection on the floor's channel, and its arrivals.
async fn raw_listener(
    config: &Config,
) -> Res<(Client, tokio::sync::mpsc::UnboundedReceiver<Instant>)> {
    let (client, mut connection) = pgcoord::__private::connect(config).await?;
    let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(_) = message {
                let _ = tx.send(Instant::now());
            }
        }
    });
    client.batch_execute("LISTEN bench_raw_events").await?;
    Ok((client, arrivals))
}

/// A durable pool's worker that tells when each mail reached it.
struct Handed(tokio::sync::mpsc::UnboundedSender<Instant>);

impl Actor for Handed {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Handed {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Mail> for Handed {
    type Result = Result<(), String>;
    fn handle(&mut self, _: Mail, _: &mut Context<Self>) -> Self::Result {
        let _ = self.0.send(Instant::now());
        Ok(())
    }
}
