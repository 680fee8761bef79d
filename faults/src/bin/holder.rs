//! A holder process for the fault suite: one or more `LockManager`s in their own process,
//! doing fenced critical sections on one lease, reporting each event on a line of its own (see
//! `pgcoord_faults::process`).
//!
//! ```text
//! holder --dsn DSN --table LOCKS --history PREFIX --name LEASE --process ID
//!        [--managers N] [--rounds N] [--hold-ms N] [--lease-ms N] [--heartbeat-ms N]
//!        [--statement-timeout-ms N] [--hold [--write-every-ms N]]
//! ```
//!
//! Rounds (the default): each of `--managers` managers (default 1) acquires the lease, runs one
//! critical section of up to `--hold-ms` (random), releases, `--rounds` times (default 1), then
//! the process prints `DONE <sections>` and exits. `--hold`: one manager acquires the lease once
//! and runs a critical section every `--write-every-ms` (default 100) until the lease is lost
//! or a section is rejected, then prints `LOST` and exits.
//!
//! Each manager reads the register (`pgcoord_faults::linear`) before each round (each section
//! with `--hold`), writes a value of its own in each section, and prints an `OP` line before
//! and after each acquire, write, read and release.

use std::time::Duration;

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{Acquire, Lease, LockLost, LockManager, SubscribeLockLost};
use pgcoord_faults::history::History;
use pgcoord_faults::linear::{Op, Recorder, Ret};
use pgcoord_faults::losses::Ended;
use pgcoord_faults::program::{arg, flag, need, number};

struct Args {
    dsn: String,
    table: String,
    history: String,
    name: String,
    process: String,
    managers: usize,
    rounds: usize,
    hold: Duration,
    lease: Duration,
    heartbeat: Duration,
    statement_timeout: Option<Duration>,
    hold_mode: bool,
    write_every: Duration,
}

fn args() -> Args {
    Args {
        dsn: need("--dsn"),
        table: need("--table"),
        history: need("--history"),
        name: need("--name"),
        process: need("--process"),
        managers: number("--managers", 1) as usize,
        rounds: number("--rounds", 1) as usize,
        hold: Duration::from_millis(number("--hold-ms", 0)),
        lease: Duration::from_millis(number("--lease-ms", 2000)),
        heartbeat: Duration::from_millis(number("--heartbeat-ms", 400)),
        statement_timeout: arg("--statement-timeout-ms")
            .map(|v| Duration::from_millis(v.parse().expect("--statement-timeout-ms"))),
        hold_mode: flag("--hold"),
        write_every: Duration::from_millis(number("--write-every-ms", 100)),
    }
}

/// Prints one event line at once.
fn say(line: String) {
    pgcoord_faults::program::say(&line);
}

fn config(args: &Args, owner: &str) -> Config {
    let mut builder = Config::builder()
        .dsn(&args.dsn)
        .lock_table(&args.table)
        .owner(owner)
        .application_name(format!("holder {owner}"))
        .lease(args.lease)
        .heartbeat(args.heartbeat);
    if let Some(timeout) = args.statement_timeout {
        builder = builder.statement_timeout(timeout);
    }
    builder.build().expect("valid configuration")
}

