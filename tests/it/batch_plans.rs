//! The batch statements' plans: planned once per connection, and finding their rows by index
//! whatever the lock table's size.

use pgcoord::__private::CachingClient;
use pgcoord::LeaseTable;
use pgcoord::Statements;
use pgcoord::lease::{AcquireRequest, ReleaseRequest};

use super::LEASE;

/// The batch statements keep one plan per connection. A prepared statement whose plans for its
/// parameters' values look cheaper than its generic plan is planned afresh at every run; with
/// the arrays' lengths visible to the planner that was every batch of a few names, and the
/// planning cost the server more than the statement (see `batch_request` in
/// `src/lease/sql.rs`).
#[tokio::test]
async fn batch_statements_are_planned_once_per_connection() {
    let (config, _admin) = super::setup().await;
    let table = LeaseTable::new(&config);
    let client = caching_client(&config).await;
    let version: i32 = (client.run("SHOW server_version_num", &[]).await.unwrap()[0])
        .get::<_, String>(0)
        .parse()
        .unwrap();
    if version < 140000 {
        // pg_prepared_statements counts plans from PostgreSQL 14 on; the next test reads the
        // plans themselves, on every version.
        eprintln!("PostgreSQL {version} does not count plans: nothing to check");
        return;
    }
    for i in 0..12 {
        // Batches of 1 to 3 names: short arrays are what made custom plans look cheaper.
        let names: Vec<String> = (0..=i % 3).map(|n| format!("plan-{i}-{n}")).collect();
        acquire_and_release(&table, &client, &names).await;
    }
    let plans = prepared_batches(&client, "generic_plans, custom_plans").await;
    for row in plans {
        let (generic, custom): (i64, i64) = (row.get(0), row.get(1));
        // PostgreSQL tries five custom plans before it compares them with the generic plan.
        assert!(
            custom <= 5 && generic >= 7,
            "custom plans {custom}, generic {generic}"
        );
    }
}

/// The batch statements find their rows by index whatever the lock table's size. Their generic
/// plan cannot know how many names a batch holds; joined to the batch's rows, it read a lock
/// table of 2,000 held leases whole into a hash at every batch (see `BY_NAME` in
/// `src/lease/sql.rs`). The plans are read with `EXPLAIN EXECUTE` of the statements
/// the batches prepared, forced generic as a long-lived connection's are.
#[tokio::test]
async fn batch_statements_find_their_rows_by_index_in_a_large_lock_table() {
    let (config, admin) = super::setup().await;
    let locks = config.lock_table().quoted();
    admin
        .batch_execute(&format!(
            "INSERT INTO {locks} (name, owner, token, acquired_at, expires_at)
             SELECT 'held-' || g, 'others', 1000000 + g, now(), now() + interval '1 hour'
             FROM generate_series(1, 2000) AS g;
             ANALYZE {locks}"
        ))
        .await
        .unwrap();
    let table = LeaseTable::new(&config);
    let client = caching_client(&config).await;
    client
        .run("SET plan_cache_mode = force_generic_plan", &[])
        .await
        .unwrap();
    acquire_and_release(&table, &client, &["by-index-1", "by-index-2"]).await;
    let prepared = prepared_batches(&client, "name, statement LIKE '%INSERT INTO%'").await;
    for row in prepared {
        let (statement, acquire): (String, bool) = (row.get(0), row.get(1));
        let arguments = if acquire {
            "'{a,b}', '{NULL,NULL}', '{f,f}', 'me', 30000, 'unused'"
        } else {
            "'{a,b}', '{1,2}', '{f,f}', '{f,f}', 'channel', 'me'"
        };
        let explain = format!("EXPLAIN EXECUTE {statement}({arguments})");
        assert_reads_by_index(&config, client.run(&explain, &[]).await.unwrap());
    }
}

