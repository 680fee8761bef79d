//! The command of `lock run` and `elect` in a process group of its own, and the watchdog that
//! kills that group if `pgcoord` dies.
//!
//! Signals go to the whole group, so a script's children stop with it: a shell's background
//! writer must not outlive the lease. A process cannot catch SIGKILL, so `pgcoord` forks a
//! watchdog before it starts the command: the watchdog holds the read end of a pipe whose only
//! writer is `pgcoord`. The command, between fork and exec, writes its pid (its group's id) into
//! that pipe; `pgcoord` writes one more byte once the group is gone. When the pipe reaches its
//! end without that byte — `pgcoord` exited, however it died — the watchdog sends SIGKILL to the
//! group. The kernel closes a dead process's pipes, so this holds on every Unix, and it reaches
//! the grandchildren, which a parent-death signal (Linux's `PR_SET_PDEATHSIG`, direct children
//! only) would not. Only a SIGKILL of the watchdog itself as well leaves the group running.

use std::io::{self, PipeWriter, Write};
use std::os::fd::{AsRawFd, RawFd};

/// The watchdog's pipe: dropped without [`Watchdog::disarm`], the command's group is killed.
pub(crate) struct Watchdog {
    pipe: PipeWriter,
}

impl Watchdog {
    /// Forks the watchdog. Called before any connection is opened, so it holds no socket.
    pub(crate) fn start() -> io::Result<Watchdog> {
        // Both ends close on exec: the command never holds them.
        let (read, write) = io::pipe()?;
        let (read_fd, write_fd) = (read.as_raw_fd(), write.as_raw_fd());
        // SAFETY: the child calls only async-signal-safe functions (close, setpgid, signal,
        // read, kill, _exit) and never returns, so the fork of a threaded process is sound.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            // SAFETY: `read_fd` and `write_fd` are this process's open pipe ends.
            0 => unsafe { watch(read_fd, write_fd) },
            _ => Ok(Watchdog { pipe: write }),
        }
    }

    /// Makes `command` start in a process group of its own, its pid sent to the watchdog before
    /// it runs a line of its own.
    pub(crate) fn guard(&self, command: &mut tokio::process::Command) {
        let pipe = self.pipe.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions; it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                // Its own group before its pid is sent: the watchdog kills the group by it.
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let pid = libc::getpid().to_ne_bytes();
                // A watchdog gone would kill this child with SIGPIPE: fail the spawn instead.
                let before = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                let written = libc::write(pipe, pid.as_ptr().cast(), pid.len());
                libc::signal(libc::SIGPIPE, before);
                if written != pid.len() as isize {
                    return Err(io::Error::from_raw_os_error(libc::EPIPE));
                }
                Ok(())
            });
        }
    }

    /// The group is gone (or was never started): the watchdog exits without killing.
    pub(crate) fn disarm(&mut self) {
        let _ = self.pipe.write_all(b"x");
    }
}

/// The watchdog: reads the group's id, then waits for `pgcoord`'s byte or the pipe's end.
///
/// # Safety
///
/// Only in the child of `fork`, with `read` and `write` the pipe's ends.
unsafe fn watch(read: RawFd, write: RawFd) -> ! {
    // SAFETY: async-signal-safe calls on this process's own descriptors and signals.
    unsafe {
        libc::close(write);
        // Out of pgcoord's group and deaf to the terminal's signals: it must outlive pgcoord.
        libc::setpgid(0, 0);
        for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // It holds no pipe a caller reads to its end (`$(pgcoord lock run …)`).
        for fd in 0..=2 {
            if fd != read {
                libc::close(fd);
            }
        }
        let mut pid = [0u8; 4];
        if read_full(read, &mut pid) == pid.len() {
            let mut done = [0u8; 1];
            if read_full(read, &mut done) == 0 {
                libc::kill(-i32::from_ne_bytes(pid), libc::SIGKILL);
            }
        }
        libc::_exit(0)
    }
}

/// Reads into `buf` until it is full or the pipe ends; how many bytes came.
///
/// # Safety
///
/// `fd` is open; async-signal-safe.
unsafe fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the pointer and length stay within `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        match n {
            -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            // Any other failure is read as the pipe's end.
            ..=0 => break,
            n => got += n as usize,
        }
    }
    got
}

/// Sends `signal` to the process group `pgid`; SIGCONT after a signal that ends a process, so
/// that a stopped member (one that read the terminal from the background, say) gets it too.
pub(crate) fn signal(pgid: i32, signal: i32) {
    // The group's id is not free for reuse while its leader (our child) is not reaped or while
    // members remain: pgcoord signals it then, or just after `alive` found members.
    // SAFETY: kill has no memory preconditions.
    unsafe {
        libc::kill(-pgid, signal);
        if matches!(signal, libc::SIGTERM | libc::SIGINT | libc::SIGHUP) {
            libc::kill(-pgid, libc::SIGCONT);
        }
    }
}

/// Whether the process group `pgid` still has a member (one it may not signal counts).
pub(crate) fn alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks that the group exists.
    let found = unsafe { libc::kill(-pgid, 0) } == 0;
    found || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
