//! The built `pgcoord` binary against a throwaway cluster: every command, its output and its
//! exit code.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord::{Config, LeaseTable};
use pgcoord_testkit::{TempPostgres, test_pg_config, unique_name};

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
async fn notify_and_listen_speak_pgcoords_envelopes() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let channel = unique_name("events");
    let listener = Command::new(env!("CARGO_BIN_EXE_pgcoord"))
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
    std::thread::sleep(Duration::from_millis(500)); // it is listening
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

/// A server that accepts and then answers too slowly: the command gives up at `--timeout` with
/// exit code 1 and says so, instead of hanging the operator's terminal.
#[tokio::test]
async fn a_database_that_does_not_answer_in_time_ends_the_command_at_its_timeout() {
    let pg = test_pg_config().unwrap();
    let proxy = pgcoord_testkit::Proxy::start(&pg).await.unwrap();
    proxy.delay(Duration::from_secs(3));
    let via = proxy.pg_config(&pg);
    let dsn = format!(
        "host=127.0.0.1 port={} user={} dbname={} connect_timeout=30",
        via.get_ports()[0],
        via.get_user().unwrap(),
        via.get_dbname().unwrap()
    );
    for command in [&["locks"][..], &["listen", "anything"][..]] {
        let started = std::time::Instant::now();
        let out = tokio::task::spawn_blocking({
            let (dsn, command) = (dsn.clone(), command.to_vec());
            move || {
                Command::new(env!("CARGO_BIN_EXE_pgcoord"))
                    .args(["--dsn", &dsn, "--timeout", "1"])
                    .args(command)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(1), "{command:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--timeout"),
            "{out:?}"
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "{command:?} took {took:?}");
    }
}

/// Over TLS with `sslmode=verify-full`, as against a managed database: the command works with
/// the right root certificate and says what failed with another (exit 1).
#[tokio::test]
async fn the_command_connects_over_verified_tls_and_says_why_it_cannot() {
    let server = TempPostgres::shared_tls().unwrap();
    let dsn = |root: &str| {
        format!(
            "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={root}",
            server.port()
        )
    };
    let table = unique_name("cli_tls");
    let run = |dsn: String, command: &str| {
        Command::new(env!("CARGO_BIN_EXE_pgcoord"))
            .args(["--dsn", &dsn, "--lock-table", &table, command])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    };
    let root = server.root_cert().unwrap().display().to_string();
    let out = run(dsn(&root), "migrate");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = run(dsn(&root), "locks");
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let other = pgcoord_testkit::CertificateAuthority::new("someone else").unwrap();
    let wrong = std::env::temp_dir().join(format!("{}.pem", unique_name("wrong_root")));
    std::fs::write(&wrong, other.certificate_pem()).unwrap();
    let out = run(dsn(&wrong.display().to_string()), "locks");
    let _ = std::fs::remove_file(&wrong);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not signed by a trusted root"), "{stderr}");
}

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

/// `--help` names the variable the DSN may come from, never its value (it holds a password).
#[test]
fn help_never_prints_the_dsn() {
    let out = Command::new(env!("CARGO_BIN_EXE_pgcoord"))
        .arg("--help")
        .env("DATABASE_URL", "postgresql://app:s3cret-pw@db.internal/app")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("DATABASE_URL"), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
}

/// A database without pgcoord's tables: exit code 4 and a hint to migrate, not a bare SQLSTATE;
/// `--timeout` takes a unit.
#[test]
fn missing_tables_have_their_own_exit_code_and_a_hint() {
    let table = unique_name("never_migrated");
    let out = pgcoord(&table, &["locks", "--timeout", "10s"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pgcoord migrate"), "{stderr}");
    let out = pgcoord(&table, &["locks", "--timeout", "soon"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("500ms"),
        "{out:?}"
    );
}

/// Without --dsn and DATABASE_URL, the PG* variables say where the database is, as for psql;
/// with none of them, exit 2 and what to set.
#[test]
fn the_pg_variables_name_the_database_when_no_dsn_is_given() {
    let pg = test_pg_config().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let table = unique_name("cli_env");
    let run = |args: &[&str], with_pg: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pgcoord"));
        command
            .env_remove("DATABASE_URL")
            .args(["--lock-table", &table]);
        for name in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSWORD",
            "PGPASSFILE",
        ] {
            command.env_remove(name);
        }
        if with_pg {
            command
                .env("PGHOST", &host)
                .env("PGPORT", pg.get_ports()[0].to_string())
                .env("PGUSER", pg.get_user().unwrap())
                .env("PGDATABASE", pg.get_dbname().unwrap_or("postgres"));
        }
        command.args(args).output().unwrap()
    };
    let out = run(&["migrate"], true);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["locks"], true);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["locks"], false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("PG*"),
        "{out:?}"
    );
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

#[test]
fn lock_run_holds_the_lease_while_its_command_runs_and_exits_with_its_code() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script =
        r#"echo "$PGCOORD_LEASE_NAME $PGCOORD_LEASE_TOKEN $PGCOORD_LEASE_OWNER"; sleep 1; exit 7"#;
    let first = pgcoord_command(&table, &["lock", "run", "job", "--", "sh", "-c", script])
        .spawn()
        .unwrap();
    wait_until_held(&table, "job");
    // While the first holds it, a second run that waits 200 ms gives up, its command not run.
    let args = [
        "--timeout",
        "200ms",
        "lock",
        "run",
        "job",
        "--",
        "echo",
        "ran",
    ];
    let second = pgcoord(&table, &args);
    assert_eq!(second.status.code(), Some(6), "{second:?}");
    assert!(!stdout(&second).contains("ran"), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("held"),
        "{second:?}"
    );
    // The first's command saw its lease, and its exit code is pgcoord's.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(7), "{first:?}");
    let seen = stdout(&first);
    let [name, token, owner]: [&str; 3] = (seen.split_whitespace().collect::<Vec<_>>())
        .try_into()
        .unwrap_or_else(|_| panic!("{seen}"));
    assert_eq!(name, "job");
    assert!(token.parse::<i64>().unwrap() > 0, "{seen}");
    // Each run its own identity (host, pid, random): two runs never share one.
    assert!(
        owner.len() > "pgcoord-cli".len() && owner != "pgcoord-cli",
        "{seen}"
    );
    // Released at once when the command exited, not left to expire.
    let show = pgcoord(&table, &["lock", "show", "job"]);
    assert_eq!(show.status.code(), Some(3), "{show:?}");
    let third = pgcoord(
        &table,
        &["--timeout", "1s", "lock", "run", "job", "--", "true"],
    );
    assert_eq!(third.status.code(), Some(0), "{third:?}");
    // No command: a usage error.
    let none = pgcoord(&table, &["lock", "run", "job"]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
}

#[test]
fn lock_run_stops_its_command_when_the_lease_is_lost() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    // A command that runs until told to stop, and says it was.
    let script = r#"trap 'echo stopped; exit 0' TERM; while true; do sleep 0.1; done"#;
    let args = [
        "lock", "run", "--lease", "3s", "job", "--", "sh", "-c", script,
    ];
    let holder = pgcoord_command(&table, &args).spawn().unwrap();
    wait_until_held(&table, "job");
    let freed = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(freed.status.success(), "{freed:?}");
    let started = std::time::Instant::now();
    let holder = holder.wait_with_output().unwrap();
    // Seen at the next renewal (a third of the lease): well within one lease.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "stopped after {took:?}");
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    assert!(stdout(&holder).contains("stopped"), "{holder:?}");
    let said = String::from_utf8_lossy(&holder.stderr);
    assert!(said.contains("lost"), "{said}");
}

