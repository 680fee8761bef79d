//! `topics` and `schedules`: the durable tables an operator inspects and mends.

use super::*;

/// `topics`: the topics, a topic's consumers and their lag, its last events, and a cursor
/// reset (refused without `--force`, typed errors for a bad cursor or an unknown consumer).
#[tokio::test]
async fn topics_lists_consumers_tails_and_resets_a_cursor() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "admin");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let topics = pgcoord::TopicTable::new(&config);
    for body in ["first", "second", "third"] {
        topics
            .append(&client, "orders", body.as_bytes())
            .await
            .unwrap();
    }
    let start = pgcoord::topic::Start::Oldest;
    topics
        .open_consumer(&client, "orders", "billing", start)
        .await
        .unwrap();

    let text = stdout(&pgcoord(&table, &["topics"]));
    let line = text.lines().find(|l| l.starts_with("orders")).expect(&text);
    assert!(line.contains(" 3 "), "{line}");
    let out = pgcoord(&table, &["topics", "consumers", "orders"]);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("billing"))
        .expect(&text);
    assert!(line.contains("0/0") && line.contains(" 3 "), "{line}");
    // The tail waits for the horizon like any reader: other tests' transactions hold it back
    // for moments.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = stdout(&pgcoord(
            &table,
            &["topics", "tail", "orders", "--count", "2"],
        ));
        if text.contains("2 event(s)") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        text.contains("  second\n") && text.contains("  third\n"),
        "{text}"
    );
    assert!(!text.contains("first"), "{text}");

    let reset = ["topics", "reset", "orders", "billing", "--to", "now"];
    assert_eq!(
        pgcoord(&table, &reset).status.code(),
        Some(2),
        "needs --force"
    );
    let mut forced = reset.to_vec();
    forced.push("--force");
    let out = pgcoord(&table, &forced);
    assert!(out.status.success(), "{out:?}");
    let moved = topics.cursor(&client, "orders", "billing").await.unwrap();
    assert!(moved > pgcoord::topic::Cursor::START, "{moved}");
    let back = [
        "topics", "reset", "orders", "billing", "--to", "oldest", "--force",
    ];
    assert!(pgcoord(&table, &back).status.success());
    let start_again = topics.cursor(&client, "orders", "billing").await.unwrap();
    assert_eq!(start_again, pgcoord::topic::Cursor::START);
    let bad = [
        "topics", "reset", "orders", "billing", "--to", "7", "--force",
    ];
    assert_eq!(pgcoord(&table, &bad).status.code(), Some(2));
    let nobody = [
        "topics", "reset", "orders", "nobody", "--to", "oldest", "--force",
    ];
    assert_eq!(pgcoord(&table, &nobody).status.code(), Some(3));
}

/// `schedules`: each schedule's latest tick, and one schedule's runs, newest first.
#[tokio::test]
async fn schedules_lists_the_latest_tick_of_each_and_one_schedules_runs() {
    use pgcoord::schedule::{RunState, ScheduleTable};
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "admin");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let runs = ScheduleTable::new(&config);
    let hour = |h: u64| std::time::UNIX_EPOCH + Duration::from_secs(3600 * h);
    for (schedule, h, state, error) in [
        ("rollup", 1, RunState::Done, None),
        ("rollup", 2, RunState::Failed, Some("disk full")),
        ("vacuum", 1, RunState::Done, None),
    ] {
        let claimed = runs
            .claim(&client, schedule, hour(h), 7, "worker-1")
            .await
            .unwrap();
        assert_eq!(claimed, Some(1));
        runs.finish(
            &client,
            schedule,
            hour(h),
            7,
            1,
            state,
            error,
            Some(hour(h + 1)),
        )
        .await
        .unwrap();
    }

    let out = pgcoord(&table, &["schedules"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let rollup = text.lines().find(|l| l.starts_with("rollup")).expect(&text);
    assert!(
        rollup.contains("1970-01-01T02:00:00") && rollup.contains("failed"),
        "the latest tick: {rollup}"
    );
    assert!(
        rollup.contains("worker-1") && rollup.ends_with("disk full"),
        "{rollup}"
    );
    assert!(text.lines().any(|l| l.starts_with("vacuum")), "{text}");
    assert!(text.contains("2 run(s)"), "{text}");

    let out = pgcoord(&table, &["schedules", "rollup", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<&str> = (listed.as_array().unwrap().iter())
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["failed", "done"], "newest first: {listed}");
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(
        pgcoord(&table, &["schedules", &"x".repeat(300)])
            .status
            .code(),
        Some(2),
        "a bad name is bad input"
    );
}

/// A prepared transaction holds readers back as an open one does, and has no backend: `topics`
/// names it by its gid. (A cluster of its own, with prepared transactions on.)
#[tokio::test]
async fn topics_names_a_prepared_transaction_that_holds_readers_back() {
    let server = tokio::task::spawn_blocking(|| {
        TempPostgres::start_with(&[("max_prepared_transactions", "2")])
    })
    .await
    .unwrap()
    .unwrap();
    let table = unique_name("cli");
    let run = |args: &[&str]| {
        let mut command = pgcoord_command(&table, args);
        command.env("DATABASE_URL", server.dsn());
        command.output().unwrap()
    };
    assert!(run(&["migrate"]).status.success());
    let config = Config::builder()
        .pg_config(&server.pg_config())
        .build()
        .unwrap();
    let preparer = pgcoord::db::connect_spawned(&config).await.unwrap();
    preparer
        .batch_execute("BEGIN; SELECT pg_current_xact_id(); PREPARE TRANSACTION 'stuck-migration'")
        .await
        .unwrap();
    let out = run(&["topics"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    preparer
        .batch_execute("ROLLBACK PREPARED 'stuck-migration'")
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("the prepared transaction \"stuck-migration\""),
        "{said}"
    );
}
