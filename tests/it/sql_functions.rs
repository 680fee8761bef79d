//! Coordination in SQL (migrations/0012_functions.sql): what any driver or language calls inside
//! its own transaction, here through plain `tokio_postgres` SQL as another driver would send it.
//! The Rust core calls the same functions (a topic read sends the read function's body, one text
//! for both); these tests check what a caller outside it sees.

use std::time::{Duration, SystemTime};

use pgcoord::topic::{Cursor, Start};
use pgcoord::{Error, ErrorKind, LeaseTable, TopicTable};
use tokio_postgres::Client;

use super::{LEASE, grant};

/// The function `suffix` of `table`, quoted: how the migrations name it for this configuration.
fn function(table: &pgcoord::ident::QualifiedName, suffix: &str) -> String {
    table.suffixed(suffix).unwrap().quoted()
}

/// The SQLSTATE of a failed statement, and its pgcoord kind.
fn state(error: tokio_postgres::Error) -> (String, ErrorKind) {
    let code = error.code().expect("a server error").code().to_owned();
    (code, Error::from(error).kind())
}

async fn written(client: &Client, table: &str) -> Vec<String> {
    let rows = client
        .query(&format!("SELECT v FROM {table} ORDER BY v"), &[])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn a_write_fenced_in_sql_commits_while_the_lease_is_held_and_never_after() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let fence = function(config.lock_table(), "_fence");
    let resource = pgcoord_testkit::unique_name("resource");
    client
        .batch_execute(&format!("CREATE TABLE {resource} (v text)"))
        .await
        .unwrap();
    let short = Duration::from_millis(300);
    let held = grant(&table, &client, "job", "rust-holder", short).await;

    // Held: the write and the fence commit together.
    let tx = client.transaction().await.unwrap();
    tx.execute(&format!("SELECT {fence}($1, $2)"), &[&"job", &held.token])
        .await
        .unwrap();
    tx.execute(&format!("INSERT INTO {resource} VALUES ('first')"), &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // The owner, when given, must match too.
    let tx = client.transaction().await.unwrap();
    let e = tx
        .execute(
            &format!("SELECT {fence}($1, $2, $3)"),
            &[&"job", &held.token, &"someone-else"],
        )
        .await
        .unwrap_err();
    assert_eq!(state(e), ("PC001".to_owned(), ErrorKind::LockLost));
    drop(tx);

    // Expired and taken over: the fence raises PC001 and the transaction cannot commit.
    tokio::time::sleep(short * 2).await;
    let next = grant(&table, &client, "job", "rust-contender", LEASE).await;
    assert!(next.token > held.token);
    let tx = client.transaction().await.unwrap();
    tx.execute(&format!("INSERT INTO {resource} VALUES ('late')"), &[])
        .await
        .unwrap();
    let e = tx
        .execute(&format!("SELECT {fence}($1, $2)"), &[&"job", &held.token])
        .await
        .unwrap_err();
    let message = e.as_db_error().unwrap().message().to_owned();
    assert_eq!(state(e), ("PC001".to_owned(), ErrorKind::LockLost));
    assert!(message.contains("'job'"), "{message}");
    // PostgreSQL answers COMMIT in an aborted transaction with a rollback.
    let _ = tx.commit().await;
    assert_eq!(written(&client, &resource).await, ["first"]);

    // The Rust core's fence is the same function: the same kind.
    let tx = client.transaction().await.unwrap();
    let e = (table.owner("rust-holder").unwrap())
        .fence(&tx, "job", held.token)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost);
    assert!(e.to_string().contains("no longer held with token"), "{e}");
}

