//! Durable topics against a real PostgreSQL: an event exists if and only if its transaction
//! commits, a late commit is never skipped, consumers' cursors move forward only and with their
//! effects, and many appends go in one statement.

use std::time::{Duration, SystemTime};

use pgcoord::topic::{Cursor, Event, Start, TopicTable};
use pgcoord::{ErrorKind, LeaseTable};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{LEASE, grant};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Order {
    id: u32,
    item: String,
}

pub(super) async fn setup() -> (pgcoord::Config, Client, TopicTable) {
    let (config, client) = super::setup().await;
    let table = TopicTable::new(&config);
    (config, client, table)
}

/// The next `n` events of `topic` after `after`, in order, read two at a time. The horizon is
/// the whole cluster's, and the other tests' transactions hold it back for moments: reads wait
/// for them, within a bound.
pub(super) async fn next_n(
    table: &TopicTable,
    client: &Client,
    topic: &str,
    after: Cursor,
    n: usize,
) -> Vec<Event> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut events: Vec<Event> = Vec::new();
    let mut cursor = after;
    while events.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} events",
            events.len()
        );
        let batch = table.read(client, topic, cursor, 2).await.unwrap();
        match batch.events.last() {
            Some(last) => cursor = last.cursor,
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        events.extend(batch.events);
    }
    events
}

/// The bodies of the next `n` events.
pub(super) async fn bodies(
    table: &TopicTable,
    client: &Client,
    topic: &str,
    after: Cursor,
    n: usize,
) -> Vec<Vec<u8>> {
    (next_n(table, client, topic, after, n).await.into_iter())
        .map(|e| e.body)
        .collect()
}

/// Nothing after `after` is read now.
pub(super) async fn nothing_after(table: &TopicTable, client: &Client, topic: &str, after: Cursor) {
    let batch = table.read(client, topic, after, 10).await.unwrap();
    assert!(batch.events.is_empty(), "{:?}", batch.events);
}

#[tokio::test]
async fn an_event_exists_if_and_only_if_its_transaction_commits() {
    let (config, mut client, table) = setup().await;
    let tx = client.transaction().await.unwrap();
    let order = Order {
        id: 7,
        item: "tea".into(),
    };
    let appended = table.append_value(&tx, "orders", &order).await.unwrap();
    let other = super::connect(&config).await;
    nothing_after(&table, &other, "orders", Cursor::START).await;
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    table.append(&tx, "orders", b"rolled back").await.unwrap();
    tx.rollback().await.unwrap();
    let large = vec![0xa5_u8; 1 << 20];
    table.append(&client, "orders", &large).await.unwrap();
    table.append(&client, "elsewhere", b"x").await.unwrap();

    let events = next_n(&table, &other, "orders", Cursor::START, 2).await;
    assert_eq!(events[0].cursor, appended);
    assert_eq!(events[0].value::<Order>().unwrap(), order);
    assert_eq!(events[1].body, large);
    assert!(events[0].cursor < events[1].cursor);
    // Of this topic only, and nothing rolled back.
    nothing_after(&table, &other, "orders", events[1].cursor).await;
}

