//! `migrate`, `--status` and `--dry-run`.

use super::*;

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

#[test]
fn migrate_status_exits_4_while_migrations_are_pending() {
    let table = unique_name("cli");
    // Nothing there yet: everything pending.
    let pending = pgcoord(&table, &["migrate", "--status"]);
    assert_eq!(pending.status.code(), Some(4), "{pending:?}");
    assert!(
        stdout(&pending).starts_with("would create:\n"),
        "{pending:?}"
    );
    let json = pgcoord(&table, &["--json", "migrate", "--status"]);
    assert_eq!(json.status.code(), Some(4), "{json:?}");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let current = pgcoord(&table, &["migrate", "--status"]);
    assert_eq!(current.status.code(), Some(0), "{current:?}");
    assert_eq!(stdout(&current).trim(), "up to date");
}

#[test]
fn migrate_dry_run_prints_the_sql_without_a_database() {
    let table = unique_name("cli");
    // No database named anywhere, and then one that does not answer: the same SQL.
    let mut printed = Vec::new();
    for dsn in [None, Some("postgresql://nobody@127.0.0.1:1/nothing")] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pgcoord"));
        for variable in [
            "DATABASE_URL",
            "PGHOST",
            "PGHOSTADDR",
            "PGPORT",
            "PGDATABASE",
        ] {
            command.env_remove(variable);
        }
        if let Some(dsn) = dsn {
            command.args(["--dsn", dsn]);
        }
        let out = command
            .args([
                "--lock-table",
                &table,
                "--timeout",
                "2s",
                "migrate",
                "--dry-run",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{dsn:?}: {out:?}");
        let sql = stdout(&out);
        assert!(
            sql.contains(&format!("CREATE TABLE IF NOT EXISTS \"{table}\"")),
            "{sql}"
        );
        printed.push(sql);
    }
    assert_eq!(printed[0], printed[1]);
}
