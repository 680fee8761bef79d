//! `pgcoord::sqlx` (feature `sqlx`): fence, append, ack and complete inside sqlx transactions,
//! checked against what the core sees through tokio-postgres.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::topic::{Cursor, Start};
use pgcoord::{Config, ErrorKind, LeaseTable, TopicTable};
use pgcoord_testkit::unique_name;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgSslMode};
use tokio_postgres::config::Host;

use super::{LEASE, grant};

/// A sqlx pool on the database of `config`.
async fn pool(config: &Config) -> PgPool {
    let pg = config.pg_config();
    let mut options = PgConnectOptions::new_without_pgpass().ssl_mode(PgSslMode::Disable);
    options = match &pg.get_hosts()[0] {
        Host::Tcp(host) => options.host(host),
        Host::Unix(path) => options.socket(path),
    };
    options = options.port(pg.get_ports().first().copied().unwrap_or(5432));
    options = options.username(pg.get_user().expect("a user"));
    if let Some(password) = pg.get_password() {
        options = options.password(std::str::from_utf8(password).unwrap());
    }
    if let Some(database) = pg.get_dbname() {
        options = options.database(database);
    }
    let pool = PgPoolOptions::new().max_connections(2);
    pool.connect_with(options).await.expect("a sqlx pool")
}

async fn written(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(&format!("SELECT v FROM {table} ORDER BY v"))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_sqlx_transaction_fenced_by_a_lease_commits_only_while_it_is_held() {
    let (config, client) = super::setup().await;
    let pool = pool(&config).await;
    let table = LeaseTable::new(&config);
    let resource = unique_name("resource");
    (sqlx::query(&format!("CREATE TABLE {resource} (v text)")).execute(&pool))
        .await
        .unwrap();
    // Long enough for one transaction on a busy machine, short enough to wait out.
    let lease = Duration::from_secs(3);
    let held = grant(&table, &client, "job", "sqlx-holder", lease).await;

    let mut tx = pool.begin().await.unwrap();
    pgcoord::sqlx::fence(&mut *tx, &config, "job", held.token)
        .await
        .unwrap();
    (sqlx::query(&format!("INSERT INTO {resource} VALUES ('first')")).execute(&mut *tx))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Expired and taken over by another owner: the fence fails and the write never commits.
    let contender = table.owner("sqlx-contender").unwrap();
    let deadline = Instant::now() + lease + Duration::from_secs(20);
    let next = loop {
        let request = AcquireRequest::new("job");
        match contender
            .try_acquire(&client, &request, LEASE)
            .await
            .unwrap()
        {
            Attempt::Granted(grant) => break grant,
            _ if Instant::now() < deadline => tokio::time::sleep(lease / 10).await,
            other => panic!("never taken over: {other:?}"),
        }
    };
    assert!(next.token > held.token);
    let mut tx = pool.begin().await.unwrap();
    (sqlx::query(&format!("INSERT INTO {resource} VALUES ('late')")).execute(&mut *tx))
        .await
        .unwrap();
    let e = pgcoord::sqlx::fence(&mut *tx, &config, "job", held.token)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert!(e.to_string().contains("no longer held with token"), "{e}");
    // PostgreSQL answers COMMIT in an aborted transaction with a rollback.
    let _ = tx.commit().await;
    assert_eq!(written(&pool, &resource).await, ["first"]);
    // The new holder's token fences, on the pool too (a transaction of its own).
    pgcoord::sqlx::fence(&pool, &config, "job", next.token)
        .await
        .unwrap();
    // A name that can never be held is refused before any SQL.
    let e = pgcoord::sqlx::fence(&pool, &config, "", next.token)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName);
}

