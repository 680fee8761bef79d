//! Handover announcements as proof and as hints: a waiter holds a handed lease from the
//! announcement alone only when it names the nonce of its last refused attempt (its pool may
//! be cut off), and never after an orphan check that may have released it; false, forged or
//! late announcements grant nothing, release nothing of another's, and start no second
//! release of a lease the process is releasing itself.

use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord::LeaseTable;
use pgcoord::embedded::Proxy;
use pgcoord_actors::*;

use super::Setup;
use super::handover::{contend, row};

/// A waiter manager whose pool goes through `proxy` (so a test can cut it off) with statements
/// bounded by `statement_timeout`, and whose listener reaches the server directly.
fn waiter_behind(
    setup: &Setup,
    proxy: &Proxy,
    statement_timeout: Duration,
) -> actix::Addr<LockManager> {
    let config = (setup.builder("waiter"))
        .pg_config(&proxy.pg_config(&setup.pg))
        .session_pg_config(&setup.pg)
        .statement_timeout(statement_timeout)
        .build()
        .unwrap();
    LockManager::new(config).start()
}

/// What a forger of handover announcements works with: the lock table (its channel) and its
/// oid, and a connection that may NOTIFY, as anyone who can connect may.
struct Forger {
    table: LeaseTable,
    oid: u32,
}

impl Forger {
    async fn new(setup: &Setup, admin: &tokio_postgres::Client) -> Forger {
        let table = LeaseTable::new(&setup.builder("admin").build().unwrap());
        let oid = table.table_oid(admin).await.unwrap();
        Forger { table, oid }
    }

    /// Announces that `token` of "job" was handed to `owner`, with `nonce` (`#…`, or empty).
    async fn announce(&self, admin: &tokio_postgres::Client, token: i64, nonce: &str, owner: &str) {
        let payload = format!("3>job{token}@{}{nonce}:{owner}", self.oid);
        admin
            .execute(
                "SELECT pg_notify($1, $2)",
                &[&self.table.channel(), &payload],
            )
            .await
            .unwrap();
    }
}

/// An announcement is not proof of a grant: one that is late (a grant already taken from the
/// table and let go) or not a release's at all (anyone may NOTIFY the channel, and tokens are
/// seen on it) names a waiter, and a process with no waiter, with the holder's own token and
/// without the nonce of the waiter's attempt. The waiter is not granted and the other process
/// releases nothing: the holder keeps its lease.
#[actix_rt::test]
async fn a_false_handover_announcement_grants_nothing_and_releases_nothing() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let forger = Forger::new(&setup, &admin).await;
    let (holder, waiter, bystander) = (
        setup.manager("holder"),
        setup.manager("waiter"),
        setup.manager("bystander"),
    );
    let (held, waits) = contend(&holder, &waiter, None).await;
    // Without a nonce (as a place of an older version), and with nonces the forger guessed.
    for owner in ["waiter", "bystander"] {
        for nonce in ["", "#0", "#1", "#-1"] {
            forger.announce(&admin, held.token(), nonce, owner).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !waits.is_finished(),
        "the waiter was granted: it took a false handover, or another process released the holder's lease on one"
    );
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("holder", held.token()));
    // The real release hands it over, and the waiter holds it with the new token.
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("waiter", lease.token()));
    lease.release().await.unwrap();
    drop(bystander);
}

/// The announcement of a handover names the nonce of the waiter's refused attempt, which proves
/// the grant: the waiter holds the lease without a statement. Its pool is cut off (black-holed
/// and refusing new connections) after it lined up; its listener is not. A waiter that read its
/// row first would wait for the statement timeout and then fail to reach the server.
#[actix_rt::test]
async fn a_handover_naming_the_waiters_attempt_is_taken_without_a_statement() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let (holder, waiter) = (
        setup.manager("holder"),
        waiter_behind(&setup, &proxy, Duration::from_secs(5)),
    );
    let (held, waits) = contend(&holder, &waiter, Some(b"mine")).await;
    proxy.cut();
    proxy.refuse(true);
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(lease.data(), Some(&b"mine"[..]));
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("waiter", lease.token()));
    // Its pool healed, it releases the lease as any other.
    proxy.refuse(false);
    proxy.reset();
    lease.release().await.unwrap();
    assert_eq!(row(&setup, &admin, "job").await, None);
}

