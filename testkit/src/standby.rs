//! Streaming standbys of the throwaway cluster, for failover tests.
//!
//! [`TempPostgres::start_primary`] starts a cluster whose commits are durable
//! (`synchronous_commit=on`) and that keeps WAL for a standby that falls behind
//! (`wal_keep_size=64MB`). [`TempPostgres::start_standby`] copies it with `pg_basebackup` (or,
//! where none here can copy its version, the low-level backup API) into a directory of its own and starts the copy as a hot standby on its own port, streaming
//! from the primary under the `application_name` `standby1` (`standby2`, … for later ones of
//! the same primary). The standby is a [`TempPostgres`] like any other: it can be stopped,
//! paused and started again, and is stopped and deleted on drop.
//! [`TempPostgres::wait_replayed`] waits until it has replayed what its primary wrote so far,
//! [`TempPostgres::promote`] makes it writable, and [`failover_pg_config`] gives clients every
//! server's address with `target_session_attrs=read-write`, so they connect to whichever
//! accepts writes.
//!
//! # Synchronous and asynchronous replication
//!
//! With [`Replication::Asynchronous`] the primary acknowledges a commit once it is flushed to
//! its own WAL; the standby receives it a little later. **A commit acknowledged by the primary
//! may be missing on the promoted standby** when the primary fails before sending it: a
//! failover loses the last moments of writes, and a client may see a row it committed vanish.
//!
//! With [`Replication::Synchronous`] `start_standby` sets `synchronous_standby_names` to the
//! standby's name on the primary (`ALTER SYSTEM`, then `pg_reload_conf()`, after the base
//! backup so the standby does not inherit it). From then on a commit on the primary returns
//! only after the standby has flushed it (`synchronous_commit=on`), or applied it so that it is
//! visible there (`remote_apply`), and a commit waits for as long as the standby is stopped,
//! paused or disconnected: a commit acknowledged by the primary survives promoting the standby.
//! It needs `synchronous_commit` on, `remote_write` or `remote_apply` on the primary
//! ([`TempPostgres::start_primary`] or a session's `SET`): `start_standby` refuses a primary
//! whose default is `off` or `local`, under which commits wait for no standby. The primary has
//! one synchronous standby: a later synchronous standby replaces the earlier one, which then
//! replicates asynchronously. The setting stays when the standby is stopped or dropped, so the
//! primary's commits then wait until it is reset (`ALTER SYSTEM RESET
//! synchronous_standby_names`, `SELECT pg_reload_conf()`).
//!
//! # Caveats
//!
//! - A standby inherits its primary's `-c` settings except `synchronous_standby_names`: once
//!   promoted it is a primary without standbys, whose commits wait for nobody.
//! - Promoting a standby while its primary still runs makes two writable servers (a split
//!   brain); [`failover_pg_config`] then connects to the first one listed. The same happens when
//!   a stopped old primary is started again after the promotion: it does not follow the new
//!   one.
//! - A primary's fast [`stop`](TempPostgres::stop) waits until its standbys have received all of
//!   its WAL, so stopping a primary while its standby is paused takes until
//!   `wal_sender_timeout` or the stop timeout, after which it is killed; use
//!   [`stop_immediate`](TempPostgres::stop_immediate) to fail a primary.
//! - Like the primary, the standby runs with `fsync=off`: it survives its processes crashing,
//!   not the machine.

use std::fs;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{TempPostgres, command, free_port, new_dir, other, poll_until};
use pgcoord::error::{Error, ErrorKind, Result};

/// How long a base backup may take.
const BASE_BACKUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a standby may take to start streaming once its postmaster accepts connections.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a promotion may take.
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one query of the helpers below may take, connecting included.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The `application_name` of the helpers' own connections.
const HELPER_NAME: &str = "pgcoord-embedded";

/// The settings of [`TempPostgres::start_primary`].
const PRIMARY_SETTINGS: &[(&str, &str)] =
    &[("synchronous_commit", "on"), ("wal_keep_size", "64MB")];

