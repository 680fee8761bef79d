//! Every bad configuration value gives its own error, and nothing the caller passed changes.

use std::time::Duration;

use pgcoord::{Config, ErrorKind};

fn kind(builder: pgcoord::ConfigBuilder) -> ErrorKind {
    builder.build().expect_err("should be rejected").kind()
}

fn base() -> pgcoord::ConfigBuilder {
    Config::builder().dsn("host=127.0.0.1 user=postgres")
}

#[test]
fn defaults_are_documented_values() {
    let config = base().build().unwrap();
    assert_eq!(config.lease(), Duration::from_secs(20));
    assert_eq!(config.heartbeat(), Some(Duration::from_secs(5)));
    assert_eq!(config.ping_interval(), Duration::from_secs(15));
    assert_eq!(config.ping_timeout(), Duration::from_secs(5));
    assert_eq!(config.lock_table().to_string(), "pgcoord_locks");
    assert_eq!(config.lock_sequence().to_string(), "pgcoord_locks_rvn");
    assert_eq!(config.payload_table().to_string(), "pgcoord_payloads");
    assert_eq!(config.pg_config().get_application_name(), Some("pgcoord"));
    assert!(config.pg_config().get_keepalives());
    let owner = config.owner();
    assert!(!owner.is_empty() && owner.len() <= 255);
    assert!(owner.contains(&std::process::id().to_string()));
    assert_ne!(
        owner,
        base().build().unwrap().owner(),
        "owners differ per config"
    );
}

#[test]
fn bad_values_have_their_own_errors() {
    assert_eq!(kind(Config::builder()), ErrorKind::InvalidConfig);
    assert_eq!(
        kind(Config::builder().dsn("port=notanumber")),
        ErrorKind::InvalidConfig
    );
    assert_eq!(kind(base().owner("")), ErrorKind::InvalidName);
    assert_eq!(kind(base().owner("o".repeat(256))), ErrorKind::InvalidName);
    assert!(base().owner("o".repeat(255)).build().is_ok());
    assert_eq!(
        kind(base().lease(Duration::ZERO)),
        ErrorKind::DurationTooSmall
    );
    assert_eq!(
        kind(
            base()
                .lease(Duration::from_secs(10))
                .heartbeat(Duration::from_millis(5001))
        ),
        ErrorKind::DurationTooSmall
    );
    assert!(
        base()
            .lease(Duration::from_secs(10))
            .heartbeat(Duration::from_secs(5))
            .build()
            .is_ok()
    );
    let no_heartbeat = base().heartbeat(Duration::ZERO).build().unwrap();
    assert_eq!(no_heartbeat.heartbeat(), None);
    assert_eq!(
        kind(base().ping_interval(Duration::ZERO)),
        ErrorKind::DurationTooSmall
    );
    assert_eq!(
        kind(base().ping_timeout(Duration::ZERO)),
        ErrorKind::DurationTooSmall
    );
    let ms = Duration::from_millis;
    assert_eq!(
        kind(base().backoff(Duration::ZERO, ms(10))),
        ErrorKind::DurationTooSmall
    );
    assert_eq!(
        kind(base().backoff(ms(100), ms(10))),
        ErrorKind::DurationTooSmall
    );
    let backoff = base().backoff(ms(20), ms(3000)).build().unwrap().backoff();
    assert_eq!((backoff.initial(), backoff.max()), (ms(20), ms(3000)));
    assert_eq!(
        base().build().unwrap().backoff(),
        pgcoord::db::Backoff::DEFAULT
    );
    assert_eq!(kind(base().pool_size(0)), ErrorKind::InvalidConfig);
    assert_eq!(
        kind(base().lock_table("x; DROP TABLE y")),
        ErrorKind::InvalidIdentifier
    );
    assert_eq!(
        kind(base().lock_table("a".repeat(58))),
        ErrorKind::InvalidIdentifier
    );
    assert!(base().lock_table("a".repeat(57)).build().is_ok());
    // The SQL functions' names leave room as the tables' do.
    assert_eq!(
        kind(base().topic_table("t".repeat(56))),
        ErrorKind::InvalidIdentifier
    );
    assert!(base().topic_table("t".repeat(55)).build().is_ok());
    assert_eq!(
        kind(base().schedule_table("s".repeat(55))),
        ErrorKind::InvalidIdentifier
    );
    assert!(base().schedule_table("s".repeat(54)).build().is_ok());
    assert_eq!(
        kind(base().schema("bad\"schema")),
        ErrorKind::InvalidIdentifier
    );
    assert_eq!(
        kind(base().payload_table("p\0")),
        ErrorKind::InvalidIdentifier
    );
    assert_eq!(
        // Channels take any name NOTIFY does, but not one it would truncate.
        kind(base().lease_channel("c".repeat(64))),
        ErrorKind::InvalidIdentifier
    );
    assert_eq!(
        kind(base().election_channel("")),
        ErrorKind::InvalidIdentifier
    );
    assert_eq!(
        kind(base().session_dsn("host=x port=notaport")),
        ErrorKind::InvalidConfig
    );
}

