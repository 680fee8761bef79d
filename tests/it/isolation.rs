//! The lease statements in chosen interleavings of concurrent sessions, stepped by PostgreSQL's
//! own isolation tester. Each spec (tests/isolation/specs/) runs the statements' SQL as
//! rendered for a table: every session PREPAREs them from `LeaseTable::sql_text`, so a
//! changed statement shows as a changed output. The outputs are compared with
//! tests/isolation/expected/; `PGCOORD_ISOLATION_BLESS=1` writes them instead.
//!
//! Each spec gets a schema of its own holding the default tables; the sessions find them by
//! `search_path`, so the steps (echoed in the output) name no run-specific table. Tokens are
//! printed as drawn: every permutation starts from a restarted sequence, on timeline 1.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pgcoord::{Config, LeaseTable, TopicTable};
use tokio_postgres::config::Host;

/// How long one spec may run before its tester is killed; the tester also cancels a step
/// blocked longer than `PGISOLATIONTIMEOUT` seconds.
const SPEC_TIMEOUT: Duration = Duration::from_secs(120);

/// The statements each session prepares, with their parameters' types (those the library
/// binds them with).
const PREPARED: &[(&str, &str)] = &[
    ("acquire", "text, text, bytea, int8, bool, text"),
    ("acquire_many", "text[], bytea[], bool[], text, int8, text"),
    ("acquire_any", "text[], text, int8, text"),
    ("renew", "text[], int8[], int8[], text"),
    ("release", "text, int8, bool, text, text, bool"),
    ("release_many", "text[], int8[], bool[], bool[], text, text"),
    ("fence", "text, int8, text"),
    ("limit_set", "text, int4, text"),
    ("limit_take_back", "text, text, int8"),
    ("limit_acquire", "text, text, int8, text, text[], int4"),
];

/// The isolation tester: on `PATH`, else in the PostgreSQL client package's pgxs directory
/// (Debian's postgresql-client-NN), the newest version first.
fn isolationtester() -> Option<PathBuf> {
    let found = pgcoord_testkit::find_program("isolationtester").or_else(|| {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .collect();
        dirs.sort_by_key(|d| {
            let version = d.file_name().and_then(|n| n.to_str()?.parse::<u32>().ok());
            std::cmp::Reverse(version)
        });
        (dirs.iter())
            .map(|d| d.join("lib/pgxs/src/test/isolation/isolationtester"))
            .find(|p| p.is_file())
    });
    pgcoord_testkit::require(found, "isolationtester", "postgresql-client")
}

/// The libpq connection string of `pg`, with `schema` first on the search path.
fn conninfo(pg: &tokio_postgres::Config, schema: &str) -> String {
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(dir)) => dir.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let user = pg.get_user().unwrap_or("postgres");
    let dbname = pg.get_dbname().unwrap_or(user);
    format!("host={host} port={port} user={user} dbname={dbname} options='-c search_path={schema}'")
}

/// The session setup every session of a spec runs before each permutation: the statements,
/// prepared (a session keeps its connection from one permutation to the next).
fn prepares(table: &LeaseTable) -> String {
    let mut setup = String::from("DEALLOCATE ALL;\n");
    for (name, types) in PREPARED {
        let sql = table.sql_text(name).expect("a statement of that name");
        // A step or setup block ends at the first `}` (the spec's scanner does not nest).
        assert!(!sql.contains('}'), "{name}'s SQL has a `}}`");
        setup.push_str(&format!("PREPARE {name}({types}) AS {sql};\n"));
    }
    setup
}

/// `spec` with the session setup after every `session` line, and the per-run values filled in.
fn render(spec: &str, table: &LeaseTable, config: &Config) -> String {
    let topics = TopicTable::new(config);
    let topic_sql = |name| {
        let sql = topics.sql_text(name).expect("a statement of that name");
        assert!(!sql.contains('}') && !sql.contains("$$"), "{name}'s SQL");
        sql.to_owned()
    };
    let setup = format!("setup {{\n{}}}\n", prepares(table));
    let mut out = String::new();
    for line in spec.lines() {
        out.push_str(line);
        out.push('\n');
        if line.starts_with("session ") {
            out.push_str(&setup);
        }
    }
    let literal = |s: &str| format!("'{}'", s.replace('\'', "''"));
    (out.replace("@SEQ@", &literal(&config.lock_sequence().quoted())))
        .replace("@CHANNEL@", &literal(config.lease_channel().as_str()))
        .replace("@APPEND@", &topic_sql("append"))
        .replace("@READ@", &topic_sql("read"))
        .replace("@ACQUIRE_OR_QUEUE@", &{
            let sql = table.sql_text("acquire_or_queue").expect("the statement");
            assert!(
                !sql.contains('}') && !sql.contains("$$"),
                "acquire_or_queue's SQL"
            );
            sql.to_owned()
        })
}

/// Runs spec `name` on the test database and compares its output with the committed one.
async fn check(name: &str) {
    let Some(tester) = isolationtester() else {
        return;
    };
    let pg = pgcoord_testkit::test_pg_config().expect("test database");
    check_with(&tester, name, &pg).await;
}

