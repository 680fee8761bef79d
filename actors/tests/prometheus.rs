//! What Prometheus scrapes: pgcoord's metrics as `metrics-exporter-prometheus` renders them, with
//! the buckets of `pgcoord_actors::metrics::BUCKETS`. A binary of its own: the recorder is
//! process-global, and must be installed before the actors start.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use pgcoord_actors::*;
use pgcoord_testkit::{test_pg_config, unique_name};

/// Polls the rendered text until it has `line`, for at most ten seconds.
async fn until_line(prometheus: &PrometheusHandle, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = prometheus.render();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(Instant::now() < deadline, "no line {line:?} in:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn histograms_have_buckets_counters_start_at_zero_and_the_pool_is_gauged() {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in pgcoord_actors::metrics::BUCKETS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)
            .unwrap();
    }
    let prometheus = builder.install_recorder().unwrap();

    let table = unique_name("prometheus");
    let config = |owner: &str, pool_size: u32| {
        pgcoord::Config::builder()
            .pg_config(&test_pg_config().unwrap())
            .lock_table(&table)
            .payload_table(format!("{table}_p"))
            .topic_table(format!("{table}_t"))
            .schedule_table(format!("{table}_s"))
            .owner(owner)
            .pool_size(pool_size)
            .build()
            .unwrap()
    };
    let admin = pgcoord::db::connect_spawned(&config("admin", 1))
        .await
        .unwrap();
    pgcoord::schema::migrate(&admin, &config("admin", 1))
        .await
        .unwrap();
    let me = Coordinator::connect(config("me", 3)).await.unwrap();

    // Once the actors started, before anything was lost: the series the alerts of
    // docs/OPERATIONS.md watch are there at 0, so their first rise is seen; the pool's gauges
    // are there too.
    for line in [
        r#"pgcoord_losses_total{kind="lease",reason="deadline_passed"} 0"#,
        r#"pgcoord_losses_total{kind="lease",reason="taken_over"} 0"#,
        r#"pgcoord_losses_total{kind="advisory",reason="connection_lost"} 0"#,
        r#"pgcoord_losses_total{kind="advisory",reason="stalled"} 0"#,
        r#"pgcoord_acquires_total{outcome="error"} 0"#,
        "pgcoord_renew_failures_total 0",
        "pgcoord_pool_max_connections 3",
        "pgcoord_pool_pending_checkouts 0",
    ] {
        until_line(&prometheus, line).await;
    }

    // Latencies are histograms with the buckets given, never summaries.
    let lease = me.acquire(Acquire::new("a")).await.unwrap();
    lease.release().await.unwrap();
    let text = prometheus.render();
    for line in [
        "# TYPE pgcoord_acquire_wait_seconds histogram",
        r#"pgcoord_acquire_wait_seconds_bucket{le="0.001"}"#,
        r#"pgcoord_acquire_wait_seconds_bucket{le="3600"}"#,
        r#"pgcoord_acquire_wait_seconds_bucket{le="+Inf"} 1"#,
        "pgcoord_acquire_wait_seconds_count 1",
        "# TYPE pgcoord_pool_wait_seconds histogram",
        r#"pgcoord_pool_wait_seconds_bucket{le="0.0005"}"#,
        r#"pgcoord_pool_wait_seconds_bucket{le="30"}"#,
        "pgcoord_pool_wait_seconds_count",
        "# HELP pgcoord_pool_wait_seconds",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no line {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains(" summary"), "a summary in:\n{text}");
    assert!(!text.contains("microseconds"), "{text}");

    // The application's pool of one connection, which it holds while an acquire needs it: the
    // acquire's checkout is seen waiting (the gauges are sampled each second), then done.
    let tight = config("tight", 1);
    let manager = pgcoord::bb8_postgres::PostgresConnectionManager::new(
        tight.pg_config().clone(),
        tight.tls().clone(),
    );
    let app_pool = pgcoord::bb8::Pool::builder()
        .max_size(1)
        .build(manager)
        .await
        .unwrap();
    let pool = pgcoord::Pool::from_bb8(&tight, app_pool.clone());
    let tight = Coordinator::connect_with_pool(tight, pool).await.unwrap();
    // The process's pools add up: 3 of its own, 1 of the application's.
    until_line(&prometheus, "pgcoord_pool_max_connections 4").await;
    let taken = app_pool.get_owned().await.unwrap();
    let acquire = tight.acquire(Acquire::new("tight"));
    let acquired = tokio::spawn(acquire);
    until_line(&prometheus, "pgcoord_pool_pending_checkouts 1").await;
    drop(taken);
    acquired.await.unwrap().unwrap().release().await.unwrap();
    until_line(&prometheus, "pgcoord_pool_pending_checkouts 0").await;
}
