//! A least-privileged role: the grants the README lists are all pgcoord needs at run time.

use std::time::Duration;

use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::{Collector, Setup};

#[actix_rt::test]
async fn a_role_with_only_the_documented_grants_runs_everything() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let role = unique_name("app");
    let (locks, queue, payloads, sequence) = (
        setup.quoted_table(),
        format!(
            "\"{0}_wq\", \"{0}_rl\", \"{0}_rr\", \"{0}_lm\"",
            setup.table
        ),
        format!("\"{}_p\"", setup.table),
        format!("\"{}_rvn\"", setup.table),
    );
    let topics = format!(
        "\"{0}_t\", \"{0}_t_cursors\", \"{0}_t_trimmed\"",
        setup.table
    );
    let schedules = format!("\"{}_s\"", setup.table);
    // The README's grants, word for word (besides the names).
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT CONNECT ON DATABASE postgres TO {role};
             GRANT USAGE ON SCHEMA public TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON {locks}, {queue}, {payloads},
                 {topics}, {schedules} TO {role};
             GRANT USAGE ON SEQUENCE {sequence} TO {role};"
        ))
        .await
        .unwrap();
    let mut pg = setup.pg.clone();
    pg.user(&role);
    let config = |owner: &str| setup.builder(owner).pg_config(&pg).build().unwrap();
    let (one, two) = (
        Coordinator::connect(config("one")).await.unwrap(),
        Coordinator::connect(config("two")).await.unwrap(),
    );

    // Leases: granted with data, renewed, contended (reservation), refused with the holder,
    // kept on release, fenced in the role's own transaction.
    let lease = one
        .locks()
        .unwrap()
        .call(Acquire::new("job").data(b"d".to_vec()).keep_on_release())
        .await
        .unwrap();
    one.locks().unwrap().call(RunNow).await.unwrap();
    let refused = two.acquire(Acquire::new("job").fail_if_locked()).await;
    assert_eq!(refused.unwrap_err().kind(), pgcoord::ErrorKind::NotAcquired);
    let waiting = actix_rt::spawn(
        two.locks()
            .unwrap()
            .call(Acquire::new("job").timeout(Duration::from_secs(5))),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut own = pgcoord::db::connect_spawned(&config("fence"))
        .await
        .unwrap();
    let tx = own.transaction().await.unwrap();
    lease.fence(&tx).await.unwrap();
    tx.commit().await.unwrap();
    lease.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();

    // Signals: inline and stored payloads; expired payloads deleted.
    let (received, recipient) = Collector::<Signal>::start_new();
    two.signals()
        .unwrap()
        .call(Subscribe::new("least", recipient))
        .await
        .unwrap();
    one.signals()
        .unwrap()
        .call(Publish::new("least", b"x".to_vec()))
        .await
        .unwrap();
    one.signals()
        .unwrap()
        .call(Publish::new("least", vec![1u8; 10_000]))
        .await
        .unwrap();
    assert_eq!(received.wait_for(2, Duration::from_secs(5)).await.len(), 2);
    one.payloads().unwrap().call(RunNow).await.unwrap();

    // Advisory locks, an election, a semaphore.
    let guard = one
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(5))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let election = one.election("leader").unwrap();
    let term = election.campaign("v", None).await.unwrap();
    assert_eq!(election.request_resign().await.unwrap(), Some(term.token()));
    assert!(term.resign_requested().await);
    term.resign().await.unwrap();
    let permit = one
        .acquire_permit(AcquirePermit::new("sem", 2))
        .await
        .unwrap();
    permit.release().await.unwrap();

    // A durable topic: append in the role's transaction, read, a consumer acked, trimmed, and
    // the server's oldest transaction looked up.
    let topics = pgcoord::TopicTable::new(&config("topics"));
    let tx = own.transaction().await.unwrap();
    topics.append(&tx, "orders", b"o").await.unwrap();
    tx.commit().await.unwrap();
    let start = pgcoord::topic::Start::Oldest;
    let from = topics
        .open_consumer(&own, "orders", "c", start)
        .await
        .unwrap();
    let read = topics.read(&own, "orders", from, 10).await.unwrap();
    if let Some(event) = read.events.last() {
        topics.ack(&own, "orders", "c", event.cursor).await.unwrap();
    }
    let all = pgcoord::topic::Retention {
        max_events: Some(0),
        ..Default::default()
    };
    topics.trim(&own, "orders", all, 10).await.unwrap();
    topics.held_back(&own).await.unwrap();

    // A schedule: its ticks claimed, run, finished and trimmed by the role.
    let every = pgcoord::schedule::Timing::every(Duration::from_millis(100)).unwrap();
    let runner = one
        .schedule(Schedule::new("least", every, |_| async { Ok(()) }).history(1))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runner.send(GetStats::new()).await.unwrap().done < 2 {
        assert!(std::time::Instant::now() < deadline, "no tick ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = super::stop_schedule(&runner).await.unwrap();
    assert_eq!(stats.failed, 0, "{stats:?}");

    // A rate limit: its key's bucket taken from.
    let rates = pgcoord::RateTable::new(&config("rates"));
    let rate = pgcoord::rate::RateLimit::per_second(10).unwrap();
    let taken = rates.try_take(&own, "least", 1, &rate).await.unwrap();
    assert_eq!(taken.granted, 1);

    // One grant fewer (the sequence's): a typed error that names what is missing.
    admin
        .batch_execute(&format!("REVOKE USAGE ON SEQUENCE {sequence} FROM {role}"))
        .await
        .unwrap();
    let err = one.acquire(Acquire::new("after")).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::PermissionDenied, "{err}");
    assert!(
        err.to_string().contains("permission denied for sequence"),
        "{err}"
    );
}
