//! Migrations: idempotent, exactly the objects of migrations/, custom names in custom schemas.

use pgcoord::lease::AcquireRequest;
use pgcoord::{Config, ErrorKind, schema};
use tokio_postgres::Client;

/// A fresh database, so the objects in it are only the ones a test creates.
async fn fresh_database() -> (tokio_postgres::Config, Client) {
    let (config, admin) = super::setup().await;
    let name = pgcoord_testkit::unique_name("db");
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    let mut pg = config.pg_config().clone();
    pg.dbname(&name);
    let (client, conn) = pg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    (pg, client)
}

/// Every relation in `schema`, with its kind.
async fn objects(client: &Client, schema: &str) -> Vec<(String, String)> {
    client
        .query(
            "SELECT c.relname::text, c.relkind::text FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn default_rendering_is_exactly_the_files() {
    let config = Config::builder().dsn("host=localhost").build().unwrap();
    let files: String = schema::MIGRATIONS.iter().map(|(_, sql)| *sql).collect();
    let on_disk: String = [
        "0001_locks.sql",
        "0002_payloads.sql",
        "0003_lock_queue.sql",
        "0004_lock_queue_handover.sql",
        "0005_lock_queue_nonce.sql",
        "0006_topics.sql",
        "0007_schedules.sql",
        "0008_rate_limits.sql",
        "0009_resign_requests.sql",
        "0010_waiter_priority.sql",
        "0011_limits.sql",
        "0012_functions.sql",
    ]
    .iter()
    .map(|f| {
        std::fs::read_to_string(format!("{}/migrations/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    })
    .collect();
    assert_eq!(schema::sql(&config), files);
    assert_eq!(files, on_disk);
}

#[tokio::test]
async fn migrate_creates_exactly_the_files_objects_and_is_idempotent() {
    // The files applied by hand, as a migration tool would...
    let (_, by_hand) = fresh_database().await;
    for (_, sql) in schema::MIGRATIONS {
        by_hand.batch_execute(sql).await.unwrap();
    }
    // ...and migrate() with the default names, three times.
    let (pg, migrated) = fresh_database().await;
    let config = Config::builder().pg_config(&pg).build().unwrap();
    for _ in 0..3 {
        schema::migrate(&migrated, &config).await.unwrap();
    }
    let expected = objects(&by_hand, "public").await;
    assert_eq!(objects(&migrated, "public").await, expected);
    let names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "pgcoord_locks",
            "pgcoord_locks_lm",
            "pgcoord_locks_lm_pkey",
            "pgcoord_locks_pkey",
            "pgcoord_locks_rl",
            "pgcoord_locks_rl_pkey",
            "pgcoord_locks_rr",
            "pgcoord_locks_rr_pkey",
            "pgcoord_locks_rvn",
            "pgcoord_locks_token_key",
            "pgcoord_locks_wq",
            "pgcoord_locks_wq_pkey",
            "pgcoord_payloads",
            "pgcoord_payloads_pkey",
            "pgcoord_schedules",
            "pgcoord_schedules_pkey",
            "pgcoord_topics",
            "pgcoord_topics_cursors",
            "pgcoord_topics_cursors_pkey",
            "pgcoord_topics_pkey",
            "pgcoord_topics_position_seq",
            "pgcoord_topics_trimmed",
            "pgcoord_topics_trimmed_pkey"
        ]
    );
}

#[tokio::test]
async fn concurrent_migrations_do_not_conflict() {
    let config = super::builder()
        .schema(pgcoord_testkit::unique_name("conc"))
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let client = super::connect(&config).await;
            // Half of them say what they created (`pgcoord migrate`).
            match i % 2 {
                0 => schema::migrate(&client, &config).await.map(|()| Vec::new()),
                _ => schema::migrate_and_report(&client, &config, true).await,
            }
        }));
    }
    let mut reported = Vec::new();
    for t in tasks {
        reported.extend(t.await.unwrap().unwrap());
    }
    // Whatever each reported, it created: no object is claimed by two of them.
    let mut distinct = reported.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), reported.len(), "{reported:?}");
}

