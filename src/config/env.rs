//! The connection from the environment, as libpq reads it: `DATABASE_URL` when it is set, else
//! the `PG*` variables, with the password, when none is set, from the password file
//! (`PGPASSFILE`, else `~/.pgpass`).

use super::passfile::{password_for, read_passfile};
use crate::error::{Error, ErrorKind, Result};

/// The `PG*` variables read, and the DSN keywords they stand for.
const VARIABLES: [(&str, &str); 12] = [
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
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

/// The process's environment variable `name`, when it is set and not empty (libpq takes an
/// empty one as unset).
pub(crate) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The DSN the process's environment describes; [`ErrorKind::InvalidConfig`] when it describes
/// none.
pub(crate) fn dsn_from_env() -> Result<String> {
    let passwords = super::passfile::path(&var).and_then(|path| read_passfile(&path));
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
}
