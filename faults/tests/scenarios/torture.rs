//! The torture run: the fenced lock-set workload across several holder processes while faults
//! are injected at random — holder processes paused past their lease, their sessions
//! terminated, the server restarted — then the checker's verdict and the counts.
//!
//! CI runs the short version (about 2,000 critical sections). The full run:
//! `TORTURE_SECTIONS=100000 cargo test --release -p pgcoord-faults --test scenarios torture_full -- --ignored --nocapture`
//! (docs/RELIABILITY.md records its figures).

use std::time::{Duration, Instant};

use pgcoord_faults::process::HolderProcess;

use super::Workload;

const PROCESSES: usize = 4;
const MANAGERS: usize = 2;

/// A deterministic pseudo-random sequence (xorshift), seeded per run and printed, so a run can
/// be told apart and its fault schedule reasoned about.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}

#[derive(Debug, Default)]
struct Counts {
    paused: u32,
    terminated: u32,
    restarts: u32,
}

async fn torture(sections: usize) {
    let workload = Workload::own_server().await;
    let server = workload.server.clone().unwrap();
    let rounds = (sections / (PROCESSES * MANAGERS)).max(1);
    let started = Instant::now();
    let mut holders: Vec<HolderProcess> = (0..PROCESSES)
        .map(|p| {
            workload.holder(
                &format!("p{p}"),
                "hot",
                &[
                    "--managers",
                    &MANAGERS.to_string(),
                    "--rounds",
                    &rounds.to_string(),
                    "--hold-ms",
                    "1",
                    "--lease-ms",
                    "1000",
                    "--heartbeat-ms",
                    "200",
                ],
            )
        })
        .collect();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("torture: {sections} sections, seed {seed}");
    let mut dice = Dice(seed);
    let mut counts = Counts::default();
    let done = |holders: &mut Vec<HolderProcess>| {
        holders
            .iter_mut()
            .all(|h| h.drain().iter().any(|l| l.starts_with("DONE")))
    };
    while !done(&mut holders) {
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "torture took too long"
        );
        tokio::time::sleep(Duration::from_millis(300 + dice.roll(1200))).await;
        match dice.roll(10) {
            // The process holding the lease now, stopped for one to two leases: its lease is
            // taken over while it believes it holds it, and its fence must keep it out.
            0..=4 => {
                let sql = format!(
                    "SELECT owner FROM \"{}\" WHERE name = 'hot'",
                    workload.table
                );
                let owner: Option<String> = workload
                    .client()
                    .await
                    .query_opt(&sql, &[])
                    .await
                    .unwrap()
                    .and_then(|row| row.get(0));
                let process = owner
                    .and_then(|o| {
                        o.strip_prefix('p')?
                            .split('-')
                            .next()?
                            .parse::<usize>()
                            .ok()
                    })
                    .unwrap_or(dice.roll(PROCESSES as u64) as usize);
                let holder = &holders[process];
                holder.pause();
                tokio::time::sleep(Duration::from_millis(1000 + dice.roll(1000))).await;
                holder.resume();
                counts.paused += 1;
            }
            // Every session of one holder process terminated by the server.
            5..=8 => {
                let pattern = format!("holder p{}-%", dice.roll(PROCESSES as u64));
                workload
                    .client()
                    .await
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE application_name LIKE $1",
                        &[&pattern],
                    )
                    .await
                    .unwrap();
                counts.terminated += 1;
            }
            // The server restarted (fast shutdown: committed work is kept).
            _ => {
                let s = server.clone();
                tokio::task::spawn_blocking(move || s.restart())
                    .await
                    .unwrap()
                    .unwrap();
                counts.restarts += 1;
            }
        }
    }
    let mut acks = Vec::new();
    let (mut rejected, mut errors) = (0, 0);
    for holder in &mut holders {
        let said = holder.finish(Duration::from_secs(10)).await;
        rejected += said.iter().filter(|l| l.starts_with("REJECTED")).count();
        errors += said.iter().filter(|l| l.starts_with("ERROR")).count();
        acks.extend(holder.acks());
    }
    let verdict = workload.verdict(&acks).await;
    eprintln!(
        "torture: {verdict}; faults: {counts:?}; {rejected} sections rejected by the fence, {errors} failed on the connection; {:?}",
        started.elapsed()
    );
    assert!(verdict.is_safe(), "{verdict}");
    assert_eq!(verdict.sections as usize, acks.len());
    assert!(
        acks.len() * 10 >= sections * 8,
        "most sections ran: {}",
        acks.len()
    );
}

#[actix_rt::test]
async fn torture_short() {
    torture(2_000).await;
}

#[actix_rt::test]
#[ignore = "the full torture run takes minutes; see docs/RELIABILITY.md"]
async fn torture_full() {
    let sections = std::env::var("TORTURE_SECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    torture(sections).await;
}
