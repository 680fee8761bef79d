//! The whole run against a mutant: the fencing guard's SQL function replaced, in this workload's
//! database only, by one that checks the token but takes no row lock. A holder whose lease runs
//! out inside its fenced transaction (its heartbeat off, as a paused process's stops) is then
//! taken over while that transaction is open, and its write commits beside the new holder's:
//! the checker must say so. The same run on the real function is safe: the takeover waits.

use std::time::Duration;

use actix::prelude::*;
use pgcoord_actors::{Acquire, LockManager};

use pgcoord_faults::history::Verdict;

use super::Workload;

const LEASE: Duration = Duration::from_millis(1000);

/// The fence of migrations/0012_functions.sql without its `FOR KEY SHARE`.
const MUTANT: &str = "CREATE OR REPLACE FUNCTION {f}(lease_name text, lease_token bigint, lease_owner text DEFAULT NULL)
    RETURNS void LANGUAGE plpgsql AS $fn$
    BEGIN
        PERFORM 1 FROM {t} AS l
        WHERE l.name = lease_name AND l.token = lease_token AND l.expires_at > clock_timestamp()
          AND (lease_owner IS NULL OR l.owner = lease_owner);
        IF NOT FOUND THEN
            RAISE EXCEPTION 'lease % is no longer held with token %', lease_name, lease_token
                USING ERRCODE = 'PC001';
        END IF;
    END
    $fn$";

/// An old holder's section that outlives its lease (held 4 leases, no heartbeat), and a
/// contender that asks for the lease after it ran out: the checker's verdict on both sections,
/// and whether the contender took the lease over.
async fn a_section_outliving_its_lease(workload: &Workload) -> (Verdict, bool) {
    let old = LockManager::new(workload.config("old", LEASE, Duration::ZERO)).start();
    let lease = old.send(Acquire::new("job")).await.unwrap().unwrap();
    let (history, mut client) = (workload.history.clone(), workload.client().await);
    let section =
        actix_rt::spawn(
            async move { history.section(&mut client, &lease, "old", LEASE * 4).await },
        );
    // The lease has run out on the server's clock; the section is open for 2.5 leases more.
    tokio::time::sleep(LEASE + LEASE / 2).await;
    let contender = LockManager::new(workload.config("contender", LEASE, LEASE / 5)).start();
    let taken = (contender.send(Acquire::new("job").timeout(LEASE)))
        .await
        .unwrap();
    let took_over = taken.is_ok();
    let mut acks = Vec::new();
    if let Ok(lease) = taken {
        let mut client = workload.client().await;
        let section = workload
            .history
            .section(&mut client, &lease, "contender", Duration::ZERO);
        acks.push(section.await.unwrap());
    }
    acks.push(section.await.unwrap().unwrap());
    (workload.verdict(&acks).await, took_over)
}

#[actix_rt::test]
async fn a_fence_without_its_row_lock_is_caught_by_the_checker() {
    // The real function: the takeover waits for the open section, which alone writes.
    let real = Workload::shared_server().await;
    let (verdict, took_over) = a_section_outliving_its_lease(&real).await;
    assert!(!took_over, "the fenced section held the takeover off");
    assert!(verdict.is_safe(), "{verdict}");
    assert_eq!(verdict.sections, 1, "{verdict}");

    // The mutant: taken over inside the open section, both write, and the checker says so.
    let mutant = Workload::shared_server().await;
    let sql = MUTANT
        .replace("{f}", &format!("\"{}_fence\"", mutant.table))
        .replace("{t}", &format!("\"{}\"", mutant.table));
    mutant.admin.batch_execute(&sql).await.unwrap();
    let (verdict, took_over) = a_section_outliving_its_lease(&mutant).await;
    assert!(took_over, "the mutant let the lease be taken over");
    assert!(verdict.overlaps > 0 && !verdict.is_safe(), "{verdict}");
}
