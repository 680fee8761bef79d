//! A pool through PgBouncer in transaction mode, with the session-bound connections (LISTEN,
//! advisory locks, the heartbeat) straight to the server: the deployment of a database behind a
//! pooler. Needs the `pgbouncer` binary (CI installs it): skipped with a line without it, except
//! under CI.

use std::time::Duration;

use pgcoord_actors::*;
use pgcoord_testkit::{PgBouncer, require_program, unique_name};

use super::{Collector, Setup};

#[actix_rt::test]
async fn leases_renewals_and_publishes_go_through_pgbouncer_while_sessions_connect_directly() {
    if require_program("pgbouncer", "pgbouncer").is_none() {
        return;
    }
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let bouncer = PgBouncer::start(&setup.pg).unwrap();
    let app = unique_name("bounced");
    let config = setup
        .builder("bounced")
        .pg_config(&bouncer.pg_config(&setup.pg))
        .session_pg_config(&setup.pg)
        .prepared_statements(false)
        .application_name(&app)
        .pool_size(4)
        .build()
        .unwrap();
    let coord = Coordinator::connect(config).await.unwrap();

    // Leases, concurrently (batched statements) and one held across several heartbeats.
    let acquires = (0..20).map(|i| coord.acquire(Acquire::new(format!("b-{i}"))));
    let leases: Vec<Lease> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let held = coord.acquire(Acquire::new("held")).await.unwrap();
    for lease in leases {
        lease.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        held.loss(),
        None,
        "renewed through the pooler past its 2 s lease"
    );
    let info = coord.get("held").await.unwrap();
    assert_eq!(info.token, Some(held.token()));

    // Events: published through the pooler, heard on the direct LISTEN connection; stored
    // payloads too.
    let (received, recipient) = Collector::<Signal>::start_new();
    coord
        .signals()
        .unwrap()
        .call(Subscribe::new("bounced", recipient))
        .await
        .unwrap();
    coord
        .signals()
        .unwrap()
        .call(Publish::new("bounced", b"small".to_vec()))
        .await
        .unwrap();
    coord
        .signals()
        .unwrap()
        .call(Publish::new("bounced", vec![7u8; 20_000]))
        .await
        .unwrap();
    let messages = received.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(&messages[0].payload[..], b"small");
    assert_eq!(messages[1].payload.len(), 20_000);

    // An advisory lock on its direct session.
    let guard = coord
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(42))
        .await
        .unwrap();

    // Session-bound connections are the server's own clients; the pooler serves only the pool.
    let direct: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name IN ($1, $2, $3)",
            &[
                &format!("{app} listener"),
                &format!("{app} advisory"),
                &format!("{app} heartbeat"),
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        direct, 3,
        "listener, advisory session and heartbeat connect directly"
    );
    let mut console = bouncer.pg_config(&setup.pg);
    console.dbname("pgbouncer");
    let (client, connection) = console.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let clients = client.simple_query("SHOW CLIENTS").await.unwrap();
    let rows = clients
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();

    // The pool's connections (at most 4) and this console.
    assert!((2..=5).contains(&rows), "{rows} pooler clients");
    guard.release().await.unwrap();
    held.release().await.unwrap();
}

#[actix_rt::test]
async fn a_listener_behind_a_transaction_mode_pooler_is_found_deaf() {
    if require_program("pgbouncer", "pgbouncer").is_none() {
        return;
    }
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let bouncer = PgBouncer::start(&setup.pg).unwrap();
    // The mistake the probe is for: the session DSN through the pooler too. LISTEN succeeds,
    // but the pooler hands the server session to others between transactions and drops what
    // arrives on it.
    let through = bouncer.pg_config(&setup.pg);
    let config = setup
        .builder("deaf")
        .pg_config(&through)
        .session_pg_config(&through)
        .prepared_statements(false)
        .ping_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let listener = ListenerActor::new(config, None).start_supervised();
    let (states, recipient) = Collector::<ConnState>::start_new();
    listener.send(SubscribeConnState(recipient)).await.unwrap();
    // Found at once, by the probe the listener sends when it is ready: no ping interval.
    let seen = states.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(
        seen[..2],
        [ConnState::Connected, ConnState::Deaf],
        "{seen:?}"
    );

    // Straight to the server, the same listener hears its probes and stays.
    let config = (setup.builder("hears"))
        .ping_interval(Duration::from_millis(100))
        .ping_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let listener = ListenerActor::new(config, None).start_supervised();
    let (states, recipient) = Collector::<ConnState>::start_new();
    listener.send(SubscribeConnState(recipient)).await.unwrap();
    states.wait_for(1, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        states.received(),
        [ConnState::Connected],
        "20 probes heard back"
    );
    let stats = listener.send(GetStats::new()).await.unwrap();
    assert_eq!(stats.connections, 1);
}
