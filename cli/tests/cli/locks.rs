//! `migrate`, `locks`, `lock show`, `lock release`, `limit`, `advisory` and `status`: listings and
//! what they show.

use super::*;

#[tokio::test]
async fn migrate_list_show_and_force_release_a_lease() {
    let table = unique_name("cli");
    let out = pgcoord(&table, &["migrate"]);
    assert!(out.status.success(), "{out:?}");
    let config = config(&table, "worker-1");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let leases = LeaseTable::new(&config);
    let Attempt::Granted(grant) = leases
        .owner("worker-1")
        .unwrap()
        .try_acquire(
            &client,
            &AcquireRequest::new("job").data(b"node-a"),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!("free")
    };

    let out = pgcoord(&table, &["locks"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let line = text.lines().find(|l| l.starts_with("job ")).expect(&text);
    assert!(
        line.contains("worker-1") && line.contains(&grant.token.to_string()),
        "{line}"
    );
    assert!(line.ends_with("  node-a"), "the data, as text: {line}");

    let out = pgcoord(&table, &["lock", "show", "job"]);
    assert!(stdout(&out).contains("held:    true"), "{out:?}");
    // Missing: exit code 3; without --force: 2, and nothing changes.
    assert_eq!(
        pgcoord(&table, &["lock", "show", "nope"]).status.code(),
        Some(3)
    );
    assert_eq!(
        pgcoord(&table, &["lock", "release", "job"]).status.code(),
        Some(2)
    );
    assert!(leases.get(&client, "job").await.unwrap().is_held());

    let out = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(out.status.success(), "{out:?}");
    // The holder's next renewal finds nothing: the loss it reports.
    let renewed = leases
        .owner("worker-1")
        .unwrap()
        .renew(&client, &[("job", grant.token)], Duration::from_secs(30))
        .await
        .unwrap();
    assert!(renewed.is_empty());
    assert_eq!(
        pgcoord(&table, &["lock", "release", "job", "--force"])
            .status
            .code(),
        Some(3)
    );
}

#[tokio::test]
async fn limit_shows_sets_and_lowers_a_stored_limit_and_a_forced_release_keeps_its_slot() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let out = pgcoord(&table, &["limit", "tenant:42"]);
    assert_eq!(out.status.code(), Some(3), "no limit yet: {out:?}");
    let out = pgcoord(&table, &["limit", "tenant:42", "2"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out).trim(), "limit of \"tenant:42\": 2");
    assert_eq!(
        stdout(&pgcoord(&table, &["limit", "tenant:42"])).trim(),
        "2"
    );

    let config = config(&table, "worker-1");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let leases = LeaseTable::new(&config);
    let owner = leases.owner("worker-1").unwrap();
    let slots = pgcoord::lease::slot_names("tenant:42", 2).unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        let attempt = owner
            .try_acquire_limited(&client, "tenant:42", &slots, 2, Duration::from_secs(30))
            .await
            .unwrap();
        let pgcoord::lease::LimitedAttempt::Granted { slot, grant } = attempt else {
            panic!("{attempt:?}")
        };
        held.push((slot, grant.token));
    }
    held.sort();
    // Forced free, a limited slot's row stays: the slot can be granted again.
    let out = pgcoord(&table, &["lock", "release", &held[0].0, "--force"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!leases.get(&client, &held[0].0).await.unwrap().is_held());
    // Lowered: the higher slot is taken back.
    let out = pgcoord(&table, &["limit", "tenant:42", "1"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("2 -> 1") && text.contains("1 permit(s) taken back"),
        "{text}"
    );
    let renewed = owner
        .renew(
            &client,
            &[(held[1].0.as_str(), held[1].1)],
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(renewed.is_empty());
    let attempt = owner
        .try_acquire_limited(&client, "tenant:42", &slots, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(&attempt, pgcoord::lease::LimitedAttempt::Granted { slot, .. } if *slot == held[0].0),
        "{attempt:?}"
    );
    assert_eq!(
        pgcoord(&table, &["limit", "x", "10001"]).status.code(),
        Some(2)
    );
}

#[tokio::test]
async fn poll_only_sends_no_notify_and_refuses_listen_and_notify() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "ears");
    let (ears, mut connection) = pgcoord::__private::connect(&config).await.unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    let channel = config.lease_channel().as_str().to_owned();
    let listen = format!("LISTEN {}", config.lease_channel().quoted());
    ears.batch_execute(&listen).await.unwrap();
    // Raising a limit notifies; with --poll-only it does not.
    for permits in ["1", "2"] {
        let out = pgcoord(&table, &["--poll-only", "limit", "jobs", permits]);
        assert!(out.status.success(), "{out:?}");
    }
    (ears.execute("SELECT pg_notify($1, 'marker')", &[&channel]))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(first.unwrap().as_deref(), Some("marker"));
    for args in [
        &["--poll-only", "listen", "jobs"][..],
        &["--poll-only", "notify", "jobs", "1"],
    ] {
        let out = pgcoord(&table, args);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--poll-only"),
            "{out:?}"
        );
    }
}

