//! libpq's environment, merged: what a DSN leaves out, filled from the `PG*` variables and the
//! password file in libpq's order, so that `--dsn` without a password and `PGPASSWORD`, or
//! `postgres:///db` and `PGHOST`, connect as psql would.

use std::time::Duration;

use super::dsn::TlsOptions;
use super::passfile::{Passfile, password_in};
use crate::error::{Error, ErrorKind, Result};

/// Fills what a DSN's settings (`pg`, and the TLS options taken out of it) leave out, in libpq's
/// order: the DSN's own value, else its `PG*` variable's from `var`, else — for the password —
/// the password file's (read with `passfile` from `PGPASSFILE`, else `~/.pgpass`), else the
/// default (the user: the system's `USER`; the rest is tokio-postgres's). Returns the password
/// file's path when it was needed and ignored for being readable by others, for the "password
/// missing" that may follow to say why. A variable that is not a valid value is
/// [`ErrorKind::InvalidConfig`] naming it.
pub(crate) fn merge(
    pg: &mut tokio_postgres::Config,
    tls: &mut TlsOptions,
    var: &dyn Fn(&str) -> Option<String>,
    passfile: impl FnOnce(&str) -> Passfile,
) -> Result<Option<String>> {
    variables(pg, tls, var)?;
    if pg.get_password().is_some() {
        return Ok(None);
    }
    if let Some(password) = var("PGPASSWORD") {
        pg.password(password);
        return Ok(None);
    }
    let Some(path) = super::passfile::path(var) else {
        return Ok(None);
    };
    match passfile(&path) {
        Passfile::Read(passwords) => {
            if let Some(password) = password_in(&passwords, pg, var("USER")) {
                pg.password(password);
            }
            Ok(None)
        }
        Passfile::TooOpen => Ok(Some(path)),
        Passfile::Missing => Ok(None),
    }
}

