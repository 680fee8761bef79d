//! Restarts and cancellations under the workload: the server restarted while holder processes
//! contend (scenario 9), their operations checked for linearizability too, and acquires
//! cancelled at random points (scenario 11).

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::{Acquire, AdvisoryLock, Coordinator, LockLost, LossReason, SubscribeLockLost};

use super::Workload;

#[actix_rt::test]
async fn a_server_restart_under_contention_keeps_mutual_exclusion() {
    let workload = Workload::own_server().await;
    let server = workload.server.clone().unwrap();
    let mut holders: Vec<_> = (0..3)
        .map(|p| {
            workload.holder(
                &format!("p{p}"),
                "hot",
                &["--managers", "2", "--rounds", "150", "--hold-ms", "3"],
            )
        })
        .collect();
    // An in-test coordinator too: its advisory lock must be reported lost, its leases kept.
    let coordinator = Coordinator::start(workload.config(
        "watcher",
        Duration::from_secs(2),
        Duration::from_millis(400),
    ));
    let (losses, recipient) = super::collector::<LockLost>();
    coordinator
        .locks()
        .unwrap()
        .send(SubscribeLockLost(recipient.clone()))
        .await
        .unwrap();
    coordinator
        .advisory()
        .unwrap()
        .send(SubscribeLockLost(recipient))
        .await
        .unwrap();
    let kept = coordinator
        .locks()
        .unwrap()
        .send(Acquire::new("kept"))
        .await
        .unwrap()
        .unwrap();
    let advisory = coordinator
        .advisory()
        .unwrap()
        .send(AdvisoryLock::new(99))
        .await
        .unwrap()
        .unwrap();
    for holder in &mut holders {
        holder.expect("ACK", Duration::from_secs(20)).await;
    }

    // Fast shutdown (sessions terminated, a checkpoint written) and start again, twice.
    for _ in 0..2 {
        let s = server.clone();
        let started = Instant::now();
        tokio::task::spawn_blocking(move || s.restart())
            .await
            .unwrap()
            .unwrap();
        eprintln!("restarted in {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(700)).await;
    }

    let (mut acks, mut operations) = (Vec::new(), Vec::new());
    for holder in &mut holders {
        let done = holder.expect("DONE", Duration::from_secs(120)).await;
        let sections: usize = done[5..].parse().unwrap();
        // Sections in flight at a restart may fail; the others all ran.
        assert!(sections >= 250, "{done}: {:?}", holder.drain());
        acks.extend(holder.acks());
        holder.finish(Duration::from_secs(10)).await;
        operations.extend(holder.operations());
    }
    let verdict = workload.verdict(&acks).await;
    eprintln!("{verdict}");
    assert!(verdict.is_safe(), "{verdict}");
    super::assert_linearizable("restarts", &operations);
    super::assert_losses_told_once("restarts", &mut holders, 6);
    assert_eq!(verdict.sections as usize, acks.len());
    // Tokens kept increasing across the restarts: no regression, and the last tenure's token is
    // the largest ever issued.
    assert_eq!(kept.loss(), None, "a lease outlasting the restart is kept");
    let advisory_losses: Vec<LossReason> = losses
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.token.is_none())
        .map(|l| l.reason)
        .collect();
    assert_eq!(
        advisory_losses,
        [LossReason::ConnectionLost],
        "the server released it"
    );
    assert_eq!(
        advisory.loss(),
        Some(LossReason::ConnectionLost),
        "and its guard knows"
    );
}

#[actix_rt::test]
async fn acquires_cancelled_at_random_points_leave_nothing_behind() {
    let workload = Workload::shared_server().await;
    let managers: Vec<_> = (0..4)
        .map(|i| {
            pgcoord_actors::LockManager::new(workload.config(
                &format!("m{i}"),
                Duration::from_secs(5),
                Duration::from_secs(1),
            ))
            .start()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut round = 0u64;
    let mut granted = 0;
    while Instant::now() < deadline {
        round += 1;
        let manager = &managers[(round % 4) as usize];
        let name = format!("k{}", round % 3);
        // Given up after 0–3 ms: before, during or after the statements.
        let give_up = Duration::from_micros((round * 7919) % 3000);
        match tokio::time::timeout(give_up, manager.send(Acquire::new(&name))).await {
            Ok(Ok(Ok(lease))) => {
                granted += 1;
                lease.release().await.unwrap();
            }
            Ok(Ok(Err(e))) => assert!(
                e.is_not_acquired() || e.kind() == pgcoord::ErrorKind::AlreadyHeld,
                "{e}"
            ),
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => {}
        }
    }
    // Whatever was cancelled released itself: no lease is held, and nobody is left in line,
    // in a moment.
    let sql = format!(
        "SELECT (SELECT count(*) FROM \"{0}\" WHERE owner IS NOT NULL)
              + (SELECT count(*) FROM \"{0}_wq\" WHERE until > now())",
        workload.table
    );
    let settle = Instant::now() + Duration::from_secs(5);
    loop {
        let left: i64 = workload.admin.query_one(&sql, &[]).await.unwrap().get(0);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < settle,
            "{left} leases held or waiters in line after {round} rounds"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{round} attempts, {granted} granted, nothing left behind");
    assert!(granted > 0);
}
