//! The built `pgcoord` binary against a throwaway cluster: every command, its output and its
//! exit code, a module per command.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{Config, LeaseTable};
use pgcoord_testkit::{TempPostgres, test_pg_config, unique_name};

mod connection;
mod locks;
mod migrate;
mod observe;
mod other_language;
mod run;
mod signals;
mod terminal;
mod topics;
mod ui;

/// The DSN of the test database (`DATABASE_URL`, else the shared throwaway cluster).
fn dsn() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            test_pg_config().unwrap();
            TempPostgres::shared().unwrap().dsn()
        }
    }
}

fn pgcoord(table: &str, args: &[&str]) -> Output {
    pgcoord_command(table, args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn config(table: &str, owner: &str) -> Config {
    Config::builder()
        .pg_config(&test_pg_config().unwrap())
        .lock_table(table)
        .payload_table(format!("{table}_p"))
        .topic_table(format!("{table}_t"))
        .schedule_table(format!("{table}_s"))
        .owner(owner)
        .build()
        .unwrap()
}

/// `pgcoord` with the test database and `table`'s names, to be spawned.
fn pgcoord_command(table: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgcoord"));
    command
        .env("DATABASE_URL", dsn())
        .args([
            "--lock-table",
            table,
            "--payload-table",
            &format!("{table}_p"),
            "--topic-table",
            &format!("{table}_t"),
            "--schedule-table",
            &format!("{table}_s"),
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits (at most 10 s) until `pgcoord lock show name` finds the lease held.
fn wait_until_held(table: &str, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pgcoord(table, &["lock", "show", name]).status.success() {
        assert!(std::time::Instant::now() < deadline, "{name} never held");
        std::thread::sleep(Duration::from_millis(50));
    }
}
