//! `pgcoord lock run NAME -- COMMAND…`: runs a command while holding a lease, as `etcdctl lock`
//! and `consul lock` do.
//!
//! The lease is waited for (in line, at most `--timeout`), then the command starts with
//! `PGCOORD_LEASE_NAME`, `PGCOORD_LEASE_TOKEN` and `PGCOORD_LEASE_OWNER` in its environment, so
//! its writes can be fenced by the token. The lease is renewed every third of its duration on a connection of its
//! own. When it is lost — taken, freed by force, or its deadline passed unrenewed (measured on
//! this process's monotonic clock from the moment each renewal was sent, less the runtime's
//! margin, so before the server's) — the command gets SIGTERM, then SIGKILL after
//! `--kill-after`, and `pgcoord` exits with [`LOST`]. When the command exits first, the lease is
//! released and `pgcoord` exits with the command's code. SIGTERM, SIGINT and SIGHUP sent to
//! `pgcoord` are passed to the command; SIGTSTP stops the command with `pgcoord`.
//!
//! The command runs in a process group of its own and every signal goes to the group, so the
//! processes a script started stop with it; any it leaves running when it exits are stopped
//! (SIGTERM, SIGKILL after `--kill-after`) before the lease is released. If `pgcoord` dies —
//! SIGKILL included — its watchdog kills the group (`group.rs`).
//!
//! `pgcoord elect NAME -- COMMAND…` is the same with the lease as an election's (the runtime's
//! `Election` of that name): once elected it proclaims `--value` (observers hear of the new
//! leader and its value), and the term's end is announced even when no candidate waits. It looks
//! for a resign request (`pgcoord resign NAME`, `Election::request_resign`) at each renewal: when
//! asked, the command gets SIGTERM (SIGKILL after `--kill-after`), the term ends when it exits,
//! and `pgcoord` exits with the command's code.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use pgcoord::lease::margin;
use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{Config, Error, ErrorKind, LeaseTable, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};

use crate::group::{self, Watchdog};

/// The exit code when the lease was lost while the command ran.
pub(crate) const LOST: u8 = 5;

/// How often a waiter tries again.
const POLL: Duration = Duration::from_millis(200);

/// What `lock run` was asked.
pub(crate) struct Hold {
    pub(crate) name: String,
    pub(crate) command: Vec<String>,
    /// How long the lease is waited for.
    pub(crate) wait: Duration,
    /// How long the command's group has between SIGTERM and SIGKILL.
    pub(crate) kill_after: Duration,
    /// For `elect`: the value the leader proclaims.
    pub(crate) proclaim: Option<Vec<u8>>,
}

