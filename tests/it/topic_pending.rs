//! Many topics read for one consumer at once, each from its stored cursor: only topics with
//! events come back, a stored cursor is where each read begins, and a cursor retention left
//! behind is `Compacted` for that topic alone.

use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord::topic::{Cursor, Pending, Retention, Start, TopicTable};
use tokio_postgres::Client;

use super::topic::{next_n, setup};

/// `read_pending` until every topic of `topics` that should have events has them (the horizon
/// is the cluster's: other tests' transactions hold it back for moments).
async fn pending(
    table: &TopicTable,
    client: &Client,
    topics: &[&str],
    expect: usize,
) -> Vec<Pending> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = table.read_pending(client, "pool", topics, 2).await.unwrap();
        let ready = found
            .iter()
            .filter(|p| p.events.as_ref().map_or(true, |e| !e.is_empty()));
        if ready.count() >= expect {
            return found;
        }
        assert!(Instant::now() < deadline, "{found:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn bodies(p: &Pending) -> Vec<Vec<u8>> {
    let events = p.events.as_ref().unwrap();
    events.iter().map(|e| e.body.clone()).collect()
}

#[tokio::test]
async fn pending_events_of_many_topics_are_read_from_each_stored_cursor() {
    let (_config, client, table) = setup().await;
    for (topic, body) in [
        ("k/1", "a"),
        ("k/1", "b"),
        ("k/1", "c"),
        ("k/2", "x"),
        ("k/3", "y"),
    ] {
        table.append(&client, topic, body.as_bytes()).await.unwrap();
    }
    let topics = ["k/1", "k/2", "k/3", "k/4", "k/1"];
    let found = pending(&table, &client, &topics, 3).await;
    let names: Vec<&str> = found.iter().map(|p| p.topic.as_str()).collect();
    assert_eq!(
        names,
        ["k/1", "k/2", "k/3"],
        "only topics with events, each once"
    );
    assert_eq!(
        bodies(&found[0]),
        [b"a".to_vec(), b"b".to_vec()],
        "at most the limit, in order"
    );
    assert_eq!(
        found[0].from,
        Cursor::START,
        "no cursor yet: from the oldest kept"
    );

    // A stored cursor is where the next read begins.
    let first = found[0].events.as_ref().unwrap()[0].cursor;
    let opened = table
        .open_consumer(&client, "k/1", "pool", Start::After(found[0].from))
        .await
        .unwrap();
    assert_eq!(opened, found[0].from);
    assert!(table.ack(&client, "k/1", "pool", first).await.unwrap());
    let found = pending(&table, &client, &["k/1"], 1).await;
    assert_eq!(found[0].from, first);
    assert_eq!(bodies(&found[0]), [b"b".to_vec(), b"c".to_vec()]);

    // Retention deletes past k/2's stored cursor: that topic alone is Compacted.
    let x = next_n(&table, &client, "k/2", Cursor::START, 1).await[0].cursor;
    table.append(&client, "k/2", b"z").await.unwrap();
    next_n(&table, &client, "k/2", x, 1).await;
    table
        .open_consumer(&client, "k/2", "pool", Start::After(Cursor::START))
        .await
        .unwrap();
    let keep_one = Retention {
        max_events: Some(1),
        ..Retention::default()
    };
    assert_eq!(table.trim(&client, "k/2", keep_one, 10).await.unwrap(), 1);
    let found = pending(&table, &client, &["k/2", "k/3"], 2).await;
    let err = found[0].events.as_ref().unwrap_err();
    assert_eq!(
        (found[0].topic.as_str(), err.kind()),
        ("k/2", ErrorKind::Compacted)
    );
    assert!(err.to_string().contains(&x.to_string()), "{err}");
    assert_eq!(bodies(&found[1]), [b"y".to_vec()]);

    // Bad input is a typed error.
    let err = table
        .read_pending(&client, "pool", &["k/1"], 0)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = table
        .read_pending(&client, "", &["k/1"], 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}
