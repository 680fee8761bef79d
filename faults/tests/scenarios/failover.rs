//! Primary failover (scenarios 16, 17 and 23): the primary is killed and its streaming standby
//! promoted while holders work; clients reach the new primary by themselves through a multi-host
//! connection string with `target_session_attrs=read-write`.
//!
//! With synchronous replication every acknowledged grant, renewal and fenced write is on the
//! standby before it is acknowledged, so mutual exclusion and the token order hold across the
//! failover, and the holders' operations are linearizable. With asynchronous replication they do not: the test shows an acknowledged grant and
//! fenced write missing after the failover and the lease granted again to someone else while its
//! holder still believed it held it. What pgcoord does about it: tokens carry the server's
//! timeline, so the promoted standby's tokens are greater than every earlier one even when its
//! copy of the sequence fell behind (before this, both holders had token 1 and the old holder's
//! renewals and fenced writes matched the new holder's row); the old holder's fence is rejected
//! at once and its next renewal reports the loss. Lost acknowledged writes cannot be helped:
//! pgcoord requires synchronous replication for its guarantees to survive a failover (OPERATIONS,
//! docs/RELIABILITY.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::{Acquire, LockManager};
use pgcoord_testkit::{Replication, TempPostgres};

use pgcoord_faults::topic_history::{Outcome, check};

use super::Workload;
use super::topic_consumers::{Consumers, Mode, appender};

/// A primary and its standby, and a workload whose DSN names both (read-write wins).
async fn pair(replication: Replication) -> (Arc<TempPostgres>, Arc<TempPostgres>, Workload) {
    pair_with(replication, &[]).await
}

/// [`pair`] with the primary (and so the standby) started with `settings` too.
pub async fn pair_with(
    replication: Replication,
    settings: &'static [(&'static str, &'static str)],
) -> (Arc<TempPostgres>, Arc<TempPostgres>, Workload) {
    let primary = Arc::new(
        tokio::task::spawn_blocking(move || TempPostgres::start_primary_with(settings))
            .await
            .unwrap()
            .unwrap(),
    );
    let p = primary.clone();
    let standby = Arc::new(
        tokio::task::spawn_blocking(move || p.start_standby(replication))
            .await
            .unwrap()
            .unwrap(),
    );
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write connect_timeout=2",
        primary.port(),
        standby.port()
    );
    let workload = Workload::on(None, dsn).await;
    // The workload's tables are on the standby before a test stops it or fails over to it (an
    // asynchronous standby may not have received them yet: CI saw the history table missing).
    let (p, s) = (primary.clone(), standby.clone());
    tokio::task::spawn_blocking(move || p.wait_replayed(&s))
        .await
        .unwrap()
        .unwrap();
    (primary, standby, workload)
}

/// Kills the primary (immediate shutdown, as a crash) and promotes the standby.
pub async fn fail_over(primary: &Arc<TempPostgres>, standby: &Arc<TempPostgres>) -> Instant {
    let (p, s) = (primary.clone(), standby.clone());
    tokio::task::spawn_blocking(move || {
        p.stop_immediate()?;
        s.promote()
    })
    .await
    .unwrap()
    .unwrap();
    Instant::now()
}

#[actix_rt::test]
async fn a_failover_to_a_synchronous_standby_keeps_mutual_exclusion_and_every_write() {
    let (primary, standby, workload) = pair(Replication::Synchronous).await;
    let mut holders: Vec<_> = (0..3)
        .map(|p| {
            workload.holder(
                &format!("p{p}"),
                "hot",
                &["--managers", "2", "--rounds", "120", "--hold-ms", "2"],
            )
        })
        .collect();
    for holder in &mut holders {
        holder.expect("ACK", Duration::from_secs(20)).await;
    }
    let acked_before: usize = holders.iter_mut().map(|h| h.acks().len()).sum();
    let failed_over = fail_over(&primary, &standby).await;
    eprintln!("failed over after {acked_before} acknowledged sections");

    let (mut acks, mut operations) = (Vec::new(), Vec::new());
    for holder in &mut holders {
        let done = holder.expect("DONE", Duration::from_secs(180)).await;
        eprintln!("{done}");
        acks.extend(holder.acks());
        holder.finish(Duration::from_secs(10)).await;
        operations.extend(holder.operations());
    }
    assert!(
        acks.len() > acked_before,
        "sections ran after the failover too"
    );
    // Read on the promoted standby: every acknowledged write is there, and mutual exclusion and
    // the token order held across the failover.
    let verdict = workload.verdict(&acks).await;
    eprintln!("{verdict}; {:?} after the failover", failed_over.elapsed());
    assert!(verdict.is_safe(), "{verdict}");
    // The operations too, their grants, writes and reads on either side of the failover.
    super::assert_linearizable("failover", &operations);
    super::assert_losses_told_once("failover", &mut holders, 6);
    let client = workload.client().await;
    let in_recovery: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!in_recovery, "the verdict was read on the promoted standby");
}

