//! Where the benchmark's client and the server's backends run: pinned to cores, for the parts
//! whose single-connection round trips depend on it.
//!
//! On this 2-core VM a round trip between one client thread and one backend takes ~0.04 ms when
//! the scheduler runs both on one core (a wake-up is a context switch there) and ~0.15–0.2 ms
//! when it runs them on two (a wake-up crosses cores), and it keeps that placement for the
//! connection's life. Left to chance, two sides of a comparison can land in different modes: one
//! run's advisory repetitions ranged from 0.24× to 7× the raw pair. Pinned, both sides run in
//! the same mode, and the comparison is of what each side does.

use std::io;

/// A set of cores, as `sched_setaffinity` takes it.
fn cores(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        set
    }
}

/// Pins thread or process `pid` (0: the calling thread) to `cpu`.
pub fn pin(pid: i32, cpu: usize) -> io::Result<()> {
    let set = cores(&[cpu]);
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let done = unsafe { libc::sched_setaffinity(pid, std::mem::size_of_val(&set), &set) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's cores now, to put back with [`restore`].
pub fn current() -> io::Result<libc::cpu_set_t> {
    // SAFETY: the kernel fills `set`, of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) == 0 {
            Ok(set)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Puts the calling thread back on `set` (from [`current`]).
pub fn restore(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let done = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How a comparison's client and backends are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The client thread on core 0, the backends on core 1: a wake-up always crosses cores, as
    /// between a service and its database on separate machines.
    SeparateCores,
    /// The client thread and the backends on core 0.
    OneCore,
}

impl Placement {
    /// The cores of the client thread and of the backends.
    pub fn cores(self) -> (usize, usize) {
        match self {
            Placement::SeparateCores => (0, 1),
            Placement::OneCore => (0, 0),
        }
    }

    /// How a report row names it.
    pub fn describe(self) -> &'static str {
        match self {
            Placement::SeparateCores => "client and backends on separate cores",
            Placement::OneCore => "client and backends on one core",
        }
    }
}

/// Whether this machine has the two cores placements need.
pub fn available() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// Pins every client backend of the server `admin` is connected to on `cpu` (a backend that
/// ended meanwhile is passed over). Returns how many were pinned.
pub async fn pin_backends(admin: &tokio_postgres::Client, cpu: usize) -> io::Result<usize> {
    let rows = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'",
            &[],
        )
        .await
        .map_err(io::Error::other)?;
    let mut pinned = 0;
    for row in rows {
        match pin(row.get(0), cpu) {
            Ok(()) => pinned += 1,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(pinned)
}
