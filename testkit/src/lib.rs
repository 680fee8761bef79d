//! pgcoord's test kit: a throwaway PostgreSQL cluster from the locally installed server binaries,
//! and the faults the workspace's tests inject into it. Not published; the workspace's tests,
//! examples and fault suite use it.
//!
//! [`TempPostgres::start`] runs `initdb` into a temporary directory and `postgres` on a free
//! loopback port — as the `postgres` user when the process is root, since `initdb` refuses to
//! run as root — and waits until the server accepts connections. Dropping it stops the server
//! and removes its files. [`TempPostgres::shared`] is one cluster per process, stopped when the
//! process exits, for test binaries. Durability is turned off (`fsync=off`): it is for tests and
//! examples, never for data you want to keep.
//!
//! For fault tests the cluster can be stopped ([`TempPostgres::stop`],
//! [`TempPostgres::stop_immediate`]) and started again on the same port with the same data
//! ([`TempPostgres::start_again`]), restarted ([`TempPostgres::restart`],
//! [`TempPostgres::restart_immediate`]), paused as a hung server is
//! ([`TempPostgres::pause`]), and single backends frozen ([`TempPostgres::freeze_backend`]),
//! found by `application_name` ([`backend_pids`]) or terminated ([`terminate_backends`]).
//!
//! For failover tests a cluster can have streaming standbys ([`TempPostgres::start_primary`],
//! [`TempPostgres::start_standby`], [`TempPostgres::wait_replayed`], [`TempPostgres::promote`],
//! [`failover_pg_config`]), which replicate synchronously or asynchronously ([`Replication`]).
//! For pooler deployments, a [`PgBouncer`] in transaction mode can stand in front of a cluster.
//! A test needing an external program finds it with [`require_program`]: missing, the test is
//! skipped with a line, or fails under CI.
//! For TLS, a cluster can start with TLS on and a certificate signed by a
//! [`CertificateAuthority`] made for the run ([`TempPostgres::start_tls`]).
//! For authentication, a cluster can start with `pg_hba.conf` rules of the test's
//! ([`TempPostgres::start_with_hba`]): a role that must give a password, say.
#![deny(missing_docs)]

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use install::{find_bindir, server_user};
use pgcoord::error::{Error, ErrorKind, Result};

mod backup;
mod control;
mod fetch;
mod install;
mod pgbouncer;
mod programs;
mod proxy;
mod reap;
mod shared;
mod standby;
mod support;
mod tls;

pub use control::{backend_pids, terminate_backends};
pub use pgbouncer::PgBouncer;
pub use programs::{find_program, require, require_program};
pub use proxy::Proxy;
pub use standby::{Replication, failover_pg_config};
pub use support::{eventually, from_env_or_start, test_pg_config, unique_name};
pub use tls::{CERT_USER, CertificateAuthority};

/// The prefix of every throwaway cluster's directory under the temporary directory.
const DIR_PREFIX: &str = "pgcoord-pg-";

/// The file in a cluster's directory holding the pid of the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// How long the server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the server may take to exit once told to, before it and its children are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running throwaway PostgreSQL server; stopped and deleted on drop.
pub struct TempPostgres {
    bindir: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    child: Mutex<Option<Child>>,
    dir: Mutex<Option<tempfile::TempDir>>,
    data: PathBuf,
    /// `-c` settings after the defaults, which they override: from [`TempPostgres::start_with`],
    /// or a standby's inherited from its primary.
    settings: Vec<(String, String)>,
    /// How many standbys this server started, to name the next one.
    standbys: AtomicU32,
    /// The `application_name` a standby streams from its primary with.
    standby_name: Option<String>,
    /// The certificate authority's certificate (PEM) when the server has TLS on.
    root_cert: Option<PathBuf>,
    /// A client certificate and key the server accepts for [`tls::CERT_USER`], with TLS on.
    client_cert: Option<(PathBuf, PathBuf)>,
}

impl TempPostgres {
    /// Initializes and starts a new cluster. Errors say what is missing: without the server
    /// binaries, install the PostgreSQL server package (Debian: `apt-get install postgresql`).
    pub fn start() -> Result<TempPostgres> {
        Self::start_with(&[])
    }

    /// As [`start`](Self::start), with server settings passed as `-c name=value` after the
    /// defaults (`fsync=off`, `synchronous_commit=off`, `full_page_writes=off`,
    /// `max_connections=500`, `listen_addresses=127.0.0.1`), which they override. They stay
    /// in force across restarts, and standbys started from this server inherit them. For
    /// example `&[("synchronous_commit", "on")]` for durable commits; see also
    /// [`start_primary`](Self::start_primary).
    pub fn start_with(settings: &[(&str, &str)]) -> Result<TempPostgres> {
        let server = Self::initialized(settings)?;
        server.launch()?;
        Ok(server)
    }

