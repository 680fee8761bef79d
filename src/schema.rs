//! The tables pgcoord needs: migrations for default and custom names.
//!
//! The files in `migrations/` are plain SQL written for the default names, usable as they are
//! by psql; a migration tool with its own naming rule (refinery's `V1__locks.sql`) needs them
//! copied under its names. [`sql`] renders them for a [`Config`] by replacing each quoted
//! default name with the configured, validated and quoted one; for the default configuration the
//! result is exactly the files.

use tokio_postgres::Client;
use tracing::{info, instrument};

use crate::config::Config;
use crate::error::Result;

/// The migrations, in order: file name and SQL text for the default names.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_locks.sql",
        include_str!("../migrations/0001_locks.sql"),
    ),
    (
        "0002_payloads.sql",
        include_str!("../migrations/0002_payloads.sql"),
    ),
    (
        "0003_lock_queue.sql",
        include_str!("../migrations/0003_lock_queue.sql"),
    ),
    (
        "0004_lock_queue_handover.sql",
        include_str!("../migrations/0004_lock_queue_handover.sql"),
    ),
    (
        "0005_lock_queue_nonce.sql",
        include_str!("../migrations/0005_lock_queue_nonce.sql"),
    ),
    (
        "0006_topics.sql",
        include_str!("../migrations/0006_topics.sql"),
    ),
    (
        "0007_schedules.sql",
        include_str!("../migrations/0007_schedules.sql"),
    ),
    (
        "0008_rate_limits.sql",
        include_str!("../migrations/0008_rate_limits.sql"),
    ),
    (
        "0009_resign_requests.sql",
        include_str!("../migrations/0009_resign_requests.sql"),
    ),
    (
        "0010_waiter_priority.sql",
        include_str!("../migrations/0010_waiter_priority.sql"),
    ),
    (
        "0011_limits.sql",
        include_str!("../migrations/0011_limits.sql"),
    ),
    ("0012_functions.sql", FUNCTIONS_MIGRATION),
];

/// The migration that creates pgcoord's SQL functions.
const FUNCTIONS_MIGRATION: &str = include_str!("../migrations/0012_functions.sql");

/// An arbitrary, fixed advisory lock key that serializes concurrent migrations: `CREATE ... IF NOT
/// EXISTS` is not safe against itself running in two sessions at once.
const MIGRATION_LOCK_KEY: i64 = 0x7067_636f_6f72_6401;

/// The SQL of every migration, rendered for `config`'s table names, preceded by `CREATE SCHEMA IF
/// NOT EXISTS` for each configured schema.
pub fn sql(config: &Config) -> String {
    let mut out = String::new();
    let mut schemas: Vec<_> = [
        config.lock_table.schema(),
        config.payload_table.schema(),
        config.topic_table.schema(),
        config.schedule_table.schema(),
    ]
    .into_iter()
    .flatten()
    .collect();
    schemas.sort_by_key(|s| s.quoted());
    schemas.dedup();
    for schema in schemas {
        out.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS {};\n",
            schema.quoted()
        ));
    }
    for (file, text) in MIGRATIONS {
        if *file == "0001_locks.sql" && config.unlogged_lock_table {
            out.push_str(&render(&unlogged(text), config));
        } else {
            out.push_str(&render(text, config));
        }
    }
    out
}

/// The body of the migrations' SQL function `name` (a `LANGUAGE sql` one, between its `$fn$`
/// quotes), rendered for `config`: a statement with the function's parameters as `$1`, `$2`, …,
/// for pgcoord to send as it is where the function would cost more (see `topic::log::read_sql`).
/// One text, so the function and pgcoord's own statement cannot drift apart.
pub(crate) fn function_body(config: &Config, name: &str) -> String {
    let functions = render(FUNCTIONS_MIGRATION, config);
    let create = format!("CREATE FUNCTION {}(", config.sql_function(name).quoted());
    let body = (functions.split_once(&create))
        .and_then(|(_, after)| after.split_once("$fn$"))
        .and_then(|(_, body)| body.split_once("$fn$"))
        .map(|(body, _)| body.trim());
    body.expect("the migration defines the function with a $fn$ body")
        .to_owned()
}

/// The lock table's migration with the table created `UNLOGGED` (the sequence stays logged, so
/// tokens keep increasing across a crash).
fn unlogged(text: &str) -> String {
    const LOGGED: &str = "CREATE TABLE IF NOT EXISTS \"pgcoord_locks\"";
    assert!(
        text.contains(LOGGED),
        "the lock table's migration creates it"
    );
    text.replace(
        LOGGED,
        "CREATE UNLOGGED TABLE IF NOT EXISTS \"pgcoord_locks\"",
    )
}

