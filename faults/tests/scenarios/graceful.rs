//! A graceful stop (scenario 24): a process holding a lease gets SIGTERM and stops through
//! `Coordinator::shutdown`; its lease is free at once, long before it would have expired.

use std::time::{Duration, Instant};

use pgcoord_actors::{Acquire, Call, LockManager};
use pgcoord_faults::process::HolderProcess;
use pgcoord_testkit::unique_name;

#[actix_rt::test]
async fn a_process_stopped_with_sigterm_leaves_its_lease_free_at_once() {
    use actix::Actor;
    let workload = super::Workload::shared_server().await;
    let name = unique_name("graceful");
    let args: Vec<String> = [
        "--dsn",
        &workload.dsn,
        "--lock-table",
        &workload.table,
        "--name",
        &name,
        "--owner",
        "graceful",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut process = HolderProcess::spawn(env!("CARGO_BIN_EXE_graceful"), &args);
    process.expect("HELD", Duration::from_secs(30)).await;
    let contender = LockManager::new(workload.config(
        "contender",
        Duration::from_secs(60),
        Duration::from_secs(10),
    ))
    .start();
    let refused = contender
        .call(Acquire::new(&name).fail_if_locked())
        .await
        .unwrap_err();
    assert!(refused.is_not_acquired(), "{refused}");
    process.terminate();
    let stopped = process.expect("STOPPED", Duration::from_secs(10)).await;
    assert_eq!(stopped, "STOPPED 1");
    // The lease lasts 60 s: only the release explains getting it now.
    let at = Instant::now();
    let _taken = contender
        .call(Acquire::new(&name).fail_if_locked())
        .await
        .unwrap();
    eprintln!("taken {:?} after the holder's shutdown", at.elapsed());
}