/// A random duration up to `max`, from std's randomly keyed hasher.
fn up_to(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    if max.is_zero() {
        return max;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    Duration::from_micros(h.finish() % max.as_micros().max(1) as u64)
}

/// The holder's own connection for its fenced transactions, opened again after it failed (a
/// restart, a terminated session) or stopped answering (a black-holed network), as an
/// application would.
async fn reconnect(config: &Config, client: &mut tokio_postgres::Client, stuck: bool) {
    if !stuck && !client.is_closed() {
        return;
    }
    for _ in 0..600 {
        if let Ok(fresh) = pgcoord::db::connect_spawned(config).await {
            *client = fresh;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    say("ERROR cannot reconnect".into());
}

/// How long a critical section may take before its connection is taken for dead: its writes
/// are then not acknowledged (they may or may not have committed; the checker sees both).
const SECTION_BOUND: Duration = Duration::from_secs(1);

/// How long the holder's own connection may take to answer a ping before each round.
const PING_BOUND: Duration = Duration::from_millis(300);

/// Reads the register, recorded; false when the connection did not answer.
async fn read(history: &History, client: &tokio_postgres::Client, record: &mut Recorder) -> bool {
    record.invoke(Op::Read);
    match tokio::time::timeout(SECTION_BOUND, history.read(client)).await {
        Ok(Ok(value)) => {
            record.complete(Some(Ret::Value(value)));
            true
        }
        _ => {
            record.complete(None);
            false
        }
    }
}

/// Acquires the lease, recorded.
async fn acquire(
    manager: &Addr<LockManager>,
    args: &Args,
    record: &mut Recorder,
) -> pgcoord::Result<Lease> {
    let acquire = Acquire::new(&args.name).timeout(Duration::from_secs(60));
    record.invoke(Op::Acquire);
    let granted = manager.send(acquire).await.expect("manager running");
    record.complete(match &granted {
        Ok(lease) => Some(Ret::Granted(lease.token())),
        Err(e) if e.is_not_acquired() => Some(Ret::NotGranted),
        Err(_) => None,
    });
    granted
}

/// Releases `lease`, recorded; what the release answered, and whether its handle reported a loss.
async fn release(lease: Lease, record: &mut Recorder) -> (Option<Ret>, bool) {
    let token = lease.token();
    let ended = lease.lost();
    record.invoke(Op::Release { token });
    let answer = match lease.release().await {
        Ok(()) => Some(Ret::Released),
        Err(e) if e.is_lock_lost() => Some(Ret::Lost),
        Err(_) => None,
    };
    record.complete(answer);
    // The tenure has ended: its handle says how at once.
    (answer, ended.await.is_some())
}

/// Counts the losses a manager tells its `SubscribeLockLost` subscriber, by token.
#[derive(Default)]
struct Losses(std::collections::HashMap<i64, u32>);

impl Actor for Losses {
    type Context = Context<Self>;
}

impl Handler<LockLost> for Losses {
    type Result = ();
    fn handle(&mut self, lost: LockLost, _: &mut Context<Self>) {
        *self.0.entry(lost.token.unwrap_or(-1)).or_default() += 1;
    }
}

/// The counts so far (every loss told before this message was sent is counted).
#[derive(Message)]
#[rtype(result = "std::collections::HashMap<i64, u32>")]
struct Counted;

impl Handler<Counted> for Losses {
    type Result = MessageResult<Counted>;
    fn handle(&mut self, _: Counted, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.clone())
    }
}

/// The value a tenure's `nth` write sets: unique, and says whose it is.
fn value(lease: &Lease, nth: i64) -> i64 {
    lease.token() * 1_000_000 + nth
}

async fn rounds(args: &Args, history: &History, index: usize) -> usize {
    let owner = format!("{}-{index}", args.process);
    let config = config(args, &owner);
    let mut record = Recorder::printing(&owner);
    let mut client = pgcoord::db::connect_spawned(&config)
        .await
        .expect("connect");
    let manager = LockManager::new(config.clone()).start();
    let losses = Losses::default().start();
    (manager.send(SubscribeLockLost(losses.clone().recipient())))
        .await
        .expect("the manager is running");
    let mut ended = Vec::new();
    let mut sections = 0;
    let mut stuck = false;
    for _ in 0..args.rounds {
        // A connection black-holed since its last section is found before the lease is
        // taken, not inside the section while the lease waits.
        stuck |= pgcoord::__private::ping(&client, PING_BOUND).await.is_err();
        reconnect(&config, &mut client, stuck).await;
        // The register, outside the lease.
        stuck = !read(history, &client, &mut record).await;
        reconnect(&config, &mut client, stuck).await;
        stuck = false;
        let lease = match acquire(&manager, args, &mut record).await {
            Ok(lease) => lease,
            Err(e) => {
                say(format!("ERROR acquire: {e}"));
                continue;
            }
        };
        let (token, value) = (lease.token(), value(&lease, 0));
        let section =
            history.section_setting(&mut client, &lease, &owner, Some(value), up_to(args.hold));
        record.invoke(Op::Write { token, value });
        let outcome = tokio::time::timeout(SECTION_BOUND, section).await;
        // Only the fence's refusal is sure to have written nothing.
        record.complete(match &outcome {
            Ok(Ok(_)) => Some(Ret::Written),
            Ok(Err(e)) if e.is_lock_lost() => Some(Ret::Rejected),
            _ => None,
        });
        match outcome {
            Ok(Ok(ack)) => {
                sections += 1;
                say(format!("ACK {} {}", ack.token, ack.write));
            }
            Ok(Err(e)) if e.is_lock_lost() => say(format!("REJECTED {token}")),
            Ok(Err(e)) => say(format!("ERROR section: {e}")),
            Err(_) => {
                stuck = true;
                say("ERROR section: no answer in time".into());
            }
        }
        let token = lease.token();
        let (answer, handle_told) = release(lease, &mut record).await;
        ended.push(Ended {
            token,
            answer,
            handle_told,
        });
    }
    // Every loss the manager told was sent before its release answered.
    let told = losses.send(Counted).await.expect("the counter is running");
    say(pgcoord_faults::losses::line(&owner, &ended, &told));
    sections
}

async fn hold(args: &Args, history: &History) {
    let owner = format!("{}-0", args.process);
    let config = config(args, &owner);
    let mut record = Recorder::printing(&owner);
    let mut client = pgcoord::db::connect_spawned(&config)
        .await
        .expect("connect");
    let manager = LockManager::new(config.clone()).start();
    let lease = acquire(&manager, args, &mut record)
        .await
        .expect("acquired");
    say(format!("HELD {}", lease.token()));
    let lost = lease.lost();
    tokio::pin!(lost);
    for nth in 0.. {
        tokio::select! {
            reason = &mut lost => {
                say(format!("LOST {} {}", lease.token(), loss(reason)));
                return;
            }
            _ = tokio::time::sleep(args.write_every) => {}
        }
        let (token, value) = (lease.token(), value(&lease, nth));
        let section = async {
            reconnect(&config, &mut client, false).await;
            read(history, &client, &mut record).await;
            record.invoke(Op::Write { token, value });
            let outcome = history
                .section_setting(&mut client, &lease, &owner, Some(value), Duration::ZERO)
                .await;
            record.complete(match &outcome {
                Ok(_) => Some(Ret::Written),
                Err(e) if e.is_lock_lost() => Some(Ret::Rejected),
                Err(_) => None,
            });
            outcome
        };
        // A section on a connection cut off hangs: the loss, reported on the manager's own
        // clock, is said all the same (the section's outcome left unknown).
        let outcome = tokio::select! {
            reason = &mut lost => {
                say(format!("LOST {} {}", lease.token(), loss(reason)));
                return;
            }
            outcome = section => outcome,
        };
        match outcome {
            Ok(ack) => say(format!("ACK {} {}", ack.token, ack.write)),
            Err(e) if e.is_lock_lost() => {
                say(format!("REJECTED {token}"));
                // The manager reports the loss itself at its next renewal or deadline.
                let reason = lost.await;
                say(format!("LOST {token} {}", loss(reason)));
                return;
            }
            Err(e) => say(format!("ERROR section: {e}")),
        }
    }
}

/// How a tenure ended, for the `LOST` line: the loss's reason, or `Released`.
fn loss(reason: Option<pgcoord_actors::LossReason>) -> String {
    reason.map_or("Released".into(), |r| format!("{r:?}"))
}

#[actix::main]
async fn main() {
    let args = args();
    let history = History::new(&args.history).expect("history prefix");
    say("READY".into());
    if args.hold_mode {
        hold(&args, &history).await;
        return;
    }
    let runs: Vec<_> = (0..args.managers)
        .map(|index| rounds(&args, &history, index))
        .collect();
    let sections: usize = futures_util::future::join_all(runs).await.into_iter().sum();
    say(format!("DONE {sections}"));
}