/// Switches the existing lock table to `UNLOGGED` (or back to logged), as
/// [`ConfigBuilder::unlogged_lock_table`](crate::ConfigBuilder::unlogged_lock_table) describes.
/// The table is rewritten under an exclusive lock: every lease statement waits for it, so run it
/// when the table is quiet. Leases survive the switch.
#[instrument(skip_all, fields(lock_table = %config.lock_table))]
pub async fn set_lock_table_unlogged(
    client: &Client,
    config: &Config,
    unlogged: bool,
) -> Result<()> {
    let persistence = if unlogged { "UNLOGGED" } else { "LOGGED" };
    let sql = format!(
        "ALTER TABLE {} SET {persistence}",
        config.lock_table.quoted()
    );
    client.batch_execute(&sql).await?;
    info!(unlogged, "lock table persistence set");
    Ok(())
}

/// Whether the lock table is `UNLOGGED` now. [`ErrorKind::NotFound`](crate::ErrorKind::NotFound)
/// when it does not exist.
pub async fn lock_table_is_unlogged(client: &Client, config: &Config) -> Result<bool> {
    let row = client
        .query_opt(
            "SELECT relpersistence = 'u' FROM pg_class WHERE oid = to_regclass($1)",
            &[&config.lock_table.quoted()],
        )
        .await?;
    match row {
        Some(row) => Ok(row.get(0)),
        None => Err(crate::Error::new(
            crate::ErrorKind::NotFound,
            format!(
                "lock table {} does not exist; run pgcoord::schema::migrate",
                config.lock_table
            ),
        )),
    }
}

/// Replaces each quoted default name in `text` with the configured one, in a single pass so a
/// replacement is never itself replaced.
fn render(text: &str, config: &Config) -> String {
    let functions = crate::config::SQL_FUNCTIONS.iter().map(|(table, suffix)| {
        let default = format!("{table}{suffix}");
        let configured = config.sql_function(&default).quoted();
        (default, configured)
    });
    let names: Vec<(String, String)> = [
        ("pgcoord_locks", config.lock_table.quoted()),
        ("pgcoord_locks_rvn", config.lock_sequence.quoted()),
        ("pgcoord_locks_wq", config.lock_queue.quoted()),
        ("pgcoord_payloads", config.payload_table.quoted()),
        ("pgcoord_topics", config.topic_table.quoted()),
        ("pgcoord_topics_cursors", config.topic_cursors().quoted()),
        ("pgcoord_topics_trimmed", config.topic_trimmed().quoted()),
        ("pgcoord_schedules", config.schedule_table.quoted()),
        ("pgcoord_locks_rl", config.rate_table().quoted()),
        ("pgcoord_locks_rr", config.resign_table().quoted()),
        ("pgcoord_locks_lm", config.limit_table().quoted()),
    ]
    .into_iter()
    .map(|(default, configured)| (default.to_owned(), configured))
    .chain(functions)
    .collect();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('"')
            .expect("migrations quote every identifier in pairs");
        let ident = &after[..close];
        match names.iter().find(|(default, _)| *default == ident) {
            Some((_, configured)) => out.push_str(configured),
            None => out.push_str(&rest[open..open + close + 2]),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Creates whatever of pgcoord's schema is missing; safe to run any number of times, from any
/// number of processes at once. All of it or none of it is applied.
#[instrument(skip_all, fields(lock_table = %config.lock_table))]
pub async fn migrate(client: &Client, config: &Config) -> Result<()> {
    // A multi-statement simple query is one implicit transaction, so the advisory lock is held
    // to the end and a failure leaves nothing half-created.
    let script = format!(
        "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY});\n{}",
        sql(config)
    );
    client.batch_execute(&script).await?;
    info!("pgcoord schema is up to date");
    Ok(())
}

/// [`migrate`], saying what it changed: the objects it created (`table public.pgcoord_locks`,
/// `column public.pgcoord_locks.waiter`, `index …`), none when the schema was up to date. With
/// `apply` false nothing is kept: the same migration runs and is rolled back, so the list is
/// what [`migrate`] would change now. Only what this migration wrote is listed: not what other
/// sessions create meanwhile in the same schemas (an application's own migration).
#[instrument(skip_all, fields(lock_table = %config.lock_table, apply))]
pub async fn migrate_and_report(
    client: &Client,
    config: &Config,
    apply: bool,
) -> Result<Vec<String>> {
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
        ))
        .await?;
    let changed = async {
        let before = objects(client, config, false).await?;
        client.batch_execute(&sql(config)).await?;
        // Only what this transaction wrote: a table another session created meanwhile in the
        // same schema (an application's own migration) is not pgcoord's.
        let after = objects(client, config, true).await?;
        let created: Vec<String> = after.into_iter().filter(|o| !before.contains(o)).collect();
        // A new table's columns come with it: listed only for tables that were there.
        let new_tables: Vec<String> = (created.iter())
            .filter_map(|o| o.strip_prefix("table ").map(|t| format!("column {t}.")))
            .collect();
        let created = (created.into_iter())
            .filter(|o| !new_tables.iter().any(|t| o.starts_with(t.as_str())))
            .collect();
        Ok::<_, crate::Error>(created)
    }
    .await;
    let end = if apply && changed.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    client.batch_execute(end).await?;
    if apply {
        info!("pgcoord schema is up to date");
    }
    changed
}

