//! Starting the runtime against a database that is down, unreachable, not PostgreSQL, not
//! migrated or read-only: the fallible start, and a runtime that becomes usable by itself.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::{Config, ErrorKind};
use pgcoord_actors::*;
use pgcoord_testkit::{TempPostgres, unique_name};

use super::own_cluster::{on_server, own_cluster};
use super::{Collector, Setup};

const LEASE: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(400);

#[actix_rt::test]
async fn a_runtime_started_while_the_server_is_down_is_usable_when_it_is_up() {
    let (server, setup, _admin) = own_cluster().await;
    on_server(&server, TempPostgres::stop).await;
    let coordinator = Coordinator::start(setup.builder("late").build().unwrap());
    let (states, recipient) = Collector::<ConnState>::start_new();
    coordinator
        .signals()
        .unwrap()
        .send(SubscribeConnState(recipient))
        .await
        .unwrap();
    // Accepted while the database is down: listened on once it is up.
    let channel = unique_name("events");
    let (events, recipient) = Collector::<Signal>::start_new();
    let subscribed = coordinator
        .signals()
        .unwrap()
        .send(Subscribe::new(channel.clone(), recipient));
    let down = coordinator
        .locks()
        .unwrap()
        .send(Acquire::new("job").timeout(Duration::from_millis(300)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(down.kind(), ErrorKind::Unavailable, "{down}");
    tokio::time::sleep(Duration::from_secs(1)).await;

    on_server(&server, TempPostgres::start_again).await;
    let up = Instant::now();
    let lease = coordinator
        .locks()
        .unwrap()
        .send(Acquire::new("job").timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    let first_acquire = up.elapsed();
    assert!(first_acquire < Duration::from_secs(2), "{first_acquire:?}");
    let _held = coordinator
        .advisory()
        .unwrap()
        .send(AdvisoryLock::new(42))
        .await
        .unwrap()
        .unwrap();
    subscribed.await.unwrap().unwrap();
    coordinator
        .signals()
        .unwrap()
        .send(Publish::new(&channel, b"hello".to_vec()))
        .await
        .unwrap()
        .unwrap();
    let got = events.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].payload[..], *b"hello");
    assert!(states.received().contains(&ConnState::Connected));
    lease.release().await.unwrap();
    eprintln!("first acquire {first_acquire:?} after the server was up");
}

#[actix_rt::test]
async fn connect_fails_with_the_cause_within_the_connect_timeout() {
    super::init_tracing();
    let timeout = Duration::from_millis(800);
    let config = |dsn: String| {
        Config::builder()
            .dsn(dsn)
            .connect_timeout(timeout)
            .build()
            .unwrap()
    };
    // Nothing listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    // Accepts, then says nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    // Accepts and answers with something that is not PostgreSQL.
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_port = http.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = http.accept().await {
            let _ = socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    for port in [port, silent_port, http_port] {
        let started = Instant::now();
        let err = LockManager::connect(config(format!(
            "host=127.0.0.1 port={port} user=postgres connect_timeout=1"
        )))
        .await
        .unwrap_err();
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "port {port}: {err}");
        assert!(
            std::error::Error::source(&err).is_some(),
            "a cause: {err:?}"
        );
        assert!(took < Duration::from_millis(1500), "port {port}: {took:?}");
        let err = Coordinator::connect(config(format!("host=127.0.0.1 port={port} user=postgres")))
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
    }
}

#[actix_rt::test]
async fn connect_names_missing_tables_and_refuses_a_read_only_server() {
    let (setup, admin) = Setup::new(LEASE, HEARTBEAT).await;
    let missing = setup
        .builder("x")
        .lock_table(unique_name("nothing"))
        .build()
        .unwrap();
    let err = LockManager::connect(missing).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("schema::migrate"), "{err}");
    assert!(err.to_string().contains("migrations/"), "{err}");

    // A schema from before the waiters' table (an upgrade not migrated yet) is named too.
    let config = setup.builder("x").build().unwrap();
    admin
        .batch_execute(&format!("DROP TABLE {}", config.lock_queue().quoted()))
        .await
        .unwrap();
    let err = LockManager::connect(config.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("waiters' table"), "{err}");
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    LockManager::connect(config).await.unwrap();

    let database = unique_name("ro");
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {database} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    let mut pg = setup.pg.clone();
    pg.dbname(&database);
    let read_only = setup.builder("x").pg_config(&pg).build().unwrap();
    let err = Coordinator::connect(read_only).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::ReadOnly, "{err}");

    let fine = LockManager::connect(setup.builder("x").build().unwrap()).await;
    assert!(fine.is_ok());
}

#[actix_rt::test]
async fn an_acquire_with_no_connection_is_unavailable_not_contention() {
    super::init_tracing();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = Config::builder()
        .dsn(format!("host=127.0.0.1 port={port} user=postgres"))
        .build()
        .unwrap();
    let manager = LockManager::new(config).start();
    let started = Instant::now();
    let err = manager
        .send(Acquire::new("job").timeout(Duration::from_millis(500)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("refused"), "says why: {err}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// With session-bound connections set apart (a pooler in front of the pool), the fallible start
/// checks both servers: either one unreachable is `Unavailable` naming it.
#[actix_rt::test]
async fn connect_checks_the_pools_server_and_the_sessions_server() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut unreachable = tokio_postgres::Config::new();
    unreachable
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres");
    // (the pool's server, the sessions' server): one of them unreachable.
    for (pool, session) in [(&unreachable, &setup.pg), (&setup.pg, &unreachable)] {
        let builder = setup
            .builder("both")
            .pg_config(pool)
            .session_pg_config(session);
        let err = Coordinator::connect(builder.build().unwrap())
            .await
            .expect_err("one server is unreachable");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}

/// `pool_timeout` bounds a wait for a free pooled connection, also for a caller whose own
/// timeout is longer: with the only connection taken, an acquire is `Unavailable` (saying the
/// pool stayed busy) after the pool timeout, not after its own 10 s.
#[actix_rt::test]
async fn a_busy_pool_is_waited_for_no_longer_than_the_pool_timeout() {
    let (setup, _admin) = Setup::new(LEASE, HEARTBEAT).await;
    let config = setup
        .builder("busy")
        .pool_size(1)
        .pool_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let pool = pgcoord::Pool::new(&config);
    let coordinator = Coordinator::start_with_pool(config, pool.clone());
    let taken = pool
        .checkout(Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let started = Instant::now();
    let request = Acquire::new("job").timeout(Duration::from_secs(10));
    let err = coordinator
        .locks()
        .unwrap()
        .call(request)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(1),
        "{took:?}"
    );
    drop(taken);
    let lease = coordinator.acquire(Acquire::new("job")).await.unwrap();
    lease.release().await.unwrap();
    // A Coordinator is Debug (so `connect(..).unwrap_err()` compiles) and shows no secret.
    let shown = format!("{coordinator:?}");
    assert!(
        shown.contains("busy") && !shown.contains("password"),
        "{shown}"
    );
}
