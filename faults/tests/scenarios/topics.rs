//! Durable topics (scenarios 21 and 22): concurrent appenders whose transactions commit out of
//! order — one held open for seconds, some rolled back — while a reader follows the topic; and
//! consumer processes SIGKILLed between their effects and their acks. The checker finds nothing
//! out of order, lost, phantom or late; fenced consumers apply each event exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::topic::{Cursor, TopicTable};
use pgcoord_faults::topic_history::{Append, Outcome, check};
use pgcoord_testkit::{test_pg_config, unique_name};

use super::topic_consumers::{Consumers, Mode, appender};
use tokio::sync::Mutex;

/// A small deterministic generator per appender (the scenario needs spread, not quality).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn appenders_committing_out_of_order_lose_nothing_and_keep_real_time_order() {
    let config = pgcoord::Config::builder()
        .pg_config(&test_pg_config().unwrap())
        .lock_table(unique_name("locks"))
        .topic_table(unique_name("topics"))
        .build()
        .unwrap();
    let admin = pgcoord::db::connect_spawned(&config).await.unwrap();
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    let table = Arc::new(TopicTable::new(&config));
    let appends = Arc::new(Mutex::new(Vec::<Append>::new()));
    let started = Instant::now();

    let mut appenders = Vec::new();
    for a in 0..6u64 {
        let (config, table, appends) = (config.clone(), table.clone(), appends.clone());
        appenders.push(tokio::spawn(async move {
            let mut client = pgcoord::db::connect_spawned(&config).await.unwrap();
            let mut random = Lcg(a + 1);
            for round in 0..40 {
                let began = Instant::now();
                let tx = client.transaction().await.unwrap();
                let mut cursors = Vec::new();
                for _ in 0..=random.below(3) {
                    let body = format!("{a}/{round}");
                    cursors.push(table.append(&tx, "t", body.as_bytes()).await.unwrap());
                }
                // Appender 0 holds its tenth transaction open for two seconds.
                let hold = if a == 0 && round == 10 {
                    2_000
                } else {
                    random.below(15)
                };
                tokio::time::sleep(Duration::from_millis(hold)).await;
                let outcome = if random.below(6) == 0 {
                    tx.rollback().await.unwrap();
                    Outcome::RolledBack
                } else {
                    tx.commit().await.unwrap();
                    Outcome::Committed(Instant::now())
                };
                let mut appends = appends.lock().await;
                for cursor in cursors {
                    appends.push(Append {
                        cursor,
                        began,
                        outcome,
                    });
                }
            }
        }));
    }

    // Follows the topic until it has as many events as were committed (known once the
    // appenders are done), within a bound.
    let expected = Arc::new(std::sync::OnceLock::<usize>::new());
    let reader = {
        let (config, table, expected) = (config.clone(), table.clone(), expected.clone());
        tokio::spawn(async move {
            let client = pgcoord::db::connect_spawned(&config).await.unwrap();
            let mut delivered = Vec::new();
            let mut cursor = Cursor::START;
            let mut empty_reads = 0;
            while expected.get().is_none_or(|n| delivered.len() < *n) {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "reader timed out"
                );
                let batch = table.read(&client, "t", cursor, 16).await.unwrap();
                match batch.events.last() {
                    Some(last) => cursor = last.cursor,
                    None => {
                        empty_reads += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                delivered.extend(batch.events.iter().map(|e| e.cursor));
            }
            (delivered, empty_reads)
        })
    };
    for appender in appenders {
        appender.await.unwrap();
    }
    let appends = appends.lock().await.clone();
    let committed = (appends.iter())
        .filter(|a| matches!(a.outcome, Outcome::Committed(_)))
        .count();
    expected.set(committed).unwrap();
    let (delivered, empty_reads) = reader.await.unwrap();
    let verdict = check(&appends, &delivered);
    eprintln!(
        "{} appends ({committed} committed), {verdict}, {empty_reads} empty reads, in {:?}",
        appends.len(),
        started.elapsed()
    );
    assert!(verdict.is_safe(), "{verdict}");
    assert_eq!(delivered.len(), committed, "every committed event, once");
}

/// Two consumer processes of one consumer name, the active one SIGKILLed four times while an
/// appender appends (a new process started each time): the applications, in the order they
/// were made, with the appends.
async fn killed_consumers(mode: Mode) -> (Vec<Append>, Vec<Cursor>) {
    let workload = super::Workload::shared_server().await;
    let consumers = Consumers::new(&workload, mode).await;
    let mut processes = vec![consumers.spawn("a0").await, consumers.spawn("b0").await];
    let appender = appender(consumers.config.clone(), 600, Duration::from_millis(8));
    let holder = format!(
        "SELECT owner FROM {} WHERE name = 't/consumers/c' AND expires_at > now()",
        consumers.config.lock_table().quoted()
    );
    let started = Instant::now();
    let mut last: i64 = 0;
    for kill in 0..4 {
        // Progress since the last kill, then the active process dies wherever it is.
        loop {
            assert!(started.elapsed() < Duration::from_secs(120), "no progress");
            let n = consumers.count(&workload.admin).await;
            if n >= last + 40 {
                last = n;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let active: Option<String> =
            (workload.admin.query_opt(&holder, &[]).await.unwrap()).and_then(|row| row.get(0));
        let Some(i) = processes
            .iter()
            .position(|(o, _)| Some(o) == active.as_ref())
        else {
            panic!("no process holds the consumer's lease: {active:?}");
        };
        let (owner, mut process) = processes.swap_remove(i);
        process.kill();
        eprintln!("killed {owner} after {last} applications");
        let next = format!("{}{}", &owner[..1], kill + 1);
        processes.push(consumers.spawn(&next).await);
    }
    let appends = appender.await.unwrap();
    let applied = consumers
        .until_applied(&workload.admin, &appends, Duration::from_secs(120))
        .await;
    (appends, applied)
}

#[actix_rt::test]
async fn a_consumer_killed_between_effect_and_fenced_ack_applies_each_event_exactly_once() {
    let (appends, applied) = killed_consumers(Mode::Fenced).await;
    let verdict = check(&appends, &applied);
    eprintln!("{} appends, 4 consumers killed: {verdict}", appends.len());
    assert!(verdict.is_safe(), "{verdict}");
    assert_eq!(applied.len(), appends.len(), "each event applied once");
}

#[actix_rt::test]
async fn a_consumer_killed_between_effect_and_ack_redelivers_from_its_cursor() {
    let (appends, applied) = killed_consumers(Mode::Plain).await;
    // Redeliveries are allowed (at least once): each restarts at or before the first event not
    // yet applied (nothing skipped) and repeats at most a window (16) of events.
    let mut first = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut repeated = 0;
    for cursor in &applied {
        if seen.insert(*cursor) {
            first.push(*cursor);
        } else {
            repeated += 1;
        }
    }
    let restarts = applied.windows(2).filter(|w| w[1] <= w[0]).count();
    let verdict = check(&appends, &first);
    eprintln!(
        "{} appends, 4 consumers killed: {verdict}; {repeated} redelivered in {restarts} restarts",
        appends.len()
    );
    assert!(verdict.is_safe(), "{verdict}");
    assert!(restarts <= 4, "a redelivery only after a kill");
    assert!(repeated <= 4 * 16, "at most a window again per kill");
}
