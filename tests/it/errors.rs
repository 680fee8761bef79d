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

/// A refused login has a kind of its own, whatever refused it — a wrong password (28P01), a role
/// the server does not know (28000), a password the server asks for and the settings lack — and
/// so has a database that does not exist (3D000). No message shows the password.
#[tokio::test]
async fn refused_logins_and_missing_databases_have_their_own_kinds() {
    const PASSWORD: &str = "Zq9x-right-pw";
    const WRONG: &str = "Zq9x-wrong-pw";
    let rules = "host all app 127.0.0.1/32 scram-sha-256\n";
    let server = pgcoord_testkit::TempPostgres::start_with_hba(rules).unwrap();
    let (admin, connection) = server
        .pg_config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // Stored as SCRAM, which the rule asks for (PostgreSQL 13 stores md5 by default).
    let create = format!(
        "SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"
    );
    admin.batch_execute(&create).await.unwrap();
    let connect = async |user: &str, password: Option<&str>, dbname: &str| {
        let mut pg = server.pg_config();
        pg.user(user).dbname(dbname);
        if let Some(password) = password {
            pg.password(password);
        }
        let config = pgcoord::Config::builder().pg_config(&pg).build().unwrap();
        db::connect(&config).await.map(drop)
    };
    let refused = async |user: &str, password: Option<&str>, dbname: &str| {
        let e = connect(user, password, dbname).await.unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(WRONG),
            "{shown}"
        );
        e
    };

    let e = refused("app", Some(WRONG), "postgres").await;
    assert_eq!(e.kind(), ErrorKind::AuthenticationFailed, "{e:?}");
    assert!(e.is_authentication_failed() && !e.is_unavailable());
    assert_eq!(e.code().map(|c| c.code()), Some("28P01"));
    assert!(
        e.to_string().contains("password authentication failed"),
        "{e}"
    );
    let e = refused("nobody", None, "postgres").await;
    assert_eq!(e.kind(), ErrorKind::AuthenticationFailed, "{e:?}");
    assert_eq!(e.code().map(|c| c.code()), Some("28000"));
    let e = refused("app", None, "postgres").await;
    assert_eq!(e.kind(), ErrorKind::AuthenticationFailed, "{e:?}");
    assert!(e.to_string().contains("password missing"), "{e}");

    let e = refused("app", Some(PASSWORD), "no_such_db").await;
    assert_eq!(e.kind(), ErrorKind::DatabaseNotFound, "{e:?}");
    assert!(e.is_database_not_found());
    assert_eq!(e.code().map(|c| c.code()), Some("3D000"));
    assert!(e.to_string().contains("no_such_db"), "{e}");
    connect("app", Some(PASSWORD), "postgres").await.unwrap();
}