#[actix_rt::test]
async fn a_failover_to_an_asynchronous_standby_can_lose_an_acknowledged_grant_yet_tokens_increase()
{
    let (primary, standby, workload) = pair(Replication::Asynchronous).await;
    let config =
        |owner: &str| workload.config(owner, Duration::from_secs(5), Duration::from_millis(500));
    // The standby falls behind (here: it stops; in production: replication lag).
    let s = standby.clone();
    tokio::task::spawn_blocking(move || s.stop())
        .await
        .unwrap()
        .unwrap();
    let holder = LockManager::new(config("holder")).start();
    let lease = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let mut client = pgcoord::db::connect_spawned(&config("w")).await.unwrap();
    let ack = workload
        .history
        .section(&mut client, &lease, "holder", Duration::ZERO)
        .await
        .unwrap();

    // The primary dies; the standby, which never received the grant, is promoted.
    primary.stop_immediate().unwrap();
    let s = standby.clone();
    tokio::task::spawn_blocking(move || {
        s.start_again()?;
        s.promote()
    })
    .await
    .unwrap()
    .unwrap();

    // Someone else gets the lease while its holder still believes it holds it...
    let contender = LockManager::new(config("contender")).start();
    let taken = contender
        .send(Acquire::new("job").timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    let believed_held = lease.loss().is_none();
    eprintln!(
        "after the failover: holder token {} (believed held: {believed_held}), contender token {}",
        lease.token(),
        taken.token()
    );
    // The promoted standby's copy of the sequence may be behind (here it handed out token 1
    // again), but its tokens carry its new timeline: still greater than every earlier one.
    assert!(taken.token() > lease.token());
    assert!(taken.token() >= 1 << 40, "timeline 2: {}", taken.token());
    // So the old holder's fenced writes are rejected at once...
    let err = workload
        .history
        .section(
            &mut workload.client().await,
            &lease,
            "holder",
            Duration::ZERO,
        )
        .await
        .unwrap_err();
    assert!(err.is_lock_lost(), "{err}");
    // ...its next renewal reports the loss — or, when the failover outlasted the holder's own
    // deadline (a slow promotion on a loaded machine), the deadline reported it first...
    let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("reported");
    assert!(
        matches!(
            reason,
            Some(
                pgcoord_actors::LossReason::TakenOver | pgcoord_actors::LossReason::DeadlinePassed
            )
        ),
        "{reason:?}"
    );
    // ...but the acknowledged grant and fenced write are gone: the checker says so. This is why
    // pgcoord requires synchronous replication.
    let verdict = workload.verdict(&[ack]).await;
    eprintln!("{verdict}; the holder reported {reason:?}");
    assert_eq!(verdict.missing, [ack]);
}

#[actix_rt::test]
async fn a_failover_to_a_synchronous_standby_loses_no_topic_event_and_applies_each_once() {
    let (primary, standby, workload) = pair(Replication::Synchronous).await;
    let consumers = Consumers::new(&workload, Mode::Fenced).await;
    let processes = vec![consumers.spawn("a").await, consumers.spawn("b").await];
    let appender = appender(consumers.config.clone(), 400, Duration::from_millis(10));
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumers.count(&workload.admin).await < 100 {
        assert!(Instant::now() < deadline, "no progress before the failover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed_over = fail_over(&primary, &standby).await;
    let appends = appender.await.unwrap();
    // Read on the promoted standby: every acknowledged append applied, once, in order.
    let client = workload.client().await;
    let applied = consumers
        .until_applied(&client, &appends, Duration::from_secs(120))
        .await;
    drop(processes);
    let verdict = check(&appends, &applied);
    let unknown = (appends.iter())
        .filter(|a| a.outcome == Outcome::Unknown)
        .count();
    eprintln!(
        "{} appends ({unknown} unknown): {verdict}; {:?} after the failover",
        appends.len(),
        failed_over.elapsed()
    );
    assert!(verdict.is_safe(), "{verdict}");
    let in_recovery: bool = (client.query_one("SELECT pg_is_in_recovery()", &[]).await)
        .unwrap()
        .get(0);
    assert!(!in_recovery, "the verdict was read on the promoted standby");
    assert!(appends.len() > 300, "appends went on after the failover");
}