/// Runs `hold`; the exit code `pgcoord` ends with.
pub(crate) async fn run(config: &Config, hold: Hold) -> Result<u8> {
    pgcoord::lease::check_name(&hold.name)?;
    let Some((program, args)) = hold.command.split_first() else {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "no command: pgcoord lock run NAME -- COMMAND [ARGS…]",
        ));
    };
    let table = LeaseTable::new(config);
    let owner = table.owner(config.owner())?;
    let lease = config.lease();
    // Held as the runtime holds a lease: given up a margin before the server's deadline.
    let held_for = lease - margin(lease);
    // Before any connection is opened: the watchdog holds no socket.
    let mut watchdog = Watchdog::start().map_err(io)?;
    let deadline = Instant::now() + hold.wait;
    let within = |what: &str| {
        Error::new(
            ErrorKind::Timeout,
            format!("{what} within {:?} (--timeout)", hold.wait),
        )
    };
    let mut client = timeout_at(deadline, pgcoord::db::connect_spawned(config))
        .await
        .map_err(|_| within("no connection to the database"))??;

    // Wait in line until granted, or until the wait's deadline.
    let (token, mut valid_until) = loop {
        let sent = Instant::now();
        let left = deadline.saturating_duration_since(sent);
        let mut request = AcquireRequest::new(&hold.name);
        if let Some(value) = &hold.proclaim {
            request = request.data(value).replace_data();
        }
        let attempt = timeout_at(
            deadline,
            owner.try_acquire_or_queue(&client, &request, lease, left),
        )
        .await;
        let holder = match attempt {
            Ok(Ok(Attempt::Granted(grant))) => break (grant.token, sent + held_for),
            Ok(Ok(Attempt::Held(holder))) => holder,
            Ok(Ok(Attempt::Busy)) => None,
            Ok(Err(e)) => return Err(e),
            Err(_) => None,
        };
        if Instant::now() + POLL >= deadline {
            // Out of line, so the next waiter is not held up by this one (bounded: best effort).
            let _ = timeout(
                config.statement_timeout(),
                owner.leave_line(&client, &hold.name),
            )
            .await;
            return Err(Error::not_acquired(&hold.name, holder));
        }
        sleep(POLL).await;
    };
    let announce = hold.proclaim.is_some();
    if let Some(value) = &hold.proclaim {
        // The value is stored (the grant's data); this announces the new leader to observers.
        let proclaimed = timeout_at(
            valid_until,
            owner.proclaim(&client, &hold.name, token, value),
        );
        match proclaimed.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_lock_lost() => {
                eprintln!("pgcoord: elected, then lost {:?} at once ({e})", hold.name);
                return Ok(LOST);
            }
            Ok(Err(e)) => eprintln!(
                "pgcoord: elected, but the announcement failed ({e}); observers learn at their next poll"
            ),
            Err(_) => eprintln!(
                "pgcoord: elected, but the announcement did not answer; observers learn at their next poll"
            ),
        }
    }

    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("PGCOORD_LEASE_NAME", &hold.name)
        .env("PGCOORD_LEASE_TOKEN", token.to_string())
        .env("PGCOORD_LEASE_OWNER", config.owner())
        .kill_on_drop(true);
    watchdog.guard(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            // Its group, if it had one, ended with it.
            watchdog.disarm();
            release(config, &table, &client, &hold.name, token, announce).await;
            let why = if e.raw_os_error() == Some(libc::EPIPE) {
                format!("the watchdog that stops it should pgcoord die is gone ({e})")
            } else {
                e.to_string()
            };
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("cannot run {program}: {why}"),
            ));
        }
    };
    // Its pid is its group's id (set before exec); known until the child is waited for.
    let pgid = child.id().expect("a child not waited for has a pid") as i32;
    let mut terminate = signal(SignalKind::terminate()).map_err(io)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(io)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(io)?;
    let mut suspend = signal(SignalKind::from_raw(libc::SIGTSTP)).map_err(io)?;
    let heartbeat = config.heartbeat().unwrap_or(lease / 3);
    let mut next_renewal = Instant::now() + heartbeat;
    // Asked to resign (looked for no more), and when the group gets SIGKILL if it has not ended.
    let mut asked = false;
    let mut kill_at: Option<Instant> = None;
    // The command's status once it exited, while processes it left in its group are stopped.
    let mut exited: Option<ExitStatus> = None;
    let lost = loop {
        tokio::select! {
            status = child.wait(), if exited.is_none() => {
                let status = status.map_err(io)?;
                if !group::alive(pgid) {
                    watchdog.disarm();
                    release(config, &table, &client, &hold.name, token, announce).await;
                    return Ok(exit_code(status));
                }
                // Its group's other members may be ending with it: looked at again in a moment.
                exited = Some(status);
            }
            _ = sleep(POLL), if exited.is_some() => {
                if !group::alive(pgid) {
                    watchdog.disarm();
                    release(config, &table, &client, &hold.name, token, announce).await;
                    return Ok(exit_code(exited.unwrap_or_default()));
                }
                if kill_at.is_none() {
                    // They must not run on without the lease: stopped before it is released.
                    eprintln!(
                        "pgcoord: the command exited, leaving processes in its group: stopping them"
                    );
                    group::signal(pgid, libc::SIGTERM);
                    kill_at = Some(Instant::now() + hold.kill_after);
                }
            }
            _ = terminate.recv() => group::signal(pgid, libc::SIGTERM),
            _ = interrupt.recv() => group::signal(pgid, libc::SIGINT),
            _ = hangup.recv() => group::signal(pgid, libc::SIGHUP),
            _ = suspend.recv() => {
                // Stopped together: the command must not run on while the lease goes unrenewed.
                group::signal(pgid, libc::SIGSTOP);
                // SAFETY: raise has no memory preconditions; it returns once pgcoord is continued.
                unsafe { libc::raise(libc::SIGSTOP) };
                group::signal(pgid, libc::SIGCONT);
            }
            _ = sleep_until(kill_at.unwrap_or(valid_until)), if kill_at.is_some() => {
                eprintln!("pgcoord: the command outlived --kill-after: SIGKILL");
                kill_at = None;
                group::signal(pgid, libc::SIGKILL);
                if let Some(status) = exited {
                    watchdog.disarm();
                    release(config, &table, &client, &hold.name, token, announce).await;
                    return Ok(exit_code(status));
                }
            }
            _ = sleep_until(valid_until) => break "its deadline passed unrenewed",
            _ = sleep_until(next_renewal) => {
                if client.is_closed() {
                    // A new session for the renewals; the lease is the server's, not the session's.
                    let connect = timeout_at(valid_until, pgcoord::db::connect_spawned(config));
                    if let Ok(Ok(fresh)) = connect.await {
                        client = fresh;
                    }
                }
                let sent = Instant::now();
                let held = [(&hold.name, token)];
                let renew = owner.renew(&client, &held, lease);
                match timeout_at(valid_until, renew).await {
                    Ok(Ok(renewed)) if renewed.contains(&token) => {
                        valid_until = sent + held_for;
                        next_renewal = sent + heartbeat;
                        if announce && !asked {
                            let look = owner.resign_requested(&client, &hold.name, token);
                            if let Ok(Ok(true)) = timeout_at(valid_until, look).await {
                                asked = true;
                                eprintln!(
                                    "pgcoord: asked to step down from {:?}: stopping the command",
                                    hold.name
                                );
                                group::signal(pgid, libc::SIGTERM);
                                kill_at = Some(Instant::now() + hold.kill_after);
                            }
                        }
                    }
                    Ok(Ok(_)) => break "it was taken or freed",
                    // Tried again soon, until the deadline says it is lost.
                    Ok(Err(_)) | Err(_) => next_renewal = Instant::now() + POLL,
                }
            }
        }
    };
    eprintln!(
        "pgcoord: lease {:?} lost ({lost}): stopping the command",
        hold.name
    );
    group::signal(pgid, libc::SIGTERM);
    let ended = async {
        let _ = child.wait().await;
        while group::alive(pgid) {
            sleep(POLL).await;
        }
    };
    if timeout(hold.kill_after, ended).await.is_err() {
        eprintln!("pgcoord: the command outlived --kill-after: SIGKILL");
        group::signal(pgid, libc::SIGKILL);
        let _ = child.wait().await;
    }
    watchdog.disarm();
    Ok(LOST)
}

/// Releases the lease, bounded by the statement timeout; a failure leaves it to expire. An
/// election's end is announced even when nobody waits (`announce`): observers do not line up.
async fn release(
    config: &Config,
    table: &LeaseTable,
    client: &tokio_postgres::Client,
    name: &str,
    token: i64,
    announce: bool,
) {
    let Ok(owner) = table.owner(config.owner()) else {
        return;
    };
    let request = ReleaseRequest {
        name,
        token,
        keep: false,
        announce_always: announce,
    };
    let released = timeout(config.statement_timeout(), owner.release(client, &request)).await;
    if !matches!(released, Ok(Ok(()))) {
        eprintln!(
            "pgcoord: lease {name:?} not released; it expires in {:?}",
            config.lease()
        );
    }
}

/// The command's exit code, or 128 plus the signal that ended it, as shells report it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => 1,
    }
}

fn io(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Other, e.to_string()).with_source(e)
}
