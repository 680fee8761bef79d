//! [`HolderProcess`]: a holder running as a real child process, so a test can pause it
//! (SIGSTOP — the fault that breaks lock services that trust a client's sense of time), resume
//! it and kill it, and read what it reports.
//!
//! The `holder` binary writes one line per event on its standard output:
//! `READY`, `HELD <token>`, `ACK <token> <write>`, `REJECTED <token>`, `LOST <token> <reason>`,
//! `DONE <sections>`, `ERROR <message>`, `LOSSES ...` (each manager's tenures, [`crate::losses`]),
//! and `OP ...` before and after each operation
//! ([`crate::linear`]). See `src/bin/holder.rs` for its arguments.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::history::Ack;
use crate::linear::{self, Event};

/// A running holder process (or any of this crate's programs: `consumer` too); killed when dropped.
pub struct HolderProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
}

impl HolderProcess {
    /// Starts `binary` (the `holder` program: `env!("CARGO_BIN_EXE_holder")` in this crate's
    /// tests) with `args`.
    pub fn spawn(binary: impl AsRef<Path>, args: &[String]) -> HolderProcess {
        HolderProcess::spawn_with_env(binary, args, &[])
    }

    /// [`spawn`](Self::spawn) with variables added to its environment (libfaketime's, say).
    pub fn spawn_with_env(
        binary: impl AsRef<Path>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> HolderProcess {
        let mut child = Command::new(binary.as_ref())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the holder binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        // A thread, not a task: it must keep reading while the test's runtime waits.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        HolderProcess {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `within` for a line starting with `prefix` and returns it; panics with what
    /// was seen otherwise.
    pub async fn expect(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "holder {} exited before {prefix:?}; it said {:?}",
                    self.pid(),
                    self.seen
                ),
                Err(_) => panic!(
                    "holder {} said no {prefix:?} within {within:?}; it said {:?}",
                    self.pid(),
                    self.seen
                ),
            }
        }
    }

    /// Reads every line available now, without waiting.
    pub fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// Waits for the process to exit (up to `within`), reads everything it said, and returns
    /// its lines.
    pub async fn finish(&mut self, within: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    /// The writes it acknowledged so far (its `ACK` lines).
    pub fn acks(&mut self) -> Vec<Ack> {
        self.drain()
            .iter()
            .filter_map(|line| {
                let mut words = line.strip_prefix("ACK ")?.split(' ');
                Some(Ack {
                    token: words.next()?.parse().ok()?,
                    write: words.next()?.parse().ok()?,
                })
            })
            .collect()
    }

    /// The operations it recorded so far (its `OP` lines).
    pub fn operations(&mut self) -> Vec<Event> {
        linear::events(self.drain())
    }

    /// SIGSTOP: the process stops where it is, its sockets open, its timers frozen.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM: the process is asked to stop (a graceful one cleans up first).
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// SIGKILL: the process dies without cleaning anything up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, which stays reserved until we wait for it.
        let result = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(result, 0, "signal {signal} to holder {}", self.child.id());
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // A paused process must be able to die.
            // SAFETY: as in `signal`; the child has not been waited for.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
            self.kill();
        }
    }
}
