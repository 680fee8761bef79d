//! The fault scenarios of docs/RELIABILITY.md, against a real PostgreSQL: holder processes that
//! are paused and killed, a server that is paused and restarted, and the lock-set checker's
//! verdict at the end of each.

mod checker;
mod clocks;
mod contention;
mod failover;
mod graceful;
mod mutation;
mod pauses;
mod restarts;
mod routing;
mod topic_consumers;
mod topics;
mod torture;

use std::sync::Arc;
use std::time::Duration;

use pgcoord::Config;
use pgcoord_faults::history::{Ack, History, Verdict};
use pgcoord_faults::linear::{self, Event};
use pgcoord_faults::process::HolderProcess;
use pgcoord_testkit::{TempPostgres, unique_name};
use tokio_postgres::Client;

/// Shows pgcoord's warnings in test output (`RUST_LOG` overrides the level).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// One workload: a server, a lock table, a history, and an admin client.
pub struct Workload {
    /// Present when the workload has a server of its own (to pause or restart it).
    pub server: Option<Arc<TempPostgres>>,
    pub dsn: String,
    pub table: String,
    pub prefix: String,
    pub history: History,
    /// A client for inspection; a scenario that restarts the server uses [`Workload::client`].
    pub admin: Client,
}

impl Workload {
    /// On a throwaway cluster of its own, which the scenario may pause, stop or restart.
    pub async fn own_server() -> Workload {
        let server = tokio::task::spawn_blocking(TempPostgres::start)
            .await
            .unwrap()
            .unwrap();
        let dsn = server.dsn();
        Workload::on(Some(Arc::new(server)), dsn).await
    }

    /// On a throwaway cluster of its own with durable commits (`synchronous_commit=on`), which
    /// the scenario may crash: an acknowledged write must survive an immediate shutdown. A
    /// session idle in a transaction is ended after 5 s, as OPERATIONS.md advises: a holder
    /// whose connection was black-holed mid-section would otherwise keep its fence's row lock
    /// (and so the lease) until the next restart.
    pub async fn own_durable_server() -> Workload {
        let server = tokio::task::spawn_blocking(|| {
            TempPostgres::start_with(&[
                ("synchronous_commit", "on"),
                ("idle_in_transaction_session_timeout", "5s"),
            ])
        })
        .await
        .unwrap()
        .unwrap();
        let dsn = server.dsn();
        Workload::on(Some(Arc::new(server)), dsn).await
    }

