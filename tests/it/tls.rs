//! TLS against a throwaway cluster with TLS on and a certificate authority made for the run:
//! each `sslmode` does what libpq's does, the pool's connections, dedicated sessions and cancel
//! requests all use it, and a certificate that must not be trusted is refused, saying why.

use std::time::{Duration, Instant};

use pgcoord::{Config, ErrorKind, SslMode};
use pgcoord_testkit::{CertificateAuthority, TempPostgres, unique_name};

fn server() -> &'static TempPostgres {
    TempPostgres::shared_tls().expect("a cluster with TLS")
}

/// A DSN for the TLS cluster at `host` with `options` (`sslmode=…` and so on).
fn dsn(host: &str, options: &str) -> String {
    format!(
        "host={host} port={} user=postgres dbname=postgres {options}",
        server().port()
    )
}

fn root() -> String {
    server().root_cert().unwrap().display().to_string()
}

fn config(dsn: &str) -> Config {
    Config::builder()
        .dsn(dsn)
        .lock_table(unique_name("locks"))
        .build()
        .unwrap()
}

/// Whether the session of `client` is encrypted, as the server sees it.
async fn encrypted(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Whether a connection from `pool` is encrypted.
async fn pooled_encrypted(pool: &pgcoord::Pool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    encrypted(pool.checkout(deadline).await.unwrap().client()).await
}

/// A PEM file with the certificate of an authority the server's certificate is not from.
fn unrelated_root() -> tempfile::TempPath {
    let authority = CertificateAuthority::new("someone else").unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), authority.certificate_pem()).unwrap();
    file.into_temp_path()
}

#[tokio::test]
async fn verify_full_with_the_right_authority_encrypts_every_connection() {
    for host in ["localhost", "127.0.0.1"] {
        let config = config(&dsn(
            host,
            &format!("sslmode=verify-full sslrootcert={}", root()),
        ));
        assert_eq!(config.tls().mode(), SslMode::VerifyFull);
        let session = pgcoord::db::connect_spawned(&config).await.unwrap();
        assert!(encrypted(&session).await, "dedicated session to {host}");

        // The pool's connections too.
        assert!(
            pooled_encrypted(&pgcoord::Pool::new(&config)).await,
            "pooled connection to {host}"
        );
        pgcoord::schema::migrate(&session, &config).await.unwrap();
        pgcoord::__private::check_server(&config).await.unwrap();
    }
    // The URL form, with the root certificate percent-encoded.
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server().port(),
        root().replace('/', "%2F")
    );
    let session = pgcoord::db::connect_spawned(&config(&url)).await.unwrap();
    assert!(encrypted(&session).await);
}

#[tokio::test]
async fn a_certificate_from_an_untrusted_authority_is_refused_saying_so() {
    let other = unrelated_root();
    for mode in ["verify-full", "verify-ca", "require"] {
        // `require` with a root certificate file verifies the chain, as libpq does.
        let config = config(&dsn(
            "localhost",
            &format!("sslmode={mode} sslrootcert={}", other.display()),
        ));
        let Err(e) = pgcoord::__private::connect(&config).await else {
            panic!("{mode}: connected with an untrusted certificate")
        };
        assert_eq!(e.kind(), ErrorKind::Tls, "{mode}: {e}");
        assert!(
            e.to_string().contains("not signed by a trusted root"),
            "{mode}: {e}"
        );
    }
}

#[tokio::test]
async fn the_system_store_does_not_trust_a_private_authority() {
    // `sslrootcert=system`, and verify-full with no root certificate given (no
    // ~/.postgresql/root.crt here): the operating system's roots, which do not include the
    // authority made for this run.
    for options in ["sslrootcert=system", "sslmode=verify-full"] {
        let built = Config::builder().dsn(dsn("localhost", options)).build();
        let config = match built {
            Ok(config) => config,
            // A machine without a system store says so when the configuration is built.
            Err(e) => {
                assert!(e.to_string().contains("system's store"), "{e}");
                continue;
            }
        };
        assert_eq!(config.tls().mode(), SslMode::VerifyFull);
        let Err(e) = pgcoord::__private::connect(&config).await else {
            panic!("{options}: the system's roots trusted a private authority")
        };
        assert_eq!(e.kind(), ErrorKind::Tls, "{options}: {e}");
    }
}

