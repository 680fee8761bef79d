//! Advisory locks through `AdvisoryLocks`: contention, modes, waits, cancellation, guards, and
//! lost sessions (terminated and black-holed).

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, unique_name};
use tokio_postgres::Client;

use super::{Collector, Setup};

const FAST: Duration = Duration::from_millis(200);

/// A key no other test uses, small enough that pg_locks shows it as objid with classid 0.
fn key() -> i64 {
    pgcoord::advisory::key_for_name(&unique_name("key")) & 0x7fff_ffff
}

/// A started collector subscribed to `locks`' losses.
async fn subscribe(locks: &Addr<AdvisoryLocks>) -> Collector<LockLost> {
    let (collector, recipient) = Collector::start_new();
    locks.send(SubscribeLockLost(recipient)).await.unwrap();
    collector
}

async fn setup() -> (Setup, Client) {
    Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await
}

fn manager_with(setup: &Setup, owner: &str, pg: &tokio_postgres::Config) -> Addr<AdvisoryLocks> {
    let config = setup
        .builder(owner)
        .pg_config(pg)
        .ping_interval(FAST)
        .ping_timeout(FAST)
        .build()
        .unwrap();
    AdvisoryLocks::new(config).start()
}

/// Managers "a" and "b" on the test database, and a key of the test's own.
fn two_managers(setup: &Setup) -> (Addr<AdvisoryLocks>, Addr<AdvisoryLocks>, i64) {
    (
        manager_with(setup, "a", &setup.pg),
        manager_with(setup, "b", &setup.pg),
        key(),
    )
}

/// Sessions holding (granted) or waiting for (not granted) the advisory key.
async fn locks(admin: &Client, key: i64) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) FROM pg_locks
             WHERE locktype = 'advisory' AND classid = 0 AND objid::text::bigint = $1",
            &[&key],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[actix_rt::test]
async fn two_managers_contend_and_locks_never_stack() {
    let (setup, admin) = setup().await;
    let (a, b, k) = two_managers(&setup);
    let guard1 = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    assert_eq!(
        b.send(AdvisoryLock::new(k))
            .await
            .unwrap()
            .unwrap_err()
            .kind(),
        ErrorKind::NotAcquired
    );
    assert_eq!(
        a.send(AdvisoryLock::new(k))
            .await
            .unwrap()
            .unwrap_err()
            .kind(),
        ErrorKind::AlreadyHeld
    );
    assert_eq!(locks(&admin, k).await, (1, 0), "held once, not stacked");
    guard1.release().await.unwrap();
    let guard2 = b.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    guard2.release().await.unwrap();
    assert_eq!(locks(&admin, k).await, (0, 0));
}

#[actix_rt::test]
async fn shared_holders_exclude_an_exclusive_one() {
    let (setup, _) = setup().await;
    let (a, b, c, k) = (
        manager_with(&setup, "a", &setup.pg),
        manager_with(&setup, "b", &setup.pg),
        manager_with(&setup, "c", &setup.pg),
        key(),
    );
    let guard3 = a
        .send(AdvisoryLock::new(k).shared())
        .await
        .unwrap()
        .unwrap();
    let guard4 = b
        .send(AdvisoryLock::new(k).shared())
        .await
        .unwrap()
        .unwrap();
    let err = c.send(AdvisoryLock::new(k)).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    guard3.release().await.unwrap();
    guard4.release().await.unwrap();
    let _guard5 = c.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let err = a
        .send(AdvisoryLock::new(k).shared())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
}

#[actix_rt::test]
async fn a_wait_with_a_deadline_gets_the_lock_or_gives_up_on_the_server() {
    let (setup, admin) = setup().await;
    let (a, b, k) = two_managers(&setup);
    let guard6 = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let started = Instant::now();
    let err = b
        .send(AdvisoryLock::new(k).timeout(Duration::from_millis(300)))
        .await
        .unwrap()
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // The server waited most of it (a quarter is kept for the answer), and no longer.
    assert!(took >= Duration::from_millis(220), "{took:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");
    assert_eq!(locks(&admin, k).await, (1, 0), "no wait left on the server");

    let waiting = b.send(AdvisoryLock::new(k).timeout(Duration::from_secs(10)));
    actix_rt::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard6.release().await.unwrap();
    });
    let _taken = waiting.await.unwrap().unwrap();
    assert_eq!(locks(&admin, k).await, (1, 0));
}

/// A timeout is hard, as every pgcoord timeout is: with the server unreachable (new connections
/// hang, as in a partition), the call answers within it, not after the connect timeout.
#[actix_rt::test]
async fn a_timeout_is_answered_in_time_while_connecting_hangs() {
    let (setup, _admin) = setup().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    proxy.black_hole_new(true);
    let locks = manager_with(&setup, "a", &proxy.pg_config(&setup.pg));
    let timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = locks
        .send(AdvisoryLock::new(key()).timeout(timeout))
        .await
        .unwrap()
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took < timeout + Duration::from_millis(300), "{took:?}");
}

