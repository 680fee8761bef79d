//! Pauses: a holder process stopped past its lease (scenario 2), its operations and the
//! contender's checked for linearizability too, and the whole server paused longer than the
//! lease (scenario 8).

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::{Acquire, LockLost, LockManager, LossReason, SubscribeLockLost};
use pgcoord_faults::linear::{Op, Recorder, Ret};

use super::Workload;

const LEASE: Duration = Duration::from_millis(1000);
const HEARTBEAT: Duration = Duration::from_millis(200);

#[actix_rt::test]
async fn a_paused_holder_process_is_fenced_out_and_takes_nothing_back() {
    let workload = Workload::shared_server().await;
    let mut old = workload.holder(
        "old",
        "job",
        &[
            "--hold",
            "--lease-ms",
            "1000",
            "--heartbeat-ms",
            "200",
            "--write-every-ms",
            "50",
        ],
    );
    let held: i64 = old.expect("HELD", Duration::from_secs(10)).await[5..]
        .parse()
        .unwrap();
    old.expect("ACK", Duration::from_secs(5)).await;

    // The process stops where it is: no heartbeat, no write, its connections open.
    old.pause();
    let paused = Instant::now();
    let contender = LockManager::new(workload.config("contender", LEASE, HEARTBEAT)).start();
    // The contender's operations are recorded as the holder process records its own.
    let mut record = Recorder::keeping("contender");
    record.invoke(Op::Acquire);
    let lease = contender
        .send(Acquire::new("job").timeout(LEASE * 5))
        .await
        .unwrap()
        .unwrap();
    record.complete(Some(Ret::Granted(lease.token())));
    let took_over = paused.elapsed();
    assert!(lease.token() > held);
    assert!(
        took_over < LEASE + Duration::from_millis(600),
        "{took_over:?}"
    );
    let mut client = pgcoord::db::connect_spawned(&workload.config("w", LEASE, HEARTBEAT))
        .await
        .unwrap();
    let (token, value) = (lease.token(), lease.token() * 1_000_000);
    record.invoke(Op::Write { token, value });
    let mine = workload
        .history
        .section_setting(
            &mut client,
            &lease,
            "contender",
            Some(value),
            Duration::ZERO,
        )
        .await
        .unwrap();
    record.complete(Some(Ret::Written));

    // Resumed past its lease: its next fenced write is rejected and it reports the loss.
    tokio::time::sleep(LEASE).await;
    old.resume();
    let lost = old.expect("LOST", Duration::from_secs(5)).await;
    assert!(lost.starts_with(&format!("LOST {held} ")), "{lost}");
    let said = old.finish(Duration::from_secs(5)).await;
    let rejected_or_lost_first = said
        .iter()
        .skip_while(|l| !l.starts_with("ACK"))
        .filter(|l| l.starts_with("ACK"))
        .all(|l| l.starts_with(&format!("ACK {held} ")));
    assert!(rejected_or_lost_first, "{said:?}");

    // Its late heartbeat took nothing back: the contender still holds the lease.
    tokio::time::sleep(HEARTBEAT * 3).await;
    assert_eq!(lease.loss(), None);
    let table = pgcoord::LeaseTable::new(&workload.config("w", LEASE, HEARTBEAT));
    let info = table.get(&client, "job").await.unwrap();
    assert_eq!(info.token, Some(lease.token()));

    // The register after the old holder's rejected write: still the contender's value.
    record.invoke(Op::Read);
    let read = workload.history.read(&client).await.unwrap();
    record.complete(Some(Ret::Value(read)));

    let mut acks = old.acks();
    acks.push(mine);
    let verdict = workload.verdict(&acks).await;
    assert!(verdict.is_safe(), "{verdict}");
    assert_eq!(verdict.tenures, 2);
    let mut operations = old.operations();
    operations.extend(pgcoord_faults::linear::events(record.lines()));
    super::assert_linearizable("a paused holder", &operations);
}

/// Collects loss reports with the time they arrived.
struct Losses(std::sync::Arc<std::sync::Mutex<Vec<(Instant, LockLost)>>>);
impl Actor for Losses {
    type Context = Context<Self>;
}
impl Handler<LockLost> for Losses {
    type Result = ();
    fn handle(&mut self, lost: LockLost, _: &mut Context<Self>) {
        self.0.lock().unwrap().push((Instant::now(), lost));
    }
}

#[actix_rt::test]
async fn a_server_paused_past_the_lease_loses_holders_on_their_own_clock() {
    let workload = Workload::own_server().await;
    let server = workload.server.clone().unwrap();
    let holder = LockManager::new(workload.config("holder", LEASE, HEARTBEAT)).start();
    let losses = std::sync::Arc::default();
    let recipient = Losses(std::sync::Arc::clone(&losses)).start().recipient();
    holder.send(SubscribeLockLost(recipient)).await.unwrap();
    let lease = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let contender = LockManager::new(workload.config("contender", LEASE, HEARTBEAT)).start();
    let waiting = tokio::spawn(contender.send(Acquire::new("job").timeout(LEASE * 10)));
    tokio::time::sleep(HEARTBEAT).await;

    let paused_for = LEASE * 2;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.pause())
        .await
        .unwrap()
        .unwrap();
    let paused = Instant::now();
    tokio::time::sleep(paused_for).await;
    let resumed = Instant::now();
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.resume())
        .await
        .unwrap()
        .unwrap();

    let reported = losses.lock().unwrap().clone();
    assert_eq!(
        reported.len(),
        1,
        "lost on its own clock, before the resume"
    );
    let (at, lost) = &reported[0];
    assert_eq!(lost.reason, LossReason::DeadlinePassed);
    assert!(
        *at < resumed && *at - paused < LEASE,
        "{:?} after the pause",
        *at - paused
    );
    assert_eq!(lease.loss(), Some(LossReason::DeadlinePassed));

    let taken = waiting.await.unwrap().unwrap().unwrap();
    let after_resume = resumed.elapsed();
    assert!(taken.token() > lease.token());
    // The contender polls every quarter lease; the statement itself waits for the server.
    assert!(
        after_resume < LEASE,
        "taken over {after_resume:?} after the resume"
    );
    eprintln!("taken over {after_resume:?} after the resume");
}
