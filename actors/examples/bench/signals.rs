//! Signal workloads: raw NOTIFY→LISTEN latency, request/reply round trips, fan-out to actor
//! subscribers, and a 1 MiB payload round trip through the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::poll_fn;
use pgcoord::Config;
use pgcoord::payload::PayloadTable;
use pgcoord::signal::{Envelope, Kind};
use pgcoord_actors::Ask;
use pgcoord_actors::{GetStats, ListenerActor, ListenerStats, Publish, Serve, Signal, Subscribe};
use tokio_postgres::AsyncMessage;

use crate::Sizes;
use crate::cpu::{CpuMark, CpuUse};
use crate::placement;
use crate::report::{Report, Samples};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

struct Counter(Arc<AtomicU64>);
impl Actor for Counter {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1 << 20);
    }
}
impl Handler<Signal> for Counter {
    type Result = ();
    fn handle(&mut self, _: Signal, _: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A raw connection LISTENing on `channel` (a quoted identifier), and the instant each
/// notification on it arrives. Keep the client: dropping it ends the connection.
pub(crate) async fn raw_listener(
    config: &Config,
    channel: &str,
) -> Res<(
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<Instant>,
)> {
    let (client, mut connection) = pgcoord::__private::connect(config).await?;
    let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(_) = message {
                let _ = tx.send(Instant::now());
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok((client, arrivals))
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = Config::builder()
        .pg_config(pg)
        .owner("bench-signals")
        .payload_table("bench_payloads")
        .pool_size(16)
        .build()?;
    let admin = pgcoord::db::connect_spawned(&config).await?;
    pgcoord::schema::migrate(&admin, &config).await?;
    let notify = admin.prepare("SELECT pg_notify('bench_raw', $1)").await?;

    // Floor: raw NOTIFY → LISTEN, one way.
    let (_listening, mut arrivals) = raw_listener(&config, "bench_raw").await?;
    // Request/reply between two listeners, as two processes, interleaved with the floor so
    // both see the same machine.
    let store = || {
        Some(
            Arc::new(PayloadTable::new(&config, pgcoord::Pool::new(&config)))
                as Arc<dyn pgcoord::payload::PayloadStore>,
        )
    };
    let server = ListenerActor::new(config.clone(), store()).start_supervised();
    let client = ListenerActor::new(config.clone(), store()).start_supervised();
    server
        .send(Serve::new("bench_echo", |p| async move { Ok(p) }))
        .await??;
    // The raw round trip: a NOTIFY from one connection, heard by a raw listener whose task
    // answers with a NOTIFY from another connection, heard by a third — as a request and its
    // reply go, each sent from a pooled connection and heard on a listening one.
    let (echo_listening, mut echo_connection) = pgcoord::__private::connect(&config).await?;
    let (echo_sender, connection) = pgcoord::__private::connect(&config).await?;
    tokio::spawn(connection);
    let pong = echo_sender
        .prepare("SELECT pg_notify('bench_pong', $1)")
        .await?;
    tokio::spawn(async move {
        while let Some(Ok(message)) = poll_fn(|cx| echo_connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(n) = message {
                let _ = echo_sender.query_one(&pong, &[&n.payload()]).await;
            }
        }
    });
    echo_listening.batch_execute("LISTEN bench_ping").await?;
    let (_pong_listening, mut pongs) = raw_listener(&config, "bench_pong").await?;
    let ping = admin.prepare("SELECT pg_notify('bench_ping', $1)").await?;
    let mut round_trips = async |requests: usize| -> Res<(Samples, Samples, Samples)> {
        let (mut one_way, mut trips, mut raw_trips) = (Vec::new(), Vec::new(), Vec::new());
        // In blocks of 20, in turns: the first operation after a switch is slower.
        for block in 0..requests.div_ceil(20) {
            for side in [block % 3, (block + 1) % 3, (block + 2) % 3] {
                for i in block * 20..(block + 1) * 20 {
                    if side == 0 {
                        let sent = Instant::now();
                        admin.query_one(&notify, &[&i.to_string()]).await?;
                        one_way.push(arrivals.recv().await.unwrap() - sent);
                    } else if side == 2 {
                        let sent = Instant::now();
                        admin.query_one(&ping, &[&i.to_string()]).await?;
                        raw_trips.push(pongs.recv().await.unwrap() - sent);
                    } else {
                        let t = Instant::now();
                        let request = Ask::new("bench_echo", (i as u32).to_be_bytes().to_vec());
                        client.send(request).await??;
                        trips.push(t.elapsed());
                    }
                }
            }
        }
        Ok((
            Samples::new(one_way),
            Samples::new(trips),
            Samples::new(raw_trips),
        ))
    };
    let (one_way, trips, raw_trips) = round_trips(sizes.requests).await?;
    report.time(
        "request/reply round trip, p50 (floor: two raw NOTIFY→LISTEN hops)",
        trips.p(0.5),
        one_way.p(0.5) * 2,
    );
    report.time(
        "request/reply round trip, p99",
        trips.p(0.99),
        one_way.p(0.99) * 2,
    );
    report.time(
        "request/reply round trip, p50 (floor: a raw round trip — NOTIFY, heard, NOTIFY back, heard)",
        trips.p(0.5),
        raw_trips.p(0.5),
    );
    // What moves the ratio between runs: other sessions listening on the database. PostgreSQL
    // (up to 18) signals every listening backend of the database at each NOTIFY's commit, and
    // each wakes to read the queue; the full bench run leaves its earlier sections' listeners.
    let mut idle = Vec::new();
    for i in 0..32 {
        let (listening, connection) = pgcoord::__private::connect(&config).await?;
        tokio::spawn(connection);
        listening
            .batch_execute(&format!("LISTEN bench_idle_{i}"))
            .await?;
        idle.push(listening);
    }
    let (one_way, trips, raw_trips) = round_trips(sizes.requests).await?;
    report.time(
        "request/reply round trip, p50, with 32 other sessions listening on other channels (floor: two raw hops beside them)",
        trips.p(0.5),
        one_way.p(0.5) * 2,
    );
    report.time(
        "request/reply round trip, p50, with 32 other sessions listening (floor: a raw round trip beside them)",
        trips.p(0.5),
        raw_trips.p(0.5),
    );
    drop(idle);

    // Fan-out: distinct envelopes, sent in batches, to 4 actor subscribers of one listener; the
    // floor is the raw connection receiving the same notifications.
    let count = Arc::new(AtomicU64::new(0));
    for _ in 0..4 {
        let recipient = Counter(count.clone()).start().recipient();
        client
            .send(Subscribe::new("bench_raw", recipient))
            .await??;
    }
    let texts: Vec<String> = (0..sizes.fanout)
        .map(|i| {
            Envelope::new(Kind::Event, (i as u64).to_be_bytes().to_vec())
                .encode()
                .unwrap()
        })
        .collect();
    while arrivals.try_recv().is_ok() {}
    let started = Instant::now();
    for batch in texts.chunks(1000) {
        admin
            .execute(
                "SELECT pg_notify('bench_raw', t) FROM unnest($1::text[]) AS t",
                &[&batch],
            )
            .await?;
    }
    let mut raw_received = 0;
    let mut raw_done = started;
    while raw_received < sizes.fanout {
        raw_done = arrivals.recv().await.unwrap();
        raw_received += 1;
    }
    while count.load(Ordering::Relaxed) < 4 * sizes.fanout as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ours = started.elapsed();
    let floor = raw_done - started;
    report.rate("fan-out: notifications/s through one listener to 4 actor subscribers (floor: one raw connection)", sizes.fanout as f64 / ours.as_secs_f64(), sizes.fanout as f64 / floor.as_secs_f64(), "/s");
    report.note(
        "fan-out: deliveries/s to subscribers",
        format!("{:.0} /s", 4.0 * sizes.fanout as f64 / ours.as_secs_f64()),
    );

    // A burst of publishes sent at once through one listener, against the unbatched floor: as
    // many raw NOTIFY statements, prepared, back to back on one warm connection. Rounds
    // interleaved; the total of each side.
    let burst = sizes.requests;
    let (mut floor_time, mut ours_time) = (Duration::ZERO, Duration::ZERO);
    let stats_before = client.send(GetStats::<ListenerStats>::new()).await?;
    for _ in 0..sizes.rounds {
        let t = Instant::now();
        for text in &texts[..burst] {
            admin.query_one(&notify, &[text]).await?;
        }
        floor_time += t.elapsed();
        let t = Instant::now();
        let publishes = (0..burst).map(|i| {
            client.send(Publish::new(
                "bench_burst",
                (i as u64).to_be_bytes().to_vec(),
            ))
        });
        for result in futures_util::future::join_all(publishes).await {
            result??;
        }
        ours_time += t.elapsed();
    }
    let stats = client.send(GetStats::<ListenerStats>::new()).await?;
    report.rate(
        &format!("a burst of {burst} publishes sent at once through one listener (floor: as many raw NOTIFY statements on one connection)"),
        (burst * sizes.rounds) as f64 / ours_time.as_secs_f64(),
        (burst * sizes.rounds) as f64 / floor_time.as_secs_f64(),
        "/s",
    );
    report.note(
        &format!("a burst of {burst} publishes: NOTIFY statements sent per burst"),
        format!(
            "{:.1}",
            (stats.notify_statements - stats_before.notify_statements) as f64 / sizes.rounds as f64
        ),
    );

    // 1 MiB round trip through the store. Its fair floor is what a request/reply of 1 MiB does
    // at the least: the payload goes through the store twice (request and reply), each an insert
    // and a select, and two notifications carry the references. The store must be a table every
    // session sees, so the floor runs the payload table's own insert and select, raw, on one warm
    // connection; a temporary table (no WAL, the backend's own buffers), which no store shared
    // between processes can be, is shown as well, as a lower bound; the two NOTIFY hops are
    // raw ones, made in the same round. Interleaved, p50 of the
    // rounds: with five rounds of a 20 ms operation on a shared machine the p50 was one unlucky
    // sample away from another, so this part takes six times the rounds.
    let rounds = 6 * sizes.rounds as i32;
    let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let payloads = config.payload_table().quoted();
    let insert = admin
        .prepare(&format!(
            "INSERT INTO {payloads} (data, expires_at) VALUES ($1, now() + interval '1 hour')
             RETURNING key::text"
        ))
        .await?;
    let select = admin
        .prepare(&format!(
            "SELECT data FROM {payloads} WHERE key = $1::text::uuid AND expires_at > now()"
        ))
        .await?;
    admin
        .batch_execute("CREATE TEMP TABLE raw_blob (id int PRIMARY KEY, data bytea)")
        .await?;
    let insert_temp = admin
        .prepare("INSERT INTO raw_blob VALUES ($1, $2)")
        .await?;
    let select_temp = admin
        .prepare("SELECT data FROM raw_blob WHERE id = $1")
        .await?;
    let (mut floors, mut temp_floors, mut trips) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_cpu, mut trip_cpu) = (CpuUse::default(), CpuUse::default());
    // This thread (requester, handler and the raw client) on one core, every backend on the
    // other, as between a service and its database on separate machines: left to the
    // scheduler, the floor's one connection and a trip's four or five each ran fast or slow for
    // their life (see `placement`), and the ratio with them.
    let pinned = placement::available();
    let saved = pinned.then(placement::current).transpose()?;
    if pinned {
        placement::pin(0, 0)?;
    }
    for round in 0..rounds {
        if pinned {
            // Again every round, outside the clock, for a connection opened meanwhile.
            placement::pin_backends(&admin, 1).await?;
        }
        let t = Instant::now();
        let mark = CpuMark::now();
        for _ in 0..2 {
            let key: String = admin.query_one(&insert, &[&payload]).await?.get(0);
            let _: Vec<u8> = admin.query_one(&select, &[&key]).await?.get(0);
        }
        mark.add_since(&mut floor_cpu);
        let statements = t.elapsed();
        // The two NOTIFY hops, raw, here and now (same placement, same moment).
        let mut hops = Duration::ZERO;
        for hop in 0..2 {
            let sent = Instant::now();
            admin
                .query_one(&notify, &[&format!("1mib-{round}-{hop}")])
                .await?;
            hops += arrivals.recv().await.expect("the raw listener") - sent;
        }
        floors.push(statements + hops);
        let t = Instant::now();
        for hop in 0..2 {
            let id = round * 2 + hop;
            admin.execute(&insert_temp, &[&id, &payload]).await?;
            let _: Vec<u8> = admin.query_one(&select_temp, &[&id]).await?.get(0);
        }
        temp_floors.push(t.elapsed() + one_way.p(0.5) * 2);
        let t = Instant::now();
        let mark = CpuMark::now();
        let echoed = client
            .send(Ask::new("bench_echo", payload.clone()))
            .await??;
        trips.push(t.elapsed());
        mark.add_since(&mut trip_cpu);
        assert!(echoed == payload);
    }
    if let Some(saved) = &saved {
        placement::restore(saved)?;
    }
    let trips = Samples::new(trips);
    // The requester's and the handler's work both run in this process: what the runtime spends
    // per trip, against what the floor's client spends on the same four statements.
    report.time(
        "1 MiB request/reply round trip: this process's CPU per trip (floor: the raw client's per round)",
        trip_cpu.process / rounds as u32,
        floor_cpu.process / rounds as u32,
    );
    let large = report.time(
        &format!("1 MiB request/reply round trip, p50 of {rounds}, client and backends on separate cores (fair floor: the payload table's raw insert+select of 1 MiB, twice, and two NOTIFY hops)"),
        trips.p(0.5),
        Samples::new(floors).p(0.5),
    );
    report.target(
        "1 MiB request/reply p50: at most 1.2× its fair floor",
        format!("{large:.3}×"),
        large <= 1.2,
    );
    report.time(
        "1 MiB request/reply round trip against a temporary table's insert+select (not shareable between sessions: a lower bound)",
        trips.p(0.5),
        Samples::new(temp_floors).p(0.5),
    );
    Ok(())
}
