//! Connecting: timeouts, TLS, the environment, secrets kept out of help, missing tables.

use super::*;

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

/// The environment fills what `--dsn` leaves out, as for psql, against a server that asks the
/// role for its password: PGPASSWORD; PGHOST (and the rest) under `postgres:///db`; a `0600`
/// password file. A password file others can read is ignored, and the failure says so without
/// printing the password.
#[test]
fn the_environment_fills_what_the_dsn_leaves_out() {
    const PASSWORD: &str = "Zq9x-env-pw";
    let server = TempPostgres::start_with_hba("host all app 127.0.0.1/32 scram-sha-256\n").unwrap();
    let admin = format!("{} connect_timeout=10", server.dsn());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        // Stored as SCRAM, which the rule asks for (PostgreSQL 13 stores md5 by default).
        let create = format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE app LOGIN SUPERUSER PASSWORD '{PASSWORD}'"
        );
        client.batch_execute(&create).await.unwrap();
    });
    let port = server.port().to_string();
    let home = std::env::temp_dir().join(unique_name("home"));
    std::fs::create_dir(&home).unwrap();
    let table = unique_name("cli_env_merge");
    let run = |dsn: &str, env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pgcoord"));
        command.env_remove("DATABASE_URL");
        for name in [
            "PGHOST",
            "PGHOSTADDR",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSWORD",
            "PGPASSFILE",
        ] {
            command.env_remove(name);
        }
        command.env("HOME", &home);
        command.envs(env.iter().copied());
        let out = (command.args(["--dsn", dsn, "--lock-table", &table, "migrate"]))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        (out.status.code(), stderr)
    };
    let dsn = format!("host=127.0.0.1 port={port} user=app dbname=postgres");
    // Without a password anywhere, the server's demand is refused.
    let (code, stderr) = run(&dsn, &[]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("password missing"), "{stderr}");
    // PGPASSWORD with a DSN lacking a password.
    let (code, stderr) = run(&dsn, &[("PGPASSWORD", PASSWORD)]);
    assert_eq!(code, Some(0), "{stderr}");
    // `postgres:///db` with PGHOST, PGPORT, PGUSER.
    let env = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", &port),
        ("PGUSER", "app"),
        ("PGPASSWORD", PASSWORD),
    ];
    let (code, stderr) = run("postgres:///postgres", &env);
    assert_eq!(code, Some(0), "{stderr}");
    // ~/.pgpass, 0600, with the host the environment names.
    use std::os::unix::fs::PermissionsExt;
    let passfile = home.join(".pgpass");
    std::fs::write(&passfile, format!("127.0.0.1:{port}:*:app:{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", &port),
        ("PGUSER", "app"),
    ];
    let (code, stderr) = run("postgres:///postgres", &env);
    assert_eq!(code, Some(0), "{stderr}");
    // Readable by others: ignored, and the failure says why.
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, stderr) = run("postgres:///postgres", &env);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("password missing"), "{stderr}");
    assert!(
        stderr.contains(".pgpass was ignored: its permissions are too open"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&home);
}
