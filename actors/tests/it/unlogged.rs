//! The unlogged lock table: a crash empties it, holders hear of it at their next renewal, and
//! tokens still only increase.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;
use pgcoord_testkit::TempPostgres;

use super::Collector;
use super::own_cluster::{on_server, own_cluster};

#[actix_rt::test]
async fn a_crash_empties_the_unlogged_table_and_holders_hear_it_at_the_next_renewal() {
    let (server, setup, admin) = own_cluster().await;
    // own_cluster migrated a logged table; this test's table is unlogged.
    let unlogged = setup
        .builder("admin")
        .unlogged_lock_table(true)
        .build()
        .unwrap();
    pgcoord::schema::drop_tables(&admin, &unlogged)
        .await
        .unwrap();
    pgcoord::schema::migrate(&admin, &unlogged).await.unwrap();
    assert!(
        pgcoord::schema::lock_table_is_unlogged(&admin, &unlogged)
            .await
            .unwrap()
    );

    let holder = LockManager::new(setup.builder("holder").build().unwrap()).start();
    let lost = Collector::subscribe(&holder).await;
    let lease = holder.call(Acquire::new("leader")).await.unwrap();
    let before = lease.token();

    on_server(&server, TempPostgres::restart_immediate).await;
    let restarted = Instant::now();
    // The next renewal finds the row gone: TakenOver, well before the lease's deadline.
    let reason = tokio::time::timeout(setup.lease, lease.lost())
        .await
        .expect("the holder hears of the loss before its deadline");
    assert_eq!(reason, Some(LossReason::TakenOver));
    assert!(
        restarted.elapsed() < setup.lease,
        "{:?}",
        restarted.elapsed()
    );
    let reported = lost.wait_for(1, Duration::from_secs(1)).await;
    assert_eq!(reported[0].token, Some(before));

    // Granted again (to anyone) with a larger token: the sequence survived the crash.
    let other = LockManager::new(setup.builder("other").build().unwrap()).start();
    let again = other.call(Acquire::new("leader")).await.unwrap();
    assert!(again.token() > before, "{} > {before}", again.token());
}
