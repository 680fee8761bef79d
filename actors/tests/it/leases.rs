//! Leases through the LockManager: pglock's six integration scenarios, then what pglock gets
//! wrong.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord::lease::Attempt;
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
    let err = b.send(Get("job".into())).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "no row left behind");
    assert_eq!(b.send(GetStats).await.unwrap().granted, 0);
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
    let info = a.send(Get("job".into())).await.unwrap().unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token),
        (Some("a"), Some(held.token()))
    );
    assert!(info.is_held());
    let tx = client.transaction().await.unwrap();
    held.fence(&tx).await.unwrap();
    tx.commit().await.unwrap();
    assert!(lost.received().is_empty());
    let stats = a.send(GetStats).await.unwrap();
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
        with_lock(&a2, Acquire::new("job"), |_| async move {
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
    let result = with_lock(&a, Acquire::new("job"), |_| {
        let admin = &admin;
        let table = setup.quoted_table();
        async move {
            admin
                .execute(&format!("DELETE FROM {table}"), &[])
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
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
    let info = b.send(Get("cfg".into())).await.unwrap().unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.data.as_deref()),
        (Some("a"), Some(&b"first"[..]))
    );
    held.release().await.unwrap();

    // Kept: the row and its data stay, free.
    let info = b.send(Get("cfg".into())).await.unwrap().unwrap();
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
        b.send(Get("cfg".into())).await.unwrap().unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let all = b.send(List).await.unwrap().unwrap();
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
    held.release().await.unwrap();
}

#[actix_rt::test]
async fn bad_names_are_rejected_before_sql() {
    let (setup, _) = Setup::new(LONG, BEAT).await;
    let a = setup.manager("a");
    for name in [String::new(), "n".repeat(256)] {
        let err = a.send(Acquire::new(name)).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
    assert!(a.send(Acquire::new("n".repeat(255))).await.unwrap().is_ok());
}

#[actix_rt::test]
async fn takeover_right_after_the_holder_stops_heartbeating() {
    let lease = Duration::from_millis(1000);
    let (setup, admin) = Setup::new(lease, Duration::from_millis(200)).await;
    // A holder that froze right after its grant: the lease statement alone, no runtime behind it.
    let config = setup.builder("frozen").build().unwrap();
    let table = pgcoord::LeaseTable::new(&config);
    let granted_at = Instant::now();
    let Attempt::Granted(old) = table
        .try_acquire(&admin, "job", "frozen", None, false, lease)
        .await
        .unwrap()
    else {
        panic!("the lease was free")
    };
    let contender = setup.manager("contender");
    let new = contender.send(Acquire::new("job")).await.unwrap().unwrap();
    let waited = granted_at.elapsed();
    eprintln!("takeover after {waited:?} with a {lease:?} lease");
    assert!(
        waited >= lease - Duration::from_millis(20),
        "not before expiry: {waited:?}"
    );
    assert!(
        waited <= lease + Duration::from_millis(400),
        "as soon as it expired: {waited:?}"
    );
    assert!(new.token() > old.token);

    // The old holder's release and renewal change nothing and report the loss.
    let err = table
        .release(&admin, "job", old.token, false)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let renewed = table
        .renew(&admin, &[("job".into(), old.token)], lease)
        .await
        .unwrap();
    assert!(renewed.is_empty());
    let info = contender.send(Get("job".into())).await.unwrap().unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token),
        (Some("contender"), Some(new.token()))
    );
    new.release().await.unwrap();
}

#[actix_rt::test]
async fn a_holder_that_cannot_renew_reports_the_loss_before_the_server_expiry() {
    let lease = Duration::from_millis(1000);
    // Heartbeats off: nothing renews, as when the database cannot be reached.
    let (setup, _) = Setup::new(lease, Duration::ZERO).await;
    let frozen = setup.manager("frozen");
    let lost = Collector::subscribe(&frozen).await;
    let started = Instant::now();
    let old = frozen.send(Acquire::new("job")).await.unwrap().unwrap();
    let reason = old.lost().await;
    let noticed = started.elapsed();
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(
        noticed < lease,
        "reported before the server could give it away: {noticed:?}"
    );
    assert!(
        noticed >= lease * 8 / 10,
        "not long before the deadline: {noticed:?}"
    );
    let received = lost.received();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].reason, LossReason::DeadlinePassed);
    assert_eq!(old.release().await.unwrap_err().kind(), ErrorKind::LockLost);
}

