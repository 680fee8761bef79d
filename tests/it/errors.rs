//! Error classification against real server behaviour.

use std::sync::atomic::{AtomicU32, Ordering};

use pgcoord::__private as db;
use pgcoord::{Error, ErrorKind, Pool};

#[tokio::test]
async fn terminated_backend_is_unavailable() {
    let (config, admin) = super::setup().await;
    let victim = super::connect(&config).await;
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // The first query may see the termination message or a closed connection; both are
    // Unavailable.
    let err: Error = victim.query_one("SELECT 1", &[]).await.unwrap_err().into();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.is_unavailable());
}

#[tokio::test]
async fn refused_connection_is_unavailable() {
    let config = super::builder()
        .dsn("host=127.0.0.1 port=1 user=postgres")
        .build()
        .unwrap();
    let Err(err) = db::connect(&config).await else {
        panic!("nothing listens on port 1")
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
}

#[tokio::test]
async fn serialization_failures_are_retried_then_reported() {
    let (_, client) = super::setup().await;
    let raise = "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$";

    let attempts = AtomicU32::new(0);
    let err = db::retry(|| async {
        attempts.fetch_add(1, Ordering::SeqCst);
        client.batch_execute(raise).await.map_err(Error::from)
    })
    .await
    .unwrap_err();
    assert_eq!(attempts.load(Ordering::SeqCst), db::RETRY_ATTEMPTS);
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
    );

    // Two conflicts, then success: the caller sees only the success.
    let attempts = AtomicU32::new(0);
    let value = db::retry(|| async {
        if attempts.fetch_add(1, Ordering::SeqCst) < 2 {
            client.batch_execute(raise).await.map_err(Error::from)?;
        }
        let row = client.query_one("SELECT 7", &[]).await?;
        Ok(row.get::<_, i32>(0))
    })
    .await
    .unwrap();
    assert_eq!((value, attempts.load(Ordering::SeqCst)), (7, 3));

    // Other errors are not retried.
    let attempts = AtomicU32::new(0);
    let err = db::retry(|| async {
        attempts.fetch_add(1, Ordering::SeqCst);
        client
            .batch_execute("SELECT 1/0")
            .await
            .map_err(Error::from)
    })
    .await
    .unwrap_err();
    assert_eq!(
        (err.kind(), attempts.load(Ordering::SeqCst)),
        (ErrorKind::Other, 1)
    );
}

#[tokio::test]
async fn an_exhausted_pool_is_unavailable_at_the_deadline() {
    let config = super::builder().pool_size(1).build().unwrap();
    let pool = Pool::new(&config);
    let soon = || std::time::Instant::now() + std::time::Duration::from_millis(200);
    let _held = pool.checkout(soon()).await.unwrap();
    let started = std::time::Instant::now();
    let Err(err) = pool.checkout(soon()).await else {
        panic!("the pool of one should be exhausted")
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}
