//! What the server spends on one acquire+release by the size of the batch statements that carry
//! it: the batch forms of k names against the single statements, back to back on one warm
//! connection, in the server backend's own CPU time (`/proc/<pid>/stat`). Skipped when the
//! server's processes are not on this machine.

use std::time::Duration;

use pgcoord::__private::CachingClient;
use pgcoord::Statements;
use pgcoord::lease::{AcquireRequest, ReleaseRequest};
use pgcoord::{Config, LeaseTable};

use crate::cpu::process_cpu;
use crate::leases::{Res, floor_clients, raw_pair};
use crate::report::Report;

/// Pairs per measurement: enough for a few hundred of the kernel's CPU ticks (10 ms on most).
const PAIRS: usize = 4_000;

pub(crate) async fn run(cfg: &Config, report: &mut Report) -> Res {
    let table = LeaseTable::new(cfg);
    let client = floor_clients(cfg, 1).await?.remove(0);
    let pid: i32 = client.run("SELECT pg_backend_pid()", &[]).await?[0].try_get(0)?;
    let local = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmd| cmd.windows(8).any(|w| w == b"postgres"));
    if !local || process_cpu(pid).is_none() {
        return Ok(());
    }
    let lease = cfg.lease();
    let single = server_cpu_per_pair(pid, async {
        for i in 0..PAIRS {
            raw_pair(&table, &client, &format!("single-{i}"), lease).await?;
        }
        Ok(())
    })
    .await?;
    for k in [1, 2, 4, 8, pgcoord::lease::MAX_NAMES_PER_STATEMENT] {
        let batched = server_cpu_per_pair(pid, batches(&table, &client, k, lease)).await?;
        report.time(
            &format!(
                "server CPU per acquire+release, in batch statements of {k} (floor: the single statements)"
            ),
            batched,
            single,
        );
    }
    Ok(())
}

/// [`PAIRS`] acquires and releases in batch statements of `k` names.
async fn batches(table: &LeaseTable, client: &CachingClient, k: usize, lease: Duration) -> Res {
    for round in 0..PAIRS / k {
        let names: Vec<String> = (0..k).map(|i| format!("batch{k}-{round}-{i}")).collect();
        let requests: Vec<AcquireRequest> =
            names.iter().map(|name| AcquireRequest::new(name)).collect();
        let grants = table
            .owner("raw")?
            .try_acquire_many(client, &requests, lease)
            .await?;
        assert_eq!(grants.len(), k, "free names");
        let releases: Vec<ReleaseRequest> = names
            .iter()
            .map(|name| ReleaseRequest {
                name,
                token: grants[name].token,
                keep: false,
                announce_always: false,
            })
            .collect();
        table.owner("raw")?.release_many(client, &releases).await?;
    }
    Ok(())
}

/// The server backend's CPU time per pair while `work` runs [`PAIRS`] pairs.
async fn server_cpu_per_pair(pid: i32, work: impl Future<Output = Res>) -> Res<Duration> {
    let before = process_cpu(pid).ok_or("backend gone")?;
    work.await?;
    let used = process_cpu(pid).ok_or("backend gone")? - before;
    Ok(used / PAIRS as u32)
}
