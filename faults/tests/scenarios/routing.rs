//! Routed messages across a member's SIGKILL and another's drain (scenario 25): three member
//! processes (`src/bin/member.rs`) serve 20 keys; one sender per key routes numbered messages
//! one after another while member `a` is SIGKILLed and member `b` drains. At most once: no
//! message applied twice; every message answered as handled applied once, every one answered
//! "not delivered" or with the worker's error not applied; each key's messages applied in the
//! order sent, under tokens that never go back; and the keys served again after both faults.
//! The same with durable mail (scenario 26): every message sent is applied exactly once, in
//! order, although a member dies and another drains while they flow.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord::ErrorKind;
use pgcoord_actors::{KeyRouter, ListenerActor, LockManager};
use pgcoord_faults::process::HolderProcess;
use pgcoord_testkit::unique_name;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Handled,
    /// `Timeout`: may or may not have been handled.
    Maybe,
    /// `Timeout`: no holder in time, not delivered.
    NotDelivered,
    /// The worker's error (its transaction rolled back), or another error.
    Failed,
}

fn member(workload: &super::Workload, applied: &str, owner: &str, extra: &[&str]) -> HolderProcess {
    let args: Vec<String> = [
        "--dsn",
        &workload.dsn,
        "--lock-table",
        &workload.table,
        "--applied",
        applied,
        "--owner",
        owner,
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    HolderProcess::spawn(env!("CARGO_BIN_EXE_member"), &args)
}

/// A table of the test's own for what the members apply (`src/bin/member.rs`).
async fn applied_table(workload: &super::Workload, prefix: &str) -> String {
    let applied = unique_name(prefix);
    (workload.admin)
        .batch_execute(&format!(
            "CREATE TABLE {applied} (id bigserial PRIMARY KEY, key text NOT NULL, n int8 NOT NULL,
             owner text NOT NULL, token int8 NOT NULL)"
        ))
        .await
        .unwrap();
    applied
}

