//! Fault injection for the throwaway cluster: stopping, restarting, pausing and freezing it or
//! one of its backends, signalling its processes, finding and ending backends.

use std::fs;
use std::time::Duration;

use super::{TempPostgres, poll_until};
use pgcoord::error::{Error, ErrorKind, Result};

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
    let mut running = Vec::new();
    let stopped = poll_until(STOP_SETTLE, Duration::from_millis(1), || {
        running = pids
            .iter()
            .copied()
            .filter(|&pid| matches!(stat(pid), Some((_, state)) if !matches!(state, 'T' | 't' | 'Z' | 'X')))
            .collect();
        Ok(running.is_empty().then_some(()))
    })?;
    stopped.ok_or_else(|| {
        Error::new(
            ErrorKind::Timeout,
            format!("processes {running:?} did not stop within {STOP_SETTLE:?}"),
        )
    })
}

/// Fault injection on the whole server or one backend: stops, restarts, pauses, freezes.
impl TempPostgres {
    /// Stops the server (fast shutdown: sessions are terminated) and starts it again on the same
    /// port with the same data: a real restart, for fault tests.
    pub fn restart(&self) -> Result<()> {
        self.stop_server();
        self.launch()
    }

    /// Stops the server with a fast shutdown (SIGINT: sessions are terminated, a checkpoint is
    /// written) and waits until the postmaster exited. The data and the port stay, for
    /// [`start_again`](Self::start_again); connecting fails meanwhile. A paused server is
    /// resumed first. Ok when the server is not running; a timeout error when it did not exit
    /// within 10 s, after which it and its children were killed.
    pub fn stop(&self) -> Result<()> {
        self.stop_with(libc::SIGINT)
    }

    /// Stops the server with an immediate shutdown (SIGQUIT: every process exits at once, without
    /// a checkpoint, as after a crash) and waits until the postmaster exited. Otherwise as
    /// [`stop`](Self::stop); the next start runs crash recovery.
    pub fn stop_immediate(&self) -> Result<()> {
        self.stop_with(libc::SIGQUIT)
    }

    /// Starts the stopped server again on the same port with the same data and waits until it
    /// accepts connections. An error when it is running.
    pub fn start_again(&self) -> Result<()> {
        if let Some(pid) = self.running_pid() {
            return Err(Error::new(
                ErrorKind::Other,
                format!("postgres is running (pid {pid}): stop it before starting it again"),
            ));
        }
        // A postmaster that exited by itself leaves its handle behind.
        if let Ok(mut child) = self.child.lock()
            && let Some(mut exited) = child.take()
        {
            let _ = exited.wait();
        }
        self.launch()
    }

    /// A crash-like restart: [`stop_immediate`](Self::stop_immediate), then
    /// [`start_again`](Self::start_again), which runs crash recovery before accepting
    /// connections.
    pub fn restart_immediate(&self) -> Result<()> {
        self.stop_immediate()?;
        self.start_again()
    }

    /// Stops (SIGSTOP) the postmaster and every process it started, and waits until they are
    /// stopped: the server hangs as an overloaded or partitioned one does. Connections stay open
    /// and new ones are accepted by the kernel, but nothing answers until
    /// [`resume`](Self::resume). Dropping or stopping a paused server resumes it first. An error
    /// when the server is not running.
    pub fn pause(&self) -> Result<()> {
        let pid = self.expect_running()?;
        // The postmaster first, so it starts no process that would escape.
        signal(pid, libc::SIGSTOP)?;
        let mut stopped = children(pid);
        for &child in &stopped {
            let _ = signal(child, libc::SIGSTOP);
        }
        stopped.push(pid);
        wait_stopped(&stopped)
    }

    /// Continues (SIGCONT) the postmaster and every process it started, after
    /// [`pause`](Self::pause) or [`freeze_backend`](Self::freeze_backend). Harmless when
    /// nothing is stopped; an error when the server is not running.
    pub fn resume(&self) -> Result<()> {
        let pid = self.expect_running()?;
        for child in children(pid) {
            let _ = signal(child, libc::SIGCONT);
        }
        signal(pid, libc::SIGCONT)
    }

    /// Stops (SIGSTOP) one backend of this server, as found by [`backend_pids`] or
    /// `pg_backend_pid()`, and waits until it is stopped: its session hangs while the rest of the
    /// server serves. An error when `pid` is not a process started by this server's postmaster,
    /// so a pid from another server is never signalled.
    pub fn freeze_backend(&self, pid: u32) -> Result<()> {
        self.expect_child(pid)?;
        signal(pid, libc::SIGSTOP)?;
        wait_stopped(&[pid])
    }

    /// Continues (SIGCONT) one backend stopped by [`freeze_backend`](Self::freeze_backend).
    /// An error when `pid` is not a process started by this server's postmaster.
    pub fn thaw_backend(&self, pid: u32) -> Result<()> {
        self.expect_child(pid)?;
        signal(pid, libc::SIGCONT)
    }

    /// The postmaster's pid, unless it is not running or has exited.
    fn running_pid(&self) -> Option<u32> {
        let mut child = self.child.lock().ok()?;
        let child = child.as_mut()?;
        match child.try_wait() {
            Ok(None) => Some(child.id()),
            _ => None,
        }
    }

    fn expect_running(&self) -> Result<u32> {
        self.running_pid()
            .ok_or_else(|| Error::new(ErrorKind::Unavailable, "postgres is not running"))
    }

    fn expect_child(&self, pid: u32) -> Result<()> {
        let postmaster = self.expect_running()?;
        if is_child_of(pid, postmaster) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("process {pid} is not a backend of this server (postmaster {postmaster})"),
            ))
        }
    }
}
