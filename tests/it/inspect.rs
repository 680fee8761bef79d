//! What an operator looks at (the live view and the `pgcoord` command): the leases with their
//! line in one statement, stored limits, rate-limit buckets, every topic's consumers at once,
//! advisory locks and the database's sessions — each against what was done to the server.

use std::time::Duration;

use pgcoord::lease::AcquireRequest;
use pgcoord::rate::RateLimit;
use pgcoord::topic::Start;
use pgcoord::{LeaseTable, RateTable, TopicTable};
use pgcoord_testkit::unique_name;

use super::{LEASE, grant, in_line, setup};

/// The one statement answers what `list` and `line` answer, each in its own order: the line by
/// priority then arrival, whatever the names' order.
#[tokio::test]
async fn the_leases_and_their_line_in_one_statement_are_what_list_and_line_say() {
    let (config, client) = setup().await;
    let table = LeaseTable::new(&config);
    grant(&table, &client, "b-held", "holder", LEASE).await;
    grant(&table, &client, "a-free-soon", "other", LEASE).await;
    for (waiter, priority) in [("early", 0), ("later", 0), ("preferred", 5)] {
        let request = AcquireRequest::new("b-held").priority(priority);
        (table.owner(waiter).unwrap())
            .try_acquire_or_queue(&client, &request, LEASE, LEASE)
            .await
            .unwrap();
    }
    in_line(&table, &client, "a-free-soon", "alone", LEASE).await;

    let (leases, line) = table.list_and_line(&client).await.unwrap();
    let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["a-free-soon", "b-held"]);
    let listed = table.list(&client).await.unwrap();
    for (one, other) in leases.iter().zip(&listed) {
        assert_eq!(
            (&one.name, &one.owner, one.token, &one.data),
            (&other.name, &other.owner, other.token, &other.data)
        );
        assert!(one.remaining.unwrap() > LEASE - Duration::from_secs(5));
    }
    let places: Vec<(&str, &str, i32)> = (line.iter())
        .map(|p| (p.name.as_str(), p.waiter.as_str(), p.priority))
        .collect();
    assert_eq!(
        places,
        [
            ("a-free-soon", "alone", 0),
            ("b-held", "preferred", 5),
            ("b-held", "early", 0),
            ("b-held", "later", 0),
        ]
    );
    let separately: Vec<(String, String)> = (table.line(&client).await.unwrap().into_iter())
        .map(|p| (p.name, p.waiter))
        .collect();
    let together: Vec<(String, String)> = (line.into_iter()).map(|p| (p.name, p.waiter)).collect();
    assert_eq!(together, separately);

    // Nothing at all: two empty lists, not an error.
    let (empty_config, empty_client) = setup().await;
    let (leases, line) = (LeaseTable::new(&empty_config))
        .list_and_line(&empty_client)
        .await
        .unwrap();
    assert!(leases.is_empty() && line.is_empty());
}

#[tokio::test]
async fn stored_limits_and_rate_buckets_are_listed() {
    let (config, client) = setup().await;
    let table = LeaseTable::new(&config);
    table.set_limit(&client, "uploads", 3).await.unwrap();
    table.set_limit(&client, "exports", 1).await.unwrap();
    let limits = table.limits(&client).await.unwrap();
    assert_eq!(
        limits,
        [("exports".to_owned(), 1), ("uploads".to_owned(), 3)]
    );

    // A key drained by a take of its whole burst is full again in about its period; a key
    // barely used, sooner. The most drained first.
    let rates = RateTable::new(&config);
    let slow = RateLimit::new(10, Duration::from_secs(60)).unwrap();
    let drained = unique_name("drained");
    let touched = unique_name("touched");
    rates.try_take(&client, &drained, 10, &slow).await.unwrap();
    rates.try_take(&client, &touched, 1, &slow).await.unwrap();
    let buckets = rates.buckets(&client).await.unwrap();
    let keys: Vec<&str> = buckets.iter().map(|b| b.key.as_str()).collect();
    assert_eq!(keys, [drained.as_str(), touched.as_str()]);
    let (first, second) = (&buckets[0], &buckets[1]);
    assert!(
        first.full_in > Duration::from_secs(50) && first.full_in <= Duration::from_secs(60),
        "{first:?}"
    );
    assert_eq!(first.granted, 10);
    assert!(
        second.full_in > Duration::from_secs(1) && second.full_in <= Duration::from_secs(6),
        "{second:?}"
    );
}

#[tokio::test]
async fn every_topics_consumers_in_one_statement() {
    let (config, client) = setup().await;
    let topics = TopicTable::new(&config);
    for (topic, consumer) in [
        ("orders", "billing"),
        ("orders", "audit"),
        ("refunds", "billing"),
    ] {
        topics
            .open_consumer(&client, topic, consumer, Start::Oldest)
            .await
            .unwrap();
    }
    for body in [b"1", b"2"] {
        topics.append(&client, "orders", body).await.unwrap();
    }
    let all = topics.all_consumers(&client).await.unwrap();
    let seen: Vec<(&str, &str, i64)> = (all.iter())
        .map(|c| (c.topic.as_str(), c.consumer.as_str(), c.lag_events))
        .collect();
    assert_eq!(
        seen,
        [
            ("orders", "audit", 2),
            ("orders", "billing", 2),
            ("refunds", "billing", 0)
        ]
    );
    // One topic's: only its own.
    let refunds = topics.consumers(&client, "refunds").await.unwrap();
    assert_eq!(refunds.len(), 1);
    assert_eq!(
        (refunds[0].topic.as_str(), refunds[0].consumer.as_str()),
        ("refunds", "billing")
    );
}

/// An advisory lock held by one session and awaited by another is listed twice (held first),
/// with each session's pid and application_name; the sessions list names both.
#[tokio::test]
async fn advisory_locks_and_sessions_are_listed_with_their_applications() {
    let (_, client) = setup().await;
    let app = unique_name("holder_app");
    let theirs = super::builder().application_name(&app).build().unwrap();
    let holder = super::connect(&theirs).await;
    let waiter = super::connect(&theirs).await;
    // A key no other test takes: this test's own, from its unique name.
    let key = pgcoord::advisory::key_for_name(&app);
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let waiting = tokio::spawn(async move {
        waiter
            .execute("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .unwrap();
        waiter
    });
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let ours = loop {
        let listed = pgcoord::advisory::list(&client).await.unwrap();
        let ours: Vec<_> = listed
            .into_iter()
            .filter(|l| l.application == app)
            .collect();
        if ours.len() == 2 {
            break ours;
        }
        assert!(
            std::time::Instant::now() < until,
            "not both listed: {ours:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ours[0].key, key.to_string());
    assert_eq!((ours[0].granted, ours[0].pid), (true, holder_pid));
    assert_eq!(ours[0].mode, "ExclusiveLock");
    assert!(!ours[1].granted);

    let sessions = pgcoord::sessions::list(&client).await.unwrap();
    let mine: Vec<_> = sessions.iter().filter(|s| s.application == app).collect();
    assert_eq!(mine.len(), 2, "{sessions:?}");
    assert!(mine.iter().any(|s| s.pid == holder_pid));
    assert!(
        mine.iter()
            .all(|s| s.connected < Duration::from_secs(60) && s.state.is_some())
    );

    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    let waiter = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    drop(waiter);
}