#[test]
fn session_connections_follow_the_pool_unless_set_apart() {
    let config = base().build().unwrap();
    assert_eq!(config.session_pg_config(), config.pg_config());
    assert!(config.prepared_statements());
    let config = base()
        .session_dsn("host=db.internal port=5433 user=app")
        .prepared_statements(false)
        .application_name("svc")
        .build()
        .unwrap();
    let session = config.session_pg_config();
    assert_ne!(session, config.pg_config());
    assert_eq!(session.get_ports(), [5433]);
    // The same treatment as the pool's: application_name, connect timeout, keepalives.
    assert_eq!(session.get_application_name(), Some("svc"));
    assert!(session.get_connect_timeout().is_some());
    assert!(session.get_keepalives());
    assert!(!config.prepared_statements());
    assert_eq!(config.election_channel().as_str(), "pgcoord_locks_ldr");
}

#[test]
fn caller_config_is_copied_not_changed() {
    let mut pg = tokio_postgres::Config::new();
    pg.host("127.0.0.1")
        .user("postgres")
        .application_name("mine");
    let config = Config::builder().pg_config(&pg).build().unwrap();
    assert_eq!(config.pg_config().get_application_name(), Some("mine"));
    assert!(!pg.get_keepalives() || pg.get_keepalives_idle() == Duration::from_secs(7200));
    assert_eq!(
        pg.get_connect_timeout(),
        None,
        "the caller's value is untouched"
    );
    let renamed = Config::builder()
        .pg_config(&pg)
        .application_name("svc")
        .build()
        .unwrap();
    assert_eq!(renamed.pg_config().get_application_name(), Some("svc"));
    assert_eq!(pg.get_application_name(), Some("mine"));
}

#[test]
fn schema_applies_to_unqualified_tables() {
    let config = base()
        .schema("app")
        .payload_table("other.p")
        .build()
        .unwrap();
    assert_eq!(config.lock_table().to_string(), "app.pgcoord_locks");
    assert_eq!(config.lock_sequence().to_string(), "app.pgcoord_locks_rvn");
    assert_eq!(config.payload_table().to_string(), "other.p");
    assert_eq!(config.lease_channel().as_str(), "pgcoord_locks");
}

/// A DSN's error says what is wrong and never shows the password, in any form a DSN carries one
/// (user-info, query parameter, key=value), nor a piece of one: the secret's pieces `Zq9x` and
/// `Wv7y` are in no message, Debug or source, of the pool's DSN or the sessions'.
#[test]
fn a_dsn_error_names_what_is_wrong_and_never_the_password() {
    let refused = |dsn: &str, says: &str| {
        for builder in [Config::builder().dsn(dsn), base().session_dsn(dsn)] {
            let e = builder.build().expect_err(says);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            let mut shown = format!("{e} {e:?}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                shown += &format!(" {s} {s:?}");
                source = s.source();
            }
            for secret in ["Zq9x", "Wv7y", "`Z`"] {
                assert!(!shown.contains(secret), "{dsn}: {shown}");
            }
            assert!(e.to_string().contains(says), "{dsn}: {e}");
        }
    };
    // Percent-encoding, wherever a URL carries the password.
    let url = "postgres://app@127.0.0.1/db";
    refused(
        "postgres://app:Zq9x%ZZWv7y@127.0.0.1/db",
        "bad percent-encoding in the password",
    );
    refused(
        &format!("{url}?password=Zq9x%ZZWv7y"),
        "bad percent-encoding in the password",
    );
    refused(
        &format!("{url}?password=Zq9x%FFWv7y"),
        "not UTF-8 in the password",
    );
    // Other parameters: a known one is named, an unknown one (a piece of a password with `&`
    // unencoded, maybe) is not.
    refused(
        "postgres://app:Zq9xWv7y@127.0.0.1/db?port=%ZZ",
        "bad percent-encoding in the value of port",
    );
    refused(
        &format!("{url}?password=Zq9x&Wv7y=%ZZ"),
        "in the value of an unknown query parameter",
    );
    refused(
        &format!("{url}?password=Zq9x&Wv%ZZ7y=1"),
        "in the name of a query parameter",
    );
    refused(
        &format!("{url}?password=Zq9x&Wv7y=1"),
        "an option tokio-postgres does not know",
    );
    // key=value: a quoted password and a bad part elsewhere.
    let quoted = "host=127.0.0.1 password='Zq9x Wv7y'";
    refused(
        &format!("{quoted} port=notaport"),
        "invalid value for option `port`",
    );
    refused(&format!("{quoted} sslmode=bogus"), "sslmode \"bogus\"");
    refused(&format!("{quoted} user"), "unexpected EOF");
    refused(
        "host=127.0.0.1 password='Zq9x Wv7y",
        "unterminated quoted connection parameter value",
    );
    // Unquoted, a password with a space splits into what looks like more options.
    refused(
        "host=127.0.0.1 password=Zq9x Wv7y=1",
        "an option tokio-postgres does not know",
    );
    refused(
        "host=127.0.0.1 password=Zq9x Wv7y Zq9x",
        "unexpected character at byte",
    );
    refused("host=127.0.0.1 password Zq9x", "expected `=`");
    // Without a password in it, an unknown option is named.
    refused("host=127.0.0.1 hots=db", "unknown option `hots`");
    // Accepted, the password is in no Debug either.
    let config = Config::builder()
        .dsn("host=127.0.0.1 password='Zq9x Wv7y'")
        .session_dsn("postgres://app:Zq9xWv7y@127.0.0.1/db")
        .build()
        .unwrap();
    assert!(!format!("{config:?}").contains("Zq9x"));
}