    /// As [`start`](Self::start), with `rules` ahead of those of the default `pg_hba.conf`, which
    /// trust every connection: `host all app 127.0.0.1/32 scram-sha-256` makes the role `app`
    /// give its password. Create the role to use it.
    pub fn start_with_hba(rules: &str) -> Result<TempPostgres> {
        let server = Self::initialized(&[])?;
        server.prepend_hba(rules)?;
        server.launch()?;
        Ok(server)
    }

    /// Puts `rules` ahead of the cluster's `pg_hba.conf` rules (read at its next start).
    fn prepend_hba(&self, rules: &str) -> Result<()> {
        let hba = self.data.join("pg_hba.conf");
        let existing = fs::read_to_string(&hba).map_err(|e| {
            Error::new(
                ErrorKind::Other,
                format!("cannot read {}: {e}", hba.display()),
            )
        })?;
        tls::write(&hba, &format!("{rules}{existing}"), 0o600, self.user)
    }

    /// A new cluster, initialized and not yet started.
    fn initialized(settings: &[(&str, &str)]) -> Result<TempPostgres> {
        let bindir = find_bindir()?;
        let user = server_user()?;
        let dir = new_dir(user)?;
        let data = dir.path().join("data");
        let output = command(&bindir.join("initdb"), user)
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .output()
            .map_err(|e| match (e.kind(), user) {
                (std::io::ErrorKind::PermissionDenied, Some(_)) => other(
                    &format!(
                        "cannot run initdb as the `postgres` user: every directory above {} \
                         must be readable and searchable by it",
                        bindir.display()
                    ),
                    e,
                ),
                _ => other("cannot run initdb", e),
            })?;
        if !output.status.success() {
            return Err(Error::new(
                ErrorKind::Other,
                format!(
                    "initdb failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            ));
        }
        let server = TempPostgres {
            bindir,
            port: free_port()?,
            user,
            child: Mutex::new(None),
            dir: Mutex::new(Some(dir)),
            data,
            settings: settings
                .iter()
                .map(|&(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
            standbys: AtomicU32::new(0),
            standby_name: None,
            root_cert: None,
            client_cert: None,
        };
        Ok(server)
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the cluster's data and log; removed on drop.
    pub fn directory(&self) -> &Path {
        self.data
            .parent()
            .expect("data lives in the temporary directory")
    }

    /// The process id of the postmaster, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok()?.as_ref().map(Child::id)
    }

    /// Connection settings for the `postgres` database as the `postgres` superuser.
    pub fn pg_config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        config
    }

    /// The same settings as a DSN.
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    fn launch(&self) -> Result<()> {
        let dir = self
            .data
            .parent()
            .expect("data lives in the temporary directory");
        // Appended to, so the log of a run before a restart stays readable.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("postgres.log"))
            .map_err(|e| other("cannot create the server log", e))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        if let Some((uid, gid)) = self.user {
            let _ = std::os::unix::fs::chown(dir.join("postgres.log"), Some(uid), Some(gid));
        }
        let stderr = log
            .try_clone()
            .map_err(|e| other("cannot open the log", e))?;
        let child = command(&self.bindir.join("postgres"), self.user)
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=500"])
            .args(
                self.settings
                    .iter()
                    .flat_map(|(name, value)| ["-c".to_owned(), format!("{name}={value}")]),
            )
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| other("cannot start postgres", e))?;
        let pid = child.id();
        *self.child.lock().expect("child lock") = Some(child);
        self.wait_ready(dir, pid, log_start)
    }

    fn wait_ready(&self, dir: &Path, pid: u32, log_start: u64) -> Result<()> {
        let ready = poll_until(STARTUP_TIMEOUT, Duration::from_millis(10), || {
            if let Some(status) = self
                .child
                .lock()
                .expect("child lock")
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = fs::read(dir.join("postgres.log")).unwrap_or_default();
                let log = log.get(log_start as usize..).unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "postgres exited with {status} during startup: {}",
                        String::from_utf8_lossy(log).trim()
                    ),
                ));
            }
            // The postmaster writes its pid as the first line of postmaster.pid and "ready" as
            // the last once it accepts connections ("standby" for a hot standby). The pid tells
            // this postmaster's file from one a killed server left behind.
            let pid_file = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
            let mut lines = pid_file.lines().map(str::trim);
            let ours = lines.next() == Some(pid.to_string().as_str());
            Ok((ours && matches!(lines.nth(6), Some("ready" | "standby"))).then_some(()))
        })?;
        if ready.is_none() {
            self.stop_server();
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("postgres did not accept connections within {STARTUP_TIMEOUT:?}"),
            ));
        }
        Ok(())
    }

    /// Fast shutdown, for restart and drop: errors are of no use there.
    fn stop_server(&self) {
        let _ = self.stop_with(libc::SIGINT);
    }

    /// Sends `signal` (SIGINT: fast shutdown, SIGQUIT: immediate) to the postmaster and waits
    /// until it exited; kills it and its children when it takes longer than [`STOP_TIMEOUT`].
    fn stop_with(&self, signal: libc::c_int) -> Result<()> {
        let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) else {
            return Ok(());
        };
        let pid = child.id();
        if let Ok(Some(_)) = child.try_wait() {
            return Ok(());
        }
        // A paused server or a frozen backend would not act on the signal (nor let the
        // postmaster finish) until continued.
        let _ = control::signal_with_children(pid, libc::SIGCONT);
        let _ = control::signal(pid, signal);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let children = control::children(pid);
        let _ = child.kill();
        for child in children {
            let _ = control::signal(child, libc::SIGKILL);
        }
        let _ = child.wait();
        Err(Error::new(
            ErrorKind::Timeout,
            format!("postgres did not exit within {STOP_TIMEOUT:?}; killed"),
        ))
    }

    fn shutdown(&self) {
        self.stop_server();
        if let Ok(mut dir) = self.dir.lock() {
            drop(dir.take());
        }
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A new temporary directory for a cluster, owned by the server user, recording this process as
/// its owner; orphans of killed processes are reaped first.
fn new_dir(user: Option<(u32, u32)>) -> Result<tempfile::TempDir> {
    reap::reap_orphans(DIR_PREFIX, OWNER_FILE);
    let dir = tempfile::Builder::new()
        .prefix(DIR_PREFIX)
        .tempdir()
        .map_err(|e| other("cannot create a temporary directory", e))?;
    // Who owns this cluster, so a later run can reap it if this process is killed.
    fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())
        .map_err(|e| other("cannot record the cluster's owner", e))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .map_err(|e| other("cannot hand the data directory to the postgres user", e))?;
    }
    Ok(dir)
}