#[tokio::test]
async fn create_try_create_and_drop_with_custom_names_in_a_custom_schema() {
    let schema_name = pgcoord_testkit::unique_name("app");
    let config = super::builder()
        .schema(&schema_name)
        .lock_table("Leases")
        .payload_table("blobs")
        .topic_table("events")
        .schedule_table("runs")
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    schema::create_tables(&client, &config).await.unwrap();
    let names: Vec<String> = objects(&client, &schema_name)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "Leases",
            "Leases_lm",
            "Leases_lm_pkey",
            "Leases_pkey",
            "Leases_rl",
            "Leases_rl_pkey",
            "Leases_rr",
            "Leases_rr_pkey",
            "Leases_rvn",
            "Leases_token_key",
            "Leases_wq",
            "Leases_wq_pkey",
            "blobs",
            "blobs_pkey",
            "events",
            "events_cursors",
            "events_cursors_pkey",
            "events_pkey",
            "events_position_seq",
            "events_trimmed",
            "events_trimmed_pkey",
            "runs",
            "runs_pkey"
        ]
    );

    let err = schema::create_tables(&client, &config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    schema::try_create_tables(&client, &config).await.unwrap();

    // Drop one table: create_tables still refuses (atomically: nothing half-created)...
    client
        .batch_execute(&format!("DROP TABLE {}", config.payload_table().quoted()))
        .await
        .unwrap();
    assert_eq!(
        schema::create_tables(&client, &config)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(objects(&client, &schema_name).await.len(), 21);
    // ...while try_create_tables fills in what is missing.
    schema::try_create_tables(&client, &config).await.unwrap();
    assert_eq!(objects(&client, &schema_name).await.len(), 23);

    schema::drop_tables(&client, &config).await.unwrap();
    assert!(objects(&client, &schema_name).await.is_empty());
    schema::drop_tables(&client, &config).await.unwrap();
}

#[tokio::test]
async fn sequence_never_wraps() {
    let (config, client) = super::setup().await;
    let seq = config.lock_sequence().quoted();
    client
        .batch_execute(&format!("SELECT setval('{seq}', 9223372036854775807)"))
        .await
        .unwrap();
    let err = client
        .query_one(&format!("SELECT nextval('{seq}')"), &[])
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::SEQUENCE_GENERATOR_LIMIT_EXCEEDED)
    );
}

