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
        kind(base().lock_table("a".repeat(60))),
        ErrorKind::InvalidIdentifier
    );
    assert!(base().lock_table("a".repeat(59)).build().is_ok());
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