#[tokio::test]
async fn a_lease_inspected_in_sql() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let lease = function(config.lock_table(), "_lease");
    let held = grant(&table, &client, "seen", "holder-1", LEASE).await;
    let row = client
        .query_one(
            &format!("SELECT owner, token, remaining_ms, data FROM {lease}($1)"),
            &[&"seen"],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "holder-1");
    assert_eq!(row.get::<_, i64>(1), held.token);
    let remaining: i64 = row.get(2);
    assert!(remaining > 0 && remaining <= 30_000, "{remaining}");
    let none = (client.query(&format!("SELECT * FROM {lease}($1)"), &[&"never"]))
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn events_appended_in_sql_are_read_in_order_and_acked_under_a_fence() {
    let (config, mut client) = super::setup().await;
    let topics = TopicTable::new(&config);
    let (append, read, ack) = (
        function(config.topic_table(), "_append"),
        function(config.topic_table(), "_read"),
        function(config.topic_table(), "_ack"),
    );
    // Both forms, bytes and JSON, in one transaction of the caller's, with a Rust append.
    let tx = client.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT * FROM {append}($1, $2::bytea)"),
        &[&"orders", &b"one".as_slice()],
    )
    .await
    .unwrap();
    tx.execute(
        &format!("SELECT * FROM {append}($1, $2::text::jsonb)"),
        &[&"orders", &r#"{"n": 2}"#],
    )
    .await
    .unwrap();
    topics.append(&tx, "orders", b"three").await.unwrap();
    tx.commit().await.unwrap();
    // Rolled back: never there.
    let tx = client.transaction().await.unwrap();
    (tx.execute(
        &format!("SELECT * FROM {append}($1, $2::bytea)"),
        &[&"orders", &b"rolled back".as_slice()],
    ))
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    // Readable once no transaction older than the appends runs anywhere on the server (other
    // tests' may, for a moment): read until all three are there, in order.
    let mut batch = topics
        .read(&client, "orders", Cursor::START, 10)
        .await
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while batch.events.len() < 3 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        batch = topics
            .read(&client, "orders", Cursor::START, 10)
            .await
            .unwrap();
    }
    let bodies: Vec<&[u8]> = batch.events.iter().map(|e| e.body.as_slice()).collect();
    assert_eq!(bodies, [&b"one"[..], br#"{"n": 2}"#, b"three"]);
    let rows = client
        .query(
            &format!("SELECT xid, position, body FROM {read}($1, 0, 0, 10)"),
            &[&"orders"],
        )
        .await
        .unwrap();
    let cursors: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected: Vec<(i64, i64)> = (batch.events.iter())
        .map(|e| (e.cursor.xid, e.cursor.position))
        .collect();
    assert_eq!(cursors, expected);

    // A consumer's ack, fenced by its lease's token: forward only.
    let table = LeaseTable::new(&config);
    let held = grant(&table, &client, "orders-consumer", "billing-1", LEASE).await;
    topics
        .open_consumer(&client, "orders", "billing", Start::Oldest)
        .await
        .unwrap();
    let second = &batch.events[1].cursor;
    let acked = |token: i64, at: &Cursor| {
        let sql = format!("SELECT {ack}($1, $2, $3, $4, $5, $6)");
        let (xid, position) = (at.xid, at.position);
        let client = &client;
        async move {
            client
                .query_one(
                    &sql,
                    &[
                        &"orders",
                        &"billing",
                        &xid,
                        &position,
                        &"orders-consumer",
                        &token,
                    ],
                )
                .await
                .map(|r| r.get::<_, bool>(0))
        }
    };
    assert!(acked(held.token, second).await.unwrap());
    assert!(!acked(held.token, &batch.events[0].cursor).await.unwrap());
    let e = acked(held.token + 1, &batch.events[2].cursor)
        .await
        .unwrap_err();
    assert_eq!(state(e), ("PC001".to_owned(), ErrorKind::LockLost));
    assert_eq!(
        topics.cursor(&client, "orders", "billing").await.unwrap(),
        *second
    );
    // Never opened: PC002, NotFound, from SQL and from Rust alike.
    let e = (client.query_one(
        &format!("SELECT {ack}($1, $2, 0, 1)"),
        &[&"orders", &"nobody"],
    ))
    .await
    .unwrap_err();
    assert_eq!(state(e), ("PC002".to_owned(), ErrorKind::NotFound));
    let e = (topics.ack(&client, "orders", "nobody", *second))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

/// The core's topic read is the read function's body, sent as a statement of its own (planning a
/// call inlines the function afresh at every page): the text in the database is the same one.
#[tokio::test]
async fn the_cores_topic_read_is_the_read_functions_body() {
    let (config, client) = super::setup().await;
    let read = function(config.topic_table(), "_read");
    let signature = format!("{read}(text, bigint, bigint, bigint)");
    let row = (client.query_one(
        "SELECT prosrc FROM pg_proc WHERE oid = $1::text::regprocedure",
        &[&signature],
    ))
    .await
    .unwrap();
    let body: String = row.get(0);
    let sent = TopicTable::new(&config)
        .sql_text("read")
        .unwrap()
        .to_owned();
    assert_eq!(sent, body.trim());
    assert!(sent.contains("pg_snapshot_xmin") && sent.contains("LIMIT $4"));
}

#[tokio::test]
async fn a_tick_completed_in_sql_counts_once() {
    let (config, mut client) = super::setup().await;
    let runs = pgcoord::schedule::ScheduleTable::new(&config);
    let complete = function(config.schedule_table(), "_complete");
    let schedule = pgcoord_testkit::unique_name("nightly");
    let tick = SystemTime::now() - Duration::from_secs(1);
    let attempt = (runs.claim(&client, &schedule, tick, 7, "runner-1"))
        .await
        .unwrap()
        .expect("claimed");
    let call = format!("SELECT {complete}($1, $2, $3, $4)");
    let run = |token: i64| {
        let (call, schedule) = (call.clone(), schedule.clone());
        let attempt = attempt as i32;
        async move |client: &mut Client| {
            let tx = client.transaction().await.unwrap();
            let result = tx
                .execute(&call, &[&schedule, &tick, &token, &attempt])
                .await;
            match result {
                Ok(_) => tx.commit().await.map(drop),
                Err(e) => Err(e),
            }
        }
    };
    // Another token's run no longer counts.
    let e = run(6)(&mut client).await.unwrap_err();
    assert_eq!(state(e), ("PC001".to_owned(), ErrorKind::LockLost));
    run(7)(&mut client).await.unwrap();
    let state_now: String = client
        .query_one(
            &format!(
                "SELECT state FROM {} WHERE schedule = $1",
                config.schedule_table().quoted()
            ),
            &[&schedule],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state_now, "done");
    // Done already: its effects must not apply again.
    let e = run(7)(&mut client).await.unwrap_err();
    assert_eq!(
        state(e),
        ("PC003".to_owned(), ErrorKind::AlreadyAcknowledged)
    );
}

#[tokio::test]
async fn the_functions_are_named_after_their_tables_and_migrate_again() {
    // Every table in a schema of its own: what migrating again would create is read from the
    // schemas pgcoord's tables live in, and other tests create tables in `public` meanwhile.
    let schema = pgcoord_testkit::unique_name("again");
    let config = super::builder()
        .lock_table(format!("{schema}.locks"))
        .payload_table(format!("{schema}.payloads"))
        .topic_table(format!("{schema}.topics"))
        .schedule_table(format!("{schema}.schedules"))
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    pgcoord::schema::migrate(&client, &config).await.unwrap();
    let names: Vec<String> = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p
             WHERE p.proname LIKE $1 || '\\_%' AND p.pronamespace = $2::text::regnamespace
             ORDER BY 1",
            &[&config.lock_table().name().as_str(), &schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Named after the lock table, in its schema (not on the search path: qualified).
    assert_eq!(
        names,
        [
            format!("{schema}.locks_fence(text,bigint,text)"),
            format!("{schema}.locks_lease(text)"),
        ]
    );
    // Migrating again creates and replaces nothing.
    pgcoord::schema::migrate(&client, &config).await.unwrap();
    let pending = pgcoord::schema::migrate_and_report(&client, &config, false)
        .await
        .unwrap();
    assert!(pending.is_empty(), "{pending:?}");
}