#[tokio::test]
async fn a_late_commit_is_never_skipped_and_holds_readers_back_until_it_ends() {
    let (config, client, table) = setup().await;
    table.append(&client, "t", b"first").await.unwrap();
    let cursor = next_n(&table, &client, "t", Cursor::START, 1).await[0].cursor;
    // `early` takes its transaction id first and commits last.
    let mut early = super::connect(&config).await;
    let mut late = super::connect(&config).await;
    let early_tx = early.transaction().await.unwrap();
    table.append(&early_tx, "t", b"early").await.unwrap();
    let late_tx = late.transaction().await.unwrap();
    table.append(&late_tx, "t", b"late").await.unwrap();
    late_tx.commit().await.unwrap();
    // "late" has committed, but reading it now would move the cursor past "early".
    nothing_after(&table, &client, "t", cursor).await;
    // Nor is it counted in the lag: what a read could read now.
    assert_eq!(table.lag(&client, "t", cursor, 100).await.unwrap(), 0);
    // The oldest transaction on the server is named: ours, once the other tests' moments
    // in a transaction have passed.
    let pid: i32 = early_tx
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let holder = table.held_back(&client).await.unwrap().expect("held back");
        if holder.pid == pid {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never named: {holder:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    early_tx.commit().await.unwrap();
    assert_eq!(
        bodies(&table, &client, "t", cursor, 2).await,
        [b"early".to_vec(), b"late".to_vec()]
    );
    // Both count now; a count stops at its bound.
    assert_eq!(table.lag(&client, "t", cursor, 100).await.unwrap(), 2);
    assert_eq!(table.lag(&client, "t", cursor, 1).await.unwrap(), 1);
}

/// A prepared transaction holds every reader back as an open one does, though no session holds
/// it: `held_back` names it by its gid (it is in `pg_prepared_xacts`, not `pg_stat_activity`),
/// and what was appended after it is read once it is rolled back. One that appended cannot be
/// prepared: the append's doorbell is a NOTIFY. (A cluster of its own, with prepared
/// transactions on: the prepared one would hold back every other test's readers.)
#[tokio::test]
async fn a_prepared_transaction_holds_readers_back_and_is_named_by_its_gid() {
    let server =
        pgcoord_testkit::TempPostgres::start_with(&[("max_prepared_transactions", "2")]).unwrap();
    let config = pgcoord::Config::builder()
        .pg_config(&server.pg_config())
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    pgcoord::schema::migrate(&client, &config).await.unwrap();
    let table = TopicTable::new(&config);
    table.append(&client, "t", b"first").await.unwrap();
    let cursor = next_n(&table, &client, "t", Cursor::START, 1).await[0].cursor;

    let mut appender = super::connect(&config).await;
    let tx = appender.transaction().await.unwrap();
    table.append(&tx, "t", b"never").await.unwrap();
    let refused = tx
        .batch_execute("PREPARE TRANSACTION 'appended'")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
        "{refused:?}"
    );
    drop(tx);

    // A transaction with an id, prepared: its session goes on to other things.
    let preparer = super::connect(&config).await;
    preparer
        .batch_execute("BEGIN; SELECT pg_current_xact_id(); PREPARE TRANSACTION 'stuck-migration'")
        .await
        .unwrap();
    table.append(&client, "t", b"after").await.unwrap();
    nothing_after(&table, &client, "t", cursor).await;
    let held = table.held_back(&client).await.unwrap().expect("held back");
    assert_eq!(
        held.prepared.as_deref(),
        Some("stuck-migration"),
        "{held:?}"
    );
    assert_eq!((held.pid, held.database.as_deref()), (0, Some("postgres")));
    assert!(held.age < Duration::from_secs(60), "{held:?}");

    client
        .batch_execute("ROLLBACK PREPARED 'stuck-migration'")
        .await
        .unwrap();
    assert_eq!(
        bodies(&table, &client, "t", cursor, 1).await,
        [b"after".to_vec()]
    );
    let after = table.held_back(&client).await.unwrap();
    assert!(
        after.as_ref().is_none_or(|h| h.prepared.is_none()),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_consumer_opens_once_and_its_cursor_moves_forward_only() {
    let (_config, mut client, table) = setup().await;
    for body in [b"a", b"b", b"c"] {
        table.append(&client, "t", body).await.unwrap();
    }
    let events = next_n(&table, &client, "t", Cursor::START, 3).await;
    let (a, b) = (events[0].cursor, events[1].cursor);
    let start = SystemTime::now();
    assert_eq!(
        table
            .open_consumer(&client, "t", "billing", Start::Oldest)
            .await
            .unwrap(),
        Cursor::START
    );
    // Opened again, from elsewhere: the stored cursor wins.
    let again = table
        .open_consumer(&client, "t", "billing", Start::Now)
        .await
        .unwrap();
    assert_eq!(again, Cursor::START);
    assert!(table.ack(&client, "t", "billing", b).await.unwrap());
    assert!(
        !table.ack(&client, "t", "billing", a).await.unwrap(),
        "never back"
    );
    assert_eq!(table.cursor(&client, "t", "billing").await.unwrap(), b);
    // An ack in a transaction that rolls back moves nothing.
    let tx = client.transaction().await.unwrap();
    assert!(
        table
            .ack(&tx, "t", "billing", events[2].cursor)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    assert_eq!(table.cursor(&client, "t", "billing").await.unwrap(), b);
    table
        .reset_consumer(&client, "t", "billing", a)
        .await
        .unwrap();
    assert_eq!(table.cursor(&client, "t", "billing").await.unwrap(), a);
    // The other starts.
    let now = table
        .open_consumer(&client, "t", "late", Start::Now)
        .await
        .unwrap();
    nothing_after(&table, &client, "t", now).await;
    table.append(&client, "t", b"d").await.unwrap();
    assert_eq!(bodies(&table, &client, "t", now, 1).await, [b"d".to_vec()]);
    let after = table
        .open_consumer(&client, "t", "after", Start::After(a))
        .await
        .unwrap();
    assert_eq!(after, a);
    let timed = table
        .open_consumer(&client, "t", "timed", Start::Time(start))
        .await
        .unwrap();
    assert_eq!(
        bodies(&table, &client, "t", timed, 1).await,
        [b"d".to_vec()]
    );
    let infos = table.consumers(&client, "t").await.unwrap();
    let names: Vec<_> = infos.iter().map(|i| i.consumer.as_str()).collect();
    assert_eq!(names, ["after", "billing", "late", "timed"]);
    assert_eq!((infos[1].lag_events, infos[2].lag_events), (3, 1));
    assert!(infos[1].oldest_unacked.is_some());
    // Unknown consumers and bad names are typed errors.
    let err = table.ack(&client, "t", "nobody", a).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        table
            .cursor(&client, "t", "nobody")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    let err = table
        .open_consumer(&client, "", "x", Start::Now)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    let err = table
        .read(&client, "t", Cursor::START, 0)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

/// The consumer's lease fences its ack: effects and cursor commit together, and a consumer
/// whose lease was taken over changes neither.
#[tokio::test]
async fn an_ack_fenced_by_the_consumers_lease_applies_each_event_exactly_once() {
    let (config, mut client, table) = setup().await;
    let leases = LeaseTable::new(&config);
    client
        .batch_execute("CREATE TEMP TABLE applied (body bytea PRIMARY KEY)")
        .await
        .unwrap();
    for body in [b"1", b"2"] {
        table.append(&client, "t", body).await.unwrap();
    }
    table
        .open_consumer(&client, "t", "c", Start::Oldest)
        .await
        .unwrap();
    let lease = "topic t consumer c";
    let mine = grant(&leases, &client, lease, "me", LEASE).await;
    let owner = leases.owner("me").unwrap();
    // Handles one event: its effect and the ack in one transaction, fenced.
    async fn handle(
        table: &TopicTable,
        owner: &pgcoord::lease::LeaseOwner<'_>,
        client: &mut Client,
        lease: &str,
        token: i64,
    ) -> pgcoord::Result<bool> {
        let tx = client.transaction().await?;
        owner.fence(&tx, lease, token).await?;
        let cursor = table.cursor(&tx, "t", "c").await?;
        let Some(event) = table.read(&tx, "t", cursor, 1).await?.events.pop() else {
            return Ok(false);
        };
        tx.execute("INSERT INTO applied VALUES ($1)", &[&event.body])
            .await?;
        table.ack(&tx, "t", "c", event.cursor).await?;
        tx.commit().await?;
        Ok(true)
    }
    // Both events are readable now (the horizon only moves forward).
    next_n(&table, &client, "t", Cursor::START, 2).await;
    assert!(
        handle(&table, &owner, &mut client, lease, mine.token)
            .await
            .unwrap()
    );
    // Taken over: the old token's handler fails at its fence and applies nothing.
    client
        .execute(
            &format!(
                "UPDATE {} SET token = token + 1000 WHERE name = $1",
                config.lock_table().quoted()
            ),
            &[&lease],
        )
        .await
        .unwrap();
    let err = handle(&table, &owner, &mut client, lease, mine.token)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let new = mine.token + 1000;
    assert!(
        handle(&table, &owner, &mut client, lease, new)
            .await
            .unwrap()
    );
    assert!(
        !handle(&table, &owner, &mut client, lease, new)
            .await
            .unwrap(),
        "all handled"
    );
    let applied: i64 = client
        .query_one("SELECT count(*) FROM applied", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied, 2, "each event once");
}

#[tokio::test]
async fn append_many_appends_in_order_in_one_transaction_or_nothing() {
    let (_config, mut client, table) = setup().await;
    let events: Vec<(&str, &[u8])> = vec![("t", b"1"), ("u", b"2"), ("t", b"3")];
    let tx = client.transaction().await.unwrap();
    table.append_many(&tx, &events).await.unwrap();
    tx.rollback().await.unwrap();
    let cursors = table.append_many(&client, &events).await.unwrap();
    assert_eq!(cursors.len(), 3);
    assert!(
        cursors[0] < cursors[1] && cursors[1] < cursors[2],
        "{cursors:?}"
    );
    assert!(
        cursors.iter().all(|c| c.xid == cursors[0].xid),
        "one transaction"
    );
    let t = next_n(&table, &client, "t", Cursor::START, 2).await;
    assert_eq!((t[0].cursor, t[1].cursor), (cursors[0], cursors[2]));
    assert_eq!(
        (t[0].body.as_slice(), t[1].body.as_slice()),
        (&b"1"[..], &b"3"[..])
    );
    nothing_after(&table, &client, "t", cursors[2]).await;
    assert_eq!(
        next_n(&table, &client, "u", Cursor::START, 1).await[0].body,
        b"2"
    );
    // Bad input fails before any SQL, and nothing is appended.
    let bad: Vec<(&str, &[u8])> = vec![("v", b"ok"), ("", b"no")];
    let err = table.append_many(&client, &bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    let too_many = vec![("v", &b"x"[..]); pgcoord::topic::MAX_EVENTS_PER_STATEMENT + 1];
    let err = table.append_many(&client, &too_many).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(table.append_many(&client, &[]).await.unwrap().is_empty());
    assert!(
        table
            .topics(&client)
            .await
            .unwrap()
            .iter()
            .all(|t| t.topic != "v")
    );
}
