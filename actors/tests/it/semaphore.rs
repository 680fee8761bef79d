//! Counting semaphores: never more than N holders, every waiter served, woken by releases, each
//! permit a lease of its own (token, loss), bad inputs refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord_actors::*;

use super::{Collector, Setup};

#[actix_rt::test]
async fn never_more_than_n_holders_and_every_waiter_is_served() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    const PERMITS: u32 = 3;
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    // 3 managers (as 3 processes) with 4 callers each: 12 contenders for 3 permits.
    for m in 0..3 {
        let manager = setup.manager(&format!("process-{m}"));
        for _ in 0..4 {
            let (manager, inside, most) = (manager.clone(), inside.clone(), most.clone());
            tasks.push(actix_rt::spawn(async move {
                let mut served = 0u32;
                let mut tokens = Vec::new();
                while Instant::now() < stop {
                    let permit = manager
                        .call(AcquirePermit::new("pool", PERMITS).timeout(Duration::from_secs(10)))
                        .await
                        .unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.push(permit.token());
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                    served += 1;
                }
                (served, tokens)
            }));
        }
    }
    let mut counts = Vec::new();
    let mut tokens = Vec::new();
    for task in tasks {
        let (served, t) = task.await.unwrap();
        counts.push(served);
        tokens.extend(t);
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders of {PERMITS} permits"
    );
    assert_eq!(most, PERMITS as usize, "the permits were used side by side");
    assert!(
        counts.iter().all(|&c| c > 0),
        "every caller served: {counts:?}"
    );
    let total = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), total, "a token of its own per permit");
    eprintln!("served per caller: {counts:?}");
}