/// [`check`] on a throwaway cluster of the spec's own, where no other test's transaction runs.
async fn check_alone(name: &str) {
    let Some(tester) = isolationtester() else {
        return;
    };
    let server = pgcoord_testkit::TempPostgres::start().expect("a cluster");
    check_with(&tester, name, &server.pg_config()).await;
}

/// Runs spec `name` with `tester` on the server of `pg` and compares its output with the
/// committed one.
async fn check_with(tester: &Path, name: &str, pg: &tokio_postgres::Config) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/isolation");
    let spec = std::fs::read_to_string(root.join(format!("specs/{name}.spec"))).unwrap();
    let expected_path = root.join(format!("expected/{name}.out"));

    // The tables, migrated into a schema of their own.
    let schema = pgcoord_testkit::unique_name("isolation");
    let migrated = Config::builder()
        .pg_config(pg)
        .schema(&schema)
        .build()
        .unwrap();
    let admin = super::connect(&migrated).await;
    let timeline: String = (admin.query_one(
        "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
        &[],
    ))
    .await
    .unwrap()
    .get(0);
    if timeline != "00000001" {
        eprintln!(
            "isolation spec {name} skipped: the server is on timeline {timeline}, the outputs print tokens of timeline 1"
        );
        return;
    }
    pgcoord::schema::migrate(&admin, &migrated).await.unwrap();
    // The statements as rendered for the default table names, found on the search path.
    let config = Config::builder().pg_config(pg).build().unwrap();
    let table = LeaseTable::new(&config);

    let dir = tempfile::tempdir().unwrap();
    let spec_path = dir.path().join(format!("{name}.spec"));
    std::fs::write(&spec_path, render(&spec, &table, &config)).unwrap();
    let output_path = dir.path().join(format!("{name}.out"));
    let status = run_tester(tester, name, pg, &schema, &spec_path, &output_path).await;
    admin
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
    let output = std::fs::read_to_string(&output_path).unwrap();
    assert!(
        status.success(),
        "isolationtester failed on {name}:\n{output}"
    );

    if std::env::var("PGCOORD_ISOLATION_BLESS").as_deref() == Ok("1") {
        std::fs::write(&expected_path, &output).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    if output != expected {
        let diff = Command::new("diff")
            .arg("-u")
            .arg(&expected_path)
            .arg(&output_path)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("(no diff: {e})\n{output}"));
        let kept = dir.keep();
        panic!(
            "isolation spec {name}: the output differs from {} (spec and output kept in {}):\n{diff}",
            expected_path.display(),
            kept.display()
        );
    }
}

/// Runs `tester` on the spec at `spec_path` against `pg` with `schema` on the search path, its
/// output to `output_path`; killed after [`SPEC_TIMEOUT`].
async fn run_tester(
    tester: &Path,
    name: &str,
    pg: &tokio_postgres::Config,
    schema: &str,
    spec_path: &Path,
    output_path: &Path,
) -> std::process::ExitStatus {
    let mut command = Command::new(tester);
    command
        .arg(conninfo(pg, schema))
        .env("PGISOLATIONTIMEOUT", "30")
        .stdin(File::open(spec_path).unwrap())
        .stdout(File::create(output_path).unwrap())
        .stderr(Stdio::inherit());
    if let Some(password) = pg.get_password() {
        command.env("PGPASSWORD", String::from_utf8_lossy(password).as_ref());
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("run isolationtester");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > SPEC_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("isolation spec {name} ran longer than {SPEC_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_release_racing_a_renewal() {
    check("release_renew").await;
}

#[tokio::test]
async fn a_takeover_of_an_expired_lease_racing_the_old_holders_renewal() {
    check("takeover_renew").await;
}

#[tokio::test]
async fn two_grants_of_a_free_lease_racing() {
    check("grant_grant").await;
}

#[tokio::test]
async fn a_fenced_write_racing_a_takeover_and_a_release() {
    check("fence_takeover").await;
}

#[tokio::test]
async fn a_stalled_grant_holds_the_grant_lock_against_a_later_tenure() {
    check("stalled_grant").await;
}

#[tokio::test]
async fn a_stored_limit_lowered_while_its_permits_are_taken() {
    check("limit_lowered").await;
}

#[tokio::test]
async fn a_topic_event_committed_behind_a_reader_is_not_skipped() {
    check_alone("topic_horizon").await;
}

#[tokio::test]
async fn a_consumers_ack_racing_a_takeover_of_its_lease() {
    check("consumer_ack").await;
}

#[tokio::test]
async fn a_released_lease_goes_to_the_first_in_line_by_priority_then_arrival() {
    check("line_order").await;
}

#[tokio::test]
async fn a_batch_release_skips_rows_under_way_and_two_batches_never_wait_on_each_other() {
    check("release_many").await;
}

#[tokio::test]
async fn a_batch_grant_skips_rows_under_way_and_two_batches_never_deadlock() {
    check("acquire_many").await;
}

#[tokio::test]
async fn permits_racing_for_a_semaphores_last_slot() {
    check("permits").await;
}