fn command(program: &Path, user: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(program);
    command.stdin(Stdio::null());
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| other("cannot find a free port", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| other("cannot find a free port", e))
}

fn other(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Other, format!("{what}: {e}")).with_source(e)
}

/// Calls `look` every `every` until it finds what it looks for (`Some`), for at most `within`:
/// `Ok(None)` when time ran out, the error of a look that fails at once. The blocking waits of
/// this module (a server starting or stopping, a standby streaming, catching up, promoted)
/// share it; each says itself what timing out means.
fn poll_until<T>(
    within: Duration,
    every: Duration,
    mut look: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let started = Instant::now();
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        if started.elapsed() > within {
            return Ok(None);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::poll_until;
    use pgcoord::error::{Error, ErrorKind};
    use std::time::{Duration, Instant};

    const EVERY: Duration = Duration::from_millis(1);

    #[test]
    fn polling_returns_what_a_look_found_and_looks_no_more() {
        let mut looks = 0;
        let found = poll_until(Duration::from_secs(5), EVERY, || {
            looks += 1;
            Ok((looks == 3).then_some(looks))
        });
        assert_eq!(found.unwrap(), Some(3));
        assert_eq!(looks, 3);
    }

    #[test]
    fn polling_gives_up_after_its_bound_and_stops_at_a_failed_look() {
        let started = Instant::now();
        let mut looks = 0;
        let found = poll_until(Duration::from_millis(30), EVERY, || {
            looks += 1;
            Ok(None::<()>)
        });
        assert_eq!(found.unwrap(), None);
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(looks > 1, "looked again until the bound: {looks}");

        let mut looks = 0;
        let failed = poll_until(
            Duration::from_secs(5),
            EVERY,
            || -> pgcoord::Result<Option<()>> {
                looks += 1;
                Err(Error::new(ErrorKind::InvalidConfig, "not a standby"))
            },
        );
        assert_eq!(failed.unwrap_err().kind(), ErrorKind::InvalidConfig);
        assert_eq!(looks, 1);
    }
}