#[tokio::test]
async fn a_rustls_configuration_of_the_callers_and_an_application_pool_with_pgcoords_tls() {
    use pgcoord::rustls;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(server().root_cert().unwrap()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let config = Config::builder()
        .dsn(dsn("localhost", ""))
        .tls_client_config(client_config)
        .build()
        .unwrap();
    // A configuration of the caller's means TLS is required unless a mode says otherwise.
    assert_eq!(config.tls().mode(), SslMode::Require);
    let session = pgcoord::db::connect_spawned(&config).await.unwrap();
    assert!(encrypted(&session).await);

    // The application's own bb8 pool, built with pgcoord's connector.
    let manager = pgcoord::bb8_postgres::PostgresConnectionManager::new(
        config.pg_config().clone(),
        config.tls().clone(),
    );
    let app_pool = pgcoord::bb8::Pool::builder()
        .max_size(2)
        .build(manager)
        .await
        .unwrap();
    assert!(
        pooled_encrypted(&pgcoord::Pool::from_bb8(&config, app_pool)).await,
        "the application pool's connection"
    );
}

#[tokio::test]
async fn a_certificate_for_another_host_fails_verify_full_but_passes_verify_ca() {
    // The server's certificate is for localhost and 127.0.0.1; the name asked for is another.
    let options = |mode: &str| format!("hostaddr=127.0.0.1 sslmode={mode} sslrootcert={}", root());
    let full = config(&dsn("db.example", &options("verify-full")));
    let Err(e) = pgcoord::__private::connect(&full).await else {
        panic!("verify-full accepted a certificate for another host")
    };
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(
        e.to_string()
            .contains("not valid for db.example (it is for localhost, 127.0.0.1)"),
        "{e}"
    );

    let ca = config(&dsn("db.example", &options("verify-ca")));
    let session = pgcoord::db::connect_spawned(&ca).await.unwrap();
    assert!(encrypted(&session).await);
}

#[tokio::test]
async fn a_server_given_only_by_address_cannot_be_reached_over_tls_and_says_so() {
    let by_address = |mode: &str| {
        format!(
            "hostaddr=127.0.0.1 port={} user=postgres dbname=postgres sslmode={mode} sslrootcert={}",
            server().port(),
            root()
        )
    };
    // tokio-postgres does no TLS handshake without a host name: `prefer` connects plain (as it
    // did before TLS was built in) instead of failing...
    let session = pgcoord::db::connect_spawned(&config(&by_address("prefer")))
        .await
        .unwrap();
    assert!(!encrypted(&session).await);
    // ...and modes that need TLS are refused when the configuration is built, saying why.
    for mode in ["require", "verify-ca", "verify-full"] {
        let Err(e) = Config::builder().dsn(by_address(mode)).build() else {
            panic!("{mode} without a host name was accepted")
        };
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("give host="), "{e}");
    }
}

#[tokio::test]
async fn require_prefer_and_disable_do_what_libpq_does() {
    // require: encrypted, nothing verified (no root certificate given).
    let session = pgcoord::db::connect_spawned(&config(&dsn("localhost", "sslmode=require")))
        .await
        .unwrap();
    assert!(encrypted(&session).await, "require");
    // prefer (also the default): encrypted when the server offers TLS…
    for options in ["sslmode=prefer", ""] {
        let config = config(&dsn("localhost", options));
        assert_eq!(config.tls().mode(), SslMode::Prefer);
        let session = pgcoord::db::connect_spawned(&config).await.unwrap();
        assert!(encrypted(&session).await, "prefer ({options:?})");
    }
    // …and plain when it does not.
    let plain = TempPostgres::shared().unwrap();
    let config_plain = Config::builder()
        .pg_config(&plain.pg_config())
        .build()
        .unwrap();
    let session = pgcoord::db::connect_spawned(&config_plain).await.unwrap();
    assert!(!encrypted(&session).await, "prefer against a plain server");
    // disable: plain even where TLS is offered; the builder's mode wins over the DSN's.
    let disabled = Config::builder()
        .dsn(dsn("localhost", "sslmode=require"))
        .ssl_mode(SslMode::Disable)
        .build()
        .unwrap();
    let session = pgcoord::db::connect_spawned(&disabled).await.unwrap();
    assert!(!encrypted(&session).await, "disable");
}