/// What the members applied, in the order they did: every row, and `(n, owner, token)` by key.
async fn applied_by_key(
    workload: &super::Workload,
    applied: &str,
) -> (
    Vec<tokio_postgres::Row>,
    HashMap<String, Vec<(u64, String, i64)>>,
) {
    let rows = (workload.admin)
        .query(
            &format!("SELECT key, n, owner, token FROM {applied} ORDER BY id"),
            &[],
        )
        .await
        .unwrap();
    let mut by_key: HashMap<String, Vec<(u64, String, i64)>> = HashMap::new();
    for row in &rows {
        let (key, n, owner, token): (String, i64, String, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        by_key
            .entry(key)
            .or_default()
            .push((n as u64, owner, token));
    }
    (rows, by_key)
}

#[actix_rt::test]
async fn routed_messages_survive_a_killed_and_a_drained_member_at_most_once() {
    let workload = super::Workload::shared_server().await;
    let applied = applied_table(&workload, "routed").await;
    let mut members = HashMap::new();
    for owner in ["a", "b", "c"] {
        let mut process = member(&workload, &applied, owner, &["--keys", "20"]);
        process.expect("READY", Duration::from_secs(30)).await;
        members.insert(owner, process);
    }
    let config = workload.config("sender", Duration::from_secs(2), Duration::from_millis(500));
    let router = KeyRouter::new(
        "routed",
        LockManager::new(config.clone()).start(),
        ListenerActor::new(config, None).start_supervised(),
    );
    // One sender per key, numbered messages one after another, for 14 s.
    let started = Instant::now();
    let run_for = Duration::from_secs(14);
    let senders: Vec<_> = (0..20)
        .map(|k| {
            let (router, key) = (router.clone(), format!("k{k}"));
            actix::spawn(async move {
                let mut outcomes = Vec::new();
                let mut n = 0u64;
                while started.elapsed() < run_for {
                    let timeout = Duration::from_secs(3);
                    let asked = Instant::now();
                    let payload = pgcoord::signal::to_payload(&n).unwrap();
                    let answer = router.ask(&key, payload, timeout).await;
                    // Every call answers within its timeout, whatever the members do.
                    let took = asked.elapsed();
                    assert!(
                        took < timeout + Duration::from_millis(500),
                        "{key} {n}: {took:?}"
                    );
                    let outcome = match answer {
                        Ok(_) => Outcome::Handled,
                        Err(e) if e.kind() == ErrorKind::Timeout => {
                            if e.to_string().contains("may or may not") {
                                Outcome::Maybe
                            } else {
                                Outcome::NotDelivered
                            }
                        }
                        Err(e) => {
                            eprintln!("{key} {n}: {e}");
                            Outcome::Failed
                        }
                    };
                    outcomes.push((n, outcome));
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (key, outcomes)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    members.get_mut("a").unwrap().kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = members.get_mut("b").unwrap();
    b.terminate();
    b.expect("DRAINED", Duration::from_secs(20)).await;
    let mut sent = HashMap::new();
    for sender in senders {
        let (key, outcomes) = sender.await.unwrap();
        sent.insert(key, outcomes);
    }

    let (rows, by_key) = applied_by_key(&workload, &applied).await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (key, outcomes) in &sent {
        let rows = by_key.get(key).cloned().unwrap_or_default();
        let ns: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "{key}: once each, in order: {ns:?}"
        );
        assert!(
            rows.windows(2).all(|w| w[0].2 <= w[1].2),
            "{key}: a token went back: {rows:?}"
        );
        for (n, outcome) in outcomes {
            let was_applied = ns.contains(n);
            match outcome {
                Outcome::Handled => assert!(was_applied, "{key} {n} answered but not applied"),
                Outcome::NotDelivered | Outcome::Failed => {
                    assert!(
                        !was_applied,
                        "{key} {n} applied though answered {outcome:?}"
                    )
                }
                Outcome::Maybe => {}
            }
            *counts.entry(format!("{outcome:?}").leak()).or_default() += 1;
        }
        assert!(
            ns.iter().all(|n| outcomes.iter().any(|(m, _)| m == n)),
            "{key}: applied unsent"
        );
        // Served again after both faults: the last messages were handled (by c).
        let last = &outcomes[outcomes.len().saturating_sub(3)..];
        assert!(
            last.iter().all(|(_, o)| *o == Outcome::Handled),
            "{key}: {last:?}"
        );
        assert_eq!(
            rows.last().map(|r| r.1.as_str()),
            Some("c"),
            "{key} ends on c"
        );
    }
    eprintln!("outcomes: {counts:?}; {} rows applied", rows.len());
    members.get_mut("c").unwrap().kill();
}

#[actix_rt::test]
async fn durable_mail_survives_a_killed_and_a_drained_member_exactly_once() {
    let workload = super::Workload::shared_server().await;
    let topics = pgcoord::Config::builder()
        .dsn(&workload.dsn)
        .lock_table(&workload.table)
        .topic_table(unique_name("mail"))
        .build()
        .unwrap();
    pgcoord::schema::migrate(&workload.admin, &topics)
        .await
        .unwrap();
    let applied = applied_table(&workload, "mailed").await;
    let topic_table = topics.topic_table().name().as_str().to_owned();
    let mut members = HashMap::new();
    // Owners of their own: a routed pool's channel is its name's and owner's, so members named
    // as the routed scenario's would also answer that scenario's senders on this server.
    for owner in ["mail-a", "mail-b", "mail-c"] {
        let extra = ["--keys", "200", "--mail", "--topic-table", &topic_table];
        let mut process = member(&workload, &applied, owner, &extra);
        process.expect("READY", Duration::from_secs(30)).await;
        members.insert(owner, process);
    }
    // 10,000 messages: each of 200 keys' numbered in order, each in a transaction of its own.
    let table = pgcoord::topic::TopicTable::new(&topics);
    let sender = pgcoord::db::connect_spawned(&topics).await.unwrap();
    let keys: Vec<String> = (0..200).map(|k| format!("k{k}")).collect();
    let sent = 50u64;
    for n in 0..sent {
        for key in &keys {
            let topic = pgcoord_actors::mail_topic("routed", key);
            table.append_value(&sender, &topic, &n).await.unwrap();
        }
        if n == 15 {
            members.get_mut("mail-a").unwrap().kill();
        }
        if n == 30 {
            let mut b = members.remove("mail-b").unwrap();
            b.terminate();
            actix::spawn(async move { b.expect("DRAINED", Duration::from_secs(30)).await });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every message applied once: mail-c holds every key by now and reads what is left.
    let count = format!("SELECT count(*) FROM {applied}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let applied: i64 = workload.admin.query_one(&count, &[]).await.unwrap().get(0);
        if applied as u64 >= sent * 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{applied} of {} applied",
            sent * 200
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rows, by_key) = applied_by_key(&workload, &applied).await;
    let mut owners: HashMap<String, usize> = HashMap::new();
    for key in &keys {
        let rows = &by_key[key];
        let ns: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(
            ns,
            (0..sent).collect::<Vec<u64>>(),
            "{key}: each once, in order"
        );
        assert!(
            rows.windows(2).all(|w| w[0].2 <= w[1].2),
            "{key}: a token went back"
        );
        for (_, owner, _) in rows {
            *owners.entry(owner.clone()).or_default() += 1;
        }
    }
    eprintln!(
        "{} messages applied exactly once; by member: {owners:?}",
        rows.len()
    );
    members.get_mut("mail-c").unwrap().kill();
}
