//! A throwaway PostgreSQL cluster from the locally installed server binaries (feature
//! `embedded`).
//!
//! [`TempPostgres::start`] runs `initdb` into a temporary directory and `postgres` on a free
//! loopback port — as the `postgres` user when the process is root, since `initdb` refuses to
//! run as root — and waits until the server accepts connections. Dropping it stops the server
//! and removes its files. [`TempPostgres::shared`] is one cluster per process, stopped when the
//! process exits, for test binaries. Durability is turned off (`fsync=off`): it is for tests and
//! examples, never for data you want to keep.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

mod reap;
mod support;

pub use support::{from_env_or_start, test_pg_config, unique_name};

/// The prefix of every throwaway cluster's directory under the temporary directory.
const DIR_PREFIX: &str = "pgcoord-pg-";

/// The file in a cluster's directory holding the pid of the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// How long the server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running throwaway PostgreSQL server; stopped and deleted on drop.
pub struct TempPostgres {
    bindir: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    child: Mutex<Option<Child>>,
    dir: Mutex<Option<tempfile::TempDir>>,
    data: PathBuf,
}

impl TempPostgres {
    /// Initializes and starts a new cluster. Errors say what is missing: without the server
    /// binaries, install the PostgreSQL server package (Debian: `apt-get install postgresql`).
    pub fn start() -> Result<TempPostgres> {
        let bindir = find_bindir()?;
        let user = server_user()?;
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
            .map_err(|e| other("cannot run initdb", e))?;
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
        };
        server.launch()?;
        Ok(server)
    }

    /// The cluster shared by everything in this process, started on first use and stopped when
    /// the process exits normally (including after a test panicked).
    pub fn shared() -> Result<&'static TempPostgres> {
        static SHARED: OnceLock<std::result::Result<TempPostgres, String>> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(Ok(server)) = SHARED.get() {
                server.shutdown();
            }
        }
        let server = SHARED.get_or_init(|| {
            let server = TempPostgres::start().map_err(|e| e.to_string())?;
            // SAFETY: registering a plain `extern "C" fn` with no captured state.
            unsafe { libc::atexit(stop_shared) };
            Ok(server)
        });
        server
            .as_ref()
            .map_err(|e| Error::new(ErrorKind::Unavailable, e.clone()))
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

    /// Stops the server (fast shutdown: sessions are terminated) and starts it again on the same
    /// port with the same data: a real restart, for fault tests.
    pub fn restart(&self) -> Result<()> {
        self.stop_server();
        self.launch()
    }

    fn launch(&self) -> Result<()> {
        let dir = self
            .data
            .parent()
            .expect("data lives in the temporary directory");
        let log = fs::File::create(dir.join("postgres.log"))
            .map_err(|e| other("cannot create the server log", e))?;
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
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| other("cannot start postgres", e))?;
        *self.child.lock().expect("child lock") = Some(child);
        self.wait_ready(dir)
    }

    fn wait_ready(&self, dir: &Path) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .lock()
                .expect("child lock")
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = fs::read_to_string(dir.join("postgres.log")).unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "postgres exited with {status} during startup: {}",
                        log.trim()
                    ),
                ));
            }
            // The postmaster writes "ready" as the last line of postmaster.pid once it accepts
            // connections.
            let pid_file = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
            if pid_file.lines().nth(7).map(str::trim) == Some("ready") {
                return Ok(());
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                self.stop_server();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("postgres did not accept connections within {STARTUP_TIMEOUT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop_server(&self) {
        let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) else {
            return;
        };
        // SIGINT is PostgreSQL's fast shutdown: terminate sessions, checkpoint, exit.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
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

fn command(program: &Path, user: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(program);
    command.stdin(Stdio::null());
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

/// The `postgres` user's ids when this process is root, since initdb refuses to run as root.
fn server_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions; getpwnam returns a pointer into static storage that
    // is read at once, before any other call could overwrite it.
    unsafe {
        if libc::geteuid() != 0 {
            return Ok(None);
        }
        let entry = libc::getpwnam(c"postgres".as_ptr());
        if entry.is_null() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "running as root needs a `postgres` user to run the server as; install the \
                 PostgreSQL server package or create the user",
            ));
        }
        Ok(Some(((*entry).pw_uid, (*entry).pw_gid)))
    }
}

/// Finds the directory holding `initdb` and `postgres`: `PATH`, then `pg_config --bindir`, then
/// the newest `/usr/lib/postgresql/*/bin`.
fn find_bindir() -> Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    let from_path = std::env::var_os("PATH").into_iter().flat_map(|p| {
        std::env::split_paths(&p)
            .map(|dir| dir.join("initdb"))
            .filter_map(|initdb| fs::canonicalize(initdb).ok())
            .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
            .collect::<Vec<_>>()
    });
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    from_path
        .chain(from_pg_config)
        .chain(versions.into_iter().rev().map(|(_, dir)| dir))
        .find(|dir| has_server(dir))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "PostgreSQL server binaries (initdb, postgres) not found in PATH, pg_config \
                 --bindir or /usr/lib/postgresql/*/bin: install the PostgreSQL server package \
                 (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL",
            )
        })
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