#[tokio::test]
async fn requiring_tls_of_a_server_without_it_fails_clearly() {
    let plain = TempPostgres::shared().unwrap();
    let config = Config::builder()
        .pg_config(&plain.pg_config())
        .ssl_mode(SslMode::Require)
        .build()
        .unwrap();
    let Err(e) = pgcoord::__private::connect(&config).await else {
        panic!("connected without TLS")
    };
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
}

#[tokio::test]
async fn a_statement_past_its_deadline_is_cancelled_over_tls() {
    // With sslmode=require, a cancel request without TLS is refused before it is sent: the
    // statement would run on.
    let config = Config::builder()
        .dsn(dsn("localhost", "sslmode=require"))
        .application_name(unique_name("cancel"))
        .build()
        .unwrap();
    let pool = pgcoord::Pool::new(&config);
    let conn = pool
        .checkout(Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(300);
    let e = pgcoord::__private::run_until(&*conn, "SELECT pg_sleep(60)", &[], deadline)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");

    let admin = pgcoord::db::connect_spawned(&self::config(&dsn("localhost", "")))
        .await
        .unwrap();
    let name = config
        .pg_config()
        .get_application_name()
        .unwrap()
        .to_owned();
    pgcoord_testkit::eventually(
        Duration::from_secs(5),
        "the statement is cancelled on the server",
        async || {
            let running: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND query LIKE '%pg_sleep%' AND state = 'active'",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            running == 0
        },
    )
    .await;
}

#[tokio::test]
async fn bad_tls_settings_are_refused_when_the_configuration_is_built() {
    let refused = |builder: pgcoord::ConfigBuilder, says: &str| {
        let Err(e) = builder.build() else {
            panic!("built, expected an error saying {says:?}")
        };
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    };
    let base = "host=localhost user=postgres";
    refused(
        Config::builder().dsn(format!("{base} sslmode=verify-all")),
        "sslmode \"verify-all\"",
    );
    refused(
        Config::builder().dsn(format!(
            "{base} sslmode=verify-full sslrootcert=/nonexistent/root.crt"
        )),
        "/nonexistent/root.crt",
    );
    refused(
        Config::builder().dsn(format!("{base} sslmode=require sslrootcert=system")),
        "use verify-full",
    );
    refused(
        Config::builder().dsn(format!("{base} sslcrl=/crl.pem")),
        "sslcrl",
    );
    let empty = tempfile::NamedTempFile::new().unwrap();
    refused(
        Config::builder()
            .dsn(base)
            .ssl_mode(SslMode::VerifyCa)
            .ssl_root_cert(empty.path().display().to_string()),
        "no PEM certificate",
    );
    // The session DSN is checked as well.
    refused(
        Config::builder()
            .dsn(base)
            .session_dsn(format!("{base} sslmode=bogus")),
        "sslmode \"bogus\"",
    );
    // sslrootcert=system alone means verify-full.
    let system = Config::builder()
        .dsn(format!("{base} sslrootcert=system"))
        .build();
    match system {
        Ok(config) => assert_eq!(config.tls().mode(), SslMode::VerifyFull),
        // A machine without a system store says so.
        Err(e) => assert!(e.to_string().contains("system's store"), "{e}"),
    }
}

/// The role that must show a client certificate exists (the shared cluster lets it in only
/// with one). Tests running at once may both create it: the loser sees `duplicate_object`, or
/// `unique_violation` when their inserts race in the catalog.
async fn cert_role() {
    let admin = pgcoord::db::connect_spawned(&config(&dsn("localhost", "sslmode=require")))
        .await
        .unwrap();
    let create = format!(
        "DO $$ BEGIN CREATE ROLE {0} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        pgcoord_testkit::CERT_USER
    );
    admin.batch_execute(&create).await.unwrap();
}

#[tokio::test]
async fn a_client_certificate_from_the_dsn_lets_in_a_role_that_needs_one() {
    cert_role().await;
    let (cert, key) = server().client_cert().unwrap();
    let user = pgcoord_testkit::CERT_USER;
    let with_cert = format!(
        "sslmode=verify-full sslrootcert={} sslcert={} sslkey={} user={user}",
        root(),
        cert.display(),
        key.display()
    );
    let url = format!(
        "postgres://{user}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        server().port(),
        root(),
        cert.display(),
        key.display()
    );
    for dsn in [dsn("localhost", &with_cert), url] {
        let config = config(&dsn);
        let client = pgcoord::db::connect_spawned(&config).await.unwrap();
        let me: String = client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(me, user);
        assert!(encrypted(&client).await);
        // The pool's connections too.
        assert!(pooled_encrypted(&pgcoord::Pool::new(&config)).await);
    }

    // Without one, the server refuses the role, and says why.
    let without = dsn(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={} user={user}", root()),
    );
    let e = pgcoord::db::connect_spawned(&config(&without))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[tokio::test]
async fn a_client_key_others_may_read_is_refused_before_connecting() {
    let (cert, key) = server().client_cert().unwrap();
    let open = tempfile::NamedTempFile::new().unwrap();
    std::fs::copy(key, open.path()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let options = format!(
        "sslmode=require sslcert={} sslkey={}",
        cert.display(),
        open.path().display()
    );
    let e = Config::builder()
        .dsn(dsn("localhost", &options))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("may be read by others"), "{e}");
    assert!(
        !e.to_string().contains("PRIVATE KEY"),
        "no key material in errors: {e}"
    );
    // A certificate file that is not there: named.
    let options = format!(
        "sslmode=require sslcert=/nonexistent.crt sslkey={}",
        key.display()
    );
    let e = Config::builder()
        .dsn(dsn("localhost", &options))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent.crt"), "{e}");
}

/// The password the tests encrypt the client key with; a space in it, for both DSN forms'
/// quoting.
const KEY_PASSWORD: &str = "correct horse";

/// The shared cluster's client key, re-encrypted by `openssl {args} -passout pass:{password}`
/// (read from `-in`, written to `-out`) into a file of mode 0600, removed when dropped.
fn openssl_key(args: &[&str], password: &str) -> tempfile::TempPath {
    let (_, key) = server().client_cert().unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = std::process::Command::new("openssl")
        .args(args)
        .arg("-in")
        .arg(key)
        .arg("-out")
        .arg(file.path())
        .arg("-passout")
        .arg(format!("pass:{password}"))
        .output()
        .expect("the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    file.into_temp_path()
}

/// The client key as `openssl pkcs8 -topk8 -v2 {cipher}` encrypts it (PBES2, PBKDF2 with
/// HMAC-SHA256, OpenSSL 3's defaults).
fn pkcs8_key(cipher: &str, password: &str) -> tempfile::TempPath {
    openssl_key(&["pkcs8", "-topk8", "-v2", cipher], password)
}

/// The key=value options for the role that must show a certificate, with the key `key` and
/// `password` options (`sslpassword=…` or nothing).
fn cert_options(key: &std::path::Path, password: &str) -> String {
    let (cert, _) = server().client_cert().unwrap();
    format!(
        "sslmode=verify-full sslrootcert={} sslcert={} sslkey={} {password} user={}",
        root(),
        cert.display(),
        key.display(),
        pgcoord_testkit::CERT_USER
    )
}

#[tokio::test]
async fn a_client_key_encrypted_as_pkcs8_is_decrypted_with_sslpassword() {
    cert_role().await;
    let user = pgcoord_testkit::CERT_USER;
    let key = pkcs8_key("aes-256-cbc", KEY_PASSWORD);
    let (cert, plain) = server().client_cert().unwrap();
    let url = format!(
        "postgres://{user}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}&sslpassword=correct%20horse",
        server().port(),
        root(),
        cert.display(),
        key.display()
    );
    let key_value = dsn(
        "localhost",
        &cert_options(&key, "sslpassword='correct horse'"),
    );
    // Other PBES2 schemes: AES-128, and scrypt instead of PBKDF2.
    let aes128 = openssl_key(&["pkcs8", "-topk8", "-v2", "aes-128-cbc"], KEY_PASSWORD);
    let scrypt = openssl_key(&["pkcs8", "-topk8", "-scrypt"], KEY_PASSWORD);
    let others = [&aes128, &scrypt].map(|key| {
        dsn(
            "localhost",
            &cert_options(key, "sslpassword='correct horse'"),
        )
    });
    // A password with a key that is not encrypted is ignored, as libpq does.
    let unencrypted = dsn("localhost", &cert_options(plain, "sslpassword=unused"));
    for dsn in [key_value, url, unencrypted].into_iter().chain(others) {
        let config = config(&dsn);
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("horse") && !shown.contains("unused"),
            "{shown}"
        );
        let client = pgcoord::db::connect_spawned(&config).await.unwrap();
        // The server let the role in by its certificate, and saw that certificate.
        let row = client
            .query_one(
                "SELECT current_user::text, client_dn FROM pg_stat_ssl \
                 WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), user);
        assert_eq!(row.get::<_, String>(1), format!("/CN={user}"));
        assert!(pooled_encrypted(&pgcoord::Pool::new(&config)).await);
    }
}

#[tokio::test]
async fn a_client_key_that_cannot_be_decrypted_is_a_tls_error_that_says_why() {
    let key = pkcs8_key("aes-256-cbc", KEY_PASSWORD);
    let refused = |dsn: String, why: &str| {
        let e = Config::builder().dsn(dsn).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        let text = format!("{e} {e:?}");
        assert!(text.contains(why), "{e}");
        assert!(
            !text.contains("horse") && !text.contains("battery"),
            "{e:?}"
        );
        assert!(
            !text.contains("PRIVATE KEY-----\n"),
            "no key material: {e:?}"
        );
    };
    let wrong = "could not be decrypted with sslpassword: wrong password";
    refused(
        dsn(
            "localhost",
            &cert_options(&key, "sslpassword='battery staple'"),
        ),
        wrong,
    );
    let (cert, _) = server().client_cert().unwrap();
    let url = format!(
        "postgres://localhost:{}/postgres?sslmode=require&sslcert={}&sslkey={}&sslpassword=battery",
        server().port(),
        cert.display(),
        key.display()
    );
    refused(url, wrong);
    refused(
        dsn("localhost", &cert_options(&key, "")),
        "is encrypted: give its password with sslpassword",
    );
    // OpenSSL's traditional encrypted PEM (Proc-Type: 4,ENCRYPTED) is not PKCS#8.
    let legacy = openssl_key(&["pkey", "-traditional", "-aes256"], KEY_PASSWORD);
    assert!(
        std::fs::read_to_string(&legacy)
            .unwrap()
            .contains("Proc-Type: 4,ENCRYPTED")
    );
    refused(
        dsn(
            "localhost",
            &cert_options(&legacy, "sslpassword='correct horse'"),
        ),
        "convert it to encrypted PKCS#8 with `openssl pkcs8 -topk8 -v2 aes-256-cbc",
    );
    // PKCS#8 schemes the RustCrypto crates are built without: triple DES, and PBKDF2 with
    // HMAC-SHA1 (OpenSSL 1.0's default).
    let sha1 = openssl_key(
        &[
            "pkcs8",
            "-topk8",
            "-v2",
            "aes-256-cbc",
            "-v2prf",
            "hmacWithSHA1",
        ],
        KEY_PASSWORD,
    );
    refused(
        dsn(
            "localhost",
            &cert_options(&sha1, "sslpassword='correct horse'"),
        ),
        "re-encrypt it with `openssl pkcs8 -topk8 -v2 aes-256-cbc`",
    );
    let des = pkcs8_key("des3", KEY_PASSWORD);
    refused(
        dsn(
            "localhost",
            &cert_options(&des, "sslpassword='correct horse'"),
        ),
        "re-encrypt it with `openssl pkcs8 -topk8 -v2 aes-256-cbc`",
    );
}
