//! Another language in the same fleet: a Python program (psycopg, the migrations' SQL functions)
//! run under `pgcoord lock`, fencing with the token the Rust holder got, appending events a Rust
//! consumer reads in order, and acking as a consumer.

use pgcoord::TopicTable;
use pgcoord::topic::{Cursor, Start};

use super::*;

/// A Python 3 with psycopg (3): Debian's `python3-psycopg` installs it for `/usr/bin/python3`.
fn python() -> &'static str {
    for candidate in ["/usr/bin/python3", "python3"] {
        let found = Command::new(candidate)
            .args(["-c", "import psycopg"])
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return candidate;
        }
    }
    panic!("no python3 with psycopg (install python3-psycopg)");
}

#[tokio::test]
async fn a_python_member_fences_appends_and_acks_in_the_same_fleet() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "rust-consumer");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let resource = format!("{table}_resource");
    client
        .batch_execute(&format!("CREATE TABLE {resource} (v text)"))
        .await
        .unwrap();
    let topics = TopicTable::new(&config);
    (topics.open_consumer(&client, "fleet", "python", Start::Oldest))
        .await
        .unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cli/fleet.py");
    let run = pgcoord_command(&table, &["lock", "job", "--", python(), script])
        .env("FLEET_DSN", dsn())
        .env("FLEET_LOCK_TABLE", &table)
        .env("FLEET_TOPIC_TABLE", format!("{table}_t"))
        .env("FLEET_RESOURCE", &resource)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let said = stdout(&run);
    assert!(
        said.contains(r#"read ['first', '{"n": 2}', 'third']"#),
        "{said}"
    );
    assert!(said.contains("acked True"), "{said}");
    assert!(said.contains("refused PC001"), "{said}");

    // The fenced write committed; the stale one did not.
    let written: Vec<String> = (client.query(&format!("SELECT v FROM {resource}"), &[]))
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(written, ["from python"]);
    // A Rust reader reads the Python events in their order, and the Python consumer's cursor
    // stands after the second.
    let events = topics
        .read(&client, "fleet", Cursor::START, 10)
        .await
        .unwrap()
        .events;
    let bodies: Vec<&[u8]> = events.iter().map(|e| e.body.as_slice()).collect();
    assert_eq!(bodies, [&b"first"[..], br#"{"n": 2}"#, b"third"]);
    assert_eq!(
        topics.cursor(&client, "fleet", "python").await.unwrap(),
        events[1].cursor
    );
}
