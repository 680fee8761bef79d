//! What the durable-topic scenarios share: consumer processes (`src/bin/consumer.rs`) applying a
//! topic to a table of their own, the applications read back, and an appender that survives a
//! failover.

use std::time::{Duration, Instant};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord_faults::process::HolderProcess;
use pgcoord_faults::topic_history::{Append, Outcome};
use pgcoord_testkit::unique_name;

/// How the consumer processes apply events (`src/bin/consumer.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Effect and ack in one transaction: each event exactly once.
    Fenced,
    /// Effect, then the runtime's ack: each event at least once.
    Plain,
}

/// A topic table, a table its consumer processes apply events to, and how to start them.
pub(super) struct Consumers {
    pub(super) config: pgcoord::Config,
    dsn: String,
    lock_table: String,
    applied: String,
    mode: Mode,
}

impl Consumers {
    /// The tables, on `workload`'s server.
    pub(super) async fn new(workload: &super::Workload, mode: Mode) -> Consumers {
        let config = pgcoord::Config::builder()
            .dsn(&workload.dsn)
            .lock_table(&workload.table)
            .topic_table(unique_name("topics"))
            .build()
            .unwrap();
        let applied = unique_name("applied");
        pgcoord::schema::migrate(&workload.admin, &config)
            .await
            .unwrap();
        (workload.admin)
            .batch_execute(&format!(
                "CREATE TABLE {applied} (n bigserial PRIMARY KEY, xid int8 NOT NULL,
                 position int8 NOT NULL, owner text NOT NULL, token int8 NOT NULL)"
            ))
            .await
            .unwrap();
        Consumers {
            config,
            dsn: workload.dsn.clone(),
            lock_table: workload.table.clone(),
            applied,
            mode,
        }
    }

    /// A consumer process named `owner`, consuming once it said `READY`.
    pub(super) async fn spawn(&self, owner: &str) -> (String, HolderProcess) {
        let args: Vec<String> = [
            "--dsn",
            &self.dsn,
            "--lock-table",
            &self.lock_table,
            "--topic-table",
            self.config.topic_table().name().as_str(),
            "--applied",
            &self.applied,
            "--owner",
            owner,
            "--mode",
            if self.mode == Mode::Fenced {
                "fenced"
            } else {
                "plain"
            },
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut process = HolderProcess::spawn(env!("CARGO_BIN_EXE_consumer"), &args);
        process.expect("READY", Duration::from_secs(30)).await;
        (owner.to_owned(), process)
    }

    /// The applications so far, in the order they were made.
    pub(super) async fn applied(&self, client: &tokio_postgres::Client) -> Vec<Cursor> {
        let sql = format!("SELECT xid, position FROM {} ORDER BY n", self.applied);
        (client.query(&sql, &[]).await.unwrap().iter())
            .map(|r| Cursor {
                xid: r.get(0),
                position: r.get(1),
            })
            .collect()
    }

    /// Waits (within `bound`) until every committed append has been applied; the
    /// applications.
    pub(super) async fn until_applied(
        &self,
        client: &tokio_postgres::Client,
        appends: &[Append],
        bound: Duration,
    ) -> Vec<Cursor> {
        let committed: std::collections::HashSet<Cursor> = (appends.iter())
            .filter(|a| matches!(a.outcome, Outcome::Committed(_)))
            .map(|a| a.cursor)
            .collect();
        let deadline = Instant::now() + bound;
        loop {
            let applied = self.applied(client).await;
            let done = committed.iter().filter(|c| applied.contains(c)).count();
            if done == committed.len() {
                return applied;
            }
            if Instant::now() >= deadline {
                let mut missing: Vec<_> = (committed.iter())
                    .filter(|c| !applied.contains(c))
                    .collect();
                missing.sort();
                panic!(
                    "{done} of {} committed events applied; missing {missing:?}; the last \
                     applied {:?}; {}",
                    committed.len(),
                    applied.iter().rev().take(3).collect::<Vec<_>>(),
                    self.diagnosis(client).await,
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What a stuck consumer leaves to see: its stored cursor and lag, and the server's open
    /// transactions and horizon (what holds readers back).
    async fn diagnosis(&self, client: &tokio_postgres::Client) -> String {
        let consumers = TopicTable::new(&self.config).consumers(client, "t").await;
        let activity = client
            .query(
                "SELECT format('%s %s xid=%s xmin=%s app=%s age=%s q=%s', pid, state,
                        backend_xid, backend_xmin, application_name,
                        now() - xact_start, left(query, 60))
                 FROM pg_stat_activity
                 WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL
                 UNION ALL SELECT 'horizon ' || pg_snapshot_xmin(pg_current_snapshot())",
                &[],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get(0)).collect::<Vec<String>>());
        format!("consumers {consumers:?}; activity {activity:?}")
    }

    /// How many applications there are now.
    pub(super) async fn count(&self, client: &tokio_postgres::Client) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.applied);
        client.query_one(&sql, &[]).await.unwrap().get(0)
    }
}

/// Appends `n` events to topic `t`, one transaction each, `every` apart, on a connection opened
/// again after a failure (a failover): an append whose answer was lost is `Unknown`.
pub(super) fn appender(
    config: pgcoord::Config,
    n: u32,
    every: Duration,
) -> tokio::task::JoinHandle<Vec<Append>> {
    tokio::spawn(async move {
        let table = TopicTable::new(&config);
        let mut client = pgcoord::db::connect_spawned(&config).await.ok();
        let mut appends = Vec::new();
        let started = Instant::now();
        for i in 0..n {
            while client.as_ref().is_none_or(|c| c.is_closed()) {
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "no connection"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                client = pgcoord::db::connect_spawned(&config).await.ok();
            }
            let began = Instant::now();
            let c = client.as_ref().unwrap();
            // The cursor is known before the commit: the append is its own statement in an
            // explicit transaction, whose COMMIT may go unanswered (then `Unknown`).
            let appended = async {
                c.batch_execute("BEGIN").await.ok()?;
                let Ok(cursor) = table.append(c, "t", &i.to_be_bytes()).await else {
                    let _ = c.batch_execute("ROLLBACK").await;
                    return None;
                };
                Some(match c.batch_execute("COMMIT").await {
                    Ok(()) => (cursor, Outcome::Committed(Instant::now())),
                    Err(_) => (cursor, Outcome::Unknown),
                })
            };
            match appended.await {
                Some((cursor, outcome)) => appends.push(Append {
                    cursor,
                    began,
                    outcome,
                }),
                // Not appended: on a connection that failed, most likely.
                None => client = None,
            }
            tokio::time::sleep(every).await;
        }
        appends
    })
}