#[actix_rt::test]
async fn a_waiter_is_woken_by_a_release_and_a_permit_is_lost_like_a_lease() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let first = a.call(AcquirePermit::new("one", 2)).await.unwrap();
    let second = a.call(AcquirePermit::new("one", 2)).await.unwrap();
    assert_ne!(first.name(), second.name(), "two slots");
    let full = b
        .call(AcquirePermit::new("one", 2).timeout(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(full.kind(), ErrorKind::NotAcquired);
    // A waiter in another process: woken by the release, not by its poll (2.5 s away).
    let waiting =
        actix_rt::spawn(b.call(AcquirePermit::new("one", 2).timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    let slot = first.name().to_owned();
    first.release().await.unwrap();
    let permit = waiting.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(permit.name(), slot);
    // A permit lost on the server (freed by hand) is reported like a lease, to it alone.
    let lost = Collector::subscribe(&a).await;
    admin
        .execute(
            &format!("DELETE FROM {} WHERE name = $1", setup.quoted_table()),
            &[&second.name()],
        )
        .await
        .unwrap();
    a.call(RunNow).await.unwrap();
    assert_eq!(second.lost().await, Some(LossReason::TakenOver));
    assert_eq!(lost.wait_for(1, Duration::from_secs(5)).await.len(), 1);
    assert!(permit.loss().is_none());
}

#[actix_rt::test]
async fn bad_semaphores_are_refused_before_any_sql() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let manager = setup.manager("m");
    let err = manager.call(AcquirePermit::new("s", 0)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = manager.call(AcquirePermit::new("", 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    let err = manager
        .call(AcquirePermit::new("x".repeat(254), 10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}

/// The acquire statements `manager` has sent.
async fn acquire_statements(manager: &actix::Addr<LockManager>) -> u64 {
    manager
        .send(GetStats::new())
        .await
        .unwrap()
        .acquire_statements
}

/// Forged announcements that a slot of a full semaphore is free, flooded for a second: the
/// waiter's attempts each find the same newest token (nothing changed hands), so the doorbell
/// gap holds and the flood costs an attempt per gap, and grants nothing. A real release is
/// still taken.
#[actix_rt::test]
async fn a_flood_of_forged_slot_releases_costs_a_waiter_an_attempt_per_gap() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let channel = setup
        .builder("admin")
        .build()
        .unwrap()
        .lease_channel()
        .clone();
    let (holder, waiter) = (setup.manager("holder"), setup.manager("waiter"));
    let name = pgcoord_testkit::unique_name("flooded");
    let held = holder.call(AcquirePermit::new(&name, 1)).await.unwrap();
    let wait = {
        let (waiter, name) = (waiter.clone(), name.clone());
        actix_rt::spawn(async move {
            waiter
                .call(AcquirePermit::new(&name, 1).timeout(Duration::from_secs(30)))
                .await
        })
    };
    // The waiter is refused once and naps on the doorbell.
    let asked = async || acquire_statements(&waiter).await;
    while asked().await < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slot = format!("{name}#0");
    let forged = format!("{}:{slot}", slot.len());
    let (sent, asked, most) = super::flood(&admin, channel.as_str(), &forged, asked).await;
    assert!(sent > most, "the flood was a flood: {sent} sent");
    assert!(asked <= most, "{asked} attempts for {sent} announcements");
    assert!(!wait.is_finished(), "the waiter was granted on a forgery");
    held.release().await.unwrap();
    let permit = wait.await.unwrap().unwrap();
    permit.release().await.unwrap();
}

/// A caller of a manager that holds every permit itself sends no statement while it waits: no
/// slot could be granted to it. It is not left behind either: the release's doorbell makes it
/// ask, and it is granted. (A statement over no slots used to answer "full", and when that
/// attempt was a doorbell's — a release announced before its own answer was in — the waiter's
/// next doorbell was put off by the doorbell's gap: 65 permits a second where 740 now.)
#[actix_rt::test]
async fn a_caller_whose_manager_holds_every_permit_waits_without_statements() {
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let manager = setup.manager("alone");
    let name = pgcoord_testkit::unique_name("ours");
    let held = manager.call(AcquirePermit::new(&name, 1)).await.unwrap();
    let asked = async || acquire_statements(&manager).await;
    let before = asked().await;
    let wait = {
        let (manager, name) = (manager.clone(), name.clone());
        actix_rt::spawn(async move {
            let request = AcquirePermit::new(&name, 1).timeout(Duration::from_secs(30));
            manager.call(request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!wait.is_finished());
    assert_eq!(
        asked().await,
        before,
        "asked the database for a slot held here"
    );
    held.release().await.unwrap();
    let permit = wait.await.unwrap().unwrap();
    assert_eq!(
        asked().await,
        before + 1,
        "one attempt, once the slot was free"
    );
    permit.release().await.unwrap();
}

/// A caller whose manager holds every permit needs nothing from the database while it waits:
/// the database unreachable meanwhile (pooled connections black-holed, new ones refused) does
/// not fail its wait, and once the database answers again and a permit is given back, it is
/// served.
#[actix_rt::test]
async fn a_caller_whose_manager_holds_every_permit_waits_through_an_outage() {
    let (setup, _admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(1)).await;
    let proxy = pgcoord_testkit::Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("alone")
        .pg_config(&proxy.pg_config(&setup.pg))
        .statement_timeout(Duration::from_millis(300))
        .pool_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let manager = actix::Actor::start(LockManager::new(config));
    let name = pgcoord_testkit::unique_name("outage");
    let held = manager.call(AcquirePermit::new(&name, 1)).await.unwrap();
    let wait = {
        let (manager, name) = (manager.clone(), name.clone());
        actix_rt::spawn(async move {
            let request = AcquirePermit::new(&name, 1).timeout(Duration::from_secs(60));
            manager.call(request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.refuse(true);
    proxy.cut();
    // Long enough for several of the waiter's short naps, each of which used to borrow a
    // connection, and for the pool to give up on one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!wait.is_finished(), "{:?}", wait.await);
    proxy.refuse(false);
    held.release().await.unwrap();
    let permit = wait.await.unwrap().unwrap();
    permit.release().await.unwrap();
}
