//! Retention: trimming in bounded batches, only below the horizon, and a cursor behind it
//! reported `Compacted`.

use std::time::Duration;

use pgcoord::ErrorKind;
use pgcoord::topic::{Cursor, Retention, Start};

use super::topic::{bodies, next_n, nothing_after, setup};

#[tokio::test]
async fn retention_trims_in_bounded_batches_and_a_cursor_behind_it_is_compacted() {
    let (config, client, table) = setup().await;
    for i in 0..10u8 {
        table.append(&client, "t", &[i]).await.unwrap();
    }
    let events = next_n(&table, &client, "t", Cursor::START, 10).await;
    let keep_four = Retention {
        max_events: Some(4),
        ..Retention::default()
    };
    assert_eq!(table.trim(&client, "t", keep_four, 3).await.unwrap(), 3);
    assert_eq!(table.trim(&client, "t", keep_four, 3).await.unwrap(), 3);
    assert_eq!(table.trim(&client, "t", keep_four, 3).await.unwrap(), 0);
    assert_eq!(
        table.trimmed(&client, "t").await.unwrap(),
        Some(events[5].cursor)
    );
    let err = table
        .read(&client, "t", Cursor::START, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compacted, "{err}");
    assert!(
        err.to_string().contains(&events[5].cursor.to_string()),
        "{err}"
    );
    let err = table
        .read(&client, "t", events[2].cursor, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compacted);
    let left = bodies(&table, &client, "t", events[5].cursor, 4).await;
    nothing_after(&table, &client, "t", events[9].cursor).await;
    assert_eq!(left, [[6], [7], [8], [9]]);
    assert_eq!(
        table
            .open_consumer(&client, "t", "new", Start::Oldest)
            .await
            .unwrap(),
        events[5].cursor,
        "the oldest kept"
    );
    // An event committed after a transaction that is still open is kept, whatever its age.
    let mut open = super::connect(&config).await;
    let open_tx = open.transaction().await.unwrap();
    open_tx
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap();
    table.append(&client, "t", b"young").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let by_age = Retention {
        max_age: Some(Duration::from_millis(1)),
        ..Retention::default()
    };
    assert_eq!(table.trim(&client, "t", by_age, 100).await.unwrap(), 4);
    open_tx.commit().await.unwrap();
    next_n(&table, &client, "t", events[9].cursor, 1).await;
    assert_eq!(table.trim(&client, "t", by_age, 100).await.unwrap(), 1);
    // Nothing is left: a cursor behind the mark is still told, not handed an empty page.
    let err = table
        .read(&client, "t", events[9].cursor, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compacted, "{err}");
    let mark = table.trimmed(&client, "t").await.unwrap().unwrap();
    nothing_after(&table, &client, "t", mark).await;
    let err = table.trim(&client, "t", by_age, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let zero = Retention {
        max_age: Some(Duration::ZERO),
        ..Retention::default()
    };
    let err = table.trim(&client, "t", zero, 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DurationTooSmall);
}
