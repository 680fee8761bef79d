//! Batched topic appends with durable commits: the one place where what batching saves (a
//! commit's WAL flush per append) is paid for as in production.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord_actors::Coordinator;

use crate::Sizes;
use crate::report::Report;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Batched appends where a commit costs what it costs in production: 8 callers through the
/// runtime against 8 raw prepared INSERTs (a transaction each), on a cluster of its own with
/// `fsync` and `synchronous_commit` on (or `DATABASE_URL`'s server, `synchronous_commit` on for
/// these sessions), two interleaved rounds.
pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let (_server, durable) = crate::unlogged::durable_server(pg).await?;
    let config = crate::topics::topic_config(&durable, "bench-durable-topics")?;
    let admin = pgcoord::db::connect_spawned(&config).await?;
    pgcoord::schema::migrate(&admin, &config).await?;
    admin.batch_execute(crate::topics::RAW).await?;
    let coordinator = Coordinator::connect(config.clone()).await?;
    let mut clients = Vec::new();
    let mut inserts = std::collections::HashMap::new();
    for _ in 0..8 {
        let client = Arc::new(pgcoord::db::connect_spawned(&config).await?);
        let insert = client.prepare("INSERT INTO bench_raw_events (topic, body) VALUES ($1, $2)");
        inserts.insert(Arc::as_ptr(&client) as usize, insert.await?);
        clients.push(client);
    }
    let (body, n) = (vec![7u8; 100], sizes.pairs);
    let (mut ours, mut floor) = (0.0, 0.0);
    for _ in 0..2 {
        floor += crate::topics::appends(
            &clients,
            n,
            |c, b| {
                let insert = inserts[&(Arc::as_ptr(&c) as usize)].clone();
                async move {
                    c.execute(&insert, &[&"bench", &b])
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            },
            &body,
        )
        .await?;
        let started = Instant::now();
        let loops = (0..8).map(|_| {
            let (coordinator, body) = (coordinator.clone(), body.clone());
            async move {
                for _ in 0..n / 8 {
                    coordinator.append("bench", &body).await?;
                }
                Ok::<(), Box<dyn std::error::Error>>(())
            }
        });
        for result in futures_util::future::join_all(loops).await {
            result?;
        }
        ours += (n / 8 * 8) as f64 / started.elapsed().as_secs_f64();
    }
    report.rate(
        "topic append through the runtime (batched), 8 callers, fsync and synchronous_commit on (floor: 8 raw prepared INSERTs, a transaction each)",
        ours / 2.0,
        floor / 2.0,
        "events/s",
    );
    coordinator.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