/// Statements made `planned` (a claim's) are planned for the lock table as it is, never run
/// with the plan their connection keeps: that plan may have been made while the table was new,
/// and read it whole at every batch as it grew (10,000 leases claimed on a new table: 3 s
/// instead of 1.1–1.4 s, docs/BENCHMARKS.md). On a pool of one connection, the kept plans are
/// made on a new table, the table grows to 10,000 rows, and a planned batch does not run them;
/// a plan made now for such a batch reads the table by index.
#[tokio::test]
async fn planned_statements_are_planned_for_the_table_as_it_is() {
    let config = super::builder().pool_size(1).build().unwrap();
    let admin = super::connect(&config).await;
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    let (table, pool) = (LeaseTable::new(&config), pgcoord::Pool::new(&config));
    let owner = table.owner("me").unwrap();
    let statements = pool.statements(None);
    let version: i32 = (statements
        .run("SHOW server_version_num", &[])
        .await
        .unwrap()[0])
        .get::<_, String>(0)
        .parse()
        .unwrap();
    // Plans kept from the first run, made on the new table.
    (statements
        .run("SET plan_cache_mode = force_generic_plan", &[])
        .await)
        .unwrap();
    let first = [AcquireRequest::new("new-1")];
    let kept = owner.try_acquire_many(&statements, &first, LEASE);
    assert_eq!(kept.await.unwrap().len(), 1);
    let locks = config.lock_table().quoted();
    admin
        .batch_execute(&format!(
            "INSERT INTO {locks} (name, owner, token, acquired_at, expires_at)
             SELECT 'held-' || g, 'others', 1000000 + g, now(), now() + interval '1 hour'
             FROM generate_series(1, 10000) AS g"
        ))
        .await
        .unwrap();
    // A planned batch does not run the kept plan (pg_prepared_statements counts its runs from
    // PostgreSQL 14 on).
    let runs = async || -> i64 {
        let sql = "SELECT generic_plans FROM pg_prepared_statements
                   WHERE statement LIKE '%unnest(args.names%'
                     AND statement NOT LIKE '%pg_prepared_statements%'";
        let rows = pool.statements(None).run(sql, &[]).await.unwrap();
        rows.iter().map(|row| row.get::<_, i64>(0)).sum()
    };
    let before = if version >= 140000 { runs().await } else { 0 };
    let names: Vec<String> = (0..16).map(|i| format!("many-{i}")).collect();
    let requests: Vec<AcquireRequest> = names.iter().map(|n| AcquireRequest::new(n)).collect();
    let planned = pool.statements(None).planned();
    let granted = owner.try_acquire_many(&planned, &requests, LEASE).await;
    assert_eq!(granted.unwrap().len(), 16);
    if version >= 140000 {
        assert_eq!(runs().await, before, "the kept plan ran a planned batch");
    }
    // What a plan made now for such a batch reads: the lock table, by an index.
    let sql = table.sql_text("acquire_many").unwrap();
    let statements = pool.statements(None);
    (statements
        .run("SET plan_cache_mode = force_custom_plan", &[])
        .await)
        .unwrap();
    let prepare = format!("PREPARE fresh(text[], bytea[], bool[], text, int8, text) AS {sql}");
    statements.run(&prepare, &[]).await.unwrap();
    let names: Vec<String> = (0..16).map(|i| format!("\"other-{i}\"")).collect();
    let arguments = format!(
        "'{{{}}}', array_fill(NULL::bytea, ARRAY[16]), array_fill(false, ARRAY[16]), 'me', \
         30000, 'unused'",
        names.join(",")
    );
    let explain = format!("EXPLAIN EXECUTE fresh({arguments})");
    assert_reads_by_index(&config, statements.run(&explain, &[]).await.unwrap());
}

/// `plan`, the lines of an `EXPLAIN`, reads the lock table, and only by an index.
fn assert_reads_by_index(config: &pgcoord::Config, plan: Vec<tokio_postgres::Row>) {
    let plan: Vec<String> = plan.iter().map(|line| line.get(0)).collect();
    let plan = plan.join("\n");
    let lock_table = config.lock_table().name().as_str();
    // The queue table's name starts with the lock table's: the space ends the name.
    assert!(
        !plan.contains(&format!("Seq Scan on {lock_table} ")),
        "{plan}"
    );
    assert!(plan.contains(&format!(" on {lock_table} ")), "{plan}");
}

/// A connection that prepares each statement once, as the pool's do.
async fn caching_client(config: &pgcoord::Config) -> CachingClient {
    let (client, connection) = pgcoord::__private::connect(config).await.unwrap();
    tokio::spawn(connection);
    CachingClient::new(client, config.session_tls().clone())
}

/// `names` (free) acquired in one batch statement and released in another.
async fn acquire_and_release(
    table: &LeaseTable,
    client: &CachingClient,
    names: &[impl AsRef<str>],
) {
    let requests: Vec<AcquireRequest> = (names.iter())
        .map(|name| AcquireRequest::new(name.as_ref()))
        .collect();
    let grants = table
        .owner("me")
        .unwrap()
        .try_acquire_many(client, &requests, LEASE)
        .await
        .unwrap();
    assert_eq!(grants.len(), names.len());
    let releases: Vec<ReleaseRequest> = (names.iter())
        .map(|name| ReleaseRequest {
            name: name.as_ref(),
            token: grants[name.as_ref()].token,
            keep: false,
            announce_always: false,
        })
        .collect();
    let released = table
        .owner("me")
        .unwrap()
        .release_many(client, &releases)
        .await
        .unwrap();
    assert_eq!(released.len(), names.len());
}

/// `columns` of `pg_prepared_statements` for the two batch statements `client` prepared.
async fn prepared_batches(client: &CachingClient, columns: &str) -> Vec<tokio_postgres::Row> {
    let rows = client
        .run(
            &format!(
                "SELECT {columns} FROM pg_prepared_statements
                 WHERE statement LIKE '%unnest(args.names%'
                   AND statement NOT LIKE '%pg_prepared_statements%'"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "the acquire and the release batch");
    rows
}
