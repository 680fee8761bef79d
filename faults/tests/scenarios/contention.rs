//! Scenario 1, the contention baseline: 16 holders in 4 processes × 200 rounds on one lease,
//! random hold times — no overlap, no token regression, nothing acknowledged lost, everyone
//! served, and the operations' history linearizable.

use std::time::{Duration, Instant};

use super::Workload;

#[tokio::test]
async fn sixteen_holders_two_hundred_rounds_each_never_overlap() {
    let workload = Workload::shared_server().await;
    let started = Instant::now();
    let mut holders: Vec<_> = (0..4)
        .map(|p| {
            workload.holder(
                &format!("p{p}"),
                "hot",
                &["--managers", "4", "--rounds", "200", "--hold-ms", "2"],
            )
        })
        .collect();
    let (mut acks, mut operations) = (Vec::new(), Vec::new());
    for holder in &mut holders {
        let done = holder.expect("DONE", Duration::from_secs(240)).await;
        assert_eq!(
            done, "DONE 800",
            "every round of every manager ran a section"
        );
        acks.extend(holder.acks());
        holder.finish(Duration::from_secs(10)).await;
        operations.extend(holder.operations());
    }
    let verdict = workload.verdict(&acks).await;
    eprintln!("{verdict} in {:?}", started.elapsed());
    assert!(verdict.is_safe(), "{verdict}");
    super::assert_linearizable("contention", &operations);
    super::assert_losses_told_once("contention", &mut holders, 16);
    assert_eq!(verdict.sections, 3_200);
    assert_eq!(acks.len(), 3_200);
}
