//! A graceful stop: `Coordinator::shutdown` releases every lease and advisory lock of the
//! process at once, tells each holder, and stops the consumers of durable topics.

use std::time::{Duration, Instant};

use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::Setup;

#[actix_rt::test]
async fn a_graceful_shutdown_releases_every_lease_and_advisory_lock_at_once() {
    // A long lease: nothing here can be explained by an expiry.
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(10)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| unique_name("graceful")).collect();
    let mut leases = Vec::new();
    for name in &names {
        leases.push(one.locks.call(Acquire::new(name)).await.unwrap());
    }
    let key = i64::from(std::process::id()) * 1000 + 7;
    let guard = one.advisory.call(AdvisoryLock::new(key)).await.unwrap();
    let consumer = one
        .consume(Consume::new("t", "c", |_| async { Ok(()) }).poll(Duration::from_millis(50)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !consumer.send(GetConsumerStats).await.unwrap().active {
        assert!(
            Instant::now() < deadline,
            "the consumer never took its lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let released = one.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(released, 4, "three leases and the consumer's");
    // At once: nothing of this owner is left in the lock table...
    let rows: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE owner = 'one'",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    // ...every holder was told, and another process takes each lease and the advisory lock
    // without waiting.
    for lease in &leases {
        assert_eq!(lease.loss(), Some(LossReason::Shutdown));
    }
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    let mut taken = Vec::new();
    for name in &names {
        taken.push(
            two.locks
                .call(Acquire::new(name).fail_if_locked())
                .await
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match two.advisory.call(AdvisoryLock::new(key)).await {
            Ok(_) => break,
            Err(e) if e.kind() == pgcoord::ErrorKind::NotAcquired => {
                assert!(Instant::now() < deadline, "the advisory lock stayed held");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(guard);
    // The consumer stopped instead of waiting for a lease from a stopped manager.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = consumer.send(GetConsumerStats).await.unwrap();
    assert_eq!((stats.active, stats.tenures), (false, 1), "{stats:?}");
}
