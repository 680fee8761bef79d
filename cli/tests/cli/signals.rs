//! `notify` and `listen`.

use super::*;

#[tokio::test]
async fn notify_and_listen_speak_pgcoords_envelopes() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let channel = unique_name("events");
    let mut listener = Command::new(env!("CARGO_BIN_EXE_pgcoord"))
        .env("DATABASE_URL", dsn())
        .args([
            "--lock-table",
            &table,
            "--payload-table",
            &format!("{table}_p"),
        ])
        .args(["listen", &channel, "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It is listening once its session has run the LISTEN on the channel (a cold process may
    // take longer than any fixed sleep).
    let client = pgcoord::db::connect_spawned(&config(&table, "admin"))
        .await
        .unwrap();
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%LISTEN%{channel}%' \
         AND state = 'idle' AND pid <> pg_backend_pid()"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client
        .query_one(&listening, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        if std::time::Instant::now() > deadline {
            let _ = listener.kill();
            panic!("the listener never listened");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let small = pgcoord(
        &table,
        &["notify", &channel, r#"{"job": 42, "tags": ["a", "b"]}"#],
    );
    assert!(small.status.success(), "{small:?}");
    // Larger than a notification: through the payload store, fetched by `listen`.
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(10_000));
    assert!(
        pgcoord(&table, &["notify", &channel, &big])
            .status
            .success()
    );
    let out = listener.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["payload"]["job"], 42);
    assert_eq!(lines[0]["kind"], "event");
    assert_eq!(lines[1]["payload"]["blob"].as_str().unwrap().len(), 10_000);
    // Bad input: exit code 2.
    assert_eq!(
        pgcoord(&table, &["notify", &channel, "{not json"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        pgcoord(&table, &["notify", &"c".repeat(64), "1"])
            .status
            .code(),
        Some(2)
    );
}

#[tokio::test]
async fn listen_reconnects_and_says_where_messages_were_missed() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let channel = unique_name("events");
    let listener = pgcoord_command(&table, &["listen", &channel, "--count", "1"])
        .spawn()
        .unwrap();
    let client = pgcoord::db::connect_spawned(&config(&table, "admin"))
        .await
        .unwrap();
    // The listener's backend, found by the LISTEN it ran on its unique channel.
    let listening = format!(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE '%{channel}%' \
         AND pid <> pg_backend_pid()"
    );
    let wait_for_listener = async || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let rows = client.query(&listening, &[]).await.unwrap();
            if let Some(row) = rows.first() {
                return row.get::<_, i32>(0);
            }
            assert!(std::time::Instant::now() < deadline, "no listener");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let first = wait_for_listener().await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while wait_for_listener().await == first {
        assert!(std::time::Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = pgcoord(&table, &["notify", &channel, r#"{"after": true}"#]);
    assert!(sent.status.success(), "{sent:?}");
    let out = listener.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0]["gap"].as_str().unwrap().contains("missed"),
        "{lines:?}"
    );
    assert_eq!(lines[1]["payload"]["after"], true);
}
