//! Appends through the runtime (`Coordinator::append`): batched, each caller its own cursor; a bad
//! event fails alone; a failed batch fails each of its callers and the appender goes on.

use std::time::{Duration, Instant};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord_actors::*;

use super::Setup;

/// Appends through the runtime: a burst shares statements (and transactions), each caller gets
/// its own cursor, and a bad event fails only its caller.
#[actix_rt::test]
async fn appends_through_the_runtime_are_batched_and_each_caller_gets_its_own_cursor() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let sends: Vec<_> = (0..300u32)
        .map(|i| one.append("t", i.to_string().as_bytes()))
        .collect();
    let bad = one.append("", b"x");
    let cursors: Vec<Cursor> = futures_util::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let err = bad.await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::InvalidName);
    let transactions: std::collections::HashSet<i64> = cursors.iter().map(|c| c.xid).collect();
    assert!(
        transactions.len() < 100,
        "{} transactions for 300 appends",
        transactions.len()
    );
    // Every caller's body is at its own cursor.
    let table = TopicTable::new(&config);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut events = Vec::new();
    while events.len() < 300 {
        assert!(
            Instant::now() < deadline,
            "{} of 300 readable",
            events.len()
        );
        let after = events
            .last()
            .map_or(Cursor::START, |e: &pgcoord::topic::Event| e.cursor);
        let batch = table.read(&admin, "t", after, 1000).await.unwrap();
        if batch.events.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        events.extend(batch.events);
    }
    for (i, cursor) in cursors.iter().enumerate() {
        let event = events.iter().find(|e| e.cursor == *cursor).unwrap();
        assert_eq!(event.body, i.to_string().into_bytes());
    }

    // The futures borrow nothing of the body or the value: spawned, they outlive both.
    let (name, body) = (String::from("spawned"), vec![7u8]);
    let by_value = tokio::spawn(one.append_value("t", &(name.as_str(), 1u32)));
    let by_body = tokio::spawn(one.append("t", &body[..]));
    drop((name, body));
    let cursor = by_value.await.unwrap().unwrap();
    assert!(by_body.await.unwrap().unwrap() != cursor);
    let after = Cursor {
        position: cursor.position - 1,
        ..cursor
    };
    let read = table.read(&admin, "t", after, 1).await.unwrap();
    let value: (String, u32) = read.events[0].value().unwrap();
    assert_eq!(value, ("spawned".to_owned(), 1));
    let err = one.append_value("t", &Unencodable).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Other, "{err}");
}

/// A value whose encoding fails.
struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("not this one"))
    }
}

/// A batch whose statement fails fails each of its callers with the error, appends nothing of
/// it, and the appender goes on: the next appends succeed.
#[actix_rt::test]
async fn a_failed_batch_fails_each_of_its_callers_and_the_appender_goes_on() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let one = Coordinator::connect(config.clone()).await.unwrap();
    one.append("t", b"before").await.unwrap();
    // The table is away: every statement on it fails.
    let table = config.topic_table().quoted();
    let away = format!("{}_away", config.topic_table().name().as_str());
    (admin
        .batch_execute(&format!("ALTER TABLE {table} RENAME TO \"{away}\""))
        .await)
        .unwrap();
    let sends: Vec<_> = (0..50u32)
        .map(|i| one.append("t", i.to_string().as_bytes()))
        .collect();
    let results = futures_util::future::join_all(sends).await;
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    let back = format!("ALTER TABLE \"{away}\" RENAME TO {table}");
    admin.batch_execute(&back).await.unwrap();
    let cursor = one.append("t", b"after").await.unwrap();
    let events = TopicTable::new(&config);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = events.read(&admin, "t", Cursor::START, 100).await.unwrap();
        if read.events.iter().any(|e| e.cursor == cursor) {
            let bodies: Vec<&[u8]> = read.events.iter().map(|e| &e.body[..]).collect();
            assert_eq!(
                bodies,
                [&b"before"[..], &b"after"[..]],
                "nothing of the failed batch"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the append after never readable");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
