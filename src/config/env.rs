//! The connection from the environment, as libpq reads it: `DATABASE_URL` when it is set, else
//! the `PG*` variables, with the password, when none is set, from the password file
//! (`PGPASSFILE`, else `~/.pgpass`).

use crate::error::{Error, ErrorKind, Result};

/// The `PG*` variables read, and the DSN keywords they stand for.
const VARIABLES: [(&str, &str); 11] = [
    ("PGHOST", "host"),
    ("PGPORT", "port"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGDATABASE", "dbname"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGSSLCERT", "sslcert"),
    ("PGSSLKEY", "sslkey"),
    ("PGAPPNAME", "application_name"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
];

/// The password for a DSN that names none, from the password file (`PGPASSFILE`, else
/// `~/.pgpass`), as libpq looks it up: the first host and port, the database (else the user),
/// the user (else the system's `USER`).
pub(crate) fn password_for_dsn(pg: &tokio_postgres::Config) -> Option<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let passfile = var("PGPASSFILE").or_else(|| var("HOME").map(|h| format!("{h}/.pgpass")))?;
    password_in(&read_passfile(&passfile)?, pg, var("USER"))
}

/// [`password_for_dsn`] with the file's text and the system's user given.
fn password_in(
    passwords: &str,
    pg: &tokio_postgres::Config,
    os_user: Option<String>,
) -> Option<String> {
    use tokio_postgres::config::Host;
    let user = pg.get_user().map(str::to_owned).or(os_user)?;
    // A socket directory matches `localhost`, as in libpq.
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        _ => "localhost".to_owned(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    let dbname = pg.get_dbname().unwrap_or(&user).to_owned();
    password_for(passwords, &host, &port, &dbname, &user)
}

/// The DSN the process's environment describes; [`ErrorKind::InvalidConfig`] when it describes
/// none.
pub(crate) fn dsn_from_env() -> Result<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let passfile = var("PGPASSFILE").or_else(|| var("HOME").map(|h| format!("{h}/.pgpass")));
    let passwords = passfile.and_then(|path| read_passfile(&path));
    dsn_from(var, passwords.as_deref())
}

/// The DSN from `var` (a variable's value by name) and the password file's text.
pub(crate) fn dsn_from(
    var: impl Fn(&str) -> Option<String>,
    passwords: Option<&str>,
) -> Result<String> {
    if let Some(url) = var("DATABASE_URL") {
        return Ok(url);
    }
    if VARIABLES.iter().all(|(name, _)| var(name).is_none()) {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "no database in the environment: set DATABASE_URL, or PGHOST, PGDATABASE and the \
             other PG* variables",
        ));
    }
    let mut pairs: Vec<(&str, String)> = (VARIABLES.iter())
        .filter_map(|(name, keyword)| Some((*keyword, var(name)?)))
        .collect();
    // As libpq: the operating system's user when none is named.
    if var("PGUSER").is_none()
        && let Some(user) = var("USER")
    {
        pairs.push(("user", user));
    }
    if var("PGPASSWORD").is_none()
        && let Some(passwords) = passwords
    {
        let get = |keyword: &str| pairs.iter().find(|(k, _)| *k == keyword).map(|(_, v)| v);
        let user = get("user").cloned().unwrap_or_default();
        let host = get("host").cloned().unwrap_or_else(|| "localhost".into());
        let port = get("port").cloned().unwrap_or_else(|| "5432".into());
        let dbname = get("dbname").cloned().unwrap_or_else(|| user.clone());
        if let Some(password) = password_for(passwords, &host, &port, &dbname, &user) {
            pairs.push(("password", password));
        }
    }
    Ok((pairs.iter())
        .map(|(keyword, value)| format!("{keyword}='{}'", quote(value)))
        .collect::<Vec<_>>()
        .join(" "))
}

/// A value inside single quotes in a key/value DSN.
fn quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

/// The password file's text; none when it cannot be read or others may read it (libpq ignores
/// such a file too).
fn read_passfile(path: &str) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                path,
                "the password file is readable by others: ignored (chmod 0600 it)"
            );
            return None;
        }
    }
    std::fs::read_to_string(path).ok()
}