#[tokio::test]
async fn listings_fit_their_data_decode_it_show_waiters_and_speak_json() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "worker-1");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let leases = LeaseTable::new(&config);
    // A name longer than any fixed column, and MessagePack data as the runtime stores a value.
    let long = format!(
        "tenant:{}:nightly-report-for-the-whole-region",
        "x".repeat(40)
    );
    let packed = rmp_serde::to_vec_named(&serde_json::json!({"job": 42})).unwrap();
    let request = AcquireRequest::new(&long).data(&packed);
    let owner = leases.owner("worker-1").unwrap();
    let Attempt::Granted(grant) = owner
        .try_acquire(&client, &request, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("free")
    };
    // Someone in line for it.
    let waiter = leases.owner("worker-2").unwrap();
    let queued = waiter
        .try_acquire_or_queue(
            &client,
            &AcquireRequest::new(&long),
            Duration::from_secs(30),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(queued, Attempt::Held(_)), "{queued:?}");

    let text = stdout(&pgcoord(&table, &["locks"]));
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let row = lines.next().unwrap();
    // Each column starts where its header does: widths come from the data.
    for column in ["OWNER", "WAITERS", "DATA"] {
        let at = header.find(column).unwrap();
        assert!(
            row.len() > at && &row[at - 2..at] == "  ",
            "{column}:\n{text}"
        );
    }
    assert!(row.starts_with(&long), "{text}");
    assert!(row.ends_with(r#"{"job":42}"#), "decoded: {text}");

    let json: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "locks"]).stdout).unwrap();
    let lease = &json.as_array().unwrap()[0];
    assert_eq!(lease["name"], long.as_str());
    assert_eq!(lease["owner"], "worker-1");
    assert_eq!(lease["token"], grant.token);
    assert_eq!(lease["waiters"], 1);
    assert_eq!(lease["data"]["job"], 42);
    assert!(lease["left"].as_f64().unwrap() > 20.0, "{lease}");

    let shown: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "lock", "show", &long]).stdout)
            .unwrap();
    assert_eq!(shown["waiters"][0]["waiter"], "worker-2");
    let text = stdout(&pgcoord(&table, &["lock", "show", &long]));
    assert!(text.contains("waiters: 1\n  worker-2 ("), "{text}");

    // Advisory locks by one bigint key and by two int keys, negative ones included.
    client
        .execute("SELECT pg_advisory_lock($1::int8)", &[&-5_000_000_000_i64])
        .await
        .unwrap();
    client
        .execute("SELECT pg_advisory_lock(3, -4)", &[])
        .await
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "advisory"]).stdout).unwrap();
    let keys: Vec<&str> = (json.as_array().unwrap().iter())
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"-5000000000"), "{json}");
    assert!(keys.contains(&"3,-4"), "{json}");

    let status: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "status"]).stdout).unwrap();
    assert_eq!(status["leases"]["held"], 1, "{status}");
}

#[tokio::test]
async fn advisory_and_status_show_sessions_and_clear_errors_for_a_bad_database() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let mut pg = test_pg_config().unwrap();
    pg.application_name("holder-app");
    let (holder, connection) = pg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    holder
        .execute("SELECT pg_advisory_lock(-77)", &[])
        .await
        .unwrap();
    let out = pgcoord(&table, &["advisory"]);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains("holder-app"))
        .expect(&text);
    assert!(line.contains("-77") && line.contains("held"), "{line}");

    let out = pgcoord(&table, &["status"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("holder-app"), "{text}");
    assert!(text.contains("leases: 0 held"), "{text}");

    // An unreachable database: exit 1 and the cause; no DSN at all: 2.
    let out = Command::new(env!("CARGO_BIN_EXE_pgcoord"))
        .args([
            "--dsn",
            "host=127.0.0.1 port=1 user=x connect_timeout=1",
            "locks",
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{out:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_pgcoord"))
        .arg("locks")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn a_limit_change_past_its_timeout_is_cancelled_on_the_server() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    assert!(
        pgcoord(&table, &["limit", "tenant:7", "1"])
            .status
            .success()
    );
    let config = config(&table, "worker-1");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let leases = LeaseTable::new(&config);
    let owner = leases.owner("worker-1").unwrap();
    let slots = pgcoord::lease::slot_names("tenant:7", 1).unwrap();
    let attempt = owner
        .try_acquire_limited(&client, "tenant:7", &slots, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let pgcoord::lease::LimitedAttempt::Granted { slot, grant } = attempt else {
        panic!("{attempt:?}")
    };
    // The holder in a fenced transaction: taking its permit back waits for that transaction.
    let mut fenced = pgcoord::db::connect_spawned(&config).await.unwrap();
    let tx = fenced.transaction().await.unwrap();
    owner.fence(&tx, &slot, grant.token).await.unwrap();

    let out = pgcoord(&table, &["limit", "tenant:7", "0", "--timeout", "1"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cancelled on the server"), "{err}");
    // It got as far as taking the permit back: the new limit is stored.
    assert_eq!(leases.limit(&client, "tenant:7").await.unwrap(), Some(0));
    // Nothing of the command is left waiting on the server (it waited until the transaction
    // ended when the command only dropped its statement).
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE application_name = 'pgcoord-cli' AND wait_event_type = 'Lock'
                     AND query LIKE '%' || $1 || '%'";
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while client
        .query_one(waiting, &[&table])
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the change still waits"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn long_names_are_shortened_in_the_middle_in_tables_and_whole_in_json() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "worker-1");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let long = format!("tenant-7:{}:job-42", "x".repeat(200));
    let leases = LeaseTable::new(&config);
    let owner = leases.owner("worker-1").unwrap();
    let granted = owner
        .try_acquire(
            &client,
            &AcquireRequest::new(&long),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted(_)), "{granted:?}");

    let text = stdout(&pgcoord(&table, &["locks"]));
    let row = text.lines().nth(1).unwrap();
    assert!(row.chars().count() < 150, "{text}");
    // Its tenant and its id kept, the middle given way.
    assert!(row.starts_with("tenant-7:xxx"), "{text}");
    assert!(row.contains("xxx:job-42  worker-1"), "{text}");
    assert!(row.contains('…'), "{text}");
    assert!(text.ends_with("1 lease(s) (… marks text shortened: --json has it whole)\n"));
    let json: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "locks"]).stdout).unwrap();
    assert_eq!(json[0]["name"], long.as_str());
}