#[actix_rt::test]
async fn cancelling_a_blocked_wait_leaves_no_lock_held() {
    let (setup, admin) = setup().await;
    let (a, b, k) = two_managers(&setup);
    let guard7 = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let gave_up = b
        .send(AdvisoryLock::new(k).timeout(Duration::from_secs(60)))
        .timeout(Duration::from_millis(300))
        .await;
    assert!(matches!(gave_up, Err(MailboxError::Timeout)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        locks(&admin, k).await,
        (1, 0),
        "the server-side wait was cancelled"
    );
    guard7.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        locks(&admin, k).await,
        (0, 0),
        "the abandoned waiter took nothing"
    );
}

#[actix_rt::test]
async fn a_terminated_session_is_reported_lost_and_release_does_not_unlock_the_new_holder() {
    let (setup, admin) = setup().await;
    // Pings far apart: the loss must be noticed from the connection ending, not from a ping.
    let slow_pings = setup
        .builder("a")
        .ping_interval(Duration::from_secs(30))
        .build()
        .unwrap();
    let (a, b, k) = (
        AdvisoryLocks::new(slow_pings).start(),
        manager_with(&setup, "b", &setup.pg),
        key(),
    );
    let lost = subscribe(&a).await;
    let guard8 = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let killed = Instant::now();
    end_session_holding(&admin, k).await;
    while lost.received().is_empty() {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "reported long before the next ping (30 s)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The connection's end is noticed at once, not at the next ping (30 s away).
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "reported before the next ping: {:?}",
        killed.elapsed()
    );
    let received = lost.received();
    assert_eq!(
        (received[0].key.clone(), received[0].reason),
        (LockKey::Advisory(k), LossReason::ConnectionLost)
    );
    let _guard9 = b.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    assert_eq!(
        guard8.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
    assert_eq!(locks(&admin, k).await, (1, 0), "the new holder keeps it");
    assert_eq!(lost.received().len(), 1, "reported once");
}

#[actix_rt::test]
async fn a_black_holed_session_is_reported_stalled() {
    let (setup, _) = setup().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let via_proxy = proxy.pg_config(&setup.pg);
    let (a, k) = (manager_with(&setup, "a", &via_proxy), key());
    let lost = subscribe(&a).await;
    let guard10 = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    proxy.cut();
    let cut = Instant::now();
    while lost.received().is_empty() {
        assert!(cut.elapsed() < Duration::from_secs(5), "not reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        cut.elapsed() < FAST * 2 + Duration::from_millis(300),
        "within interval plus timeout: {:?}",
        cut.elapsed()
    );
    eprintln!("black-holed session reported after {:?}", cut.elapsed());
    assert_eq!(lost.received()[0].reason, LossReason::Stalled);
    assert_eq!(
        guard10.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
}

#[actix_rt::test]
async fn stopping_the_manager_releases_every_lock() {
    let (setup, admin) = setup().await;
    let a = manager_with(&setup, "a", &setup.pg);
    let keys = [key(), key(), key()];
    let lost = subscribe(&a).await;
    let mut guards = Vec::new();
    for k in keys {
        guards.push(a.send(AdvisoryLock::new(k)).await.unwrap().unwrap());
    }
    a.send(Shutdown).await.unwrap();
    let reported = lost.wait_for(3, Duration::from_secs(5)).await;
    assert!(reported.iter().all(|l| l.reason == LossReason::Shutdown));
    for guard in &guards {
        assert_eq!(guard.lost().await, Some(LossReason::Shutdown));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in keys {
        assert_eq!(locks(&admin, k).await, (0, 0));
    }
}

/// Ends, on the server, the session that holds advisory key `key`.
async fn end_session_holding(admin: &Client, key: i64) {
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid::text::bigint = $1",
            &[&key],
        )
        .await
        .unwrap();
}

/// The backend holding the advisory key.
async fn holder_pid(admin: &Client, key: i64) -> i32 {
    admin
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 0
             AND objid::text::bigint = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

#[actix_rt::test]
async fn a_session_that_holds_nothing_is_reused() {
    let (setup, admin) = setup().await;
    let (a, b) = (
        manager_with(&setup, "a", &setup.pg),
        manager_with(&setup, "b", &setup.pg),
    );
    let (k1, k2, k3) = (key(), key(), key());
    let guard12 = a.send(AdvisoryLock::new(k1)).await.unwrap().unwrap();
    let first = holder_pid(&admin, k1).await;
    guard12.release().await.unwrap();
    let _guard13 = a.send(AdvisoryLock::new(k2)).await.unwrap().unwrap();
    assert_eq!(holder_pid(&admin, k2).await, first, "same session, reused");
    assert_eq!(
        locks(&admin, k1).await,
        (0, 0),
        "holding nothing from before"
    );
    // A refused try leaves its session clean, too; a concurrent second acquire is refused.
    let _guard14 = b.send(AdvisoryLock::new(k3)).await.unwrap().unwrap();
    let (x, y) = (a.send(AdvisoryLock::new(k3)), a.send(AdvisoryLock::new(k3)));
    let (x, y) = (x.await.unwrap().unwrap_err(), y.await.unwrap().unwrap_err());
    let mut kinds = [x.kind(), y.kind()];
    kinds.sort_by_key(|k| format!("{k:?}"));
    assert_eq!(kinds, [ErrorKind::AlreadyHeld, ErrorKind::NotAcquired]);
}

#[actix_rt::test]
async fn a_dropped_guard_releases_and_a_lost_lock_is_reported_to_its_guard() {
    let (setup, admin) = setup().await;
    let (a, b, k) = two_managers(&setup);
    let guard = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    assert_eq!((guard.key(), guard.loss()), (k, None));
    drop(guard);
    // Released in the background: the other side gets it.
    let taken = b
        .send(AdvisoryLock::new(k).timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(locks(&admin, k).await, (1, 0));
    end_session_holding(&admin, k).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), taken.lost())
        .await
        .expect("the guard hears of the loss");
    assert_eq!(reason, Some(LossReason::ConnectionLost));
    assert_eq!(taken.loss(), Some(LossReason::ConnectionLost));
    assert_eq!(
        taken.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
    let (a, b) = (
        a.send(GetStats::new()).await.unwrap(),
        b.send(GetStats::new()).await.unwrap(),
    );
    assert_eq!(
        (a.granted, a.released, a.lost, a.held),
        (1, 1, 0, 0),
        "{a:?}"
    );
    assert_eq!(
        (b.granted, b.released, b.lost, b.held),
        (1, 0, 1, 0),
        "{b:?}"
    );
    assert_eq!(a.idle_sessions, 1, "the released session kept for reuse");
}

#[actix_rt::test]
async fn a_guard_from_an_earlier_tenure_does_not_release_a_later_one() {
    let (setup, admin) = setup().await;
    let (a, _, k) = two_managers(&setup);
    let first = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    // The first tenure ends by a loss: its session is ended on the server.
    end_session_holding(&admin, k).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), first.lost()).await;
    assert_eq!(ended.unwrap(), Some(LossReason::ConnectionLost));
    let second = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    // Its release is sent whatever the guard knows, but names the first tenure: the later one
    // of the same key, in the same manager, stays held.
    assert_eq!(
        first.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        locks(&admin, k).await,
        (1, 0),
        "still held by the second guard"
    );
    assert_eq!(second.loss(), None);
    second.release().await.unwrap();
    assert_eq!(locks(&admin, k).await, (0, 0));
}

/// A guard's `lost()` ends without a loss when the lock is released, by `release` or by
/// dropping the guard; stopping the actor is a loss (`Shutdown`).
#[actix_rt::test]
async fn a_release_is_no_loss_and_a_shutdown_is() {
    let (setup, _admin) = setup().await;
    let (a, _, k) = two_managers(&setup);
    let guard = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let lost = guard.lost();
    guard.release().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(ended, Ok(None), "released");
    let guard = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    let lost = guard.lost();
    drop(guard);
    let ended = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(ended, Ok(None), "dropped");
    let guard = a.send(AdvisoryLock::new(k)).await.unwrap().unwrap();
    a.send(Shutdown).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    assert_eq!(ended, Ok(Some(LossReason::Shutdown)), "stopped");
}

/// A name locked the way sqlx's `PgAdvisoryLock::new` locks it (its published algorithm, here a
/// raw `pg_try_advisory_lock` of its key) excludes `AdvisoryLock::named_like_sqlx` of the same
/// name, and the other way round: services half moved from sqlx keep excluding each other.
#[actix_rt::test]
async fn a_name_locked_by_sqlx_excludes_named_like_sqlx() {
    let (setup, admin) = setup().await;
    let (a, _, _) = two_managers(&setup);
    let name = unique_name("sqlx");
    let key = pgcoord::advisory::key_like_sqlx(&name);
    let row = admin
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    let err = a
        .send(AdvisoryLock::named_like_sqlx(&name))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    let _guard = a
        .send(AdvisoryLock::named_like_sqlx(&name))
        .await
        .unwrap()
        .unwrap();
    let row = admin
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0), "held by named_like_sqlx");
}