/// How a standby replicates from its primary ([`TempPostgres::start_standby`]).
///
/// With `Asynchronous` the primary acknowledges a commit once it is in its own WAL and the
/// standby receives it shortly after: **a commit the primary acknowledged may be missing on the
/// promoted standby** when the primary failed before sending it.
///
/// With `Synchronous` the primary's `synchronous_standby_names` names the standby (set with
/// `ALTER SYSTEM` and a reload, after the base backup so the standby does not inherit it), and
/// a commit returns only once the standby flushed it (`synchronous_commit=on`) or applied it,
/// visible there at once (`remote_apply`): a commit the primary acknowledged survives promoting
/// the standby. Commits on the primary wait for as long as the standby is stopped, paused or
/// gone, dropped included, until `ALTER SYSTEM RESET synchronous_standby_names` and
/// `SELECT pg_reload_conf()` on the primary. Sessions with `synchronous_commit` `off` or `local`
/// wait for no standby. A primary has one synchronous standby: a later one replaces it, and it
/// goes on replicating asynchronously.
///
/// Either way the standby inherits its primary's `-c` settings except
/// `synchronous_standby_names`: once promoted it is a primary whose commits wait for nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Commits on the primary wait for the standby: a commit the primary acknowledged is on the
    /// standby. The primary's commits block while the standby is down.
    Synchronous,
    /// Commits on the primary do not wait for the standby, which follows shortly after: a commit
    /// the primary acknowledged may be missing on the standby when the primary fails.
    Asynchronous,
}

impl TempPostgres {
    /// Starts a cluster to be the primary of standbys ([`start_standby`](Self::start_standby)):
    /// as [`start_with`](Self::start_with) with `synchronous_commit=on`, so an acknowledged
    /// commit is in the primary's WAL and, with a synchronous standby, on the standby too, and
    /// `wal_keep_size=64MB`, so a standby that was stopped for a while can catch up. `fsync`
    /// stays off.
    pub fn start_primary() -> Result<TempPostgres> {
        Self::start_primary_with(&[])
    }

    /// [`start_primary`](Self::start_primary) with `settings` too (its standbys inherit them).
    pub fn start_primary_with(settings: &[(&str, &str)]) -> Result<TempPostgres> {
        let all: Vec<(&str, &str)> = PRIMARY_SETTINGS.iter().chain(settings).copied().collect();
        Self::start_with(&all)
    }

