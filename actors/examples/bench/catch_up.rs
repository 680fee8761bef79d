//! Topic catch-up: a consumer reading a backlog of events, against a raw keyset-paged SELECT of
//! it, in interleaved rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::topic::Cursor;
use pgcoord::{Config, ErrorKind};
use pgcoord_actors::{Consume, Coordinator, Delivery};
use tokio_postgres::Client;

use crate::Sizes;
use crate::report::Report;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// A backlog of `sizes.backlog` events of `body` appended to `config`'s topic table, then read
/// by the floor and by a consumer of `coordinator`, round after round.
pub async fn run(
    admin: &Client,
    config: &Config,
    coordinator: &Coordinator,
    body: &[u8],
    sizes: &Sizes,
    report: &mut Report,
) -> Res {
    // Catch-up: a consumer reading a backlog, against a raw keyset-paged SELECT of it.
    let backlog = sizes.backlog;
    admin
        .execute(
            &format!(
                "INSERT INTO {} (topic, body) SELECT 'backlog', $1 FROM generate_series(1, $2::int8)",
                config.topic_table().quoted()
            ),
            &[&body, &(backlog as i64)],
        )
        .await?;
    // Statistics for the new rows (or the floor's plan sorts the whole backlog for each page:
    // seen, 10 ms a page), and a VACUUM now rather than autovacuum's during a round (it starts
    // on its own after a million inserts and took the CPU of whichever side ran then); then a
    // pass that sets the rows' hint bits, so neither side pays it.
    let vacuum = format!("VACUUM ANALYZE {}", config.topic_table().quoted());
    admin.batch_execute(&vacuum).await?;
    // The floor's page statement prepared once, as the consumer's is (the pool's connections
    // keep theirs): unnamed, it would be planned again for every page.
    let (reader, connection) = pgcoord::__private::connect(config).await?;
    tokio::spawn(connection);
    let reader = pgcoord::__private::CachingClient::new(reader, config.session_tls().clone());
    keyset(&reader, config, backlog).await?;
    // Interleaved rounds, floor then consumer (a consumer name of its own each, so each reads
    // the whole backlog). Judged on the median of the rounds' ratios: one round's ratio moves
    // by ±10% on a 2-core machine where the client, the read and the ack share the cores.
    let rounds = if backlog >= 100_000 { 5 } else { 2 };
    let (mut floor_total, mut ours_total, mut ratios) =
        (Duration::ZERO, Duration::ZERO, Vec::new());
    let mut grown = 0;
    for round in 0..rounds {
        let floor = keyset(&reader, config, backlog).await?;
        let (took, peak) = catch_up(coordinator, backlog, &format!("bench{round}")).await?;
        (floor_total, ours_total) = (floor_total + floor, ours_total + took);
        ratios.push(floor.as_secs_f64() / took.as_secs_f64());
        grown = grown.max(peak);
    }
    report.note(
        &format!("topic catch-up: resident memory's peak growth while reading {backlog} events (window 1,000)"),
        format!("{:.1} MiB", grown as f64 / (1 << 20) as f64),
    );
    let events = (backlog * rounds) as f64;
    report.rate(
        &format!("topic catch-up: a consumer reading a backlog of {backlog} events, {rounds} rounds (floor: keyset-paged SELECT, 1,000 a page)"),
        events / ours_total.as_secs_f64(),
        events / floor_total.as_secs_f64(),
        "events/s",
    );
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let spread = format!("{:.3}–{:.3}", ratios[0], ratios[ratios.len() - 1]);
    report.note(
        "topic catch-up: each round's rate ÷ the floor's in the same round, lowest–highest",
        format!("{spread}×"),
    );
    report.target(
        "topic catch-up: at least 0.9× the keyset-paged SELECT's rate (the median round's)",
        format!("{median:.3}×"),
        median >= 0.9,
    );
    Ok(())
}

/// A consumer named `consumer` reading the backlog from the oldest event: how long it took,
/// and how much resident memory grew at its peak (sampled every 50 ms).
async fn catch_up(
    coordinator: &Coordinator,
    backlog: usize,
    consumer: &str,
) -> Res<(Duration, u64)> {
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel::<()>();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let before = crate::held::resident_bytes();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                peak.fetch_max(
                    crate::held::resident_bytes(),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        })
    };
    let started = Instant::now();
    let consume = Consume::new("backlog", consumer, move |_: Delivery| {
        if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == backlog {
            let _ = done.send(());
        }
        async { Ok(()) }
    })
    .window(1_000);
    let running = coordinator.consume(consume)?;
    tokio::time::timeout(Duration::from_secs(600), finished.recv()).await?;
    let took = started.elapsed();
    sampler.abort();
    running.stop().await;
    let grown = peak.load(std::sync::atomic::Ordering::Relaxed);
    Ok((took, grown.saturating_sub(before)))
}

/// The floor of catch-up: reading the backlog in pages of 1,000 by keyset.
async fn keyset(
    client: &impl pgcoord::Statements,
    config: &Config,
    backlog: usize,
) -> Res<Duration> {
    let sql = format!(
        "SELECT e.xid::text::int8, e.position, e.appended_at, e.body FROM {} AS e
         WHERE e.topic = 'backlog' AND (e.xid, e.position) > ($1::int8::text::xid8, $2)
         ORDER BY e.xid, e.position LIMIT 1000",
        config.topic_table().quoted()
    );
    let started = Instant::now();
    let (mut cursor, mut read) = (Cursor::START, 0);
    while read < backlog {
        let params: &[pgcoord::__private::Param<'_>] = &[
            (&cursor.xid, tokio_postgres::types::Type::INT8),
            (&cursor.position, tokio_postgres::types::Type::INT8),
        ];
        let rows = client.run(&sql, params).await?;
        // Every row read as an event is, as the consumer reads them.
        let mut last = None;
        for row in &rows {
            let cursor: Cursor = Cursor {
                xid: row.try_get(0)?,
                position: row.try_get(1)?,
            };
            let _: (std::time::SystemTime, Vec<u8>) = (row.try_get(2)?, row.try_get(3)?);
            last = Some(cursor);
        }
        let Some(last) = last else {
            return Err(pgcoord::Error::new(ErrorKind::Other, "the backlog ended early").into());
        };
        cursor = last;
        read += rows.len();
    }
    Ok(started.elapsed())
}
