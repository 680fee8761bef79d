//! Retention and topic consumers: a topic kept to its retention on a timer, and a consumer
//! whose cursor fell behind retention stopped with `Compacted`, never a silent jump.

use std::time::{Duration, Instant};

use pgcoord::topic::{Cursor, Retention, TopicTable};
use pgcoord_actors::*;

use super::Setup;
use super::topics::{Seen, append, recording, stats};

#[actix_rt::test]
async fn a_cursor_behind_retention_stops_the_consumer_with_compacted() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    append(&table, &admin, 0..5).await;
    table
        .open_consumer(&admin, "t", "c", pgcoord::topic::Start::Oldest)
        .await
        .unwrap();
    // Retention deletes what the consumer has not read (once it is below the horizon).
    let everything = Retention {
        max_events: Some(0),
        ..Retention::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut trimmed = 0;
    while trimmed < 5 {
        assert!(Instant::now() < deadline, "never trimmed");
        trimmed += table.trim(&admin, "t", everything, 10).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let one = Coordinator::connect(config).await.unwrap();
    let seen = Seen::default();
    let consumer = one.consume(recording(&seen)).unwrap();
    loop {
        let stats = stats(&consumer).await;
        if let Some(failed) = stats.failed {
            assert!(failed.contains("trimmed"), "{failed}");
            assert!(!stats.active, "the lease is let go");
            break;
        }
        assert!(Instant::now() < deadline, "never failed: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing delivered past the gap"
    );
}

/// Retention on a timer keeps the newest events, and a consumer behind it learns `Compacted`.
#[actix_rt::test]
async fn a_topic_kept_to_its_retention_on_a_timer() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("one").build().unwrap();
    let table = TopicTable::new(&config);
    append(&table, &admin, 0..10).await;
    let one = Coordinator::connect(config).await.unwrap();
    let keep_two = Retention {
        max_events: Some(2),
        ..Retention::default()
    };
    let retention = one
        .retain("t", keep_two, Duration::from_millis(20))
        .unwrap();
    // Deleted once the events are below the horizon (other tests' transactions hold it back
    // for moments).
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let kept = table.topics(&admin).await.unwrap();
        if kept.iter().any(|t| t.topic == "t" && t.events == 2) {
            break table.trimmed(&admin, "t").await.unwrap().unwrap();
        }
        assert!(Instant::now() < deadline, "not trimmed: {kept:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let err = table
        .read(&admin, "t", Cursor::START, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::Compacted);
    let left = table.read(&admin, "t", events, 10).await.unwrap().events;
    assert_eq!(left.len(), 2, "the newest two");
    assert_eq!(retention.send(RunNow).await.unwrap().unwrap(), 0);
    // Bad settings are typed errors.
    let everything = Retention::default();
    let err = one
        .retain("t", everything, Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::InvalidConfig);
    let err = one.retain("t", keep_two, Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::DurationTooSmall);
    retention.send(Shutdown).await.unwrap();
}