#[tokio::test]
async fn events_appended_in_sqlx_transactions_are_read_in_order_and_ring_the_doorbell() {
    let (config, client) = super::setup().await;
    let pool = pool(&config).await;
    let topics = TopicTable::new(&config);
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen(topics.channel()).await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let one = pgcoord::sqlx::append(&mut *tx, &config, "orders", b"one")
        .await
        .unwrap();
    let two = pgcoord::sqlx::append(&mut *tx, &config, "orders", b"two")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Rolled back: never there.
    let mut tx = pool.begin().await.unwrap();
    pgcoord::sqlx::append(&mut *tx, &config, "orders", b"rolled back")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let three = pgcoord::sqlx::append(&pool, &config, "orders", b"three")
        .await
        .unwrap();

    // Readable once every older transaction of the cluster (other tests') has ended.
    let deadline = Instant::now() + Duration::from_secs(20);
    let batch = loop {
        let batch = (topics.read(&client, "orders", Cursor::START, 10))
            .await
            .unwrap();
        if batch.events.len() >= 3 || Instant::now() > deadline {
            break batch;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let bodies: Vec<&[u8]> = batch.events.iter().map(|e| e.body.as_slice()).collect();
    assert_eq!(bodies, [&b"one"[..], b"two", b"three"]);
    let cursors: Vec<Cursor> = batch.events.iter().map(|e| e.cursor).collect();
    assert_eq!(cursors, [one, two, three]);
    // The commit rang the topic's channel, with the topic's name.
    let rung = tokio::time::timeout(Duration::from_secs(20), listener.recv())
        .await
        .expect("a doorbell")
        .unwrap();
    assert_eq!(rung.payload(), "orders");
}

#[tokio::test]
async fn an_ack_in_sqlx_moves_a_cursor_forward_only() {
    let (config, client) = super::setup().await;
    let pool = pool(&config).await;
    let topics = TopicTable::new(&config);
    let mut at = Vec::new();
    for body in [b"a", b"b", b"c"] {
        at.push(
            pgcoord::sqlx::append(&pool, &config, "jobs", body)
                .await
                .unwrap(),
        );
    }
    (topics.open_consumer(&client, "jobs", "worker", Start::Oldest))
        .await
        .unwrap();
    let ack = async |cursor: Cursor| {
        let mut tx = pool.begin().await.unwrap();
        let moved = pgcoord::sqlx::ack(&mut *tx, &config, "jobs", "worker", cursor).await;
        tx.commit().await.unwrap();
        moved
    };
    assert!(ack(at[1]).await.unwrap());
    assert!(!ack(at[0]).await.unwrap());
    assert!(!ack(at[1]).await.unwrap());
    assert_eq!(
        topics.cursor(&client, "jobs", "worker").await.unwrap(),
        at[1]
    );
    // Rolled back with the handler's effects: the cursor stays.
    let mut tx = pool.begin().await.unwrap();
    let moved = pgcoord::sqlx::ack(&mut *tx, &config, "jobs", "worker", at[2]).await;
    assert!(moved.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(
        topics.cursor(&client, "jobs", "worker").await.unwrap(),
        at[1]
    );
    // Never opened: NotFound.
    let e = pgcoord::sqlx::ack(&pool, &config, "jobs", "nobody", at[2])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

#[tokio::test]
async fn a_tick_completed_in_sqlx_counts_once() {
    let (config, client) = super::setup().await;
    let pool = pool(&config).await;
    let runs = pgcoord::schedule::ScheduleTable::new(&config);
    let schedule = unique_name("nightly");
    // Microseconds and a remainder of nanoseconds: the tick must match the row exactly.
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let tick = UNIX_EPOCH + Duration::new(secs - 2, 123_456_789);
    let next_tick = tick + Duration::new(60, 987_654_321);
    let attempt = (runs.claim(&client, &schedule, tick, 7, "runner-1"))
        .await
        .unwrap()
        .expect("claimed");
    let complete = async |token: i64, commit: bool| {
        let mut tx = pool.begin().await.unwrap();
        let done = pgcoord::sqlx::complete(
            &mut *tx,
            &config,
            &schedule,
            tick,
            token,
            attempt,
            Some(next_tick),
        )
        .await;
        if commit {
            tx.commit().await.unwrap();
        }
        done
    };
    let e = complete(6, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    // Rolled back: still running.
    complete(7, false).await.unwrap();
    complete(7, true).await.unwrap();
    let row = client
        .query_one(
            &format!(
                "SELECT state, next_tick = $2 FROM {} WHERE schedule = $1",
                config.schedule_table().quoted()
            ),
            &[&schedule, &next_tick],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "done");
    assert!(
        row.get::<_, bool>(1),
        "next_tick as tokio-postgres sends it"
    );
    let e = complete(7, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyAcknowledged, "{e}");
}

#[tokio::test]
async fn sqlx_errors_are_classified_as_the_core_classifies_them() {
    let (config, _client) = super::setup().await;
    let pool = pool(&config).await;
    let raise = |code: &str| {
        format!("DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{code}'; END $$")
    };
    let error = async |sql: String| -> pgcoord::Error {
        sqlx::query(&sql).execute(&pool).await.unwrap_err().into()
    };
    let e = error(raise("40001")).await;
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition);
    assert!(e.is_retryable() && !e.is_connection_failure(), "{e:?}");
    assert_eq!(e.to_string(), "database error 40001: raised");
    let e = error(raise("PC003")).await;
    assert_eq!(e.kind(), ErrorKind::AlreadyAcknowledged);
    assert_eq!(e.to_string(), "raised");
    let e = error("SELECT 1/0".to_owned()).await;
    assert_eq!(e.kind(), ErrorKind::Other);
    assert!(!e.is_retryable());
    pool.close().await;
    let e = error("SELECT 1".to_owned()).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.is_connection_failure(), "{e:?}");
}
