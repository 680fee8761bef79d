//! Topic consumers against a real PostgreSQL: every event at least once and in order, one
//! active instance per consumer name, a takeover from the stored cursor, redelivery after a
//! handler error, effects applied once through an ack in the handler's transaction, a
//! listener and a server that go away, and appends batched through the runtime.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord_actors::*;
use tokio_postgres::Client;

use super::Setup;

/// What a handler was handed: each event's body, in order.
pub(super) type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

/// A consumer of topic "t" named "c" whose handler records each body it is handed.
pub(super) fn recording(seen: &Seen) -> Consume {
    let seen = seen.clone();
    Consume::new("t", "c", move |delivery: Delivery| {
        seen.lock().unwrap().push(delivery.event().body.clone());
        async { Ok(()) }
    })
    .window(7)
    .poll(Duration::from_millis(200))
}

pub(super) async fn append(table: &TopicTable, client: &Client, range: std::ops::Range<u32>) {
    for i in range {
        table
            .append(client, "t", i.to_string().as_bytes())
            .await
            .unwrap();
    }
}

pub(super) fn bodies(range: std::ops::Range<u32>) -> Vec<Vec<u8>> {
    range.map(|i| i.to_string().into_bytes()).collect()
}

/// Waits until `seen` holds `n` bodies (the horizon is the cluster's, and other tests hold it
/// back for moments).
pub(super) async fn until_seen(seen: &Seen, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = seen.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        assert!(Instant::now() < deadline, "{} of {n} seen", now.len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) async fn stats(consumer: &TopicConsumer) -> ConsumerStats {
    consumer.stats().await.unwrap()
}

#[actix_rt::test]
async fn a_consumer_gets_every_event_once_in_order_and_acks_them() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    append(&table, &admin, 0..30).await;
    let one = Coordinator::connect(config).await.unwrap();
    let seen = Seen::default();
    let consumer = one.consume(recording(&seen)).unwrap();
    assert_eq!(until_seen(&seen, 30).await, bodies(0..30));
    // More, after it has caught up: the doorbell (or the poll) brings them.
    append(&table, &admin, 30..35).await;
    assert_eq!(until_seen(&seen, 35).await, bodies(0..35));
    let stats = stats(&consumer).await;
    assert_eq!(
        (stats.delivered, stats.handler_errors, stats.tenures),
        (35, 0, 1)
    );
    assert!(stats.active && stats.acks >= 5, "{stats:?}");
    // Acked through the last one (the ack follows each read's events).
    let last = table
        .read(&admin, "t", Cursor::START, 100)
        .await
        .unwrap()
        .events;
    let deadline = Instant::now() + Duration::from_secs(10);
    while table.cursor(&admin, "t", "c").await.unwrap() != last[34].cursor {
        assert!(
            Instant::now() < deadline,
            "not acked through the last event"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Bad settings are typed errors, before anything starts.
    let err = one.consume(recording(&seen).window(0)).unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::InvalidConfig);
    let err = one
        .consume(recording(&seen).poll(Duration::ZERO))
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::DurationTooSmall);
    let nameless = Consume::new("", "c", |_| async { Ok(()) });
    assert_eq!(
        one.consume(nameless).unwrap_err().kind(),
        pgcoord::ErrorKind::InvalidName
    );
}

#[actix_rt::test]
async fn a_second_instance_waits_and_takes_over_from_the_cursor() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let table = TopicTable::new(&setup.builder("admin").build().unwrap());
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    let (seen_one, seen_two) = (Seen::default(), Seen::default());
    let first = one.consume(recording(&seen_one)).unwrap();
    until_active(&first).await;
    let second = two.consume(recording(&seen_two)).unwrap();
    append(&table, &admin, 0..20).await;
    assert_eq!(until_seen(&seen_one, 20).await, bodies(0..20));
    assert!(seen_two.lock().unwrap().is_empty(), "one active instance");
    assert!(!stats(&second).await.active);
    // The first stops: its lease is released and the second, waiting in line, takes over.
    first.stop().await;
    append(&table, &admin, 20..40).await;
    assert_eq!(until_seen(&seen_two, 20).await, bodies(20..40));
    assert_eq!(
        seen_one.lock().unwrap().len(),
        20,
        "nothing after it stopped"
    );
    assert!(stats(&second).await.active);
}

