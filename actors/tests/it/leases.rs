//! Leases through the LockManager: pglock's six integration scenarios, typed data, bad input.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::*;

use super::{Collector, Setup};

const LONG: Duration = Duration::from_secs(10);
const BEAT: Duration = Duration::from_secs(2);

#[actix_rt::test]
async fn a_second_client_with_fail_if_locked_is_not_acquired() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let held = a.send(Acquire::new("job")).await.unwrap().unwrap();
    let err = b
        .send(Acquire::new("job").fail_if_locked())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    let holder = err.holder().expect("the holder is named");
    assert_eq!((holder.owner.as_str(), holder.token), ("a", held.token()));
    assert!(holder.remaining > Duration::ZERO && holder.remaining <= LONG);
}

#[actix_rt::test]
async fn release_then_another_client_acquires() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let first = a.send(Acquire::new("job")).await.unwrap().unwrap();
    let first_token = first.token();
    first.release().await.unwrap();
    let second = b
        .send(Acquire::new("job").fail_if_locked())
        .await
        .unwrap()
        .unwrap();
    assert!(
        second.token() > first_token,
        "tokens strictly increase across grants"
    );
}

#[actix_rt::test]
async fn a_timed_out_or_cancelled_wait_never_enters_the_critical_section() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let held = a.send(Acquire::new("job")).await.unwrap().unwrap();

    let started = Instant::now();
    let err = b
        .send(Acquire::new("job").timeout(Duration::from_millis(300)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert_eq!(err.holder().map(|h| h.owner.as_str()), Some("a"));
    assert!(started.elapsed() < Duration::from_secs(2));

    // The caller gives up through actix's own timeout: the wait is cancelled.
    let gave_up = b
        .send(Acquire::new("job"))
        .timeout(Duration::from_millis(300))
        .await;
    assert!(matches!(gave_up, Err(MailboxError::Timeout)));

    // Once released, nobody holds it: the abandoned waiters took nothing.
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = setup.table().get("job").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "no row left behind");
    assert_eq!(b.send(GetStats::new()).await.unwrap().granted, 0);
}

#[actix_rt::test]
async fn holding_longer_than_a_heartbeat_stays_valid() {
    let lease = Duration::from_millis(800);
    let (setup, mut client) = Setup::new(lease, Duration::from_millis(150)).await;
    let a = setup.manager("a");
    let lost = Collector::subscribe(&a).await;
    let held = a.send(Acquire::new("job")).await.unwrap().unwrap();
    tokio::time::sleep(lease * 3).await;
    assert_eq!(held.loss(), None);
    let info = setup.table().get("job").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token),
        (Some("a"), Some(held.token()))
    );
    assert!(info.is_held());
    let tx = client.transaction().await.unwrap();
    held.fence(&tx).await.unwrap();
    tx.commit().await.unwrap();
    assert!(lost.received().is_empty());
    let stats = a.send(GetStats::new()).await.unwrap();
    assert!(stats.renew_statements >= 10, "{stats:?}");
    held.release().await.unwrap();
}

#[actix_rt::test]
async fn cancelling_with_lock_work_frees_the_lock() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let entered = Arc::new(AtomicBool::new(false));
    let flag = entered.clone();
    let a2 = a.clone();
    let work = actix_rt::spawn(async move {
        with_lock(&a2, Acquire::new("job"), async move |_| {
            flag.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .await
    });
    while !entered.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    work.abort();
    let started = Instant::now();
    let lease = b
        .send(Acquire::new("job").timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "freed at once, not at expiry"
    );
    lease.release().await.unwrap();
}

#[actix_rt::test]
async fn with_lock_work_is_cancelled_when_the_lease_is_lost() {
    let (setup, admin) = Setup::new(Duration::from_millis(600), Duration::from_millis(100)).await;
    let a = setup.manager("a");
    let started = Instant::now();
    let table = setup.quoted_table();
    let result = with_lock(&a, Acquire::new("job"), async |lease| {
        // The work fences its writes; then the lease is taken away under it.
        let mut client = pgcoord::db::connect_spawned(&setup.builder("w").build().unwrap())
            .await
            .unwrap();
        let tx = client.transaction().await.unwrap();
        lease.fence(&tx).await.unwrap();
        tx.commit().await.unwrap();
        admin
            .execute(&format!("DELETE FROM {table}"), &[])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
    })
    .await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::LockLost);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[actix_rt::test]
async fn get_data_keep_on_release_and_replace_data() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let held = a
        .send(
            Acquire::new("cfg")
                .data(b"first".to_vec())
                .keep_on_release(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.data(), Some(&b"first"[..]));
    let info = setup.table().get("cfg").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.data.as_deref()),
        (Some("a"), Some(&b"first"[..]))
    );
    held.release().await.unwrap();

    // Kept: the row and its data stay, free.
    let info = setup.table().get("cfg").await.unwrap();
    assert_eq!((info.owner, info.token, info.remaining), (None, None, None));
    assert_eq!(info.data.as_deref(), Some(&b"first"[..]));

    // Without replace_data the kept data wins; with it, the new data does.
    let kept = b
        .send(
            Acquire::new("cfg")
                .data(b"second".to_vec())
                .keep_on_release(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.data(), Some(&b"first"[..]));
    kept.release().await.unwrap();
    let replaced = b
        .send(Acquire::new("cfg").data(b"third".to_vec()).replace_data())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replaced.data(), Some(&b"third"[..]));
    replaced.release().await.unwrap();
    // Not kept this time: the row is gone.
    assert_eq!(
        setup.table().get("cfg").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let all = setup.table().list_prefix("").await.unwrap();
    assert!(all.is_empty());
}