#[test]
fn elect_runs_its_command_while_leader_and_the_next_candidate_after() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script = r#"echo "term $PGCOORD_LEASE_TOKEN"; sleep 1; exit 3"#;
    let first = [
        "elect",
        "primary",
        "--value",
        "host-a:5432",
        "--",
        "sh",
        "-c",
        script,
    ];
    let first = pgcoord_command(&table, &first).spawn().unwrap();
    wait_until_held(&table, "primary");
    // The leader's value is the election's data.
    let show = stdout(&pgcoord(&table, &["lock", "show", "primary"]));
    assert!(show.contains("host-a:5432"), "{show}");
    // A candidate waits until elected (by default as long as it takes) ...
    let second = [
        "elect",
        "primary",
        "--value",
        "host-b",
        "--",
        "sh",
        "-c",
        r#"echo "term $PGCOORD_LEASE_TOKEN""#,
    ];
    let second = pgcoord_command(&table, &second).spawn().unwrap();
    // ... unless told to give up: exit 6, its command not run.
    let args = ["elect", "primary", "--wait", "200ms", "--", "echo", "ran"];
    let quitter = pgcoord(&table, &args);
    assert_eq!(quitter.status.code(), Some(6), "{quitter:?}");
    assert!(!stdout(&quitter).contains("ran"), "{quitter:?}");
    // The first term ends with its command (pgcoord exits with its code); the second starts.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(3), "{first:?}");
    let second = second.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    let term = |out: &std::process::Output| -> i64 {
        let text = stdout(out);
        text.trim()
            .strip_prefix("term ")
            .unwrap_or_else(|| panic!("{text}"))
            .parse()
            .unwrap()
    };
    assert!(
        term(&second) > term(&first),
        "terms are ordered by their tokens"
    );
    let free = pgcoord(&table, &["lock", "show", "primary"]);
    assert_eq!(
        free.status.code(),
        Some(3),
        "released after the last term: {free:?}"
    );
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

