//! A standby's copy made without `pg_basebackup`, for a server no `pg_basebackup` here can copy
//! (a fetched PostgreSQL 18 on a machine whose own tools are 15): the low-level backup API.
//! In one session, `pg_backup_start` (13 and 14: `pg_start_backup`, non-exclusive); the data
//! directory copied file by file, leaving out what a base backup leaves out; then
//! `pg_backup_stop`, whose backup label is written into the copy. The standby streams the WAL
//! from the backup's start (the primary keeps 64 MB of it), as after `pg_basebackup -X none`.

use std::fs;
use std::path::Path;
use std::time::Duration;

use pgcoord::error::{Error, Result};

use super::{TempPostgres, other};

/// The directories whose contents a base backup leaves out (their directories stay, empty).
const EMPTIED: &[&str] = &[
    "pg_wal",
    "pg_replslot",
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_stat_tmp",
    "pg_subtrans",
];

/// The files a base backup leaves out.
const LEFT_OUT: &[&str] = &["postmaster.pid", "postmaster.opts", "backup_label.old"];

/// How long the backup's session may take, copying included.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(60);

impl TempPostgres {
    /// Copies this server's data directory into `data` (which must not exist) with the
    /// low-level backup API; see the module docs.
    pub(super) fn copy_with_backup_api(&self, data: &Path) -> Result<()> {
        let mut config = self.pg_config();
        config
            .application_name("pgcoord-backup")
            .connect_timeout(Duration::from_secs(10));
        let backup = async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            let connection = tokio::spawn(connection);
            let version: i32 = client
                .query_one("SELECT current_setting('server_version_num')::int", &[])
                .await?
                .get(0);
            let (start, stop) = if version >= 150_000 {
                (
                    "SELECT pg_backup_start('pgcoord standby', true)::text",
                    "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)",
                )
            } else {
                (
                    "SELECT pg_start_backup('pgcoord standby', true, false)::text",
                    "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)",
                )
            };
            client.query_one(start, &[]).await?;
            // Blocking, on this thread of its own; the session waits idle meanwhile.
            copy_dir(&self.data, data, true)?;
            let row = client.query_one(stop, &[]).await?;
            let (label, map): (String, Option<String>) = (row.get(0), row.get(1));
            fs::write(data.join("backup_label"), label)
                .map_err(|e| other("cannot write backup_label", e))?;
            if let Some(map) = map.filter(|m| !m.is_empty()) {
                fs::write(data.join("tablespace_map"), map)
                    .map_err(|e| other("cannot write tablespace_map", e))?;
            }
            drop(client);
            let _ = connection.await;
            Ok::<_, Error>(())
        };
        super::standby::on_own_thread("the backup", BACKUP_TIMEOUT, backup)?;
        if let Some((uid, gid)) = self.user {
            chown_all(data, uid, gid)?;
        }
        Ok(())
    }
}

/// Copies `from` into `to`, directories 0700 and files 0600 as the server wants them. A file
/// that vanished while being copied (a temporary one) is skipped: the WAL replayed from the
/// backup's start makes the copy consistent. At the top, what a base backup leaves out is.
fn copy_dir(from: &Path, to: &Path, top: bool) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fs::DirBuilder::new()
        .mode(0o700)
        .create(to)
        .map_err(|e| other("cannot create a directory of the copy", e))?;
    let entries = fs::read_dir(from).map_err(|e| other("cannot read the data directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| other("cannot read the data directory", e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if top && LEFT_OUT.contains(&name.as_ref()) || name.starts_with("pgsql_tmp") {
            continue;
        }
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(other("cannot read the data directory", e)),
        };
        if kind.is_dir() {
            if top && EMPTIED.contains(&name.as_ref()) {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&target)
                    .map_err(|e| other("cannot create a directory of the copy", e))?;
            } else {
                copy_dir(&source, &target, false)?;
            }
            continue;
        }
        match fs::copy(&source, &target) {
            Ok(_) => fs::set_permissions(&target, fs::Permissions::from_mode(0o600))
                .map_err(|e| other("cannot set a copied file's mode", e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(other("cannot copy a data file", e)),
        }
    }
    Ok(())
}

/// Gives `path` and everything under it to `uid`/`gid`.
fn chown_all(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| other("cannot give the copy to the server's user", e))?;
    if path.is_dir() {
        for entry in fs::read_dir(path).map_err(|e| other("cannot read the copy", e))? {
            let entry = entry.map_err(|e| other("cannot read the copy", e))?;
            chown_all(&entry.path(), uid, gid)?;
        }
    }
    Ok(())
}