#[actix_rt::test]
async fn a_lease_taken_away_is_reported_lost_exactly_once() {
    let (setup, admin) = Setup::new(Duration::from_millis(600), Duration::from_millis(100)).await;
    let a = setup.manager("a");
    let (first, second) = (
        Collector::subscribe(&a).await,
        Collector::subscribe(&a).await,
    );
    let held = a.send(Acquire::new("job")).await.unwrap().unwrap();
    let _other = a.send(Acquire::new("untouched")).await.unwrap().unwrap();
    admin
        .execute(
            &format!("DELETE FROM {} WHERE name = 'job'", setup.quoted_table()),
            &[],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    for collector in [&first, &second] {
        let received = collector.received();
        assert_eq!(received.len(), 1, "{received:?}");
        assert_eq!(received[0].key, LockKey::Lease("job".into()));
        assert_eq!(
            (received[0].token, received[0].reason),
            (Some(held.token()), LossReason::TakenOver)
        );
    }
    assert_eq!(held.loss(), Some(LossReason::TakenOver));
    assert_eq!(
        held.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(first.received().len(), 1, "still exactly once");
    assert_eq!(a.send(GetStats).await.unwrap().held, 1);
}

#[actix_rt::test]
async fn sixteen_contenders_never_overlap_and_all_are_served() {
    let (setup, _) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    const CONTENDERS: usize = 16;
    const ROUNDS: u32 = 6;
    let inside = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let manager = setup.manager(&format!("c{i}"));
        let (inside, total) = (inside.clone(), total.clone());
        tasks.push(actix_rt::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = manager
                    .send(Acquire::new("counter"))
                    .await
                    .unwrap()
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                total.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    let started = Instant::now();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every contender is served")
            .unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), CONTENDERS as u32 * ROUNDS);
    eprintln!(
        "{} handoffs in {:?}",
        CONTENDERS as u32 * ROUNDS,
        started.elapsed()
    );
}

#[actix_rt::test]
async fn a_thousand_leases_are_renewed_by_one_statement_per_tick() {
    let (setup, admin) = Setup::new(Duration::from_secs(4), Duration::from_millis(500)).await;
    let a = setup.manager("a");
    let requests: Vec<_> = (0..1000)
        .map(|i| a.send(Acquire::new(format!("lease-{i}"))))
        .collect();
    let mut leases = Vec::new();
    for request in requests {
        leases.push(request.await.unwrap().unwrap());
    }
    let before = a.send(GetStats).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let after = a.send(GetStats).await.unwrap();
    let ticks = after.renew_statements - before.renew_statements;
    assert!((2..=4).contains(&ticks), "one statement per tick: {ticks}");
    // One statement renews every row with the same server timestamp.
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT expires_at), bool_and(expires_at > acquired_at)
                 FROM {}",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap();
    let (rows, distinct, renewed): (i64, i64, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((rows, distinct, renewed), (1000, 1, true));
    assert_eq!(after.lost, 0);
}

#[actix_rt::test]
async fn releases_racing_heartbeats_are_never_reported_as_losses() {
    // A heartbeat every 20 ms keeps a renewal in flight most of the time.
    let (setup, _) = Setup::new(Duration::from_millis(400), Duration::from_millis(20)).await;
    let a = setup.manager("a");
    let lost = Collector::subscribe(&a).await;
    for i in 0..150 {
        let lease = a
            .send(Acquire::new(format!("job-{}", i % 5)))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(i % 3)).await;
        lease.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(lost.received().is_empty(), "{:?}", lost.received());
    assert!(a.send(GetStats).await.unwrap().renew_statements > 0);
}

#[actix_rt::test]
async fn a_coordinator_wakes_waiters_through_its_one_listen_connection() {
    let (setup, admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(5)).await;
    let app = pgcoord::embedded::unique_name("app");
    let start = |owner: &str| {
        Coordinator::start(setup.builder(owner).application_name(&app).build().unwrap())
    };
    let (a, b) = (start("a"), start("b"));
    let held = a.locks.send(Acquire::new("job")).await.unwrap().unwrap();
    let waiting = b
        .locks
        .send(Acquire::new("job").timeout(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    // The polling fallback is a quarter lease (7.5 s): this fast, it was the NOTIFY.
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();
    let names: Vec<String> = admin
        .query("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1 || ' %' ORDER BY 1", &[&app])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        [format!("{app} listener"), format!("{app} listener")],
        "one LISTEN connection per coordinator, no lease waker"
    );
}