    /// Starts a streaming hot standby of this server and waits until it streams: it accepts
    /// connections, is in recovery, and the primary's `pg_stat_replication` shows it
    /// `streaming` with `sync_state` `sync` or `async` as `replication` asks.
    ///
    /// The standby is a copy made with `pg_basebackup` (or the low-level backup API, for a
    /// version no `pg_basebackup` here can copy), in a temporary directory of its own,
    /// listening on its own loopback port, with this server's `-c` settings except
    /// `synchronous_standby_names`; it streams under the `application_name` given by
    /// [`standby_name`](Self::standby_name): `standby1` for the first standby of this server,
    /// `standby2` for the next. For [`Replication::Synchronous`] this server's
    /// `synchronous_standby_names` is set to that name (see [`Replication`]); on an error it is
    /// set back. Takes 0.2 to 2 s (a loaded 2-core machine).
    ///
    /// An error when the copy fails (for example when this server is stopped), when the
    /// standby does not stream within 30 s, or, for [`Replication::Synchronous`], when this
    /// server's `synchronous_commit` is `off` or `local`, under which commits wait for no
    /// standby.
    pub fn start_standby(&self, replication: Replication) -> Result<TempPostgres> {
        let name = format!(
            "standby{}",
            self.standbys.fetch_add(1, Ordering::Relaxed) + 1
        );
        if replication == Replication::Synchronous {
            let commit = self.query_value("SHOW synchronous_commit", QUERY_TIMEOUT)?;
            if matches!(commit.as_deref(), Some("off" | "local")) {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "a synchronous standby needs synchronous_commit on, remote_write or \
                         remote_apply on the primary, not {}: start it with \
                         TempPostgres::start_primary",
                        commit.unwrap_or_default()
                    ),
                ));
            }
        }
        let dir = new_dir(self.user)?;
        let data = dir.path().join("data");
        self.base_backup(&name, dir.path(), &data)?;
        // A primary's synchronous standby names, copied from its postgresql.auto.conf, would make
        // the standby's commits wait for itself once it is promoted.
        let auto_conf = data.join("postgresql.auto.conf");
        let conf = fs::read_to_string(&auto_conf)
            .map_err(|e| other("cannot read the standby's postgresql.auto.conf", e))?;
        if conf.contains("synchronous_standby_names") {
            let kept: String = conf
                .lines()
                .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
                .map(|line| format!("{line}\n"))
                .collect();
            fs::write(&auto_conf, kept)
                .map_err(|e| other("cannot write the standby's postgresql.auto.conf", e))?;
        }
        let standby = TempPostgres {
            bindir: self.bindir.clone(),
            port: free_port()?,
            user: self.user,
            child: Mutex::new(None),
            dir: Mutex::new(Some(dir)),
            data,
            settings: self
                .settings
                .iter()
                .filter(|(setting, _)| setting != "synchronous_standby_names")
                .cloned()
                .collect(),
            standbys: AtomicU32::new(0),
            root_cert: self.root_cert.clone(),
            client_cert: self.client_cert.clone(),
            standby_name: Some(name.clone()),
        };
        let previous = match replication {
            Replication::Synchronous => Some(self.set_synchronous_standby_names(&name)?),
            Replication::Asynchronous => None,
        };
        let started = standby
            .launch()
            .and_then(|()| self.wait_streaming(&standby, &name, replication));
        if let Err(e) = started {
            if let Some(previous) = previous {
                let _ = self.set_synchronous_standby_names(&previous);
            }
            return Err(e);
        }
        Ok(standby)
    }

    /// The `application_name` this standby streams from its primary with (`standby1`, …), as
    /// in the primary's `pg_stat_replication` and `synchronous_standby_names`; `None` for a
    /// server not started by [`start_standby`](Self::start_standby). It stays after promotion.
    pub fn standby_name(&self) -> Option<&str> {
        self.standby_name.as_deref()
    }

    /// Promotes this standby to a primary (`pg_promote`) and waits until it accepts writes: it
    /// ends recovery after replaying the WAL it received, switches to a new timeline and stops
    /// following its primary. Stop the primary first, or there are two writable servers, a split
    /// brain ([`failover_pg_config`] connects to the first one listed); the same happens when a
    /// stopped old primary is started again after the promotion, as it does not follow the new
    /// one. An error when this server is not in recovery or the promotion takes
    /// longer than 30 s.
    pub fn promote(&self) -> Result<()> {
        if !self.in_recovery()? {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "not a standby: the server is not in recovery",
            ));
        }
        let wait = PROMOTE_TIMEOUT.as_secs();
        let promoted = self.query_value(
            &format!("SELECT pg_promote(true, {wait})"),
            PROMOTE_TIMEOUT + QUERY_TIMEOUT,
        )?;
        if promoted.as_deref() != Some("t") {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("the standby was not promoted within {PROMOTE_TIMEOUT:?}"),
            ));
        }
        let writable = poll_until(PROMOTE_TIMEOUT, Duration::from_millis(10), || {
            Ok((!self.in_recovery()?).then_some(()))
        })?;
        writable.ok_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                format!("the standby was still in recovery {PROMOTE_TIMEOUT:?} after pg_promote"),
            )
        })
    }

    /// Waits until `standby` has replayed all the WAL this server had written when it was
    /// called (`pg_current_wal_lsn()` here against `pg_last_wal_replay_lsn()` there), so that
    /// everything committed here so far is visible on the standby and survives its promotion.
    /// An asynchronous standby needs it before a test stops it or fails over to it on purpose:
    /// without it, even the tables a test created just before may be missing there. An error
    /// at once when `standby` is not in recovery, and when it has not caught up within 30 s (it
    /// is stopped, paused or not streaming).
    pub fn wait_replayed(&self, standby: &TempPostgres) -> Result<()> {
        let written = self
            .query_value("SELECT pg_current_wal_lsn()", QUERY_TIMEOUT)?
            .unwrap_or_default();
        let target = parse_lsn(&written)?;
        let mut last = String::new();
        let replayed = poll_until(STREAMING_TIMEOUT, Duration::from_millis(5), || {
            match standby.query_value("SELECT pg_last_wal_replay_lsn()", QUERY_TIMEOUT) {
                Ok(Some(replayed)) if parse_lsn(&replayed)? >= target => return Ok(Some(())),
                Ok(Some(replayed)) => last = format!("replayed up to {replayed}"),
                Ok(None) => {
                    return Err(Error::new(
                        ErrorKind::InvalidConfig,
                        "not a standby: the server has no replay position",
                    ));
                }
                Err(e) => last = e.to_string(),
            }
            Ok(None)
        })?;
        replayed.ok_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "the standby had not replayed up to {written} within {STREAMING_TIMEOUT:?}: \
                     {last}"
                ),
            )
        })
    }

    /// Runs `pg_basebackup` from this server into `data`, with `standby.signal` and a
    /// `primary_conninfo` naming `name` as the `application_name`, logging to `dir`.
    fn base_backup(&self, name: &str, dir: &std::path::Path, data: &std::path::Path) -> Result<()> {
        let log_path = dir.join("basebackup.log");
        let log = fs::File::create(&log_path)
            .map_err(|e| other("cannot create the base backup's log", e))?;
        let stderr = log
            .try_clone()
            .map_err(|e| other("cannot open the base backup's log", e))?;
        let Some(tool) = super::install::base_backup_tool(&self.bindir)? else {
            // No pg_basebackup here can copy this server (a fetched one newer than the
            // machine's): the low-level backup API does.
            self.copy_with_backup_api(data)?;
            return self.follow(name, data);
        };
        let mut child = command(&tool, self.user)
            .arg("-d")
            .arg(format!(
                "host=127.0.0.1 port={} user=postgres application_name={name}",
                self.port
            ))
            .arg("-D")
            .arg(data)
            // A fast checkpoint, as a spread one may take long. No -R: see `follow`.
            .args(["-X", "stream", "--checkpoint=fast", "--no-sync"])
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| other("cannot run pg_basebackup", e))?;
        let exited = poll_until(BASE_BACKUP_TIMEOUT, Duration::from_millis(10), || {
            child
                .try_wait()
                .map_err(|e| other("cannot wait for pg_basebackup", e))
        })?;
        let Some(status) = exited else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("pg_basebackup did not finish within {BASE_BACKUP_TIMEOUT:?}"),
            ));
        };
        if status.success() {
            return self.follow(name, data);
        }
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("pg_basebackup failed ({status}): {}", log.trim()),
        ))
    }

    /// Makes the copy in `data` a standby of this server streaming as `name`: `standby.signal` and
    /// a `primary_conninfo`. Written here rather than by `pg_basebackup -R`: a newer
    /// `pg_basebackup` (the machine's, for a fetched server that has none) writes connection
    /// options an older server's libpq refuses (`sslsni` for 13).
    fn follow(&self, name: &str, data: &std::path::Path) -> Result<()> {
        use std::io::Write;
        fs::write(data.join("standby.signal"), "")
            .map_err(|e| other("cannot write standby.signal", e))?;
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(data.join("postgresql.auto.conf"))
            .map_err(|e| other("cannot open postgresql.auto.conf", e))?;
        writeln!(
            conf,
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={name}'",
            self.port
        )
        .map_err(|e| other("cannot write primary_conninfo", e))
    }

    /// Sets `synchronous_standby_names` (`ALTER SYSTEM` and a reload) and waits until new
    /// sessions see it; returns the value before.
    fn set_synchronous_standby_names(&self, names: &str) -> Result<String> {
        let previous = self
            .query_value("SHOW synchronous_standby_names", QUERY_TIMEOUT)?
            .unwrap_or_default();
        let statement = if names.is_empty() {
            "ALTER SYSTEM RESET synchronous_standby_names".to_owned()
        } else {
            format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{}'",
                names.replace('\'', "''")
            )
        };
        self.query(&statement, QUERY_TIMEOUT)?;
        self.query("SELECT pg_reload_conf()", QUERY_TIMEOUT)?;
        let mut now = String::new();
        let seen = poll_until(QUERY_TIMEOUT, Duration::from_millis(10), || {
            now = self
                .query_value("SHOW synchronous_standby_names", QUERY_TIMEOUT)?
                .unwrap_or_default();
            Ok((now == names).then_some(()))
        })?;
        match seen {
            Some(()) => Ok(previous),
            None => Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "synchronous_standby_names is {now:?}, not {names:?}, after ALTER SYSTEM and \
                     a reload: is it set with -c (TempPostgres::start_with)?"
                ),
            )),
        }
    }

    /// Waits until `standby` is in recovery and this server's `pg_stat_replication` shows it
    /// streaming with the `sync_state` `replication` asks for.
    fn wait_streaming(
        &self,
        standby: &TempPostgres,
        name: &str,
        replication: Replication,
    ) -> Result<()> {
        let expected = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let sql = format!(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        );
        let mut last = String::new();
        let streaming = poll_until(STREAMING_TIMEOUT, Duration::from_millis(20), || {
            // Connecting may fail while the standby is still starting: try again until the
            // deadline, then report what was last seen.
            last = match standby.in_recovery() {
                Ok(false) => {
                    return Err(Error::new(
                        ErrorKind::Other,
                        "the standby is not in recovery: it started as a primary",
                    ));
                }
                Ok(true) => match self.query(&sql, QUERY_TIMEOUT) {
                    Ok(rows) => match rows
                        .first()
                        .map(|row| (row[0].as_deref(), row[1].as_deref()))
                    {
                        Some((Some("streaming"), Some(state))) if state == expected => {
                            return Ok(Some(()));
                        }
                        Some((state, sync)) => format!("state {state:?}, sync_state {sync:?}"),
                        None => "not in pg_stat_replication".to_owned(),
                    },
                    Err(e) => format!("primary: {e}"),
                },
                Err(e) => format!("standby: {e}"),
            };
            Ok(None)
        })?;
        streaming.ok_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "the standby {name} was not streaming with sync_state {expected} within \
                     {STREAMING_TIMEOUT:?}: {last}"
                ),
            )
        })
    }

    /// `pg_is_in_recovery()`.
    fn in_recovery(&self) -> Result<bool> {
        Ok(self
            .query_value("SELECT pg_is_in_recovery()", QUERY_TIMEOUT)?
            .as_deref()
            == Some("t"))
    }

    /// The first column of the first row of `sql`.
    fn query_value(&self, sql: &str, timeout: Duration) -> Result<Option<String>> {
        Ok(self
            .query(sql, timeout)?
            .into_iter()
            .next()
            .and_then(|row| row.into_iter().next().flatten()))
    }

    /// Runs one statement over a new connection and returns its rows as text. It runs on a
    /// thread of its own with its own Tokio runtime, so it blocks as the rest of
    /// [`TempPostgres`] does, whether or not the caller is inside a runtime.
    fn query(&self, sql: &str, timeout: Duration) -> Result<Vec<Vec<Option<String>>>> {
        let mut config = self.pg_config();
        config
            .application_name(HELPER_NAME)
            .connect_timeout(QUERY_TIMEOUT);
        let run = async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            let connection = tokio::spawn(connection);
            let messages = client.simple_query(sql).await;
            drop(client);
            let _ = connection.await;
            let rows = messages?
                .into_iter()
                .filter_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect();
            Ok::<_, Error>(rows)
        };
        on_own_thread(&format!("{sql:?}"), timeout, run)
    }
}

