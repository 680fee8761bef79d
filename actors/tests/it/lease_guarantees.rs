//! Leases: what pglock gets wrong and pgcoord must not — takeover on expiry, the holder's own
//! deadline, loss reported exactly once, fairness under contention, batched heartbeats, and
//! wake-ups through the one LISTEN connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord::ErrorKind;
use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord_actors::*;

use super::{Collector, Setup};

#[actix_rt::test]
async fn takeover_right_after_the_holder_stops_heartbeating() {
    let lease = Duration::from_millis(1000);
    let (setup, admin) = Setup::new(lease, Duration::from_millis(200)).await;
    // A holder that froze right after its grant: the lease statement alone, no runtime behind it.
    let config = setup.builder("frozen").build().unwrap();
    let table = pgcoord::LeaseTable::new(&config);
    let granted_at = Instant::now();
    let Attempt::Granted(old) = table
        .owner("frozen")
        .unwrap()
        .try_acquire(&admin, &AcquireRequest::new("job"), lease)
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
        .owner("frozen")
        .unwrap()
        .release(
            &admin,
            &ReleaseRequest {
                name: "job",
                token: old.token,
                keep: false,
                announce_always: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let renewed = table
        .owner("frozen")
        .unwrap()
        .renew(&admin, &[("job", old.token)], lease)
        .await
        .unwrap();
    assert!(renewed.is_empty());
    let info = setup.table().get("job").await.unwrap();
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
    assert_eq!(reason, Some(LossReason::DeadlinePassed));
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
    assert_eq!(a.send(GetStats::new()).await.unwrap().held, 1);
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
    let before = a.send(GetStats::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let after = a.send(GetStats::new()).await.unwrap();
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
    assert!(a.send(GetStats::new()).await.unwrap().renew_statements > 0);
}

#[actix_rt::test]
async fn shutdown_releases_every_lease_even_with_releases_in_flight() {
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(5)).await;
    let a = setup.manager("a");
    let mut leases = Vec::new();
    for i in 0..60 {
        leases.push(
            a.send(Acquire::new(format!("job-{i}")))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // Half are dropped (their releases queue up), half still held, then the manager stops.
    let kept = leases.split_off(30);
    drop(leases);
    a.send(Shutdown).await.unwrap();
    let count = format!("SELECT count(*) FROM {}", setup.quoted_table());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: i64 = admin.query_one(&count, &[]).await.unwrap().get(0);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} leases left behind after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for lease in &kept {
        assert!(
            lease.loss().is_some(),
            "holders hear that their lease ended"
        );
    }
}

#[actix_rt::test]
async fn heartbeats_outlive_the_acquire_deadline() {
    // pglock issue #5: heartbeats died with the acquire call's context.
    let lease = Duration::from_millis(600);
    let (setup, _) = Setup::new(lease, Duration::from_millis(100)).await;
    let a = setup.manager("a");
    let held = a
        .send(Acquire::new("job").timeout(Duration::from_millis(100)))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(lease * 3).await;
    assert_eq!(held.loss(), None);
    let info = setup.table().get("job").await.unwrap();
    assert!(info.is_held() && info.token == Some(held.token()));
    held.release().await.unwrap();
}

#[actix_rt::test]
async fn a_holder_cut_off_from_the_database_gives_up_before_the_server_would() {
    let lease = Duration::from_millis(1000);
    let (setup, _) = Setup::new(lease, Duration::from_millis(200)).await;
    let proxy = super::Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("cut-off")
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let holder = LockManager::new(config).start();
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A full partition: every connection the manager has is black-holed (renewals hang,
    // nothing errors) and new ones are refused, so a reconnect cannot save the lease.
    proxy.refuse(true);
    proxy.cut();
    let cut = Instant::now();
    let reason = tokio::time::timeout(lease * 2, held.lost())
        .await
        .expect("reported");
    assert_eq!(reason, Some(LossReason::DeadlinePassed));
    // The last renewal was sent at most a heartbeat before the cut; its lease ends a full lease
    // after that, and the holder gave up before then.
    assert!(
        cut.elapsed() < lease,
        "gave up {:?} after the cut",
        cut.elapsed()
    );
    // Meanwhile a contender on a working connection gets it once the server's lease expires.
    let contender = setup.manager("contender");
    let taken = contender
        .send(Acquire::new("job").timeout(lease * 3))
        .await
        .unwrap()
        .unwrap();
    assert!(taken.token() > held.token());
}

/// A subscriber with a mailbox of one that is busy when the losses arrive.
struct Busy(Arc<std::sync::Mutex<Vec<LockLost>>>);
impl actix::Actor for Busy {
    type Context = actix::Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1);
    }
}
impl actix::Handler<LockLost> for Busy {
    type Result = ();
    fn handle(&mut self, lost: LockLost, _: &mut Self::Context) {
        std::thread::sleep(Duration::from_millis(50));
        self.0.lock().unwrap().push(lost);
    }
}

#[actix_rt::test]
async fn loss_reports_reach_a_busy_subscriber_too() {
    let (setup, admin) = Setup::new(Duration::from_millis(600), Duration::from_millis(100)).await;
    let a = setup.manager("a");
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let busy = Busy::start_in_arbiter(&actix::Arbiter::new().handle(), {
        let received = received.clone();
        move |_| Busy(received)
    });
    a.send(SubscribeLockLost(busy.recipient())).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..10 {
        leases.push(
            a.send(Acquire::new(format!("job-{i}")))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    admin
        .execute(&format!("DELETE FROM {}", setup.quoted_table()), &[])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while received.lock().unwrap().len() < 10 {
        assert!(
            Instant::now() < deadline,
            "got {} of 10",
            received.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