async fn until_active(consumer: &TopicConsumer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stats(consumer).await.active {
        assert!(Instant::now() < deadline, "never active");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[actix_rt::test]
async fn a_handler_error_hands_the_same_event_over_again() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    append(&table, &admin, 0..10).await;
    let one = Coordinator::connect(config).await.unwrap();
    let (handled, failed_once) = (Seen::default(), Arc::new(Mutex::new(false)));
    let consume = {
        let (handled, failed_once) = (handled.clone(), failed_once.clone());
        Consume::new("t", "c", move |delivery: Delivery| {
            let body = delivery.event().body.clone();
            let fail = body == b"5" && !std::mem::replace(&mut *failed_once.lock().unwrap(), true);
            if !fail {
                handled.lock().unwrap().push(body);
            }
            async move {
                if fail {
                    Err("not yet".to_owned())
                } else {
                    Ok(())
                }
            }
        })
        // Pages of 4: the failure is in the second, while the third is being read ahead.
        .window(4)
    };
    let consumer = one.consume(consume).unwrap();
    assert_eq!(
        until_seen(&handled, 10).await,
        bodies(0..10),
        "in order, each once"
    );
    let stats = stats(&consumer).await;
    assert_eq!(
        (stats.handler_errors, stats.delivered, stats.redelivered),
        (1, 11, 1)
    );
}

/// The handler applies each event in its own transaction and acks it there: a handler that dies
/// after its commit, and a consumer stopped midway and started again, apply every event exactly
/// once; a second ack of an event is refused with `AlreadyAcknowledged`.
#[actix_rt::test]
async fn acks_in_the_handlers_transaction_apply_each_event_exactly_once() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    let applied = format!("\"{}_applied\"", setup.table);
    admin
        .batch_execute(&format!("CREATE TABLE {applied} (body bytea PRIMARY KEY)"))
        .await
        .unwrap();
    append(&table, &admin, 0..40).await;
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let client = Arc::new(tokio::sync::Mutex::new(
        pgcoord::db::connect_spawned(&config).await.unwrap(),
    ));
    let (crashed, duplicates, refused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let consume = || {
        let (client, applied) = (client.clone(), applied.clone());
        let (crashed, duplicates, refused) = (crashed.clone(), duplicates.clone(), refused.clone());
        Consume::new("t", "c", move |delivery: Delivery| {
            let (client, applied) = (client.clone(), applied.clone());
            let (crashed, duplicates, refused) =
                (crashed.clone(), duplicates.clone(), refused.clone());
            async move {
                let mut client = client.lock().await;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                let sql = format!("INSERT INTO {applied} VALUES ($1)");
                if let Err(e) = tx.execute(&sql, &[&delivery.event().body]).await {
                    duplicates.fetch_add(1, Ordering::SeqCst);
                    return Err(e.to_string());
                }
                delivery.ack(&tx).await.map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                // A second ack of the event is refused, typed.
                let again = client.transaction().await.map_err(|e| e.to_string())?;
                match delivery.ack(&again).await {
                    Err(e) if e.kind() == pgcoord::ErrorKind::AlreadyAcknowledged => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    other => return Err(format!("a second ack: {other:?}")),
                }
                drop(again);
                // The handler dies after its commit, once: its event must not come again.
                if delivery.event().body == b"17" && !crashed.swap(true, Ordering::SeqCst) {
                    panic!("crashed after the commit");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(())
            }
        })
        .window(10)
    };
    let count = format!("SELECT count(*) FROM {applied}");
    let first = one.consume(consume()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.query_one(&count, &[]).await.unwrap().get::<_, i64>(0) < 15 {
        assert!(Instant::now() < deadline, "the first applied too few");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.stop().await;
    let _again = one.consume(consume()).unwrap();
    while admin.query_one(&count, &[]).await.unwrap().get::<_, i64>(0) < 40 {
        assert!(Instant::now() < deadline, "not all applied");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(crashed.load(Ordering::SeqCst));
    // The last handler tries its second ack after its commit, which the count above already
    // sees: wait for it too.
    while refused.load(Ordering::SeqCst) < 40 {
        assert!(Instant::now() < deadline, "each second ack refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        refused.load(Ordering::SeqCst),
        40,
        "each second ack refused, once"
    );
    assert_eq!(
        duplicates.load(Ordering::SeqCst),
        0,
        "an event applied twice"
    );
}

/// The listener's session is terminated (its doorbells are lost until it is back), then the
/// server restarts under the consumer: it catches up by itself, from its cursor, missing nothing.
#[actix_rt::test]
async fn a_consumer_catches_up_by_itself_after_its_listener_dies_and_the_server_restarts() {
    let (server, setup, admin) = super::own_cluster::own_cluster().await;
    let app = pgcoord_testkit::unique_name("app");
    let config = setup.builder("one").application_name(&app).build().unwrap();
    let table = TopicTable::new(&config);
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let seen = Seen::default();
    let _consumer = one.consume(recording(&seen)).unwrap();
    append(&table, &admin, 0..10).await;
    until_seen(&seen, 10).await;

    let name = format!("{app} listener");
    let killed = pgcoord_testkit::terminate_backends(&admin, &name)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the listener's session");
    append(&table, &admin, 10..20).await;
    until_seen(&seen, 20).await;

    super::own_cluster::on_server(&server, pgcoord_testkit::TempPostgres::restart).await;
    let admin = pgcoord::db::connect_spawned(&config).await.unwrap();
    append(&table, &admin, 20..30).await;
    let seen = until_seen(&seen, 30).await;
    // At least once: an event may come twice around the restart, never out of order within a
    // tenure, and none is missing.
    let mut firsts = seen.clone();
    let mut at = std::collections::HashSet::new();
    firsts.retain(|b| at.insert(b.clone()));
    assert_eq!(firsts, bodies(0..30), "every event, in order");
}

/// A tenure outlives the statement timeout many times over: every statement has a bound of its
/// own, so the consumer goes on delivering (one bound for the whole tenure once stopped it after
/// the first 5 s).
#[actix_rt::test]
async fn a_consumer_goes_on_long_past_the_statement_timeout() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = (setup.builder("one"))
        .statement_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let table = TopicTable::new(&config);
    let one = Coordinator::connect(config).await.unwrap();
    let seen = Seen::default();
    let consumer = one.consume(recording(&seen)).unwrap();
    append(&table, &admin, 0..5).await;
    assert_eq!(until_seen(&seen, 5).await, bodies(0..5));
    // Five statement timeouts later, in the same tenure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    append(&table, &admin, 5..25).await;
    assert_eq!(until_seen(&seen, 25).await, bodies(0..25));
    assert_eq!(stats(&consumer).await.tenures, 1);
}

/// A transaction left open holds the caught-up consumer back: nothing appended after it began is
/// delivered until it ends, and the consumer warns, once, naming its backend. Then everything
/// comes, in order. (A cluster of its own: the open transaction would hold back every other
/// test's readers.)
#[actix_rt::test]
async fn a_transaction_left_open_is_warned_of_by_its_backend_and_holds_events_back_until_it_ends() {
    let (log, _capture) = super::capture_warnings();
    let (_server, setup, admin) = super::own_cluster::own_cluster().await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let seen = Seen::default();
    let consume = recording(&seen)
        .poll(Duration::from_millis(50))
        .held_back_warning(Duration::from_millis(500));
    let consumer = one.consume(consume).unwrap();
    until_active(&consumer).await;

    let mut open = pgcoord::db::connect_spawned(&config).await.unwrap();
    let tx = open.transaction().await.unwrap();
    let pid: i32 = tx
        .query_one("SELECT pg_backend_pid() FROM pg_current_xact_id()", &[])
        .await
        .unwrap()
        .get(0);
    append(&table, &admin, 0..3).await;
    let warning = "holds every topic reader back";
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.lines_containing(warning) == 0 {
        assert!(Instant::now() < deadline, "no warning");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(log.lines_containing(&format!("pid={pid}")), 1, "names it");
    assert!(seen.lock().unwrap().is_empty(), "read past an open one");
    // Still open a while later: no second warning within the minute.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(log.lines_containing(warning), 1);
    assert!(seen.lock().unwrap().is_empty());

    tx.rollback().await.unwrap();
    assert_eq!(until_seen(&seen, 3).await, bodies(0..3));
    // A held-back warning after no time at all is refused, as every bad setting is.
    let err = one
        .consume(recording(&seen).held_back_warning(Duration::ZERO))
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::DurationTooSmall);
}

/// A prepared transaction holds the caught-up consumer back as an open one does, though no
/// session holds it: the warning names its gid, as no backend holds it. Once it is rolled back,
/// everything comes, in order. (A cluster of its own, with prepared transactions on.)
#[actix_rt::test]
async fn a_prepared_transaction_is_warned_of_by_its_gid() {
    let (log, _capture) = super::capture_warnings();
    let (_server, setup, admin) =
        super::own_cluster::own_cluster_with(&[("max_prepared_transactions", "2")]).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let seen = Seen::default();
    let consume = recording(&seen)
        .poll(Duration::from_millis(50))
        .held_back_warning(Duration::from_millis(500));
    let consumer = one.consume(consume).unwrap();
    until_active(&consumer).await;

    let preparer = pgcoord::db::connect_spawned(&config).await.unwrap();
    preparer
        .batch_execute("BEGIN; SELECT pg_current_xact_id(); PREPARE TRANSACTION 'stuck-2pc'")
        .await
        .unwrap();
    append(&table, &admin, 0..3).await;
    let warning = "holds every topic reader back";
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.lines_containing(warning) == 0 {
        assert!(Instant::now() < deadline, "no warning");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(log.lines_containing("stuck-2pc"), 1, "names it");
    assert!(seen.lock().unwrap().is_empty(), "read past a prepared one");

    admin
        .batch_execute("ROLLBACK PREPARED 'stuck-2pc'")
        .await
        .unwrap();
    assert_eq!(until_seen(&seen, 3).await, bodies(0..3));
}