#[tokio::test]
async fn migrate_says_what_it_created_and_status_and_dry_run_change_nothing() {
    let table = unique_name("cli");
    let quoted_table = format!("table public.{table}");
    let dry = stdout(&pgcoord(&table, &["migrate", "--dry-run"]));
    assert!(
        dry.contains(&format!("CREATE TABLE IF NOT EXISTS \"{table}\"")),
        "{dry}"
    );
    let status = stdout(&pgcoord(&table, &["migrate", "--status"]));
    assert!(status.starts_with("would create:\n"), "{status}");
    assert!(status.contains(&quoted_table), "{status}");
    // Neither created anything.
    let missing = pgcoord(&table, &["locks"]);
    assert_eq!(missing.status.code(), Some(4), "{missing:?}");

    let created = stdout(&pgcoord(&table, &["migrate"]));
    assert!(created.starts_with("created:\n"), "{created}");
    assert_eq!(
        created.replacen("created:", "would create:", 1),
        status,
        "the status said what the migration did"
    );
    // A table's columns come with it, not one by one.
    assert!(
        !created.contains(&format!("column public.{table}.")),
        "{created}"
    );
    let again = stdout(&pgcoord(&table, &["migrate"]));
    assert_eq!(again.trim(), "up to date: nothing changed");
    // A table from before a later migration's column: the upgrade names the column.
    let client = pgcoord::db::connect_spawned(&config(&table, "admin"))
        .await
        .unwrap();
    let drop = format!("ALTER TABLE \"{table}_wq\" DROP COLUMN data");
    client.batch_execute(&drop).await.unwrap();
    let upgraded = stdout(&pgcoord(&table, &["migrate"]));
    assert_eq!(
        upgraded,
        format!("created:\n  column public.{table}_wq.data\n")
    );
    let json: serde_json::Value =
        serde_json::from_slice(&pgcoord(&table, &["--json", "migrate", "--status"]).stdout)
            .unwrap();
    assert_eq!(json, serde_json::json!({ "pending": [] }));
}