/// Runs `work` to its end on a thread of its own with a Tokio runtime of its own, blocking as
/// the rest of [`TempPostgres`] does whether or not the caller is inside a runtime; a
/// [`ErrorKind::Timeout`] naming `what` past `timeout`.
pub(super) fn on_own_thread<T: Send>(
    what: &str,
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T>> + Send,
) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| other("cannot start a runtime", e))?;
                runtime.block_on(async {
                    tokio::time::timeout(timeout, work)
                        .await
                        .unwrap_or_else(|_| {
                            Err(Error::new(
                                ErrorKind::Timeout,
                                format!("{what} did not finish within {timeout:?}"),
                            ))
                        })
                })
            })
            .join()
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::Other, format!("{what} panicked"))))
    })
}

/// Connection settings that reach whichever of `servers` accepts writes: every server's
/// loopback address and port, in order, with `target_session_attrs=read-write`, as the
/// `postgres` superuser to the `postgres` database. Connecting tries each in turn and skips a
/// server that refuses the connection or is read-only (a standby), so after a failover
/// ([`TempPostgres::promote`]) new connections reach the promoted standby.
///
/// No `connect_timeout` is set: a paused server ([`TempPostgres::pause`]) accepts the TCP
/// connection and then does not answer, so connecting waits there. Set one on the returned
/// config; it bounds each server's TCP connect, while the startup handshake with a paused
/// server waits regardless, so wrap the connect in a timeout too.
pub fn failover_pg_config(servers: &[&TempPostgres]) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    for server in servers {
        config.host("127.0.0.1").port(server.port);
    }
    config
        .user("postgres")
        .dbname("postgres")
        .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    config
}

/// A WAL position as PostgreSQL writes it (`16/B374D848`: the high and low 32 bits in
/// hexadecimal), as one number that orders as the positions do.
fn parse_lsn(text: &str) -> Result<u64> {
    let parsed = text.split_once('/').and_then(|(high, low)| {
        let high = u32::from_str_radix(high, 16).ok()?;
        let low = u32::from_str_radix(low, 16).ok()?;
        Some((u64::from(high) << 32) | u64::from(low))
    });
    parsed.ok_or_else(|| Error::new(ErrorKind::Other, format!("not a WAL position: {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::parse_lsn;

    #[test]
    fn wal_positions_order_as_postgres_orders_them() {
        assert_eq!(parse_lsn("0/3000148").unwrap(), 0x3000148);
        assert_eq!(parse_lsn("16/B374D848").unwrap(), 0x16_B374_D848);
        // The high half counts more than any low half.
        assert!(parse_lsn("1/0").unwrap() > parse_lsn("0/FFFFFFFF").unwrap());
        for bad in ["", "0", "0/", "/0", "0/G", "1/2/3", "100000000/0", "-1/0"] {
            assert!(parse_lsn(bad).is_err(), "{bad:?}");
        }
    }
}