/// A handover whose announcement names the waiter's last refused attempt, made while the
/// waiter's next attempt hung on a black-holed pooled connection: the orphan check after that
/// attempt (its outcome unknown) releases every lease of the name the owner holds, the handed
/// one included. The announcement heard meanwhile must not be taken on its nonce afterwards:
/// the lease it names is gone, and the waiter must hold only what the row says.
#[actix_rt::test]
async fn a_handover_released_by_the_orphan_check_is_not_taken_on_its_nonce() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let config = setup.builder("admin").build().unwrap();
    let table = LeaseTable::new(&config);
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let (holder, waiter) = (
        setup.manager("holder"),
        waiter_behind(&setup, &proxy, Duration::from_secs(2)),
    );
    let (held, waits) = contend(&holder, &waiter, None).await;
    // Its idle pooled connection black-holed, the waiter is woken (as by a release) and asks
    // again on it: the attempt hangs until the statement timeout.
    proxy.cut();
    admin
        .execute("SELECT pg_notify($1, '3:job')", &[&table.channel()])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the holder's release hands the lease to the waiter's place.
    held.release().await.unwrap();
    let (owner, handed, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!(owner, "waiter");
    let lease = waits.await.unwrap().unwrap().unwrap();
    // Whatever it holds, the row must say so.
    let (owner, token, _) = row(&setup, &admin, "job")
        .await
        .expect("the waiter holds a lease the table does not have");
    assert_eq!((owner.as_str(), token), ("waiter", lease.token()));
    assert_ne!(
        token, handed,
        "the handed lease was released by the orphan check"
    );
    lease.release().await.unwrap();
}

/// The nonce is as secret as the waiters' table: a role that can read it (a read-only
/// monitoring role, say) can forge a handover the waiter takes on its word. Owner checks bound
/// the damage: the waiter holds a token that is not its own, so its first renewal reports the
/// lease lost, and its fencing guard and release touch nothing of the holder's, which keeps
/// its lease throughout.
#[actix_rt::test]
async fn a_handover_forged_with_a_leaked_nonce_is_lost_at_the_first_renewal_and_harms_no_holder() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_millis(500)).await;
    let config = setup.builder("admin").build().unwrap();
    let forger = Forger::new(&setup, &admin).await;
    let (holder, waiter) = (setup.manager("holder"), setup.manager("waiter"));
    let (held, waits) = contend(&holder, &waiter, None).await;
    let nonce: i64 = admin
        .query_one(
            &format!(
                "SELECT nonce FROM {} WHERE name = 'job' AND waiter = 'waiter'",
                config.lock_queue().quoted()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    forger
        .announce(&admin, held.token(), &format!("#{nonce}"), "waiter")
        .await;
    let forged = waits.await.unwrap().unwrap().unwrap();
    assert_eq!(forged.token(), held.token(), "taken on the leaked nonce");
    let mut client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let err = forged.fence(&tx).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::LockLost);
    tx.rollback().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), forged.lost())
        .await
        .expect("reported lost at its first renewal");
    assert_eq!(reason, LossReason::TakenOver);
    let _ = forged.release().await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // the holder renewed meanwhile
    assert_eq!(held.loss(), None, "the holder lost its lease");
    let (owner, token, left) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("holder", held.token()));
    assert!(left > 18.0, "the holder renews it: {left} s left");
    held.release().await.unwrap();
}

/// A handover's announcement can arrive after its lease was taken from the table (an attempt
/// found it ours) and after its holder began releasing it. The process must not give it "back"
/// too: two releases would race, and the loser — maybe the holder's own — would report a lease
/// it released as lost. Here the holder's release waits on a fencing guard's row lock while the
/// announcement (its own grant's, as a late one would be) arrives: only one release statement
/// may be waiting on the row.
#[actix_rt::test]
async fn a_late_announcement_of_a_lease_being_released_starts_no_second_release() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let forger = Forger::new(&setup, &admin).await;
    let holder = setup.manager("holder");
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let token = held.token();
    let config = setup.builder("admin").build().unwrap();
    let mut guard = pgcoord::db::connect_spawned(&config).await.unwrap();
    let tx = guard.transaction().await.unwrap();
    forger
        .table
        .fence(&tx, "job", "holder", token)
        .await
        .unwrap();
    let releasing = actix_rt::spawn(held.release());
    // Release statements of this test's table waiting on a row lock.
    let waiting_releases = || async {
        let sql = "SELECT count(*) FROM pg_stat_activity
                   WHERE wait_event_type = 'Lock' AND query LIKE '%releaser AS%'
                     AND strpos(query, $1) > 0";
        let table = setup.quoted_table();
        admin
            .query_one(sql, &[&table])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let until = Instant::now() + Duration::from_secs(5);
    while waiting_releases().await == 0 {
        assert!(
            Instant::now() < until,
            "the release never waited on the guard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    forger.announce(&admin, token, "", "holder").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiting_releases().await, 1, "a second release of the lease");
    tx.commit().await.unwrap();
    releasing.await.unwrap().unwrap();
    assert_eq!(row(&setup, &admin, "job").await, None);
}
