//! Fault injection for the throwaway cluster: signalling its processes, finding and ending
//! backends.

use std::fs;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// How long a stopped process may take to show as stopped in `/proc`.
const STOP_SETTLE: Duration = Duration::from_secs(2);

/// The process ids of the backends whose `application_name` is `application_name`, from
/// `pg_stat_activity`, except the session of `client` itself.
///
/// The ids are those of the server's host: with the throwaway cluster they can be given to
/// [`TempPostgres::freeze_backend`](super::TempPostgres::freeze_backend).
pub async fn backend_pids(
    client: &tokio_postgres::Client,
    application_name: &str,
) -> Result<Vec<u32>> {
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid() ORDER BY pid",
            &[&application_name],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|row| u32::try_from(row.get::<_, i32>(0)).ok())
        .collect())
}

/// Ends the backends whose `application_name` is `application_name` with
/// `pg_terminate_backend`, except the session of `client` itself, and returns how many were
/// signalled. It does not wait for them to exit: their clients see the connection end shortly
/// after. Needs a superuser or a member of `pg_signal_backend`.
pub async fn terminate_backends(
    client: &tokio_postgres::Client,
    application_name: &str,
) -> Result<usize> {
    let rows = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&application_name],
        )
        .await?;
    Ok(rows.iter().filter(|row| row.get::<_, bool>(0)).count())
}

/// Sends `signal` to `pid`.
pub(super) fn signal(pid: u32, signal: libc::c_int) -> Result<()> {
    let Ok(target) = libc::pid_t::try_from(pid) else {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            format!("{pid} is not a process id"),
        ));
    };
    if target <= 0 {
        // 0 and negative ids would signal process groups.
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            format!("{pid} is not a process id"),
        ));
    }
    // SAFETY: kill has no memory-safety preconditions; the id names one process.
    if unsafe { libc::kill(target, signal) } == 0 {
        Ok(())
    } else {
        let e = std::io::Error::last_os_error();
        Err(Error::new(
            ErrorKind::Other,
            format!("cannot signal process {pid}: {e}"),
        )
        .with_source(e))
    }
}

/// The parent process id and the state letter of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last
    // closing parenthesis.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Whether `pid` is a child of `parent`.
pub(super) fn is_child_of(pid: u32, parent: u32) -> bool {
    stat(pid).is_some_and(|(ppid, _)| ppid == parent)
}

/// The processes whose parent is `parent`.
pub(super) fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| is_child_of(pid, parent))
        .collect()
}

/// Sends `signal` to `pid` and, best effort, to its children.
pub(super) fn signal_with_children(pid: u32, sig: libc::c_int) -> Result<()> {
    signal(pid, sig)?;
    for child in children(pid) {
        let _ = signal(child, sig);
    }
    Ok(())
}

/// Waits until every process of `pids` is stopped (or gone), since a signal is delivered after
/// `kill` returns.
pub(super) fn wait_stopped(pids: &[u32]) -> Result<()> {
    let started = Instant::now();
    loop {
        let running: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| matches!(stat(pid), Some((_, state)) if !matches!(state, 'T' | 't' | 'Z' | 'X')))
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        if started.elapsed() > STOP_SETTLE {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("processes {running:?} did not stop within {STOP_SETTLE:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
