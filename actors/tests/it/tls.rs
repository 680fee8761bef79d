//! The whole runtime over TLS with `sslmode=verify-full`: leases (granted, renewed, released),
//! an advisory lock, events with an inline and a stored payload, and a request/reply — and every
//! connection the runtime opened is encrypted, as the server sees it.

use std::time::Duration;

use pgcoord::{Config, SslMode};
use pgcoord_actors::*;
use pgcoord_testkit::{TempPostgres, unique_name};

use super::Collector;

#[actix_rt::test]
async fn leases_advisory_locks_and_signals_work_over_verified_tls() {
    super::init_tracing();
    let server = TempPostgres::shared_tls().expect("a cluster with TLS");
    let app = unique_name("tls");
    let config = Config::builder()
        .dsn(format!(
            "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
            server.port(),
            server.root_cert().unwrap().display()
        ))
        .lock_table(unique_name("locks"))
        .payload_table(unique_name("payloads"))
        .application_name(&app)
        .lease(Duration::from_secs(2))
        .heartbeat(Duration::from_millis(400))
        .build()
        .unwrap();
    assert_eq!(config.tls().mode(), SslMode::VerifyFull);
    let admin = pgcoord::db::connect_spawned(&config).await.unwrap();
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    let coord = Coordinator::connect(config).await.unwrap();

    // A lease held across several renewals, then released.
    let lease = coord.acquire(Acquire::new("tls-lease")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(lease.loss(), None, "renewed over TLS past its 2 s lease");
    let info = coord.get("tls-lease").await.unwrap();
    assert_eq!(info.token, Some(lease.token()));

    // An advisory lock on its own session.
    let guard = coord
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(7))
        .await
        .unwrap();

    // Events, inline and through the payload store, heard on the LISTEN connection.
    let (received, recipient) = Collector::<Signal>::start_new();
    let channel = unique_name("tls_events");
    coord
        .signals()
        .unwrap()
        .call(Subscribe::new(channel.clone(), recipient))
        .await
        .unwrap();
    for payload in [b"small".to_vec(), vec![9u8; 100_000]] {
        coord
            .signals()
            .unwrap()
            .call(Publish::new(&channel, payload))
            .await
            .unwrap();
    }
    let messages = received.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(&messages[0].payload[..], b"small");
    assert_eq!(messages[1].payload.len(), 100_000);

    // A request and its reply.
    let echo = unique_name("tls_echo");
    coord
        .signals()
        .unwrap()
        .call(Serve::new(&echo, |p| async move { Ok(p) }))
        .await
        .unwrap();
    let reply = coord
        .signals()
        .unwrap()
        .call(Ask::new(&echo, b"ping".to_vec()))
        .await
        .unwrap();
    assert_eq!(&reply[..], b"ping");

    // Every connection of this runtime: pool, listener, advisory session, heartbeat.
    let rows = admin
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a
               JOIN pg_stat_ssl s USING (pid)
              WHERE a.application_name LIKE $1 || '%' AND pid <> pg_backend_pid()",
            &[&app],
        )
        .await
        .unwrap();
    let sessions: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for role in ["listener", "advisory", "heartbeat"] {
        assert!(
            sessions
                .iter()
                .any(|(name, _)| *name == format!("{app} {role}")),
            "{role} in {sessions:?}"
        );
    }
    assert!(
        sessions.iter().any(|(name, _)| *name == app),
        "a pooled connection in {sessions:?}"
    );
    assert!(
        sessions.iter().all(|(_, ssl)| *ssl),
        "every session encrypted: {sessions:?}"
    );

    guard.release().await.unwrap();
    lease.release().await.unwrap();
}

/// A runtime started without the check (`start`, not `connect`) against a server whose
/// certificate is for another host: calls fail with `Tls` at once, saying why, instead of
/// retrying as `Unavailable` until their timeout; the checking starts refuse with `Tls`.
#[actix_rt::test]
async fn a_certificate_it_cannot_trust_fails_calls_with_tls_at_once() {
    super::init_tracing();
    let server = TempPostgres::shared_tls().expect("a cluster with TLS");
    let config = Config::builder()
        .dsn(format!(
            "host=db.example hostaddr=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
            server.port(),
            server.root_cert().unwrap().display()
        ))
        .lock_table(unique_name("locks"))
        .build()
        .unwrap();
    let (manager, table) = super::manager_on_pool(config.clone());
    let started = std::time::Instant::now();
    let request = Acquire::new("job").timeout(Duration::from_secs(10));
    let err = manager.call(request).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Tls, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let err = table.list_prefix("").await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Tls, "{err}");
    let err = AdvisoryLocks::connect(config.clone()).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Tls, "{err}");
    let err = ListenerActor::connect(config.clone(), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Tls, "{err}");
    let err = LockManager::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Tls, "{err}");
}
