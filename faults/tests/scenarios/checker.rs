//! The checker itself: it must see the violations it exists to find.

use pgcoord_faults::history::Ack;

use super::Workload;

#[tokio::test]
async fn the_checker_finds_overlaps_regressions_and_lost_writes() {
    let workload = Workload::shared_server().await;
    let table = format!("\"{}_history\"", workload.prefix);
    // Two sections that overlap in time, the second carrying an older token than the resource
    // had: what a lease without fencing lets a paused holder do.
    workload
        .admin
        .batch_execute(&format!(
            "INSERT INTO {table} (process, token, previous_token, write_no, entered, exited) VALUES
               ('a', 7, 0, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:02'),
               ('b', 5, 7, 2, '2026-01-01 00:00:01', '2026-01-01 00:00:03'),
               ('a', 8, 7, 3, '2026-01-01 00:00:04', '2026-01-01 00:00:05')"
        ))
        .await
        .unwrap();
    let acks = [
        Ack { token: 7, write: 1 },
        Ack { token: 8, write: 3 },
        Ack { token: 9, write: 4 },
    ];
    let verdict = workload.verdict(&acks).await;
    assert_eq!(verdict.sections, 3);
    assert_eq!(verdict.overlaps, 1, "{verdict}");
    assert_eq!(verdict.regressions, 1, "{verdict}");
    assert_eq!(verdict.missing, [Ack { token: 9, write: 4 }]);
    assert!(!verdict.is_safe());
}