/// The tables, sequences, indexes, columns and functions in the schemas pgcoord's tables live
/// in; with `ours`, only those whose catalog row the current transaction wrote (`age(xmin)` is
/// 0 for the transaction's own id): created or altered by it.
async fn objects(client: &Client, config: &Config, ours: bool) -> Result<Vec<String>> {
    let schemas: Vec<String> = [
        &config.lock_table,
        &config.payload_table,
        &config.topic_table,
        &config.schedule_table,
    ]
    .iter()
    .map(|t| {
        t.schema()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default()
    })
    .collect();
    let rows = client
        .query(
            "WITH wanted AS (
                 SELECT CASE WHEN s = '' THEN current_schema() ELSE s END AS nspname
                 FROM unnest($1::text[]) AS s
             ), relations AS (
                 SELECT c.oid, c.relkind, n.nspname, c.relname, c.xmin
                 FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                 WHERE n.nspname IN (SELECT nspname FROM wanted)
                   AND c.relkind IN ('r', 'p', 'S', 'i')
             )
             SELECT CASE relkind WHEN 'S' THEN 'sequence' WHEN 'i' THEN 'index' ELSE 'table' END
                    || ' ' || quote_ident(nspname) || '.' || quote_ident(relname)
             FROM relations WHERE NOT $2 OR age(xmin) = 0
             UNION ALL
             SELECT 'column ' || quote_ident(r.nspname) || '.' || quote_ident(r.relname) || '.'
                    || quote_ident(a.attname)
             FROM relations AS r JOIN pg_attribute AS a ON a.attrelid = r.oid
             WHERE r.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
               AND (NOT $2 OR age(a.xmin) = 0)
             UNION ALL
             SELECT 'function ' || quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '('
                    || pg_get_function_identity_arguments(p.oid) || ')'
             FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
             WHERE n.nspname IN (SELECT nspname FROM wanted) AND (NOT $2 OR age(p.xmin) = 0)
             ORDER BY 1",
            &[&schemas, &ours],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Creates pgcoord's tables and sequence; an [`ErrorKind::AlreadyExists`] error when any of them
/// exists already, and then nothing is created.
///
/// [`ErrorKind::AlreadyExists`]: crate::ErrorKind::AlreadyExists
#[instrument(skip_all, fields(lock_table = %config.lock_table))]
pub async fn create_tables(client: &Client, config: &Config) -> Result<()> {
    let script = sql(config)
        .replace("CREATE TABLE IF NOT EXISTS", "CREATE TABLE")
        .replace(
            "CREATE UNLOGGED TABLE IF NOT EXISTS",
            "CREATE UNLOGGED TABLE",
        )
        .replace("CREATE SEQUENCE IF NOT EXISTS", "CREATE SEQUENCE");
    // Sequences report duplicate_table (42P07) too, which classifies as AlreadyExists.
    client.batch_execute(&script).await?;
    Ok(())
}

/// Creates what is missing and ignores what exists, like pglock's `TryCreateTable`; the same as
/// [`migrate`].
pub async fn try_create_tables(client: &Client, config: &Config) -> Result<()> {
    migrate(client, config).await
}

/// The SQL functions' signatures, as `0012_functions.sql` creates them.
const FUNCTION_ARGUMENTS: &[(&str, &str)] = &[
    ("pgcoord_locks_fence", "text, bigint, text"),
    ("pgcoord_locks_lease", "text"),
    ("pgcoord_topics_append", "text, jsonb, boolean"),
    ("pgcoord_topics_append", "text, bytea, boolean"),
    ("pgcoord_topics_read", "text, bigint, bigint, bigint"),
    (
        "pgcoord_topics_ack",
        "text, text, bigint, bigint, text, bigint",
    ),
    (
        "pgcoord_schedules_complete",
        "text, timestamptz, bigint, integer, timestamptz",
    ),
];

/// Drops pgcoord's tables, sequence and functions (schemas are left alone). For tests and teardown; never
/// call it from normal application startup.
#[instrument(skip_all, fields(lock_table = %config.lock_table))]
pub async fn drop_tables(client: &Client, config: &Config) -> Result<()> {
    let script = format!(
        "DROP TABLE IF EXISTS {}, {}, {}, {}, {}, {}, {}, {}, {}, {}; DROP SEQUENCE IF EXISTS {};",
        config.lock_table.quoted(),
        config.lock_queue.quoted(),
        config.payload_table.quoted(),
        config.topic_table.quoted(),
        config.topic_cursors().quoted(),
        config.topic_trimmed().quoted(),
        config.schedule_table.quoted(),
        config.rate_table().quoted(),
        config.resign_table().quoted(),
        config.limit_table().quoted(),
        config.lock_sequence.quoted()
    );
    // The SQL functions, each by its signature (the append is overloaded).
    let functions: Vec<String> = FUNCTION_ARGUMENTS
        .iter()
        .map(|(default, arguments)| {
            format!("{}({arguments})", config.sql_function(default).quoted())
        })
        .collect();
    let script = format!("{script} DROP FUNCTION IF EXISTS {};", functions.join(", "));
    client.batch_execute(&script).await?;
    Ok(())
}
