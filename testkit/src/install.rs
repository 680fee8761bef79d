//! Where the server binaries are, and which user runs them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use pgcoord::error::{Error, ErrorKind, Result};

/// The `postgres` user's ids when this process is root, since initdb refuses to run as root.
pub(super) fn server_user() -> Result<Option<(u32, u32)>> {
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
pub(super) fn find_bindir() -> Result<PathBuf> {
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
