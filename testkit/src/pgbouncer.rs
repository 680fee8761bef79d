//! [`PgBouncer`]: a PgBouncer in transaction mode in front of a server, for tests of the
//! deployments that put a pooler between the application and PostgreSQL.

use std::fs;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;

use super::install::server_user;
use super::{command, free_port, new_dir, other};
use pgcoord::error::{Error, ErrorKind, Result};

/// A running `pgbouncer` in transaction mode, trusting every user, on a free loopback port.
/// Dropping it stops it and removes its files.
pub struct PgBouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts `pgbouncer` (from `PATH`, else `/usr/sbin`) in front of the server `server` names
    /// (its first TCP host and port; any database) and waits until it accepts connections.
    /// [`ErrorKind::Unavailable`] when the binary is missing (Debian: `apt-get install
    /// pgbouncer`) or it does not start.
    pub fn start(server: &tokio_postgres::Config) -> Result<PgBouncer> {
        let binary = find_binary()?;
        let host = server
            .get_hosts()
            .iter()
            .find_map(|h| match h {
                Host::Tcp(host) => Some(host.clone()),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .unwrap_or_else(|| "127.0.0.1".into());
        let server_port = server.get_ports().first().copied().unwrap_or(5432);
        let user = server.get_user().unwrap_or("postgres").to_owned();
        let run_as = server_user()?;
        let dir = new_dir(run_as)?;
        let port = free_port()?;
        let path = |name: &str| dir.path().join(name);
        fs::write(path("users.txt"), format!("\"{user}\" \"\"\n"))
            .map_err(|e| other("cannot write pgbouncer's user list", e))?;
        let ini = format!(
            "[databases]\n* = host={host} port={server_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             max_client_conn = 500\ndefault_pool_size = 20\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             admin_users = {user}\nlogfile = {log}\npidfile = {pid}\n",
            users = path("users.txt").display(),
            log = path("pgbouncer.log").display(),
            pid = path("pgbouncer.pid").display(),
        );
        fs::write(path("pgbouncer.ini"), ini)
            .map_err(|e| other("cannot write pgbouncer's configuration", e))?;
        if let Some((uid, gid)) = run_as {
            for file in ["users.txt", "pgbouncer.ini"] {
                std::os::unix::fs::chown(path(file), Some(uid), Some(gid))
                    .map_err(|e| other("cannot hand pgbouncer's files to its user", e))?;
            }
        }
        let mut child = command(&binary, run_as)
            .arg(path("pgbouncer.ini"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| other("cannot start pgbouncer", e))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let log = fs::read_to_string(path("pgbouncer.log")).unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("pgbouncer did not start ({exited:?}): {log}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(PgBouncer {
            child,
            port,
            _dir: dir,
        })
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `server`'s user, database and password, pointed at this pooler instead.
    pub fn pg_config(&self, server: &tokio_postgres::Config) -> tokio_postgres::Config {
        super::support::pointed_at(server, self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_binary() -> Result<PathBuf> {
    super::find_program("pgbouncer").ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "pgbouncer not found on PATH or in /usr/sbin (Debian: apt-get install pgbouncer)",
        )
    })
}
