//! Where the CPU goes during a timed part: this process's (the runtime and the raw floor's
//! clients alike) and the whole machine's, from `getrusage` and `/proc/stat`. On a 2-core machine
//! the server and the benchmark share the cores, so a rate is bounded by both.

use std::time::Duration;

/// CPU counters at one moment.
#[derive(Clone, Copy)]
pub struct CpuMark {
    process: Duration,
    machine_busy: u64,
    machine_total: u64,
}

/// CPU used between two marks, summed over several parts.
#[derive(Default, Clone, Copy)]
pub struct CpuUse {
    pub process: Duration,
    machine_busy: u64,
    machine_total: u64,
}

impl CpuMark {
    pub fn now() -> CpuMark {
        // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            usage
        };
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        // The first line of /proc/stat: jiffies spent in each state, idle and iowait 4th and 5th.
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let jiffies: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        let total: u64 = jiffies.iter().sum();
        let idle = jiffies.get(3).copied().unwrap_or(0) + jiffies.get(4).copied().unwrap_or(0);
        CpuMark {
            process: time(usage.ru_utime) + time(usage.ru_stime),
            machine_busy: total - idle,
            machine_total: total,
        }
    }

    /// Adds what was used since this mark to `into`.
    pub fn add_since(self, into: &mut CpuUse) {
        let now = CpuMark::now();
        into.process += now.process - self.process;
        into.machine_busy += now.machine_busy - self.machine_busy;
        into.machine_total += now.machine_total - self.machine_total;
    }
}

impl CpuUse {
    /// How busy the machine's cores were, in percent.
    pub fn machine_busy(&self) -> f64 {
        self.machine_busy as f64 * 100.0 / self.machine_total.max(1) as f64
    }

    /// How many of the machine's cores were busy on average: CPU-seconds per second.
    pub fn machine_cores_used(&self) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.machine_busy() / 100.0 * cores as f64
    }
}

/// User and system CPU time of another process on this machine (a server backend), from
/// `/proc/<pid>/stat`; `None` when it cannot be read.
pub fn process_cpu(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some(Duration::from_secs(ticks) / per_second.max(1) as u32)
}