    /// On the test database (`DATABASE_URL` or the shared cluster), for scenarios that do not
    /// touch the server.
    pub async fn shared_server() -> Workload {
        let dsn = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => TempPostgres::shared().unwrap().dsn(),
        };
        Workload::on(None, dsn).await
    }

    /// On the server(s) `dsn` names.
    pub async fn on(server: Option<Arc<TempPostgres>>, dsn: String) -> Workload {
        init_tracing();
        let table = unique_name("locks");
        let prefix = unique_name("lockset");
        let config = Config::builder()
            .dsn(&dsn)
            .lock_table(&table)
            .build()
            .unwrap();
        let admin = pgcoord::db::connect_spawned(&config).await.unwrap();
        pgcoord::schema::migrate(&admin, &config).await.unwrap();
        let history = History::new(&prefix).unwrap();
        history.create(&admin).await.unwrap();
        Workload {
            server,
            dsn,
            table,
            prefix,
            history,
            admin,
        }
    }

    /// A configuration for an in-test manager on this workload's table.
    pub fn config(&self, owner: &str, lease: Duration, heartbeat: Duration) -> Config {
        Config::builder()
            .dsn(&self.dsn)
            .lock_table(&self.table)
            .owner(owner)
            .lease(lease)
            .heartbeat(heartbeat)
            .build()
            .unwrap()
    }

    /// Starts a holder process on lease `name` with `extra` arguments.
    pub fn holder(&self, process: &str, name: &str, extra: &[&str]) -> HolderProcess {
        self.holder_on(&self.dsn, process, name, extra)
    }

    /// Starts a holder process that reaches the server through `dsn` (a proxy's, say).
    pub fn holder_on(&self, dsn: &str, process: &str, name: &str, extra: &[&str]) -> HolderProcess {
        self.holder_with_env(dsn, process, name, extra, &[])
    }

    /// [`holder_on`](Self::holder_on) with variables added to the process's environment.
    pub fn holder_with_env(
        &self,
        dsn: &str,
        process: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> HolderProcess {
        let mut args: Vec<String> = [
            "--dsn",
            dsn,
            "--table",
            &self.table,
            "--history",
            &self.prefix,
            "--name",
            name,
            "--process",
            process,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        HolderProcess::spawn_with_env(env!("CARGO_BIN_EXE_holder"), &args, env)
    }

    /// A new client (the admin's session does not survive a restart of the server).
    pub async fn client(&self) -> Client {
        let config = Config::builder().dsn(&self.dsn).build().unwrap();
        pgcoord::db::connect_spawned(&config).await.unwrap()
    }

    /// The checker's verdict on everything acknowledged, read on a new session.
    pub async fn verdict(&self, acks: &[Ack]) -> Verdict {
        self.history
            .check(&self.client().await, acks)
            .await
            .unwrap()
    }
}

/// Operations per window of the linearizability check (a window ends at the first place past
/// it where nothing ahead may need placing before something behind). The tester remembers no
/// dead end: a window of 8 is checked in µs either way, one of 20 without a linearization takes
/// it seconds.
pub const WINDOW: usize = 8;

/// Asserts that the recorded operations are linearizable, and prints the check's figures.
/// Invariant I9 over every holder process's tenures: each lost lease told once, to its handle
/// and to its manager's subscriber; a release no loss. Every manager must have said so.
pub fn assert_losses_told_once(scenario: &str, holders: &mut [HolderProcess], managers: usize) {
    let mut losses = pgcoord_faults::losses::Losses::default();
    for holder in holders.iter_mut() {
        for line in holder.drain() {
            let _ = losses.add(line);
        }
    }
    eprintln!(
        "{scenario}: losses: {} tenures of {} managers, {} lost, {} told otherwise",
        losses.tenures,
        losses.managers,
        losses.lost,
        losses.broken.len()
    );
    assert_eq!(losses.managers, managers, "{losses:?}");
    assert!(losses.broken.is_empty(), "{losses:?}");
}

pub fn assert_linearizable(scenario: &str, events: &[Event]) {
    // `LINEAR_HISTORY_DIR=dir` keeps each scenario's history (`dir/<scenario>.history`, the
    // recorded lines), for `linear_check` to check again.
    if let Ok(dir) = std::env::var("LINEAR_HISTORY_DIR") {
        let lines: Vec<String> = events.iter().map(Event::line).collect();
        let path = std::path::Path::new(&dir).join(format!("{scenario}.history"));
        std::fs::write(&path, lines.join("\n")).unwrap();
        eprintln!("{scenario}: history kept in {}", path.display());
    }
    let report = linear::check(events, WINDOW);
    eprintln!("{scenario}: linearizability: {report}");
    assert!(report.is_linearizable(), "{report}");
    // stateright's tester, the reference, where its windows are narrow: it remembers no dead
    // end, and a short torture run's window of 40 operations has kept it searching for minutes.
    if report.widest <= 12 {
        let reference = linear::check_by_stateright(events, WINDOW);
        eprintln!("{scenario}: stateright's tester: {reference}");
        assert!(reference.is_linearizable(), "{reference}");
    }
}

/// Collects the messages of one type it receives.
pub struct Collector<M>(pub Arc<std::sync::Mutex<Vec<M>>>);

impl<M: actix::Message<Result = ()> + Unpin + Send + 'static> actix::Actor for Collector<M> {
    type Context = actix::Context<Self>;
}

impl<M: actix::Message<Result = ()> + Unpin + Send + 'static> actix::Handler<M> for Collector<M> {
    type Result = ();
    fn handle(&mut self, message: M, _: &mut actix::Context<Self>) {
        self.0.lock().unwrap().push(message);
    }
}

/// A started collector: what it received, and its recipient.
pub fn collector<M: actix::Message<Result = ()> + Unpin + Send + 'static>()
-> (Arc<std::sync::Mutex<Vec<M>>>, actix::Recipient<M>) {
    use actix::Actor;
    let received = Arc::default();
    let recipient = Collector(Arc::clone(&received)).start().recipient();
    (received, recipient)
}