/// The first line of a password file (`host:port:database:user:password`, `*` matching
/// anything, `\:` and `\\` escaped) that matches.
pub(crate) fn password_for(
    passwords: &str,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    for line in passwords.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        let [h, p, d, u, password] = fields.as_slice() else {
            continue;
        };
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if matches(h, host) && matches(p, port) && matches(d, dbname) && matches(u, user) {
            return Some(password.clone());
        }
    }
    None
}

/// A line's fields: split at unescaped `:`, with `\:` and `\\` unescaped.
fn split_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field) = (Vec::new(), String::new());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.extend(chars.next()),
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn database_url_wins_and_pg_variables_make_a_quoted_dsn() {
        let url = vars(&[("DATABASE_URL", "postgres://a@b/c"), ("PGHOST", "x")]);
        assert_eq!(dsn_from(url, None).unwrap(), "postgres://a@b/c");
        let pg = vars(&[
            ("PGHOST", "db1"),
            ("PGPORT", "6432"),
            ("PGUSER", "app"),
            ("PGPASSWORD", "it's \\ secret"),
            ("PGSSLMODE", "verify-full"),
        ]);
        assert_eq!(
            dsn_from(pg, None).unwrap(),
            "host='db1' port='6432' user='app' password='it\\'s \\\\ secret' sslmode='verify-full'"
        );
        let none = vars(&[("USER", "me")]);
        assert_eq!(
            dsn_from(none, None).unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
    }

    #[test]
    fn the_password_file_gives_the_first_matching_password() {
        let file = "# comment\n\
                    other:5432:*:app:wrong\n\
                    db1:6432:orders:app:first\n\
                    *:*:*:app:any\\:colon\n";
        assert_eq!(
            password_for(file, "db1", "6432", "orders", "app").as_deref(),
            Some("first")
        );
        assert_eq!(
            password_for(file, "db2", "5432", "x", "app").as_deref(),
            Some("any:colon")
        );
        assert_eq!(password_for(file, "db2", "5432", "x", "bob"), None);
        // Used when no PGPASSWORD is set, for the DSN's host, port, database (default: the
        // user) and user.
        let pg = vars(&[
            ("PGHOST", "db1"),
            ("PGPORT", "6432"),
            ("PGUSER", "app"),
            ("PGDATABASE", "orders"),
        ]);
        assert!(
            dsn_from(pg, Some(file))
                .unwrap()
                .ends_with("password='first'")
        );
        let set = vars(&[("PGHOST", "db1"), ("PGUSER", "app"), ("PGPASSWORD", "mine")]);
        assert!(!dsn_from(set, Some(file)).unwrap().contains("any"));
    }

    #[cfg(unix)]
    #[test]
    fn a_dsn_without_a_password_gets_the_password_files() {
        let file = "other:5432:app:svc:wrong\ndb.internal:6432:app:svc:right\n*:*:*:*:any\n";
        let pg = |dsn: &str| dsn.parse::<tokio_postgres::Config>().unwrap();
        let found = |dsn: &str| password_in(file, &pg(dsn), Some("os".into()));
        assert_eq!(
            found("host=db.internal port=6432 user=svc dbname=app").as_deref(),
            Some("right")
        );
        // Defaults: port 5432, the database named as the user, the system's user.
        assert_eq!(found("host=db.internal").as_deref(), Some("any"));
        let exact = "db.internal:5432:os:os:mine\n";
        let pg_default = pg("host=db.internal");
        assert_eq!(
            password_in(exact, &pg_default, Some("os".into())).as_deref(),
            Some("mine")
        );
        // A socket directory is `localhost`.
        let local = "localhost:5432:app:svc:sock\n";
        let socket = pg("host=/var/run/postgresql user=svc dbname=app");
        assert_eq!(password_in(local, &socket, None).as_deref(), Some("sock"));
    }

    #[test]
    fn a_password_file_others_may_read_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, "*:*:*:*:secret\n").unwrap();
        let path_str = path.to_str().unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_passfile(path_str), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_passfile(path_str).is_some());
    }
}