#[tokio::test]
async fn an_unlogged_lock_table_is_created_unlogged_and_can_be_switched() {
    let table = pgcoord_testkit::unique_name("locks");
    let unlogged = super::builder()
        .lock_table(&table)
        .unlogged_lock_table(true)
        .build()
        .unwrap();
    assert!(
        schema::sql(&unlogged)
            .contains(&format!("CREATE UNLOGGED TABLE IF NOT EXISTS \"{table}\""))
    );
    let client = super::connect(&unlogged).await;
    let err = schema::lock_table_is_unlogged(&client, &unlogged)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    schema::migrate(&client, &unlogged).await.unwrap();
    schema::migrate(&client, &unlogged).await.unwrap();
    assert!(
        schema::lock_table_is_unlogged(&client, &unlogged)
            .await
            .unwrap()
    );
    // The token sequence stays logged: tokens keep increasing across a crash.
    let sequence: String = client
        .query_one(
            "SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)",
            &[&unlogged.lock_sequence().quoted()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sequence, "p");
    // Switched back and forth with leases in it, which survive.
    let leases = pgcoord::LeaseTable::new(&unlogged);
    let grant = match leases
        .owner("me")
        .unwrap()
        .try_acquire(
            &client,
            &AcquireRequest::new("kept"),
            std::time::Duration::from_secs(30),
        )
        .await
        .unwrap()
    {
        pgcoord::lease::Attempt::Granted(grant) => grant,
        other => panic!("{other:?}"),
    };
    schema::set_lock_table_unlogged(&client, &unlogged, false)
        .await
        .unwrap();
    assert!(
        !schema::lock_table_is_unlogged(&client, &unlogged)
            .await
            .unwrap()
    );
    schema::set_lock_table_unlogged(&client, &unlogged, true)
        .await
        .unwrap();
    assert!(
        schema::lock_table_is_unlogged(&client, &unlogged)
            .await
            .unwrap()
    );
    let info = leases.get(&client, "kept").await.unwrap();
    assert_eq!(info.token, Some(grant.token));
    // The default stays logged.
    let logged = super::builder()
        .lock_table(pgcoord_testkit::unique_name("locks"))
        .build()
        .unwrap();
    schema::migrate(&client, &logged).await.unwrap();
    assert!(
        !schema::lock_table_is_unlogged(&client, &logged)
            .await
            .unwrap()
    );
    schema::drop_tables(&client, &unlogged).await.unwrap();
    schema::drop_tables(&client, &logged).await.unwrap();
}

/// The columns migrations 0004 and 0005 added to the waiters' table (a handover's stored grant
/// and its nonce) are no longer read or written: a table of migration 0003 passes the check at
/// start, and waiting, lining up and releasing work on it.
#[tokio::test]
async fn a_waiters_table_of_migration_0003_needs_none_of_the_later_columns() {
    let (config, client) = super::setup().await;
    for column in ["lease_ms", "data", "replace_data", "nonce"] {
        client
            .batch_execute(&format!(
                "ALTER TABLE {} DROP COLUMN {column}",
                config.lock_queue().quoted()
            ))
            .await
            .unwrap();
    }
    pgcoord::__private::check_server(&config).await.unwrap();
    let table = pgcoord::LeaseTable::new(&config);
    let request = AcquireRequest::new("job");
    let g = super::grant(&table, &client, "job", "holder", super::LEASE).await;
    let waiter = table.owner("waiter").unwrap();
    let attempt = waiter.try_acquire_or_queue(&client, &request, super::LEASE, super::LEASE);
    assert!(matches!(
        attempt.await.unwrap(),
        pgcoord::lease::Attempt::Held(Some(_))
    ));
    let release = pgcoord::lease::ReleaseRequest {
        name: "job",
        token: g.token,
        keep: false,
        announce_always: false,
    };
    table
        .owner("holder")
        .unwrap()
        .release(&client, &release)
        .await
        .unwrap();
    let attempt = waiter.try_acquire_or_queue(&client, &request, super::LEASE, super::LEASE);
    assert!(matches!(
        attempt.await.unwrap(),
        pgcoord::lease::Attempt::Granted(_)
    ));
    waiter.leave_line(&client, "job").await.unwrap();
}

/// What a report lists is what the migration created: a table another session creates in the
/// same schema while the migration runs is not listed as pgcoord's (the objects before and
/// after are read in one snapshot).
#[tokio::test]
async fn a_report_lists_only_what_the_migration_created_while_others_create_tables() {
    let name = pgcoord_testkit::unique_name("report");
    let config = super::builder().schema(&name).build().unwrap();
    let client = super::connect(&config).await;
    schema::migrate(&client, &config).await.unwrap();
    // Another session creates a table of its own in the schema, holding the waiters' table
    // meanwhile: the migration reads what exists, then its first ALTER of that table waits
    // for this session to commit.
    let waiters = config.lock_queue().to_string();
    let other = super::connect(&config).await;
    other
        .batch_execute(&format!(
            "BEGIN; CREATE TABLE \"{name}\".orders (id int);
             LOCK TABLE {waiters} IN ACCESS SHARE MODE"
        ))
        .await
        .unwrap();
    let report = tokio::spawn({
        let config = config.clone();
        async move { schema::migrate_and_report(&client, &config, false).await }
    });
    let admin = super::connect(&config).await;
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE NOT granted
         AND relation = '{waiters}'::regclass"
    );
    let started = std::time::Instant::now();
    while admin
        .query_one(&waiting, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            started.elapsed().as_secs() < 30,
            "the migration never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    other.batch_execute("COMMIT").await.unwrap();
    let pending = report.await.unwrap().unwrap();
    assert!(pending.is_empty(), "{pending:?}");
}