#[actix_rt::test]
async fn typed_data_round_trips_as_messagepack() {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Leader {
        addr: String,
        term: u32,
    }
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    let value = Leader {
        addr: "10.0.0.1:80".into(),
        term: 7,
    };
    let held = a
        .send(Acquire::new("leader").value(&value).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.value::<Leader>().unwrap(), Some(value));
    let info = setup.table().get("leader").await.unwrap();
    assert_eq!(
        info.value::<Leader>().unwrap(),
        held.value::<Leader>().unwrap()
    );
    held.release().await.unwrap();
}

#[actix_rt::test]
async fn bad_names_are_rejected_before_sql() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    for name in [String::new(), "n".repeat(256), "a\0b".into()] {
        let err = a.send(Acquire::new(name)).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
    assert!(a.send(Acquire::new("n".repeat(255))).await.unwrap().is_ok());
    // An owner with a NUL byte never gets as far as a manager.
    let err = setup.builder("own\0er").build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}

#[actix_rt::test]
async fn a_lease_this_manager_holds_is_already_held_at_once() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    let held = a.send(Acquire::new("job")).await.unwrap().unwrap();
    for again in [
        Acquire::new("job"),
        Acquire::new("job").fail_if_locked(),
        Acquire::new("job").timeout(Duration::from_secs(5)),
    ] {
        let started = Instant::now();
        let err = a.send(again).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyHeld);
        assert!(started.elapsed() < Duration::from_millis(200));
    }
    held.release().await.unwrap();
    // Released, it can be taken again.
    let again = a.send(Acquire::new("job")).await.unwrap().unwrap();
    again.release().await.unwrap();
}

#[actix_rt::test]
async fn shutdown_tells_every_subscriber_once_per_lease() {
    let (setup, client) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    let lost = Collector::subscribe(&a).await;
    let one = a.send(Acquire::new("one")).await.unwrap().unwrap();
    let two = a.send(Acquire::new("two")).await.unwrap().unwrap();
    a.send(Shutdown).await.unwrap();
    let mut got = lost.wait_for(2, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(lost.received().len(), 2, "once each");
    got.sort_by_key(|l| format!("{:?}", l.key));
    assert!(
        got.iter().all(|l| l.reason == LossReason::Shutdown),
        "{got:?}"
    );
    assert_eq!(
        got.iter().map(|l| l.key.clone()).collect::<Vec<_>>(),
        [LockKey::Lease("one".into()), LockKey::Lease("two".into()),]
    );
    assert_eq!(one.loss(), Some(LossReason::Shutdown));
    assert_eq!(two.loss(), Some(LossReason::Shutdown));
    // And the leases were released on the server.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let sql = format!("SELECT count(*) FROM {}", setup.quoted_table());
        let rows: i64 = client.query_one(&sql, &[]).await.unwrap().get(0);
        if rows == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{rows} rows left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn call_folds_a_stopped_actor_into_unavailable() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    let lease = a.call(Acquire::new("job")).await.unwrap();
    let err = a.call(Acquire::new("job")).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::AlreadyHeld,
        "pgcoord's errors come through as they are"
    );
    drop(lease);
    a.send(Shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = a.call(Acquire::new("other")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[actix_rt::test]
async fn an_acquire_with_its_own_lease_is_renewed_and_lost_by_it() {
    let (setup, _admin) = Setup::new(Duration::from_secs(1), Duration::from_millis(250)).await;
    let a = setup.manager("a");
    let long = a
        .call(Acquire::new("long").lease(Duration::from_secs(6)))
        .await
        .unwrap();
    let short = a.call(Acquire::new("short")).await.unwrap();
    // Past the manager's lease, several beats later: each renewed by its own lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(long.loss().is_none() && short.loss().is_none());
    let left = |info: pgcoord::LeaseInfo| info.remaining.unwrap();
    let long_left = left(setup.table().get("long").await.unwrap());
    let short_left = left(setup.table().get("short").await.unwrap());
    assert!(long_left > Duration::from_secs(4), "{long_left:?}");
    assert!(short_left <= Duration::from_secs(1), "{short_left:?}");

    // A holder that stops renewing (heartbeats off) keeps a 3 s lease past the manager's 1 s,
    // and gives it up before the server does.
    let config = setup.builder("paused").heartbeat(Duration::ZERO).build();
    let paused = LockManager::new(config.unwrap()).start();
    let held = paused
        .call(Acquire::new("paused").lease(Duration::from_secs(3)))
        .await
        .unwrap();
    let taken = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(held.loss().is_none(), "held past the manager's lease");
    let refused = a
        .call(Acquire::new("paused").fail_if_locked())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotAcquired);
    assert_eq!(held.lost().await, Some(LossReason::DeadlinePassed));
    let lost_after = taken.elapsed();
    assert!(
        lost_after >= Duration::from_millis(2500) && lost_after < Duration::from_secs(3),
        "reported lost a tenth of its lease before it ends: {lost_after:?}"
    );
    let _taken_over = a
        .call(Acquire::new("paused").timeout(Duration::from_secs(5)))
        .await
        .unwrap();

    // Shorter than the manager's, or past the most: refused before any SQL.
    for lease in [
        Duration::from_millis(500),
        MAX_LEASE + Duration::from_secs(1),
    ] {
        let err = a.call(Acquire::new("x").lease(lease)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{lease:?}: {err}");
        let err = a
            .call(AcquirePermit::new("s", 2).lease(lease))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }
}