/// The settings but the password, each from its `PG*` variable when the DSN leaves it out; the
/// user, else, from the system's `USER`.
fn variables(
    pg: &mut tokio_postgres::Config,
    tls: &mut TlsOptions,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<()> {
    // Each setting apart, as libpq: a DSN's host with PGHOSTADDR set connects to that address.
    if pg.get_hosts().is_empty()
        && let Some(hosts) = var("PGHOST")
    {
        for host in hosts.split(',') {
            pg.host(host);
        }
    }
    if pg.get_hostaddrs().is_empty()
        && let Some(addresses) = var("PGHOSTADDR")
    {
        for address in addresses.split(',') {
            pg.hostaddr(
                address
                    .parse()
                    .map_err(|_| invalid("PGHOSTADDR must be IP addresses, separated by commas"))?,
            );
        }
    }
    if pg.get_ports().is_empty()
        && let Some(ports) = var("PGPORT")
    {
        for port in ports.split(',') {
            pg.port(
                port.parse()
                    .map_err(|_| invalid("PGPORT must be port numbers, separated by commas"))?,
            );
        }
    }
    if pg.get_user().is_none()
        && let Some(user) = var("PGUSER").or_else(|| var("USER"))
    {
        pg.user(user);
    }
    if pg.get_dbname().is_none()
        && let Some(dbname) = var("PGDATABASE")
    {
        pg.dbname(dbname);
    }
    if pg.get_application_name().is_none()
        && let Some(name) = var("PGAPPNAME")
    {
        pg.application_name(name);
    }
    if pg.get_connect_timeout().is_none()
        && let Some(timeout) = var("PGCONNECT_TIMEOUT")
    {
        let seconds: i64 = (timeout.parse())
            .map_err(|_| invalid("PGCONNECT_TIMEOUT must be a whole number of seconds"))?;
        // Zero or less is "wait forever" to libpq: pgcoord's own bound applies then.
        if seconds > 0 {
            pg.connect_timeout(Duration::from_secs(seconds as u64));
        }
    }
    for (option, name) in [
        (&mut tls.sslmode, "PGSSLMODE"),
        (&mut tls.sslrootcert, "PGSSLROOTCERT"),
        (&mut tls.sslcert, "PGSSLCERT"),
        (&mut tls.sslkey, "PGSSLKEY"),
    ] {
        if option.is_none() {
            *option = var(name);
        }
    }
    Ok(())
}

/// A variable's value that is not what it should be (the value is not quoted).
fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidConfig, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A variable's value by name from `pairs`.
    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |name| (pairs.iter().find(|(k, _)| *k == name)).map(|(_, v)| v.to_string())
    }

    /// `dsn` parsed (its TLS options taken out) and completed from `env` and the password file
    /// `file` says: the settings, the TLS options, and the ignored password file's path.
    fn merged(
        dsn: &str,
        env: &[(&str, &str)],
        file: Passfile,
    ) -> Result<(tokio_postgres::Config, TlsOptions, Option<String>)> {
        let (rest, mut tls) = super::super::dsn::take_tls_options(dsn)?;
        let mut pg: tokio_postgres::Config = rest.parse().unwrap();
        let ignored = merge(&mut pg, &mut tls, &vars(env), |path| {
            assert_eq!(path, "/home/me/.pgpass");
            file
        })?;
        Ok((pg, tls, ignored))
    }

    fn host(pg: &tokio_postgres::Config) -> String {
        format!("{:?}", pg.get_hosts())
    }

    #[test]
    fn pgpassword_fills_a_dsn_without_a_password_and_never_overrides_one() {
        let env = [("PGPASSWORD", "from-env"), ("HOME", "/home/me")];
        let unread = || Passfile::Read("*:*:*:*:from-file\n".into());
        let (pg, _, _) = merged("host=db user=app", &env, unread()).unwrap();
        assert_eq!(pg.get_password(), Some(&b"from-env"[..]));
        let (pg, _, _) = merged("postgres://app:mine@db/x", &env, unread()).unwrap();
        assert_eq!(pg.get_password(), Some(&b"mine"[..]));
    }

    #[test]
    fn pg_variables_fill_what_a_dsn_leaves_out_and_nothing_it_says() {
        let env = [
            ("PGHOST", "db1,db2"),
            ("PGPORT", "6432,6433"),
            ("PGUSER", "app"),
            ("USER", "me"),
            ("PGDATABASE", "orders"),
            ("PGAPPNAME", "billing"),
            ("PGCONNECT_TIMEOUT", "7"),
            ("PGSSLMODE", "verify-full"),
            ("PGSSLROOTCERT", "/ca.pem"),
            ("PGPASSWORD", "secret"),
        ];
        // `postgres:///db` names no host: PGHOST's (tokio-postgres refuses it without one).
        let (pg, tls, _) = merged("postgres:///cli", &env, Passfile::Missing).unwrap();
        assert_eq!(host(&pg), r#"[Tcp("db1"), Tcp("db2")]"#);
        assert_eq!(pg.get_ports(), [6432, 6433]);
        assert_eq!(pg.get_user(), Some("app"));
        assert_eq!(pg.get_dbname(), Some("cli"));
        assert_eq!(pg.get_application_name(), Some("billing"));
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(7)));
        assert_eq!(tls.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(tls.sslrootcert.as_deref(), Some("/ca.pem"));
        // What the DSN says stays.
        let dsn = "host=h port=1 user=u dbname=d application_name=a connect_timeout=2 \
                   sslmode=disable";
        let (pg, tls, _) = merged(dsn, &env, Passfile::Missing).unwrap();
        assert_eq!(host(&pg), r#"[Tcp("h")]"#);
        assert_eq!(pg.get_ports(), [1]);
        assert_eq!(
            (pg.get_user(), pg.get_dbname(), pg.get_application_name()),
            (Some("u"), Some("d"), Some("a"))
        );
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert_eq!(tls.sslmode.as_deref(), Some("disable"));
        // The system's user when neither says one; a socket directory; an address.
        let env = [("PGHOST", "/run/postgresql"), ("USER", "me")];
        let (pg, _, _) = merged("dbname=x", &env, Passfile::Missing).unwrap();
        assert_eq!(pg.get_user(), Some("me"));
        assert_eq!(host(&pg), r#"[Unix("/run/postgresql")]"#);
        let (pg, _, _) =
            merged("host=db", &[("PGHOSTADDR", "10.0.0.7")], Passfile::Missing).unwrap();
        assert_eq!(
            pg.get_hostaddrs(),
            ["10.0.0.7".parse::<std::net::IpAddr>().unwrap()]
        );
        // Zero is "wait forever" to libpq: left to pgcoord's own bound.
        let (pg, _, _) =
            merged("host=h", &[("PGCONNECT_TIMEOUT", "0")], Passfile::Missing).unwrap();
        assert_eq!(pg.get_connect_timeout(), None);
    }

    #[test]
    fn a_bad_variable_is_named_and_not_quoted() {
        for (name, value) in [
            ("PGPORT", "54x32"),
            ("PGHOSTADDR", "db.example"),
            ("PGCONNECT_TIMEOUT", "soon"),
        ] {
            let e = merged("host=h", &[(name, value)], Passfile::Missing).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            let text = e.to_string();
            assert!(text.contains(name) && !text.contains(value), "{text}");
        }
    }

    #[test]
    fn the_password_file_comes_after_the_dsn_and_pgpassword() {
        let home = ("HOME", "/home/me");
        let file = || Passfile::Read("db1:6432:orders:app:from-file\n".into());
        let dsn = "host=db1 port=6432 dbname=orders";
        let (pg, _, ignored) = merged(dsn, &[home, ("PGUSER", "app")], file()).unwrap();
        assert_eq!(pg.get_password(), Some(&b"from-file"[..]));
        assert_eq!(ignored, None);
        // Looked up with what the environment filled in.
        let env = [
            home,
            ("PGHOST", "db1"),
            ("PGPORT", "6432"),
            ("PGUSER", "app"),
        ];
        let (pg, _, _) = merged("dbname=orders", &env, file()).unwrap();
        assert_eq!(pg.get_password(), Some(&b"from-file"[..]));
        let env = [home, ("PGUSER", "app"), ("PGPASSWORD", "from-env")];
        let (pg, _, _) = merged(dsn, &env, file()).unwrap();
        assert_eq!(pg.get_password(), Some(&b"from-env"[..]));
        // PGPASSFILE names another file.
        let (rest, mut tls) = super::super::dsn::take_tls_options(dsn).unwrap();
        let mut pg: tokio_postgres::Config = rest.parse().unwrap();
        let env = [home, ("PGUSER", "app"), ("PGPASSFILE", "/etc/pgpass")];
        merge(&mut pg, &mut tls, &vars(&env), |path| {
            assert_eq!(path, "/etc/pgpass");
            file()
        })
        .unwrap();
        assert_eq!(pg.get_password(), Some(&b"from-file"[..]));
    }

    #[test]
    fn a_password_file_others_may_read_is_ignored_and_named() {
        let env = [("HOME", "/home/me"), ("PGUSER", "app")];
        let (pg, _, ignored) = merged("host=db1", &env, Passfile::TooOpen).unwrap();
        assert_eq!(pg.get_password(), None);
        assert_eq!(ignored.as_deref(), Some("/home/me/.pgpass"));
        // Not even looked at when a password is given.
        let (rest, mut tls) = super::super::dsn::take_tls_options("host=h password=p").unwrap();
        let mut pg: tokio_postgres::Config = rest.parse().unwrap();
        let looked = |_: &str| -> Passfile { panic!("the password file is not needed") };
        assert_eq!(merge(&mut pg, &mut tls, &vars(&env), looked).unwrap(), None);
    }
}
